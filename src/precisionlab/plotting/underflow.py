"""Figures of gradient underflow: g0·a^k against a format's floors, gradients and zeros by depth."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
from matplotlib.axes import Axes

from ..formats import get_format
from ..underflow import first_underflow_depth, floor_value, gradient_by_depth
from .style import FORMAT_COLORS, PALETTE, format_style, get_axes, legend_outside

__all__ = ["plot_attenuation_model", "plot_layer_gradients", "plot_zero_fraction"]

_FLOOR_STYLES = {"normal": ("--", "smallest normal"), "subnormal": ("-", "smallest subnormal q"),
                 "zero": (":", "q/2: rounds to 0")}

def _floor_lines(ax: Axes, fmt, floors=("normal", "subnormal", "zero")) -> None:
    f = get_format(fmt)
    for floor in floors:
        ls, label = _FLOOR_STYLES[floor]
        ax.axhline(floor_value(f, floor), color=FORMAT_COLORS.get(f.name, "k"), ls=ls, lw=1.2,
                   label=f"{f.name} {label}")


def plot_attenuation_model(attenuation: float, depth: int, fmt="float16", g0: float = 1.0,
                           ax: Axes | None = None) -> Axes:
    """g0·a^k against depth k (log scale) with fmt's floors and the first depth past each."""
    ax = get_axes(ax)
    f = get_format(fmt)
    g = gradient_by_depth(attenuation, depth, g0)
    ax.plot(np.arange(depth), g, color=PALETTE["black"], label=f"model g0·a^k, a = {attenuation:g}")
    _floor_lines(ax, f)
    for floor, marker in (("normal", "s"), ("zero", "o")):
        k = first_underflow_depth(attenuation, f, g0, floor)
        if k is not None and k < depth:
            ax.plot([k], [g[k]], marker=marker, ms=8, mfc="none", mew=2,
                    color=PALETTE["black"], linestyle="none",
                    label=f"first depth past {_FLOOR_STYLES[floor][1].split(':')[0]}: {k}")
    ax.set_yscale("log")
    ax.set_ylim(min(g.min(), f.min_subnormal / 4) / 3, max(g.max(), f.min_normal) * 3)
    ax.set_xlabel("depth k (layers below the loss)")
    ax.set_ylabel("typical gradient entry")
    ax.set_title(f"Attenuation model: a = {attenuation:g}, {depth} layers, {f.name}")
    legend_outside(ax)
    return ax


def plot_layer_gradients(probes: Mapping, which: str = "signal", model=None,
                         ax: Axes | None = None) -> Axes:
    """Median |gradient| per depth for each probe (format); zeros drawn on the bottom edge; model = (a, g0)."""
    ax = get_axes(ax)
    positive = [p.stats(which).median_abs for p in probes.values()]
    lowest = min([m[m > 0].min() for m in positive if (m > 0).any()] + [floor_value("float16")])
    bottom = lowest / 20  # exact zeros are drawn just above this edge
    for j, (name, probe) in enumerate(probes.items()):
        med = probe.stats(which).median_abs
        k = np.arange(med.size)
        style = format_style(probe.fmt)
        color = style["color"]
        # Each format has its own dash pattern and later probes are drawn on top, narrower,
        # so a float16 curve that coincides with float32's shows through its gaps.
        ax.plot(k, np.where(med > 0, med, np.nan), lw=max(3.0 - 0.8 * j, 1.4), zorder=2 + j,
                label=f"{name}", **style)
        zero = med == 0
        if zero.any():
            ax.plot(k[zero], np.full(zero.sum(), bottom * 2), "v", ms=4, color=color,
                    label=f"{name}: median exactly 0")
    if model is not None:
        a, g0 = model
        depth = max(len(p.stats(which).median_abs) for p in probes.values())
        ax.plot(np.arange(depth), g0 * np.power(float(a), np.arange(depth)), color=PALETTE["black"],
                ls="--", lw=1.2, label=f"model g0·a^k (a = {a:g})")
    _floor_lines(ax, "float16", ("zero",))
    ax.set_yscale("log")
    ax.set_ylim(bottom, None)
    ax.set_xlabel("depth k (layers below the loss)")
    what = {"signal": "dL/dh (backward signal)", "weight": "dL/dW (weight gradient)"}[which]
    ax.set_ylabel(f"median |{what.split(' ')[0]}|")
    ax.set_title(f"Typical {what} by depth")
    legend_outside(ax)
    return ax


def plot_zero_fraction(probes: Mapping, which: str = "weight", ax: Axes | None = None) -> Axes:
    """Fraction of exactly-zero gradient entries per depth for each probe; which: weight, signal or both."""
    ax = get_axes(ax)
    kinds = ("weight", "signal") if which == "both" else (which,)
    names = {"weight": "dL/dW", "signal": "dL/dh"}
    for name, probe in probes.items():
        for kind, ls in zip(kinds, ("-", "--"), strict=False):
            z = probe.stats(kind).zero_fraction
            label = name if len(kinds) == 1 else f"{name}, {names[kind]}"
            ax.plot(np.arange(z.size), z, color=FORMAT_COLORS.get(probe.fmt), ls=ls, label=label)
    ax.axhline(0.5, color="#888888", ls=":", lw=1, label="half the entries")
    ax.set_ylim(-0.03, 1.03)
    ax.set_xlabel("depth k (layers below the loss)")
    ax.set_ylabel("fraction exactly zero")
    shown = " and ".join(names[k] for k in kinds)
    ax.set_title(f"Exact zeros in {shown} by depth")
    legend_outside(ax)
    return ax
