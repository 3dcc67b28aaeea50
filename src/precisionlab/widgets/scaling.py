"""Chapter 5's loss-scaling explorer: dynamic loss scaling's scale, skipped steps and headroom."""

from __future__ import annotations

import numpy as np
from matplotlib.figure import Figure

from ..checks import check_real
from ..formats import get_format
from ..plotting import FORMAT_COLORS, PALETTE, legend_outside, plot_scale_history
from ..scaling import (
    gradient_stream,
    largest_safe_gradient,
    smallest_surviving_gradient,
    trace_dynamic_scaling,
)
from .frames import interactive
from .view import TextPanel, view_figure

__all__ = ["SCALING_GRID", "scaling_explorer", "scaling_view"]

SCALING_GRID: dict[str, tuple] = {
    "growth_interval": (5, 10, 20, 30, 50, 75, 100, 150, 200, 300, 400, 600),
    "spike_rate": (0.0, 0.01, 0.05),
    "init_scale": (2.0**8, 2.0**16),
}


def scaling_view(growth_interval: int = 50, spike_rate: float = 0.01,
                 init_scale: float = 2.0**16, steps: int = 600, fmt="float16",
                 seed: int = 0) -> tuple[TextPanel, Figure]:
    """Dynamic loss scaling over scaling.gradient_stream: the scale, skipped steps, scaled max |g| vs fmt's max."""
    f = get_format(fmt)
    if int(growth_interval) != growth_interval or growth_interval < 1:
        raise ValueError(f"growth_interval must be a positive integer; got {growth_interval!r}")
    g = gradient_stream(int(steps), spike_rate=check_real(spike_rate, "spike_rate"), seed=seed)
    hist = trace_dynamic_scaling(g, f, init_scale=check_real(init_scale, "init_scale"),
                                 growth_interval=int(growth_interval))
    final = float(hist.scale[-1])
    lines = [
        f"{steps} steps, growth_interval = {growth_interval}, init scale 2^{np.log2(init_scale):g},"
        f" {f.name}",
        f"skipped steps (overflow): {hist.skipped.sum()}; scale grew {hist.growth_steps.size} times",
        f"scale: min 2^{np.log2(hist.scale.min()):g}, max 2^{np.log2(hist.scale.max()):g}, "
        f"final 2^{np.log2(final):g}",
        f"at the final scale: gradients from {smallest_surviving_gradient(final, f):.2g} "
        f"to {largest_safe_gradient(final, f):.2g} survive",
    ]
    fig, (ax_s, ax_g) = view_figure(6.6, width=7.5, nrows=2, sharex=True)
    plot_scale_history({"dynamic scale": hist}, ax=ax_s)
    k = np.arange(g.size)
    ax_g.plot(k, g * hist.scale, lw=1, color=PALETTE["blue"], label="largest |g| · scale")
    ax_g.axhline(f.max_finite, color=FORMAT_COLORS.get(f.name, "k"), ls="--",
                 label=f"{f.name} max {f.max_finite:g}")
    sk = hist.skipped_steps
    ax_g.plot(sk, (g * hist.scale)[sk], "x", color=PALETTE["vermillion"], label="overflow")
    ax_g.set_yscale("log")
    ax_g.set_xlabel("step")
    ax_g.set_ylabel("scaled gradient")
    ax_g.set_title("Headroom below overflow")
    legend_outside(ax_g)
    fig.set_layout_engine("tight")  # laid out when drawn (live widget, PNG), not per view
    return TextPanel("\n".join(lines)), fig


def scaling_explorer(growth_interval: int = 50, spike_rate: float = 0.01,
                     init_scale: float = 2.0**16, steps: int = 600):
    """interactive(scaling_view, SCALING_GRID, ...): growth interval x spike rate x initial scale."""
    return interactive(scaling_view, SCALING_GRID, growth_interval=growth_interval,
                       spike_rate=spike_rate, init_scale=init_scale, steps=steps)
