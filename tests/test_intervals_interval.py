"""precisionlab.intervals.interval: the Interval type, point, hull, concrete and rule mixing.

The constructor's NaN and empty-range encoding, element by element; the executed value and the
NaN flags carried through gathers, reshapes and transposes (3-D, explicit axes); point, hull,
concrete; values and rules carried through an operation; and messages that name what was
wrong. Expected values are written out by hand from the documented convention (an element is
[lo, hi] U N).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from oracles import equal_with_nan

from precisionlab import intervals as iv

INF = math.inf


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
    assert equal_with_nan(g.lo, lo[1, :, 1:3]) and equal_with_nan(g.hi, lo[1, :, 1:3] + 0.5)
    assert equal_with_nan(g.value, lo[1, :, 1:3] + 0.25)
    assert g.nan.tolist() == nan[1, :, 1:3].tolist() and g.nan.any()
    assert g.rule == "oblivious"


def test_reshape_keeps_value_nan_and_rule():
    x, lo, nan = _cube()
    r = x.reshape(4, 6)
    assert equal_with_nan(r.lo, lo.reshape(4, 6)) and equal_with_nan(r.hi, lo.reshape(4, 6) + 0.5)
    assert equal_with_nan(r.value, lo.reshape(4, 6) + 0.25)
    assert r.nan.tolist() == nan.reshape(4, 6).tolist() and r.rule == "oblivious"


@pytest.mark.parametrize("axes", [(), (1, 0, 2), (2, 0, 1)])
def test_transpose_with_explicit_axes_moves_every_field(axes):
    x, lo, nan = _cube()
    t = x.transpose(*axes)
    want = lo.transpose(axes or None)
    assert t.shape == want.shape
    assert equal_with_nan(t.lo, want) and equal_with_nan(t.hi, want + 0.5) and equal_with_nan(t.value, want + 0.25)
    assert t.nan.tolist() == nan.transpose(axes or None).tolist()
    assert t.rule == "oblivious"


def test_with_rule_changes_only_the_rule():
    x, lo, nan = _cube()
    y = x.with_rule("structure")
    assert y.rule == "structure" and x.rule == "oblivious"
    assert equal_with_nan(y.lo, lo) and equal_with_nan(y.hi, lo + 0.5) and equal_with_nan(y.value, lo + 0.25)
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
    assert equal_with_nan(p.value, [1.5, -2.0]) and equal_with_nan(p.lo, p.hi)
    h = iv.hull([3.0, -1.0], [1.0, 2.0])
    assert h.lo.tolist() == [1.0, -1.0] and h.hi.tolist() == [3.0, 2.0]
    assert equal_with_nan(h.value, [3.0, -1.0])  # defaults to the first program's values
    h2 = iv.hull([3.0, -1.0], [1.0, 2.0], value=[2.0, 0.0])
    assert equal_with_nan(h2.value, [2.0, 0.0])
    assert equal_with_nan(iv.concrete(np.array([1.0, 2.0])), [1.0, 2.0])
    assert equal_with_nan(iv.concrete(h2), [2.0, 0.0])


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
