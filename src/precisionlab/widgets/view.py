"""What every chapter view takes and returns: view(**params) -> (TextPanel, Figure)."""

from __future__ import annotations

import contextlib
import html
import pickle
from contextvars import ContextVar

import numpy as np
from matplotlib.figure import Figure

from ..plotting import rc_snapshot

__all__ = ["FIGURE_WIDTH_IN", "TextPanel", "figure_copies", "figure_summary", "panel_html",
           "view_figure"]

FIGURE_WIDTH_IN = 7.0  # a frame at FRAME_DPI = 100 is 700 px, the book's text column


class TextPanel:
    """Monospaced text: <pre> in HTML front ends, itself elsewhere; alt describes the figure beside it."""

    def __init__(self, text: str, error: bool = False, alt: str = ""):
        self.text = text
        self.error = error
        self.alt = alt

    def _repr_html_(self) -> str:
        color = "#b00020" if self.error else "inherit"
        # 12.5 px monospace holds 80 columns in the book's column; longer lines wrap, never scroll
        return (f'<pre style="font-size: 12.5px; line-height: 1.35; white-space: pre-wrap; '
                f'overflow-wrap: anywhere; color: {color}">{html.escape(self.text)}</pre>')

    def __repr__(self) -> str:
        return self.text


def panel_html(panel) -> str:
    """The panel's HTML: its own _repr_html_, else its text escaped in a <pre>."""
    if hasattr(panel, "_repr_html_"):
        return panel._repr_html_()
    return f"<pre>{html.escape(str(panel))}</pre>"


def _blank_figure(layout: tuple) -> tuple[Figure, object]:
    width, height, nrows, ncols, sharex = layout
    fig = Figure(figsize=(width, height))
    return fig, fig.subplots(nrows, ncols, sharex=sharex)


def _as_subplots(axes: list, nrows: int, ncols: int):
    """A copy's Axes as Figure.subplots returns them: one Axes, else an array squeezed of 1s."""
    if nrows * ncols == 1:
        return axes[0]
    grid = np.empty(len(axes), dtype=object)
    grid[:] = axes
    return grid.reshape(nrows, ncols).squeeze()


# While figure_copies() is active: {layout: (rcParams snapshot, pickled blank figure)}. Set
# only for the duration of one with-block (Interactive.frames), in this context alone.
_BLANKS: ContextVar[dict | None] = ContextVar("precisionlab_blank_figures", default=None)


@contextlib.contextmanager
def figure_copies():
    """Within the block, view_figure returns copies of a blank figure made once per layout.

    Unpickling a blank Figure with its Axes takes a third to a half of the time of building one
    (an Axes makes its spines, axes, ticks and grid lines from rcParams), and a view's frame
    is drawn on it as on a new one (shared x axes stay shared): a copy is used only while
    rcParams equal those the blank was made under; one blank per size and Axes grid. Used
    by Interactive.frames, which calls one view many times.
    """
    token = _BLANKS.set({})
    try:
        yield
    finally:
        _BLANKS.reset(token)


def view_figure(height: float, *, width: float = FIGURE_WIDTH_IN, nrows: int = 1,
                ncols: int = 1, sharex: bool = False) -> tuple[Figure, object]:
    """A width x height inch figure and its Axes as Figure.subplots(nrows, ncols, sharex) gives them.

    One Axes by default; no pyplot, no global state.
    """
    layout = (float(width), float(height), nrows, ncols, sharex)
    blanks = _BLANKS.get()
    if blanks is None:
        return _blank_figure(layout)
    rc, blank = rc_snapshot(), blanks.get(layout)
    if blank is None or blank[0] != rc:
        fig, axes = _blank_figure(layout)
        blanks[layout] = (rc, pickle.dumps(fig))
        return fig, axes
    fig = pickle.loads(blank[1])
    return fig, _as_subplots(fig.axes, nrows, ncols)


def figure_summary(fig: Figure) -> str:
    """Each titled Axes as 'title (x: xlabel; y: ylabel)', joined by '; ': a figure's alt text."""
    parts = []
    for ax in fig.axes:
        title = ax.get_title()
        if not title:
            continue  # colour bars and inset axes carry no title
        axes = "; ".join(f"{k}: {v}" for k, v in (("x", ax.get_xlabel()), ("y", ax.get_ylabel()))
                         if v)
        parts.append(f"{title} ({axes})" if axes else title)
    return "; ".join(parts)
