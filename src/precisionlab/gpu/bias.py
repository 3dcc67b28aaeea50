"""Where a low-precision running sum picks up its error: each add's rounding, split by binade.

A sequential sum S <- fl(S + t) makes one rounding error per add, fl(S + t) - (S + t), on
the grid of the binade that S + t falls in. `add_errors_by_binade` replays the same adds
as `reduce_sum(order="atomic", block=1)` for given orders and books every error to the
binade [2^e, 2^(e+1)) of the exact S + t, and within it to a band of the term's size in
ulps of that binade. The errors of all adds plus the rounding of the terms into the
accumulator add up to S - sum(x) exactly, so the table says *where* a bias comes from.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..exact import as_float64, two_sum
from ..formats import FloatFormat, get_format
from ..rounding import round_to
from .arith import RoundedAdder
from .reductions import exact_sum

__all__ = ["BinadeSplit", "add_errors_by_binade"]


@dataclass(frozen=True)
class BinadeSplit:
    """Rounding errors of a sequential sum booked by binade of S + t (means over the orders)."""

    exponents: np.ndarray  # (B,) e: adds whose exact result |S + t| lies in [2^e, 2^(e+1))
    ulp: np.ndarray  # (B,) the accumulator's spacing in that binade
    adds: np.ndarray  # (B,) adds per order
    up: np.ndarray  # (B,) adds per order that rounded up (fl(S + t) > S + t)
    down: np.ndarray  # (B,) adds per order that rounded down
    error: np.ndarray  # (B,) summed error fl(S + t) - (S + t) per order
    band_edges: np.ndarray  # (K,) band k holds edges[k] <= |t| / ulp(binade) < edges[k + 1]
    band_adds: np.ndarray  # (B, K) adds per order by band of the term's size (last: open above)
    band_error: np.ndarray  # (B, K) summed error per order by band
    load_error: float  # sum(fl(x)) - sum(x): rounding the terms into the accumulator
    exact: float  # sum(x), correctly rounded to float64
    sums: np.ndarray  # (lanes,) the final S of every order (= reduce_sum atomic, block=1)

    @property
    def total(self) -> float:
        """mean(S) - sum(x) = load_error + sum of the per-binade errors (float64)."""
        return self.load_error + float(np.sum(self.error))


def _binade(hi: np.ndarray, lo: np.ndarray) -> np.ndarray:
    """floor(log2 |hi + lo|) for hi = fl64(hi + lo), exact also just below a power of two."""
    m, e = np.frexp(np.abs(hi))  # |hi| = m 2^e, m in [0.5, 1)
    below = (m == 0.5) & (lo * np.sign(hi) < 0)  # hi rounded up onto a power of two
    return (e - 1 - below).astype(np.int64)


def add_errors_by_binade(x, orders, acc: str | FloatFormat = "bfloat16",
                         band_edges=(0.0, 0.5, 1.0, 1.5, 2.0)) -> BinadeSplit:
    """Per binade e of S + t: adds, and sum of fl_acc(S + t) - (S + t), over S <- fl(S + x[orders[l, i]]).

    x: the n terms (1-D, rounded into acc first, as reduce_sum does); orders: (lanes, n)
    permutations of 0..n-1 (e.g. gpu.atomic_orders). The sum starts from S = 0 and rounds to
    nearest even. band_edges: increasing edges, from 0, of |t| / ulp(binade) for the band split.
    """
    fmt = get_format(acc)
    xa = as_float64(x)
    if xa.ndim != 1 or xa.size == 0 or not np.all(np.isfinite(xa)):
        raise ValueError(f"x must be a non-empty 1-D array of finite values; got shape {xa.shape}")
    o = np.asarray(orders)
    n = xa.size
    if o.ndim != 2 or o.shape[1] != n or not np.issubdtype(o.dtype, np.integer):
        raise ValueError(f"orders must be an integer array of shape (lanes, {n}); got "
                         f"{o.dtype} array of shape {o.shape}")
    if not np.array_equal(np.sort(o, axis=1), np.broadcast_to(np.arange(n), o.shape)):
        raise ValueError("orders must hold a permutation of 0..n-1 in every row")
    edges = np.asarray(band_edges, dtype=np.float64)
    if edges.ndim != 1 or edges.size < 2 or edges[0] != 0 or np.any(np.diff(edges) <= 0):
        raise ValueError(f"band_edges must increase from 0 with at least two edges; "
                         f"got band_edges={band_edges!r}")
    if fmt.name == "float64":
        raise ValueError("acc must be narrower than float64 (the errors are measured in float64); "
                         "got acc='float64'")

    adder = RoundedAdder(fmt)
    loads = np.asarray(round_to(xa, fmt), dtype=np.float64)
    lanes = o.shape[0]
    lo_e, hi_e = fmt.emin - 1, fmt.emax + 1  # every binade a sum of fmt values can reach
    nb, nk = hi_e - lo_e + 1, edges.size
    adds = np.zeros(nb)
    up = np.zeros(nb)
    down = np.zeros(nb)
    err_sum = np.zeros(nb)
    band_adds = np.zeros(nb * nk)
    band_err = np.zeros(nb * nk)
    s = np.zeros(lanes)
    held = loads.astype(adder.dtype)  # the terms in the adder's container (exactly)
    for i in range(n):
        t = loads[o[:, i]]
        # s and t are values of fmt: add's one rounding (in float32 words for the narrow
        # formats, by innocuous double rounding) is the correctly rounded sum, as add_any's
        # round to odd in float64 is, with a quarter of the work
        new = np.asarray(adder.add(s.astype(adder.dtype), held[o[:, i]]), dtype=np.float64)
        hi, lo = two_sum(s, t)
        err = (new - hi) - lo  # new - hi is exact (Sterbenz): the two are within a factor 2
        live = hi != 0
        e = np.where(live, _binade(hi, lo), lo_e)
        e = np.clip(e, lo_e, hi_e) - lo_e
        spacing = np.ldexp(1.0, np.maximum(e + lo_e, fmt.emin) - fmt.mantissa_bits)
        band = np.searchsorted(edges, np.abs(t) / spacing, side="right") - 1
        w = live.astype(np.float64)
        adds += np.bincount(e, weights=w, minlength=nb)
        up += np.bincount(e, weights=(err > 0).astype(np.float64), minlength=nb)
        down += np.bincount(e, weights=(err < 0).astype(np.float64), minlength=nb)
        err_sum += np.bincount(e, weights=err, minlength=nb)
        cell = e * nk + band
        band_adds += np.bincount(cell, weights=w, minlength=nb * nk)
        band_err += np.bincount(cell, weights=err, minlength=nb * nk)
        s = new
    used = np.flatnonzero(adds > 0)
    exps = used + lo_e
    exact = float(exact_sum(xa))
    return BinadeSplit(
        exponents=exps.astype(np.int64),
        ulp=np.ldexp(1.0, np.maximum(exps, fmt.emin) - fmt.mantissa_bits),
        adds=adds[used] / lanes, up=up[used] / lanes, down=down[used] / lanes,
        error=err_sum[used] / lanes, band_edges=edges,
        band_adds=band_adds.reshape(nb, nk)[used] / lanes,
        band_error=band_err.reshape(nb, nk)[used] / lanes,
        load_error=float(exact_sum(np.concatenate([loads, -xa]))),
        exact=exact, sums=s,
    )
