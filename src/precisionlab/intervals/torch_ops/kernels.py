"""Compiled (numba) passes for whole torch-operation rules: the operands and the closing
of matrix products (`products.mm`), layer / RMS norm rows, softmax rows around NumPy's
exponentials, scaled attention scores, and unary functions after their float64 evaluation,
each before the rule's `finish` (widening by ulps and rounding into the format). Each gives
the float64 values of the NumPy steps it replaces, bit for bit (the same IEEE operations in the
same order, no fast-math except where a sum may take any order; tests/test_diagnose_kernels.py
checks them against those steps), built from `fused`'s one-number steps. numba's on-disk cache
(cache=True) keys on this file alone: after editing fused.py, touch this one."""

from __future__ import annotations

import numba
import numpy as np

from . import fused as F

_INF = np.inf


@numba.njit(error_model="numpy")
def _outward1(lo, hi):
    """(lo, hi) stepped outward, a NaN end making the whole line."""
    a, b = F.nxt(lo, -1.0), F.nxt(hi, 1.0)
    nan = a != a or b != b
    return (-_INF if nan else a), (_INF if nan else b)


@numba.njit(error_model="numpy")
def _mul1(alo, ahi, blo, bhi):
    """The product of `rules` (`_mul_iv`) of one pair: the four corner products stepped outward;
    a NaN product (0 inf) gives the whole line."""
    c1, c2, c3, c4 = alo * blo, alo * bhi, ahi * blo, ahi * bhi
    a, b = F.nxt(min(min(c1, c2), min(c3, c4)), -1.0), F.nxt(max(max(c1, c2), max(c3, c4)), 1.0)
    nan = c1 != c1 or c2 != c2 or c3 != c3 or c4 != c4
    return (-_INF if nan else a), (_INF if nan else b)


@numba.njit(cache=True, error_model="numpy")
def unary_ends(lo, hi, fa, fb, kind, xmin, fminv, rel, tiny, absc, out_lo, out_hi):
    """A unary function's bound over [lo, hi] from fa = f(lo), fb = f(hi) (float64, NaN
    possible), before `finish`: the steps of `_mono` in `rules` (kind 0: increasing, 1:
    decreasing) or of a unimodal f (kind 2: fminv where xmin is inside), then `widen_abs` by
    absc max|x| (absc > 0)."""
    for i in range(lo.size):
        u, v = fa[i], fb[i]
        nan = u != u or v != v
        if kind == 0:
            lw, h = u, v
        elif kind == 1:
            lw, h = v, u
        else:
            lw = np.nan if nan else (u if u < v else v)
            h = np.nan if nan else (u if u > v else v)
            if lo[i] <= xmin and hi[i] >= xmin:
                lw = fminv
        x, y = _outward1(lw - abs(lw) * rel - tiny, h + abs(h) * rel + tiny)
        if absc > 0:
            r = absc * max(abs(lo[i]), abs(hi[i]))
            x, y = _outward1(x - r, y + r)
        out_lo[i], out_hi[i] = x, y


@numba.njit(cache=True, error_model="numpy")
def scaled(lo, hi, c_lo, c_hi, out_lo, out_hi):
    """[lo, hi] times [c_lo, c_hi] (as `_mul_iv` in `rules`: the four corner products stepped
    outward)."""
    for i in range(lo.size):
        out_lo[i], out_hi[i] = _mul1(lo[i], hi[i], c_lo, c_hi)


@numba.njit(error_model="numpy")
def _up32(x):
    """nextafter(float32(x), +inf) in float32 (as torch.nextafter after the cast to nearest):
    +-0 to the smallest positive subnormal, +inf and NaN kept."""
    y = np.float32(x)
    b = y.view(np.int32)
    keep = (b & 0x7FFFFFFF) > 0x7F800000 or b == 0x7F800000
    moved = np.int32(1) if (b & 0x7FFFFFFF) == 0 else (b + np.int32(1) if b > 0 else
                                                          b - np.int32(1))
    r = np.int32(b if keep else moved)
    return r.view(np.float32)


