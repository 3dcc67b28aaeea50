"""Normalisations (RMSNorm, GroupNorm): statistics by fixed-order sums in float64, one rounding to F."""

from __future__ import annotations

import torch

from .elementary import sqrt64
from .precision import as_precision
from .summation import fixed_sum, sum_over

__all__ = ["group_norm", "rms_norm"]


class _RMSNorm(torch.autograd.Function):
    """y = fl_F(x / sqrt(mean(x^2) + eps)) over the last dim; one rounding, float64 inside."""

    @staticmethod
    def forward(ctx, x, eps, prec):
        xr = prec.round(x).to(torch.float64)
        r = 1.0 / sqrt64(fixed_sum(xr * xr, -1, keepdim=True) / xr.shape[-1] + eps)
        ctx.save_for_backward(xr, r)
        ctx.prec = prec
        return prec.round(xr * r)

    @staticmethod
    def backward(ctx, g):
        xr, r = ctx.saved_tensors
        prec = ctx.prec
        g = prec.round(g).to(torch.float64)
        y = xr * r
        # dx = r (g - y mean(g y)): the projection removes the component along y.
        dx = r * (g - y * (fixed_sum(g * y, -1, keepdim=True) / xr.shape[-1]))
        return prec.round(dx), None, None


def rms_norm(x: torch.Tensor, prec="float32", eps: float = 1e-6) -> torch.Tensor:
    """x / sqrt(mean_last(x^2) + eps), no learnable scale."""
    prec = as_precision(prec)
    if prec.native:
        return torch.nn.functional.rms_norm(x.to(prec.dtype), (x.shape[-1],), eps=eps).to(
            prec.container)
    return _RMSNorm.apply(x, float(eps), prec)


def _group_stats64(x: torch.Tensor, groups: int, eps: float):
    """For float64 x (N, C, *): x_hat = (x - mean) r and r = 1/sqrt(var + eps) per (sample, group), grouped shape (N, G, m)."""
    xg = x.reshape(x.shape[0], groups, -1)
    m = xg.shape[-1]
    d = xg - fixed_sum(xg, -1, keepdim=True) / m
    r = 1.0 / sqrt64(fixed_sum(d * d, -1, keepdim=True) / m + eps)
    return d * r, r


def _channel_view(p: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """A per-channel vector (C,) shaped (1, C, 1, ...) to broadcast against x (N, C, *)."""
    return p.reshape(1, -1, *([1] * (x.dim() - 2)))


class _GroupNorm(torch.autograd.Function):
    """y = fl_F(x_hat gamma + beta), x_hat normalised over each (sample, group); float64 inside, one rounding."""

    @staticmethod
    def forward(ctx, x, groups, w, b, eps, prec):
        xr = prec.round(x).to(torch.float64)
        xhat, r = _group_stats64(xr, groups, eps)
        xhat = xhat.reshape(xr.shape)
        wr = None if w is None else _channel_view(prec.round(w).to(torch.float64), xr)
        y = xhat if wr is None else xhat * wr
        if b is not None:
            y = y + _channel_view(prec.round(b).to(torch.float64), xr)
        ctx.save_for_backward(xhat, r, wr)
        ctx.groups, ctx.prec, ctx.has = groups, prec, (w is not None, b is not None)
        return prec.round(y)

    @staticmethod
    def backward(ctx, g):
        xhat, r, wr = ctx.saved_tensors
        prec, groups = ctx.prec, ctx.groups
        g = prec.round(g).to(torch.float64)
        gy = g if wr is None else g * wr
        n = xhat.shape[0]
        gg, hg = gy.reshape(n, groups, -1), xhat.reshape(n, groups, -1)
        m = gg.shape[-1]
        # dx = r (g' - mean(g') - x_hat mean(g' x_hat)) per group, g' = g gamma.
        dx = r * (gg - fixed_sum(gg, -1, keepdim=True) / m
                  - hg * (fixed_sum(gg * hg, -1, keepdim=True) / m))
        per_channel = (0, *range(2, xhat.dim()))
        gw = gb = None
        if ctx.has[0] and ctx.needs_input_grad[2]:
            gw = prec.round(sum_over(g * xhat, per_channel))
        if ctx.has[1] and ctx.needs_input_grad[3]:
            gb = prec.round(sum_over(g, per_channel))
        return prec.round(dx.reshape(xhat.shape)), None, gw, gb, None, None


def group_norm(x: torch.Tensor, groups: int, weight: torch.Tensor | None = None,
               bias: torch.Tensor | None = None, prec="float32", eps: float = 1e-5) -> torch.Tensor:
    """(x - mean) / sqrt(var + eps) over each group of C/groups channels of x (N, C, *), times weight plus bias."""
    prec = as_precision(prec)
    if x.dim() < 2 or int(groups) != groups or groups < 1 or x.shape[1] % groups:
        raise ValueError(f"group_norm needs x (N, C, *) with C divisible by groups; got shape "
                         f"{tuple(x.shape)} and groups={groups!r}")
    if prec.native:
        dt = prec.dtype

        def cv(p):
            return None if p is None else p.to(dt)

        return torch.nn.functional.group_norm(x.to(dt), int(groups), cv(weight), cv(bias),
                                              eps).to(prec.container)
    return _GroupNorm.apply(x, int(groups), weight, bias, float(eps), prec)
