"""softmax, log-softmax and cross entropy: executed in float64 with max-subtraction, bounded for any logits.

Execution follows attention kernels: z = x - max(x), e^z, a fixed tree sum, one rounding to
the format. Entries at -inf (a mask) give exactly 0 (log-softmax -inf); a row holding +inf or
NaN, or only -inf, gives NaN everywhere (as torch.softmax does).

Bounds use the monotonicity of softmax_i = 1 / (1 + sum_(j != i) e^(x_j - x_i)) over the box
[lo, hi]. Rows whose logits spread over at most 700 (no float64 overflow) use that form
directly; other rows, and rows with infinities, use the shifted form
e^(x_i - M) / (e^(x_i - M) + sum_(j != i) e^(x_j - M)) with M the largest exponent, whose
terms lie in [0, 1] and whose denominator lies in [1, n], so nothing overflows whatever the
logits. Cross entropy ln(1 + D) is evaluated as A + ln(e^-A + sum e^(a_j - A)) for the same
reason.
"""

from __future__ import annotations

import numpy as np

from ..formats import get_format
from ..gpu import as_float64, round_float64
from .interval import Interval, canonical
from .ops import check_ulps
from .outward import (
    INF,
    MAX64,
    down,
    exp_array,
    exp_down,
    exp_up,
    log_array,
    log_down,
    log_up,
    sum_down,
    sum_up,
    tree_sum,
    up,
    widen,
)

_EASY_SPREAD = 700.0  # e^700 and sums of such terms stay far below float64's largest value


def _softmax64(x: np.ndarray) -> np.ndarray:
    """softmax over the last axis in float64: e^(x - max) / sum, exp64 and a fixed tree sum."""
    with np.errstate(invalid="ignore"):
        z = x - np.max(x, axis=-1, keepdims=True)
        e = exp_array(z)
        return e / tree_sum(e)[..., None]


def _lse_gap64(x: np.ndarray) -> np.ndarray:
    """lse(x) - z with z = x - max(x), per entry (the cross entropy of every label), in float64."""
    with np.errstate(invalid="ignore"):
        z = x - np.max(x, axis=-1, keepdims=True)
        lse = log_array(tree_sum(exp_array(z)))
        return lse[..., None] - z


def _cross_entropy64(logits: np.ndarray, labels: np.ndarray) -> np.ndarray:
    with np.errstate(invalid="ignore"):
        z = logits - np.max(logits, axis=-1, keepdims=True)
        lse = log_array(tree_sum(exp_array(z)))
        return lse - np.take_along_axis(z, labels[..., None], axis=-1)[..., 0]


# --------------------------------------------------------------------------- row classification


def _rows(lo: np.ndarray, hi: np.ndarray, nan: np.ndarray):
    """(may be NaN, NaN only, easy) per row: NaN where a row may hold NaN or +inf or be all -inf."""
    empty = lo > hi
    row_nan = np.any(nan, axis=-1) | np.any(hi == INF, axis=-1) | np.all(lo == -INF, axis=-1)
    row_empty = np.any(empty, axis=-1) | np.any(lo == INF, axis=-1) | np.all(hi == -INF, axis=-1)
    finite = np.all(np.isfinite(lo) & np.isfinite(hi), axis=-1)
    with np.errstate(invalid="ignore", over="ignore"):
        spread = np.max(hi, axis=-1) - np.min(lo, axis=-1)
    easy = finite & (spread <= _EASY_SPREAD)
    return row_nan | row_empty, row_empty, easy


def _stand_ins(lo, hi):
    """Finite stand-ins for +inf ends (the largest float64: every finite logit lies below it)."""
    return np.where(lo == INF, MAX64, lo), np.where(hi == INF, MAX64, hi)


def _off(n: int) -> np.ndarray:
    return ~np.eye(n, dtype=bool)


def _excl_max(v: np.ndarray) -> np.ndarray:
    """m[..., i] = max over j != i of v[..., j] (-inf for a single entry)."""
    n = v.shape[-1]
    return np.max(np.where(_off(n), v[..., None, :], -INF), axis=-1)


# --------------------------------------------------------------------------- softmax ranges


