"""precisionlab.intervals.outward: outward-rounded float64 sums, rounding units, widening and growth.

Overflow of float64 from finite operands (the inner bound +-max64, the outer one infinite, an
overflowing sum redone scaled), sums of one or no terms, the rounding unit of each mode,
widening by ulps up to and past the largest value, growth and the log/exp bounds at their
edges, and no floating-point warning on huge or non-finite values. Expected values are
written out by hand (powers of two, nextafter steps) or come from math.nextafter.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from precisionlab import intervals as iv
from precisionlab.formats import get_format
from precisionlab.intervals.outward import (
    exp_down,
    exp_up,
    growth,
    log_down,
    log_up,
    mul_box,
    round_out,
    rounding_unit,
    sum_down,
    sum_up,
    tree_sum,
    widen,
)

INF = math.inf
MAX64 = float(np.finfo(np.float64).max)


def test_float64_overflow_from_finite_operands_keeps_a_finite_bound():
    # the exact sums +-2e308 are finite: the inner bound is +-max64, the outer one infinite
    s = iv.add(iv.point([1e308, -1e308]), iv.point([1e308, -1e308]), "float64")
    assert s.lo.tolist() == [MAX64, -INF] and s.hi.tolist() == [INF, -MAX64]
    assert not s.nan.any()
    p = iv.mul(iv.point([1e200, -1e200]), iv.point([1e200, 1e200]), "float32")
    f32 = float(np.finfo(np.float32).max)
    assert p.lo.tolist() == [f32, -INF] and p.hi.tolist() == [INF, -f32]
    assert sum_down(np.array([1e308, 1e308])) == MAX64 and sum_up(np.array([-1e308, -1e308])) == -MAX64
    # an overflowing float64 sum is redone scaled: 1e308 + 1e308 - 1.5e308 = 5e307
    t = np.array([1e308, 1e308, -1.5e308])
    assert 5e307 * (1 - 1e-14) < sum_down(t) <= 5e307 <= sum_up(t) < 5e307 * (1 + 1e-14)


def test_sums_of_one_or_no_terms_are_exact_up_to_one_float64_step():
    assert sum_up(np.array([1.0])) == math.nextafter(1.0, INF)
    assert sum_down(np.array([1.0])) == math.nextafter(1.0, -INF)
    assert tree_sum(np.zeros((3, 0))).shape == (3,) and tree_sum(np.ones((2, 5))).tolist() == [5.0, 5.0]


def test_rounding_units_and_widening_by_ulps():
    bf = get_format("bfloat16")
    assert rounding_unit(bf, "nearest_even") == rounding_unit(bf, "nearest_away") == 2.0**-8
    assert rounding_unit(bf, "up") == rounding_unit(bf, "toward_zero") == 2.0**-7
    one = np.array([1.0])
    lo, hi = widen(one, one, "bfloat16", 0.5)  # correct rounding: directed rounding, exact here
    assert (lo[0], hi[0]) == (1.0, 1.0)
    lo, hi = widen(one, one, "bfloat16", 1.0)  # every value within one ulp: 1 - 2^-8 and 1 + 2^-7
    assert lo[0] <= 1 - 2.0**-8 and hi[0] >= 1 + 2.0**-7 and hi[0] - lo[0] < 2.0**-5
    big = np.array([3.5e38])  # past float32's largest value: the result may be max or inf
    lo, hi = widen(big, big, "float32", 2.0)
    assert lo[0] <= float(np.finfo(np.float32).max) and hi[0] == INF


def test_growth_and_log_bounds_at_their_edges():
    g = growth(2.0**-24, np.array([0, 1, 2]))
    exact = [0.0, 2.0**-24, 2 * 2.0**-24 + 2.0**-48]
    assert all(e <= v <= e + 4 * 2.0**-52 for v, e in zip(g.tolist(), exact, strict=True))
    with np.errstate(all="raise"):  # NaN and infinite inputs: no floating-point exception
        for f in (log_down, log_up, exp_down, exp_up):
            f(np.array([INF, 0.0, 1.0, np.nan]))
    assert log_down(np.array([1.0]))[0] <= 0.0 <= log_up(np.array([1.0]))[0] < 1e-300


@pytest.mark.filterwarnings("error")
def test_sums_and_products_of_huge_values_raise_no_warning():
    # pairwise: 1e308 + 1e308 overflows, then inf + -inf is NaN (the float64 tree sum is redone)
    rows = np.array([[1e308, -1e308, 1e308, -1e308], [INF, -INF, 1.0, 2.0], [np.nan, 1.0, 2.0, 3.0]])
    for r in rows:
        sum_down(r), sum_up(r)
    mul_box(np.array([0.0, -INF]), np.array([INF, INF]), np.array([-INF, 0.0]), np.array([INF, 0.0]))
    round_out(np.array([1e308, -1e308, INF]), np.array([1e308, INF, -INF]), "float16")


@pytest.mark.parametrize("fmt", ["float16", "bfloat16", "float32", "float8_e4m3fn"])
def test_round_out_gives_the_same_bits_below_and_above_the_compiled_threshold(fmt, monkeypatch):
    # round_out takes the kernel's NumPy tier below ROUND_OUT_COMPILED_MIN values and the
    # compiled one from it: lowering the threshold sends the same inputs down the other path.
    # Every float class: subnormals of the format, ties, overflow past its largest value,
    # +-inf, NaN, signed zeros and float64 values one step either side of them.
    from precisionlab.intervals import outward
    from precisionlab.rounding import round_to

    f = get_format(fmt)
    rng = np.random.default_rng(7)
    edges = np.array([0.0, -0.0, INF, -INF, np.nan, f.max_finite, -f.max_finite, f.min_normal,
                      f.min_subnormal, f.min_subnormal / 2, 1.0 + f.eps / 2,
                      -(1.0 + 3 * f.eps / 2), 2 * f.max_finite, MAX64])
    edges = np.concatenate([edges, np.nextafter(edges, INF), np.nextafter(edges, -INF)])
    spread = 10.0 ** rng.integers(-50, 50, 3000)
    values = np.concatenate([edges, rng.standard_normal(3000) * spread])
    lo, hi = values, values[::-1].copy()
    monkeypatch.setattr(outward, "ROUND_OUT_COMPILED_MIN", values.size + 1)
    small = round_out(lo, hi, fmt)
    monkeypatch.setattr(outward, "ROUND_OUT_COMPILED_MIN", values.size)
    large = round_out(lo, hi, fmt)
    for a, b in zip(small, large, strict=True):
        np.testing.assert_array_equal(a.view(np.uint64), b.view(np.uint64))
    # and both are the directed roundings themselves
    expected = np.asarray(round_to(lo, f, "down", compiled=True), dtype=np.float64)
    np.testing.assert_array_equal(small[0].view(np.uint64), expected.view(np.uint64))
