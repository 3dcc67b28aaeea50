"""Exact float64 arithmetic: widening to float64, and the error-free sums and products.

float64 holds every value of the narrower formats exactly, so `as_float64` loses nothing.
`two_sum` and `two_prod` return a float64 result together with its exact rounding error
(s + e = a + b, p + e = a * b): the building blocks of round-to-odd sums and of exact
comparisons such as the weight-update boundaries.
"""

from __future__ import annotations

import numpy as np

__all__ = ["as_float64", "two_prod", "two_sum"]


def as_float64(x) -> np.ndarray:
    """x as a float64 NumPy array (a torch tensor detached, moved to the CPU and widened exactly)."""
    if hasattr(x, "detach"):
        x = x.detach().cpu().double().numpy()
    return np.asarray(x, dtype=np.float64)


def two_sum(a, b):
    """(s, e) with s = fl64(a + b) and s + e = a + b exactly (Knuth's TwoSum, no overflow)."""
    s = a + b
    with np.errstate(invalid="ignore"):  # inf - inf when a sum is infinite: e is NaN there
        bv = s - a
        e = (a - (s - bv)) + (b - bv)
    return s, e


def _split(a):
    """Dekker's split a = hi + lo with hi, lo holding at most 26 significant bits each."""
    c = 134217729.0 * a  # 2^27 + 1
    hi = c - (c - a)
    return hi, a - hi


def two_prod(a, b):
    """(p, e) with p = fl64(a * b) and a * b = p + e exactly (Dekker's TwoProduct, no overflow
    or underflow)."""
    p = a * b
    ah, al = _split(a)
    bh, bl = _split(b)
    e = ((ah * bh - p) + ah * bl + al * bh) + al * bl
    return p, e
