"""Figures of scaling at finer grain: per-layer SQNR and zeros, outlier sweeps, scale traces (chapter 9)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
from matplotlib.axes import Axes

from .style import get_axes, legend_outside

__all__ = ["SQNR_CEILING_DB", "plot_block_sqnr", "plot_layer_quantization",
           "plot_outlier_sweep", "plot_scaling_trace"]

SQNR_CEILING_DB = 60.0  # an exact channel (infinite SQNR) is drawn at this height


def _styled(styles: Mapping[str, dict] | None, name: str) -> dict:
    return dict((styles or {}).get(name, {}))


# (y label, title) of each quantity the figures below can show
_LABELS = {"sqnr": ("SQNR (dB)", "Quantization error of dL/dh by depth"),
           "underflowed": ("share of entries 0", "Entries of dL/dh that underflow to 0"),
           "admitted": ("amax", "The largest value each scale admits"),
           "saturated": ("share saturated", "Entries clipped to the format's max")}


def _label(ax: Axes, which: str) -> None:
    """The y label and title of `which`, and the legend beside the Axes."""
    ylabel, title = _LABELS[which]
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    legend_outside(ax)


def plot_layer_quantization(results: Mapping, which: str = "sqnr", ax: Axes | None = None,
                            styles: Mapping[str, dict] | None = None) -> Axes:
    """Per-layer SQNR (dB) or underflowed share against depth, one line per LayerQuantization."""
    if which not in ("sqnr", "underflowed"):
        raise ValueError(f"unknown which {which!r}; valid choices: sqnr, underflowed")
    ax = get_axes(ax)
    for name, r in results.items():
        y = np.asarray(getattr(r, which), dtype=np.float64)
        ax.plot(np.arange(y.size), y, label=name, **_styled(styles, name))
    ax.set_xlabel("depth k (layers below the loss)")
    _label(ax, which)
    return ax


def plot_outlier_sweep(sizes: Sequence[float], sqnr: Mapping[str, Sequence[float]],
                       ax: Axes | None = None, styles: Mapping[str, dict] | None = None) -> Axes:
    """SQNR (dB) of the ordinary channels against the outliers' size (log axis), one line per recipe."""
    ax = get_axes(ax)
    x = np.asarray(sizes, dtype=np.float64)
    for name, y in sqnr.items():
        ax.plot(x, np.asarray(y, dtype=np.float64), marker="o", ms=4, label=name,
                **_styled(styles, name))
    ax.set_xscale("log")
    ax.set_xlabel("outlier channels' size (times the others)")
    ax.set_ylabel("SQNR of ordinary channels (dB)")
    ax.set_title("What the ordinary channels keep")
    legend_outside(ax)
    return ax


def plot_scaling_trace(traces: Mapping, which: str = "admitted", ax: Axes | None = None,
                       styles: Mapping[str, dict] | None = None) -> Axes:
    """Per step: the tensor's amax with the amax each scale admits (log axis), or the saturated share."""
    if which not in ("admitted", "saturated"):
        raise ValueError(f"unknown which {which!r}; valid choices: admitted, saturated")
    ax = get_axes(ax)
    first = next(iter(traces.values()))
    steps = np.arange(first.amax.size)
    if which == "admitted":
        ax.plot(steps, first.amax, color="#999999", lw=1.2, label="amax of the tensor")
    for name, t in traces.items():
        y = t.admitted if which == "admitted" else t.saturated
        ax.step(steps, y, where="mid", label=name, **_styled(styles, name))
    ax.set_xlabel("step")
    if which == "admitted":
        ax.set_yscale("log")
    _label(ax, which)
    return ax


def plot_block_sqnr(curves: Mapping[str, Sequence[float]], block: int,
                    outliers: Sequence[int] = (), ax: Axes | None = None,
                    styles: Mapping[str, dict] | None = None) -> Axes:
    """SQNR (dB) of each block of `block` channels as steps over the channels; inf drawn at SQNR_CEILING_DB."""
    ax = get_axes(ax)
    for name, y in curves.items():
        v = np.minimum(np.asarray(y, dtype=np.float64), SQNR_CEILING_DB)
        edges = np.arange(v.size + 1) * block - 0.5
        ax.step(edges, np.append(v, v[-1]), where="post", label=name, **_styled(styles, name))
    if len(outliers):
        ax.plot(list(outliers), [SQNR_CEILING_DB] * len(outliers), "v", color="#D55E00",
                ms=7, label="outlier channels")
    ax.set_ylim(-2, SQNR_CEILING_DB + 4)
    ax.set_xlabel("channel")
    ax.set_ylabel("SQNR of its block (dB)")
    ax.set_title("Quantization error of the ordinary values, per block")
    legend_outside(ax)
    return ax
