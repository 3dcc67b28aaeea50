"""Compiled (numba) twins of `bound_ops`' elementwise chains: one pass over the arrays where the
NumPy path makes a dozen calls, each giving the NumPy path's float64 values bit for bit (the same
IEEE operations in the same order, no fast-math; tests/test_diagnose_fused.py checks them on edge
and random values). Kernels take C-contiguous 1-D float64 arrays and compile on first use, one
signature each, into numba's on-disk cache (cache=True)."""

from __future__ import annotations

import math

import numba
import numpy as np

_INF = np.inf


@numba.njit(error_model="numpy")
def _nudge(out, sign):
    """out[i] <- nextafter(out[i], sign inf) in place, infinities and NaN kept (as `_step`)."""
    # +-0 goes to +-5e-324, a finite value one step of its sign-magnitude pattern; a pass of
    # its own (a loop that only nudges vectorises)
    bits = out.view(np.int64)
    tiny = 1 if sign > 0 else -9223372036854775807  # the patterns of 5e-324 and -5e-324
    for i in range(out.size):
        x = out[i]
        b = bits[i]
        if x == 0:
            b = tiny
        elif x - x == 0:  # finite
            b += 1 if (x > 0) == (sign > 0) else -1
        bits[i] = b


@numba.njit(cache=True, error_model="numpy")
def step(a, sign, out):
    """out = `_step`(a, sign) elementwise."""
    for i in range(a.size):
        out[i] = a[i]
    _nudge(out, sign)


@numba.njit(error_model="numpy")
def _widen_end(a, ulps, eps, q, sign, out):
    """out = step(a + sign up(ulps max(up(eps |a|), q)), sign), infinite a kept."""
    for i in range(a.size):
        out[i] = eps * abs(a[i])
    _nudge(out, 1.0)
    for i in range(a.size):
        e = out[i]
        out[i] = ulps * (e if (e > q or e != e) else q)
    _nudge(out, 1.0)
    for i in range(a.size):
        out[i] = a[i] + sign * out[i]
    _nudge(out, sign)
    for i in range(a.size):
        if a[i] - a[i] != 0 and a[i] == a[i]:
            out[i] = a[i]


@numba.njit(cache=True, error_model="numpy")
def widen_rel(lo, hi, ulps, eps, q, nmin, out_lo, out_hi):
    """`_widen_rel` then, for nmin > 0, `_ftz` (ends in (0, nmin) to 0); whether all lo <= hi."""
    _widen_end(lo, ulps, eps, q, -1.0, out_lo)
    _widen_end(hi, ulps, eps, q, 1.0, out_hi)
    bad = 0
    for i in range(lo.size):
        x, y = out_lo[i], out_hi[i]
        if nmin > 0:
            if x > 0 and x < nmin:
                out_lo[i] = x = 0.0
            if y < 0 and y > -nmin:
                out_hi[i] = y = 0.0
        bad += not x <= y
    return bad == 0


@numba.njit(cache=True, error_model="numpy")
def close_tail(pm, pr, s, ncol, bias, bmid, brad, blo, bhi, c1, c2, c3, uf, qf, grow_f,
               limit_f, grow_acc, limit_acc, out_lo, out_hi):
    """`_close_numpy`'s pm -+ rad outward, then infinite bias entries, then overflow, per entry."""
    # pm, pr, s: (rows, ncol) flattened; a bias has one entry per column
    flag = np.zeros(pm.size, np.uint8)  # 1: the bias entry is infinite, 2: may overflow
    for r in range(pm.size // ncol):
        for j in range(ncol):
            i = r * ncol + j
            p, rr, t = pm[i], pr[i], s[i]
            extra = 0.0
            over = False
            if bias:
                if uf > 0:
                    extra = 1.01 * uf * t + qf
                    over = t * grow_f >= limit_f
                p, rr, t = p + bmid[j], rr + brad[j], t + abs(bmid[j]) + brad[j]
            rad = (rr + c1 * t + extra) * c2 + c3
            out_lo[i], out_hi[i] = p - rad, p + rad
            if over or t * grow_acc >= limit_acc:
                flag[i] = 2
            elif bias and blo[j] == bhi[j] and blo[j] - blo[j] != 0:  # an infinite entry
                flag[i] = 1
    _nudge(out_lo, -1.0)
    _nudge(out_hi, 1.0)
    for i in range(pm.size):
        if flag[i] == 2:
            out_lo[i], out_hi[i] = -_INF, _INF
        elif flag[i] == 1:
            out_lo[i], out_hi[i] = blo[i % ncol], bhi[i % ncol]


@numba.njit(cache=True, error_model="numpy")
def leaf_box(v, emin, mbits, half0, out_lo, out_hi):
    """v -+ 2^(max(e - 1, emin) - mbits - 1) for v = m 2^e, m in [1/2, 1) (0: half0), as `leaf`."""
    for i in range(v.size):
        x = v[i]
        if x - x != 0:
            out_lo[i] = out_hi[i] = x
            continue
        half = half0
        if x != 0:
            e = math.frexp(abs(x))[1]
            half = math.ldexp(1.0, max(e - 1, emin) - mbits - 1)
        out_lo[i], out_hi[i] = x - half, x + half


@numba.njit(cache=True, error_model="numpy")
def inside_worst(lo, hi, ref, tgt):
    """`check_inside`'s (flat index, margin, width); (-1, 0, 0) if a value is outside or NaN."""
    for i in range(lo.size):
        a, b = ref[i], tgt[i]
        m = a if a < b else b
        x = a if a > b else b
        if a != a or b != b or not (m >= lo[i] and x <= hi[i]):
            return -1, 0.0, 0.0
    best = 0
    best_s = _INF
    for i in range(lo.size):
        d1, d2 = ref[i] - lo[i], hi[i] - ref[i]
        m = d1 if d1 < d2 else d2
        if d1 != d1 or d2 != d2:
            m = np.nan
        sc = m / ((hi[i] - lo[i]) / 2)
        if not sc < _INF:  # fmin(NaN, inf) = inf
            sc = _INF
        if sc < best_s or i == 0:
            best, best_s = i, sc
    d1, d2 = ref[best] - lo[best], hi[best] - ref[best]
    m = d1 if d1 < d2 else d2
    if d1 != d1 or d2 != d2:
        m = np.nan
    return best, m, hi[best] - lo[best]


def flat(a: np.ndarray) -> np.ndarray:
    """a's values as a writable C-contiguous 1-D float64 array (a view where a is one)."""
    if type(a) is np.ndarray and a.dtype == np.float64 and a.flags.c_contiguous and \
            a.flags.writeable:
        return a.reshape(-1)
    f = np.ascontiguousarray(np.asarray(a, dtype=np.float64).reshape(-1))
    return f if f.flags.writeable else f.copy()
