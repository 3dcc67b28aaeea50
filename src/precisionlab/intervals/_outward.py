"""Outward-rounded float64 building blocks: neighbours, sums, products, powers, exp and log bounds.

Every function returns a float64 bound that holds for the exact real result: a lower bound is
rounded down, an upper bound up. Where a float64 computation overflows from finite operands
the true value is finite but beyond float64, so a lower bound keeps the largest float64 and an
upper bound goes to +inf (and symmetrically below).
"""

from __future__ import annotations

import math

import numpy as np

_F64 = np.float64
_TINY = 5e-324  # the smallest positive float64 (subnormal)
_MAX64 = float(np.finfo(np.float64).max)
_INF = math.inf


def _f64(x) -> np.ndarray:
    """x as a float64 array (torch tensors detached and widened exactly)."""
    if hasattr(x, "detach"):
        x = x.detach().cpu().double().numpy()
    return np.asarray(x, dtype=_F64)


def _dn(x) -> np.ndarray:
    """The next float64 below x (x itself when infinite or NaN): a lower bound after one RN step."""
    x = np.asarray(x, dtype=_F64)
    return np.where(np.isfinite(x), np.nextafter(x, -np.inf), x)


def _up(x) -> np.ndarray:
    """The next float64 above x (x itself when infinite or NaN): an upper bound after one RN step."""
    x = np.asarray(x, dtype=_F64)
    return np.where(np.isfinite(x), np.nextafter(x, np.inf), x)


def _dn_from_finite(raw, finite) -> np.ndarray:
    """_dn(raw), but max64 where raw overflowed to +inf from finite operands (the true value is finite)."""
    return np.where(finite & (raw == _INF), _MAX64, _dn(raw))


def _up_from_finite(raw, finite) -> np.ndarray:
    """_up(raw), but -max64 where raw overflowed to -inf from finite operands."""
    return np.where(finite & (raw == -_INF), -_MAX64, _up(raw))