def _softmax_range(lo: np.ndarray, hi: np.ndarray):
    """Bounds of the exact softmax over the box [lo, hi], and of D_i = sum_(j != i) e^(x_j - x_i).

    softmax_i = 1 / (1 + D_i) increases with x_i and decreases with every other x_j, so its
    smallest value takes x_i = lo_i and x_j = hi_j, its largest the opposite.
    """
    n = lo.shape[-1]
    off = _off(n)
    with np.errstate(invalid="ignore", over="ignore"):
        up_arg = up(hi[..., None, :] - lo[..., :, None])  # [.., i, j] = hi_j - lo_i
        dn_arg = down(lo[..., None, :] - hi[..., :, None])
        d_up = sum_up(np.where(off, exp_up(up_arg), 0.0))
        d_dn = sum_down(np.where(off, exp_down(dn_arg), 0.0))
        d_dn = np.maximum(d_dn, 0.0)
        s_lo = down(1.0 / up(1.0 + d_up))
        s_hi = np.minimum(up(1.0 / down(1.0 + d_dn)), 1.0)
    return np.maximum(s_lo, 0.0), s_hi, d_dn, d_up


def _softmax_range_shifted(lo: np.ndarray, hi: np.ndarray):
    """Bounds of the exact softmax for any logits (infinite ends included), no overflow."""
    L, H = _stand_ins(lo, hi)
    off = _off(lo.shape[-1])
    with np.errstate(invalid="ignore", over="ignore"):
        # smallest value: x_i = lo_i, x_j = hi_j, shifted by M = max(lo_i, max_(j != i) hi_j)
        m = np.maximum(L, _excl_max(H))
        num = exp_down(down(L - m))
        rest = sum_up(np.where(off, exp_up(up(H[..., None, :] - m[..., None])), 0.0))
        s_lo = down(num / up(num + rest))
        s_lo = np.where(m == -INF, 1.0, s_lo)  # every other entry is -inf: x_i takes it all
        # largest value: x_i = hi_i, x_j = lo_j, shifted by M' = max(hi_i, max_(j != i) lo_j)
        m2 = np.maximum(H, _excl_max(L))
        num2 = exp_up(up(H - m2))
        rest2 = sum_down(np.where(off, exp_down(down(L[..., None, :] - m2[..., None])), 0.0))
        s_hi = np.minimum(up(num2 / down(num2 + rest2)), 1.0)
    masked = H == -INF  # x_i is -inf: exactly 0
    s_lo = np.where(masked, 0.0, np.maximum(s_lo, 0.0))
    s_hi = np.where(masked, 0.0, s_hi)
    return s_lo, s_hi


def _gap_range(lo: np.ndarray, hi: np.ndarray):
    """Bounds of ln(1 + D_i), D_i = sum_(j != i) e^(x_j - x_i), for every i (cross entropy with label i)."""
    L, H = _stand_ins(lo, hi)
    off = _off(lo.shape[-1])
    with np.errstate(invalid="ignore", over="ignore"):
        a = np.where(off, down(L[..., None, :] - H[..., :, None]), -INF)  # [.., i, j] = lo_j - hi_i
        big_a = np.maximum(np.max(a, axis=-1), 0.0)
        big_a = np.where(np.isfinite(big_a), big_a, 0.0)
        terms = np.where(off, exp_down(down(a - big_a[..., None])), exp_down(down(-big_a))[..., None])
        g_lo = np.maximum(down(big_a + log_down(sum_down(terms))), 0.0)
        b = np.where(off, up(H[..., None, :] - L[..., :, None]), -INF)  # hi_j - lo_i
        big_b = np.maximum(np.max(b, axis=-1), 0.0)
        finite_b = np.isfinite(big_b)
        bb = np.where(finite_b, big_b, 0.0)
        terms = np.where(off, exp_up(up(b - bb[..., None])), exp_up(up(-bb))[..., None])
        g_hi = np.where(finite_b, up(bb + log_up(sum_up(terms))), INF)
    gone = H == -INF  # x_i is -inf: ln(1 + D) is +inf
    return np.where(gone, INF, g_lo), np.where(gone, INF, g_hi)


def _gap_bounds(lo, hi, easy):
    """ln(1 + D_i) bounds for every i: the direct form on easy rows, the shifted form elsewhere."""
    with np.errstate(invalid="ignore", over="ignore"):
        _, _, d_dn, d_up = _softmax_range(lo, hi)
        g_lo = np.maximum(log_down(down(1.0 + d_dn)), 0.0)
        g_hi = log_up(up(1.0 + d_up))
    if not np.all(easy):
        s_lo, s_hi = _gap_range(lo, hi)
        g_lo = np.where(easy[..., None], g_lo, s_lo)
        g_hi = np.where(easy[..., None], g_hi, s_hi)
    # The float64 evaluation of lse - z loses up to a few ulps of the logits' size
    # (cancellation when the loss is small): allow 2^-46 of the largest finite |logit| on top.
    mag = np.where(np.isfinite(lo), np.abs(lo), 0.0)
    mag = np.maximum(mag, np.where(np.isfinite(hi), np.abs(hi), 0.0))
    slack = up(np.max(mag, axis=-1) * 2.0**-46 + 2.0**-1000)[..., None]
    with np.errstate(invalid="ignore"):
        return down(g_lo - slack), up(g_hi + slack)


