"""The torch-operation rules' fast interval primitives (intervals/torch_ops: arith, rules) give
the bounds of the slower, independent ones: outward rounding against intervals.cast
(rounding.round_to's integer kernel), sums against intervals.add/sub, products of a positive
factor against exact rational corner products, the direct Interval against the validating
constructor, and the quick check against the full one."""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest

from precisionlab import intervals as iv
from precisionlab.diagnose import opcheck
from precisionlab.formats import get_format
from precisionlab.intervals.torch_ops import arith as B
from precisionlab.intervals.torch_ops import rules as R

FORMATS = ("float32", "bfloat16", "float16")


def edge_values(seed: int = 0) -> np.ndarray:
    """Each format's edges (max, smallest normal and subnormal, eps) times factors around 1 and
    2, ties, zeros, infinities, and random magnitudes and bit patterns (NaN removed)."""
    rng = np.random.default_rng(seed)
    vals = [0.0, -0.0, np.inf, -np.inf, 5e-324, -5e-324, 1.0, -1.0]
    for name in FORMATS:
        f = get_format(name)
        for v in (f.max_finite, f.min_subnormal, f.min_normal, f.eps):
            for m in (1, 1 + 2**-52, 1 - 2**-53, 0.5, 0.75, 1.5, 2, 3, 1 + 2**-30, 1 - 2**-30):
                vals += [v * m, -v * m]
    x = np.concatenate([np.array(vals),
                        rng.standard_normal(4000) * np.exp2(rng.integers(-160, 140, 4000)),
                        np.frombuffer(rng.bytes(8 * 4000), dtype=np.float64)])
    return x[~np.isnan(x)]


@pytest.mark.parametrize("fmt", FORMATS)
def test_round_into_is_intervals_cast(fmt):
    x = edge_values()
    lo, hi = np.sort(np.stack([x, np.roll(x, 1)]), axis=0)
    want = iv.cast(iv.Interval(lo, hi), fmt)
    got = B.round_into(B.mk(lo, hi), fmt)
    np.testing.assert_array_equal(got.lo, want.lo)
    np.testing.assert_array_equal(got.hi, want.hi)
    # into float32 and then into fmt: the same bounds (the formats' values nest)
    twice = B.round_into(B.round_into(B.mk(lo, hi), "float32"), fmt)
    np.testing.assert_array_equal(twice.lo, got.lo)
    np.testing.assert_array_equal(twice.hi, got.hi)
    # 0-d and strided arrays keep their shapes
    z = B.round_into(B.mk(np.float64(1.1), np.float64(1.1)), fmt)
    assert z.lo.shape == () and z.lo < 1.1 < z.hi
    s = B.round_into(B.mk(lo.reshape(-1, 2)[:, 0], hi.reshape(-1, 2)[:, 0]), fmt)
    c = B.round_into(B.mk(lo[::2].copy(), hi[::2].copy()), fmt)
    np.testing.assert_array_equal(s.lo, c.lo)
    np.testing.assert_array_equal(s.hi, c.hi)


@pytest.mark.parametrize("minus", [False, True])
def test_finite_sums_are_intervals_add_and_sub(minus):
    rng = np.random.default_rng(1)
    x = edge_values(1)
    x = x[np.isfinite(x)]
    big = get_format("float64").max_finite
    ends = [np.sort(rng.choice(x, (2, 3000)), axis=0) for _ in range(2)]
    ends[0][:, :4] = [[big, -big, big / 2, 1.0], [big, -big, big, 1.0]]  # sums past the range
    ends[1][:, :4] = [[big, -big, big, 2.0**-60], [big, -big, big, 2.0**-60]]
    a, b = (iv.Interval(lo, hi) for lo, hi in ends)
    for fmt in ("float32", "float64"):
        want = (iv.sub if minus else iv.add)(a, b, fmt)
        got = R._add_finite(B.mk(a.lo, a.hi), B.mk(b.lo, b.hi), minus, fmt)
        np.testing.assert_array_equal(got.lo, want.lo)
        np.testing.assert_array_equal(got.hi, want.hi)


def test_products_with_a_positive_factor_hold_the_exact_corners():
    rng = np.random.default_rng(2)
    alo = rng.standard_normal((40, 7)) * np.exp2(rng.integers(-30, 30, (40, 7)))
    a = B.mk(alo, alo + np.abs(rng.standard_normal((40, 7))))
    blo = np.exp2(rng.uniform(-20, 20, (40, 1)))
    b = B.mk(blo, blo * 1.5)
    fast = R._mul_iv(a, b)  # b > 0: two products per end
    full = R._mul_iv(b, a)  # a holds negatives: the four corners
    np.testing.assert_array_equal(fast.lo, full.lo)
    np.testing.assert_array_equal(fast.hi, full.hi)
    for i, j in ((0, 0), (5, 3), (39, 6)):
        corners = [Fraction(p) * Fraction(q) for p in (a.lo[i, j], a.hi[i, j])
                   for q in (b.lo[i, 0], b.hi[i, 0])]
        assert Fraction(fast.lo[i, j]) < min(corners) and max(corners) < Fraction(fast.hi[i, j])


def test_direct_interval_matches_the_validating_constructor():
    lo = np.array([[1.0, -np.inf, np.nan, 2.0], [0.0, np.inf, 1.0, -3.0]])
    hi = np.array([[1.5, 0.0, 1.0, np.nan], [0.0, np.inf, np.inf, -1.0]])
    for a, b in ((lo, hi), (lo[0], hi[0]), (np.full((2, 1), -9.0), hi)):  # broadcasting
        got = B.mk(a, b)
        bad = np.isnan(a) | np.isnan(b)
        want = iv.Interval(np.where(bad, -np.inf, a), np.where(bad, np.inf, b))
        np.testing.assert_array_equal(got.lo, want.lo)
        np.testing.assert_array_equal(got.hi, want.hi)
        np.testing.assert_array_equal(got.nan, want.nan)
        assert got.rule == "oblivious"
    empty = B.mk(np.inf, -np.inf)  # the empty range (NaN only) keeps its flag
    assert bool(empty.nan) and empty.empty
    with pytest.raises(ValueError, match="must not exceed"):
        B.mk(2.0, 1.0)


def test_quick_check_is_the_full_check():
    rng = np.random.default_rng(3)
    lo = rng.standard_normal((6, 50))
    hi = lo + np.abs(rng.standard_normal((6, 50)))
    hi[0, :5] = lo[0, :5]  # zero widths
    lo[1, :3], hi[2, :3] = -np.inf, np.inf  # unbounded ends
    for seed in range(4):
        r = np.random.default_rng(seed)
        with np.errstate(invalid="ignore"):  # inf - inf at the unbounded ends: replaced below
            ref = lo + (hi - lo) * r.uniform(0, 1, lo.shape)
            tgt = lo + (hi - lo) * r.uniform(0, 1, lo.shape)
        ref = np.where(np.isfinite(ref), ref, np.where(np.isinf(lo), hi - 1, lo + 1))
        ref[1, 3] = -np.inf  # a reference value at an infinite end
        lo[1, 3] = -np.inf
        tgt = np.where(np.isfinite(tgt), tgt, ref)
        quick = opcheck.check_inside(0, "op", lo, hi, ref, tgt, False)
        full = opcheck.check_any(0, "op", lo, hi, ref, tgt, False)
        assert quick == full
    ref[4, 7] = hi[4, 7] + 1.0  # outside: the full check takes over and calls it Type-II
    c = opcheck.check(0, "op", B.mk(lo, hi), ref, tgt)
    assert c.verdict == "Type-II" and c.outside == 1 and c.element == (4, 7)
