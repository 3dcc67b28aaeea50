"""precisionlab.intervals.softmax: softmax, log_softmax and cross_entropy bounds, sound and tight.

On points: the exact value (mpmath, 200 bits) and the executed one inside the bound, within a
few ulps of the format, for easy rows, rows spread past exp's range (700), masked entries,
two magnitudes, ties, 3-D inputs; a large logit gap (e^-1000 rounds to 0 in float32, e^1000
overflows float64, the bound does not); extreme and non-finite logits without a warning;
masked labels, rows holding +inf, and labels checked by name.
"""

from __future__ import annotations

import math

import mpmath
import numpy as np
import pytest

from precisionlab import intervals as iv
from precisionlab.formats import get_format

INF = math.inf
MAX64 = float(np.finfo(np.float64).max)


# --------------------------------------------------------------------------- a large logit gap


def test_a_large_logit_gap_gives_a_valid_tight_softmax_bound():
    x = np.array([[0.0, 0.0, -1000.0]])
    b = iv.softmax(iv.point(x), "float32")
    run = iv.softmax(x, "float32")
    assert not np.isnan(b.lo).any() and not np.isnan(b.hi).any() and not b.nan.any()
    assert b.contains(run).all() and run[0, 2] == 0.0
    assert b.lo[0, 2] == 0.0 and 0 < b.hi[0, 2] <= 2.0**-148  # e^-1000 rounds to 0 in float32
    assert b.lo[0, 0] <= 0.5 <= b.hi[0, 0] and b.width[0, 0] < 2.0**-20
    lsm = iv.log_softmax(iv.point(x), "float32")
    assert lsm.contains(iv.log_softmax(x, "float32")).all() and lsm.lo[0, 2] < -1000 - math.log(2) < lsm.hi[0, 2]
    assert lsm.width[0, 2] < 1e-3  # e^1000 overflows float64, the bound does not
    ce = iv.cross_entropy(iv.point(np.array([[0.0, 1000.0]])), np.array([0]), "float32")
    assert ce.lo[0] <= 1000.0 <= ce.hi[0] and ce.width[0] < 1e-3


# --------------------------------------------------------------------------- softmax family: tight and sound

SOFTMAX_CASES = {
    "easy": [[0.5, -1.25, 2.0, 0.0]],
    "spread past 700": [[0.0, -800.0, 3.0, 1.0]],
    "masked": [[1.0, -INF, 0.5, -INF]],
    "two magnitudes": [[1e6, 1e6 + 1, 1e6 - 2], [0.0, 1.0, -1.0]],
    "ties past 700": [[0.0, 0.0, -1000.0]],
    "3-D": [[[0.1, 0.2, -0.3], [5.0, -1.0, 0.0]], [[-2.0, 2.0, 1.5], [0.0, -750.0, 1.0]]],
    "rows far apart past 700": [[1e4, 1e4 - 800, 1e4 + 1], [0.0, -800.0, 1.0]],
    "ten small logits": [[1e-3 * k for k in (3, -1, 4, 1, -5, 9, 2, -6, 5, 3)]],
}


def _exact_log_softmax(x) -> list:
    """x_i - ln sum_j e^(x_j) per row (mpmath, 200 bits), -inf for masked entries."""
    x = np.asarray(x, dtype=np.float64)
    out = []
    with mpmath.workprec(200):
        for row in x.reshape(-1, x.shape[-1]).tolist():
            lse = mpmath.log(mpmath.fsum(mpmath.exp(v) for v in row if v != -INF))
            out.append([mpmath.mpf(v) - lse if v != -INF else mpmath.mpf("-inf") for v in row])
    return out


def _check_tight(bound, exact, fmt, slack=0.0):
    """exact and the executed value in [lo, hi]; hi - lo within a few ulps of fmt (plus slack, per element)."""
    f = get_format(fmt)
    lo, hi = bound.lo.ravel().tolist(), bound.hi.ravel().tolist()
    value = bound.value.ravel().tolist()
    slack = np.broadcast_to(slack, bound.shape).ravel().tolist()
    for lo_i, hi_i, v, e, sl in zip(lo, hi, value, exact, slack, strict=True):
        assert lo_i <= e <= hi_i and lo_i <= v <= hi_i, (lo_i, e, v, hi_i)
        if math.isinf(e):
            assert lo_i == hi_i == e
            continue
        e = float(e)
        ulp_e = 2.0 ** (max(math.frexp(abs(e))[1] - 1, f.emin) - f.mantissa_bits) if e else f.min_subnormal
        width = 8 * ulp_e + (2.0**-36 * abs(e) + 2.0**-990 if f.name == "float64" else 0.0) + sl
        assert hi_i - lo_i <= width, (fmt, lo_i, e, hi_i, (hi_i - lo_i) / ulp_e)


