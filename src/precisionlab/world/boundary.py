"""Decisions at a rounding boundary: sums one ulp below tol, solves they flip, and contacts one ulp apart."""

from __future__ import annotations

import numpy as np
import torch

from ..checks import check_count, check_positive, check_real
from ..formats import get_format
from ..gpu import boundary_terms, reduce_sum
from ..rounding import next_up, round_to, seed_generator
from .dynamics import integrate, rounder
from .model import Rollout, World
from .rollout import rollout


def boundary_batch(fmt="bfloat16", tol: float = 1e-3, n_small: int = 8) -> tuple[np.ndarray, float]:
    """(y0, tol_F): heights -[L, s, ..., s] whose penetrations sum exactly to tol_F = fl_F(tol).

    L is the F value just below tol_F and the n_small terms s = ulp(L) / n_small each: a
    sequential F sum that starts with L drops every s and lands one ulp below tol_F, while the
    exact (or float32) sum is tol_F itself (gpu.boundary_terms).
    """
    f = get_format(fmt)
    tol_f = float(round_to(check_positive(tol, "tol"), f))
    terms = boundary_terms(tol_f, f, n_small)
    return -terms.reshape(1, -1), tol_f


def boundary_rollout(fmt="bfloat16", policy: str = "low_precision", low="bfloat16", T: int = 4,
                     max_iter: int = 25, k: float = 0.5, tol: float = 1e-3, n_small: int = 8,
                     **world_fields) -> Rollout:
    """Micro-demo 2: the boundary batch of format `low` at rest inside the floor (g = 0), T solves with gain k.

    The state is stored in `fmt`; tol is fl_low(tol); the loss is the mean squared final
    penetration. Extra keyword arguments are World fields (tol_exit, alpha, order, ...).
    """
    y0, tol_low = boundary_batch(low, tol, n_small)
    world = World(g=0.0, fmt=fmt, policy=policy, tol=tol_low, max_iter=max_iter, **world_fields)
    return rollout(world, y0, k, T, loss="penetration")


def side_by_side(runs: dict, lane: int = 0) -> str:
    """One line per named rollout (first contact step, iterations per step, loss, dL/dk, whether
    the loss needs grad), then max_t,i |p_t,i(first) - p_t,i(other)| for every other run."""
    width = max(len(name) for name in runs)
    lines = [f"{'run':<{width}}  {'contact':>7}  {'iterations per step':<20} {'loss':>12} "
             f"{'dL/dk':>13}  requires grad"]
    for name, r in runs.items():
        lines.append(f"{name:<{width}}  {int(r.first_contact[lane]):>7}  {r.it_hist(lane)!s:<20} "
                     f"{r.loss[lane]:>12.6e} {r.grad[lane]:>13.6e}  {r.loss_requires_grad}")
    names = list(runs)
    first = runs[names[0]]
    for name in names[1:]:
        d = np.abs(first.penetration[:, lane] - runs[name].penetration[:, lane]).max()
        lines.append(f"largest |penetration difference| over the horizon, {names[0]} vs {name}: {d:.6e}")
    return "\n".join(lines)


def torch_boundary_rollout(dtype: torch.dtype = torch.bfloat16, promoted: bool = False,
                           low: torch.dtype | None = None, T: int = 4, max_iter: int = 25,
                           k: float = 0.5, alpha: float = 0.5, tol: float = 1e-3,
                           n_small: int = 8) -> dict:
    """Micro-demo 2 with torch's own kernels: state, gain and gradient in `dtype` ("your hardware").

    The boundary batch of format `low` (default: dtype) is held in a `dtype` tensor; each
    step runs y <- y + alpha k p while S >= tol, S summed one torch add at a time in dtype, or
    by torch.sum in float32 when `promoted`; k is a float32 leaf cast to dtype, as under
    autocast. Returns it_hist, p_hist (T, N), loss (mean p^2 in float32), grad and
    loss_requires_grad. Hardware-dependent by design: for comparison with the emulated run.
    """
    low_fmt = get_format(low if low is not None else dtype)
    y0, tol_low = boundary_batch(low_fmt, tol, n_small)
    kk = torch.tensor(float(k), dtype=torch.float32, requires_grad=True)
    gain = kk.to(dtype)
    y = torch.as_tensor(y0[0]).to(torch.float32).to(dtype)
    it_hist, p_hist = [], []
    p = torch.relu(-y)
    for _ in range(check_count(T, "T")):
        it = 0
        while it < max_iter:
            p = torch.relu(-y)
            if promoted:
                s = p.float().sum()
            else:
                s = torch.zeros((), dtype=dtype)
                for term in p:
                    s = s + term
            if bool(s < tol_low):
                break
            y = y + alpha * gain * p
            it += 1
        it_hist.append(it)
        p_hist.append(p.detach().float().numpy().astype(np.float64))
    loss = p.float().pow(2).mean()
    needs = bool(loss.requires_grad)
    value = float(loss.detach())
    grad = 0.0
    if needs:
        (g,) = torch.autograd.grad(loss, kk, allow_unused=True)
        grad = 0.0 if g is None else float(g)
    return {"it_hist": it_hist, "p_hist": np.stack(p_hist), "loss": value, "grad": grad,
            "loss_requires_grad": needs}


