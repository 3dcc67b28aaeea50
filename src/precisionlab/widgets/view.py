"""What every chapter view takes and returns: view(**params) -> (TextPanel, Figure)."""

from __future__ import annotations

import html

import numpy as np
from matplotlib.figure import Figure

from ..plotting import copied_figure

__all__ = ["FIGURE_WIDTH_IN", "TextPanel", "figure_summary", "panel_html", "view_figure"]

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


def _blank_figure(layout: tuple) -> Figure:
    width, height, nrows, ncols, sharex = layout
    fig = Figure(figsize=(width, height))
    fig.subplots(nrows, ncols, sharex=sharex)
    return fig


def _as_subplots(axes: list, nrows: int, ncols: int):
    """A copy's Axes as Figure.subplots returns them: one Axes, else an array squeezed of 1s."""
    if nrows * ncols == 1:
        return axes[0]
    grid = np.empty(len(axes), dtype=object)
    grid[:] = axes
    return grid.reshape(nrows, ncols).squeeze()


def view_figure(height: float, *, width: float = FIGURE_WIDTH_IN, nrows: int = 1,
                ncols: int = 1, sharex: bool = False) -> tuple[Figure, object]:
    """A width x height inch figure and its Axes as Figure.subplots(nrows, ncols, sharex) gives them.

    One Axes by default; no pyplot, no global state.
    """
    # Inside plotting.figure_copies (Interactive.frames) a copy of one blank per layout.
    layout = (float(width), float(height), nrows, ncols, sharex)
    fig = copied_figure(("view_figure", layout), lambda: _blank_figure(layout))
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
