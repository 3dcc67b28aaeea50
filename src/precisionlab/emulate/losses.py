"""The mean squared error loss: float64 inside, one rounding to F."""

from __future__ import annotations

import torch

from .precision import as_precision
from .summation import fixed_sum

__all__ = ["mse_loss"]


class _MSE(torch.autograd.Function):
    """L = fl_F(sum (x - t)^2 / n); dL/dx = fl_F(2 (x - t) dL / n)."""

    @staticmethod
    def forward(ctx, x, t, prec):
        diff = prec.round(x).to(torch.float64) - prec.round(t).to(torch.float64)
        ctx.save_for_backward(diff)
        ctx.prec = prec
        return prec.round(fixed_sum((diff * diff).reshape(-1), 0) / diff.numel())

    @staticmethod
    def backward(ctx, g):
        (diff,) = ctx.saved_tensors
        prec = ctx.prec
        gx = prec.round(2.0 * diff * (prec.round(g).to(torch.float64) / diff.numel()))
        return gx, None if not ctx.needs_input_grad[1] else -gx, None


def mse_loss(x: torch.Tensor, t: torch.Tensor, prec="float32") -> torch.Tensor:
    """mean((x - t)^2) over every entry, evaluated in float64 and rounded once to F."""
    prec = as_precision(prec)
    if x.shape != t.shape:
        raise ValueError(f"mse_loss needs equal shapes; got {tuple(x.shape)} and {tuple(t.shape)}")
    if prec.native:
        dt = prec.dtype
        return torch.nn.functional.mse_loss(x.to(dt), t.to(dt)).to(prec.container)
    return _MSE.apply(x, t, prec)