@pytest.mark.parametrize("fmt", ["bfloat16", "float32", "float64"])
@pytest.mark.parametrize("case", list(SOFTMAX_CASES))
def test_softmax_family_bounds_are_sound_and_tight_on_points(case, fmt):
    x = np.array(SOFTMAX_CASES[case])
    exact = _exact_log_softmax(x)
    # the float64 evaluation of lse - z may lose 2^-46 of the row's largest |logit| (documented)
    gap = 4 * 2.0**-46 * np.max(np.where(np.isfinite(x), np.abs(x), 0.0), axis=-1, keepdims=True)
    with mpmath.workprec(200):
        probs = [mpmath.exp(v) for r in exact for v in r]
    _check_tight(iv.softmax(iv.point(x), fmt), probs, fmt)
    _check_tight(iv.log_softmax(iv.point(x), fmt), [v for r in exact for v in r], fmt, gap)
    labels = np.zeros(x.shape[:-1], dtype=int)
    labels.flat[-1] = 2
    ce = iv.cross_entropy(iv.point(x), labels, fmt)
    want = [-r[k] for r, k in zip(exact, labels.ravel().tolist(), strict=True)]
    _check_tight(ce, want, fmt, gap[..., 0])


@pytest.mark.filterwarnings("error")
def test_softmax_family_on_extreme_logits_raises_no_warning():
    rows = np.array([[1e300, -1e300, 0.0], [-INF, -INF, -INF], [INF, 0.0, 1.0], [np.nan, 0.0, 1.0],
                     [0.0, -INF, 5.0]])
    wide = np.array([[1e308, -1e308, 0.0], [MAX64, -MAX64, MAX64]])  # bounds only: see below
    for x, labels in ((rows, [0, 1, 2, 0, 2]), (iv.point(rows), [0, 1, 2, 0, 2]),
                      (iv.Interval(rows - 1, rows + 1), [0, 1, 2, 0, 2]), (iv.Interval(wide, wide), [0, 1])):
        iv.softmax(x), iv.log_softmax(x), iv.cross_entropy(x, np.array(labels))


@pytest.mark.xfail(raises=RuntimeWarning, reason="softmax's float64 execution subtracts the row "
                   "maximum under errstate(invalid='ignore') only; 1e308 - (-1e308) overflows and NumPy warns")
@pytest.mark.filterwarnings("error")
def test_executing_softmax_on_logits_spread_past_max64_warns():
    assert iv.softmax(np.array([[1e308, -1e308]])).tolist() == [[1.0, 0.0]]


def test_cross_entropy_of_a_masked_label_is_infinite():
    ce = iv.cross_entropy(iv.point([[0.0, -INF], [1.0, -INF]]), np.array([1, 0]))
    assert ce.lo[0] == ce.hi[0] == INF and ce.lo[1] < ce.hi[1] < 1e-3
    assert ce.value[0] == INF


def test_a_row_holding_plus_inf_is_nan_only_everywhere():
    x = iv.point([[INF, -INF, 0.0], [0.0, 1.0, 2.0]])
    for b in (iv.softmax(x), iv.log_softmax(x)):
        assert b.lo[0].tolist() == [INF] * 3 and b.hi[0].tolist() == [-INF] * 3 and b.nan[0].all()
        assert np.isfinite(b.lo[1]).all() and not b.nan[1].any()


def test_cross_entropy_labels_are_checked_by_name():
    x = np.zeros((2, 4))
    with pytest.raises(ValueError, match=r"^labels must have shape \(2,\) with values in 0\.\.3; got shape \(2,\), values 0\.\.4$"):
        iv.cross_entropy(x, np.array([0, 4]))
    with pytest.raises(ValueError, match=r"^labels must have shape \(2,\) with values in 0\.\.3; got shape \(0,\)$"):
        iv.cross_entropy(iv.point(x), np.zeros(0, dtype=int))
    with pytest.raises(ValueError, match=r"^labels must be integer class indices; got dtype float64$"):
        iv.cross_entropy(x, np.array([0.0, 1.0]))
