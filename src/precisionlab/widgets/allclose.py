"""Chapter 7's allclose explorer: a matmul with an injected bug, its two bounds and three verdicts."""

from __future__ import annotations

import numpy as np
from matplotlib.figure import Figure
from matplotlib.ticker import FixedFormatter, FixedLocator

from ..chapters.allclose_demos import injected_bug
from ..plotting import plot_bound_bands
from .frames import interactive
from .view import TextPanel, view_figure

__all__ = ["ALLCLOSE_GRID", "allclose_explorer", "allclose_view"]

ALLCLOSE_GRID: dict[str, tuple] = {
    "k": (4096,),  # one size: each view re-runs the 4 x k x 4 matmul, its bounds and re-execution
    "fmt": ("float32", "tf32", "bfloat16", "float16"),
    "bug": (0.0, *(float(f"{10 ** (j / 2 - 6):.3g}") for j in range(11))),  # 0, 1e-6 ... 0.1
}

_METHODS = {"structure": "structure-aware interval", "oblivious": "order-oblivious rule",
            "high_precision": "high-precision re-execution"}


def allclose_view(k: int = 4096, fmt: str = "float32", bug: float = 0.0) -> tuple[TextPanel, Figure]:
    """C = A B (4 x k x 4) in fmt, C[0, 0] += bug·mean|C|, vs float64: both bounds and each verdict."""
    c = injected_bug(k, fmt, bug)
    s, o = c.structure, c.oblivious
    i = c.index
    truth = "Type-II (bug)" if bug > 0 else "Type-I (round-off)"
    lines = [
        f"C = A B, A 4 x {k}, B {k} x 4",
        f"kernel: {c.kernel.describe()}",
        f"injected bug: C[0, 0] += {bug:g} mean|C|   truth: {truth}",
        f"allclose(target, float64 reference), {fmt} tolerances: "
        + ("passes" if c.passes_allclose else "fails"),
        f"at C[0, 0]: |target - reference| = {c.error:.3g}",
        f"  structure-aware bound  \u00b1{float(s.width[i]) / 2:.3g}",
        f"  order-oblivious bound  \u00b1{float(o.width[i]) / 2:.3g}",
    ]
    lines += [f"{_METHODS[m]:>28}: {v}" for m, v in c.verdicts.items()]
    fig, ax = view_figure(3.3)
    plot_bound_bands(c.reference - c.target, (s.lo - c.target, s.hi - c.target),
                     (o.lo - c.target, o.hi - c.target), ax=ax,
                     title=f"k = {k}, {fmt}, bug = {bug:g}", legend=False)
    # The locator and formatter set_xticks and set_xticklabels would install, without the 16
    # Tick objects those calls make up front (most of a frame's drawing time): ticks are made
    # when the figure is drawn, in labelsize 7.
    ax.xaxis.set_major_locator(FixedLocator(np.arange(c.target.size)))
    ax.xaxis.set_major_formatter(FixedFormatter([f"{r}{q}" for r in range(4) for q in range(4)]))
    ax.tick_params(axis="x", labelsize=7)
    ax.set_xlabel("output element C[i, j] (ij)")
    ax.legend(fontsize=7, loc="upper right", framealpha=0.9)  # inside: the frame has no room beside
    fig.set_layout_engine("none")  # fixed margins: a layout pass per frame costs more than the model
    fig.subplots_adjust(left=0.13, right=0.98, bottom=0.19, top=0.9)
    return TextPanel("\n".join(lines)), fig


def allclose_explorer(k: int = 4096, fmt: str = "float32", bug: float = 0.0):
    """interactive(allclose_view, ALLCLOSE_GRID, ...): inner dimension x format x injected bug size."""
    return interactive(allclose_view, ALLCLOSE_GRID, k=k, fmt=fmt, bug=bug)
