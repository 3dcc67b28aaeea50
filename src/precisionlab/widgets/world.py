"""Chapter 3's bouncing-ball explorer: solver passes of a stopping rule with low-precision sums."""

from __future__ import annotations

import numpy as np
from matplotlib.figure import Figure

from ..checks import check_real
from ..plotting import plot_solver_passes
from ..world import World, rollout
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
    steps = int(horizon) if not isinstance(horizon, bool) and float(horizon) == int(horizon) else 0
    if steps < 1:
        raise ValueError(f"horizon must be a whole number of steps >= 1; got horizon={horizon!r}")
    y0 = world_scenes(scenes, balls, seed)
    low = World(fmt="float32", reduce_fmt=reduce_fmt, policy=policy, tol=check_real(tol, "tol"))
    wide = low.with_(reduce_fmt="float32")
    run = rollout(low, y0, 1.0, steps, loss="height")
    sums = policy in ("low_precision", "hysteresis") and low.accumulator != wide.accumulator
    same = rollout(wide, y0, 1.0, steps, loss="height") if sums else run
    differ = np.flatnonzero((run.iterations != same.iterations).any(axis=0))
    scale = np.abs(same.grad).max()
    rel = float(np.abs(run.grad - same.grad).max() / scale) if scale > 0 else 0.0
    what = "per-ball tests, no sum" if policy == "per_instance" else f"{low.accumulator} sums"
    lines = [
        f"{scenes} scenes x {balls} balls dropped, float32 state, tol {low.tol:g}, {steps} steps",
        f"stopping rule {policy} ({what})"
        + (f", exit tolerance {low.exit_tol:g}" if policy == "hysteresis" else ""),
        f"solver passes: {int(run.total_iterations.sum())}, "
        f"stops on max_iter: {int((run.stop == 'max_iter').sum())}",
        f"decisions the exact sum would reverse: {int(run.flips.sum())}",
    ]
    if sums:
        lines += [f"scenes whose iteration history differs with float32 sums: {differ.size} of "
                  f"{scenes}", f"largest change of dL/dk: {rel:.1e} of max |dL/dk|"]
    fig, ax = view_figure(3.4)
    curves = {f"{policy}, {what}": run.iterations}
    if sums:
        curves[f"{policy}, float32 sums"] = same.iterations
    plot_solver_passes(curves, flips=run.flips, ax=ax)
    return TextPanel("\n".join(lines)), fig


def world_explorer(tol: float = 1e-3, policy: str = "low_precision", horizon: int = 120):
    """interactive(world_view, WORLD_GRID, ...): stopping policy x horizon, at a fixed tolerance."""
    return interactive(world_view, WORLD_GRID, tol=tol, policy=policy, horizon=horizon)
