"""Chapter 7's demonstrations (precisionlab.chapters.allclose_demos) against exact oracles:
a dot product by hand encloses the exact partial sums, every summation order equals the
rational reference, and an injected bug is seen once it exceeds the bound."""

from __future__ import annotations

import itertools
import math
from fractions import Fraction

import numpy as np
import pytest
from oracles import fraction_round, rn

from precisionlab import intervals as iv
from precisionlab.chapters import allclose_demos as demos


def dot_in_order(a, b, order, mode="nearest_even"):
    """fl(acc + a_i b_i) in float16 along `order`, by exact rationals."""
    acc = Fraction(0)
    for i in order:
        acc = Fraction(fraction_round(acc + Fraction(a[i]) * Fraction(b[i]), "float16", mode))
    return float(acc)


def test_dot_by_hand_encloses_the_exact_partial_sums():
    a = rn(np.array([0.1, -0.3, 0.7, 0.2]), "float16")
    b = rn(np.array([1.3, 0.9, -0.45, 2.1]), "float16")
    steps = demos.dot_by_hand(a, b, "float16")
    for s in steps:
        assert s.lo <= s.exact <= s.hi and s.lo <= s.value <= s.hi
    assert steps[-1].exact == math.fsum(a * b)


def test_injected_bug_is_seen_once_it_exceeds_the_bound():
    clean = demos.injected_bug(1024, "float32", 0.0)
    assert clean.verdicts == {"structure": "Type-I", "oblivious": "Type-I", "high_precision": "Type-I"}
    assert clean.structure.contains(clean.target).all() and clean.structure.contains(clean.reference).all()
    big = demos.injected_bug(1024, "float32", 0.1)
    assert big.verdicts["structure"] == "Type-II" and big.error > big.structure.width[0, 0] / 2
    with pytest.raises(ValueError, match="bug"):
        demos.injected_bug(256, "float32", -1.0)
    with pytest.raises(ValueError, match="format"):
        demos.injected_bug(256, "float8_e4m3fn", 0.0)


@pytest.mark.parametrize("seed", [0, 7, 21])
def test_every_order_and_the_orders_outside_the_naive_interval(seed):
    a, b = iv.uniform_data((2, 4), seed, "float16", scale=2.0)
    got = demos.every_order(a, b, "float16")
    perms = list(itertools.permutations(range(4)))
    assert list(got) == perms
    assert all(got[p] == dot_in_order(a, b, p) for p in perms)
    naive_lo, naive_hi = dot_in_order(a, b, range(4), "down"), dot_in_order(a, b, range(4), "up")
    want = {p: v for p, v in got.items() if not naive_lo <= v <= naive_hi}
    assert demos.orders_outside(a, b, "float16") == want
    if seed == 7:  # the chapter's pair: 8 of the 24 orders escape
        assert len(want) == 8


def test_every_order_refuses_long_vectors():
    with pytest.raises(ValueError, match="at most 8 entries; got 9"):
        demos.every_order(np.ones(9), np.ones(9))
    with pytest.raises(ValueError, match="float16"):
        demos.every_order(np.full(3, 0.1), np.ones(3))  # 0.1 is no float16 value


@pytest.mark.parametrize(("na", "nb"), [(3, 2), (2, 3), (1, 4)])
def test_every_order_refuses_vectors_of_two_lengths(na, nb):
    # a longer a ran past b's end (IndexError); a shorter a silently dropped b's tail.
    with pytest.raises(ValueError, match=f"a of length {na} and b of length {nb}"):
        demos.every_order(np.ones(na), np.ones(nb))
    with pytest.raises(ValueError, match=rf"a and b .* one length; got \({na},\) and \({nb},\)"):
        demos.orders_outside(np.ones(na), np.ones(nb))


def test_injected_bug_adds_each_bug_to_products_computed_once():
    # The matmul, its bounds and the promoted re-run do not depend on the bug: they are made
    # once per setting and shared (read-only); each call adds its bug to them. The result is
    # the model computed from scratch.
    a = iv.uniform_data((4, 256), 0, "float32")
    b = iv.uniform_data((256, 4), 1, "float32")
    kern = demos.BUG_KERNELS["float16"]
    exact = np.array([[math.fsum(a[i] * b[:, j]) for j in range(4)] for i in range(4)])
    for bug in (0.0, 0.02, 0.3):
        got = demos.injected_bug(256, "float16", bug)
        delta = np.zeros((4, 4))
        delta[0, 0] = bug * math.fsum(np.abs(exact).ravel()) / 16
        assert np.array_equal(got.target, iv.add(iv.matmul(a, b, kern), delta, "float16"))
        for rule, bound in (("structure", got.structure), ("oblivious", got.oblivious)):
            want = iv.add(iv.matmul(iv.point(a, rule), b, kern), delta, "float16")
            assert np.array_equal(bound.lo, want.lo) and np.array_equal(bound.hi, want.hi)
        high = iv.add(iv.matmul(a, b, iv.promote(kern)), delta, "float64")
        rtol, atol = iv.ASSERT_CLOSE_TOLERANCES["float16"]
        assert (got.verdicts["high_precision"] == "Type-II") == (not iv.allclose(high, got.reference, rtol, atol))
    assert not got.reference.flags.writeable  # shared between calls
    with pytest.raises(ValueError, match="seed"):
        demos.injected_bug(256, "float16", 0.0, seed=-1)
