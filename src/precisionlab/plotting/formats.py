"""Figures of a format's value grid: ulp(x) against |x|, the values in [lo, hi], fl(x) among them."""

from __future__ import annotations

from collections.abc import Iterable

import matplotlib as mpl
import numpy as np
from matplotlib.axes import Axes

from ..formats import FloatFormat, get_format
from ..rounding import round_to, ulp
from .style import FORMAT_COLORS, PALETTE, format_style, get_axes, legend_outside

__all__ = ["format_grid", "plot_number_line", "plot_ulp_vs_magnitude"]

def plot_ulp_vs_magnitude(formats: Iterable[str | FloatFormat] = ("float32", "tf32", "float16",
                                                                  "bfloat16", "float8_e4m3fn",
                                                                  "float8_e5m2"),
                          ax: Axes | None = None) -> Axes:
    """ulp(x) against |x| on log-log axes, from each format's smallest subnormal to its largest value."""
    ax = get_axes(ax)
    for f in formats:
        fmt = get_format(f)
        # ulp is constant on each binade [2^e, 2^(e+1)) and equal to the smallest subnormal
        # below 2·min_normal: one step per binade edge draws it exactly.
        edges = np.ldexp(1.0, np.arange(fmt.emin + 1, fmt.emax + 1))
        xs = np.concatenate([[fmt.min_subnormal], edges, [fmt.max_finite]])
        us = np.asarray(ulp(xs, fmt))
        color = FORMAT_COLORS.get(fmt.name)
        ax.step(xs, us, where="post", label=fmt.name, **format_style(fmt))
        ax.plot([fmt.min_normal], [ulp(fmt.min_normal, fmt)], "o", color=color, ms=5)
        ax.plot([fmt.max_finite], [ulp(fmt.max_finite, fmt)], "^", color=color, ms=6)
    ax.set_xscale("log", base=10)
    ax.set_yscale("log", base=10)
    ax.set_xlabel("magnitude |x|")
    ax.set_ylabel("ulp(x): gap to the next value")
    ax.set_title("Spacing of representable values")
    handles, labels = ax.get_legend_handles_labels()
    marker_handles = [
        mpl.lines.Line2D([], [], color="grey", marker="o", linestyle="none", label="min normal"),
        mpl.lines.Line2D([], [], color="grey", marker="^", linestyle="none", label="max finite"),
    ]
    legend_outside(ax, handles=[*handles, *marker_handles],
                   labels=[*labels, "min normal", "max finite"])
    return ax


def format_grid(fmt, lo: float, hi: float, max_values: int = 2000) -> np.ndarray:
    """All finite values of fmt in [lo, hi], ascending; raises if there are more than max_values."""
    fmt = get_format(fmt)
    if not (np.isfinite(lo) and np.isfinite(hi) and lo < hi):
        raise ValueError(f"need finite lo < hi; got lo={lo!r}, hi={hi!r}")

    def nonneg(a: float, b: float) -> list[np.ndarray]:
        # Binade e >= emin + 1 holds k·2^(e-m) on [2^e, 2^(e+1)); below 2^(emin+1) the step is
        # the smallest subnormal all the way down to 0. Loop over binades, not values.
        b = min(b, fmt.max_finite)
        if b < a:
            return []
        e_a, e_b = (int(np.clip(np.floor(np.log2(t)), fmt.emin, fmt.emax)) if t > 0 else fmt.emin
                    for t in (a, b))
        out, count = [], 0
        for e in range(e_a, e_b + 1):
            step = 2.0 ** (e - fmt.mantissa_bits)
            seg_lo = 0.0 if e == fmt.emin else 2.0**e
            first = np.ceil(max(a, seg_lo) / step)
            last = min(np.floor(b / step), 2.0 ** (e + 1) / step - 1)
            count += max(0, int(last - first) + 1)
            if count > max_values:
                raise ValueError(
                    f"[{lo!r}, {hi!r}] holds more than {max_values} {fmt.name} values; "
                    "narrow the window"
                )
            out.append(step * np.arange(first, last + 1))
        return out

    parts = nonneg(max(lo, 0.0), hi) if hi >= 0 else []
    if lo < 0:
        parts += [-p for p in nonneg(max(-hi, 0.0), -lo)]
    grid = np.unique(np.concatenate(parts)) + 0.0 if parts else np.array([])  # + 0.0: no -0
    return grid[(grid >= lo) & (grid <= hi)]


def plot_number_line(fmt, lo: float, hi: float, x: float | None = None,
                     mode: str = "nearest_even", ax: Axes | None = None) -> Axes:
    """fmt's representable values in [lo, hi] as ticks, with rounding midpoints, x, its neighbours and fl(x)."""
    fmt = get_format(fmt)
    ax = get_axes(ax)
    grid = format_grid(fmt, lo, hi)
    ax.axhline(0, color="#888888", lw=1, zorder=1)
    ax.vlines(grid, -0.35, 0.35, color=FORMAT_COLORS.get(fmt.name, "k"), lw=1.6,
              label=f"{fmt.name} values", zorder=2)
    if len(grid) > 1:
        mids = (grid[1:] + grid[:-1]) / 2
        ax.vlines(mids, -0.15, 0.15, color="#999999", lw=1, linestyles=":",
                  label="rounding midpoints", zorder=2)
    if x is not None:
        x = float(x)
        below = float(round_to(x, fmt, "down"))
        above = float(round_to(x, fmt, "up"))
        fx = float(round_to(x, fmt, mode, generator=np.random.default_rng(0)))
        for nb in {below, above}:
            ax.annotate(f"{nb:.8g}", (nb, 0.4), xytext=(0, 4), textcoords="offset points",
                        ha="center", va="bottom", fontsize=8.5)
        ax.vlines([below, above], -0.5, 0.5, color="#444444", lw=2.4,
                  label="neighbours of x", zorder=3)
        ax.plot([x], [0], marker="v", ms=11, color=PALETTE["black"], linestyle="none",
                label=f"x = {x:.10g}", zorder=4)
        ax.plot([fx], [0], marker="o", ms=10, mfc="none", mew=2, color=PALETTE["black"],
                linestyle="none", label=f"fl(x) = {fx:.8g} ({mode})", zorder=4)
    ax.set_ylim(-1.0, 1.3)
    ax.set_yticks([])
    ax.grid(False)
    ax.spines["left"].set_visible(False)
    ax.set_xlim(lo, hi)
    ax.set_xlabel("value")
    ax.set_title(f"{fmt.name} near {x:.6g}" if x is not None else f"{fmt.name} values")
    ax.legend(loc="upper center", ncol=3, bbox_to_anchor=(0.5, -0.32), fontsize=8.5)
    return ax