@numba.njit(cache=True, error_model="numpy")
def mm_operand(lo, hi, nb, nr, nc, by_rows, mbits, emin, top, q, c_rad, c_rows, mid, stack,
               rows):
    """An operand of `products.mm`'s float32 path, nb blocks of nr x nc: [lo, hi] rounded
    outward into the format (`F.outward`), mid = lo/2 + hi/2 and rad = max(hi - mid, mid - lo)
    c_rad (`products.midrad`); stack = |mid| over rad (by_rows: blocks of 2 nr x nc) or beside it
    (nr x 2 nc), each rounded up into float32 (`upper_product`); by_rows: rows = (sum |mid| +
    sum rad) c_rows per row (`leaf_products`, `F.rowsum`). Returns max(stack), NaN if any."""
    a, b = lo.copy(), hi.copy()
    F.outward(a, b, mbits, emin, top, q)
    big = np.float32(0)
    nan = False
    for blk in range(nb):
        for r in range(nr):
            for c in range(nc):
                i = (blk * nr + r) * nc + c  # a, mid <- mid, b <- rad
                x, y = a[i], b[i]
                m = x / 2 + y / 2
                d1, d2 = y - m, m - x
                rad = np.nan if (d1 != d1 or d2 != d2) else (d1 if d1 > d2 else d2) * c_rad
                a[i] = mid[i] = m
                b[i] = rad
                # by_rows: |mid| in rows 0..nr-1 of a block of 2 nr rows, rad below; else
                # |mid| in columns 0..nc-1 of a row of 2 nc, rad beside
                j1 = ((2 * blk * nr + r) * nc + c) if by_rows else ((2 * (blk * nr + r)) * nc + c)
                j2 = j1 + (nr * nc if by_rows else nc)
                s1, s2 = _up32(abs(m)), _up32(rad)
                stack[j1], stack[j2] = s1, s2
                nan |= s1 != s1 or s2 != s2
                big = max(big, max(s1, s2))
    if by_rows:  # |mid| and rad summed per row (any order is within c_rows' slack)
        for i in range(a.size):
            a[i] = abs(a[i])
        for r in range(nb * nr):
            rows[r] = (F.rowsum(a, r * nc, nc) + F.rowsum(b, r * nc, nc)) * c_rows
    return np.nan if nan else np.float64(big)


@numba.njit(cache=True, error_model="numpy")
def mm_close(pm, prod, nb, nm, nn, leaf, rows, rho, tau, c_up, c_add, orel, ncol, bias, blo,
             bhi, g64, c1, c2, c3, uf, qf, grow_f, limit_f, grow_acc, limit_acc, mbits, emin,
             top, q, out_lo, out_hi):
    """The float32 path's radii from prod (float32 products of the stacked operands, blocks of
    2 nm x nn for a leaf, 2 nm x 2 nn for two boxes), each read as prod c_up + c_add
    (`upper_product`), combined as `leaf_products` / `box_products` do, widened by orel as
    `mm` does, closed (`F.close`) and rounded outward into the format (`F.outward`);
    whether every out_lo <= out_hi."""
    pr, s = np.empty(pm.size), np.empty(pm.size)
    w = 2 * nn if not leaf else nn
    for blk in range(nb):
        for i in range(nm):
            for j in range(nn):
                o = (blk * nm + i) * nn + j
                t = (blk * 2 * nm + i) * w + j  # |a| |b| (leaf: |am| |w|)
                u = t + nm * w  # ar |b| (leaf: ar |w|)
                qq = np.float64(prod[t]) * c_up + c_add
                rr = np.float64(prod[u]) * c_up + c_add
                if leaf:
                    x = tau * rows[blk * nm + i]
                    p, sv = (rho * qq + (1 + rho) * rr) + x, (1 + rho) * (qq + rr) + x
                else:
                    p2 = np.float64(prod[t + nn]) * c_up + c_add
                    p4 = np.float64(prod[u + nn]) * c_up + c_add
                    p = (p2 + rr) + p4
                    sv = qq + p
                if orel != 0:
                    p, sv = p + orel * sv, sv * (1 + orel)
                pr[o], s[o] = p, sv
    F.close(pm, pr, s, ncol, bias, blo, bhi, g64, c1, c2, c3, uf, qf, grow_f, limit_f,
            grow_acc, limit_acc, out_lo, out_hi)
    return F.outward(out_lo, out_hi, mbits, emin, top, q)


