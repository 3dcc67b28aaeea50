"""Portable statistics: float64 with fixed-order sums (emulate.fixed_sum), the same digits everywhere.

fmean, fstd, fcorr, fdot, fnorm, fcos return Python floats; fexp and fsum are tensor ops with
autograd in the tensor's own precision (fp32, or float64 for the tests' oracles).
"""

from __future__ import annotations

import math

import torch

from .. import emulate as E

__all__ = ["fcorr", "fcos", "fdot", "fexp", "fmean", "fnorm", "fstd", "fsum"]

_FP32 = E.Precision("float32")
_FP64 = E.Precision("float64", "float64")


def _flat64(x) -> torch.Tensor:
    """x as a detached 1-D float64 tensor."""
    return torch.as_tensor(x).detach().reshape(-1).to(torch.float64)


def fmean(x) -> float:
    """mean of every entry, in float64 with a fixed pairwise sum (nan for no entries)."""
    x = _flat64(x)
    return float(E.fixed_sum(x, 0)) / x.numel() if x.numel() else float("nan")


def fstd(x) -> float:
    """sample standard deviation sqrt(sum (x - mean)^2 / (n - 1)), float64 with fixed pairwise sums."""
    x = _flat64(x)
    if x.numel() < 2:
        return 0.0
    d = x - float(E.fixed_sum(x, 0)) / x.numel()
    return math.sqrt(float(E.fixed_sum(d * d, 0)) / (x.numel() - 1))


def fcorr(x, y) -> float:
    """Pearson r = sum dx dy / sqrt(sum dx^2 sum dy^2), d = deviation from the mean; float64, fixed sums (nan if either is constant)."""
    x, y = _flat64(x), _flat64(y)
    if x.numel() != y.numel() or x.numel() < 2:
        raise ValueError(f"x and y must hold the same number (>= 2) of values; got {x.numel()} "
                         f"and {y.numel()}")
    dx = x - float(E.fixed_sum(x, 0)) / x.numel()
    dy = y - float(E.fixed_sum(y, 0)) / y.numel()
    den = math.sqrt(float(E.fixed_sum(dx * dx, 0)) * float(E.fixed_sum(dy * dy, 0)))
    return float(E.fixed_sum(dx * dy, 0)) / den if den > 0 else float("nan")


def fdot(a: torch.Tensor, b: torch.Tensor) -> float:
    """sum a_i b_i in float64 with a fixed pairwise sum."""
    return float(E.fixed_sum(a.to(torch.float64) * b.to(torch.float64), 0))


def fnorm(a: torch.Tensor) -> float:
    """|a| = sqrt(sum a_i^2), float64 with a fixed pairwise sum."""
    return math.sqrt(fdot(a, a))


def fcos(a: torch.Tensor, b: torch.Tensor) -> float:
    """cos(a, b) = a.b / (|a| |b|) (nan if either is 0)."""
    den = fnorm(a) * fnorm(b)
    return fdot(a, b) / den if den > 0 else float("nan")


def _prec_of(x: torch.Tensor) -> E.Precision:
    """float64 arithmetic for float64 tensors, fp32 otherwise."""
    return _FP64 if x.dtype == torch.float64 else _FP32


def fexp(x: torch.Tensor) -> torch.Tensor:
    """fl(e^x) in x's precision (fp32 or float64) by emulate.exp: portable, with autograd."""
    return E.exp(x, _prec_of(x))


def fsum(x: torch.Tensor) -> torch.Tensor:
    """sum of every entry by emulate.sum (fixed pairwise order), in x's precision, with autograd."""
    return E.sum(x, None, prec=_prec_of(x))
