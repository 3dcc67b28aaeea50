"""Casts and elementwise functions (exp, log, tanh, sigmoid, gelu, silu): f in float64, one rounding to F."""

from __future__ import annotations

import math

import torch

from .elementary import exp64, log64, sigmoid64, tanh64
from .precision import as_precision

__all__ = ["cast", "exp", "gelu", "log", "sigmoid", "silu", "tanh"]


class _Cast(torch.autograd.Function):
    """y = fl_F(x); dy/dx passes through unchanged (straight-through, like autocast's casts)."""

    @staticmethod
    def forward(ctx, x, prec):
        return prec.round(x)

    @staticmethod
    def backward(ctx, g):
        return g, None


def cast(x: torch.Tensor, prec) -> torch.Tensor:
    """fl_F(x) with a straight-through gradient."""
    prec = as_precision(prec)
    if prec.native:
        return x.to(prec.dtype).to(prec.container)
    return _Cast.apply(x, prec)


def _gelu_parts(x):
    """gelu(x) = x/2 (1 + tanh(c (x + 0.044715 x^3))), c = sqrt(2/pi), and its derivative, in float64."""
    c = math.sqrt(2.0 / math.pi)
    t = tanh64(c * (x + 0.044715 * x * x * x))
    y = 0.5 * x * (1.0 + t)
    dy = 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * c * (1.0 + 3 * 0.044715 * x * x)
    return y, dy


def _silu_parts(x):
    """silu(x) = x sigmoid(x) and its derivative s (1 + x (1 - s)), in float64."""
    s = sigmoid64(x)
    return x * s, s * (1.0 + x * (1.0 - s))


def _exp_parts(x):
    """e^x and its derivative e^x."""
    y = exp64(x)
    return y, y


def _log_parts(x):
    """ln x and its derivative 1/x."""
    return log64(x), 1.0 / x


def _tanh_parts(x):
    """tanh x and its derivative 1 - tanh^2 x."""
    t = tanh64(x)
    return t, 1.0 - t * t


def _sigmoid_parts(x):
    """s = sigmoid(x) and its derivative s (1 - s)."""
    s = sigmoid64(x)
    return s, s * (1.0 - s)


_UNARY = {"exp": _exp_parts, "log": _log_parts, "tanh": _tanh_parts, "sigmoid": _sigmoid_parts,
          "gelu": _gelu_parts, "silu": _silu_parts}
_NATIVE_UNARY = {"exp": torch.exp, "log": torch.log, "tanh": torch.tanh, "sigmoid": torch.sigmoid,
                 "gelu": lambda x: torch.nn.functional.gelu(x, approximate="tanh"),
                 "silu": torch.nn.functional.silu}


class _Unary(torch.autograd.Function):
    """y = fl_F(f(x)), dx = fl_F(fl_F(dy) f'(x)), f and f' evaluated in float64."""

    @staticmethod
    def forward(ctx, x, name, prec):
        xr = prec.round(x)
        y, _ = _UNARY[name](xr.to(torch.float64))
        ctx.save_for_backward(xr)
        ctx.name, ctx.prec = name, prec
        return prec.round(y)

    @staticmethod
    def backward(ctx, g):
        (xr,) = ctx.saved_tensors
        prec = ctx.prec
        _, dy = _UNARY[ctx.name](xr.to(torch.float64))
        return prec.round(prec.round(g).to(torch.float64) * dy), None, None


def _unary(name: str, x: torch.Tensor, prec) -> torch.Tensor:
    """fl_F(f(x)) for f = _UNARY[name], or torch's own f in F's dtype for backend='native'."""
    prec = as_precision(prec)
    if prec.native:
        return _NATIVE_UNARY[name](x.to(prec.dtype)).to(prec.container)
    return _Unary.apply(x, name, prec)


def exp(x: torch.Tensor, prec="float32") -> torch.Tensor:
    """fl_F(e^x), e^x from exp64."""
    return _unary("exp", x, prec)


def log(x: torch.Tensor, prec="float32") -> torch.Tensor:
    """fl_F(ln x), ln x from log64."""
    return _unary("log", x, prec)


def tanh(x: torch.Tensor, prec="float32") -> torch.Tensor:
    """fl_F(tanh x)."""
    return _unary("tanh", x, prec)


def sigmoid(x: torch.Tensor, prec="float32") -> torch.Tensor:
    """fl_F(1 / (1 + e^-x))."""
    return _unary("sigmoid", x, prec)


def gelu(x: torch.Tensor, prec="float32") -> torch.Tensor:
    """fl_F(x/2 (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))), the tanh form of GELU."""
    return _unary("gelu", x, prec)


def silu(x: torch.Tensor, prec="float32") -> torch.Tensor:
    """fl_F(x sigmoid(x))."""
    return _unary("silu", x, prec)
