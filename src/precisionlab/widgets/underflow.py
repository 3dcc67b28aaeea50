"""Chapter 4's underflow explorer: the attenuation model g0·a^k against a format's floors by depth.

With `network` ticked, the view also shows the real network's backward signal: one backward
pass of `underflow.AttenuatingNet` (width 64, batch 16) in the format and in float32, whose
median |dL/dh| the view draws and fits g0 to. Those passes are the explorer's input, not its
lesson: the 36 of its grid (every attenuation in float16, bfloat16 and float32, 96 layers,
seed 0) are stored in data/ch4_network_probes.json and .npz by scripts/ch4_network_probes.py,
and `network_probe` replays them (any other network it computes, once). Their arithmetic is
precisionlab.emulate's, the same bits on every machine: chapter 4 checks the stored passes
at a = 0.82 against the ones it runs, and tests/test_widgets_underflow.py others.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from functools import lru_cache
from pathlib import Path

import numpy as np
from matplotlib.figure import Figure

from ..checks import check_real
from ..formats import get_format
from ..plotting import FORMAT_COLORS, legend_outside, plot_attenuation_model
from ..rl import find_stored
from ..underflow import (
    NETWORK_FORMATS,
    AttenuatingNet,
    LayerGradients,
    first_underflow_depth,
    fit_g0,
    make_batch,
    measured_underflow_depth,
    probe_gradients,
)
from .frames import interactive
from .view import TextPanel, view_figure

__all__ = ["NETWORK_BATCH", "NETWORK_WIDTH", "STORED_PROBES", "UNDERFLOW_GRID",
           "compute_network_probe", "load_network_probes", "network_probe",
           "save_network_probes", "stored_network_probes", "underflow_explorer",
           "underflow_view"]

UNDERFLOW_GRID: dict[str, tuple] = {
    "attenuation": (0.5, 0.6, 0.7, 0.75, 0.8, 0.82, 0.85, 0.88, 0.9, 0.92, 0.95, 0.98),
    "fmt": ("float16", "bfloat16", "float32"),
    "network": (False, True),
}
NETWORK_WIDTH, NETWORK_BATCH = 64, 16  # the explorer's network: 64 units, a batch of 16
STORED_PROBES = "ch4_network_probes.json"  # in data/, written by scripts/ch4_network_probes.py

ProbeKey = tuple[int, float, str, int]  # (depth, attenuation, format, seed)


def compute_network_probe(depth: int, attenuation: float, fmt: str, seed: int) -> LayerGradients:
    """probe_gradients of AttenuatingNet(depth, 64, attenuation, fmt, seed) on its batch of 16, run now."""
    return probe_gradients(AttenuatingNet(depth, NETWORK_WIDTH, attenuation, fmt, seed),
                           *make_batch(NETWORK_WIDTH, NETWORK_BATCH, fmt, seed))


def save_network_probes(path, probes: Mapping[ProbeKey, LayerGradients], meta: Mapping) -> None:
    """Write probes ((depth, a, fmt, seed) -> LayerGradients) to path (.json, meta and keys) and its .npz."""
    path = Path(path)
    entries, arrays = [], {}
    for i, ((depth, a, fmt, seed), p) in enumerate(probes.items()):
        if p.loss_scale != 1 or p.flush_to_zero or p.fmt != get_format(fmt).name:
            raise ValueError(f"probe {i} is not a plain pass of the network in {fmt}")
        entries.append({"depth": int(depth), "attenuation": float(a), "fmt": p.fmt,
                        "seed": int(seed)})
        arrays.update({f"p{i}.{k}": v for k, v in p.arrays().items()})
    np.savez_compressed(path.with_suffix(".npz"), **arrays)
    doc = {**meta, "width": NETWORK_WIDTH, "batch": NETWORK_BATCH, "probes": entries,
           "arrays": path.with_suffix(".npz").name}
    path.write_text(json.dumps(doc, indent=1) + "\n")


def load_network_probes(path) -> tuple[dict, dict[ProbeKey, LayerGradients]]:
    """(meta, (depth, a, fmt, seed) -> LayerGradients) from a file save_network_probes wrote."""
    path = Path(path)
    meta = json.loads(path.read_text())
    if (meta["width"], meta["batch"]) != (NETWORK_WIDTH, NETWORK_BATCH):
        raise ValueError(f"{path.name} holds networks of width {meta['width']} and batch "
                         f"{meta['batch']}; the explorer's are {NETWORK_WIDTH} and {NETWORK_BATCH}")
    with np.load(path.parent / meta["arrays"]) as z:
        arrays = {k: z[k] for k in z.files}
    probes = {}
    for i, e in enumerate(meta["probes"]):
        mine = {k.split(".", 1)[1]: v for k, v in arrays.items() if k.startswith(f"p{i}.")}
        probes[e["depth"], e["attenuation"], e["fmt"], e["seed"]] = \
            LayerGradients.from_arrays(e["fmt"], mine)
    return meta, probes


@lru_cache(maxsize=1)
def stored_network_probes() -> dict[ProbeKey, LayerGradients]:
    """The stored passes (data/ch4_network_probes.json, found by rl.find_stored), or {} where there are none."""
    try:
        path = find_stored(STORED_PROBES)
    except OSError:  # no repository and no download: every pass is computed
        return {}
    return load_network_probes(path)[1]


@lru_cache(maxsize=32)
def _computed(depth: int, attenuation: float, fmt: str, seed: int) -> LayerGradients:
    return compute_network_probe(depth, attenuation, fmt, seed)


def network_probe(depth: int, attenuation: float, fmt: str, seed: int) -> LayerGradients:
    """compute_network_probe(depth, attenuation, fmt, seed): stored where the file holds it, else computed once."""
    key = (int(depth), float(attenuation), get_format(fmt).name, int(seed))
    stored = stored_network_probes().get(key)
    return stored if stored is not None else _computed(*key)


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