def _f64_slack(lo, hi, fmt: str):
    """Bounds for a float64 result: its own evaluation errs by up to 2^-40 relative (plus 2^-1000)."""
    if fmt != "float64":
        return lo, hi
    with np.errstate(invalid="ignore", over="ignore"):
        return (down(lo - np.abs(lo) * 2.0**-40 - 2.0**-1000),
                up(hi + np.abs(hi) * 2.0**-40 + 2.0**-1000))


# --------------------------------------------------------------------------- the rules


def softmax(x, fmt="float32", ulps=None):
    """softmax over the last axis, computed in float64 and rounded once to fmt; on intervals the
    monotone bound [1/(1 + sum_(j!=i) e^(hi_j - lo_i)), 1/(1 + sum_(j!=i) e^(lo_j - hi_i))] widened by the budget.

    Rows may hold -inf (a masked logit: probability exactly 0); a row that holds +inf or
    only -inf may be NaN.

    Parameters
    ----------
    x : array_like or Interval
        Logits, the softmax taken over the last axis.
    fmt : str or FloatFormat, default "float32"
        The result's format.
    ulps : float or None, default None
        The error budget in ulps of fmt; None takes ULP_BUDGETS["softmax"], 1.

    Returns
    -------
    numpy.ndarray or Interval
        The probabilities in float64 for an array; for an Interval, their bound, within
        [0, 1].

    Raises
    ------
    ValueError
        If fmt is unknown or ulps is not a finite number >= 0.

    Examples
    --------
    >>> import numpy as np
    >>> from precisionlab.intervals import Interval, softmax
    >>> logits = np.array([[1.0, 2.0, 3.0]])
    >>> bound = softmax(Interval(logits - 0.01, logits + 0.01))
    >>> bool(bound.contains(softmax(logits)).all())
    True
    >>> bool(bound.contains(softmax(logits + [0.01, 0.0, -0.01])).all())
    True
    >>> bool((bound.hi - bound.lo < 0.02).all())
    True
    """
    u = check_ulps(ulps, "softmax")
    if not isinstance(x, Interval):
        return round_float64(_softmax64(as_float64(x)), fmt)
    nan, empty, easy = _rows(x.lo, x.hi, x.nan)
    s_lo, s_hi, _, _ = _softmax_range(x.lo, x.hi)
    if not np.all(easy):
        t_lo, t_hi = _softmax_range_shifted(x.lo, x.hi)
        s_lo = np.where(easy[..., None], s_lo, t_lo)
        s_hi = np.where(easy[..., None], s_hi, t_hi)
    s_lo, s_hi = _f64_slack(s_lo, s_hi, get_format(fmt).name)
    lo, hi = widen(s_lo, s_hi, fmt, u)
    v = None if x.value is None else softmax(x.value, fmt)
    e = np.broadcast_to(empty[..., None], x.shape)
    masked = x.hi == -INF  # e^-inf = 0 exactly, and 0 / s = 0
    lo, hi = np.where(masked, 0.0, np.maximum(lo, 0.0)), np.where(masked, 0.0, np.minimum(hi, 1.0))
    return canonical(np.where(e, INF, lo), np.where(e, -INF, hi),
                   np.broadcast_to(nan[..., None], x.shape), v, x.rule)


