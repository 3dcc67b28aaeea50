"""Sums in one fixed order: the pairwise tree every emulated reduction uses."""

from __future__ import annotations

import torch

__all__ = ["fixed_sum", "sum_over", "sum_to"]


def fixed_sum(x: torch.Tensor, dim: int = -1, keepdim: bool = False) -> torch.Tensor:
    """sum over `dim` by a fixed pairwise tree, x_i + x_(i + h) with h = half the padded length."""
    x = x.movedim(dim, -1)
    while x.shape[-1] > 1:
        n = x.shape[-1]
        if n % 2:
            x = torch.nn.functional.pad(x, (0, 1))
            n += 1
        x = x[..., : n // 2] + x[..., n // 2:]
    if x.shape[-1] == 0:
        x = x.new_zeros((*x.shape[:-1], 1))
    x = x.movedim(-1, dim)
    return x if keepdim else x.squeeze(dim)


def sum_to(g: torch.Tensor, shape: torch.Size) -> torch.Tensor:
    """A broadcast gradient reduced back to `shape` with fixed_sum (undoes broadcasting)."""
    while g.dim() > len(shape):
        g = fixed_sum(g, 0)
    for d, n in enumerate(shape):
        if n == 1 and g.shape[d] != 1:
            g = fixed_sum(g, d, keepdim=True)
    return g


def sum_over(x: torch.Tensor, dims) -> torch.Tensor:
    """fixed_sum over several dimensions, last first."""
    for d in sorted(dims, reverse=True):
        x = fixed_sum(x, d)
    return x
