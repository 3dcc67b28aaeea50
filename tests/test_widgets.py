"""Tests for precisionlab.widgets: views build without a display, defaults are drawn, bad
input is rejected with a message naming it, and callbacks survive bad input."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import ipywidgets
import pytest
from matplotlib.figure import Figure

from precisionlab import widgets


def test_bit_view_shows_fields_of_one():
    panel, fig = widgets.bit_view(1.0, "bfloat16")
    # IEEE layout of 1.0 in bf16: sign 0, biased exponent 127, fraction 0.
    assert "0 01111111 0000000" in panel.text
    assert "next_up    = 1.0078125" in panel.text  # 1 + 2^-7
    assert "next_down  = 0.99609375" in panel.text  # 1 - 2^-8: the gap halves below 1
    assert isinstance(fig, Figure) and len(fig.axes) == 1
    assert fig.axes[0].collections  # the grid ticks were drawn
    assert "<pre" in panel._repr_html_()


def test_bit_explorer_displays_default_view_then_returns_controls(capsys):
    box = widgets.bit_explorer(0.1, "float16", "toward_zero")
    out = capsys.readouterr().out  # outside IPython, display() prints the objects
    assert "rounded into float16 (toward_zero)" in out
    assert isinstance(box, ipywidgets.HBox)
    value_box, fmt_box, mode_box = box.children
    assert (value_box.value, fmt_box.value, mode_box.value) == (0.1, "float16", "toward_zero")
    fmt_box.value = "float8_e5m2"  # the callback redraws
    assert "rounded into float8_e5m2" in capsys.readouterr().out
    value_box.value = 1e9  # out of e5m2's range: the callback reports instead of raising
    assert "outside float8_e5m2's finite range" in capsys.readouterr().out


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"fmt": "fp7"}, "valid choices"),
        ({"mode": "stochastic"}, "valid choices"),
        ({"value": float("inf")}, "finite"),
        ({"value": "abc"}, "real number"),
        ({"value": 1e6, "fmt": "float16"}, "finite range"),
    ],
)
def test_bit_explorer_rejects_bad_input(kwargs, match):
    with pytest.raises(ValueError, match=match):
        widgets.bit_explorer(**kwargs)


def test_crossing_view_and_explorer(capsys):
    panel, fig = widgets.crossing_view(1.0, 1e-5)
    assert "exact steps to first change   : 391" in panel.text  # 2^-8 / 1e-5 = 390.6 -> 391
    assert "float32-master simulation     : 391" in panel.text
    assert len(fig.axes) == 1 and len(fig.axes[0].get_lines()) >= 2
    box = widgets.crossing_explorer(0.5, 1e-4, "float16")
    assert "float16" in capsys.readouterr().out
    _, lr_box, _ = box.children
    lr_box.value = 1e-2
    assert "lr = 0.01" in capsys.readouterr().out


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"lr": 0.0}, "nonzero"),
        ({"fmt": "float64"}, "narrower than float64"),
        ({"w": 1.0, "lr": 1e-9}, "at most"),
        ({"w": float("nan")}, "finite"),
    ],
)
def test_crossing_explorer_rejects_bad_input(kwargs, match):
    with pytest.raises(ValueError, match=match):
        widgets.crossing_explorer(**kwargs)


def test_figures_are_displayed_as_png_images():
    """The default view must not depend on a matplotlib backend's Figure formatter."""
    _, fig = widgets.bit_view(0.5, "float16")
    image = widgets._as_image(fig)
    assert image.data[:8] == b"\x89PNG\r\n\x1a\n"
