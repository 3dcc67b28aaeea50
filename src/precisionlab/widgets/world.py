"""Chapter 3's bouncing-ball explorer: solver passes of a stopping rule with low-precision sums."""

from __future__ import annotations

import functools
import inspect

import numpy as np
from matplotlib.figure import Figure

from ..checks import check_real
from ..plotting import plot_solver_passes
from ..world import World, rollouts
from .frames import interactive
from .view import TextPanel, view_figure

__all__ = ["WORLD_GRID", "world_explorer", "world_scenes", "world_view"]

WORLD_GRID: dict[str, tuple] = {
    "policy": ("low_precision", "float32", "per_instance", "hysteresis"),
    "horizon": tuple(range(10, 121, 10)),  # a view reruns every scene: cost grows with horizon
}  # tol is fixed per explorer (a 12 x 4 tol grid at 120 steps costs 3x the chapter's budget)


def world_scenes(scenes: int = 16, balls: int = 16, seed: int = 0):
    """The explorer's drop heights: (scenes, balls) uniform in [0.3, 1.5) m from default_rng(seed)."""
    return np.random.default_rng(seed).uniform(0.3, 1.5, (scenes, balls))


def world_view(tol: float = 1e-3, policy: str = "low_precision", horizon: int = 120,
               reduce_fmt="bfloat16", scenes: int = 16, balls: int = 16,
               seed: int = 0) -> tuple[TextPanel, Figure]:
    """scenes x balls float32 drops: solver passes of stopping rule `policy` with reduce_fmt vs float32 sums."""
    return _world_view(None, tol, policy, horizon, reduce_fmt, scenes, balls, seed)


def _world_view(cache: dict | None, tol, policy, horizon, reduce_fmt, scenes, balls, seed):
    """world_view; with a cache (a dict), one unroll per setting serves every grid horizon."""
    steps = int(horizon) if not isinstance(horizon, bool) and float(horizon) == int(horizon) else 0
    if steps < 1:
        raise ValueError(f"horizon must be a whole number of steps >= 1; got horizon={horizon!r}")
    y0 = world_scenes(scenes, balls, seed)
    low = World(fmt="float32", reduce_fmt=reduce_fmt, policy=policy, tol=check_real(tol, "tol"))
    wide = low.with_(reduce_fmt="float32")
    sums = policy in ("low_precision", "hysteresis") and low.accumulator != wide.accumulator
    horizons = [steps]
    if cache is not None and steps in WORLD_GRID["horizon"]:
        horizons = list(WORLD_GRID["horizon"])  # the steps to T do not depend on the horizon
    key = (low, tuple(horizons), scenes, balls, seed)
    if cache is None or key not in cache:
        if sums:
            runs = rollouts(low, y0, 1.0, horizons, loss="height")
            sames = rollouts(wide, y0, 1.0, horizons, loss="height")
            got = dict(zip(horizons, zip(runs, sames, strict=True), strict=True))
        else:  # the view reads only the solver's log: its first T steps serve every T
            got = rollouts(low, y0, 1.0, [max(horizons)], loss="height")[0]
        if cache is not None:
            cache[key] = got
    else:
        got = cache[key]
    run, same = got[steps] if sums else (got, None)
    iterations, stop, flips = run.iterations[:steps], run.stop[:steps], run.flips[:steps]
    if sums:
        differ = np.flatnonzero((run.iterations != same.iterations).any(axis=0))
        scale = np.abs(same.grad).max()
        rel = float(np.abs(run.grad - same.grad).max() / scale) if scale > 0 else 0.0
    what = "per-ball tests, no sum" if policy == "per_instance" else f"{low.accumulator} sums"
    lines = [
        f"{scenes} scenes x {balls} balls dropped, float32 state, tol {low.tol:g}, {steps} steps",
        f"stopping rule {policy} ({what})"
        + (f", exit tolerance {low.exit_tol:g}" if policy == "hysteresis" else ""),
        f"solver passes: {int(iterations.sum())}, "
        f"stops on max_iter: {int((stop == 'max_iter').sum())}",
        f"decisions the exact sum would reverse: {int(flips.sum())}",
    ]
    if sums:
        lines += [f"scenes whose iteration history differs with float32 sums: {differ.size} of "
                  f"{scenes}", f"largest change of dL/dk: {rel:.1e} of max |dL/dk|"]
    fig, ax = view_figure(3.4)
    curves = {f"{policy}, {what}": iterations}
    if sums:
        curves[f"{policy}, float32 sums"] = same.iterations
    plot_solver_passes(curves, flips=flips, ax=ax)
    return TextPanel("\n".join(lines)), fig


def world_explorer(tol: float = 1e-3, policy: str = "low_precision", horizon: int = 120):
    """interactive(world_view, WORLD_GRID, ...): stopping policy x horizon, at a fixed tolerance."""
    cache: dict = {}  # this explorer's unrolls, one per setting (not shared between explorers)

    @functools.wraps(world_view)
    def view(*args, **kwargs):
        b = _SIGNATURE.bind(*args, **kwargs)
        b.apply_defaults()
        return _world_view(cache, **b.arguments)

    return interactive(view, WORLD_GRID, tol=tol, policy=policy, horizon=horizon)


_SIGNATURE = inspect.signature(world_view)
