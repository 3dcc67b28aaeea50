"""log pi(a | row) of one chosen entry per row, with autograd: emulate.log_softmax then a gather, compiled.

A trainer scores only the sampled token of each row, but emulate.log_softmax followed by
`gather` evaluates exp64 on every entry of the (N, V) logits twice (forward and backward)
through torch's elementwise ops: with a 2048-entry vocabulary that dominates a training step.
`gathered_log_softmax` computes the same numbers with the compiled twins in emulate.kernels:
the forward is emulate.log_softmax's (float64, the row maximum subtracted, exp64, the pairwise
sum, log64, one rounding to fp32) at the chosen entry; the backward is its backward,
dz_v = fl32(g_v - e^(y_v) sum_u g_u), for an upstream gradient that is zero off the chosen
entry (what `gather` passes back). tests/test_rl_stall.py holds both equal to the torch path
bit for bit.
"""

from __future__ import annotations

import numba
import numpy as np
import torch

from ..emulate import kernels as K

__all__ = ["gathered_log_softmax"]


@numba.njit(cache=True)
def _forward(z, index, out, zmax, lse):  # pragma: no cover - compiled
    """out_i = fl32((z_i,a_i - max_i) - lse_i); keeps max_i and lse_i for the backward.

    lse_i = log64(fixed_sum(exp64(z_i - max_i))), float64 (inline: one kernel less to compile).
    """
    v = z.shape[1]
    buf = np.empty(v + 2, np.float64)
    for i in range(z.shape[0]):
        zm = -np.inf
        for j in range(v):
            zm = max(zm, np.float64(z[i, j]))
        for j in range(v):
            buf[j] = K.exp64(np.float64(z[i, j]) - zm)
        zmax[i], lse[i] = zm, K.log64(K.pairwise_sum(buf, v))
        out[i] = np.float32((np.float64(z[i, index[i]]) - zmax[i]) - lse[i])


@numba.njit(cache=True)
def _backward(z, index, g, zmax, lse, out):  # pragma: no cover - compiled
    """out_iv = fl32(G_iv - exp64(y_iv) s_i), G = s_i = g_i + 0 on the chosen entry (gather's scatter-add) and +0 elsewhere."""
    for i in range(z.shape[0]):
        gi = np.float64(g[i])
        s = gi + 0.0  # gather's backward adds g_i to a +0; the pairwise sum adds +0s
        for j in range(z.shape[1]):
            y = (np.float64(z[i, j]) - zmax[i]) - lse[i]
            gj = s if j == index[i] else 0.0
            out[i, j] = np.float32(gj - K.exp64(y) * s)


class _Gathered(torch.autograd.Function):
    """y_i = log softmax(z_i)[a_i] in fp32; dz_iv = fl32(g_i ([v = a_i] - e^(y_iv)))."""

    @staticmethod
    def forward(ctx, z, index):
        zn = np.ascontiguousarray(z.detach().numpy(), dtype=np.float32)
        idx = np.ascontiguousarray(index.numpy(), dtype=np.int64)
        n = zn.shape[0]
        out, zmax, lse = np.empty(n, np.float32), np.empty(n), np.empty(n)
        if n:
            _forward(zn, idx, out, zmax, lse)
        ctx.saved = (zn, idx, zmax, lse)
        return torch.from_numpy(out)

    @staticmethod
    def backward(ctx, g):
        zn, idx, zmax, lse = ctx.saved
        out = np.empty(zn.shape, np.float32)
        if zn.shape[0]:
            _backward(zn, idx, np.ascontiguousarray(g.numpy(), dtype=np.float32), zmax, lse,
                      out)
        return torch.from_numpy(out), None


def gathered_log_softmax(z: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """y_i = log softmax(z_i)[index_i] (N,) in fp32 from fp32 logits z (N, V), with autograd."""
    if z.ndim != 2 or z.dtype != torch.float32:
        raise ValueError(f"z must be a 2-D float32 tensor of logits; got shape "
                         f"{tuple(z.shape)}, dtype {z.dtype}")
    if index.shape != z.shape[:1] or index.dtype not in (torch.int64, torch.int32):
        raise ValueError(f"index must be an integer tensor of shape {tuple(z.shape[:1])}; got "
                         f"shape {tuple(index.shape)}, dtype {index.dtype}")
    if index.numel() and not (0 <= int(index.min()) and int(index.max()) < z.shape[1]):
        raise ValueError(f"index must lie in [0, {z.shape[1] - 1}]; got values in "
                         f"[{int(index.min())}, {int(index.max())}]")
    return _Gathered.apply(z, index)
