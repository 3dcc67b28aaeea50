"""Stiffness against step size: where penalty-contact rollouts stay bounded forward and backward."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..checks import check_count, check_positive, check_real
from .model import World
from .rollout import rollout


@dataclass
class StiffnessMap:
    """Forward and backward growth of penalty-contact rollouts over a (step size, stiffness) grid."""

    h: np.ndarray  # (H,)
    k: np.ndarray  # (K,)
    integrator: str
    forward: np.ndarray  # (H, K) max_t |y_t| / y0: 1 while the motion stays bounded
    backward: np.ndarray  # (H, K) |k dy_T/dk| / y0: the final height's response to a relative change of k
    steps: np.ndarray  # (H,) rollout lengths round(duration / h)

    def regions(self, forward_limit: float = 1.0, backward_limit: float = 100.0) -> np.ndarray:
        """(H, K) codes: 0 both fine, 1 forward fine but backward above backward_limit, 2 forward above forward_limit.

        The default forward_limit 1 flags every rollout whose ball ever rises above its drop height.
        """
        fwd_bad = ~np.isfinite(self.forward) | (self.forward > forward_limit)
        bwd_bad = ~np.isfinite(self.backward) | (self.backward > backward_limit)
        return np.where(fwd_bad, 2, np.where(bwd_bad, 1, 0))


def stiffness_map(hs, ks, integrator: str = "semi_implicit", duration: float = 2.0,
                  y0: float = 1.0, damping: float = 20.0, fmt="float64") -> StiffnessMap:
    """Damped penalty-contact drops from y0 over `duration` for each step size h (rows) and stiffness k (lanes).

    forward = max_t |y_t| / y0; backward = |k dy_T/dk| / y0, the gradient of the mean final
    height (loss "mean_height") scaled to a relative change of k.
    """
    hs = np.asarray(hs, dtype=np.float64).reshape(-1)
    ks = np.asarray(ks, dtype=np.float64).reshape(-1)
    duration = check_positive(duration, "duration")
    y0 = check_positive(y0, "y0")
    fwd = np.empty((hs.size, ks.size))
    bwd = np.empty((hs.size, ks.size))
    steps = np.empty(hs.size, dtype=np.int64)
    for i, h in enumerate(hs):
        world = World(h=float(h), contact="penalty", integrator=integrator, fmt=fmt, damping=damping)
        T = max(1, round(duration / h))
        steps[i] = T
        with np.errstate(over="ignore", invalid="ignore"):
            run = rollout(world, np.full((1, 1), y0), ks, T, loss="mean_height")
            fwd[i] = np.abs(run.heights).max(axis=(0, 2)) / y0
            bwd[i] = np.abs(ks * run.grad) / y0
    return StiffnessMap(h=hs, k=ks, integrator=integrator, forward=fwd, backward=bwd, steps=steps)


def horizon_sensitivity(world: World, y0, k: float, horizons, v0=0.0) -> np.ndarray:
    """dy_T/dk (the mean final height's gradient, lane 0) for each horizon T in `horizons`."""
    Ts = [check_count(t, "horizon") for t in np.asarray(horizons).reshape(-1).tolist()]
    return np.array([rollout(world, y0, check_real(k, "k"), T, v0=v0, loss="mean_height").grad[0]
                     for T in Ts])
