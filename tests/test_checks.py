"""The shared input checks: errors name the bad value and what is allowed."""

import math

import numpy as np
import pytest

from precisionlab.checks import check_choice, check_positive


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
