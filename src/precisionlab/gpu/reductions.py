"""Sums over the last axis in the orders GPUs use, every add rounded into an accumulator format.

The leading axes are independent *lanes*: many vectors, or many random orders of one vector
(pass ``np.broadcast_to(x, (orders, n))``), advance together, so each step of a reduction is
one array operation over all lanes rather than a Python loop per lane. The orders:

=============  ==============================================================================
sequential     acc = x0; acc = fl(acc + x_i) for i = 1 .. n-1 (one thread, a CPU loop)
pairwise       level by level: neighbours (0,1), (2,3), ... are added; an odd last element
               moves up a level unchanged; repeat until one value is left
blocked        consecutive blocks of `block` elements summed sequentially, then the block
               sums summed sequentially (a tiled kernel with one partial per tile)
warp           a thread block of `threads` threads: thread t sums x[t], x[t+T], x[t+2T], ...
               (grid-stride loop); each 32-lane warp combines its lanes with the shuffle-down
               tree (offsets 16, 8, 4, 2, 1); the warp sums are combined by the same tree
split_k        `splits` consecutive chunks summed sequentially, each partial rounded to
               `partial` (the workspace format), then the partials summed in order
atomic         blocks of `block` elements summed sequentially, then the block sums land in the
               accumulator in a random order, drawn per lane from `seed` (block=1: one atomic
               add per element, as in scatter_add / index_add)
kahan          sequential with Kahan's compensation term; every operation rounded
=============  ==============================================================================

Inputs are first rounded into the accumulator format (what loading them into an accumulator
register does); zero padding of partial blocks adds +0, which changes no sum.
"""

from __future__ import annotations

import functools
import math

import numpy as np

from ..checks import check_choice, check_positive_int
from ..formats import FloatFormat, get_format
from ..rounding import round_to, seed_generator
from .arith import CONVERT_NUMPY_MAX, RoundedAdder, progress

__all__ = [
    "DETERMINISTIC_ORDERS",
    "ORDERS",
    "WARP_SIZE",
    "atomic_orders",
    "exact_sum",
    "reduce_sum",
]

ORDERS: tuple[str, ...] = ("sequential", "pairwise", "blocked", "warp", "split_k", "atomic", "kahan")
DETERMINISTIC_ORDERS: tuple[str, ...] = tuple(o for o in ORDERS if o != "atomic")
WARP_SIZE = 32
_SHUFFLE_OFFSETS = (16, 8, 4, 2, 1)


# --------------------------------------------------------------------------- kernels


def _fisher_yates(u, out):  # pragma: no cover - compiled (`_fisher_yates_kernel`)
    """out[l] = a random permutation of 0..m-1: swap i with j = i + floor(u[l, i] * (m - i)).

    u holds uniform [0, 1) float64 draws; floor(u * k) is uniform on 0..k-1 up to a bias
    below k / 2^53, far under anything a histogram of orders could show.
    """
    lanes, m = u.shape
    for lane in range(lanes):
        row = out[lane]
        for i in range(m):
            row[i] = i
        for i in range(m - 1):
            j = min(i + np.int64(u[lane, i] * (m - i)), m - 1)
            t = row[i]
            row[i] = row[j]
            row[j] = t


@functools.cache
def _fisher_yates_kernel():
    """_fisher_yates compiled by numba (or loaded from its cache), numba imported, on first use."""
    import numba  # only long permutations need it (0.7 s to import, a cold compile 0.2 s)

    return numba.njit(cache=True)(_fisher_yates)


# Draws of at most FISHER_YATES_NUMPY_MAX_M entries per permutation and FISHER_YATES_NUMPY_MAX
# in all (lanes x m) run the swaps as NumPy steps over all lanes at once (the same swaps in the
# same order): m - 1 steps of 5-8 us each plus about 30 ns an entry, a few milliseconds at
# most, so a chapter that draws only a few short orders needs no numba at all, where the loop
# (about 1 ns an entry) would first cost numba's import and a cold compile, near a second.
# Longer or larger draws take the loop (few lanes of a long permutation would cost NumPy's
# per-step overhead m times: 1 x 65536 entries take half a second there).
FISHER_YATES_NUMPY_MAX_M = 512
FISHER_YATES_NUMPY_MAX = 1 << 16


