"""Figures of loss scaling: log2 of the scale per step with skipped steps, and loss curves."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
from matplotlib.axes import Axes

from .style import get_axes, legend_outside

__all__ = ["plot_loss_curves", "plot_scale_history"]

def plot_scale_history(histories: Mapping, ax: Axes | None = None,
                       styles: Mapping[str, dict] | None = None) -> Axes:
    """log2 of the loss scale per step for each ScaleHistory, skipped steps marked with crosses."""
    ax = get_axes(ax)
    styles = styles or {}
    for j, (name, h) in enumerate(histories.items()):
        style = {"lw": 1.8, **styles.get(name, {})}
        line, = ax.step(np.arange(h.steps), np.log2(h.scale), where="post", label=name, **style)
        sk = h.skipped_steps
        if sk.size:
            ax.plot(sk, np.log2(h.scale[sk]), "x", ms=7, mew=2, color=line.get_color(),
                    label=f"{name}: skipped steps ({sk.size})", zorder=3 + j)
    ax.set_xlabel("step")
    ax.set_ylabel("log2(loss scale)")
    ax.set_title("Loss scale per step")
    legend_outside(ax)
    return ax


def plot_loss_curves(losses: Mapping[str, Sequence[float]], relative: bool = True,
                     ax: Axes | None = None, styles: Mapping[str, dict] | None = None) -> Axes:
    """Loss per step (divided by the first loss when relative), log scale, one line per run."""
    ax = get_axes(ax)
    styles = styles or {}
    for name, loss in losses.items():
        y = np.asarray(loss, dtype=np.float64)
        if relative:
            y = y / y[0]
        ax.plot(np.arange(y.size), y, label=name, **styles.get(name, {}))
    ax.set_yscale("log")
    ax.set_xlabel("step")
    ax.set_ylabel("loss / initial loss" if relative else "loss")
    ax.set_title("Training loss")
    legend_outside(ax)
    return ax
