"""Figures of interval bounds: leaf depths per summand, bound widths against k, bands per element."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np
from matplotlib.axes import Axes
from matplotlib.ticker import FixedLocator

from .style import PALETTE, get_axes, legend_outside

__all__ = ["plot_bound_bands", "plot_bound_widths", "plot_leaf_depths"]


def _set_yticks(ax: Axes, ticks: list[float]) -> None:
    """What ax.set_yticks(ticks) does on an unshared y axis (a FixedLocator, the view widened to
    hold every tick), without making a Tick per location up front: ticks are made when the
    figure is drawn. Making them took most of an allclose explorer frame's figure time."""
    if ticks:
        old = tuple(ax.yaxis.get_view_interval())
        ax.yaxis.set_view_interval(min(ticks), max(ticks))
        if tuple(ax.yaxis.get_view_interval()) != old:
            ax.callbacks.process("ylim_changed", ax)
    ax.stale = True
    ax.yaxis.set_major_locator(FixedLocator(ticks))


def plot_leaf_depths(depths: Mapping[str, np.ndarray], ax: Axes | None = None) -> Axes:
    """Roundings on each summand's path (its leaf depth) against its index, one step line per order."""
    ax = get_axes(ax)
    colors = (PALETTE["black"], PALETTE["blue"], PALETTE["orange"], PALETTE["green"],
              PALETTE["purple"], PALETTE["vermillion"], PALETTE["sky"])
    for j, (name, d) in enumerate(depths.items()):
        d = np.asarray(d)
        ax.step(np.arange(d.size), d, where="mid", color=colors[j % len(colors)], label=name,
                lw=1.8 if j == 0 else 1.4, ls="-" if j % 2 == 0 else "--")
    ax.set_xlabel("summand index i")
    ax.set_ylabel("roundings on its path")
    ax.set_title("Who pays for the order: leaf depths")
    legend_outside(ax)
    return ax


def plot_bound_widths(ks: Sequence[int], widths: Mapping[str, Sequence[float]],
                      observed: Sequence[float] | None = None, ax: Axes | None = None) -> Axes:
    """Error bounds (half-widths) against the inner dimension k, log-log, beside the largest observed error."""
    ax = get_axes(ax)
    styles = ({"color": PALETTE["vermillion"], "ls": "--", "marker": "s"},
              {"color": PALETTE["blue"], "ls": "-", "marker": "o"},
              {"color": PALETTE["green"], "ls": "-.", "marker": "^"})
    for j, (name, w) in enumerate(widths.items()):
        ax.loglog(ks, w, label=name, ms=5, **styles[j % len(styles)])
    if observed is not None:
        ax.loglog(ks, observed, color=PALETTE["black"], ls=":", marker="x", label="largest error observed")
    ax.set_xlabel("inner dimension k")
    ax.set_ylabel("|computed - exact|")
    ax.set_title("Bound against observed error")
    legend_outside(ax)
    return ax


def plot_bound_bands(offset, structure, oblivious=None, ax: Axes | None = None,
                     title: str = "Reference against the target's bounds",
                     legend: bool = True) -> Axes:
    """Per output element: reference - target (dots) inside or outside the bounds' ranges [lo - target, hi - target].

    legend=False leaves the legend to the caller (who places its own: one legend built, not two).
    """
    ax = get_axes(ax)
    offset = np.ravel(np.asarray(offset, dtype=np.float64))
    x = np.arange(offset.size)
    if oblivious is not None:
        lo, hi = (np.ravel(np.asarray(v, dtype=np.float64)) for v in oblivious)
        ax.fill_between(x, lo, hi, step="mid", color=PALETTE["sky"], alpha=0.25, lw=0,
                        label="order-oblivious bound")
    lo, hi = (np.ravel(np.asarray(v, dtype=np.float64)) for v in structure)
    ax.fill_between(x, lo, hi, step="mid", color=PALETTE["blue"], alpha=0.45, lw=0,
                    label="structure-aware bound")
    inside = (lo <= offset) & (offset <= hi)
    ax.plot(x[inside], offset[inside], "o", ms=4, color=PALETTE["black"], label="reference (inside)")
    if (~inside).any():
        ax.plot(x[~inside], offset[~inside], "X", ms=7, color=PALETTE["vermillion"],
                label="reference (outside)")
    span = np.max(np.abs(np.concatenate([lo, hi, offset])[np.isfinite(np.concatenate([lo, hi, offset]))]),
                  initial=1e-300)
    thresh = max(span * 1e-4, 1e-300)
    ax.set_yscale("symlog", linthresh=thresh)
    top = math.ceil(math.log10(span)) if span > 0 else 0
    decades = list(range(top, math.floor(math.log10(thresh)), -2))[:3]  # every other decade
    _set_yticks(ax, sorted([-(10.0**d) for d in decades] + [0.0] + [10.0**d for d in decades]))
    ax.axhline(0, color="#888888", lw=0.8)
    ax.set_xlabel("output element")
    ax.set_ylabel("value - target")
    ax.set_title(title)
    if legend:
        legend_outside(ax)
    return ax
