"""The projection solve and its stopping rule: a reduction of the penetrations against tol, and the exact decision."""

from __future__ import annotations

import numpy as np
import torch

from ..formats import get_format
from ..gpu import exact_sum, reduce_sum
from .dynamics import penetration
from .model import World


def _reduce(world: World, p: np.ndarray) -> np.ndarray:
    """S per lane: the gpu-simulated sum of p (L, N) in the policy's accumulator."""
    return np.atleast_1d(reduce_sum(p, world.order, acc=world.accumulator))


def exact_decision(world: World, p: np.ndarray, s: np.ndarray, thr: np.ndarray,
                   go: np.ndarray) -> np.ndarray:
    """exact_sum(p) >= thr per lane, evaluated (math.fsum) only where |S - thr| is within the
    accumulator's error bound 2 (n + 1) u max(S, thr) + n * smallest subnormal; elsewhere the
    rounded decision is provably the exact one."""
    f = get_format(world.accumulator)
    n = p.shape[-1]
    bound = 2 * (n + 1) * 2.0**-f.precision * np.maximum(s, thr) + n * f.min_subnormal
    near = np.abs(s - thr) <= bound
    out = go.copy()
    if near.any():
        out[near] = exact_sum(p[near]) >= thr[near]
    return out


def solve(world: World, y, c, r, engaged: np.ndarray):
    """The projection loop on y (L, N): returns y, passes, stop, margins, flips, engaged."""
    lanes, n = y.shape
    active = np.ones(lanes, dtype=bool)
    passes = np.zeros(lanes, dtype=np.int64)
    stop = np.full(lanes, "tol", dtype=object)
    first_m = np.full(lanes, np.nan)
    last_m = np.full(lanes, np.nan)
    flips = np.zeros(lanes, dtype=np.int64)
    share = world.tol / n
    for it in range(world.max_iter + 1):
        p = penetration(y, world, r)
        pn = p.detach().numpy()
        if world.policy == "per_instance":
            go_ball = pn >= share
            go = go_ball.any(axis=1)
            m = (pn - share).max(axis=1)
            exact_go = go
        else:
            s = _reduce(world, pn)
            if world.policy == "hysteresis":
                thr = np.where(engaged, world.exit_tol, world.tol)
            else:
                thr = np.full(lanes, world.tol)
            go = s >= thr
            m = s - thr
            exact_go = exact_decision(world, pn, s, thr, go)
        go &= active
        last_m = np.where(active, m, last_m)
        if it == 0:
            first_m = m.copy()
        flips += (active & (go != (exact_go & active))).astype(np.int64)
        if world.policy == "hysteresis":
            engaged = np.where(active, go, engaged)
        active = go
        if not active.any():
            break
        if it == world.max_iter:  # a pass was due but the cap is reached
            stop[active] = "max_iter"
            break
        if world.policy == "per_instance":
            mask = go_ball & active[:, None]
        else:
            mask = np.repeat(active[:, None], n, axis=1)
        y = torch.where(torch.from_numpy(mask), r(y + r(c * p)), y)
        passes += active
    return y, passes, stop, last_m, first_m, flips, engaged
