"""All-reduce orders: how W ranks' partial sums become one sum, every add rounded once.

Rank r holds a vector x_r (its local gradient, a partial sum over its share of the batch).
An all-reduce leaves S = x_0 + ... + x_{W-1} on every rank; the algorithm decides which
additions happen in which order, and so which bits S gets. The all-gather phase only copies,
so every rank ends with the same bits. The orders, per element (indices mod W):

============  ==========================================================================
sequential    rank order: ((x_0 + x_1) + x_2) + ... (a reduce to rank 0, one rank at a time)
ring          NCCL's ring for one channel and one loop (small tensors, ring order = rank
              order): the vector is cut into W contiguous chunks of ceil(n / W) elements;
              chunk c starts on rank c+1 and travels c+1 -> c+2 -> ... -> c, each rank adding
              its own values: S = (((x_{c+1} + x_{c+2}) + ...) + x_{c-1}) + x_c
gloo          gloo's ring (gloo/allreduce.cc, ``ring``; what torch.distributed's gloo back end
              runs on CPU tensors, tested against torch 2.13): the vector is cut into
              G = W * ceil(max(ceil(bytes / 1 MiB), 2W) / W) segments of
              ceil(ceil(bytes / G) / size) elements (size: bytes per element), W chunks of
              G / W consecutive segments; chunk q starts on rank q-1 and travels *down*:
              S = (((x_{q-1} + x_{q-2}) + ...) + x_{q+1}) + x_q
tree          NCCL's binary tree (ncclGetBtree, one rank per node): rank 0 is the root with
              one child, every other rank r adds its children's subtree sums to its own
              values, fl(fl(x_r + S_d0) + S_d1), d0 = r - b/2 and d1 = r + b/2 (b the lowest
              set bit of r; d1 moved down while it is >= W)
double_tree   NCCL's double binary tree (ncclGetDtree): the first ceil(n / 2) elements are
              reduced on the tree above, the rest on the second tree (the first one mirrored,
              r -> W-1-r, for even W; shifted by one, r -> r+1, for odd W)
============  ==========================================================================

Our assumptions, stated once. The NCCL orders are read from NCCL's source (the ring and tree
kernels of src/device/all_reduce.h, src/graph/trees.cc) and never measured here (no GPU): the
ring order and node order are the rank order; one channel and one loop, so element j's chunk
is j // ceil(n / W) (NCCL's channels, loops and protocol cut large tensors into other
chunks); NCCL builds its trees over *nodes* and chains the GPUs inside a node, and we put one
rank on each node; a rank's own values come first in a tree node's sum, then the children in
ncclGetBtree's order; the double tree splits the data between two halves of its channels, and
we give each tree one contiguous half. gloo's order is the one measured
(tests/test_gpu_collectives_gloo.py compares the bits with torch.distributed): gloo's ring is
what an unspecified algorithm gets; a shared-memory intra-node all-reduce that adds the ranks
in rank order (our `sequential`) was merged into gloo in January 2026 and reverted in
February, and torch 2.13's gloo has none.

Values are first rounded into the reduction format (what casting a gradient to FSDP's
``reduce_dtype`` does); every add is then fl(a + b) by `RoundedAdder`. `data_parallel_sum`
sums each rank's examples in float32 first (the backward's accumulator), so a bfloat16
reduction format rounds each rank's gradient once and then every add of the all-reduce.
"""

from __future__ import annotations

import numpy as np

from ..checks import check_choice, check_positive_int
from ..formats import FloatFormat, get_format
from .arith import RoundedAdder
from .reductions import reduce_sum

__all__ = [
    "COLLECTIVE_ORDERS",
    "GLOO_MAX_SEGMENT_BYTES",
    "REDUCE_FORMATS",
    "allreduce",
    "btree",
    "chunk_starts",
    "data_parallel_sum",
    "dtree",
    "gloo_segments",
    "rank_sequence",
    "tree_root",
]

COLLECTIVE_ORDERS: tuple[str, ...] = ("sequential", "ring", "gloo", "tree", "double_tree")
REDUCE_FORMATS: dict[str, int] = {  # format: bytes per element on the wire
    "float64": 8, "float32": 4, "bfloat16": 2, "float16": 2,
}
GLOO_MAX_SEGMENT_BYTES = 1024 * 1024  # gloo's AllreduceOptionsImpl::kMaxSegmentSize


