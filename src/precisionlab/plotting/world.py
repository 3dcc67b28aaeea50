"""Figures of the bouncing ball: heights, gaps, parameter sweeps, stiffness regions, solver passes."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
from matplotlib.axes import Axes
from matplotlib.colors import ListedColormap
from matplotlib.patches import Patch

from .style import PALETTE, get_axes

__all__ = ["plot_height_gap", "plot_heights", "plot_parameter_sweep", "plot_solver_passes", "plot_stiffness_map"]

def plot_heights(h: float, heights: Mapping[str, Sequence[float]],
                 contacts: Mapping[str, int] | None = None, ax: Axes | None = None) -> Axes:
    """Height y_t against time t h, one line per run; a dot at each run's first-contact step."""
    ax = get_axes(ax)
    colors = (PALETTE["blue"], PALETTE["vermillion"], PALETTE["green"], PALETTE["purple"])
    for j, (name, y) in enumerate(heights.items()):
        y = np.asarray(y, dtype=np.float64)
        t = np.arange(y.size) * h
        style = {"color": colors[j % len(colors)], "lw": 1.6, "ls": "-" if j == 0 else "--"}
        ax.plot(t, y, label=name, **style)
        if contacts and name in contacts and contacts[name] >= 0:
            c = int(contacts[name]) + 1  # the state after the contact step
            ax.plot([t[c]], [y[c]], "o", ms=6, color=style["color"], mfc="none", mew=1.6)
    ax.axhline(0.0, color="#777777", lw=1)
    ax.set_xlabel("time (s)")
    ax.set_ylabel("height y (m)")
    ax.set_title("Two rollouts, first contacts circled")
    ax.legend(fontsize=8.5)
    return ax


def plot_height_gap(h: float, a: Sequence[float], b: Sequence[float], ax: Axes | None = None) -> Axes:
    """|y_a - y_b| against time on a log scale; steps where the runs agree exactly are left out."""
    ax = get_axes(ax)
    gap = np.abs(np.asarray(a, dtype=np.float64) - np.asarray(b, dtype=np.float64))
    t = np.arange(gap.size) * h
    shown = gap > 0
    ax.plot(t[shown], gap[shown], ".", ms=3.5, color=PALETTE["black"])
    ax.set_yscale("log")
    ax.set_xlabel("time (s)")
    ax.set_ylabel("|difference| (m)")
    ax.set_title("Gap between the two rollouts")
    return ax


def plot_parameter_sweep(k, values, iterations=None, ylabel: str = "value", label: str | None = None,
                         ax: Axes | None = None, **style) -> Axes:
    """values(k) as dots; dashed verticals where the total solver iteration count changes."""
    ax = get_axes(ax)
    k = np.asarray(k, dtype=np.float64)
    ax.plot(k, np.asarray(values, dtype=np.float64), ".", ms=3.5, label=label, **style)
    if iterations is not None:
        it = np.asarray(iterations)
        for j in np.flatnonzero(np.diff(it)):
            ax.axvline(0.5 * (k[j] + k[j + 1]), color="#999999", ls="--", lw=0.8)
    ax.set_xlabel("gain k")
    ax.set_ylabel(ylabel)
    if label:
        ax.legend(fontsize=8.5)
    return ax


def plot_stiffness_map(smap, forward_limit: float = 1.0, backward_limit: float = 100.0,
                       ax: Axes | None = None) -> Axes:
    """Regions of a world.StiffnessMap over (stiffness k, step size h): both fine, backward only, forward."""
    ax = get_axes(ax)
    codes = smap.regions(forward_limit, backward_limit)
    cmap = ListedColormap(["#dce9f5", PALETTE["orange"], "#555555"])
    ax.pcolormesh(smap.k, smap.h, codes, cmap=cmap, vmin=-0.5, vmax=2.5, shading="nearest")
    kk = np.geomspace(smap.k.min(), smap.k.max(), 50)
    ax.plot(kk, 2 / np.sqrt(kk), color=PALETTE["black"], ls=":", lw=1.2, label="h √k = 2")
    ax.set_xscale("log")
    ax.set_yscale("log")
    if smap.k.min() < smap.k.max():
        ax.set_xlim(smap.k.min(), smap.k.max())
    if smap.h.min() < smap.h.max():
        ax.set_ylim(smap.h.min(), smap.h.max())
    ax.set_xlabel("stiffness k (1/s²)")
    ax.set_ylabel("step size h (s)")
    ax.set_title(f"{smap.integrator.replace('_', '-')} Euler")
    handles = [Patch(facecolor=c, edgecolor="#888888", label=text) for c, text in (
        ("#dce9f5", "forward and backward fine"),
        (PALETTE["orange"], f"forward fine, |k dy/dk| > {backward_limit:g} y0"),
        ("#555555", f"forward grows (max |y| > {forward_limit:g} y0)"))]
    ax.legend(handles=handles + ax.get_legend_handles_labels()[0], fontsize=8, loc="lower left",
              frameon=True, framealpha=0.9)
    return ax


def plot_solver_passes(runs: Mapping[str, np.ndarray], flips=None, ax: Axes | None = None) -> Axes:
    """Solver passes per step summed over scenes, one step line per run; x where a decision flipped."""
    ax = get_axes(ax)
    colors = (PALETTE["vermillion"], PALETTE["blue"], PALETTE["green"])
    for j, (name, it) in enumerate(runs.items()):
        total = np.asarray(it).reshape(np.asarray(it).shape[0], -1).sum(axis=1)
        ax.step(np.arange(total.size), total, where="mid", color=colors[j % 3], label=name,
                lw=1.6 if j == 0 else 1.2, ls="-" if j == 0 else "--")
    if flips is not None:
        f = np.asarray(flips).reshape(np.asarray(flips).shape[0], -1).sum(axis=1)
        first = next(iter(runs.values()))
        total = np.asarray(first).reshape(f.size, -1).sum(axis=1)
        steps = np.flatnonzero(f)
        if steps.size:
            ax.plot(steps, total[steps], "x", ms=8, mew=2, color=PALETTE["black"],
                    label=f"decision the exact sum reverses ({int(f.sum())})")
    ax.set_xlabel("step")
    ax.set_ylabel("solver passes (all scenes)")
    ax.set_title("Projection solver work per step")
    ax.legend(fontsize=8.5)
    return ax
