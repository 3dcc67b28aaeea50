"""The shares a quantizer reports: elements that saturated, underflowed to zero, or landed subnormal."""

from __future__ import annotations

import functools

import numpy as np

from ..formats import FloatFormat

__all__ = ["count_shares", "overflow_threshold"]

# From this many elements on, one compiled pass counts everything (a cold numba compile costs
# about half a second once, then comes from numba's on-disk cache); shorter tensors use
# NumPy's count_nonzero, several passes but no compiler (about 1 ms per 2^18 elements, so a
# chapter's few tensors of 2^16 would pay the compile a hundred times over). Both give the
# same counts.
_NUMBA_MIN_SIZE = 1 << 20


def overflow_threshold(elem: FloatFormat) -> tuple[float, bool]:
    """(t, tie_overflows): |y| > t (or = t when max_E's last bit is odd) rounds past max_E to nearest."""
    ulp = 2.0 ** (elem.emax - elem.mantissa_bits)
    return elem.max_finite + ulp / 2, round(elem.max_finite / ulp) % 2 == 1


def _count_loop(x, y, q, t, odd, mn):
    """(#|y| past t, #q = 0, #x = 0, #|q| < mn) in one pass over three flat float32 arrays."""
    sat = zero_q = zero_x = small = 0
    for i in range(x.size):
        a = abs(y[i])
        sat += (a > t) | (odd & (a == t))
        zero_q += q[i] == 0
        zero_x += x[i] == 0
        small += abs(q[i]) < mn
    return sat, zero_q, zero_x, small


@functools.cache
def _count_kernel():
    """_count_loop compiled by numba (or loaded from its cache) on first use."""
    import numba  # optional here: only tensors of 2^16+ elements need it (0.7 s to import)

    return numba.njit(cache=True)(_count_loop)


def count_shares(x: np.ndarray, y: np.ndarray, q: np.ndarray, elem: FloatFormat,
                 could_saturate: bool = True) -> tuple[float, float, float]:
    """(saturated, underflowed, subnormal) shares: |y| rounds past max_E; x != 0 but q = 0; 0 < |q| < min_normal."""
    t, odd = overflow_threshold(elem)
    n, mn = x.size, elem.min_normal
    if n == 0:
        return 0.0, 0.0, 0.0
    if n >= _NUMBA_MIN_SIZE:
        sat, zero_q, zero_x, small = _count_kernel()(x.ravel(), y.ravel(), q.ravel(), t, odd, mn)
    else:
        sat = 0
        if could_saturate:
            a = np.abs(y)
            sat = np.count_nonzero(a >= t) if odd else np.count_nonzero(a > t)
        zero_q, zero_x = n - np.count_nonzero(q), n - np.count_nonzero(x)
        small = np.count_nonzero(np.abs(q) < mn)
    return int(sat) / n, (int(zero_q) - int(zero_x)) / n, (int(small) - int(zero_q)) / n
