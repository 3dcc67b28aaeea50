"""Sums in one fixed order: the pairwise tree every emulated reduction uses."""

from __future__ import annotations

import numpy as np
import torch

__all__ = ["fixed_sum", "sum_over", "sum_to"]

# NumPy adds float32 and float64 arrays with the same IEEE additions as torch (elementwise,
# round to nearest, subnormals kept) at a fraction of torch's per-call cost, which dominates
# the small tensors summed here: the same tree, the same bits, about 1.3-2x faster (128 to
# 512x128 float32 entries, in-process, one thread, loaded machine). The tree is this
# module's, never np.sum's own pairwise blocking. Only a NaN's sign and payload can differ,
# so a sum with a NaN is redone by torch.
_NUMPY_DTYPES = (torch.float32, torch.float64)


def _numpy_tree(a: np.ndarray) -> np.ndarray:
    """The pairwise tree of fixed_sum over a's last axis, on a NumPy array."""
    with np.errstate(over="ignore", invalid="ignore"):
        while a.shape[-1] > 1:
            n = a.shape[-1]
            if n % 2:
                a = np.concatenate([a, np.zeros((*a.shape[:-1], 1), dtype=a.dtype)], -1)
                n += 1
            a = a[..., : n // 2] + a[..., n // 2:]
    if a.shape[-1] == 0:
        a = np.zeros((*a.shape[:-1], 1), dtype=a.dtype)
    return a


def fixed_sum(x: torch.Tensor, dim: int = -1, keepdim: bool = False) -> torch.Tensor:
    """sum over `dim` by a fixed pairwise tree, x_i + x_(i + h) with h = half the padded length."""
    if not -x.dim() <= dim < x.dim():  # the same error on the NumPy and the torch path
        raise IndexError(f"dim must lie in [{-x.dim()}, {x.dim() - 1}] for x of shape "
                         f"{tuple(x.shape)}; got dim={dim}" if x.dim() else
                         f"x must have a dimension to sum over; got a 0-d tensor (dim={dim})")
    if x.dtype in _NUMPY_DTYPES and x.device.type == "cpu" and not x.requires_grad:
        tree = _numpy_tree(np.moveaxis(x.numpy(), dim, -1))
        if not np.isnan(tree).any():  # a NaN's sign and payload: torch's, from the loop below
            out = torch.from_numpy(np.moveaxis(tree, -1, dim))
            return out if keepdim else out.squeeze(dim)
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
