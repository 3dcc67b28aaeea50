"""Unrolled rollouts of the world with the gradient of the loss with respect to k, and finite differences."""

from __future__ import annotations

import numpy as np
import torch

from ..checks import check_choice, check_count, check_positive, check_real
from ..emulate import fixed_sum
from .dynamics import force, integrate, penetration, rounder, spread
from .model import LOSSES, Rollout, World
from .solver import solve


def _lanes(y0, v0, k):
    """y0 as (L, N) float64, v0 broadcast to it, k as (L,): L is the larger of y0's and k's lane counts."""
    y = np.asarray(y0.detach().numpy() if isinstance(y0, torch.Tensor) else y0, dtype=np.float64)
    if y.ndim == 0:
        y = y.reshape(1, 1)
    elif y.ndim == 1:
        y = y.reshape(1, -1)
    elif y.ndim != 2:
        raise ValueError(f"y0 must be a scalar, (N,) or (L, N); got shape {y.shape}")
    kk = np.asarray(k.detach().numpy() if isinstance(k, torch.Tensor) else k, dtype=np.float64).reshape(-1)
    if kk.size == 0 or not np.all(np.isfinite(kk)):
        raise ValueError(f"k must be finite real number(s); got k={k!r}")
    if not np.all(np.isfinite(y)):
        raise ValueError("y0 must be finite")
    lanes = max(y.shape[0], kk.size)
    if y.shape[0] not in (1, lanes) or kk.size not in (1, lanes):
        raise ValueError(f"y0 has {y.shape[0]} lanes and k has {kk.size}: they must match or be 1")
    y = np.broadcast_to(y, (lanes, y.shape[1])).copy()
    kk = np.broadcast_to(kk, (lanes,)).copy()
    v = np.broadcast_to(np.asarray(v0, dtype=np.float64), y.shape).copy()
    return y, v, kk


def rollout(world: World, y0, k, T: int, v0=0.0, loss: str = "penetration",
            target: float = 0.0, k_transform=None) -> Rollout:
    """Unroll T steps from (y0, v0) with parameter k; L = mean_i p_T,i^2, mean_i (y_T,i - target)^2 or mean_i y_T,i; dL/dk.

    y0: scalar, (N,) or (L, N) heights (rounded into world.fmt); v0 broadcasts to y0; k: a scalar
    or one value per lane (L,). loss "penetration" is the seed's mean squared final penetration,
    "height" the mean squared distance of the final heights from `target`, "mean_height" the
    mean final height (its gradient is the sensitivity dy_T/dk itself). k_transform: a
    differentiable map applied to k before the simulator uses it (for example
    emulate.fake_quantize); the gradient is still taken with respect to k.
    """
    return rollouts(world, y0, k, [T], v0=v0, loss=loss, target=target,
                    k_transform=k_transform)[0]


