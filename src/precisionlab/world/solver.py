"""The projection solve and its stopping rule: a reduction of the penetrations against tol, and the exact decision."""

from __future__ import annotations

import numpy as np
import torch

from ..formats import get_format
from ..gpu import exact_sum, reduce_sum
from ..rounding import round_to
from ..rounding_native import native_dtype
from .dynamics import penetration
from .model import World


def _reduce(world: World, p: np.ndarray) -> np.ndarray:
    """S per lane: the gpu-simulated sum of p (L, N) in the policy's accumulator."""
    if world.order == "sequential":
        s = sequential_sum(p, world.accumulator)
        if s is not None:
            return s
    return np.atleast_1d(reduce_sum(p, world.order, acc=world.accumulator))


def sequential_sum(p: np.ndarray, acc) -> np.ndarray | None:
    """gpu.reduce_sum(p, "sequential", acc=acc) for finite p (L, N), bit for bit, or None.

    The same operations in fewer calls: float64 and float32 accumulators sum with np.cumsum
    (strictly left to right in the accumulator's own IEEE arithmetic); formats of at most 11
    bits within float32's range add in float32 and round each sum by torch's cast into the
    format (rounding_native.native_dtype: exactly round_to's nearest even there), which is
    reduce_sum's double_round32 path (gpu.arith). None where that path does not apply, and
    where a sum is NaN (reduce_sum gives its NaN the kernel's bits).
    """
    f = get_format(acc)
    if p.ndim != 2 or p.shape[1] == 0 or not np.isfinite(p).all():
        return None
    with np.errstate(over="ignore"):
        if f.name == "float64":
            s = np.cumsum(p, axis=1)[:, -1]
        elif f.name == "float32":  # fl32(p): NumPy's cast is round_to's for float32
            s = np.cumsum(p.astype(np.float32), axis=1, dtype=np.float32)[:, -1]
        else:
            s = _narrow_sum(p, f)
    if s is None:
        return None
    s = s.astype(np.float64)
    return None if np.isnan(s).any() else s


def _narrow_sum(p: np.ndarray, f) -> np.ndarray | None:
    """sequential_sum into a format of at most 11 bits with an exact torch cast, else None."""
    dtype = native_dtype(f, saturate=False)
    if dtype is None or 2 * f.precision + 2 > 24 or f.emax > 127 or f.min_subnormal < 2.0**-149:
        return None
    a32 = p.astype(np.float32)
    if np.array_equal(a32, p):  # p holds float32 values: fl(p) is the cast of a32
        rows = torch.from_numpy(np.ascontiguousarray(a32.T)).to(dtype).float()
    else:
        rows = torch.from_numpy(np.ascontiguousarray(np.asarray(round_to(p, f), dtype=np.float32).T))
    terms = rows.unbind(0)
    acc = terms[0].clone()
    narrow = torch.empty(acc.shape, dtype=dtype)
    for term in terms[1:]:
        # float32 keeps >= 2p + 2 bits: rounding the sum there and then into f is one
        # rounding of the exact sum (innocuous double rounding, gpu.arith)
        acc.add_(term)
        narrow.copy_(acc)
        acc.copy_(narrow)
    return acc.numpy()


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
    """The projection loop on y (L, N): returns y, passes, stop, margins, flips, engaged and
    the penetration of the returned y (the last test's, a tensor like one computed afresh)."""
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
    return y, passes, stop, last_m, first_m, flips, engaged, p
