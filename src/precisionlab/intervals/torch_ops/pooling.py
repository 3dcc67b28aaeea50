"""Interval rules for pooling: max, average and adaptive pooling in one and two dimensions
(kernel model: `rules`).

* max pooling (max_pool1d/2d, their _with_indices forms, adaptive_max_pool1d/2d): the maximum
  is monotone in every entry and exact, so torch's own pooling of the lower ends and of the
  upper ends (in float64, with the call's window, stride, padding, dilation and ceil_mode:
  padding is -inf) is the bound; a window holding an entry without information (whole line,
  maybe NaN) may give NaN and gets the whole line.
* average pooling (avg_pool1d/2d, adaptive_avg_pool1d/2d): a sum over the window, then one
  division by its size (count_include_pad, divisor_override as the call says). torch's pooling
  of the ends in float64 is within gamma_(k+2)(2^-53) of the exact means, k the largest window;
  the kernel's sum is in float32 (float64 for float64) in any order, within gamma_k(u) of the
  sum of magnitudes (torch's pooling of max(|lo|, |hi|)), and the division 1.5 ulps (it may be a
  multiplication by the divisor's rounded reciprocal); a
  window whose sum of magnitudes may overflow the accumulator is the whole line.
Indices (the _with_indices forms' second output) are integers: no bound.
"""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F

from ...formats import get_format
from ..interval import Interval
from .arith import (
    UnsupportedOperation,
    down,
    finish,
    gamma,
    internal,
    mk,
    nan_where,
    round_into,
    up,
    whole,
)

__all__ = ["POOL_RULES", "pool_bound"]

_MAX = {"max_pool1d": F.max_pool1d, "max_pool2d": F.max_pool2d,
        "max_pool1d_with_indices": F.max_pool1d, "max_pool2d_with_indices": F.max_pool2d,
        "adaptive_max_pool1d": F.adaptive_max_pool1d, "adaptive_max_pool2d": F.adaptive_max_pool2d,
        "adaptive_max_pool1d_with_indices": F.adaptive_max_pool1d,
        "adaptive_max_pool2d_with_indices": F.adaptive_max_pool2d}
_AVG = {"avg_pool1d": F.avg_pool1d, "avg_pool2d": F.avg_pool2d,
        "adaptive_avg_pool1d": F.adaptive_avg_pool1d, "adaptive_avg_pool2d": F.adaptive_avg_pool2d}


def _t(a: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(a, dtype=np.float64))


def _window(name: str, shape: tuple, args: tuple, kwargs: dict) -> int:
    """The largest number of entries one output of the pooling sums (an upper bound)."""
    nd = 2 if name.endswith("2d") else 1
    if name.startswith("adaptive"):
        out = args[1] if len(args) > 1 else kwargs["output_size"]
        out = tuple(out) if isinstance(out, (list, tuple)) else (out,) * nd
        n = 1
        for size, o in zip(shape[-nd:], out, strict=True):
            o = size if o is None else int(o)
            n *= math.ceil(size / max(o, 1)) + 1
        return n
    k = args[1] if len(args) > 1 else kwargs["kernel_size"]
    k = tuple(k) if isinstance(k, (list, tuple)) else (k,) * nd
    return math.prod(int(v) for v in k)


def pool_bound(name: str, x: Interval, args: tuple, kwargs: dict, fmt: str) -> Interval:
    """The bound of pooling `name` (a key of POOL_RULES) of the box x, the call's other
    arguments args[1:] and kwargs, with results in fmt (module docstring).

    Parameters
    ----------
    name : str
        The torch name of the pooling ("max_pool2d", "adaptive_avg_pool1d", ...).
    x : Interval
        The input's bound, (N, C, *spatial) or (C, *spatial).
    args, kwargs : tuple, dict
        The call's arguments (args[0], the input, is not read).
    fmt : str
        The result's format.

    Returns
    -------
    Interval
        The output's bound.
    """
    rest = dict(kwargs)
    rest.pop("return_indices", None)
    fn = _MAX.get(name) or _AVG.get(name)
    if fn is None:
        raise UnsupportedOperation(f"pool_bound takes one of {sorted(POOL_RULES)}; got {name!r}")
    more = args[1:]
    if name in _MAX:
        lo, hi = (fn(_t(z), *more, **rest).numpy() for z in (x.lo, x.hi))
        free = fn(_t(whole(x).astype(np.float64)), *more, **rest).numpy() > 0
        return nan_where(round_into(mk(lo, hi), fmt), free)
    mag = np.maximum(np.abs(x.lo), np.abs(x.hi))
    with np.errstate(invalid="ignore", over="ignore"):
        lo, hi, m = (fn(_t(z), *more, **rest).numpy() for z in (x.lo, x.hi, mag))
    k = _window(name, x.shape, args, kwargs)
    d = kwargs.get("divisor_override", args[6] if len(args) > 6 else None)
    d = max(k, abs(float(d))) if d else k  # the largest divisor: sum of magnitudes = m d
    inner = internal(fmt)
    u = get_format(inner).unit_roundoff
    g = gamma(k, u) + gamma(k + 2, 2.0**-53)
    with np.errstate(invalid="ignore", over="ignore"):
        r = m * (1 + 2 * gamma(k + 2, 2.0**-53)) * g * (1 + 2.0**-50)
        y = mk(down(lo - r), up(hi + r))
        # the sum itself may overflow the accumulator (m is its mean of magnitudes, the divisor
        # at most the window's size)
        over = ~np.isfinite(m) | (m * d >= get_format(inner).max_finite) | np.isnan(r)
    return nan_where(finish(y, fmt, 1.5), over)


def _rule(name: str):
    def rule(rec, get, fmt):
        return [pool_bound(name, get(rec.args[0]), rec.args, rec.kwargs, fmt)]
    return rule


POOL_RULES = {name: _rule(name) for name in (*_MAX, *_AVG)}
