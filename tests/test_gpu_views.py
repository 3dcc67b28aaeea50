"""The chapter-2 figures and explorer: they draw what the simulator computes and reject bad input."""

from __future__ import annotations

import numpy as np
import pytest
from matplotlib.figure import Figure

from precisionlab import gpu, plotting, widgets


def test_sum_outcomes_bars_add_up_and_split_at_tol():
    sums = np.array([1.0, 1.0, 1.0 + 2.0**-10, 1.0 - 2.0**-11, 1.0 + 2.0**-10])
    fig = Figure()
    ax = plotting.plot_sum_outcomes(sums, 1.0, 1.0 + 2.0**-11, "float16",
                                    marks={"fixed": 1.0}, ax=fig.subplots())
    heights = [p.get_height() for p in ax.patches]
    assert np.isclose(sum(heights), 1.0) and len(heights) == 3
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert "S < tol: stop (60.0%)" in labels and "S ≥ tol: continue (40.0%)" in labels


def test_flip_probability_plot_draws_both_sides():
    m = np.logspace(-6, -2, 5)
    ax = plotting.plot_flip_probability(m, {"float16": np.linspace(1, 0, 5)},
                                        below={"float16": np.zeros(5)}, ax=Figure().subplots())
    assert len(ax.lines) == 2 and ax.get_xscale() == "log"


def test_residual_plot_has_one_line_per_profile_and_tolerance_lines():
    ax = plotting.plot_residual_histories({"fp32": [1, 0.1, 0.01], "tf32": [1, 0.1, 0.05]},
                                          tol=[0.02], ax=Figure().subplots())
    assert len(ax.lines) == 3 and ax.get_yscale() == "log"


def test_reduction_view_reports_the_simulated_flip_rate():
    panel, fig = widgets.reduction_view("atomic", "float16", 1, 1e-3, n=64, runs=300, seed=3)
    x = widgets.reduction_data(64, 3)
    sums = gpu.reduce_sum(np.broadcast_to(x, (300, 64)), "atomic", "float16", block=1,
                          seed=3)
    rate = gpu.flip_probability(sums, float(gpu.exact_sum(x)), 1e-3)
    assert f"decision flipped in {rate:.1%} of runs" in panel.text
    assert isinstance(fig, Figure)


@pytest.mark.parametrize("kwargs, match", [
    (dict(order="random"), "valid choices: sequential"),
    (dict(acc="float12"), "valid choices"),
    (dict(block=3), "block must be one of"),
    (dict(margin=0.0), "margin must be nonzero"),
    (dict(margin=float("nan")), "margin must be finite"),
])
def test_reduction_view_rejects_bad_controls(kwargs, match):
    with pytest.raises(ValueError, match=match):
        widgets.reduction_view(**kwargs)
