"""Chapter 4's underflow explorer: the attenuation model g0·a^k against a format's floors by depth."""

from __future__ import annotations

from functools import lru_cache

import numpy as np
from matplotlib.figure import Figure

from ..checks import check_real
from ..formats import get_format
from ..plotting import FORMAT_COLORS, legend_outside, plot_attenuation_model
from ..underflow import (
    NETWORK_FORMATS,
    AttenuatingNet,
    first_underflow_depth,
    fit_g0,
    make_batch,
    measured_underflow_depth,
    probe_gradients,
)
from .frames import interactive
from .view import TextPanel, view_figure

__all__ = ["UNDERFLOW_GRID", "network_probe", "underflow_explorer", "underflow_view"]

UNDERFLOW_GRID: dict[str, tuple] = {
    "attenuation": (0.5, 0.6, 0.7, 0.75, 0.8, 0.82, 0.85, 0.88, 0.9, 0.92, 0.95, 0.98),
    "fmt": ("float16", "bfloat16", "float32"),
    "network": (False, True),
}


@lru_cache(maxsize=32)
def network_probe(depth: int, attenuation: float, fmt: str, seed: int):
    """probe_gradients of AttenuatingNet(depth, 64, attenuation, fmt, seed) on its batch, computed once."""
    return probe_gradients(AttenuatingNet(depth, 64, attenuation, fmt, seed),
                           *make_batch(64, 16, fmt, seed))


def underflow_view(attenuation: float = 0.82, depth: int = 96, fmt="float16", g0: float = 1.0,
                   network: bool = False, seed: int = 0) -> tuple[TextPanel, Figure]:
    """The attenuation model g0·a^k over depth with fmt's floors; optionally the real network's signal too."""
    a = check_real(attenuation, "attenuation")
    if not 0 < a < 1:
        raise ValueError(f"attenuation must be in (0, 1); got attenuation={a!r}")
    if int(depth) != depth or not 2 <= depth <= 400:
        raise ValueError(f"depth must be an integer in [2, 400]; got depth={depth!r}")
    f = get_format(fmt)
    g = check_real(g0, "g0")
    if g <= 0:
        raise ValueError(f"g0 must be > 0; got g0={g!r}")
    depth = int(depth)

    def say(k):
        return f"{k}" if k is not None and k < depth else f"none within {depth} layers"

    head = f"a = {a:g}, {depth} layers, {f.name}, gradient at the last layer g0 = {g:.3g}"
    if network:
        if f.name not in NETWORK_FORMATS:
            raise ValueError(f"the network runs only in {', '.join(NETWORK_FORMATS)}; "
                             f"got fmt={f.name!r}")
        probes = {name: network_probe(depth, a, name, int(seed))
                  for name in dict.fromkeys(("float32", f.name))}
        g = fit_g0(probes["float32"], a)  # the network sets g0; the slider value is not used
        head = f"a = {a:g}, {depth} layers, {f.name}; g0 fitted to the float32 network: {g:.3g}"
    lines = [head]
    for floor, what in (("normal", "below the smallest normal"),
                        ("subnormal", "below the smallest subnormal"),
                        ("zero", "rounds to exactly 0")):
        lines.append(f"model, first depth {what:<28}: {say(first_underflow_depth(a, f, g, floor))}")
    if network:
        lines.append(f"network, first depth with >= half zeros in dL/dh : "
                     f"{say(measured_underflow_depth(probes[f.name]))}")
    fig, ax = view_figure(4.0)
    plot_attenuation_model(a, depth, f, g, ax=ax)
    if network:
        med = probes[f.name].signal.median_abs
        ax.plot(np.arange(depth), np.where(med > 0, med, np.nan), color=FORMAT_COLORS[f.name],
                lw=1.2, marker=".", ms=4, label=f"network median |dL/dh|, {f.name}")
        legend_outside(ax)
    return TextPanel("\n".join(lines)), fig


def underflow_explorer(attenuation: float = 0.82, depth: int = 96, fmt="float16",
                       g0: float = 1.0, network: bool = False):
    """interactive(underflow_view, UNDERFLOW_GRID, ...): attenuation x format x network overlay."""
    return interactive(underflow_view, UNDERFLOW_GRID, attenuation=attenuation, depth=depth,
                       fmt=get_format(fmt).name, g0=g0, network=network)
