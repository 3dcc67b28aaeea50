"""The static view's fast path (Interactive.frames) emits what the straightforward one does.

frames() draws each view on a copy of a pickled blank figure (plotting.figure_copies), pauses the
full-heap garbage collector, and figure_spec reads the tick labels' rotation without making
the ticks. The oracle for each is the plain matplotlib path: the view called on a figure built
from scratch, every tick made (get_majorticklabels), then figure_spec.
"""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import gc
import itertools
import json

import pytest
from matplotlib import rc_context

from precisionlab import widgets
from precisionlab.plotting import figure_copies
from precisionlab.widgets.collectives import collective_explorer
from precisionlab.widgets.figure_json import figure_spec
from precisionlab.widgets.frames import frame_png
from precisionlab.widgets.view import panel_html, view_figure

EXPLORERS = {
    "bit": lambda: widgets.bit_explorer(),
    "crossing": lambda: widgets.crossing_explorer(),
    "reduction": lambda: widgets.reduction_explorer(),
    "world": lambda: widgets.world_explorer(),
    "underflow": lambda: widgets.underflow_explorer(),
    "scaling": lambda: widgets.scaling_explorer(),
    "phantom": lambda: widgets.phantom_explorer(steps=3),
    "allclose": lambda: widgets.allclose_explorer(bug=0.001),
    "block": lambda: widgets.block_explorer(),
    "collective": lambda: collective_explorer(),
}


def _sub_grid(explorer) -> dict:
    """Each list cut to its ends, its middle and the shown value: a few frames, every control."""
    grid = {}
    for name, values in explorer.grid.items():
        keep = {0, len(values) // 2, len(values) - 1, values.index(explorer.params[name])}
        grid[name] = [values[k] for k in sorted(keep)]
    return grid


def _plain_spec(view, params: dict, drawn: bool) -> str:
    """The oracle: a fresh figure, every tick made as a draw would, then its spec as JSON.

    drawn: the default view's figure is first drawn as the page's PNG (Interactive does so
    before its frames), which lays it out.
    """
    _, fig = view(**params)
    if drawn:
        frame_png(fig)
    for ax in fig.axes:
        for axis in (ax.xaxis, ax.yaxis):
            axis.get_majorticklabels()
    return json.dumps(figure_spec(fig), separators=(",", ":"))


@pytest.mark.parametrize("name", list(EXPLORERS))
def test_frames_equal_the_plain_matplotlib_path(name):
    """Every frame of a sub-grid of each book explorer: the same panel and figure spec."""
    full = EXPLORERS[name]()
    it = widgets.interactive(full.view, _sub_grid(full), **full.fixed, **full.params)
    data = it.frames()
    keys = [dict(zip(it.names, k, strict=True)) for k in itertools.product(*it.grid.values())]
    assert len(keys) == len(data["frames"]) >= 4
    for params, (f, p) in zip(keys, data["frames"], strict=True):
        try:
            panel, _ = it.view(**it.fixed, **params)
        except ValueError:
            assert data["figures"][f] is None  # outside the view's domain, as the page says
            continue
        assert data["panels"][p] == panel_html(panel), params
        figure = data["figures"][f]
        assert not isinstance(figure, bytes), params  # a spec, not a PNG fallback
        assert json.dumps(figure, separators=(",", ":")) == _plain_spec(
            it.view, {**it.fixed, **params}, params == it.params), params


def _rotated(how: str):
    fig, ax = view_figure(3.0)
    ax.plot([0, 1, 2], [3, 1, 2])
    if how == "set_xticklabels":
        ax.set_xticks([0, 1, 2])
        ax.set_xticklabels(["a", "b", "c"], rotation=30)
    elif how == "tick_params":
        ax.tick_params(axis="x", labelrotation=45)
    elif how == "top labels only":
        ax.tick_params(axis="x", labelbottom=False, labeltop=True, labelrotation=60)
    elif how == "no labels":
        ax.tick_params(axis="x", labelbottom=False, labelrotation=20)
    elif how == "no ticks":
        ax.set_xticks([])
    elif how == "first label turned":
        ax.set_xticks([0, 1, 2])
        ax.get_xticklabels()[0].set_rotation(15)
    return fig, ax


@pytest.mark.parametrize("how", ["plain", "set_xticklabels", "tick_params", "top labels only",
                                 "no labels", "no ticks", "first label turned"])
def test_tick_rotation_is_read_without_making_ticks(how):
    """xtickrot equals matplotlib's first visible tick label's rotation, and made no tick."""
    fig, ax = _rotated(how)
    made = len(ax.xaxis.majorTicks)
    got = figure_spec(fig)["axes"][0]["xtickrot"]
    assert len(ax.xaxis.majorTicks) == made  # no tick was made to read it
    labels = ax.xaxis.get_majorticklabels()  # the oracle makes them all
    assert got == (float(labels[0].get_rotation()) if labels else 0.0)
    assert figure_spec(fig)["axes"][0]["xtickrot"] == got  # the same with every tick made


def test_figure_copies_are_fresh_blank_figures():
    """Inside figure_copies: independent figures, as fresh ones, and new rcParams respected."""
    fresh_fig, fresh_ax = view_figure(2.5)
    with figure_copies():
        first, _ = view_figure(2.5)
        copy, ax = view_figure(2.5)
        ax.plot([0, 1], [1, 0], label="drawn on the copy")
        again, ax2 = view_figure(2.5)
        with rc_context({"axes.facecolor": "#123456"}):
            shaded, ax3 = view_figure(2.5)
    assert len({id(first), id(copy), id(again), id(shaded)}) == 4
    assert not ax2.lines and ax2.figure is again and again.axes == [ax2]
    assert figure_spec(again) == figure_spec(fresh_fig)
    assert matplotlib.colors.to_hex(ax3.get_facecolor()) == "#123456"
    assert matplotlib.colors.to_hex(ax2.get_facecolor()) == matplotlib.colors.to_hex(
        fresh_ax.get_facecolor())
    _, outside = view_figure(2.5)  # the block is over: built from scratch again
    assert outside.figure is not again


@pytest.mark.parametrize("layout", [dict(nrows=2, sharex=True), dict(nrows=2, ncols=3),
                                    dict(ncols=2, width=9.0)])
def test_figure_copies_of_a_grid_are_shaped_and_shared_as_fresh_subplots(layout):
    """A copied blank with several Axes: Figure.subplots' shape, shared x axes still shared."""
    fresh, fresh_axes = view_figure(3.0, **layout)
    with figure_copies():
        view_figure(3.0, **layout)
        fig, axes = view_figure(3.0, **layout)
    assert axes.shape == fresh_axes.shape and list(axes.flat) == fig.axes
    assert fig.get_size_inches().tolist() == fresh.get_size_inches().tolist()
    assert figure_spec(fig) == figure_spec(fresh)
    first, last = axes.flat[0], axes.flat[-1]
    shared = fresh_axes.flat[0].get_shared_x_axes().joined(fresh_axes.flat[0], fresh_axes.flat[-1])
    assert first.get_shared_x_axes().joined(first, last) == shared
    last.set_xlim(2.0, 5.0)
    assert (first.get_xlim() == (2.0, 5.0)) == shared


@pytest.mark.parametrize("enabled", [True, False])
def test_frames_leave_the_garbage_collector_as_they_found_it(enabled):
    it = widgets.interactive(widgets.bit_view, {"value": [0.1, 0.3, 3.0]}, fmt="float16")
    was = gc.isenabled()
    try:
        (gc.enable if enabled else gc.disable)()
        it.frames()
        assert gc.isenabled() is enabled
    finally:
        (gc.enable if was else gc.disable)()
