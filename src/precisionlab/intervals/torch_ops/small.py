"""NumPy twins of `fused`'s elementwise kernels and of `kernels`' row passes (norm rows, the
softmax's) and matrix-product passes (`mm_operand`, `mm_close`) for small inputs, and the size
tier that picks between them. Compiling a kernel on a cold cache costs 0.2-3 s, which pays only
where the arrays are large: below `NUMPY_MAX_SIZE` values each kernel here takes NumPy steps
that give the compiled kernel's float64 values bit for bit (nextafter, `rounding.round_to`'s
NumPy tier, the same IEEE operations in the same order; tests/test_intervals_small.py checks
each against the compiled kernel on edge values at sizes on both sides of the tier). The tier
depends on the input's size only, never on what ran before, so a result does not depend on the
call history. Each function takes the arguments of its `fused` (or `kernels`) namesake and
returns what it returns."""

from __future__ import annotations

import numpy as np

from ...formats import FORMATS
from ...rounding import round_to
from . import fused, kernels

NUMPY_MAX_SIZE = 1 << 15  # up to this many values: NumPy (no compile); above: numba
_MAX64 = np.finfo(np.float64).max


def numpy_tier(n: int) -> bool:
    """Whether an input of n values takes the NumPy path (the tier depends on n only)."""
    return n <= NUMPY_MAX_SIZE


def _nxt(x: np.ndarray, sign: float) -> np.ndarray:
    """`fused.nxt` elementwise: np.nextafter toward sign inf, infinities and NaN kept."""
    with np.errstate(over="ignore", invalid="ignore"):
        y = np.nextafter(x, -np.inf if sign < 0 else np.inf)
        return np.where(x - x == 0, y, x)


def _outward(lo: np.ndarray, hi: np.ndarray, mbits: int, emin: int, top: float,
             q: float) -> bool:
    """`fused.outward`: lo rounded down, hi up in place (mbits < 0: kept); whether all lo <= hi.
    The format is the one `arith.rounding` describes by (mbits, emin, top, q)."""
    if mbits >= 0:
        fmt = _format(mbits, emin, top)
        with np.errstate(over="ignore", invalid="ignore"):
            lo[...] = round_to(lo, fmt, "down", compiled=False)
            hi[...] = round_to(hi, fmt, "up", compiled=False)
    return bool((lo <= hi).all())


def _format(mbits: int, emin: int, top: float) -> str | None:
    """The name of the registered format with inf of mbits fraction bits, smallest normal
    exponent emin and largest finite top (those `arith.rounding` describes); None for one
    without inf (float8_e4m3fn: `fused.directed` and `round_to` differ past its top), which
    the compiled kernels handle; "float64" for mbits < 0 (no rounding)."""
    if mbits < 0:
        return "float64"
    for f in FORMATS.values():
        if f.has_inf and (f.mantissa_bits, f.emin, f.max_finite) == (mbits, emin, top):
            return f.name
    return None


def step(a, sign, out):
    """`fused.step`: out = nextafter(a, sign inf) elementwise, infinities kept."""
    if not numpy_tier(a.size):
        return fused.step(a, sign, out)
    out[...] = _nxt(a, sign)
    return None


def _widen1(a: np.ndarray, sign: float, ulps: float, eps: float, q: float) -> np.ndarray:
    """`fused.widen1` elementwise."""
    with np.errstate(over="ignore", invalid="ignore"):
        e = _nxt(eps * np.abs(a), 1.0)
        e = _nxt(ulps * np.where((e > q) | (e != e), e, q), 1.0)
        y = _nxt(a + sign * e, sign)
        return np.where((a - a != 0) & (a == a), a, y)


def widen_rel(lo, hi, ulps, eps, q, nmin, out_lo, out_hi):
    """`fused.widen_rel`: relative widening, then for nmin > 0 ends in (0, nmin) to 0; whether
    all out_lo <= out_hi."""
    if not numpy_tier(lo.size):
        return fused.widen_rel(lo, hi, ulps, eps, q, nmin, out_lo, out_hi)
    x, y = _widen1(lo, -1.0, ulps, eps, q), _widen1(hi, 1.0, ulps, eps, q)
    if nmin > 0:
        x = np.where((x > 0) & (x < nmin), 0.0, x)
        y = np.where((y < 0) & (y > -nmin), 0.0, y)
    out_lo[...], out_hi[...] = x, y
    return bool((x <= y).all())


