"""The phantom explorer's views drawn from a copy of the runs' figure are the views drawn anew."""

from __future__ import annotations

import dataclasses

import matplotlib

matplotlib.use("Agg")

from precisionlab import rl, widgets
from precisionlab.widgets.figure_json import figure_spec

KW = {"engine": "bf16", "trainer": "fp32", "eps": 0.2, "lr": 1.5e-4, "steps": 3}


def _runs():
    base = rl.RunConfig(trainer="fp32", engine="bf16", lr=1.5e-4, steps=3)
    return {(t, 0.2): rl.train(rl.PolicyConfig(), rl.with_changes(base, trainer=t), seed=0,
                               progress=False) for t in ("fp32", "bf16")}


def _fresh(runs):
    """The same logs as new objects: a view of them cannot reuse a figure drawn for the others."""
    return {k: dataclasses.replace(v) for k, v in runs.items()}


def test_copied_figures_are_the_figures_drawn_anew():
    runs = _runs()
    for step in (None, 0, 2, 1):  # None and 0 draw, 2 and 1 copy the marked figure
        text, fig = widgets.phantom_view(**KW, step=step, runs=runs)
        new_text, new_fig = widgets.phantom_view(**KW, step=step, runs=_fresh(runs))
        assert str(text) == str(new_text)
        assert figure_spec(fig) == figure_spec(new_fig), step
        assert fig is not new_fig and len(fig.axes) == 2
    # each call returns a figure of its own: marking one leaves the next untouched
    _, a = widgets.phantom_view(**KW, step=2, runs=runs)
    _, b = widgets.phantom_view(**KW, step=0, runs=runs)
    assert [list(ax.lines[-1].get_xdata()) for ax in a.axes] == [[2, 2]] * 2
    assert [list(ax.lines[-1].get_xdata()) for ax in b.axes] == [[0, 0]] * 2


def test_a_changed_style_draws_the_figure_again():
    runs = _runs()
    _, before = widgets.phantom_view(**KW, step=1, runs=runs)
    with matplotlib.rc_context({"lines.linewidth": 3.5}):
        _, styled = widgets.phantom_view(**KW, step=1, runs=runs)
        _, drawn = widgets.phantom_view(**KW, step=1, runs=_fresh(runs))
    assert figure_spec(styled) == figure_spec(drawn) != figure_spec(before)
