"""The book's house style: colour-blind-safe palette, one colour and dash per format, rcParams."""

from __future__ import annotations

import matplotlib as mpl
import matplotlib.pyplot as plt
from matplotlib.axes import Axes

from ..formats import get_format

__all__ = ["FORMAT_COLORS", "FORMAT_LINESTYLES", "PALETTE", "format_style", "get_axes",
           "legend_outside", "use_house_style"]

# Okabe & Ito's colour-blind-safe palette (yellow left out: too faint on white).
PALETTE: dict[str, str] = {
    "black": "#000000",
    "orange": "#E69F00",
    "sky": "#56B4E9",
    "green": "#009E73",
    "blue": "#0072B2",
    "vermillion": "#D55E00",
    "purple": "#CC79A7",
}

# One colour per format in every figure of the book (the only format -> colour mapping:
# plotting functions and widgets look colours up here or through format_style). float16 and
# bfloat16, the pair most often drawn together, get two hues far apart (orange, green).
FORMAT_COLORS: dict[str, str] = {
    "float64": PALETTE["black"],
    "float32": PALETTE["blue"],
    "tf32": PALETTE["sky"],
    "float16": PALETTE["orange"],
    "bfloat16": PALETTE["green"],
    "float8_e4m3fn": PALETTE["purple"],
    "float8_e5m2": PALETTE["vermillion"],
}

# A line style per format as well, so that curves that coincide stay visible (the narrower
# format is drawn dashed on top of the wider one) and figures read in grey.
FORMAT_LINESTYLES: dict[str, str] = {
    "float64": "-", "float32": "-", "tf32": (0, (5, 1.5)), "float16": (0, (4, 2.2)),
    "bfloat16": (0, (7, 2, 1.5, 2)), "float8_e4m3fn": (0, (1.2, 1.6)),
    "float8_e5m2": (0, (3, 1.5, 1, 1.5, 1, 1.5)),
}

_HOUSE_STYLE = {
    "figure.figsize": (7.0, 4.2),
    "figure.dpi": 110,
    "savefig.dpi": 110,
    "figure.autolayout": True,
    "font.size": 11,
    "axes.titlesize": 12,
    "axes.titleweight": "bold",
    "axes.labelsize": 11,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "axes.grid": True,
    "grid.color": "#dddddd",
    "grid.linewidth": 0.7,
    "axes.prop_cycle": mpl.cycler(color=list(PALETTE.values())),
    "legend.frameon": False,
    "legend.fontsize": 9.5,
    "lines.linewidth": 1.8,
    "image.cmap": "viridis",
}


def format_style(fmt) -> dict:
    """Colour and line style of a format (a registry name, an alias such as bf16, or a FloatFormat)."""
    name = get_format(fmt).name
    return {"color": FORMAT_COLORS[name], "linestyle": FORMAT_LINESTYLES[name]}


def legend_outside(ax: Axes, **kwargs):
    """A legend to the right of the axes, where it can cover no data."""
    kwargs.setdefault("fontsize", 8.5)
    return ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0, **kwargs)


def use_house_style() -> None:
    """Apply the book's matplotlib rcParams (clean axes, light grid, colour-blind-safe cycle)."""
    mpl.rcParams.update(_HOUSE_STYLE)


def get_axes(ax: Axes | None) -> Axes:
    """ax itself, or the Axes of a new pyplot figure when ax is None."""
    if ax is None:
        _, ax = plt.subplots()
    return ax

