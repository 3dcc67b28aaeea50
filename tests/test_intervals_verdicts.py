"""precisionlab.intervals.verdicts: classify on programs whose values leave the format.

A verdict compares the target's bound with the reference program's values; non-finite values
in one program only are reported, a non-finite reference the bound excludes is a bug, NaN in
both programs where the bound allows it is no difference, and identical programs that
overflow to inf are not bugs. With reference_rule a verdict compares two bounds, the target's
and the reference program's own, and must stay Type-I when both programs are correct whatever
their round-off, overflow included: a float16 reference whose running sum overflows to NaN
(inf - inf) or to inf, or whose -1e9 mask bias overflows float16 so that a fully masked row's
softmax is NaN, is still a correct program: its bound allows that value, and the two bounds
share the exact result (checked here by rational arithmetic). Genuine bugs stay Type-II.
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest

from precisionlab import intervals as iv

X = np.array([[60256.0, 60256.0, -60256.0, -60256.0]])  # float16 values; the exact sum is 0


# --------------------------------------------------------------------------- non-finite values against a reference program


def test_identical_programs_that_overflow_to_inf_are_not_bugs():
    x = np.array([[60000.0, 60000.0, 1.0], [1.0, 2.0, 3.0]])
    prog = [iv.Layer("fp16 sum", lambda v: iv.sum_(v, iv.Kernel("sequential", acc="float16")))]
    v = iv.classify(prog, prog, x)
    assert v.verdict == "Type-I" and v.nonfinite == 0
    assert iv.allclose(iv.sum_(x, iv.Kernel("sequential", acc="float16")), np.array([math.inf, 6.0]), 0, 0)


def test_inf_where_the_reference_is_finite_is_reported():
    x = np.array([[60000.0, 60000.0], [1.0, 2.0]])
    target = [iv.Layer("fp16 sum", lambda v: iv.sum_(v, iv.Kernel("sequential", acc="float16")))]
    reference = [iv.Layer("fp32 sum", lambda v: iv.sum_(v, iv.Kernel("sequential", acc="float32")))]
    v = iv.classify(target, reference, x)
    c = v.layers[0]
    assert v.verdict == "Type-I"  # float16's range explains it: round-off, not a bug
    assert c.nonfinite == 1 and c.nonfinite_index == (0,) and c.nonfinite_target == math.inf
    assert c.nonfinite_reference == 120000.0 and "non-finite in one program only" in str(v)


def test_a_non_finite_reference_the_bound_excludes_is_a_bug():
    x = np.array([[1.0, 2.0], [3.0, 4.0]])
    prog = [iv.Layer("sum", lambda v: iv.sum_(v, iv.Kernel()))]
    for bad in (np.array([3.0, math.nan]), np.array([math.inf, 7.0])):
        v = iv.classify(prog, bad, x)
        assert v.verdict == "Type-II" and v.margin == -math.inf and v.nonfinite == 1


def test_nan_in_both_programs_where_the_bound_allows_nan_is_no_difference():
    x = np.array([[math.inf, -math.inf, 1.0], [1.0, 2.0, 3.0]])
    prog = [iv.Layer("sum", lambda v: iv.sum_(v, iv.Kernel("pairwise")))]
    v = iv.classify(prog, prog, x)
    assert v.verdict == "Type-I" and v.nonfinite == 0
    assert iv.classify(prog, np.array([math.nan, 6.0]), x).verdict == "Type-I"
    assert iv.classify(prog, np.array([0.0, 6.0]), x).verdict == "Type-II"  # NaN only: 0 is not possible


# --------------------------------------------------------------------------- reference_rule: two bounds


def _sum_layer(order: str, acc: str) -> iv.Layer:
    kernel = iv.Kernel(order, acc=acc)
    return iv.Layer(f"{order} {acc}", lambda v: iv.sum_(v, kernel))


@pytest.mark.parametrize("order, executed", [("pairwise", "nan"), ("sequential", "inf")])
@pytest.mark.parametrize("rule", iv.RULES)
def test_a_reference_that_overflows_in_float16_is_not_a_bug_under_reference_rule(order, executed, rule):
    target, reference = _sum_layer(order, "float32"), _sum_layer(order, "float16")
    t, r = float(target.execute(X)[0]), float(reference.execute(X)[0])
    assert t == 0.0 and str(r) == executed  # the float16 kernel overflows; float32 does not
    exact = sum(Fraction(v) for v in X[0])
    tb = iv.sum_(iv.point(X, rule), iv.Kernel(order, acc="float32"))
    rb = iv.sum_(iv.point(X, rule), iv.Kernel(order, acc="float16"))
    for b in (tb, rb):  # the exact sum lies in both bounds: they overlap
        lo, hi = float(b.lo[0]), float(b.hi[0])
        assert (lo == -np.inf or Fraction(lo) <= exact) and (hi == np.inf or exact <= Fraction(hi))
    assert rb.contains(r).all() and tb.contains(t).all()
    v = iv.classify(target, reference, X, rule=rule, reference_rule=rule)
    assert v.verdict == "Type-I", str(v)
    assert v.nonfinite == 1  # still reported
    # compared as a point (the source's test) the NaN or inf reference stays outside
    assert iv.classify(target, reference, X, rule=rule).verdict == "Type-II"


@pytest.mark.parametrize("rule", iv.RULES)
def test_a_mask_bias_that_overflows_float16_is_not_a_bug_under_reference_rule(rule):
    s = np.array([[0.5, -0.25, 1.0], [2.0, 0.0, -1.0]])
    bias = np.array([[-1e9, -1e9, -1e9], [0.0, -1e9, 0.0]])  # row 0 fully masked

    def program(fmt):
        return iv.Layer(f"masked softmax {fmt}", lambda x: iv.softmax(iv.add(x, bias, fmt), fmt))

    target, reference = program("float32"), program("float16")
    assert np.isnan(reference.execute(s)[0]).all()  # -1e9 is -inf in float16: 0 / 0
    assert np.allclose(target.execute(s)[0], 1 / 3)
    v = iv.classify(target, reference, s, rule=rule, reference_rule=rule)
    assert v.verdict == "Type-I", str(v)
    assert v.nonfinite == 3


def test_a_nan_reference_whose_own_bound_excludes_nan_is_still_judged_against_the_target():
    bound = iv.Interval(np.array([0.0]), np.array([1.0]))
    ref_bound = iv.Interval(np.array([0.0]), np.array([1.0]))  # says "never NaN"
    from precisionlab.intervals.verdicts import _margins

    assert _margins(bound, np.array([np.nan]), ref_bound)[0] == -np.inf
    assert _margins(bound, np.array([np.nan]), None)[0] == -np.inf
    both = iv.Interval(np.array([0.0]), np.array([1.0]), nan=True)
    assert _margins(both, np.array([np.nan]), iv.Interval(np.array([5.0]), np.array([6.0]), nan=True))[0] == 0.0


def test_genuine_bugs_stay_type_ii_under_reference_rule():
    def scale(c):
        return iv.Layer(f"sum x {c}", lambda v: iv.mul(iv.sum_(v, iv.Kernel("pairwise", acc="float16")), c,
                                                        "float16"))

    x = np.array([[1.0, 2.0, 3.0, 4.0]])
    assert iv.classify(scale(1.0), scale(2.0), x, reference_rule="structure").verdict == "Type-II"
    # a NaN from an overflow in the reference that no correct computation of it gives
    y = np.array([[3e4, 3e4, -3e4, -3e4]])
    bug = iv.Layer("bug", lambda v: iv.sum_(v, iv.Kernel("pairwise", acc="float16")) * np.nan
                   if not isinstance(v, iv.Interval) else iv.sum_(v, iv.Kernel("pairwise", acc="float16")))
    assert iv.classify(_sum_layer("pairwise", "float32"), bug, y, reference_rule="structure").verdict == "Type-II"