def log_softmax(x, fmt="float32", ulps=None):
    """x - ln sum e^x over the last axis (z - ln sum e^z, z = x - max), float64 then rounded once;
    on intervals -ln(1 + D_i) over the box, D_i = sum_(j != i) e^(x_j - x_i), widened by the budget.

    Parameters
    ----------
    x : array_like or Interval
        Logits, the log-softmax taken over the last axis.
    fmt : str or FloatFormat, default "float32"
        The result's format.
    ulps : float or None, default None
        The error budget in ulps of fmt; None takes ULP_BUDGETS["cross_entropy"], 1 (the
        same evaluation: float64, then one rounding).

    Returns
    -------
    numpy.ndarray or Interval
        The log-probabilities in float64 for an array; for an Interval, their bound, within
        [-inf, 0] (-inf exactly where a logit is -inf, a masked key).

    Raises
    ------
    ValueError
        If fmt is unknown or ulps is not a finite number >= 0.

    Examples
    --------
    >>> import numpy as np
    >>> from precisionlab.intervals import Interval, log_softmax
    >>> logits = np.array([[1.0, 2.0, 3.0]])
    >>> log_softmax(logits).round(4).tolist()
    [[-2.4076, -1.4076, -0.4076]]
    >>> bound = log_softmax(Interval(logits - 0.01, logits + 0.01))
    >>> bool(bound.contains(log_softmax(logits)).all()), bool((bound.hi <= 0).all())
    (True, True)
    """
    u = check_ulps(ulps, "cross_entropy")  # the same evaluation: float64, then one rounding
    if not isinstance(x, Interval):
        return round_float64(-_lse_gap64(as_float64(x)), fmt)
    nan, empty, easy = _rows(x.lo, x.hi, x.nan)
    g_lo, g_hi = _gap_bounds(x.lo, x.hi, easy)
    g_lo, g_hi = _f64_slack(np.maximum(g_lo, 0.0), g_hi, get_format(fmt).name)
    lo, hi = widen(-g_hi, -g_lo, fmt, u)
    v = None if x.value is None else log_softmax(x.value, fmt)
    e = np.broadcast_to(empty[..., None], x.shape)
    masked = x.hi == -INF  # -inf - lse = -inf exactly
    lo, hi = np.where(masked, -INF, lo), np.where(masked, -INF, np.minimum(hi, 0.0))
    return canonical(np.where(e, INF, lo), np.where(e, -INF, hi),
                   np.broadcast_to(nan[..., None], x.shape), v, x.rule)


def cross_entropy(logits, labels, fmt="float32", ulps=None):
    """-ln softmax(logits)[label] per row, float64 then rounded once to fmt; on intervals
    [ln(1 + D_lo), ln(1 + D_hi)] with D = sum_(j != label) e^(x_j - x_label) over the box, widened by the budget.

    Parameters
    ----------
    logits : array_like or Interval
        Logits of shape (..., classes), the softmax taken over the last axis.
    labels : array_like of int
        The class index of each row, of shape logits.shape[:-1].
    fmt : str or FloatFormat, default "float32"
        The result's format.
    ulps : float or None, default None
        The error budget in ulps of fmt; None takes ULP_BUDGETS["cross_entropy"], 1.

    Returns
    -------
    numpy.ndarray or Interval
        The loss of each row (shape logits.shape[:-1]) in float64 for an array; for an
        Interval, its bound, within [0, inf].

    Raises
    ------
    ValueError
        If labels are not integers, have another shape than the rows or a value outside
        0..classes - 1, fmt is unknown or ulps is not a finite number >= 0.

    Examples
    --------
    >>> import numpy as np
    >>> from precisionlab.intervals import Interval, cross_entropy
    >>> logits = np.array([[1.0, 2.0, 3.0]])
    >>> cross_entropy(logits, np.array([2])).round(4).tolist()  # -ln softmax(logits)[2]
    [0.4076]
    >>> bound = cross_entropy(Interval(logits - 0.01, logits + 0.01), np.array([2]))
    >>> bound.lo.round(4).tolist(), bound.hi.round(4).tolist()
    ([0.401], [0.4143])
    """
    u = check_ulps(ulps, "cross_entropy")
    lab = np.asarray(labels)
    if lab.dtype.kind not in "iu":
        raise ValueError(f"labels must be integer class indices; got dtype {lab.dtype}")
    lab = lab.astype(np.int64)
    shape = np.shape(logits.lo if isinstance(logits, Interval) else as_float64(logits))
    if lab.shape != shape[:-1] or (lab.size and (lab.min() < 0 or lab.max() >= shape[-1])):
        raise ValueError(f"labels must have shape {shape[:-1]} with values in 0..{shape[-1] - 1}; "
                         f"got shape {lab.shape}" + (f", values {lab.min()}..{lab.max()}" if lab.size else ""))
    if not isinstance(logits, Interval):
        return round_float64(_cross_entropy64(as_float64(logits), lab), fmt)
    nan, empty, easy = _rows(logits.lo, logits.hi, logits.nan)
    g_lo, g_hi = _gap_bounds(logits.lo, logits.hi, easy)
    pick = lab[..., None]
    lo = np.take_along_axis(g_lo, pick, axis=-1)[..., 0]
    hi = np.take_along_axis(g_hi, pick, axis=-1)[..., 0]
    lo, hi = _f64_slack(lo, hi, get_format(fmt).name)
    lo, hi = widen(lo, hi, fmt, u)
    v = None if logits.value is None else cross_entropy(logits.value, lab, fmt)
    return canonical(np.where(empty, INF, np.maximum(lo, 0.0)), np.where(empty, -INF, hi), nan, v,
                   logits.rule)