def round_out(lo, hi, mbits, emin, top, q, out_lo, out_hi):
    """`fused.round_out`: [RD(lo), RU(hi)] into the format; whether every out_lo <= out_hi."""
    if not numpy_tier(lo.size) or _format(mbits, emin, top) is None:
        return fused.round_out(lo, hi, mbits, emin, top, q, out_lo, out_hi)
    out_lo[...], out_hi[...] = lo, hi
    return _outward(out_lo, out_hi, mbits, emin, top, q)


def add_out(alo, ahi, blo, bhi, minus, mbits, emin, top, q, out_lo, out_hi):
    """`fused.add_out`: the sum (difference when minus) of finite ends stepped outward, an
    overflowed end +-max64, rounded outward into the format: 1 when every lo <= hi, 0 when not,
    -1 (nothing usable written) when an end is not finite."""
    if not numpy_tier(alo.size) or _format(mbits, emin, top) is None:
        return fused.add_out(alo, ahi, blo, bhi, minus, mbits, emin, top, q, out_lo, out_hi)
    x, y = (-bhi, -blo) if minus else (blo, bhi)
    with np.errstate(over="ignore", invalid="ignore"):
        if not ((alo - alo == 0) & (ahi - ahi == 0) & (x - x == 0) & (y - y == 0)).all():
            return -1
        a, b = _nxt(alo + x, -1.0), _nxt(ahi + y, 1.0)
    out_lo[...] = np.where(a == np.inf, _MAX64, a)
    out_hi[...] = np.where(b == -np.inf, -_MAX64, b)
    return int(_outward(out_lo, out_hi, mbits, emin, top, q))


def leaf_box(v, emin, mbits, half0, join, out_lo, out_hi):
    """`fused.leaf_box`: v -+ half an ulp of v in the format (mbits < 0: v itself); join: the
    hull with [out_lo, out_hi], NaN propagating."""
    if not numpy_tier(v.size):
        return fused.leaf_box(v, emin, mbits, half0, join, out_lo, out_hi)
    a = b = v
    if mbits >= 0:
        e = ((v.view(np.int64) >> 52) & 2047) - 1023
        half = ((np.maximum(e, emin) - mbits - 1 + 1023) << 52).view(np.float64)
        h = np.where(v == 0, half0, half)
        with np.errstate(over="ignore", invalid="ignore"):
            fin = v - v == 0
            a, b = np.where(fin, v - h, v), np.where(fin, v + h, v)
    if join:  # np.minimum / np.maximum (c, a): NaN propagates, a tie gives the second
        c, d = out_lo, out_hi
        a = np.where((a != a) | (c != c), np.nan, np.where(c < a, c, a))
        b = np.where((b != b) | (d != d), np.nan, np.where(d > b, d, b))
    out_lo[...], out_hi[...] = a, b
    return None


