"""precisionlab.intervals on the cases a mutation run (scripts/mutation_run.py) found untested.

The Interval constructor's NaN and empty-range encoding, element by element; the executed
value and the NaN flags carried through gathers, reshapes and transposes (3-D, explicit axes);
point/hull/concrete and rule mixing; and messages that name what was wrong. Expected values
are written out by hand from the documented convention (an element is [lo, hi] U N).
"""

from __future__ import annotations

import math

import mpmath
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


def _same(a, b) -> bool:
    """Arrays equal elementwise, NaN equal to NaN."""
    return np.array_equal(np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64), equal_nan=True)


# --------------------------------------------------------------------------- the constructor


def test_nan_ends_encode_one_sided_and_empty_ranges_element_by_element():
    nan = math.nan
    x = iv.Interval([nan, 1.0, nan, 2.0], [3.0, nan, nan, 4.0])
    # lo NaN: unbounded below; hi NaN: unbounded above; both: NaN only (empty); neither: as given
    assert x.lo.tolist() == [-INF, 1.0, INF, 2.0]
    assert x.hi.tolist() == [3.0, INF, -INF, 4.0]
    assert x.nan.tolist() == [True, True, True, False]
    assert x.empty.tolist() == [False, False, True, False]
    one = iv.Interval(nan, 5.0)  # only a lower end missing (both sides are checked separately)
    assert (float(one.lo), float(one.hi), bool(one.nan)) == (-INF, 5.0, True)


def test_the_nan_flag_is_broadcast_as_booleans_and_defaults_to_false():
    x = iv.Interval([0.0, 1.0, 2.0], [1.0, 2.0, 3.0], nan=[0, 2, 0])
    assert x.nan.dtype == bool and x.nan.tolist() == [False, True, False]
    y = iv.Interval([0.0, 1.0], [1.0, 2.0], nan=1)
    assert y.nan.tolist() == [True, True]
    assert iv.Interval([0.0, 1.0], [1.0, 2.0]).nan.tolist() == [False, False]


def test_an_empty_range_needs_exactly_plus_inf_minus_inf():
    e = iv.Interval(INF, -INF)
    assert bool(e.empty) and bool(e.nan)
    with pytest.raises(ValueError, match=r"lower bounds must not exceed upper bounds"):
        iv.Interval(INF, 0.0)  # lo = +inf alone is not the empty encoding
    with pytest.raises(ValueError, match=r"lower bounds must not exceed upper bounds"):
        iv.Interval(0.0, -INF)
    with pytest.raises(ValueError, match=r"got lo=\[1\. 2\. 3\.\], hi=\[0\. 0\. 0\.\] \(an empty"):
        iv.Interval([1.0, 2.0, 3.0, 4.0], 0.0)  # the message shows the first three


def test_no_value_stays_none_and_an_unknown_rule_is_named():
    x = iv.Interval([0.0, 1.0], [1.0, 2.0])
    assert x.value is None
    with pytest.raises(ValueError, match=r"^this Interval carries no executed value; build it with point"):
        iv.concrete(x)
    with pytest.raises(ValueError, match=r"^unknown rule 'tight'; valid choices: structure, oblivious$"):
        iv.Interval(0.0, 1.0, rule="tight")


# --------------------------------------------------------------------------- exact shape operations


def _cube():
    lo = np.arange(24.0).reshape(2, 3, 4)
    nan = (np.arange(24) % 3 == 0).reshape(2, 3, 4)
    return iv.Interval(lo, lo + 0.5, lo + 0.25, "oblivious", nan), lo, nan


def test_gathers_keep_value_nan_and_rule():
    x, lo, nan = _cube()
    g = x[1, :, 1:3]
    assert _same(g.lo, lo[1, :, 1:3]) and _same(g.hi, lo[1, :, 1:3] + 0.5)
    assert _same(g.value, lo[1, :, 1:3] + 0.25)
    assert g.nan.tolist() == nan[1, :, 1:3].tolist() and g.nan.any()
    assert g.rule == "oblivious"


def test_reshape_keeps_value_nan_and_rule():
    x, lo, nan = _cube()
    r = x.reshape(4, 6)
    assert _same(r.lo, lo.reshape(4, 6)) and _same(r.hi, lo.reshape(4, 6) + 0.5)
    assert _same(r.value, lo.reshape(4, 6) + 0.25)
    assert r.nan.tolist() == nan.reshape(4, 6).tolist() and r.rule == "oblivious"