def _round_up(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple


def gloo_segments(n: int, world_size: int, element_size: int = 4) -> tuple[int, int]:
    """(G, e): gloo's ring cuts n elements into G segments of e elements, G / W per chunk."""
    n = check_positive_int(n, "n")
    w = check_positive_int(world_size, "world_size")
    total = n * element_size
    g = _round_up(max(-(-total // GLOO_MAX_SEGMENT_BYTES), 2 * w), w)
    seg_bytes = _round_up(-(-total // g), element_size)
    return g, seg_bytes // element_size


def chunk_starts(order: str, n: int, world_size: int, element_size: int = 4) -> np.ndarray:
    """(n,) int array: the chunk index c (ring) or q (gloo) of every element, 0 for sequential."""
    check_choice(order, "order", ("sequential", "ring", "gloo"))
    w = check_positive_int(world_size, "world_size")
    idx = np.arange(check_positive_int(n, "n"))
    if order == "sequential" or w == 1:
        return np.zeros(n, dtype=np.int64)
    if order == "ring":
        return idx // -(-n // w)
    g, e = gloo_segments(n, w, element_size)
    return (idx // e) // (g // w)


def _chain(order: str, c: int, w: int) -> list[int]:
    """The ranks a chain order visits for chunk c, first to last."""
    if order == "sequential" or w == 1:
        return list(range(w))
    if order == "ring":
        return [(c + 1 + k) % w for k in range(w)]
    return [(c - 1 - k) % w for k in range(w)]  # gloo: c-1, c-2, ..., c+1, c


def btree(world_size: int) -> dict[int, tuple[int, ...]]:
    """NCCL's ncclGetBtree: {rank: its children, in order}; rank 0 is the root."""
    w = check_positive_int(world_size, "world_size")
    children: dict[int, tuple[int, ...]] = {}
    for r in range(w):
        bit = 1
        while bit < w and not bit & r:
            bit <<= 1
        if r == 0:
            children[r] = (bit >> 1,) if w > 1 else ()
            continue
        low = bit >> 1
        if low == 0:
            children[r] = ()
            continue
        d1 = r + low
        while d1 >= w:  # as NCCL: recompute with the old lowbit, then halve it
            d1 = r + low if low else -1
            low >>= 1
        children[r] = tuple(d for d in (r - (bit >> 1), d1) if d >= 0)
    return children


def dtree(world_size: int) -> tuple[dict[int, tuple[int, ...]], dict[int, tuple[int, ...]]]:
    """NCCL's ncclGetDtree: (tree 0, tree 1), the second mirrored (even W) or shifted (odd W)."""
    w = check_positive_int(world_size, "world_size")
    t0 = btree(w)
    if w % 2:
        def move(r):
            return (r + 1) % w
    else:
        def move(r):
            return w - 1 - r
    t1 = {move(r): tuple(move(d) for d in ch) for r, ch in t0.items()}
    return t0, t1


def tree_root(tree: dict[int, tuple[int, ...]]) -> int:
    """The rank that is nobody's child."""
    kids = {d for ch in tree.values() for d in ch}
    return next(r for r in tree if r not in kids)


def _tree_sum(add, x: np.ndarray, tree: dict[int, tuple[int, ...]], r: int) -> np.ndarray:
    """fl(fl(x_r + S_child0) + S_child1) for the subtree under rank r."""
    acc = x[r]
    for d in tree[r]:
        acc = add(acc, _tree_sum(add, x, tree, d))
    return acc


def _parts(parts, adder: RoundedAdder) -> np.ndarray:
    if hasattr(parts, "detach"):  # torch tensor: exact widening on the CPU
        parts = parts.detach().cpu().double().numpy()
    a = np.asarray(parts, dtype=np.float64)
    if a.ndim == 1:
        a = a[:, None]
    if a.ndim != 2 or a.shape[0] == 0 or a.shape[1] == 0:
        raise ValueError("parts must be (world_size, n) or (world_size,) with world_size, n >= 1; "
                         f"got shape {a.shape}")
    return adder.convert(a)


def allreduce(parts, order: str = "ring", fmt: str | FloatFormat = "float32", *,
              mode: str = "nearest_even") -> np.ndarray:
    """S_j = sum over ranks r of parts[r, j], added in `order` (COLLECTIVE_ORDERS), each add fl_fmt.

    parts: (W, n) array or tensor, row r what rank r contributes (a (W,) vector is n = 1).
    fmt: the reduction format, one of REDUCE_FORMATS (parts are rounded into it first);
    its size on the wire sets gloo's segments. Returns the (n,) float64 array of the result
    every rank holds (values of fmt).
    """
    check_choice(order, "order", COLLECTIVE_ORDERS)
    f = get_format(fmt)
    check_choice(f.name, "reduction format fmt", REDUCE_FORMATS)
    adder = RoundedAdder(f, mode)
    x = _parts(parts, adder)
    w, n = x.shape
    with np.errstate(over="ignore", invalid="ignore"):
        if order in ("tree", "double_tree"):
            trees = (btree(w),) if order == "tree" else dtree(w)
            half = -(-n // len(trees))
            pieces = []
            for k, t in enumerate(trees):
                sl = x[:, k * half:(k + 1) * half]
                if sl.shape[1]:
                    pieces.append(_tree_sum(adder.add, sl, t, tree_root(t)))
            out = np.concatenate(pieces)
        else:
            chunk = chunk_starts(order, n, w, REDUCE_FORMATS[f.name])
            out = np.empty(n, dtype=adder.dtype)
            for c in np.unique(chunk):
                cols = chunk == c
                ranks = _chain(order, int(c), w)
                acc = x[ranks[0], cols]
                for r in ranks[1:]:
                    acc = adder.add(acc, x[r, cols])
                out[cols] = acc
    return np.asarray(out, dtype=np.float64)


def rank_sequence(order: str, element: int, n: int, world_size: int,
                  fmt: str | FloatFormat = "float32") -> list[int]:
    """The ranks whose values a chain order adds for one element, first to last."""
    f = get_format(fmt)
    check_choice(f.name, "reduction format fmt", REDUCE_FORMATS)
    n = check_positive_int(n, "n")
    if isinstance(element, bool) or not isinstance(element, (int, np.integer)) \
            or not 0 <= element < n:
        raise ValueError(f"element must be an index 0 <= element < n={n}; got element={element!r}")
    c = int(chunk_starts(order, n, world_size, REDUCE_FORMATS[f.name])[element])
    return _chain(order, c, world_size)


def data_parallel_sum(samples, world_size: int, order: str = "ring",
                      fmt: str | FloatFormat = "float32", *,
                      local: str | FloatFormat = "float32") -> np.ndarray:
    """sum_i samples[i] as W data-parallel ranks compute it: each rank sums its shard, then all-reduce.

    samples: (N, n) per-example gradients, N >= 1 a multiple of world_size; rank r takes the
    r-th block of N / W consecutive rows and sums them in row order in `local` (one rounding
    per add, our stand-in for the backward pass's float32 accumulation), rounds the sum once
    into the reduction format fmt, then `allreduce(parts, order, fmt)`. At W = 1 this is the
    sequential sum of all N rows rounded once to fmt: the world size alone changes the order.
    """
    w = check_positive_int(world_size, "world_size")
    a = np.asarray(samples, dtype=np.float64)
    if a.ndim != 2 or a.shape[0] == 0 or a.shape[1] == 0 or a.shape[0] % w:
        raise ValueError(f"samples must be (N, n) with N >= 1 a multiple of world_size={w} "
                         f"and n >= 1; got shape {a.shape}")
    f = get_format(fmt)
    check_choice(f.name, "reduction format fmt", REDUCE_FORMATS)
    shards = a.reshape(w, a.shape[0] // w, a.shape[1])
    parts = reduce_sum(np.moveaxis(shards, 1, 2), "sequential", local, out=f)  # (w, n)
    return allreduce(np.asarray(parts).reshape(w, a.shape[1]), order, f)