def coalesce(indices, values, order: str = "sequential", acc="float16", *,
             seed: int | None = None):
    """(unique indices, sums): duplicate indices of a COO list summed, each group in the listed
    order with gpu.reduce_sum(order, acc): contact impulses accumulated per body.

    Which order a sparse library uses when it coalesces is its own choice; order="atomic"
    (with seed) adds each value by its own atomic add in a random order, as a scatter-add
    does (reduce_sum's block=1); the groups, in sorted index order, take the seeds that
    np.random.default_rng(seed) draws one by one.
    """
    idx = np.asarray(indices).reshape(-1)
    val = np.asarray(values, dtype=np.float64).reshape(-1)
    if idx.shape != val.shape:
        raise ValueError(f"indices and values must have the same length; got {idx.size} and {val.size}")
    keys = np.unique(idx)
    seeds = [None] * keys.size if seed is None else seed_generator(seed).integers(0, 2**63, keys.size)
    block = 1 if order == "atomic" else 32  # reduce_sum's default tile for the blocked order
    sums = np.array([float(reduce_sum(val[idx == key], order, acc=acc, seed=s, block=block))
                     for key, s in zip(keys, seeds, strict=True)])
    return keys, sums


def first_contact_steps(world: World, y0, T: int, v0=0.0) -> np.ndarray:
    """For each starting height in y0 (one ball per lane): the first step whose free-flight position is below 0 (T: none)."""
    T = check_count(T, "T")
    y = torch.as_tensor(np.asarray(y0, dtype=np.float64).reshape(-1))
    r = rounder(world.fmt)
    hg = world.gravity_step
    with torch.no_grad():
        y = r(y)
        v = r(torch.full_like(y, float(v0)))
        out = np.full(y.shape[0], T, dtype=np.int64)
        for t in range(T):
            y, v = integrate(world, y, v, r, hg)
            hit = (y < 0).numpy() & (out == T)
            out[hit] = t
            if (out < T).all():
                break
    return out


def contact_boundary(world: World, lo: float, hi: float, T: int) -> tuple[float, float, int, int]:
    """Adjacent values (a, b = next_up(a)) of world.fmt in [lo, hi] whose drops first touch the floor at different steps.

    Bisection on the monotone map y0 -> first-contact step (rounding is monotone), so
    first_contact(lo) must be below first_contact(hi). Returns (a, b, step_a, step_b).
    """
    f = world.fmt
    a, b = float(round_to(check_real(lo, "lo"), f)), float(round_to(check_real(hi, "hi"), f))
    sa, sb = first_contact_steps(world, [a, b], T)
    if not sa < sb:
        raise ValueError(f"lo={lo!r} and hi={hi!r} touch the floor at the same step ({sa}); "
                         "widen the interval")
    while float(next_up(a, f)) < b:
        mid = float(round_to(0.5 * (a + b), f))
        if not a < mid < b:
            mid = float(next_up(a, f))
        (sm,) = first_contact_steps(world, [mid], T)
        if sm == sa:
            a = mid
        else:
            b, sb = mid, sm
    return a, b, int(sa), int(sb)
