"""Chapter 10's world-size explorer: its views, their checks, and the static control's size."""

from __future__ import annotations

import numpy as np
import pytest

from precisionlab.widgets.collectives import (
    COLLECTIVE_GRID,
    collective_data,
    collective_view,
    ulp_shifts,
)


def test_world_size_one_changes_nothing_and_four_does():
    one, _ = collective_view(1, "ring", "float32")
    assert "differ from W = 1: 0 of 512" in one.text
    four, fig = collective_view(4, "ring", "float32")
    assert "differ from W = 1: 0 of 512" not in four.text
    assert fig.axes[0].get_title() == "W = 4, ring, float32"


def test_bad_choices_name_the_field():
    with pytest.raises(ValueError, match="world_size"):
        collective_view(5)  # 96 examples: no even split
    with pytest.raises(ValueError, match="fmt"):
        collective_view(4, "ring", "float16")


def test_ulp_shifts_and_data():
    assert ulp_shifts([1.0 + 2.0**-23], [1.0], "float32")[0] == 1.0
    x = collective_data()
    assert x.shape == (64, 512) and np.array_equal(x, x.astype(np.float32))
    assert len(COLLECTIVE_GRID["world_size"]) >= 12  # the main slider: 12 positions or more
    assert np.prod([len(v) for v in COLLECTIVE_GRID.values()]) == 120
