"""The source's own error charge for a matmul whose tiles are added into C by atomics.

Zhan et al. (RENDER) state their rules to first order and follow the kernel's code in one
order: its matmul algorithm on each tile of `tile` products, every product and add charged
eps_tile relative to its size; the tile's result cast to the output format, rounded outward;
then one eps of the output format for each atomic add into C, relative to the running sum,
in tile order. The chapter sets it beside the structure-aware bound (`bounds.matmul`), which
charges every tile the worst case over all orders of the atomic adds.
"""

from __future__ import annotations

import math

import numpy as np

from ..checks import check_nonnegative, check_positive_int
from ..formats import get_format
from ..gpu import as_float64, round_float64
from .interval import Interval


def _fsum_last(a: np.ndarray) -> np.ndarray:
    """Exact sums over the last axis (math.fsum, rounded once), the same on every machine."""
    return np.apply_along_axis(math.fsum, -1, a)


def source_charge(x, w, eps_tile: float, tile: int = 256, out="float16") -> Interval:
    """Per tile [sum l - (tile-1) e sum|l|, sum h + (tile-1) e sum|h|], l, h = p -+ e|p| (e = eps_tile),
    cast outward to `out`; then C <- C + t widened by eps_out |C| after each atomic add, in tile order.

    Parameters
    ----------
    x : array_like
        The left operand, shape (m, k).
    w : array_like
        The right operand, shape (k, n).
    eps_tile : float
        The relative charge of every product and add inside a tile (>= 0; the unit roundoff
        of the tile's accumulator, 2^-24 for float32).
    tile : int, default 256
        Products per tile; must divide k.
    out : str or FloatFormat, default "float16"
        The format of C, which the tiles are cast to and added in.

    Returns
    -------
    Interval
        The source's bound of C = x w, shape (m, n), without an executed value.

    Raises
    ------
    ValueError
        If x and w are not matrices of matching inner size, tile is not a positive integer
        that divides k, eps_tile is not a finite number >= 0, or out is unknown.

    Examples
    --------
    >>> import numpy as np
    >>> from precisionlab.intervals import source_charge
    >>> x, w = np.full((1, 512), 0.5), np.full((512, 1), 0.25)  # C = 64, two tiles of 32
    >>> c = source_charge(x, w, eps_tile=2.0**-24, tile=256, out="float16")
    >>> c.shape, round(float(c.lo[0, 0]), 3), round(float(c.hi[0, 0]), 3)
    ((1, 1), 63.875, 64.156)
    """
    x, w = as_float64(x), as_float64(w)
    if x.ndim != 2 or w.ndim != 2 or x.shape[1] != w.shape[0]:
        raise ValueError(f"source_charge needs x (m, k) and w (k, n); got shapes {x.shape} "
                         f"and {w.shape}")
    tile = check_positive_int(tile, "tile")
    if x.shape[1] % tile:
        raise ValueError(f"tile must divide k = {x.shape[1]} (the tiles are whole); "
                         f"got tile={tile}")
    eps_tile = check_nonnegative(eps_tile, "eps_tile", " (the tile's relative charge)")
    p = x[:, None, :] * w.T[None, :, :]  # exact products, (m, n, k)
    p = p.reshape(*p.shape[:2], -1, tile)  # (m, n, tiles, tile)
    lo, hi = p - eps_tile * np.abs(p), p + eps_tile * np.abs(p)
    t_lo = _fsum_last(lo) - _fsum_last(np.abs(lo)) * (tile - 1) * eps_tile
    t_hi = _fsum_last(hi) + _fsum_last(np.abs(hi)) * (tile - 1) * eps_tile
    t_lo, t_hi = round_float64(t_lo, out, "down"), round_float64(t_hi, out, "up")
    eps_out = get_format(out).eps
    c_lo = c_hi = np.zeros(p.shape[:2])
    for j in range(p.shape[2]):
        c_lo, c_hi = c_lo + t_lo[..., j], c_hi + t_hi[..., j]
        c_lo, c_hi = c_lo - eps_out * np.abs(c_lo), c_hi + eps_out * np.abs(c_hi)
    return Interval(c_lo, c_hi)
