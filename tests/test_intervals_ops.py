"""precisionlab.intervals.ops: every elementwise rule on executed values, rules, warnings and corners.

Every binary and unary rule (and the softmax family through the same table) carries the
executed value, refuses operands with different rules, defaults to float32 and raises no
RuntimeWarning on overflow, inf - inf or 0 * inf; products with infinite factors and zeros,
divisions by ranges through zero, sums with one infinite end, amax over an empty element, and
a cast up that returns its operand. Expected values are written out by hand from the
documented convention (an element is [lo, hi] U N), or are the executed float64 results.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from oracles import equal_with_nan

from precisionlab import intervals as iv

INF = math.inf


# --------------------------------------------------------------------------- every rule: values, rules, warnings

A = np.array([[1.5, -2.0, 0.0, 3e38], [0.25, 7.0, -1e-30, 2.0]])
B = np.array([[0.5, 3.0, -0.0, 1e38], [4.0, -7.0, 2.0, -0.125]])
LABELS = np.array([3, 0])
BINARY = {
    "add": lambda a, b: iv.add(a, b, "float16"),
    "sub": lambda a, b: iv.sub(a, b, "bfloat16"),
    "mul": lambda a, b: iv.mul(a, b, "float16"),
    "div": lambda a, b: iv.div(a, b, "float32"),
    "fast div": lambda a, b: iv.div(a, b, "float32", fast=True),
    "maximum": iv.maximum,
    "where": lambda a, b: iv.where(np.array([[True, False, True, False], [False, True, True, False]]), a, b),
}
UNARY = {
    "cast": lambda x: iv.cast(x, "bfloat16", "up"),
    "sqrt": lambda x: iv.sqrt(x, "float16"),
    "exp": lambda x: iv.exp(x, "bfloat16"),
    "relu": iv.relu,
    "amax": lambda x: iv.amax(x, axis=0),
    "softmax": lambda x: iv.softmax(x, "float16"),
    "log_softmax": lambda x: iv.log_softmax(x, "bfloat16"),
    "cross_entropy": lambda x: iv.cross_entropy(x, LABELS, "float32"),
}


@pytest.mark.filterwarnings("error")  # overflow, inf - inf, 0 * inf: no RuntimeWarning either way
@pytest.mark.parametrize("name", list(BINARY))
def test_binary_rules_carry_the_executed_value_and_check_rules(name):
    op = BINARY[name]
    want = op(A, B)
    for a, b in ((iv.point(A), iv.point(B)), (iv.point(A), B), (A, iv.point(B))):
        got = op(a, b)
        assert equal_with_nan(got.value, want), name
        assert np.all(got.contains(want)), name
    with pytest.raises(ValueError, match="different rules"):
        op(iv.point(A), iv.point(B, rule="oblivious"))
    with pytest.raises(ValueError, match="different rules"):
        op(iv.point(A, rule="oblivious"), iv.point(B))
    assert op(iv.point(A, rule="oblivious"), iv.point(B, rule="oblivious")).rule == "oblivious"
    special = np.array([np.inf, -np.inf, np.nan, 0.0, -0.0, 1e308, -1e308, 5e-324])
    if "div" in name:  # see test_dividing_by_the_smallest_subnormal_warns
        special = special[:-1]
    s = np.broadcast_to(special, (special.size, special.size))
    got = op(iv.point(s), iv.point(s.T)) if name != "where" else iv.where(s > 0, iv.point(s), iv.point(s.T))
    ref = op(s, s.T) if name != "where" else iv.where(s > 0, s, s.T)
    assert equal_with_nan(got.value, ref) and np.all(got.contains(ref)), name


@pytest.mark.filterwarnings("error")
@pytest.mark.parametrize("name", list(UNARY))
def test_unary_rules_carry_the_executed_value(name):
    op = UNARY[name]
    x = np.abs(A) if name == "sqrt" else np.minimum(A, 80.0)
    want = op(x)
    got = op(iv.point(x, rule="oblivious"))
    assert equal_with_nan(got.value, want) and np.all(got.contains(want)), name
    assert got.rule == "oblivious"
    assert op(iv.Interval(x, x)).value is None  # no executed value in, none out


@pytest.mark.xfail(raises=RuntimeWarning, reason="ops.div takes 1/b_hi in float64 without "
                   "errstate(over='ignore'); 1/5e-324 overflows and NumPy warns")
@pytest.mark.filterwarnings("error")
def test_dividing_by_the_smallest_subnormal_warns():
    got = iv.div(iv.point([1.0]), iv.point([5e-324]))
    assert got.hi[0] == math.inf and got.contains(math.inf).all()


def test_every_rule_defaults_to_float32():
    x, y = iv.point([[1.1, 2.3], [0.7, 5.0]]), iv.point([[3.3, 0.9], [1.7, 2.0]])
    for op in (iv.add, iv.sub, iv.mul, iv.div):
        assert equal_with_nan(op(x, y).lo, op(x, y, "float32").lo) and equal_with_nan(op(x, y).hi, op(x, y, "float32").hi)
    for op in (iv.sqrt, iv.exp, iv.softmax, iv.log_softmax):
        assert equal_with_nan(op(x).lo, op(x, "float32").lo) and equal_with_nan(op(x).hi, op(x, "float32").hi)
        assert equal_with_nan(op(x).value, op(x, "float32").value)


# --------------------------------------------------------------------------- corners: infinities, zeros, empty elements


def test_infinite_factors_and_zeros_in_products():
    # an exactly infinite factor times a positive range: exactly +inf, never NaN
    p = iv.mul(iv.point([INF]), iv.Interval([0.5], [2.0]))
    assert (p.lo[0], p.hi[0], bool(p.nan[0])) == (INF, INF, False)
    assert iv.mul(iv.point([1.0]), iv.point([INF])).lo[0] == INF
    assert not iv.mul(iv.point([INF]), iv.point([2.0])).nan[0]
    assert not iv.mul(iv.Interval([0.5], [2.0]), iv.point([INF])).nan[0]
    # 0 within one factor and +-inf possible in the other: 0 * inf = NaN may happen
    assert iv.mul(iv.point([INF]), iv.Interval([0.0], [5.0])).nan[0]
    assert iv.mul(iv.point([0.0]), iv.Interval([-INF], [5.0])).nan[0]
    z = iv.mul(iv.point([0.0]), iv.Interval([-INF], [INF]))  # 0 times every finite value: 0
    assert -1e-44 < z.lo[0] <= 0.0 <= z.hi[0] < 1e-44 and z.nan[0]
    # an empty factor (NaN only) gives an empty product, whatever the other factor
    for e in (iv.mul(iv.Interval([INF], [-INF]), iv.point([2.0])),
              iv.mul(iv.point([2.0]), iv.Interval([INF], [-INF])),
              iv.div(iv.Interval([INF], [-INF]), iv.Interval([-1.0], [1.0])),
              iv.div(iv.point([2.0]), iv.Interval([INF], [-INF]))):
        assert (e.lo[0], e.hi[0], bool(e.nan[0])) == (INF, -INF, True)


@pytest.mark.filterwarnings("error")
def test_executed_division_overflows_to_inf_silently():
    assert iv.div(np.array([1e308, -1e308]), np.array([1e-10, 1e-10]), "float64").tolist() == [INF, -INF]


def test_division_by_a_range_through_zero():
    q = iv.div(iv.Interval([0.0], [0.5]), iv.Interval([-1.0], [1.0]))
    assert (q.lo[0], q.hi[0], bool(q.nan[0])) == (-INF, INF, True)  # 0 / 0 can happen
    r = iv.div(iv.Interval([1.0], [2.0]), iv.Interval([-1.0], [1.0]))
    assert (r.lo[0], r.hi[0], bool(r.nan[0])) == (-INF, INF, False)


def test_sums_with_one_infinite_end():
    s = iv.add(iv.Interval([-INF], [1.0]), iv.point([1.0]))
    assert s.lo[0] == -INF and s.hi[0] == float(np.nextafter(np.float32(2), np.float32(3)))
    assert not s.nan[0]
    t = iv.add(iv.point([INF]), iv.point([1.0]))
    assert (t.lo[0], t.hi[0], bool(t.nan[0])) == (INF, INF, False)


def test_amax_of_a_column_holding_an_empty_element_is_empty():
    x = iv.Interval([[INF, 0.0], [0.0, 1.0]], [[-INF, INF], [INF, 2.0]])
    m = iv.amax(x, axis=0)
    assert (m.lo[0], m.hi[0], bool(m.nan[0])) == (INF, -INF, True)
    assert (m.lo[1], m.hi[1]) == (1.0, INF)


def test_a_cast_up_returns_its_operand():
    x = iv.Interval([0.1, -3.3], [0.2, 1e-40])  # not float32 values: a real cast would move them
    assert iv.cast(x, "float32", src="bfloat16") is x
    assert iv.cast(x, "float32", src="float16") is x
    y = iv.cast(x, "float16", src="bfloat16")  # bfloat16's range is wider: rounded outward
    assert y is not x and y.lo[0] < 0.1 < 0.2 < y.hi[0]
