"""Outward rounding: float64 neighbours, sums, products, powers, exp and log bounds, and ranges
rounded outward into a format.

Every function returns a float64 bound that holds for the exact real result: a lower bound is
rounded down, an upper bound up. Where a float64 computation overflows from finite operands
the true value is finite but beyond float64, so a lower bound keeps the largest float64 and an
upper bound goes to +inf (and symmetrically below).
"""

from __future__ import annotations

import math

import numpy as np
import torch

from ..emulate import exp64, log64
from ..formats import FloatFormat, get_format
from ..gpu import as_float64
from ..rounding import round_to

__all__ = [
    "INF", "MAX64", "ROUND_OUT_COMPILED_MIN", "TINY", "down", "down_from_finite", "empty_range",
    "exp_array", "exp_down", "exp_up", "growth", "log_array", "log_down", "log_up", "mul_box", "round_out",
    "rounding_unit", "sum_down", "sum_up", "tree_sum", "up", "up_from_finite", "widen",
]

TINY = 5e-324  # the smallest positive float64 (subnormal)
MAX64 = float(np.finfo(np.float64).max)
INF = math.inf


def down(x) -> np.ndarray:
    """The next float64 below x (x itself when infinite or NaN): a lower bound after one RN step."""
    x = np.asarray(x, dtype=np.float64)
    return np.where(np.isfinite(x), np.nextafter(x, -np.inf), x)


def up(x) -> np.ndarray:
    """The next float64 above x (x itself when infinite or NaN): an upper bound after one RN step."""
    x = np.asarray(x, dtype=np.float64)
    return np.where(np.isfinite(x), np.nextafter(x, np.inf), x)


def down_from_finite(raw, finite) -> np.ndarray:
    """down(raw), but max64 where raw overflowed to +inf from finite operands (the true value is finite)."""
    return np.where(finite & (raw == INF), MAX64, down(raw))


def up_from_finite(raw, finite) -> np.ndarray:
    """up(raw), but -max64 where raw overflowed to -inf from finite operands."""
    return np.where(finite & (raw == -INF), -MAX64, up(raw))


def tree_sum(x: np.ndarray) -> np.ndarray:
    """Sum over the last axis by a fixed pairwise tree of float64 adds (the same bits on every CPU)."""
    x = np.asarray(x, dtype=np.float64)
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
    """(s, e): s = tree_sum(t) and |s - sum t| <= e, e an upper bound (gamma_depth sum |t|, generous)."""
    n = t.shape[-1]
    with np.errstate(over="ignore", invalid="ignore"):
        s = tree_sum(t)
    if n <= 1:
        return s, np.zeros_like(s)
    depth = math.ceil(math.log2(n))
    with np.errstate(invalid="ignore", over="ignore"):
        a = tree_sum(np.abs(t))
    # |s - sum t| <= gamma_depth sum|t| and sum|t| <= a / (1 - gamma_depth): (depth + 2) 2^-52 a
    # covers both, and the rounding of this product; TINY covers its underflow.
    return s, a * ((depth + 2) * 2.0**-52) + TINY


_SCALE = 2.0**-64  # sums that overflow float64 are redone on terms scaled by this power of two


def _sum_bound(t: np.ndarray, sign: int) -> np.ndarray:
    """A float64 bound (sign -1: lower, +1: upper) of the exact sum of t over the last axis.

    Infinite terms give the infinite sum (+inf and -inf together: the bound the side asks for
    is infinite on that side). Finite terms whose float64 sum overflows are summed again
    scaled by 2^-64 (each scaled term off by at most 2^-1075, charged), then scaled back.
    """
    t = np.asarray(t, dtype=np.float64)
    fin = np.isfinite(t)
    tf = np.where(fin, t, 0.0)
    s, e = _tree_slack(tf)
    with np.errstate(invalid="ignore", over="ignore"):
        b = down(s - e) if sign < 0 else up(s + e)
    bad = ~np.isfinite(b)
    if np.any(bad):
        s2, e2 = _tree_slack(tf * _SCALE)
        e2 = e2 + t.shape[-1] * TINY
        with np.errstate(invalid="ignore", over="ignore"):
            b2 = (down(s2 - e2) if sign < 0 else up(s2 + e2)) / _SCALE
        if sign < 0:  # a lower bound past the top of float64: the true sum exceeds max64
            b2 = np.where(b2 == INF, MAX64, b2)
        else:
            b2 = np.where(b2 == -INF, -MAX64, b2)
        b = np.where(bad, b2, b)
    pos = np.any(t == INF, axis=-1)
    neg = np.any(t == -INF, axis=-1)
    if sign < 0:
        b = np.where(neg, -INF, np.where(pos, INF, b))
    else:
        b = np.where(pos, INF, np.where(neg, -INF, b))
    return b


