"""Compiled (numba) twins of the elementwise chains of `arith` and `rules`: one pass over the
arrays where the NumPy path makes a dozen calls, each giving the NumPy path's float64 values
bit for bit (the same IEEE operations in the same order, no fast-math;
tests/test_diagnose_fused.py checks them on edge and random values), and the primitives
`kernels` builds whole rules from: steps on one number (one float64 step toward an infinity,
widening by ulps, directed rounding into a format by `rounding.round_to`'s own recipe), passes
over arrays (outward rounding), NumPy's pairwise sum.
Loops call the one-number steps with the format's branch taken outside them, so that they
vectorise and each kernel compiles small. Kernels take C-contiguous 1-D arrays and compile on
first use, one signature each, into numba's on-disk cache (cache=True)."""

from __future__ import annotations

import numba
import numpy as np

from ...rounding_kernel import DOWN, UP, inline_word

_INF = np.inf


@numba.njit(error_model="numpy")
def nxt(x, sign):
    """nextafter(x, sign inf) of one float64, infinities and NaN kept (as `arith.down` and
    `arith.up`): +-0 to +-5e-324, a finite value one step of its sign-magnitude pattern."""
    b = np.float64(x).view(np.int64)
    tiny = np.int64(1) if sign > 0 else np.int64(-9223372036854775807)
    moved = tiny if x == 0 else b + (np.int64(1) if (x > 0) == (sign > 0) else np.int64(-1))
    r = np.int64(moved if x - x == 0 else b)
    return r.view(np.float64)


@numba.njit(cache=True, error_model="numpy")
def step(a, sign, out):
    """out = nextafter(a, sign inf) elementwise (`arith.down`, `arith.up`)."""
    for i in range(a.size):
        out[i] = nxt(a[i], sign)


@numba.njit(error_model="numpy")
def widen1(a, sign, ulps, eps, q):
    """step(a + sign up(ulps max(up(eps |a|), q)), sign) of one value, an infinite a kept."""
    e = nxt(eps * abs(a), 1.0)
    e = nxt(ulps * (e if (e > q or e != e) else q), 1.0)
    y = nxt(a + sign * e, sign)
    return a if (a - a != 0 and a == a) else y


@numba.njit(cache=True, error_model="numpy")
def widen_rel(lo, hi, ulps, eps, q, nmin, out_lo, out_hi):
    """`arith.widen_rel` then, for nmin > 0, the flush that `arith.finish` takes (ends in
    (0, nmin) to 0); whether all lo <= hi."""
    bad = 0
    for i in range(lo.size):
        x, y = widen1(lo[i], -1.0, ulps, eps, q), widen1(hi[i], 1.0, ulps, eps, q)
        if nmin > 0:
            x = 0.0 if (x > 0 and x < nmin) else x
            y = 0.0 if (y < 0 and y > -nmin) else y
        out_lo[i], out_hi[i] = x, y
        bad += not x <= y
    return bad == 0


@numba.njit(cache=True, error_model="numpy")
def close_tail(pm, pr, s, ncol, bias, blo, bhi, g64, c1, c2, c3, uf, qf, grow_f, limit_f,
               grow_acc, limit_acc, out_lo, out_hi):
    """`products.close_products`' pm -+ rad outward (its NumPy path), then infinite bias entries,
    then overflow, per entry."""
    close(pm, pr, s, ncol, bias, blo, bhi, g64, c1, c2, c3, uf, qf, grow_f, limit_f,
          grow_acc, limit_acc, out_lo, out_hi)