@numba.njit(cache=True, error_model="numpy")
def norm_rows(lo, hi, nrow, n, rms, eps_lo, eps_hi, has_w, wlo, whi, has_b, blo, bhi, g, u, uf,
              limit, tiny, mbits, emin, top, q, out_lo, out_hi):
    """The norm rule of `rows` (`_norm_rule`) per row of n entries (layer norm, or RMS norm when
    rms), its float64 steps in the same order (sums by `F.rowsum`); a row holding an infinite
    end, or whose squares may overflow (4 n max|x|^2 >= limit), the whole line; rounded outward
    into the format when mbits >= 0. tiny, the internal format's smallest normal: squares below
    it underflow (their relative error is unbounded), so the variance gets an absolute slack of
    4 tiny and the mean one of 2 n u tiny (n roundings on the subnormal grid); with eps = 0 a
    row whose variance may be below 4 tiny is the whole line (1 / sqrt(0) may be inf or NaN)."""
    d_lo, d_hi = np.empty(n), np.empty(n)
    t = np.empty(4 * n)  # rows of terms to sum
    sums = np.empty(4)
    for r in range(nrow):
        o = r * n
        xmax = 0.0
        whole = False
        for j in range(o, o + n):
            whole |= lo[j] - lo[j] != 0 or hi[j] - hi[j] != 0
            xmax = max(xmax, max(abs(lo[j]), abs(hi[j])))
        if whole or 4 * n * (xmax * xmax) >= limit:
            for j in range(o, o + n):
                out_lo[j], out_hi[j] = -_INF, _INF
            continue
        if rms:
            for j in range(n):
                d_lo[j], d_hi[j] = lo[o + j], hi[o + j]
        else:
            for j in range(n):
                t[j], t[n + j] = lo[o + j], hi[o + j]
                t[2 * n + j], t[3 * n + j] = abs(lo[o + j]), abs(hi[o + j])
            for k in range(4):
                sums[k] = 0.0 + F.rowsum(t, k * n, n)
            m_lo, m_hi = sums[0] / n, sums[1] / n
            sl = sums[2] / n + sums[3] / n
            sl = g * sl + 2 * n * u * tiny
            m_lo, m_hi = F.nxt(m_lo - sl, -1.0), F.nxt(m_hi + sl, 1.0)
            for j in range(n):
                d_lo[j], d_hi[j] = F.nxt(lo[o + j] - m_hi, -1.0), F.nxt(hi[o + j] - m_lo, 1.0)
        for j in range(n):  # squares (`_square`)
            a, b = d_lo[j] * d_lo[j], d_hi[j] * d_hi[j]
            straddle = d_lo[j] <= 0 and d_hi[j] >= 0
            t[j] = 0.0 if straddle else F.nxt(min(a, b), -1.0)
            t[n + j] = F.nxt(max(a, b), 1.0)
        for k in range(2):
            sums[k] = 0.0 + F.rowsum(t, k * n, n)
        v_lo = F.nxt(sums[0] / n * (1 - g) - 4 * tiny, -1.0)
        v_hi = F.nxt(sums[1] / n * (1 + g) + 4 * tiny, 1.0)
        r_hi = F.nxt(1.0 / np.sqrt(F.nxt(max(v_lo, 0.0) + eps_lo, -1.0)) * (1 + g), 1.0)
        r_lo = F.nxt(1.0 / np.sqrt(F.nxt(v_hi + eps_hi, 1.0)) * (1 - g), -1.0)
        r_lo = 0.0 if r_lo != r_lo else r_lo
        for j in range(n):
            y_lo, y_hi = _mul1(d_lo[j], d_hi[j], r_lo, r_hi)
            xhat = max(abs(y_lo), abs(y_hi))
            wabs, babs = 1.0, 0.0
            if has_w:
                y_lo, y_hi = _mul1(y_lo, y_hi, wlo[j], whi[j])
                wabs = max(abs(wlo[j]), abs(whi[j]))
            if has_b:
                y_lo, y_hi = _outward1(y_lo + blo[j], y_hi + bhi[j])
                babs = max(abs(blo[j]), abs(bhi[j]))
            yabs = max(abs(y_lo), abs(y_hi))
            e = u * ((2 * n + 16) * xmax * r_hi * wabs + 4 * yabs + 2 * babs)
            e = e + 2 * uf * (2 * xhat * wabs + babs + yabs)
            e = _INF if e != e else e
            out_lo[o + j], out_hi[o + j] = F.nxt(y_lo - e, -1.0), F.nxt(y_hi + e, 1.0)
    if mbits >= 0:
        F.outward(out_lo, out_hi, mbits, emin, top, q)


