"""Figures of small updates: steps until fl(w + k·lr) moves, and training under storage policies."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
from matplotlib.axes import Axes
from matplotlib.colors import LogNorm

from ..formats import get_format
from ..rounding import round_to
from ..updates import TrainingRun, crossing_trajectory, steps_to_cross
from .formats import format_grid
from .style import FORMAT_COLORS, PALETTE, format_style, get_axes, legend_outside

__all__ = ["POLICY_STYLES", "plot_changed_fraction", "plot_crossing_heatmap", "plot_crossing_trajectory", "plot_training_curves"]

POLICY_STYLES: dict[str, dict] = {
    "fp32": {"color": FORMAT_COLORS["float32"], "label": "fp32 weights", "linestyle": "-"},
    "bf16": {"color": FORMAT_COLORS["bfloat16"], "label": "bf16-stored weights", "linestyle": "-"},
    "master": {"color": PALETTE["black"], "label": "fp32 master + bf16 copy", "linestyle": "--"},
    "bf16_stochastic": {"color": FORMAT_COLORS["bfloat16"], "label": "bf16-stored, stochastic rounding",
                        "linestyle": ":", "marker": "o", "markevery": 15, "ms": 4},
}

def plot_crossing_heatmap(magnitudes: Sequence[float], lrs: Sequence[float], fmt="bfloat16",
                          ax: Axes | None = None) -> Axes:
    """Exact steps to the first change of fl(w), w = fl(magnitude), over magnitude x learning rate."""
    ax = get_axes(ax)
    fmt = get_format(fmt)
    mags = np.asarray(magnitudes, dtype=np.float64)
    rates = np.asarray(lrs, dtype=np.float64)
    w = np.asarray(round_to(mags, fmt), dtype=np.float64)
    k = steps_to_cross(w[:, None], rates[None, :], fmt)
    im = ax.imshow(k, norm=LogNorm(vmin=1, vmax=max(k.max(), 10)), cmap="viridis",
                   aspect="auto")
    for i in range(k.shape[0]):
        for j in range(k.shape[1]):
            light = k[i, j] < np.sqrt(max(k.max(), 10))
            ax.text(j, i, f"{k[i, j]:,}", ha="center", va="center", fontsize=9,
                    color="white" if light else "black")
    ax.set_xticks(range(len(rates)), [f"{r:g}" for r in rates])
    ax.set_yticks(range(len(mags)), [f"{m:g}" for m in mags])
    ax.set_xlabel("learning rate (update per step)")
    ax.set_ylabel("weight magnitude |W|")
    ax.set_title(f"Steps until the {fmt.name} copy changes")
    ax.grid(False)
    ax.figure.colorbar(im, ax=ax, label="steps (log scale)")
    return ax


def plot_crossing_trajectory(w: float, lr: float, steps: int, fmt="bfloat16",
                             master: str = "float32", ax: Axes | None = None) -> Axes:
    """The master weight w + k·lr rising steadily while its fmt copy moves in jumps at the midpoints."""
    ax = get_axes(ax)
    fmt = get_format(fmt)
    k, wm, copy = crossing_trajectory(w, lr, steps, fmt, master=master)
    ax.plot(k, wm, color=format_style(master)["color"], label=f"{master} master weight")
    ax.step(k, copy, where="post", color=FORMAT_COLORS.get(fmt.name, "k"),
            label=f"{fmt.name} copy")
    lo, hi = min(wm.min(), copy.min()), max(wm.max(), copy.max())
    grid = format_grid(fmt, lo - abs(lo) * 1e-9, hi + abs(hi) * 1e-9)
    mids = (grid[1:] + grid[:-1]) / 2
    for j, m in enumerate(mids):
        ax.axhline(m, color="#999999", lw=1, ls=":", label="rounding midpoint" if j == 0 else None)
    ax.set_xlabel("optimizer step k")
    ax.set_ylabel("weight value")
    ax.set_title(f"w = {w:g}, lr = {lr:g}: master vs {fmt.name} copy")
    ax.ticklabel_format(axis="y", useOffset=False)
    legend_outside(ax)
    return ax


def plot_training_curves(runs: Mapping[str, TrainingRun], ax: Axes | None = None) -> Axes:
    """Loss against optimizer step (log scale) for each storage policy."""
    ax = get_axes(ax)
    for name, run in runs.items():
        style = POLICY_STYLES.get(name, {"label": name})
        ax.plot(np.arange(len(run.loss)), run.loss, **style)
    ax.set_yscale("log")
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("training loss")
    ax.set_title("Loss under different weight-storage policies")
    legend_outside(ax)
    return ax


def plot_changed_fraction(runs: Mapping[str, TrainingRun], ax: Axes | None = None,
                          window: int = 5) -> Axes:
    """Fraction of the forward-pass weights that changed at each step (moving average over `window`)."""
    ax = get_axes(ax)
    kernel = np.ones(window) / window
    for name, run in runs.items():
        style = POLICY_STYLES.get(name, {"label": name})
        frac = np.convolve(run.changed, kernel, mode="valid") if window > 1 else run.changed
        ax.plot(np.arange(len(frac)) + window, frac, **style)
    ax.set_ylim(-0.03, 1.05)
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("fraction of weights that changed")
    ax.set_title("Which weights actually move")
    legend_outside(ax)
    return ax
