"""Stiffness against step size: where penalty-contact rollouts stay bounded forward and backward."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from ..checks import check_count, check_positive, check_real
from ..emulate import fixed_sum
from .dynamics import penalty_step, rounder, spread
from .model import World
from .rollout import rollouts


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
    height (loss "mean_height") scaled to a relative change of k. Each row is
    rollout(World(h=h, contact="penalty", ...), y0, ks, round(duration / h), loss="mean_height"),
    bit for bit; the rows advance together as lanes with their own h, a row leaving the
    batch at its last step (so one unroll, as long as the longest row's, serves them all).
    """
    hs = np.asarray(hs, dtype=np.float64).reshape(-1)
    ks = np.asarray(ks, dtype=np.float64).reshape(-1)
    duration = check_positive(duration, "duration")
    y0 = check_positive(y0, "y0")
    if hs.size and (ks.size == 0 or not np.all(np.isfinite(ks))):
        raise ValueError(f"k must be finite real number(s); got k={ks!r}")  # as rollout says
    worlds = [World(h=float(h), contact="penalty", integrator=integrator, fmt=fmt, damping=damping)
              for h in hs]
    steps = np.array([max(1, round(duration / h)) for h in hs], dtype=np.int64)
    fwd = np.empty((hs.size, ks.size))
    bwd = np.empty((hs.size, ks.size))
    if hs.size:
        with np.errstate(over="ignore", invalid="ignore"):
            order = np.argsort(steps, kind="stable")  # rows in the order they finish
            peak, grad = _unroll_rows([worlds[i] for i in order], steps[order], y0, ks)
            fwd[order] = peak / y0
            bwd[order] = np.abs(ks * grad) / y0
    return StiffnessMap(h=hs, k=ks, integrator=integrator, forward=fwd, backward=bwd, steps=steps)


def _unroll_rows(worlds: list[World], steps: np.ndarray, y0: float, ks: np.ndarray):
    """(max_t |y_t|, dy_T/dk) of each row's K lanes, rows sorted by their step counts.

    Every lane runs its own row's arithmetic (its h and fl(h g), as a tensor over the lanes);
    the rows that reach their last step give their loss and leave (a slice of the state), so
    no lane computes past its horizon and its gradient is its row's own.
    """
    w0 = worlds[0]  # the rows differ only in h: the same format, integrator and contact
    r = rounder(w0.fmt, w0.grad_fmt)
    n_k = ks.size
    k_leaf = torch.tensor(np.tile(ks, len(worlds)), dtype=torch.float64, requires_grad=True)
    kb = spread(k_leaf, 1)
    h = torch.tensor(np.repeat([w.h for w in worlds], n_k), dtype=torch.float64)[:, None]
    hg = torch.tensor(np.repeat([w.gravity_step for w in worlds], n_k),
                      dtype=torch.float64)[:, None]
    y = r(torch.full((k_leaf.shape[0], 1), y0, dtype=torch.float64))
    v = r(torch.zeros_like(y))
    peak = np.abs(y.detach().numpy()[:, 0]).copy()
    losses, done = [], 0  # rows finished so far
    for t in range(int(steps[-1])):
        y, v, _, _ = penalty_step(w0, y, v, kb, r, hg, h)
        lo = done * n_k
        np.maximum(peak[lo:], np.abs(y.detach().numpy()[:, 0]), out=peak[lo:])
        leaving = int(np.searchsorted(steps, t + 1, side="right")) - done
        if leaving:
            m = leaving * n_k
            losses.append(fixed_sum(y[:m], dim=-1) / 1)  # the mean of one ball's height
            y, v, kb, h, hg = y[m:], v[m:], kb[m:], h[m:], hg[m:]
            done += leaving
    loss = torch.cat(losses)
    grad = np.zeros(k_leaf.shape[0])
    if loss.requires_grad:
        (g,) = torch.autograd.grad(loss.sum(), k_leaf, allow_unused=True)  # as rollout seeds it
        if g is not None:
            grad = g.detach().numpy().copy()
    return peak.reshape(len(worlds), n_k), grad.reshape(len(worlds), n_k)


def horizon_sensitivity(world: World, y0, k: float, horizons, v0=0.0) -> np.ndarray:
    """dy_T/dk (the mean final height's gradient, lane 0) for each horizon T in `horizons`.

    One unroll to the longest horizon serves them all (rollouts: the same bits as a rollout
    per horizon).
    """
    Ts = [check_count(t, "horizon") for t in np.asarray(horizons).reshape(-1).tolist()]
    if not Ts:
        return np.array([])
    runs = rollouts(world, y0, check_real(k, "k"), Ts, v0=v0, loss="mean_height")
    return np.array([run.grad[0] for run in runs])