@pytest.mark.parametrize("axes", [(), (1, 0, 2), (2, 0, 1)])
def test_transpose_with_explicit_axes_moves_every_field(axes):
    x, lo, nan = _cube()
    t = x.transpose(*axes)
    want = lo.transpose(axes or None)
    assert t.shape == want.shape
    assert _same(t.lo, want) and _same(t.hi, want + 0.5) and _same(t.value, want + 0.25)
    assert t.nan.tolist() == nan.transpose(axes or None).tolist()
    assert t.rule == "oblivious"


def test_with_rule_changes_only_the_rule():
    x, lo, nan = _cube()
    y = x.with_rule("structure")
    assert y.rule == "structure" and x.rule == "oblivious"
    assert _same(y.lo, lo) and _same(y.hi, lo + 0.5) and _same(y.value, lo + 0.25)
    assert y.nan.tolist() == nan.tolist()


def test_repr_states_shape_rule_width_and_nan_count():
    x, _, nan = _cube()
    assert repr(x) == (f"Interval(shape=(2, 3, 4), rule='oblivious', max width=0.5, "
                       f"may be NaN at {int(nan.sum())})")
    assert repr(iv.Interval(np.zeros(0), np.zeros(0))) == \
        "Interval(shape=(0,), rule='structure', max width=0)"


# --------------------------------------------------------------------------- points, hulls, values


def test_point_and_hull_carry_the_executed_value():
    p = iv.point([1.5, -2.0])
    assert _same(p.value, [1.5, -2.0]) and _same(p.lo, p.hi)
    h = iv.hull([3.0, -1.0], [1.0, 2.0])
    assert h.lo.tolist() == [1.0, -1.0] and h.hi.tolist() == [3.0, 2.0]
    assert _same(h.value, [3.0, -1.0])  # defaults to the first program's values
    h2 = iv.hull([3.0, -1.0], [1.0, 2.0], value=[2.0, 0.0])
    assert _same(h2.value, [2.0, 0.0])
    assert _same(iv.concrete(np.array([1.0, 2.0])), [1.0, 2.0])
    assert _same(iv.concrete(h2), [2.0, 0.0])


def test_an_operation_carries_values_only_when_both_operands_have_one():
    a, b = iv.point([1.0, 2.0]), iv.Interval([0.0, 0.0], [1.0, 1.0])
    assert iv.add(a, a, "float32").value.tolist() == [2.0, 4.0]
    assert iv.add(a, b, "float32").value is None
    assert iv.add(b, a, "float32").value is None
    assert iv.add(a, np.array([0.5, 0.5]), "float32").value.tolist() == [1.5, 2.5]


def test_operands_with_different_rules_cannot_be_mixed():
    a, b = iv.point([1.0]), iv.point([2.0], rule="oblivious")
    with pytest.raises(ValueError, match=r"^operands carry different rules \['oblivious', 'structure'\]"):
        iv.add(a, b)
    assert iv.add(b, b).rule == "oblivious"


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
        assert _same(got.value, want), name
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
    assert _same(got.value, ref) and np.all(got.contains(ref)), name


@pytest.mark.filterwarnings("error")
@pytest.mark.parametrize("name", list(UNARY))
def test_unary_rules_carry_the_executed_value(name):
    op = UNARY[name]
    x = np.abs(A) if name == "sqrt" else np.minimum(A, 80.0)
    want = op(x)
    got = op(iv.point(x, rule="oblivious"))
    assert _same(got.value, want) and np.all(got.contains(want)), name
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
        assert _same(op(x, y).lo, op(x, y, "float32").lo) and _same(op(x, y).hi, op(x, y, "float32").hi)
    for op in (iv.sqrt, iv.exp, iv.softmax, iv.log_softmax):
        assert _same(op(x).lo, op(x, "float32").lo) and _same(op(x).hi, op(x, "float32").hi)
        assert _same(op(x).value, op(x, "float32").value)


# --------------------------------------------------------------------------- outward rounding and corners

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


# --------------------------------------------------------------------------- sums and matmuls (bounds)

K = iv.Kernel


def _factors(n: int, kernel, rule: str) -> tuple[np.ndarray, np.ndarray]:
    """Per summand: the documented upper factor prod_stage (1 + u)^depth and lower prod (1 - theta)."""
    u = {"tile": kernel.acc, "warp": kernel.acc, "combine": kernel.combine_format.name,
         "partial": kernel.partial}
    if rule == "oblivious":
        fmts = [kernel.acc, kernel.combine_format.name] + ([kernel.partial] if kernel.partial else [])
        uu = max(get_format(f).eps / 2 for f in fmts)
        d = n - 1 + (kernel.partial is not None) + (kernel.combine is not None)
        g = (1 + uu) ** d
        return np.full(n, g), np.full(n, 2 - g)
    up_f, lo_f = np.ones(n), np.ones(n)
    for stage, depths in iv.leaf_depths(n, kernel).items():
        g = (1 + get_format(u[stage]).eps / 2) ** depths.astype(float)
        up_f, lo_f = up_f * g, lo_f * (2 - g)
    return up_f, lo_f