@numba.njit(cache=True, error_model="numpy")
def softmax_in(lo, hi, n, u2, a, b, row_nan):
    """`rows.softmax_rule`'s steps before the exponentials, per row of n entries: the box widened
    by r = u2 (max hi - lo) (0 where hi = -inf, NaN read as inf) outward (a NaN end: the whole
    line), c = its largest finite upper end (else 0), a = lo' - c, b = hi' - c; row_nan: the
    row holds an entry without information, or every entry is -inf (`_row_nan`)."""
    for r in range(lo.size // n):
        o = r * n
        mx = -_INF
        whole = False
        masked = True
        for j in range(o, o + n):
            mx = hi[j] if hi[j] > mx else mx
            whole |= (lo[j] == -_INF) & (hi[j] == _INF)
            masked &= hi[j] == -_INF
        row_nan[r] = whole or masked
        c = -_INF
        for j in range(o, o + n):
            w = u2 * (mx - lo[j])
            w = _INF if w != w else w
            w = 0.0 if hi[j] == -_INF else w
            a[j], b[j] = _outward1(lo[j] - w, hi[j] + w)
            c = b[j] if b[j] > c else c
        c = c if c - c == 0 else 0.0
        for j in range(o, o + n):
            a[j], b[j] = a[j] - c, b[j] - c


@numba.njit(cache=True, error_model="numpy")
def softmax_out(ea, eb, n, g, rel, tiny, row_nan, out_lo, out_hi):
    """`rows.softmax_rule` after the exponentials ea = e^(lo - c), eb = e^(hi - c), per row of n
    entries: s_i in [e^lo_i / (e^lo_i + sum_(j!=i) e^hi_j), e^hi_i / (e^hi_i + sum_(j!=i)
    e^lo_j)] in float64 steps (sums by `F.rowsum`), clipped to [0, 1]; rows in row_nan the
    whole line."""
    e = np.empty(2 * n)  # e^hi (times 1 + rel, plus tiny), then e^lo (times 1 - rel, less tiny)
    sums = np.empty(2)
    for r in range(ea.size // n):
        o = r * n
        for j in range(n):
            e[j] = eb[o + j] * (1 + rel) + tiny
            x = ea[o + j] * (1 - rel) - tiny
            e[n + j] = x if (x != x or x > 0) else 0.0  # np.maximum(., 0.0)
        for k in range(2):
            sums[k] = 0.0 + F.rowsum(e, k * n, n)
        s_hi, s_lo = sums[0] * (1 + g), sums[1] * (1 - g)
        for j in range(n):
            e_hi, e_lo = e[j], e[n + j]
            d_hi, d_lo = s_hi - e_lo, s_lo - e_hi  # np.maximum(., 0.0) of each
            other_hi = (d_hi if (d_hi != d_hi or d_hi > 0) else 0.0) * (1 + 2.0**-50) + tiny
            other_lo = (d_lo if (d_lo != d_lo or d_lo > 0) else 0.0) * (1 - 2.0**-50)
            x = e_lo / (e_lo + other_hi) * (1 - 2.0**-50)
            y = e_hi / (e_hi + other_lo) * (1 + 2.0**-50)
            # np.clip(., 0, 1), a tie keeping the value; a row in row_nan the whole line
            x = 0.0 if (x != x or x < 0) else (1.0 if x > 1 else x)
            y = 1.0 if y != y else (0.0 if y < 0 else (1.0 if y > 1 else y))
            out_lo[o + j] = -_INF if row_nan[r] else x
            out_hi[o + j] = _INF if row_nan[r] else y
