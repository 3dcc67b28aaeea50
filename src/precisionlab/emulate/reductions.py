"""Reductions over a dimension (sum, mean, log-softmax): fixed-order sums in float64, one rounding to F."""

from __future__ import annotations

import torch

from .elementary import exp64, log64
from .precision import as_precision
from .summation import fixed_sum

__all__ = ["log_softmax", "mean", "sum"]


class _LogSoftmax(torch.autograd.Function):
    """y = fl_F(x - max - ln sum e^(x - max)) over the last dim; dx = fl_F(g - e^y sum g)."""

    @staticmethod
    def forward(ctx, x, prec):
        xr = prec.round(x).to(torch.float64)
        z = xr - xr.amax(-1, keepdim=True)
        y = z - log64(fixed_sum(exp64(z), -1, keepdim=True))
        ctx.save_for_backward(y)
        ctx.prec = prec
        return prec.round(y)

    @staticmethod
    def backward(ctx, g):
        (y,) = ctx.saved_tensors
        prec = ctx.prec
        g = prec.round(g).to(torch.float64)
        return prec.round(g - exp64(y) * fixed_sum(g, -1, keepdim=True)), None


def log_softmax(x: torch.Tensor, prec="float32") -> torch.Tensor:
    """log softmax over the last dimension."""
    prec = as_precision(prec)
    if prec.native:
        return torch.log_softmax(x.to(prec.dtype), -1).to(prec.container)
    return _LogSoftmax.apply(x, prec)


class _Sum(torch.autograd.Function):
    """y = fl_F(fixed_sum(x, dim) / d), d = 1 (sum) or the length (mean); dx = fl_F(dy / d) broadcast."""

    @staticmethod
    def forward(ctx, x, dim, keepdim, divide, prec):
        xr = prec.round(x).to(torch.float64)
        d = xr.shape[dim] if divide else 1
        ctx.shape, ctx.dim, ctx.keepdim, ctx.d, ctx.prec = x.shape, dim, keepdim, d, prec
        return prec.round(fixed_sum(xr, dim, keepdim) / d)

    @staticmethod
    def backward(ctx, g):
        prec = ctx.prec
        g = prec.round(g).to(torch.float64) / ctx.d
        if not ctx.keepdim:
            g = g.unsqueeze(ctx.dim)
        return prec.round(g.expand(ctx.shape)), None, None, None, None


def _reduce(x, dim, keepdim, divide, prec):
    """sum (divide False) or mean (True) over dim, every entry when dim is None."""
    prec = as_precision(prec)
    if dim is None:
        x, dim = x.reshape(-1), 0
    if prec.native:
        f = torch.mean if divide else torch.sum
        return f(x.to(prec.dtype), dim, keepdim=keepdim).to(prec.container)
    return _Sum.apply(x, int(dim), bool(keepdim), bool(divide), prec)


def sum(x: torch.Tensor, dim: int | None = None, keepdim: bool = False, prec="float32") -> torch.Tensor:
    """sum over dim (all entries when None) by fixed_sum, rounded once to F."""
    return _reduce(x, dim, keepdim, False, prec)


def mean(x: torch.Tensor, dim: int | None = None, keepdim: bool = False, prec="float32") -> torch.Tensor:
    """mean over dim (all entries when None): fixed_sum / n, rounded once to F."""
    return _reduce(x, dim, keepdim, True, prec)