def rollouts(world: World, y0, k, horizons, v0=0.0, loss: str = "penetration",
             target: float = 0.0, k_transform=None) -> list[Rollout]:
    """[rollout(world, y0, k, T, ...) for T in horizons], bit for bit, from one unroll to max(horizons).

    The steps up to T do not depend on the horizon, so one unroll serves every T; the loss
    and dL/dk of each T are taken when the unroll reaches step T (its graph kept for the
    later ones). horizons: step counts >= 1, in any order, repeats allowed.
    """
    if isinstance(horizons, (str, bytes)) or not hasattr(horizons, "__iter__"):
        raise ValueError(f"horizons must be a list of step counts; got horizons={horizons!r}")
    wanted = [check_count(T, "T") for T in horizons]
    if not wanted:
        raise ValueError("horizons must hold at least one step count; got []")
    T = max(wanted)
    check_choice(loss, "loss", LOSSES)
    target = check_real(target, "target")
    y_np, v_np, k_np = _lanes(y0, v0, k)
    lanes, n = y_np.shape
    r = rounder(world.fmt, world.grad_fmt)
    k_leaf = torch.tensor(k_np, dtype=torch.float64, requires_grad=True)
    k_used = k_leaf if k_transform is None else k_transform(k_leaf)
    kb = spread(k_used, n)
    y = r(torch.from_numpy(y_np))
    v = r(torch.from_numpy(v_np))
    hg = world.gravity_step
    if world.contact == "projection":
        c = r(world.alpha * kb)
    engaged = np.full(lanes, bool(world.start_engaged))

    done = {}

    def _finish(y, p_end, contact, last):
        """(loss, dL/dk, whether L depends on k, first_contact) at the step reached."""
        if loss == "penetration":
            per_ball = p_end * p_end
        elif loss == "height":
            d = y - target
            per_ball = d * d
        else:
            per_ball = y
        loss_lanes = fixed_sum(per_ball, dim=-1) / n
        needs = bool(loss_lanes.requires_grad)
        grad = np.zeros(lanes)
        if needs:
            (g,) = torch.autograd.grad(loss_lanes, k_leaf,
                                       grad_outputs=torch.ones_like(loss_lanes),
                                       allow_unused=True, retain_graph=not last)
            if g is not None:
                grad = g.detach().numpy().copy()
        return loss_lanes.detach().numpy().copy(), grad, needs, contact

    heights, vels, pens = [y.detach().numpy().copy()], [v.detach().numpy().copy()], []
    free, touch = [], []
    iters = np.zeros((T, lanes), dtype=np.int64)
    stops = np.full((T, lanes), "none", dtype=object)
    margin = np.full((T, lanes), np.nan)
    first_margin = np.full((T, lanes), np.nan)
    flips = np.zeros((T, lanes), dtype=np.int64)
    first_contact = np.full(lanes, -1, dtype=np.int64)

    for t in range(T):
        if world.contact == "penalty":
            if world.integrator == "explicit":
                p_old = penetration(y, world, r)
                y1, v1 = integrate(world, y, v, r, hg)
                v = r(v1 + r(world.h * force(world, kb, p_old, v, r, y)))
                y = y1
            else:
                y1, v1 = integrate(world, y, v, r, hg)
                p_new = penetration(y1, world, r)
                v = r(v1 + r(world.h * force(world, kb, p_new, v1, r, y1)))
                y = y1
            touching = (y1 < 0).detach().numpy().any(axis=1)
            p_end = penetration(y, world, r)
        else:
            y1, v1 = integrate(world, y, v, r, hg)
            below = y1 < 0
            touching = below.detach().numpy().any(axis=1)
            y, passes, stop, last_m, first_m, fl, engaged = solve(world, y1, c, r, engaged)
            iters[t], stops[t], margin[t], first_margin[t], flips[t] = passes, stop, last_m, first_m, fl
            bounce = -r(world.restitution * torch.minimum(v1, torch.zeros_like(v1)))
            v = torch.where(below, bounce, v1)
            if world.clamp:
                y = torch.where(y < 0, torch.zeros_like(y), y)  # relu(y): no k past this point
            p_end = penetration(y, world, r)
        first_contact = np.where((first_contact < 0) & touching, t, first_contact)
        free.append(v1.detach().numpy().copy())
        touch.append(touching.copy())
        heights.append(y.detach().numpy().copy())
        vels.append(v.detach().numpy().copy())
        pens.append(p_end.detach().numpy().copy())
        if t + 1 in wanted:
            done[t + 1] = _finish(y, p_end, first_contact.copy(), t + 1 == T)

    heights, vels, pens = np.stack(heights), np.stack(vels), np.stack(pens)
    free, touch = np.stack(free), np.stack(touch)
    out = []
    for h in wanted:
        loss_h, grad, needs, contact = done[h]
        out.append(Rollout(world=world, heights=heights[:h + 1].copy(),
                           velocities=vels[:h + 1].copy(), free_velocities=free[:h].copy(),
                           penetration=pens[:h].copy(), iterations=iters[:h].copy(),
                           stop=stops[:h].copy(), margin=margin[:h].copy(),
                           first_margin=first_margin[:h].copy(), flips=flips[:h].copy(),
                           first_contact=contact.copy(), touching=touch[:h].copy(), loss=loss_h.copy(),
                           grad=grad.copy(), loss_requires_grad=needs, k=k_np.copy()))
    return out


def finite_difference(world: World, y0, k: float, T: int, dk: float, v0=0.0,
                      loss: str = "penetration", target: float = 0.0) -> tuple[float, bool]:
    """(L(k + dk) - L(k - dk)) / (2 dk) for lane 0, and whether both runs took k's iteration history."""
    dk = check_positive(dk, "dk")
    runs = rollout(world, y0, [k - dk, k, k + dk], T, v0=v0, loss=loss, target=target)
    same = bool(np.array_equal(runs.iterations[:, 0], runs.iterations[:, 1])
                and np.array_equal(runs.iterations[:, 2], runs.iterations[:, 1]))
    return float((runs.loss[2] - runs.loss[0]) / (2 * dk)), same
