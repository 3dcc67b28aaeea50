"""Leaf depths: the roundings each summand passes through, per stage of a kernel's summation tree."""

from __future__ import annotations

import numpy as np

from ..checks import check_positive_int
from .kernel import Kernel
from .tensorcore import get_tensor_core_model

__all__ = ["leaf_depths", "sequential_depths"]


def sequential_depths(length: np.ndarray, t: int) -> np.ndarray:
    """Adds on each position's path in sequential sums of groups of real length `length` (padded to t).

    acc = x_0; acc = fl(acc + x_p): x_0 and x_1 pass L - 1 adds, x_p (p >= 1) L - p; the
    padded zeros add nothing (x + 0 is exact).
    """
    p = np.arange(t)
    L = np.asarray(length)[..., None]
    d = L - np.maximum(p, 1)
    return np.where(p < L, np.maximum(d, 0), 0)


def _pairwise_depths(n: int) -> np.ndarray:
    """Adds on each leaf's path in reduce_sum's pairwise tree (neighbours paired, odd last moves up)."""
    pos = np.arange(n)
    d = np.zeros(n, dtype=np.int64)
    m = n
    while m > 1:
        h = m // 2
        paired = pos < 2 * h
        d += paired
        pos = np.where(paired, pos // 2, h)
        m = h + (m % 2)
    return d


def leaf_depths(n: int, kernel: Kernel) -> dict[str, np.ndarray]:
    """Roundings on each summand's path through the kernel's tree, per stage: {stage: depths (n,)}.

    The structure-aware bound charges summand i the factor (1 + u_stage)^depth per stage; the
    order-oblivious rule charges every summand n - 1. Stages: "tile" (within a tile, thread or
    the whole sum), "partial" (the rounding of the tile result), "combine" (adds between tiles),
    "warp" (the two 5-level shuffle trees of order="warp"), "block_fma" (tensor-core blocks).

    Parameters
    ----------
    n : int
        The number of summands (>= 1).
    kernel : Kernel
        How the sum is executed (order, block, splits, threads, partial format, ...).

    Returns
    -------
    dict of str to numpy.ndarray
        For each stage the kernel has, the number of roundings on summand i's path, an
        integer array of shape (n,).

    Raises
    ------
    ValueError
        If n is not a positive integer.

    Examples
    --------
    >>> from precisionlab.intervals import Kernel, leaf_depths
    >>> leaf_depths(4, Kernel("sequential"))["tile"].tolist()  # x_0 and x_1 pass all 3 adds
    [3, 3, 2, 1]
    >>> d = leaf_depths(8, Kernel("blocked", block=4))  # two tiles of 4, then one combine
    >>> d["tile"].tolist(), d["combine"].tolist()
    ([3, 3, 2, 1, 3, 3, 2, 1], [1, 1, 1, 1, 1, 1, 1, 1])
    """
    n = check_positive_int(n, "n")
    k = kernel
    idx = np.arange(n)
    if k.order in ("sequential",):
        return {"tile": sequential_depths(np.array(n), n)}
    if k.order == "pairwise":
        return {"tile": _pairwise_depths(n)}
    if k.order == "tensor_core":
        B = get_tensor_core_model(k.model).block
        nblk = -(-n // B)
        return {"block_fma": nblk - idx // B}
    if k.order == "warp":
        T = k.threads
        rows = -(-n // T)
        thread, r = idx % T, idx // T
        per_thread = np.array([len(range(t, n, T)) for t in range(T)])
        tile = sequential_depths(per_thread, rows)[thread, r]
        return {"tile": tile, "warp": np.full(n, 10)}
    # blocked, split_k, atomic: tiles of t elements, then the tile results combined
    if k.order == "atomic" and k.block == 1:
        return {"combine": np.full(n, n - 1)}
    t = k.tile(n)
    nb = -(-n // t)
    lengths = np.minimum(t, n - np.arange(nb) * t)
    tile = sequential_depths(lengths, t)[idx // t, idx % t]
    if k.order == "atomic":
        comb = np.full(n, nb - 1)  # a random order: any tile may land first or last
    else:
        comb = sequential_depths(np.array(nb), nb)[idx // t]
    out = {"tile": tile, "combine": comb}
    if k.partial is not None:
        out["partial"] = np.ones(n, dtype=np.int64)
    return out
