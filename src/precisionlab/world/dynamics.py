"""One time step's arithmetic: rounding with straight-through gradients, penetration, contact force, Euler."""

from __future__ import annotations

import torch

from ..emulate import Precision, exp, fixed_sum, log
from ..rounding import round_to
from .model import World

_F64 = Precision("float64", "float64")


class _Round(torch.autograd.Function):
    """y = fl_F(x) stored in float64; dy/dx = 1 (straight through), the adjoint rounded to G if given."""

    @staticmethod
    def forward(ctx, x, fmt, grad_fmt):
        ctx.grad_fmt = grad_fmt
        return round_to(x.detach(), fmt)

    @staticmethod
    def backward(ctx, g):
        if ctx.grad_fmt is not None:
            g = round_to(g.contiguous(), ctx.grad_fmt)
        return g, None, None


class _Spread(torch.autograd.Function):
    """k (L,) -> k broadcast to (L, N); the backward sums over N with emulate.fixed_sum (fixed order)."""

    @staticmethod
    def forward(ctx, k, n):
        return k.detach()[:, None].expand(k.shape[0], n).clone()

    @staticmethod
    def backward(ctx, g):
        return fixed_sum(g, dim=-1), None


def spread(k: torch.Tensor, n: int) -> torch.Tensor:
    """k (L,) broadcast to (L, N) for the simulator; its gradient sums over N in a fixed order."""
    return _Spread.apply(k, n)


def rounder(fmt: str, grad_fmt: str | None = None):
    """x -> fl_fmt(x) stored in float64 with a straight-through gradient (identity for float64)."""
    if fmt == "float64" and grad_fmt is None:
        return lambda x: x
    return lambda x: _Round.apply(x, fmt, grad_fmt)


def softplus(x: torch.Tensor) -> torch.Tensor:
    """log(1 + e^x) = max(x, 0) + log1p(e^-|x|) in float64 from + - * / (emulate's exp and log)."""
    x = x.to(torch.float64)
    neg = torch.where(x > 0, -x, x)  # -|x| with the derivative's sign right at 0
    pos = torch.where(x > 0, x, torch.zeros_like(x))
    e = exp(neg, _F64)
    u = 1.0 + e
    # log1p(e) = log(u) e / (u - 1): the rounding of u cancels (Goldberg's trick); e itself once u = 1
    tiny = u == 1.0
    d = torch.where(tiny, torch.ones_like(u), u - 1.0)
    return pos + torch.where(tiny, e, log(u, _F64) * (e / d))


def penetration(y: torch.Tensor, world: World, r) -> torch.Tensor:
    """p = max(0, -y), or eps softplus(-y / eps) with eps = world.smooth, rounded to the format."""
    if world.smooth > 0:
        return r(world.smooth * softplus(-y / world.smooth))
    return torch.where(y < 0, -y, torch.zeros_like(y))  # exact in any format


def _contact_weight(y: torch.Tensor, world: World) -> torch.Tensor:
    """dp/d(-y): 1 below the floor and 0 above (hard contact), sigmoid(-y / eps) when smoothed."""
    if world.smooth == 0:
        return (y < 0).to(torch.float64)
    x = (-y / world.smooth).to(torch.float64)
    e = exp(torch.where(x > 0, -x, x), _F64)  # e^-|x|, never overflows
    return torch.where(x > 0, 1.0 / (1.0 + e), e / (1.0 + e))


def force(world: World, kb, p, v, r, y):
    """Contact force k p, minus damping c v while in contact: where y < 0, or weighted by
    sigmoid(-y / eps) for a smoothed contact (so a ball in free flight is not damped)."""
    f = r(kb * p)
    if world.damping > 0:
        if world.smooth == 0:
            f = torch.where(p > 0, r(f - r(world.damping * v)), f)
        else:
            w = _contact_weight(y, world)
            f = r(f - r(world.damping * r(w * v)))
    return f


def integrate(world: World, y, v, r, hg, h=None):
    """Unconstrained step: semi-implicit (y uses the new v) or explicit Euler (y uses the old v).

    h: the step size, world.h unless given (a tensor broadcasting to y: one per lane).
    """
    h = world.h if h is None else h
    if world.integrator == "semi_implicit":
        v1 = r(v - hg)
        return r(y + r(h * v1)), v1
    return r(y + r(h * v)), r(v - hg)


def penalty_step(world: World, y, v, kb, r, hg, h=None, p_old=None):
    """One step of penalty contact: (y, v) after it, the unconstrained velocity v' and the
    penetration of the new y where the step computed it (semi-implicit Euler: its force
    uses the new position and v'), else None (explicit Euler: the force uses the old state,
    whose penetration p_old may be given).

    h: the step size, world.h unless given (a tensor broadcasting to y: one per lane).
    """
    h = world.h if h is None else h
    if world.integrator == "explicit":
        p_old = penetration(y, world, r) if p_old is None else p_old
        y1, v1 = integrate(world, y, v, r, hg, h)
        return y1, r(v1 + r(h * force(world, kb, p_old, v, r, y))), v1, None
    y1, v1 = integrate(world, y, v, r, hg, h)
    p_new = penetration(y1, world, r)
    return y1, r(v1 + r(h * force(world, kb, p_new, v1, r, y1))), v1, p_new
