"""Unrolled rollouts of the world with the gradient of the loss with respect to k, and finite differences."""

from __future__ import annotations

import numpy as np
import torch

from ..checks import check_choice, check_count, check_positive, check_real
from ..emulate import fixed_sum
from .dynamics import integrate, penalty_step, penetration, rounder, spread
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

    The steps up to T do not depend on the horizon, so one unroll serves every T. Each
    distinct horizon gets its own copy of the lanes (a replica: its own k, so its own dL/dk);
    a replica leaves the batch at its horizon with its loss, and one backward pass then
    gives every horizon's gradient. The copies run the same arithmetic, and the solver's
    passes, which are decided per lane, come out the same in each. horizons: step counts
    >= 1, in any order, repeats allowed.
    """
    if isinstance(horizons, (str, bytes)) or not hasattr(horizons, "__iter__"):
        raise ValueError(f"horizons must be a list of step counts; got horizons={horizons!r}")
    wanted = [check_count(T, "T") for T in horizons]
    if not wanted:
        raise ValueError("horizons must hold at least one step count; got []")
    ends = sorted(set(wanted))  # replica j leaves after step ends[j]
    T = ends[-1]
    check_choice(loss, "loss", LOSSES)
    target = check_real(target, "target")
    y_np, v_np, k_np = _lanes(y0, v0, k)
    lanes, n = y_np.shape
    reps = len(ends)
    r = rounder(world.fmt, world.grad_fmt)
    k_leaf = torch.tensor(np.tile(k_np, reps), dtype=torch.float64, requires_grad=True)
    k_used = k_leaf if k_transform is None else torch.cat(
        [k_transform(part) for part in k_leaf.split(lanes)])  # each replica's k on its own
    kb = spread(k_used, n)
    y = r(torch.from_numpy(np.tile(y_np, (reps, 1))))
    v = r(torch.from_numpy(np.tile(v_np, (reps, 1))))
    hg = world.gravity_step
    c = r(world.alpha * kb) if world.contact == "projection" else None
    engaged = np.full(lanes * reps, bool(world.start_engaged))

    def _loss(y, p_end):
        """Each lane's loss at the step reached: (L,) from the first replica's rows of y and p."""
        if loss == "penetration":
            per_ball = p_end * p_end
        elif loss == "height":
            d = y - target
            per_ball = d * d
        else:
            per_ball = y
        return fixed_sum(per_ball, dim=-1) / n

    # the log: the last replica's rows (it runs to T; every replica's steps are the same)
    heights, vels, pens = [y[-lanes:].detach().numpy().copy()], [v[-lanes:].detach().numpy().copy()], []
    free, touch = [], []
    iters = np.zeros((T, lanes), dtype=np.int64)
    stops = np.full((T, lanes), "none", dtype=object)
    margin = np.full((T, lanes), np.nan)
    first_margin = np.full((T, lanes), np.nan)
    flips = np.zeros((T, lanes), dtype=np.int64)
    first_contact = np.full(lanes, -1, dtype=np.int64)
    p_next = None  # penalty contact: the penetration of y, once a step has computed it
    losses, contacts = [], []

    for t in range(T):
        if world.contact == "penalty":
            y, v, v1, p_new = penalty_step(world, y, v, kb, r, hg, p_old=p_next)
            touching = (y[-lanes:] < 0).detach().numpy().any(axis=1)
            # p of the new y, computed once: the step's (semi-implicit) serves the log, and
            # the log's the next step's force (explicit), except where a loss takes p_end
            # (then it is a node of its own, as its gradient's rounding requires)
            scored = loss == "penetration" and t + 1 in ends
            p_end = p_new if p_new is not None and not scored else penetration(y, world, r)
            p_next = None if scored else p_end
        else:
            y1, v1 = integrate(world, y, v, r, hg)
            below = y1 < 0
            touching = below[-lanes:].detach().numpy().any(axis=1)
            y, passes, stop, last_m, first_m, fl, engaged, p_end = solve(world, y1, c, r, engaged)
            iters[t], stops[t], margin[t], first_margin[t], flips[t] = (
                a[-lanes:] for a in (passes, stop, last_m, first_m, fl))
            bounce = -r(world.restitution * torch.minimum(v1, torch.zeros_like(v1)))
            v = torch.where(below, bounce, v1)
            if world.clamp:
                y = torch.where(y < 0, torch.zeros_like(y), y)  # relu(y): no k past this point
                p_end = penetration(y, world, r)
        first_contact = np.where((first_contact < 0) & touching, t, first_contact)
        free.append(v1[-lanes:].detach().numpy().copy())
        touch.append(touching.copy())
        heights.append(y[-lanes:].detach().numpy().copy())
        vels.append(v[-lanes:].detach().numpy().copy())
        pens.append(p_end[-lanes:].detach().numpy().copy())
        if t + 1 == ends[len(losses)]:  # the first replica leaves with its loss
            losses.append(_loss(y[:lanes], p_end[:lanes]))
            contacts.append(first_contact.copy())
            if t + 1 < T:
                y, v, kb, p_end = y[lanes:], v[lanes:], kb[lanes:], p_end[lanes:]
                c = None if c is None else c[lanes:]
                p_next = None if p_next is None else p_next[lanes:]
                engaged = engaged[lanes:]

    # every horizon's dL/dk from one backward pass: the sum seeds each lane's loss with
    # exactly 1 (as grad_outputs=ones would, without torch's checks of a given seed, which
    # import sympy), and the replicas' k are separate leaves
    scored = [j for j, lj in enumerate(losses) if lj.requires_grad]
    grads = np.zeros((reps, lanes))
    if scored:
        total = torch.cat([losses[j] for j in scored]).sum()
        (g,) = torch.autograd.grad(total, k_leaf, allow_unused=True)
        if g is not None:
            grads = g.detach().numpy().reshape(reps, lanes).copy()
    done = {h: (losses[j].detach().numpy().copy(), grads[j], j in scored, contacts[j])
            for j, h in enumerate(ends)}

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
