"""Interval rules for cos and sin (rotary position embeddings compute them; kernel model: `rules`).

The exact range of cos (sin) over [lo, hi] is taken by its monotone pieces: the values at both
ends, and 1 (-1) where a maximum (minimum) lies inside. Maxima of cos are at 2 pi k, minima at
pi + 2 pi k; sin is cos shifted by pi / 2. Whether an extremum lies inside is decided on
x / pi with a margin, so that a rounding in that test can only add an extremum, never drop one.
The float64 values at the ends (torch's, libm) get an absolute slack of 2^-50.

Kernel model (an assumption, conservative beside torch's kernels): the result is within 4 ulps
of the internal format (float32 for float16/bfloat16/float32, float64 for float64) of the exact
cosine of its float input, plus an absolute error of 4 u (1 + |x|), u the internal format's unit
roundoff: a kernel whose argument reduction uses a rounded pi (GPU fast paths) loses accuracy in
proportion to |x|. torch's CPU kernels (SLEEF's 1-ulp cosf/sinf, libm) are within 1 ulp. Beyond
|x| = 2^20 nothing is assumed of the reduction: the bound is [-1, 1] (widened by 4 ulps and 4 u
absolute). An infinite or unknown input gives the whole line (cos(inf) is NaN).
"""

from __future__ import annotations

import math

import numpy as np
import torch

from ...formats import get_format
from ..interval import Interval
from .arith import down, finish, internal, mk, nan_where, up, whole, widen_abs

__all__ = ["TRIG_RULES", "trig_bound"]

FN_ULPS = 4.0  # ulps of the internal format around the exact value
ABS_ULPS = 4.0  # and 4 u (1 + |x|) absolute: an argument reduction with a rounded pi
LARGE = 2.0**20  # beyond this |x|, only |cos x| <= 1 is assumed
_SLACK64 = 2.0**-50  # torch's float64 cos / sin (libm) at the ends: well within this


def _has_parity(t_lo: np.ndarray, t_hi: np.ndarray, odd: bool) -> np.ndarray:
    """Whether [t_lo, t_hi] holds an integer of the given parity (arrays of finite floats)."""
    c = np.ceil(t_lo)
    first = np.where((np.mod(c, 2) == 1) == odd, c, c + 1)  # the first such integer >= t_lo
    return first <= t_hi


def trig_bound(x: Interval, fmt: str, sine: bool = False) -> Interval:
    """cos(x) (sin(x) when sine) over the box x, as a result of fmt: the exact range from the
    monotone pieces, widened by the kernel model's budgets (module docstring) and rounded
    outward into fmt.

    Parameters
    ----------
    x : Interval
        The input's bound (float64 ends).
    fmt : str
        The result's format ("float16", "bfloat16", "float32" or "float64").
    sine : bool, default False
        Bound sin instead of cos.

    Returns
    -------
    Interval
        A bound holding every value the kernel model allows, the whole line where x has an
        infinite or unknown end.
    """
    lo, hi = np.asarray(x.lo, dtype=np.float64), np.asarray(x.hi, dtype=np.float64)
    bad = ~(np.isfinite(lo) & np.isfinite(hi))
    a, b = np.where(bad, 0.0, lo), np.where(bad, 0.0, hi)
    fn = torch.sin if sine else torch.cos
    fa, fb = fn(torch.from_numpy(np.ascontiguousarray(a))).numpy(), fn(
        torch.from_numpy(np.ascontiguousarray(b))).numpy()
    y_lo = np.minimum(fa, fb) - _SLACK64
    y_hi = np.maximum(fa, fb) + _SLACK64
    # t = x / pi (sin: x / pi - 1/2): a maximum at even t, a minimum at odd t; the margin covers
    # the rounding of the division and of pi (relative 2^-52 each) with room to spare
    shift = 0.5 if sine else 0.0
    t_lo, t_hi = a / math.pi - shift, b / math.pi - shift
    margin = 2.0**-40 * (1.0 + np.maximum(np.abs(t_lo), np.abs(t_hi)))
    t_lo, t_hi = t_lo - margin, t_hi + margin
    y_hi = np.where(_has_parity(t_lo, t_hi, odd=False), 1.0, y_hi)
    y_lo = np.where(_has_parity(t_lo, t_hi, odd=True), -1.0, y_lo)
    mag = np.maximum(np.abs(a), np.abs(b))
    large = mag > LARGE
    y_lo, y_hi = np.where(large, -1.0, y_lo), np.where(large, 1.0, y_hi)
    u = get_format(internal(fmt)).unit_roundoff
    y = widen_abs(mk(down(y_lo), up(y_hi)), ABS_ULPS * u * (1.0 + np.where(large, 0.0, mag)))
    y = finish(y, fmt, FN_ULPS)
    return nan_where(y, bad | whole(x))


def _rule(sine: bool):
    def rule(rec, get, fmt):
        return [trig_bound(get(rec.args[0]), fmt, sine)]
    return rule


TRIG_RULES = {"cos": _rule(False), "sin": _rule(True)}