@numba.njit(error_model="numpy")
def close(pm, pr, s, ncol, bias, blo, bhi, g64, c1, c2, c3, uf, qf, grow_f, limit_f,
          grow_acc, limit_acc, out_lo, out_hi):
    """`close_tail`'s body (shared with `mm_close`); the bias [blo, bhi] (one entry per column)
    in midpoint-radius form as `products.midrad`, an infinite point entry as 0 +- 0."""
    bmid, brad = np.zeros(ncol), np.zeros(ncol)
    if bias:
        for j in range(ncol):
            lo, hi = blo[j], bhi[j]
            if lo == hi and lo - lo != 0:
                continue
            m = lo / 2 + hi / 2
            d1, d2 = hi - m, m - lo
            bmid[j] = m
            brad[j] = np.nan if (d1 != d1 or d2 != d2) else (d1 if d1 > d2 else d2) * (1 + 4 * g64)
    for r in range(pm.size // ncol):  # pm, pr, s: (rows, ncol) flattened
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
            lo, hi = nxt(p - rad, -1.0), nxt(p + rad, 1.0)
            if over or t * grow_acc >= limit_acc:  # may overflow
                lo, hi = -_INF, _INF
            elif bias and blo[j] == bhi[j] and blo[j] - blo[j] != 0:  # an infinite entry
                lo, hi = blo[j], bhi[j]
            out_lo[i], out_hi[i] = lo, hi


_WORD = inline_word()  # rounding's one recipe, compiled into these kernels
_EXP = np.int64(0x7FF0000000000000)  # float64's exponent mask: the bits of +inf
_NAN = np.int64(0x7FF8000000000000)  # the quiet NaN
_SIGN = np.int64(-9223372036854775808)


@numba.njit(error_model="numpy")
def directed(x, mode, mbits, emin, top, q):
    """x rounded down (mode `DOWN`) or up (`UP`) into the IEEE format of mbits fraction bits,
    smallest normal exponent emin, largest finite top and smallest subnormal q, by
    `rounding.round_to`'s own recipe (`rounding_kernel.inline_word` on float64 words): past
    the range +-top or +-inf as IEEE directed rounding gives, infinities, zeros and NaN kept."""
    r = _WORD(np.float64(x).view(np.int64), np.int64(0), np.int64(52), np.int64(52 - mbits),
              np.int64(emin + 1023), np.float64(q).view(np.int64),
              np.float64(q / 2).view(np.int64), np.float64(top).view(np.int64), _EXP, _EXP,
              _NAN, _EXP, _SIGN, mode)
    return np.int64(r).view(np.float64)


@numba.njit(error_model="numpy")
def outward(lo, hi, mbits, emin, top, q):
    """lo rounded down and hi up in place into the format (`directed`; mbits < 0: float64,
    kept); whether every lo <= hi."""
    bad = 0
    if mbits < 0:
        for i in range(lo.size):
            bad += not lo[i] <= hi[i]
    else:
        for i in range(lo.size):
            a, b = directed(lo[i], DOWN, mbits, emin, top, q), directed(hi[i], UP, mbits, emin,
                                                                         top, q)
            lo[i], hi[i] = a, b
            bad += not a <= b
    return bad == 0


@numba.njit(cache=True, error_model="numpy")
def round_out(lo, hi, mbits, emin, top, q, out_lo, out_hi):
    """[RD(lo), RU(hi)] elementwise into the format (`outward`), as `intervals.outward.round_out`;
    whether every out_lo <= out_hi."""
    for i in range(lo.size):
        out_lo[i], out_hi[i] = lo[i], hi[i]
    return outward(out_lo, out_hi, mbits, emin, top, q)


@numba.njit(cache=True, error_model="numpy")
def add_out(alo, ahi, blo, bhi, minus, mbits, emin, top, q, out_lo, out_hi):
    """The sum of finite ends of `rules` (`_add_finite`: a + b, or a - b when minus) then rounded
    outward into the format (mbits < 0: float64, not rounded): 1 when every lo <= hi, 0 when
    not, -1 (nothing usable written) when an end is not finite."""
    for i in range(alo.size):
        x, y = (-bhi[i], -blo[i]) if minus else (blo[i], bhi[i])
        if alo[i] - alo[i] != 0 or ahi[i] - ahi[i] != 0 or x - x != 0 or y - y != 0:
            return -1
        a, b = nxt(alo[i] + x, -1.0), nxt(ahi[i] + y, 1.0)
        # a sum of finite ends that overflowed: +-max64, not +-inf
        out_lo[i] = 1.7976931348623157e308 if a == _INF else a
        out_hi[i] = -1.7976931348623157e308 if b == -_INF else b
    return int(outward(out_lo, out_hi, mbits, emin, top, q))


@numba.njit(error_model="numpy")
def rowsum(a, s, n):
    """sum(a[s:s + n]) in NumPy's pairwise order up to 128 terms (8 accumulators, then the rest
    in turn); longer rows as consecutive blocks of 128 added in turn (any order is within the
    gamma_n bounds the rules charge)."""
    t = 0.0
    for c in range(s, s + n, 128):
        m = min(128, s + n - c)
        if m < 8:
            res = 0.0
            for i in range(c, c + m):
                res += a[i]
        else:
            r0, r1, r2, r3 = a[c], a[c + 1], a[c + 2], a[c + 3]
            r4, r5, r6, r7 = a[c + 4], a[c + 5], a[c + 6], a[c + 7]
            i = c + 8
            while i < c + m - m % 8:
                r0, r1, r2, r3 = r0 + a[i], r1 + a[i + 1], r2 + a[i + 2], r3 + a[i + 3]
                r4, r5, r6, r7 = r4 + a[i + 4], r5 + a[i + 5], r6 + a[i + 6], r7 + a[i + 7]
                i += 8
            res = ((r0 + r1) + (r2 + r3)) + ((r4 + r5) + (r6 + r7))
            while i < c + m:
                res += a[i]
                i += 1
        t += res
    return t


@numba.njit(cache=True, error_model="numpy")
def leaf_box(v, emin, mbits, half0, join, out_lo, out_hi):
    """v -+ 2^(max(e - 1, emin) - mbits - 1) for v = m 2^e, m in [1/2, 1) (0: half0), as `leaf`
    (mbits < 0: v itself); join: the hull with [out_lo, out_hi] (NaN propagates). e - 1 is
    the float64 pattern's exponent (below emin for float64's subnormals), the power of two
    built from its pattern."""
    n = v.size
    halves = np.empty(n, np.int64)
    bits = v.view(np.int64)
    for i in range(n):
        e = ((bits[i] >> 52) & 2047) - 1023
        halves[i] = (max(e, emin) - mbits - 1 + 1023) << 52
    half = halves.view(np.float64)
    for i in range(n):
        x = v[i]
        a = b = x
        if x - x == 0 and mbits >= 0:
            h = half0 if x == 0 else half[i]
            a, b = x - h, x + h
        if join:
            c, d = out_lo[i], out_hi[i]
            # np.minimum / np.maximum (c, a): NaN propagates, a tie gives the second
            a = np.nan if (a != a or c != c) else (c if c < a else a)
            b = np.nan if (b != b or d != d) else (d if d > b else b)
        out_lo[i], out_hi[i] = a, b


@numba.njit(cache=True, error_model="numpy")
def inside_worst(lo, hi, ref, tgt, keep, h_lo, h_hi):
    """`check_inside`'s (flat index, margin, width); (-1, 0, 0) if a value is outside or NaN;
    keep: h_lo, h_hi <- min(ref, tgt), max(ref, tgt) (float32 or float64 values)."""
    if keep:
        for i in range(lo.size):
            a, b = np.float64(ref[i]), np.float64(tgt[i])
            nan = a != a or b != b  # np.minimum / np.maximum (tgt, ref): NaN propagates, a
            h_lo[i] = np.nan if nan else (b if b < a else a)  # tie gives the second (ref)
            h_hi[i] = np.nan if nan else (b if b > a else a)
    bad = 0
    for i in range(lo.size):  # NaN fails every comparison
        a, b = np.float64(ref[i]), np.float64(tgt[i])
        bad += not ((a >= lo[i]) & (a <= hi[i]) & (b >= lo[i]) & (b <= hi[i]))
    if bad:
        return -1, 0.0, 0.0
    sc = np.empty(lo.size)
    for i in range(lo.size):  # margin / half width; NaN (0/0, inf/inf, inf - inf) counts as inf
        d1, d2 = ref[i] - lo[i], hi[i] - ref[i]
        m = np.nan if (d1 != d1 or d2 != d2) else (d1 if d1 < d2 else d2)
        x = m / ((hi[i] - lo[i]) / 2)
        sc[i] = x if x < _INF else _INF
    best = 0
    for i in range(1, lo.size):
        if sc[i] < sc[best]:
            best = i
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
