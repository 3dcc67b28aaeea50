"""Row lookup T[idx] whose gradient adds repeated rows in index order (torch's order may vary)."""

from __future__ import annotations

import numpy as np
import torch

__all__ = ["embedding"]


class _Rows(torch.autograd.Function):
    """y = T[idx]; dT = sum of dy over repeated indices, added in index order in float64, rounded to T's dtype."""

    @staticmethod
    def forward(ctx, table, idx):
        ctx.save_for_backward(idx)
        ctx.shape, ctx.dtype = table.shape, table.dtype
        return table[idx]

    @staticmethod
    def backward(ctx, g):
        from .kernels import scatter_rows  # numba, imported on the first backward (0.7 s)

        (idx,) = ctx.saved_tensors
        out = np.zeros(tuple(ctx.shape), dtype=np.float64)
        scatter_rows(np.ascontiguousarray(idx.numpy(), dtype=np.int64),
                     np.ascontiguousarray(g.detach().to(torch.float64).numpy()), out)
        return torch.from_numpy(out).to(ctx.dtype), None


def embedding(table: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    """table[idx], with a gradient that sums repeated rows in index order in float64."""
    if not (torch.is_grad_enabled() and table.requires_grad):
        return table[idx]
    return _Rows.apply(table, idx)
