"""The numba kernels: compiled twins of emulate's arithmetic, for loops too slow in torch.

Each kernel repeats, operation for operation, a float64 formula or rounding of the torch
side (`elementary`, `summation`, `rounding.round_to`, the loop of `products`), so the two
give the same bits; tests/test_emulate.py holds each pair equal. No fused multiply-adds, no
reassociation: numba keeps the written order. A format is passed as the rounding recipe's parameters (`format_params`); every rounding is
`rounding.round_to`'s recipe itself (`rounding_kernel.inline_word`).
"""

from __future__ import annotations

import math

import numba
import numpy as np

from ..formats import get_format
from ..rounding_kernel import F64, NEAREST_EVEN, inline_word, word_params
from .elementary import EXP_COEF, INV_LN2, LN2_HI, LN2_LO, LOG_COEF

__all__ = ["exp64", "format_params", "gemm", "inverse_cdf", "log64", "pairwise_sum",
           "rms_rows", "round_buffer", "round_into", "round_scalar", "scatter_rows"]

# numba freezes module-level floats and arrays into the compiled code as constants.
_SQRT_HALF = math.sqrt(0.5)
_WORD = inline_word()  # rounding's one recipe, compiled into these kernels
_EXP_C = np.array(EXP_COEF)
_LOG_C = np.array(LOG_COEF)
_POW2 = np.array([math.ldexp(1.0, k) for k in range(-600, 601)])  # 2^k, exact: elementary.pow2


def format_params(fmt) -> tuple[int, ...]:
    """The rounding parameters of fmt that the kernels take: `rounding_kernel.word_params` of
    fmt on float64 words (overflow to inf, or NaN where fmt has none, as `round_to`)."""
    return word_params(get_format(fmt), F64, False)


@numba.njit(cache=True)
def gemm(a, b, out):  # pragma: no cover - compiled
    """out[i, j] = (...((0 + a[i,0] b[0,j]) + a[i,1] b[1,j]) + ...), in a's dtype, no FMA."""
    m, k = a.shape
    n = b.shape[1]
    for i in range(m):
        for j in range(n):
            out[i, j] = 0.0
        for p in range(k):
            aip = a[i, p]
            for j in range(n):
                out[i, j] = out[i, j] + aip * b[p, j]


@numba.njit(cache=True)
def round_scalar(v, wp):  # pragma: no cover - compiled
    """round_to(v, fmt) for one float64 v, wp = format_params(fmt): rounding's own recipe."""
    r = _WORD(np.float64(v).view(np.int64), np.int64(0), wp[0], wp[1], wp[2], wp[3], wp[4],
              wp[5], wp[6], wp[7], wp[8], wp[9], wp[10], NEAREST_EVEN)
    return np.int64(r).view(np.float64)


@numba.njit(cache=True)
def round_buffer(buf, n, wp):  # pragma: no cover - compiled
    """buf[:n] = round_to(buf[:n], fmt) in place (float64), wp = format_params(fmt)."""
    for i in range(n):
        buf[i] = round_scalar(buf[i], wp)


@numba.njit(cache=True)
def pairwise_sum(buf, n):  # pragma: no cover - compiled
    """summation.fixed_sum of buf[:n] (overwrites buf, needs one spare slot): halves added pairwise."""
    while n > 1:
        if n % 2:
            buf[n] = 0.0
            n += 1
        h = n // 2
        for i in range(h):
            buf[i] = buf[i] + buf[i + h]
        n = h
    return buf[0] if n == 1 else 0.0


@numba.njit(cache=True)
def exp64(x):  # pragma: no cover - compiled
    """elementary.exp64 of one float64, the same operations in the same order."""
    if np.isnan(x):
        return x
    if x > 709.8:
        return np.inf
    if x < -745.2:
        return 0.0
    n = min(max(np.rint(x * INV_LN2), -1100.0), 1100.0)
    r = (x - n * LN2_HI) - n * LN2_LO
    p = _EXP_C[_EXP_C.shape[0] - 1]
    for k in range(_EXP_C.shape[0] - 2, -1, -1):
        p = p * r + _EXP_C[k]
    half = math.floor(n * 0.5)
    return p * _POW2[int(half) + 600] * _POW2[int(n - half) + 600]


@numba.njit(cache=True)
def log64(x):  # pragma: no cover - compiled
    """elementary.log64 of one finite float64 x > 0, the same operations in the same order."""
    m, e = math.frexp(x)
    ef = np.float64(e)
    if m < _SQRT_HALF:
        m = m * 2.0
        ef = ef - 1.0
    s = (m - 1.0) / (m + 1.0)
    s2 = s * s
    p = _LOG_C[_LOG_C.shape[0] - 1]
    for k in range(_LOG_C.shape[0] - 2, -1, -1):
        p = p * s2 + _LOG_C[k]
    return ef * LN2_HI + (ef * LN2_LO + s * p)


@numba.njit(cache=True)
def round_into(acc, out, buf, wp):  # pragma: no cover - compiled
    """out = round_to(acc) elementwise (float32 arrays of one shape, buf a float64 scratch row)."""
    n, m = acc.shape
    for i in range(n):
        for j in range(m):
            buf[j] = np.float64(acc[i, j])
        round_buffer(buf, m, wp)
        for j in range(m):
            out[i, j] = np.float32(buf[j])


@numba.njit(cache=True)
def rms_rows(x, out, buf, wp):  # pragma: no cover - compiled
    """out = fl(x / sqrt(fixed_sum(x^2) / d + 1e-6)) per row, float64 inside: emulate.rms_norm's forward."""
    n, d = x.shape
    for i in range(n):
        for k in range(d):
            buf[k] = np.float64(x[i, k]) * np.float64(x[i, k])
        r = 1.0 / math.sqrt(pairwise_sum(buf, d) / d + 1e-6)
        for k in range(d):
            buf[k] = np.float64(x[i, k]) * r
        round_buffer(buf, d, wp)
        for k in range(d):
            out[i, k] = np.float32(buf[k])


@numba.njit(cache=True)
def inverse_cdf(logp, u, out):  # pragma: no cover - compiled
    """out[i] = first v with c_v > u_i c_last, c_v = p_0 + ... + p_v added left to right, p = exp64(logp)."""
    n, v = logp.shape
    cdf = np.empty(v, np.float64)
    for i in range(n):
        c = 0.0
        for j in range(v):
            c = c + exp64(np.float64(logp[i, j]))
            cdf[j] = c
        target = u[i] * cdf[v - 1]
        k = v - 1
        for j in range(v):
            if cdf[j] > target:
                k = j
                break
        out[i] = k


@numba.njit(cache=True)
def scatter_rows(idx, g, out):  # pragma: no cover - compiled
    """out[idx[i]] += g[i] for i = 0, 1, ..., in this order (float64): embedding's backward."""
    for i in range(idx.shape[0]):
        r = idx[i]
        for j in range(g.shape[1]):
            out[r, j] = out[r, j] + g[i, j]