def _tree(x: np.ndarray) -> np.ndarray:
    """Sum over the last axis by a fixed pairwise tree of float64 adds (the same bits on every CPU)."""
    x = np.asarray(x, dtype=_F64)
    if x.shape[-1] == 0:
        return np.zeros(x.shape[:-1])
    while x.shape[-1] > 1:
        m = x.shape[-1]
        if m % 2:
            x = np.concatenate([x, np.zeros((*x.shape[:-1], 1))], axis=-1)
            m += 1
        x = x[..., : m // 2] + x[..., m // 2:]
    return x[..., 0]


def _tree_slack(t: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(s, e): s = _tree(t) and |s - sum t| <= e, e an upper bound (gamma_depth sum |t|, generous)."""
    n = t.shape[-1]
    with np.errstate(over="ignore", invalid="ignore"):
        s = _tree(t)
    if n <= 1:
        return s, np.zeros_like(s)
    depth = math.ceil(math.log2(n))
    with np.errstate(invalid="ignore", over="ignore"):
        a = _tree(np.abs(t))
    # |s - sum t| <= gamma_depth sum|t| and sum|t| <= a / (1 - gamma_depth): (depth + 2) 2^-52 a
    # covers both, and the rounding of this product; _TINY covers its underflow.
    return s, a * ((depth + 2) * 2.0**-52) + _TINY


_SCALE = 2.0**-64  # sums that overflow float64 are redone on terms scaled by this power of two


def _sum_bound(t: np.ndarray, sign: int) -> np.ndarray:
    """A float64 bound (sign -1: lower, +1: upper) of the exact sum of t over the last axis.

    Infinite terms give the infinite sum (+inf and -inf together: the bound the side asks for
    is infinite on that side). Finite terms whose float64 sum overflows are summed again
    scaled by 2^-64 (each scaled term off by at most 2^-1075, charged), then scaled back.
    """
    t = np.asarray(t, dtype=_F64)
    fin = np.isfinite(t)
    tf = np.where(fin, t, 0.0)
    s, e = _tree_slack(tf)
    with np.errstate(invalid="ignore", over="ignore"):
        b = _dn(s - e) if sign < 0 else _up(s + e)
    bad = ~np.isfinite(b)
    if np.any(bad):
        s2, e2 = _tree_slack(tf * _SCALE)
        e2 = e2 + t.shape[-1] * _TINY
        with np.errstate(invalid="ignore", over="ignore"):
            b2 = (_dn(s2 - e2) if sign < 0 else _up(s2 + e2)) / _SCALE
        if sign < 0:  # a lower bound past the top of float64: the true sum exceeds max64
            b2 = np.where(b2 == _INF, _MAX64, b2)
        else:
            b2 = np.where(b2 == -_INF, -_MAX64, b2)
        b = np.where(bad, b2, b)
    pos = np.any(t == _INF, axis=-1)
    neg = np.any(t == -_INF, axis=-1)
    if sign < 0:
        b = np.where(neg, -_INF, np.where(pos, _INF, b))
    else:
        b = np.where(pos, _INF, np.where(neg, -_INF, b))
    return b


def _sum_dn(t: np.ndarray) -> np.ndarray:
    """A float64 lower bound of the exact sum of t over the last axis."""
    return _sum_bound(t, -1)


def _sum_up(t: np.ndarray) -> np.ndarray:
    """A float64 upper bound of the exact sum of t over the last axis."""
    return _sum_bound(t, +1)


def _empty(lo, hi) -> np.ndarray:
    """Elements whose real part is empty (lo > hi: encoded as [+inf, -inf], the value can only be NaN)."""
    return np.asarray(lo) > np.asarray(hi)


def _mul_box(alo, ahi, blo, bhi) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(lo, hi, nan): the real products a b over two boxes of extended reals, rounded outward, and
    where IEEE's 0 * inf = NaN can occur.

    A corner 0 * inf stands for products of a finite factor near 0 with a huge one: it is 0
    when the infinite factor's interval holds finite values, and no real product otherwise.
    An empty factor (NaN only) gives an empty product.
    """
    alo, ahi, blo, bhi = np.broadcast_arrays(*(np.asarray(v, dtype=_F64) for v in (alo, ahi, blo, bhi)))
    if all(np.isfinite(v).all() for v in (alo, ahi, blo, bhi)):  # finite boxes: the four corners
        with np.errstate(over="ignore"):
            c = (alo * blo, alo * bhi, ahi * blo, ahi * bhi)
        lo = np.minimum(np.minimum(c[0], c[1]), np.minimum(c[2], c[3]))
        hi = np.maximum(np.maximum(c[0], c[1]), np.maximum(c[2], c[3]))
        return (_dn_from_finite(lo, True), _up_from_finite(hi, True),
                _empty(alo, ahi) | _empty(blo, bhi))
    lo = np.full(alo.shape, np.nan)
    hi = np.full(alo.shape, np.nan)
    with np.errstate(invalid="ignore", over="ignore"):
        for x, y in ((alo, blo), (alo, bhi), (ahi, blo), (ahi, bhi)):
            c = x * y
            finite_member = np.where(np.isinf(x), alo != ahi, blo != bhi)
            c = np.where(np.isnan(c) & finite_member, 0.0, c)
            lo = np.fmin(lo, c)
            hi = np.fmax(hi, c)
    finite = np.isfinite(alo) & np.isfinite(ahi) & np.isfinite(blo) & np.isfinite(bhi)
    empty = _empty(alo, ahi) | _empty(blo, bhi) | np.isnan(lo)
    zero_a = (alo <= 0) & (ahi >= 0)
    zero_b = (blo <= 0) & (bhi >= 0)
    inf_a = (alo == -_INF) | (ahi == _INF)
    inf_b = (blo == -_INF) | (bhi == _INF)
    nan = (zero_a & inf_b) | (inf_a & zero_b)
    lo = np.where(empty, _INF, _dn_from_finite(lo, finite))
    hi = np.where(empty, -_INF, _up_from_finite(hi, finite))
    return lo, hi, nan | empty


def _mul_bounds(alo, ahi, blo, bhi) -> tuple[np.ndarray, np.ndarray]:
    """[min, max] of the four corner products, rounded outward in float64 (finite boxes)."""
    lo, hi, _ = _mul_box(alo, ahi, blo, bhi)
    return lo, hi


def _growth(u: float, d) -> np.ndarray:
    """An upper bound of (1 + u)^d - 1 for integer d >= 0 (binary powering, each step rounded up)."""
    d = np.asarray(d, dtype=np.int64)
    base = np.full(d.shape, float(_up(1.0 + u)) if (1.0 + u) - 1.0 != u else 1.0 + u)
    result = np.ones(d.shape)
    e = d.copy()
    with np.errstate(over="ignore"):
        while np.any(e > 0):
            odd = (e & 1) == 1
            result = np.where(odd, _up(result * base), result)
            base = _up(base * base)
            e = e >> 1
    return _up(result - 1.0)


# exp64/log64 (precisionlab.emulate) are accurate to a few float64 ulps (tests/test_intervals.py
# checks them against mpmath); the bounds below allow 2^-44 relative, about 256 ulps.
_REL64 = 2.0**-44


def _exp64(x: np.ndarray) -> np.ndarray:
    import torch

    from ..emulate import exp64

    return exp64(torch.from_numpy(np.ascontiguousarray(x, dtype=_F64))).numpy()


def _log64(x: np.ndarray) -> np.ndarray:
    import torch

    from ..emulate import log64

    return log64(torch.from_numpy(np.ascontiguousarray(x, dtype=_F64))).numpy()


def _exp_dn(x) -> np.ndarray:
    """A lower bound of e^x (float64; max64 where e^x overflows float64, +inf at x = +inf)."""
    x = _f64(x)
    y = _exp64(x)
    with np.errstate(invalid="ignore", over="ignore"):
        lo = _dn(y * (1 - _REL64) - 2 * _TINY)
    lo = np.where(np.isinf(y), _MAX64, lo)
    lo = np.where(x == _INF, _INF, lo)
    return np.maximum(lo, 0.0)


def _exp_up(x) -> np.ndarray:
    """An upper bound of e^x (float64)."""
    y = _exp64(_f64(x))
    with np.errstate(over="ignore"):
        return _up(y * (1 + _REL64) + 2 * _TINY)


def _log_dn(x) -> np.ndarray:
    """A lower bound of ln x for x > 0."""
    y = _log64(_f64(x))
    with np.errstate(invalid="ignore"):
        return _dn(y - np.abs(y) * _REL64 - 2.0**-1000)


def _log_up(x) -> np.ndarray:
    """An upper bound of ln x for x > 0."""
    y = _log64(_f64(x))
    with np.errstate(invalid="ignore"):
        return _up(y + np.abs(y) * _REL64 + 2.0**-1000)
