"""The signal-to-quantization-noise ratio of a quantized tensor, by the fixed-order sum."""

from __future__ import annotations

import math

import torch

from .summation import fixed_sum

__all__ = ["energy", "sqnr_db"]


def energy(x) -> float:
    """sum x^2 over every entry, in float64 by `fixed_sum` (the same bits on every machine)."""
    v = torch.as_tensor(x).detach().to(torch.float64).reshape(-1)
    return float(fixed_sum(v * v, -1))


def sqnr_db(x, xhat) -> float:
    """10 log10(sum x^2 / sum (x - xhat)^2) in dB; inf when xhat = x, 0 dB when xhat = 0.

    Parameters
    ----------
    x, xhat : torch.Tensor or array_like
        The tensor and its quantized (dequantized) copy, of one shape.

    Returns
    -------
    float
        The ratio in decibels, both sums in float64 by `fixed_sum`.

    Raises
    ------
    ValueError
        If the shapes differ, or x is all zeros (its SQNR is undefined).

    Examples
    --------
    >>> import torch
    >>> round(sqnr_db(torch.tensor([1.0, 2.0]), torch.tensor([1.0, 2.5])), 2)
    13.01
    """
    x, xhat = torch.as_tensor(x), torch.as_tensor(xhat)
    if x.shape != xhat.shape:
        raise ValueError(f"x and xhat must have the same shape; got {tuple(x.shape)} and "
                         f"{tuple(xhat.shape)}")
    signal = energy(x)
    if signal == 0:
        raise ValueError("x is all zeros: its SQNR is undefined")
    noise = energy(x.to(torch.float64) - xhat.to(torch.float64))
    return math.inf if noise == 0 else 10 * math.log10(signal / noise)
