"""Threshold decisions on rounded sums: when does `S < tol` come out differently?

A solver that stops when a reduction S falls below tol turns a last-bit difference in S into
a different program. These helpers build the classic sub-ULP boundary case and measure, over
sampled sums (for example many atomic orders), how often the decision differs from the one
the exact sum would make.
"""

from __future__ import annotations

import numpy as np

from ..formats import FloatFormat, get_format
from ..rounding import next_down, round_to, ulp

__all__ = ["boundary_terms", "decision_margin", "flip_probability"]


def boundary_terms(tol: float, fmt: str | FloatFormat = "float16", n_small: int = 4) -> np.ndarray:
    """[L, s, ..., s]: L = the fmt value just below tol, n_small copies of s = ulp(L)/n_small; L + n_small·s = tol.

    Each s is at most a quarter of L's ulp, so added to L it rounds away (nearest-even), while
    the n_small copies added to each other first sum exactly to one ulp. tol must be a
    positive value of fmt, and n_small a power of two >= 4 with s still a value of fmt.
    """
    f = get_format(fmt)
    tol = float(tol)
    if not (tol > 0 and float(round_to(tol, f)) == tol):
        raise ValueError(f"tol must be a positive {f.name} value; got tol={tol!r}")
    if not (isinstance(n_small, (int, np.integer)) and n_small >= 4 and n_small & (n_small - 1) == 0):
        raise ValueError(f"n_small must be a power of two >= 4 (so each term is below half an ulp); "
                         f"got n_small={n_small!r}")
    big = float(next_down(tol, f))
    s = float(ulp(big, f)) / n_small
    if s < f.min_subnormal:
        raise ValueError(f"ulp({big!r})/{n_small} = {s!r} is below {f.name}'s smallest value; "
                         "raise tol or lower n_small")
    return np.array([big] + [s] * int(n_small))


def decision_margin(tol: float, exact: float) -> float:
    """m = tol / exact - 1: the relative distance of tol above the exact sum (negative: below)."""
    return float(tol) / float(exact) - 1.0


def flip_probability(sums, exact: float, margins) -> np.ndarray:
    """For each m in margins: the fraction of sums with (S < tol) != (exact < tol), tol = exact·(1 + m).

    sums: sampled rounded results (any shape; e.g. one per atomic order); exact: the exact sum
    (float64). Margins are relative; |m| should exceed 1e-15 so that tol != exact.
    """
    s = np.asarray(sums, dtype=np.float64).ravel()
    m = np.asarray(margins, dtype=np.float64)
    tol = float(exact) * (1.0 + m)
    flips = (s[None, :] < tol.reshape(-1, 1)) != (float(exact) < tol.reshape(-1, 1))
    return flips.mean(axis=1).reshape(m.shape)