def sum_down(t: np.ndarray) -> np.ndarray:
    """A float64 lower bound of the exact sum of t over the last axis."""
    return _sum_bound(t, -1)


def sum_up(t: np.ndarray) -> np.ndarray:
    """A float64 upper bound of the exact sum of t over the last axis."""
    return _sum_bound(t, +1)


def empty_range(lo, hi) -> np.ndarray:
    """Elements whose real part is empty (lo > hi: encoded as [+inf, -inf], the value can only be NaN)."""
    return np.asarray(lo) > np.asarray(hi)


def mul_box(alo, ahi, blo, bhi) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(lo, hi, nan): the real products a b over two boxes of extended reals, rounded outward, and
    where IEEE's 0 * inf = NaN can occur.

    A corner 0 * inf stands for products of a finite factor near 0 with a huge one: it is 0
    when the infinite factor's interval holds finite values, and no real product otherwise.
    An empty factor (NaN only) gives an empty product.
    """
    alo, ahi, blo, bhi = np.broadcast_arrays(*(np.asarray(v, dtype=np.float64) for v in (alo, ahi, blo, bhi)))
    if all(np.isfinite(v).all() for v in (alo, ahi, blo, bhi)):  # finite boxes: the four corners
        with np.errstate(over="ignore"):
            c = (alo * blo, alo * bhi, ahi * blo, ahi * bhi)
        lo = np.minimum(np.minimum(c[0], c[1]), np.minimum(c[2], c[3]))
        hi = np.maximum(np.maximum(c[0], c[1]), np.maximum(c[2], c[3]))
        return (down_from_finite(lo, True), up_from_finite(hi, True),
                empty_range(alo, ahi) | empty_range(blo, bhi))
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
    empty = empty_range(alo, ahi) | empty_range(blo, bhi) | np.isnan(lo)
    zero_a = (alo <= 0) & (ahi >= 0)
    zero_b = (blo <= 0) & (bhi >= 0)
    inf_a = (alo == -INF) | (ahi == INF)
    inf_b = (blo == -INF) | (bhi == INF)
    nan = (zero_a & inf_b) | (inf_a & zero_b)
    lo = np.where(empty, INF, down_from_finite(lo, finite))
    hi = np.where(empty, -INF, up_from_finite(hi, finite))
    return lo, hi, nan | empty


def growth(u: float, d) -> np.ndarray:
    """An upper bound of (1 + u)^d - 1 for integer d >= 0 (binary powering, each step rounded up)."""
    d = np.asarray(d, dtype=np.int64)
    base = np.full(d.shape, float(up(1.0 + u)) if (1.0 + u) - 1.0 != u else 1.0 + u)
    result = np.ones(d.shape)
    e = d.copy()
    with np.errstate(over="ignore"):
        while np.any(e > 0):
            odd = (e & 1) == 1
            result = np.where(odd, up(result * base), result)
            base = up(base * base)
            e = e >> 1
    return up(result - 1.0)


# exp64/log64 (precisionlab.emulate) are accurate to a few float64 ulps (tests/test_intervals.py
# checks them against mpmath); the bounds below allow 2^-44 relative, about 256 ulps.
_REL64 = 2.0**-44


def exp_array(x: np.ndarray) -> np.ndarray:
    """e^x by emulate.exp64 (the same bits on every CPU), for a NumPy array (of x's shape)."""
    x = np.asarray(x, dtype=np.float64)  # ascontiguousarray alone makes a 0-d array 1-d
    return exp64(torch.from_numpy(np.ascontiguousarray(x))).numpy().reshape(x.shape)


def log_array(x: np.ndarray) -> np.ndarray:
    """ln x by emulate.log64 (the same bits on every CPU), for a NumPy array (of x's shape)."""
    x = np.asarray(x, dtype=np.float64)  # ascontiguousarray alone makes a 0-d array 1-d
    return log64(torch.from_numpy(np.ascontiguousarray(x))).numpy().reshape(x.shape)


def exp_down(x) -> np.ndarray:
    """A lower bound of e^x (float64; max64 where e^x overflows float64, +inf at x = +inf)."""
    x = as_float64(x)
    y = exp_array(x)
    with np.errstate(invalid="ignore", over="ignore"):
        lo = down(y * (1 - _REL64) - 2 * TINY)
    lo = np.where(np.isinf(y), MAX64, lo)
    lo = np.where(x == INF, INF, lo)
    return np.maximum(lo, 0.0)


def exp_up(x) -> np.ndarray:
    """An upper bound of e^x (float64)."""
    y = exp_array(as_float64(x))
    with np.errstate(over="ignore"):
        return up(y * (1 + _REL64) + 2 * TINY)


def log_down(x) -> np.ndarray:
    """A lower bound of ln x for x > 0."""
    y = log_array(as_float64(x))
    with np.errstate(invalid="ignore"):
        return down(y - np.abs(y) * _REL64 - 2.0**-1000)


def log_up(x) -> np.ndarray:
    """An upper bound of ln x for x > 0."""
    y = log_array(as_float64(x))
    with np.errstate(invalid="ignore"):
        return up(y + np.abs(y) * _REL64 + 2.0**-1000)


# --------------------------------------------------------------------------- into a format


def rounding_unit(fmt: FloatFormat, mode: str) -> float:
    """The relative error bound of one rounding into fmt: u = eps/2 to nearest, eps for directed/stochastic."""
    return fmt.eps / 2 if mode in ("nearest_even", "nearest_away") else fmt.eps


# round_out rounds with the compiled kernel only from this many values: below it the kernel's
# NumPy tier (the same bits) costs well under the cold compile of a directed-mode loop
# (about 0.5 s; chapter 7's bounds hold at most a few tens of thousands of values)
ROUND_OUT_COMPILED_MIN = 1 << 20


def round_out(lo, hi, fmt) -> tuple[np.ndarray, np.ndarray]:
    """[RD_fmt(lo), RU_fmt(hi)]: the tightest sound bounds on a rounding of any value in [lo, hi] (RU past the top is +inf)."""
    f = get_format(fmt)
    if f.name == "float64":
        return np.array(lo, dtype=np.float64), np.array(hi, dtype=np.float64)
    shape = np.shape(lo)  # (ascontiguousarray makes 0-d arrays 1-d: restore the shape)
    lo = np.ascontiguousarray(lo, dtype=np.float64)
    hi = np.ascontiguousarray(hi, dtype=np.float64)
    compiled = lo.size >= ROUND_OUT_COMPILED_MIN
    with np.errstate(over="ignore", invalid="ignore"):
        return (np.asarray(round_to(lo, f, "down", compiled=compiled),
                           dtype=np.float64).reshape(shape),
                np.asarray(round_to(hi, f, "up", compiled=compiled),
                           dtype=np.float64).reshape(shape))


def widen(lo, hi, fmt, ulps: float) -> tuple[np.ndarray, np.ndarray]:
    """Bounds on a result within `ulps` ulps of an exact value in [lo, hi], in fmt.

    ulps <= 1/2 (correct rounding): directed rounding into fmt. Otherwise
    lo - ulps max(eps |lo|, q) and hi + ulps max(eps |hi|, q), q the smallest subnormal:
    ulp(x) <= max(eps |x|, q) everywhere, and x - ulps max(eps|x|, q) increases with x.
    Infinite ends stay; past the largest finite value the result may be infinite.
    """
    f = get_format(fmt)
    if ulps <= 0.5:
        return round_out(lo, hi, f)
    lo, hi = as_float64(lo), as_float64(hi)
    with np.errstate(invalid="ignore", over="ignore"):
        dlo = up(ulps * np.maximum(up(f.eps * np.abs(lo)), f.min_subnormal))
        dhi = up(ulps * np.maximum(up(f.eps * np.abs(hi)), f.min_subnormal))
        lo2, hi2 = down(lo - dlo), up(hi + dhi)
    lo2 = np.where(np.isinf(lo), lo, lo2)
    hi2 = np.where(np.isinf(hi), hi, hi2)
    if f.name != "float64":
        lo2 = np.where(lo2 < -f.max_finite, -INF, lo2)
        hi2 = np.where(hi2 > f.max_finite, INF, hi2)
        lo2 = np.where(np.isfinite(lo2) & (lo2 > f.max_finite), f.max_finite, lo2)
        hi2 = np.where(np.isfinite(hi2) & (hi2 < -f.max_finite), -f.max_finite, hi2)
    return lo2, hi2