def _fisher_yates_numpy(u, out):
    """_fisher_yates as m - 1 NumPy steps, each swapping position i of every lane at once."""
    lanes, m = u.shape
    out[:] = np.arange(m, dtype=out.dtype)
    rows = np.arange(lanes)
    for i in range(m - 1):
        j = np.minimum(i + (u[:, i] * (m - i)).astype(np.int64), m - 1)
        t = out[:, i].copy()
        out[:, i] = out[rows, j]
        out[rows, j] = t


def _gather_transposed(src, perms, out):
    """out[i, l] = src[l or 0, perms[l, i]]: permuted lanes, written step-major.

    Gathered lane by lane (reading perms in its own order), then written transposed: about
    10 ns a value with NumPy alone, where a numba loop (about 2 ns) first costs a cold compile
    per dtype and layout of 0.2-0.5 s, more than it saves below some 10^8 gathered values.
    """
    if src.shape[0] == 1:
        out[...] = np.take(src[0], perms).T
    else:
        out[...] = np.take_along_axis(src, perms, axis=1).T


# --------------------------------------------------------------------------- helpers


_ORDER_CHUNK = 1 << 20  # random draws per chunk of lanes: bounds the float64 scratch memory


def _order_chunks(lanes: int, m: int, generator: np.random.Generator):
    """Yield (first lane, permutations of the next lanes): the one place orders are drawn."""
    step = max(1, _ORDER_CHUNK // m)
    for l0 in progress(range(0, lanes, step), lanes * m, "drawing atomic orders"):
        rows = min(step, lanes - l0)
        perms = np.empty((rows, m), dtype=np.int32)
        small = m <= FISHER_YATES_NUMPY_MAX_M and rows * m <= FISHER_YATES_NUMPY_MAX
        shuffle = _fisher_yates_numpy if small else _fisher_yates_kernel()
        shuffle(generator.random((rows, m)), perms)
        yield l0, perms


def atomic_orders(lanes: int, m: int, *, seed: int) -> np.ndarray:
    """(lanes, m) int32 array whose rows are independent uniform random permutations of 0..m-1.

    reduce_sum(order="atomic", seed=seed) draws its orders exactly this way (from
    np.random.default_rng(seed)), so the same seed gives the same orders (the tests rely on it).
    """
    lanes = check_positive_int(lanes, "lanes")
    m = check_positive_int(m, "m")
    gen = seed_generator(seed)
    return np.concatenate([p for _, p in _order_chunks(lanes, m, gen)])


def exact_sum(x) -> np.ndarray:
    """sum(x) over the last axis, correctly rounded to float64 (math.fsum per lane)."""
    a = np.asarray(x, dtype=np.float64)
    flat = a.reshape(-1, a.shape[-1]) if a.ndim else a.reshape(1, 1)
    out = np.array([math.fsum(row) for row in flat], dtype=np.float64)
    return out.reshape(a.shape[:-1]) if a.ndim else out.reshape(())


def _shared_rows(x: np.ndarray) -> bool:
    """True when every lane of x is the same vector (leading axes broadcast with stride 0)."""
    return x.ndim >= 2 and x.shape[-1] > 0 and all(s == 0 for s in x.strides[:-1])


def _sequential(add, v: np.ndarray) -> np.ndarray:
    """Sum v along axis 0 in index order: acc = v[0]; acc = add(acc, v[i])."""
    acc = v[0].copy()
    for i in progress(range(1, v.shape[0]), v.size, "simulated adds"):
        acc = add(acc, v[i])
    return acc


def _pad_rows(v: np.ndarray, rows: int) -> np.ndarray:
    """v (m, ...) with zero rows appended up to `rows` rows."""
    if v.shape[0] == rows:
        return v
    pad = np.zeros((rows - v.shape[0], *v.shape[1:]), dtype=v.dtype)
    return np.concatenate([v, pad])


def _pairwise(add, v: np.ndarray) -> np.ndarray:
    while v.shape[0] > 1:
        m = v.shape[0]
        h = m // 2
        pairs = add(v[0:2 * h:2], v[1:2 * h:2])
        v = pairs if m % 2 == 0 else np.concatenate([pairs, v[m - 1:m]])
    return v[0].copy()


def _chunks(add, v: np.ndarray, size: int) -> np.ndarray:
    """Sequential sums of consecutive chunks of `size` rows of v (m, L): returns (ceil(m/size), L)."""
    nb = -(-v.shape[0] // size)
    blocks = _pad_rows(v, nb * size).reshape((nb, size, *v.shape[1:]))
    return _sequential(add, np.ascontiguousarray(np.moveaxis(blocks, 1, 0)))


def _shuffle_tree(add, v: np.ndarray) -> np.ndarray:
    """Warp shuffle-down reduction along axis 1 of v (g, 32, L): lane i += lane i + offset."""
    for off in _SHUFFLE_OFFSETS:
        v = add(v[:, :off], v[:, off:2 * off])
    return v[:, 0]


def _warp(add, v: np.ndarray, threads: int) -> np.ndarray:
    rows = -(-v.shape[0] // threads)
    per_thread = _sequential(add, _pad_rows(v, rows * threads).reshape((rows, threads, *v.shape[1:])))
    warps = threads // WARP_SIZE
    warp_sums = _shuffle_tree(add, per_thread.reshape((warps, WARP_SIZE, *v.shape[1:])))
    first = _pad_rows(warp_sums, WARP_SIZE).reshape((1, WARP_SIZE, *v.shape[1:]))
    return _shuffle_tree(add, first)[0]


def _rounded_per_lane(order: str, n: int, block: int, splits: int, threads: int) -> int:
    """About how many values one lane's sum of n terms rounds in `order` (the loads included):
    what tells whether rounding's NumPy tier finishes before a cold compile would."""
    padded = {"blocked": -(-n // block) * block, "atomic": -(-n // block) * block,
              "warp": -(-n // threads) * threads + WARP_SIZE,
              "split_k": -(-n // splits) * splits + splits, "kahan": 4 * n}
    return n + padded.get(order, n)  # sequential, pairwise: n - 1 adds


def _kahan(adder: RoundedAdder, v: np.ndarray) -> np.ndarray:
    s = v[0].copy()
    c = np.zeros_like(s)
    for i in range(1, v.shape[0]):
        y = adder.sub(v[i], c)
        t = adder.add(s, y)
        c = adder.sub(adder.sub(t, s), y)
        s = t
    return s


# --------------------------------------------------------------------------- public API


def reduce_sum(x, order: str = "sequential", acc: str | FloatFormat = "float32",
               out: str | FloatFormat | None = None, *, mode: str = "nearest_even",
               seed: int | None = None, block: int = 32, splits: int = 4,
               threads: int = 256, partial: str | FloatFormat | None = None):
    """S = x_0 + ... + x_{n-1} over the last axis in `order`, each add fl_acc(a + b), then fl_out(S).

    x: array (or torch tensor) of shape (..., n); leading axes are independent lanes.
    order: one of ORDERS (see the module docstring). acc: the accumulator format; out: the
    output format (default acc). mode: the rounding mode of every rounding. seed: required for
    order="atomic" and mode="stochastic"; the orders and the stochastic roundings draw, in
    turn, from one np.random.default_rng(seed). block (blocked, atomic), splits and partial
    (split_k), threads (warp; a multiple of 32, at most 1024) shape the order.
    Returns a float64 array of shape x.shape[:-1] (a float64 scalar for 1-D x) whose values
    are values of `out`.
    """
    check_choice(order, "order", ORDERS)
    acc_fmt = get_format(acc)
    out_fmt = acc_fmt if out is None else get_format(out)
    block = check_positive_int(block, "block")
    splits = check_positive_int(splits, "splits")
    threads = check_positive_int(threads, "threads", upper=1024)
    if threads % WARP_SIZE:
        raise ValueError(f"threads must be a multiple of {WARP_SIZE}; got threads={threads}")
    if seed is None and (order == "atomic" or mode == "stochastic"):
        what = "order='atomic' draws its orders" if order == "atomic" else "stochastic rounding draws"
        raise ValueError(f"{what} at random: pass seed=<int>; got seed=None")
    gen = None if seed is None else seed_generator(seed)
    RoundedAdder(acc_fmt, mode, gen)  # validates mode before x is read

    if hasattr(x, "detach"):  # torch tensor: exact widening to float64 on the CPU
        x = x.detach().cpu().double().numpy()
    xa = np.asarray(x)
    if xa.ndim == 0 or xa.shape[-1] == 0:
        raise ValueError(f"x must have a non-empty last axis to sum over; got shape {xa.shape}")
    lead = xa.shape[:-1]
    n = xa.shape[-1]
    lanes = math.prod(lead)
    adder = RoundedAdder(acc_fmt, mode, gen, work=lanes * _rounded_per_lane(order, n, block,
                                                                          splits, threads))
    shared = _shared_rows(xa) and mode != "stochastic"
    if shared:  # every lane holds the same vector: convert (and, if deterministic, sum) it once
        rows = adder.convert(xa[(0,) * len(lead)].reshape(1, n))
    else:
        rows = adder.convert(xa.reshape(lanes, n))

    if order == "atomic":
        if block == 1:
            parts_lm = rows  # (1 or L, n): every element is its own atomic add
        else:
            parts_lm = np.ascontiguousarray(_chunks(adder.add, np.ascontiguousarray(rows.T), block).T)
        m = parts_lm.shape[1]
        steps = np.empty((m, lanes), dtype=adder.dtype)
        for l0, perms in _order_chunks(lanes, m, gen):
            src = parts_lm if parts_lm.shape[0] == 1 else parts_lm[l0:l0 + len(perms)]
            _gather_transposed(src, perms, steps[:, l0:l0 + len(perms)])
        total = _sequential(adder.add, steps)
    else:
        v = np.ascontiguousarray(rows.T)  # (n, L): the summed axis first, lanes contiguous
        if order == "sequential":
            total = _sequential(adder.add, v)
        elif order == "pairwise":
            total = _pairwise(adder.add, v)
        elif order == "blocked":
            total = _sequential(adder.add, _chunks(adder.add, v, block))
        elif order == "warp":
            total = _warp(adder.add, v, threads)
        elif order == "split_k":
            parts = _chunks(adder.add, v, -(-n // splits))
            if partial is not None:
                parts = adder.convert(round_to(parts.astype(np.float64), get_format(partial), mode,
                                               generator=gen,
                                               compiled=parts.size > CONVERT_NUMPY_MAX))
            total = _sequential(adder.add, parts)
        else:  # kahan
            total = _kahan(adder, v)
        if shared:
            total = np.broadcast_to(total, (lanes,))

    # The output rounds each sum once, as convert loads each input once: on rounding's NumPy
    # tier up to CONVERT_NUMPY_MAX values (cheaper than a cold compile there; the same bits).
    result = np.asarray(round_to(np.ascontiguousarray(total, dtype=np.float64), out_fmt, mode,
                                 generator=gen, compiled=lanes > CONVERT_NUMPY_MAX),
                        dtype=np.float64)
    return result.reshape(lead)[()] if lead else result.reshape(())[()]