def _outward1(lo: np.ndarray, hi: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """`kernels._outward1` elementwise: (lo, hi) stepped outward, a NaN end the whole line."""
    a, b = _nxt(lo, -1.0), _nxt(hi, 1.0)
    nan = (a != a) | (b != b)
    return np.where(nan, -np.inf, a), np.where(nan, np.inf, b)


def _pymax(a, b):
    """Python's (and numba's) max(a, b): b where b > a, else a (NaN and ties as they give)."""
    return np.where(b > a, b, a)


def _pymin(a, b):
    """Python's (and numba's) min(a, b): b where b < a, else a."""
    return np.where(b < a, b, a)


def scaled(lo, hi, c_lo, c_hi, out_lo, out_hi):
    """`kernels.scaled`: [lo, hi] times [c_lo, c_hi], the four corner products stepped outward,
    a NaN product the whole line."""
    if not numpy_tier(lo.size):
        return kernels.scaled(lo, hi, c_lo, c_hi, out_lo, out_hi)
    with np.errstate(over="ignore", invalid="ignore", under="ignore"):
        c1, c2, c3, c4 = lo * c_lo, lo * c_hi, hi * c_lo, hi * c_hi
        a = _nxt(_pymin(_pymin(c1, c2), _pymin(c3, c4)), -1.0)
        b = _nxt(_pymax(_pymax(c1, c2), _pymax(c3, c4)), 1.0)
    nan = (c1 != c1) | (c2 != c2) | (c3 != c3) | (c4 != c4)
    out_lo[...], out_hi[...] = np.where(nan, -np.inf, a), np.where(nan, np.inf, b)
    return None


def unary_ends(lo, hi, fa, fb, kind, xmin, fminv, rel, tiny, absc, out_lo, out_hi):
    """`kernels.unary_ends`: a unary function's bound over [lo, hi] from fa = f(lo), fb = f(hi)
    (kind 0: increasing, 1: decreasing, 2: unimodal with fminv at xmin), widened by rel and
    tiny, then by absc max|x| (absc > 0), stepped outward."""
    if not numpy_tier(lo.size):
        return kernels.unary_ends(lo, hi, fa, fb, kind, xmin, fminv, rel, tiny, absc, out_lo,
                                  out_hi)
    u, v = fa, fb
    with np.errstate(over="ignore", invalid="ignore"):
        if kind == 0:
            lw, h = u, v
        elif kind == 1:
            lw, h = v, u
        else:
            nan = (u != u) | (v != v)
            lw = np.where(nan, np.nan, np.where(u < v, u, v))
            h = np.where(nan, np.nan, np.where(u > v, u, v))
            lw = np.where((lo <= xmin) & (hi >= xmin), fminv, lw)
        x, y = _outward1(lw - np.abs(lw) * rel - tiny, h + np.abs(h) * rel + tiny)
        if absc > 0:
            r = absc * _pymax(np.abs(lo), np.abs(hi))
            x, y = _outward1(x - r, y + r)
    out_lo[...], out_hi[...] = x, y
    return None


def inside_worst(lo, hi, ref, tgt, keep, h_lo, h_hi):
    """`fused.inside_worst`: (flat index, margin, width) of the entry whose values sit least
    inside [lo, hi] relative to its half width; (-1, 0, 0) if a value is outside or NaN; keep:
    h_lo, h_hi <- min(ref, tgt), max(ref, tgt) (NaN propagating, a tie giving ref)."""
    if lo.size == 0 or not numpy_tier(lo.size):
        return fused.inside_worst(lo, hi, ref, tgt, keep, h_lo, h_hi)
    a, b = ref.astype(np.float64), tgt.astype(np.float64)
    if keep:
        nan = (a != a) | (b != b)
        h_lo[...] = np.where(nan, np.nan, np.where(b < a, b, a))
        h_hi[...] = np.where(nan, np.nan, np.where(b > a, b, a))
    if not ((a >= lo) & (a <= hi) & (b >= lo) & (b <= hi)).all():
        return -1, 0.0, 0.0
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        d1, d2 = a - lo, hi - a
        m = np.where((d1 != d1) | (d2 != d2), np.nan, np.where(d1 < d2, d1, d2))
        x = m / ((hi - lo) / 2)
        best = int(np.argmin(np.where(x < np.inf, x, np.inf)))  # the first smallest
        w = hi[best] - lo[best]
    return best, float(m[best]), float(w)


def softmax_in(lo, hi, n, u2, a, b, row_nan):
    """`kernels.softmax_in`: per row of n entries, the box widened by u2 (max hi - lo) outward
    (0 where hi = -inf, NaN read as inf), shifted by its largest finite upper end c (else 0):
    a = lo' - c, b = hi' - c; row_nan: a row holding [-inf, inf], or every entry -inf."""
    if n <= 0 or not numpy_tier(lo.size):
        return kernels.softmax_in(lo, hi, n, u2, a, b, row_nan)
    rows = lo.size // n
    L, H = lo[:rows * n].reshape(rows, n), hi[:rows * n].reshape(rows, n)
    mx = np.max(np.where(H != H, -np.inf, H), axis=1, keepdims=True)  # NaN never > mx
    row_nan[:rows] = ((L == -np.inf) & (H == np.inf)).any(axis=1) | (H == -np.inf).all(axis=1)
    with np.errstate(over="ignore", invalid="ignore"):
        w = u2 * (mx - L)
        w = np.where(H == -np.inf, 0.0, np.where(w != w, np.inf, w))
        x, y = _outward1(L - w, H + w)
        c = np.max(y, axis=1, keepdims=True)  # no NaN after _outward1
        c = np.where(c - c == 0, c, 0.0)
        a[:rows * n], b[:rows * n] = (x - c).reshape(-1), (y - c).reshape(-1)
    return None


def _rowsums(t: np.ndarray) -> np.ndarray:
    """`0.0 + fused.rowsum` of each row of t (rows, n): NumPy's pairwise order up to 128 terms
    (8 accumulators, then the rest in turn), longer rows as consecutive blocks of 128 added in
    turn, each step vectorised over the rows."""
    rows, n = t.shape
    nb, m = divmod(n, 128)
    parts = []
    if nb:
        blk = t[:, :nb * 128].reshape(rows, nb, 128)
        parts += list(np.moveaxis(_block_sums(blk, 128), 1, 0))
    if m:
        parts.append(_block_sums(t[:, nb * 128:][:, None, :], m)[:, 0])
    s = np.zeros(rows)
    with np.errstate(over="ignore", invalid="ignore"):
        for p in parts:  # t += res, block by block
            s = s + p
        return 0.0 + s


def _block_sums(b: np.ndarray, m: int) -> np.ndarray:
    """`fused.rowsum`'s sum of one block of m <= 128 terms along b's last axis."""
    with np.errstate(over="ignore", invalid="ignore"):
        if m < 8:
            res = np.zeros(b.shape[:-1])
            for i in range(m):
                res = res + b[..., i]
            return res
        r = b[..., :8]
        end = m - m % 8
        for i in range(8, end, 8):
            r = r + b[..., i:i + 8]
        res = ((r[..., 0] + r[..., 1]) + (r[..., 2] + r[..., 3])) + \
            ((r[..., 4] + r[..., 5]) + (r[..., 6] + r[..., 7]))
        for i in range(end, m):
            res = res + b[..., i]
        return res


def _mul1(alo, ahi, blo, bhi):
    """`kernels._mul1` elementwise: the four corner products stepped outward, a NaN product the
    whole line."""
    c1, c2, c3, c4 = alo * blo, alo * bhi, ahi * blo, ahi * bhi
    a = _nxt(_pymin(_pymin(c1, c2), _pymin(c3, c4)), -1.0)
    b = _nxt(_pymax(_pymax(c1, c2), _pymax(c3, c4)), 1.0)
    nan = (c1 != c1) | (c2 != c2) | (c3 != c3) | (c4 != c4)
    return np.where(nan, -np.inf, a), np.where(nan, np.inf, b)


def norm_rows(lo, hi, nrow, n, rms, eps_lo, eps_hi, has_w, wlo, whi, has_b, blo, bhi, g, u, uf,
              limit, tiny, mbits, emin, top, q, out_lo, out_hi):
    """`kernels.norm_rows`: the norm rule of `rows` per row of n entries (layer norm, or RMS
    norm when rms), its float64 steps vectorised over the rows; a row holding an infinite or
    NaN end, or whose squares may overflow (4 n max|x|^2 >= limit), the whole line; rounded
    outward into the format when mbits >= 0."""
    if not numpy_tier(lo.size) or nrow <= 0 or n <= 0 or _format(mbits, emin, top) is None:
        return kernels.norm_rows(lo, hi, nrow, n, rms, eps_lo, eps_hi, has_w, wlo, whi, has_b,
                                 blo, bhi, g, u, uf, limit, tiny, mbits, emin, top, q, out_lo,
                                 out_hi)
    with np.errstate(over="ignore", invalid="ignore", divide="ignore", under="ignore"):
        y_lo, y_hi = _norm_rows(lo[:nrow * n].reshape(nrow, n), hi[:nrow * n].reshape(nrow, n),
                                n, rms, eps_lo, eps_hi, has_w, wlo, whi, has_b, blo, bhi, g, u,
                                uf, limit, tiny)
    out_lo[:nrow * n], out_hi[:nrow * n] = y_lo.reshape(-1), y_hi.reshape(-1)
    if mbits >= 0:
        _outward(out_lo, out_hi, mbits, emin, top, q)
    return None


def _norm_rows(L, H, n, rms, eps_lo, eps_hi, has_w, wlo, whi, has_b, blo, bhi, g, u, uf, limit,
               tiny):
    """`norm_rows`' rows (L, H: (rows, n)) before the outward rounding."""
    whole = ((L - L != 0) | (H - H != 0)).any(axis=1, keepdims=True)
    # the kernel's max(xmax, max(|lo|, |hi|)) from 0 in turn: on a row of finite ends (the
    # rest are the whole line) any order gives the same largest |end|
    xmax = np.max(np.maximum(np.abs(L), np.abs(H)), axis=1, keepdims=True, initial=0.0)
    whole |= 4 * n * (xmax * xmax) >= limit
    if rms:
        d_lo, d_hi = L, H
    else:
        s = [_rowsums(z)[:, None] for z in (L, H, np.abs(L), np.abs(H))]
        m_lo, m_hi = s[0] / n, s[1] / n
        sl = s[2] / n + s[3] / n
        sl = g * sl + 2 * n * u * tiny
        m_lo, m_hi = _nxt(m_lo - sl, -1.0), _nxt(m_hi + sl, 1.0)
        d_lo, d_hi = _nxt(L - m_hi, -1.0), _nxt(H - m_lo, 1.0)
    a, b = d_lo * d_lo, d_hi * d_hi  # squares (`_square`)
    straddle = (d_lo <= 0) & (d_hi >= 0)
    sq_lo = np.where(straddle, 0.0, _nxt(_pymin(a, b), -1.0))
    sq_hi = _nxt(_pymax(a, b), 1.0)
    s0, s1 = _rowsums(sq_lo)[:, None], _rowsums(sq_hi)[:, None]
    v_lo = _nxt(s0 / n * (1 - g) - 4 * tiny, -1.0)
    v_hi = _nxt(s1 / n * (1 + g) + 4 * tiny, 1.0)
    r_hi = _nxt(1.0 / np.sqrt(_nxt(_pymax(v_lo, 0.0) + eps_lo, -1.0)) * (1 + g), 1.0)
    r_lo = _nxt(1.0 / np.sqrt(_nxt(v_hi + eps_hi, 1.0)) * (1 - g), -1.0)
    r_lo = np.where(r_lo != r_lo, 0.0, r_lo)
    y_lo, y_hi = _mul1(d_lo, d_hi, r_lo, r_hi)
    xhat = _pymax(np.abs(y_lo), np.abs(y_hi))
    wabs, babs = 1.0, 0.0
    if has_w:
        y_lo, y_hi = _mul1(y_lo, y_hi, wlo[:n], whi[:n])
        wabs = _pymax(np.abs(wlo[:n]), np.abs(whi[:n]))
    if has_b:
        y_lo, y_hi = _outward1(y_lo + blo[:n], y_hi + bhi[:n])
        babs = _pymax(np.abs(blo[:n]), np.abs(bhi[:n]))
    yabs = _pymax(np.abs(y_lo), np.abs(y_hi))
    e = u * ((2 * n + 16) * xmax * r_hi * wabs + 4 * yabs + 2 * babs)
    e = e + 2 * uf * (2 * xhat * wabs + babs + yabs)
    e = np.where(e != e, np.inf, e)
    y_lo, y_hi = _nxt(y_lo - e, -1.0), _nxt(y_hi + e, 1.0)
    return np.where(whole, -np.inf, y_lo), np.where(whole, np.inf, y_hi)


def softmax_out(ea, eb, n, g, rel, tiny, row_nan, out_lo, out_hi):
    """`kernels.softmax_out`: per row of n entries, s_i in [e^lo_i / (e^lo_i + sum_(j!=i)
    e^hi_j), e^hi_i / (e^hi_i + sum_(j!=i) e^lo_j)] in float64 steps (sums in `fused.rowsum`'s
    order), clipped to [0, 1]; rows in row_nan the whole line."""
    if n <= 0 or not numpy_tier(ea.size):
        return kernels.softmax_out(ea, eb, n, g, rel, tiny, row_nan, out_lo, out_hi)
    rows = ea.size // n
    A, B = ea[:rows * n].reshape(rows, n), eb[:rows * n].reshape(rows, n)
    with np.errstate(over="ignore", invalid="ignore", divide="ignore", under="ignore"):
        e_hi = B * (1 + rel) + tiny
        x = A * (1 - rel) - tiny
        e_lo = np.where((x != x) | (x > 0), x, 0.0)  # np.maximum(., 0.0)
        s_hi = _rowsums(e_hi)[:, None] * (1 + g)
        s_lo = _rowsums(e_lo)[:, None] * (1 - g)
        d_hi, d_lo = s_hi - e_lo, s_lo - e_hi
        other_hi = np.where((d_hi != d_hi) | (d_hi > 0), d_hi, 0.0) * (1 + 2.0**-50) + tiny
        other_lo = np.where((d_lo != d_lo) | (d_lo > 0), d_lo, 0.0) * (1 - 2.0**-50)
        x = e_lo / (e_lo + other_hi) * (1 - 2.0**-50)
        y = e_hi / (e_hi + other_lo) * (1 + 2.0**-50)
    x = np.where((x != x) | (x < 0), 0.0, np.where(x > 1, 1.0, x))
    y = np.where(y != y, 1.0, np.where(y < 0, 0.0, np.where(y > 1, 1.0, y)))
    nan = np.asarray(row_nan[:rows], bool)[:, None]
    out_lo[:rows * n] = np.where(nan, -np.inf, x).reshape(-1)
    out_hi[:rows * n] = np.where(nan, np.inf, y).reshape(-1)
    return None


def _up32(x: np.ndarray) -> np.ndarray:
    """`kernels._up32` elementwise: nextafter(float32(x), +inf) in float32, +-0 to the smallest
    positive subnormal, +inf and NaN kept."""
    with np.errstate(over="ignore", invalid="ignore"):
        b = x.astype(np.float32).view(np.int32)
    mag = b & 0x7FFFFFFF
    keep = (mag > 0x7F800000) | (b == 0x7F800000)
    moved = np.where(mag == 0, np.int32(1), np.where(b > 0, b + np.int32(1), b - np.int32(1)))
    return np.where(keep, b, moved).astype(np.int32).view(np.float32)


def mm_operand(lo, hi, nb, nr, nc, by_rows, mbits, emin, top, q, c_rad, c_rows, mid, stack,
               rows):
    """`kernels.mm_operand`: an operand of `products.mm`'s float32 path, nb blocks of nr x nc,
    rounded outward, in midpoint-radius form (mid), its |mid| and radii rounded up into float32
    stacked (by_rows: blocks of 2 nr x nc, else rows of 2 nc), by_rows: the row sums (in
    `fused.rowsum`'s order); returns max(stack, 0), NaN if any. The tier is the operand's
    size (nb nr nc; its stack is twice that)."""
    size = nb * nr * nc
    if size <= 0 or not numpy_tier(size) or _format(mbits, emin, top) is None:
        return kernels.mm_operand(lo, hi, nb, nr, nc, by_rows, mbits, emin, top, q, c_rad,
                                  c_rows, mid, stack, rows)
    a, b = lo[:size].copy(), hi[:size].copy()
    _outward(a, b, mbits, emin, top, q)
    with np.errstate(over="ignore", invalid="ignore", under="ignore"):
        m = a / 2 + b / 2
        d1, d2 = b - m, m - a
        rad = np.where((d1 != d1) | (d2 != d2), np.nan, np.where(d1 > d2, d1, d2) * c_rad)
    mid[:size] = m
    s1, s2 = _up32(np.abs(m)), _up32(rad)
    st = stack[:2 * size].reshape((nb, 2, nr, nc) if by_rows else (nb * nr, 2, nc))
    st[:, 0], st[:, 1] = s1.reshape(st[:, 0].shape), s2.reshape(st[:, 1].shape)
    if by_rows:
        with np.errstate(over="ignore", invalid="ignore"):
            rows[:nb * nr] = (_rowsums(np.abs(m).reshape(nb * nr, nc)) +
                              _rowsums(rad.reshape(nb * nr, nc))) * c_rows
    if np.isnan(s1).any() or np.isnan(s2).any():
        return np.nan
    return float(max(np.float32(0), s1.max(), s2.max()))


def mm_close(pm, prod, nb, nm, nn, leaf, rows, rho, tau, c_up, c_add, orel, ncol, bias, blo,
             bhi, g64, c1, c2, c3, uf, qf, grow_f, limit_f, grow_acc, limit_acc, mbits, emin,
             top, q, out_lo, out_hi):
    """`kernels.mm_close`: the float32 path's radii from prod (blocks of 2 nm x nn for a leaf,
    2 nm x 2 nn for two boxes) read as prod c_up + c_add, combined, widened by orel, closed
    (`fused.close`) and rounded outward into the format; whether every out_lo <= out_hi. The
    tier is the output's size (nb nm nn; prod is two or four times that)."""
    size = nb * nm * nn
    if (size <= 0 or ncol <= 0 or not numpy_tier(size) or pm.size != size or
            _format(mbits, emin, top) is None):
        return kernels.mm_close(pm, prod, nb, nm, nn, leaf, rows, rho, tau, c_up, c_add, orel,
                                ncol, bias, blo, bhi, g64, c1, c2, c3, uf, qf, grow_f, limit_f,
                                grow_acc, limit_acc, mbits, emin, top, q, out_lo, out_hi)
    w = nn if leaf else 2 * nn
    P = prod[:nb * 2 * nm * w].reshape(nb, 2 * nm, w).astype(np.float64)
    with np.errstate(over="ignore", invalid="ignore", under="ignore"):
        qq = P[:, :nm, :nn] * c_up + c_add
        rr = P[:, nm:, :nn] * c_up + c_add
        if leaf:
            x = tau * rows[:nb * nm].reshape(nb, nm, 1)
            p, sv = (rho * qq + (1 + rho) * rr) + x, (1 + rho) * (qq + rr) + x
        else:
            p2 = P[:, :nm, nn:] * c_up + c_add
            p4 = P[:, nm:, nn:] * c_up + c_add
            p = (p2 + rr) + p4
            sv = qq + p
        if orel != 0:
            p, sv = p + orel * sv, sv * (1 + orel)
        lo, hi = _close(pm[:size].reshape(-1, ncol), p.reshape(-1, ncol), sv.reshape(-1, ncol),
                        ncol, bias, blo, bhi, g64, c1, c2, c3, uf, qf, grow_f, limit_f,
                        grow_acc, limit_acc)
    out_lo[:size], out_hi[:size] = lo.reshape(-1), hi.reshape(-1)
    return _outward(out_lo, out_hi, mbits, emin, top, q)


def _close(p, rr, t, ncol, bias, blo, bhi, g64, c1, c2, c3, uf, qf, grow_f, limit_f, grow_acc,
           limit_acc):
    """`fused.close` on (rows, ncol) arrays: (lo, hi), the bias [blo, bhi] (one entry per
    column) in midpoint-radius form, an infinite point entry as 0 +- 0 and then kept."""
    extra, over = 0.0, False
    inf_b = False
    if bias:
        bl, bh = blo[:ncol], bhi[:ncol]
        inf_b = (bl == bh) & (bl - bl != 0)
        m = bl / 2 + bh / 2
        d1, d2 = bh - m, m - bl
        r = np.where((d1 != d1) | (d2 != d2), np.nan, np.where(d1 > d2, d1, d2) * (1 + 4 * g64))
        bmid, brad = np.where(inf_b, 0.0, m), np.where(inf_b, 0.0, r)
        if uf > 0:
            extra = 1.01 * uf * t + qf
            over = t * grow_f >= limit_f
        p, rr, t = p + bmid, rr + brad, t + np.abs(bmid) + brad
    rad = (rr + c1 * t + extra) * c2 + c3
    lo, hi = _nxt(p - rad, -1.0), _nxt(p + rad, 1.0)
    whole = over | (t * grow_acc >= limit_acc)
    if bias:
        lo, hi = np.where(inf_b, bl, lo), np.where(inf_b, bh, hi)
    return np.where(whole, -np.inf, lo), np.where(whole, np.inf, hi)
