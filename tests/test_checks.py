"""The shared input checks: errors name the bad value and what is allowed."""

import math
import re

import numpy as np
import pytest

from precisionlab.checks import (
    check_choice,
    check_count,
    check_integer,
    check_positive,
    check_positive_int,
    check_real,
)


def test_check_choice_returns_a_valid_value_and_lists_the_choices_otherwise():
    assert check_choice("up", "rounding mode", ("up", "down")) == "up"
    with pytest.raises(ValueError) as err:
        check_choice("sideways", "rounding mode", ("up", "down"))
    assert str(err.value) == "unknown rounding mode 'sideways'; valid choices: up, down"


@pytest.mark.parametrize("good, want", [(3, 3.0), (0.5, 0.5), (np.float32(0.25), 0.25), (np.int64(7), 7.0)])
def test_check_positive_accepts_finite_positive_reals(good, want):
    assert check_positive(good, "lr") == want


@pytest.mark.parametrize("bad", [0, -1.0, math.nan, math.inf, True, "0.5", None, [1.0]])
def test_check_positive_rejects_everything_else_by_name(bad):
    with pytest.raises(ValueError) as err:
        check_positive(bad, "lr")
    assert str(err.value) == f"lr must be a finite number > 0; got lr={bad!r}"


@pytest.mark.parametrize("good, want", [(3, 3.0), (-0.5, -0.5), (np.float32(0.25), 0.25), (np.int64(-7), -7.0)])
def test_check_real_accepts_finite_reals_numpy_scalars_included(good, want):
    assert check_real(good, "w") == want


@pytest.mark.parametrize("bad", [True, "1.5", b"1.5", None, [1.0]])
def test_check_real_rejects_bools_strings_and_non_numbers_by_name(bad):
    with pytest.raises(ValueError) as err:
        check_real(bad, "w")
    assert str(err.value) == f"w must be a real number; got w={bad!r}"


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf, np.float32("nan")])
def test_check_real_rejects_non_finite_values_by_name(bad):
    with pytest.raises(ValueError) as err:
        check_real(bad, "w")
    assert str(err.value) == f"w must be finite; got w={bad!r}"


def test_integer_checks_take_python_and_numpy_integers_and_reject_bools():
    assert check_integer(-3, "k") == -3 and check_count(np.int64(4), "n") == 4
    assert check_count(0, "n", 0) == 0 and check_positive_int(np.int32(9), "m", upper=9) == 9
    assert isinstance(check_count(np.int64(4), "n"), int)
    for bad in (True, 2.0, "3", None):
        with pytest.raises(ValueError, match=re.escape(f"got k={bad!r}")):
            check_integer(bad, "k")
    with pytest.raises(ValueError) as err:
        check_integer(1.5, "margin", " (the scale gets 2^margin of headroom)")
    assert str(err.value) == "margin must be an integer (the scale gets 2^margin of headroom); got margin=1.5"


@pytest.mark.parametrize("bad", [0, -1, True, 2.5, "3"])
def test_check_count_names_the_floor_and_the_bad_value(bad):
    with pytest.raises(ValueError) as err:
        check_count(bad, "steps", 1, " (steps in the window)")
    assert str(err.value) == f"steps must be an integer >= 1 (steps in the window); got steps={bad!r}"


def test_check_positive_int_names_the_bad_value_and_the_upper_limit():
    with pytest.raises(ValueError) as err:
        check_positive_int(0, "splits")
    assert str(err.value) == "splits must be a positive integer; got splits=0"
    with pytest.raises(ValueError) as err:
        check_positive_int(2048, "threads", upper=1024)
    assert str(err.value) == "threads must be at most 1024; got threads=2048"