TIGHT_KERNELS = [
    K("sequential"), K("pairwise"), K("blocked", block=32), K("blocked", block=16, combine="bfloat16"),
    K("split_k", splits=4), K("split_k", splits=3, partial="float16"), K("atomic", block=8),
    K("atomic", block=1), K("warp", threads=32),
]


@pytest.mark.parametrize("rule", ["structure", "oblivious"])
@pytest.mark.parametrize("kernel", TIGHT_KERNELS, ids=lambda k: f"{k.order}-{k.block}-{k.partial}-{k.combine}")
def test_sum_bounds_are_as_tight_as_the_documented_factors(kernel, rule):
    # positive summands, the large ones last: a short last tile, padding and wrong depths all show
    x = np.concatenate([np.full(32, 1e-3), np.linspace(1.0, 2.0, 8)])
    b = iv.sum_(iv.point(x, rule=rule), kernel)
    up_f, lo_f = _factors(x.size, kernel, rule)
    exact = math.fsum(x.tolist())
    hi_doc, lo_doc = math.fsum((x * up_f).tolist()), math.fsum((x * lo_f).tolist())
    names = [kernel.acc, kernel.combine_format.name, kernel.out_format.name, kernel.partial or kernel.acc]
    slack = (x.size // 8 + 3) * max(get_format(f).eps for f in names) * hi_doc  # outward casts
    assert lo_doc - slack <= float(b.lo) <= exact <= float(b.hi) <= hi_doc + slack, \
        (float(b.lo), lo_doc, exact, hi_doc, float(b.hi))


@pytest.mark.parametrize("kernel", [K("sequential", acc="float16"), K("pairwise", acc="float16"),
                                    K("blocked", acc="float16", block=2)])
def test_partial_sums_that_cancel_do_not_count_as_overflow(kernel):
    # every ordered partial sum stays within float16's 65504; the positive terms alone do not
    b = iv.sum_(iv.point([6e4, -6e4, 6e4, -6e4]), kernel)
    assert np.isfinite(b.lo) and np.isfinite(b.hi) and not b.nan
    x = np.zeros(96)
    x[[0, 32, 64]] = [6e4, -6e4, 6e4]  # one warp thread sums 6e4, -6e4, 6e4 in order
    w = iv.sum_(iv.point(x), K("warp", acc="float16", threads=32))
    assert 59000 < float(w.lo) <= 6e4 <= float(w.hi) < 61000


def test_overflow_in_a_narrow_accumulator_reaches_a_wide_output():
    k = K("pairwise", acc="float16", out="float32")
    assert iv.sum_(np.array([3e4, 3e4, 3e4]), k) == INF  # the root 9e4 overflows float16
    assert iv.sum_(iv.point([3e4, 3e4, 3e4]), k).hi == INF
    k = K("sequential", acc="float16", out="float32")  # 32752 + 32768 = 65520 ties to inf
    assert iv.sum_(np.array([32752.0, 32768.0]), k) == INF
    assert iv.sum_(iv.Interval([0.0, 0.0], [32752.0, 32768.0]), k).hi == INF
    rows = iv.sum_(iv.point([[65504.0, 0.0], [1.0, 2.0]]), K("pairwise", acc="float16"))
    assert rows.hi[0] == INF and 3 <= rows.hi[1] < 3.01  # one row's overflow stays in its row
    rows = iv.sum_(iv.Interval([[0.0, 0.0], [1.0, 2.0]], [[1.0, INF], [1.0, 2.0]]), K("sequential"))
    assert rows.hi[0] == INF and 3 <= rows.hi[1] < 3.01 and not rows.nan.any()


def test_a_range_with_one_infinite_end_sums_to_that_infinity():
    b = iv.sum_(iv.Interval([-INF, 1.0], [1.0, 2.0]), K("sequential"))
    assert b.lo == -INF and 3 <= b.hi < 3.001 and not b.nan


def test_subnormal_partials_are_bounded_absolutely():
    # tiles of 2 summing to 9e-8, 1.5 of float16's smallest subnormal: the partial rounds by 33%
    x = np.full(8, 4.5e-8)
    for rule in ("structure", "oblivious"):
        for kernel in (K("split_k", splits=4, partial="float16"), K("atomic", block=2, partial="float16")):
            b = iv.sum_(iv.point(x, rule=rule), kernel)
            for seed in range(4):
                v = iv.sum_(x, kernel, seed=seed)
                assert b.lo <= v <= b.hi, (rule, kernel.order, float(b.lo), v, float(b.hi))


def test_truncated_subnormal_partials_lose_up_to_q_each():
    # four tiles of 2 x 0.995 q: each tile sums to 1.99 q and is truncated to q in float16
    q = get_format("float16").min_subnormal
    x = np.full(8, 0.995 * q)
    k = K("split_k", splits=4, partial="float16", mode="toward_zero")
    v = iv.sum_(x, k)
    assert v == 4 * q
    for rule in ("structure", "oblivious"):
        b = iv.sum_(iv.point(x, rule=rule), k)
        assert b.lo <= v <= b.hi, (rule, float(b.lo) / q, float(b.hi) / q)


def test_an_atomic_kernel_adding_in_float16_is_bounded_in_float16():
    x = np.full(16, 1 + 2.0**-12)  # float16 additions of these lose their low bits
    k = K("atomic", block=1, combine="float16")
    b = iv.sum_(iv.point(x), k)
    for seed in range(4):
        v = iv.sum_(x, k, seed=seed)
        assert b.lo <= v <= b.hi
    assert b.hi - b.lo > 2.0**-6  # float16 steps, not float32 ones


def test_sums_and_matmuls_carry_executed_values():
    x = np.array([[0.1, 0.2, 0.3], [1.0, -2.0, 4.0]])
    assert _same(iv.sum_(iv.point(x)).value, iv.sum_(x))
    assert iv.sum_(iv.point(x), K("atomic", block=1)).value is None  # no seed: no execution
    assert _same(iv.sum_(iv.point(x), K("atomic", block=1), seed=3).value, iv.sum_(x, K("atomic", block=1), seed=3))
    a, b = x, x.T
    m = iv.matmul(a, iv.point(b))
    assert isinstance(m, iv.Interval) and _same(m.value, iv.matmul(a, b)) and np.all(m.contains(iv.matmul(a, b)))
    assert _same(iv.matmul(iv.point(a), iv.point(b)).value, iv.matmul(a, b))


def test_the_oblivious_rule_is_wider_for_tensor_cores_too():
    g = np.random.default_rng(0)
    a, b = g.uniform(0.5, 1, (2, 64)), g.uniform(0.5, 1, (64, 2))
    k = K("tensor_core", inputs="float16")
    s = iv.matmul(iv.point(a), iv.point(b), k)
    o = iv.matmul(iv.point(a, rule="oblivious"), iv.point(b, rule="oblivious"), k)
    assert np.all(o.hi > s.hi) and np.all(o.lo < s.lo)
    ex = iv.matmul(a, b, k)
    assert np.all(s.contains(ex)) and np.all(o.contains(ex))


def test_tensor_core_bounds_with_tiny_and_cancelling_products():
    k16 = K("tensor_core", inputs="float16", out="float16")
    B = 4  # the A100 model's block of products
    # one product of 1.5 q per block: each block's float16 result rounds 1.5 q to 2 q, and the
    # four blocks give 8 q for the exact 6 q
    a = np.zeros((1, 4 * B))
    a[0, ::B] = 1.5 * 2.0**-12
    b = np.full((4 * B, 1), 2.0**-12)
    m = iv.matmul(iv.point(a), iv.point(b), k16)
    assert iv.matmul(a, b, k16)[0, 0] == 8 * 2.0**-24 and m.contains(iv.matmul(a, b, k16)).all()
    # block sums 6e4, -6e4, 6e4: no float16 overflow in order, though the positive terms reach 1.2e5
    a = np.array([[15000.0] * B + [-15000.0] * B + [15000.0] * B])
    m = iv.matmul(iv.point(a), iv.point(np.ones((3 * B, 1))), k16)
    assert np.isfinite(m.lo).all() and np.isfinite(m.hi).all()


def test_a_saturating_tensor_core_block_gives_up_the_relative_model():
    # bfloat16 products of 3e38: the first block's sum saturates at float32's largest value,
    # the next subtracts 3e38: the executed result 4e37 is far below the exact 2.1e39
    B = 4
    a = np.zeros((1, 2 * B))
    a[0, :B], a[0, B] = 3e38, -3e38
    k = K("tensor_core", inputs="bfloat16")
    v = iv.matmul(a, np.ones((2 * B, 1)), k)
    m = iv.matmul(iv.point(a), iv.point(np.ones((2 * B, 1))), k)
    assert 3e37 < v[0, 0] < 5e37 and m.contains(v).all()
