"""Matrix products: operands in F, products and sums in the accumulator in a fixed order, one rounding."""

from __future__ import annotations

import numpy as np
import torch

from ..plan import numpy_planned
from .precision import Precision, as_precision
from .summation import fixed_sum

__all__ = ["GEMM_COMPILED_MIN", "linear", "matmul", "sequential_gemm"]

# From this many products (m k n) on, a product runs the compiled loop (kernels.gemm); below
# it NumPy's, the same bits without the loop's cold compile (about half a second per dtype)
# and without importing numba at all (kernels is imported on the first compiled product).
GEMM_COMPILED_MIN = 1 << 15


def sequential_gemm(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """kernels.gemm(a, b, out)'s result with NumPy: (m, k) @ (k, n) in a's dtype, k in order.

    Each product a[i, p] b[p, j] is rounded once to the dtype and each sum once (no fused
    multiply-add), from 0 as the loop adds. With 256 or more outputs, the loop's own
    operations a whole block of outputs at a time: acc = 0, then acc = acc + a[:, p] b[p, :]
    for each p (k NumPy calls, about 2 ns a product; memory 2 m n values). With fewer, where
    k calls would cost more than the arithmetic, all m k n products at once (memory m k n
    values) and np.add.accumulate along k; a sum that starts at the first product rather than
    at 0 differs from the loop's only when that product is -0 (0 + -0 is +0), which the final
    + 0.0 gives as the loop does (x + 0.0 is x for every other x).
    The same bits as the loop, except a NaN's sign and payload where two NaNs meet: x86's
    addition returns its first operand's NaN, NumPy's add keeps the running sum's, and the
    compiled loop's operand order is LLVM's (the tests compare NaN with NaN).
    """
    m, k = a.shape
    n = b.shape[1]
    with np.errstate(all="ignore"):  # overflow to inf and inf - inf = NaN, as the loop
        if m * n < 256:
            if k == 0:
                return np.zeros((m, n), dtype=a.dtype)
            prods = a[:, :, None] * b[None, :, :]
            return np.add.accumulate(prods, axis=1)[:, -1, :] + a.dtype.type(0.0)
        acc = np.zeros((m, n), dtype=a.dtype)
        prod = np.empty_like(acc)
        for p in range(k):
            np.multiply(a[:, p, None], b[p], out=prod)
            np.add(acc, prod, out=acc)
    return acc


def _gemm(a: torch.Tensor, b: torch.Tensor, prec: Precision) -> torch.Tensor:
    """a @ b in the accumulator, sequential over k; result in the accumulator's dtype."""
    dt = np.float64 if prec.accumulate == "float64" else np.float32
    an = np.ascontiguousarray(a.detach().cpu().numpy(), dtype=dt)
    bn = np.ascontiguousarray(b.detach().cpu().numpy(), dtype=dt)
    small = an.shape[0] * an.shape[1] * bn.shape[1] < GEMM_COMPILED_MIN  # k = 0 among them
    if small or numpy_planned():
        return torch.from_numpy(sequential_gemm(an, bn))
    from .kernels import gemm  # numba: imported here, by the first product that needs it

    out = np.empty((an.shape[0], bn.shape[1]), dtype=dt)
    gemm(an, bn, out)  # sets each output to 0 before its sum
    return torch.from_numpy(out)


class _MatMul(torch.autograd.Function):
    """C = fl_F(fl_F(A) fl_F(B)); dA = fl_F(fl_F(dC) B^T), dB = fl_F(A^T fl_F(dC))."""

    @staticmethod
    def forward(ctx, a, b, prec):
        ar, br = prec.round(a), prec.round(b)
        ctx.save_for_backward(ar, br)
        ctx.prec = prec
        return prec.round(_gemm(ar, br, prec))

    @staticmethod
    def backward(ctx, g):
        ar, br = ctx.saved_tensors
        prec = ctx.prec
        g = prec.round(g)
        ga = prec.round(_gemm(g, br.T, prec)) if ctx.needs_input_grad[0] else None
        gb = prec.round(_gemm(ar.T, g, prec)) if ctx.needs_input_grad[1] else None
        return ga, gb, None


class _Linear(torch.autograd.Function):
    """y = fl_F(acc(fl_F(x) fl_F(W)^T) + b): the bias joins the accumulator before the one rounding."""

    @staticmethod
    def forward(ctx, x, w, b, prec):
        xr, wr = prec.round(x), prec.round(w)
        acc = _gemm(xr, wr.T, prec)
        if b is not None:
            acc = acc + prec.round(b).to(acc.dtype)
        ctx.save_for_backward(xr, wr)
        ctx.prec, ctx.has_bias = prec, b is not None
        return prec.round(acc)

    @staticmethod
    def backward(ctx, g):
        xr, wr = ctx.saved_tensors
        prec = ctx.prec
        g = prec.round(g)
        gx = prec.round(_gemm(g, wr, prec)) if ctx.needs_input_grad[0] else None
        gw = prec.round(_gemm(g.T, xr, prec)) if ctx.needs_input_grad[1] else None
        gb = None
        if ctx.has_bias and ctx.needs_input_grad[2]:
            gb = prec.round(fixed_sum(g.to(torch.float64), 0))
        return gx, gw, gb, None


def matmul(a: torch.Tensor, b: torch.Tensor, prec="float32") -> torch.Tensor:
    """A @ B for A (M, K), B (K, N): operands and result in F, sequential accumulation over k."""
    prec = as_precision(prec)
    if a.dim() != 2 or b.dim() != 2 or a.shape[1] != b.shape[0]:
        raise ValueError(f"matmul needs (M, K) @ (K, N); got shapes {tuple(a.shape)} and {tuple(b.shape)}")
    if prec.native:
        return (a.to(prec.dtype) @ b.to(prec.dtype)).to(prec.container)
    return _MatMul.apply(a, b, prec)


def linear(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None = None,
           prec="float32") -> torch.Tensor:
    """x W^T + b for x (..., K), W (N, K), b (N,): accumulated in the accumulator, rounded once to F."""
    prec = as_precision(prec)
    if x.shape[-1] != w.shape[-1] or w.dim() != 2:
        raise ValueError(f"linear needs x (..., K) and W (N, K); got {tuple(x.shape)} and {tuple(w.shape)}")
    if prec.native:
        dt = prec.dtype
        return torch.nn.functional.linear(x.to(dt), w.to(dt), None if b is None else b.to(dt)).to(
            prec.container)
    lead = x.shape[:-1]
    y = _Linear.apply(x.reshape(-1, x.shape[-1]), w, b, prec)
    return y.reshape(*lead, w.shape[0])
