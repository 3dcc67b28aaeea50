"""Figures of rounded sums: outcomes S_i against tol, flip probability by margin, solver residuals."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
from matplotlib.axes import Axes

from ..formats import get_format
from ..rounding import ulp
from .style import FORMAT_COLORS, PALETTE, format_style, get_axes, legend_outside

__all__ = ["plot_flip_probability", "plot_residual_histories", "plot_sum_outcomes"]

_DECISION_COLORS = {"stop": PALETTE["blue"], "continue": PALETTE["vermillion"]}

def plot_sum_outcomes(sums, exact: float, tol: float, acc="float32",
                      marks: Mapping[str, float] | None = None, title: str | None = None,
                      ax: Axes | None = None) -> Axes:
    """Counts of each rounded sum S_i, placed at (S_i - S)/ulp_acc(S), coloured by the test S_i < tol."""
    ax = get_axes(ax)
    fmt = get_format(acc)
    unit = float(ulp(exact, fmt))
    values, counts = np.unique(np.asarray(sums, dtype=np.float64), return_counts=True)
    pos = (values - exact) / unit
    width = 0.8 * (np.min(np.diff(pos)) if pos.size > 1 else 1.0)
    frac = counts / counts.sum()
    stop = values < tol
    for key, sel in (("stop", stop), ("continue", ~stop)):
        if sel.any():
            ax.bar(pos[sel], frac[sel], width=width, color=_DECISION_COLORS[key],
                   label=f"{'S < tol' if key == 'stop' else 'S ≥ tol'}: {key} ({frac[sel].sum():.1%})")
    ax.axvline((tol - exact) / unit, color=PALETTE["black"], ls="--", lw=1.4, label="tol")
    ax.axvline(0.0, color="#777777", ls=":", lw=1.4, label="exact sum")
    if marks:
        top = frac.max() * 1.08
        for j, (name, v) in enumerate(marks.items()):
            x = (float(v) - exact) / unit
            ax.plot([x], [top], marker="v", ms=8, color=PALETTE["green"], linestyle="none")
            ax.annotate(name, (x, top), xytext=(0, 6 + 11 * (j % 3)), textcoords="offset points",
                        ha="center", fontsize=8.5, color=PALETTE["green"])
        ax.set_ylim(0, frac.max() * 1.45)
    ax.set_xlabel(f"rounded sum - exact sum, in {fmt.name} ulps of the exact sum")
    ax.set_ylabel("fraction of runs")
    ax.set_title(title or f"Rounded sums in a {fmt.name} accumulator")
    legend_outside(ax)
    return ax


def plot_flip_probability(margins, curves: Mapping[str, Sequence[float]],
                          below: Mapping[str, Sequence[float]] | None = None,
                          ax: Axes | None = None) -> Axes:
    """P(rounded S < tol differs from exact S < tol) against |tol - S|/S, per accumulator."""
    # curves: tol above the exact sum (the exact test says stop); below (dashed, optional): tol
    # the same distance below it (the exact test says continue).
    ax = get_axes(ax)
    m = np.asarray(margins, dtype=np.float64)
    for name, probs in curves.items():
        try:
            color = FORMAT_COLORS.get(get_format(name).name)
        except ValueError:  # a label that is not a format name: use the colour cycle
            color = None
        line, = ax.plot(m, np.asarray(probs), marker="o", ms=3.5, color=color,
                        label=f"{name}: tol above S")
        if below and name in below:
            ax.plot(m, np.asarray(below[name]), ls="--", marker="s", ms=3, mfc="none",
                    color=line.get_color(), label=f"{name}: tol below S")
    ax.set_xscale("log")
    ax.set_ylim(-0.02, 1.02)
    ax.set_xlabel("relative margin |tol - S| / S (S: the exact sum)")
    ax.set_ylabel("fraction of orders that flip the test")
    ax.set_title("How close to tol can a reduction get?")
    legend_outside(ax)
    return ax


def plot_residual_histories(histories: Mapping[str, Sequence[float]],
                            tol: float | Sequence[float] | None = None,
                            ax: Axes | None = None) -> Axes:
    """Relative residual ||b - A x_k|| / ||b|| against iteration k (log scale), one line per device profile."""
    ax = get_axes(ax)
    for name, res in histories.items():
        r = np.asarray(res, dtype=np.float64)
        try:
            color = format_style(name)["color"]  # profile names are format aliases (bf16, ...)
        except ValueError:
            color = None
        ax.plot(np.arange(r.size), r, marker=".", color=color, label=f"{name} matmuls")
    tols = [] if tol is None else np.atleast_1d(np.asarray(tol, dtype=np.float64))
    for j, t in enumerate(tols):
        ax.axhline(t, color=PALETTE["black"], ls="--", lw=1, label="tolerances" if j == 0 else None)
    ax.set_yscale("log")
    ax.set_xlabel("iteration k")
    ax.set_ylabel("relative residual")
    ax.set_title("Jacobi iteration: the residual each profile can reach")
    legend_outside(ax)
    return ax
