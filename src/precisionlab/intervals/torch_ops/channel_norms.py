"""Interval rules for the normalisations over channels: batch norm (running statistics, as in
eval mode, or the batch's own), group norm and instance norm (kernel model: `rules`).

* Running statistics (batch_norm in eval mode, instance_norm with use_input_stats=False): per
  channel c of axis 1, y = (x - mean_c) w_c / sqrt(var_c + eps) + b_c, an affine map. Its exact
  range over the boxes is taken in float64 stepped outward (eps as given and as float32 rounds
  it), then widened by an absolute 8 u (|x| + |mean|) |s| + 4 u |b| + 2 u |y|, s = w /
  sqrt(var + eps) and u the internal format's unit roundoff. That budget holds for any of the
  ways kernels compute it: torch's CPU kernel folds it into alpha = w / sqrt(var + eps) and
  beta = b - mean alpha in float32 (float64 for float64) and computes x alpha + beta (the
  cancellation there is the (|x| + |mean|) |s| term); others compute (x - mean) / std w + b.
  A float16/bfloat16 result may keep alpha and beta in its format (torch's CPU kernel with
  parameters of the dtype does: a running mean far from zero then costs far more than u): 4 u_fmt
  (|x| + |mean|) |s| more, and (x - mean) s and the sum with b: 2 u_fmt (|(x - mean) s| + |b| +
  |y|). Where var + eps may be <= 0 the result may be inf or NaN:
  the whole line.
* Batch statistics (batch_norm in training mode or without running statistics, group_norm,
  instance_norm with use_input_stats=True): x-hat = (x - mean) / sqrt(var + eps) over each
  row of the normalised entries (a channel over (N, *spatial); a group of channels over its
  channels and spatial entries; a channel of one sample over its spatial entries) by the layer
  norm rule's rows (`kernels.norm_rows`, no weight or bias: absolute (2 n + 16) u max|x| /
  std + 4 u |x-hat|, more than the fold above costs), then x-hat w_c + b_c exact, widened by
  2 u (|x-hat w| + |b|) + u |y| (and for float16/bfloat16, alpha and beta kept in the dtype,
  8 u_fmt max|x| / std |w| + 2 u_fmt (|x-hat w| + |b| + |y|), max|x| / std over the row).
Rounded outward into the result's format last.
"""

from __future__ import annotations

import inspect

import numpy as np
import torch
import torch.nn.functional as F

from ...formats import get_format
from ..interval import Interval
from ..outward import mul_box
from . import fused, small
from .arith import (
    UnsupportedOperation,
    down,
    gamma,
    internal,
    is_tensor,
    mk,
    nan_where,
    round_into,
    rounding,
    u_out,
    up,
    whole,
    widen_abs,
)

__all__ = ["NORM_RULES", "batch_stats_bound", "running_stats_bound"]

_SIGS = {"batch_norm": inspect.signature(F.batch_norm),
         "instance_norm": inspect.signature(F.instance_norm),
         "group_norm": inspect.signature(F.group_norm)}
# torch.batch_norm (the ATen function, not F.batch_norm) takes its arguments in this order
_ATEN_BN = inspect.Signature([inspect.Parameter(n, inspect.Parameter.POSITIONAL_OR_KEYWORD)
                              for n in ("input", "weight", "bias", "running_mean", "running_var",
                                        "training", "momentum", "eps", "cudnn_enabled")])


def _eps(eps: float) -> tuple[float, float]:
    """eps as given and as float32 rounds it (a float32 kernel adds the rounded one)."""
    e32 = float(np.float32(eps))
    return min(eps, e32), max(eps, e32)


def _mag(x: Interval) -> np.ndarray:
    return np.maximum(np.abs(x.lo), np.abs(x.hi))


def _per_channel(v: Interval | None, ndim: int, default: float) -> Interval:
    """A per-channel vector's bound shaped (1, C, 1, ...) against an input of ndim axes."""
    if v is None:
        return mk(np.full((1,) * ndim, default), np.full((1,) * ndim, default))
    shape = (1, -1) + (1,) * (ndim - 2)
    return mk(v.lo.reshape(shape), v.hi.reshape(shape))


def _mul(a: Interval, b: Interval) -> tuple[Interval, np.ndarray]:
    """The exact products' bound (float64, outward) and where 0 * inf may make NaN."""
    lo, hi, nan = mul_box(a.lo, a.hi, b.lo, b.hi)
    return mk(np.where(nan, -np.inf, lo), np.where(nan, np.inf, hi)), nan


def _add(a: Interval, b: Interval) -> Interval:
    with np.errstate(invalid="ignore", over="ignore"):
        lo, hi = a.lo + b.lo, a.hi + b.hi
    bad = np.isnan(lo) | np.isnan(hi)  # inf - inf
    return mk(np.where(bad, -np.inf, down(lo)), np.where(bad, np.inf, up(hi)))


def running_stats_bound(x: Interval, mean: Interval, var: Interval, w: Interval | None,
                        b: Interval | None, eps: float, fmt: str) -> Interval:
    """(x - mean) w / sqrt(var + eps) + b per channel (axis 1 of x; mean, var, w, b of shape
    (C,)), as a result of fmt: the exact range widened by the module docstring's budget.

    Parameters
    ----------
    x : Interval
        The input's bound, (N, C, *spatial).
    mean, var : Interval
        The running mean and variance's bounds, shape (C,).
    w, b : Interval or None
        The affine weight and bias (None: 1 and 0).
    eps : float
        The eps added to the variance.
    fmt : str
        The result's format.

    Returns
    -------
    Interval
        The output's bound, of x's shape.
    """
    nd = x.ndim
    m, v = _per_channel(mean, nd, 0.0), _per_channel(var, nd, 1.0)
    wc, bc = _per_channel(w, nd, 1.0), _per_channel(b, nd, 0.0)
    e_lo, e_hi = _eps(eps)
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        s_lo = up(v.hi + e_hi)  # 1 / sqrt over [var + eps]: decreasing
        s_hi = down(v.lo + e_lo)
        bad = ~(s_hi > 0) | np.isnan(v.lo) | np.isnan(v.hi)
        inv_lo = down(1.0 / up(np.sqrt(s_lo)))
        inv_hi = np.where(bad, np.inf, up(1.0 / down(np.sqrt(np.where(bad, 1.0, s_hi)))))
    inv = mk(np.where(np.isnan(inv_lo), 0.0, inv_lo), inv_hi)
    s, nan_s = _mul(wc, inv)
    d = _add(x, mk(-m.hi, -m.lo))
    ds, nan_d = _mul(d, s)
    y = _add(ds, bc)
    u = get_format(internal(fmt)).unit_roundoff
    with np.errstate(invalid="ignore", over="ignore"):
        uf = u_out(fmt)
        r = ((8 * u + 4 * uf) * (_mag(x) + _mag(m)) * _mag(s) + 4 * u * _mag(bc)
             + 2 * u * _mag(y) + 2 * uf * (_mag(ds) + _mag(bc) + _mag(y)))
        if uf:  # beta and the result rounded into the dtype below its normal range
            r = r + 2 * get_format(fmt).min_normal
    r = np.where(np.isnan(r), np.inf, r)
    free = np.broadcast_to(bad | nan_s, x.shape) | nan_d | whole(x)
    return nan_where(round_into(widen_abs(y, r), fmt), free)


def batch_stats_bound(x: Interval, rows: int, w: Interval | None, b: Interval | None, eps: float,
                      fmt: str) -> Interval:
    """Normalised over each of `rows` contiguous rows of x's entries in C order (x-hat), then
    x-hat w + b per channel (axis 1), as a result of fmt (module docstring).

    Parameters
    ----------
    x : Interval
        The input's bound laid out so that each normalised group is a contiguous row of
        x.size / rows entries.
    rows : int
        The number of groups.
    w, b : Interval or None
        The per-channel weight and bias (None: 1 and 0).
    eps : float
        The eps added to the variance.
    fmt : str
        The result's format.

    Returns
    -------
    Interval
        The output's bound, of x's shape.
    """
    n = x.lo.size // max(rows, 1) if rows else 0
    inner = internal(fmt)
    f = get_format(inner)
    lo, hi = np.empty(x.shape), np.empty(x.shape)
    e_lo, e_hi = _eps(eps)
    if x.lo.size:
        none = np.zeros(1)
        small.norm_rows(fused.flat(x.lo), fused.flat(x.hi), rows, n, False, e_lo, e_hi, False,
                        none, none, False, none, none, gamma(n + 4, 2.0**-53), f.unit_roundoff,
                        u_out(fmt), f.max_finite, _tiny(fmt), *rounding("float64"),
                        lo.reshape(-1), hi.reshape(-1))
    xh = mk(lo, hi)
    free = whole(xh)
    wc = _per_channel(w, x.ndim, 1.0)
    xw, nan_w = _mul(xh, wc)
    bc = _per_channel(b, x.ndim, 0.0)
    y = _add(xw, bc)
    u, uf = f.unit_roundoff, u_out(fmt)
    with np.errstate(invalid="ignore", over="ignore"):
        r = (2 * u * (_mag(xw) + _mag(bc)) + u * _mag(y)
             + 2 * uf * (_mag(xw) + _mag(bc) + _mag(y)))
        if uf and x.lo.size:  # alpha = w r and beta = b - mean alpha kept in the dtype
            big = _row_scale(x, rows, n, e_lo, _tiny(fmt), fmt).reshape(x.shape) * _mag(wc)
            r = r + 8 * uf * big
    r = np.where(np.isnan(r), np.inf, r)
    return nan_where(round_into(widen_abs(y, r), fmt), free | nan_w)


def _tiny(fmt: str) -> float:
    """The smallest normal below which the variance's absolute error is unbounded relative to
    it: the internal format's (its squares underflow), or float16's, whose CPU kernels for
    batch and instance norm may hold the variance in the dtype (x ~ 3e-6 with eps = 0 gives
    NaN there: the variance underflows to 0)."""
    return max(get_format(internal(fmt)).min_normal, get_format(fmt).min_normal)


def _row_scale(x: Interval, rows: int, n: int, eps_lo: float, tiny: float,
               fmt: str) -> np.ndarray:
    """max|x| / std per row of n entries, an upper bound over the box (float64, with the slack
    of `kernels.norm_rows`: the mean's interval from the sums of the ends, the variance's lower
    bound from the squares of x - mean), broadcast to the row's entries."""
    lo, hi = x.lo.reshape(rows, n), x.hi.reshape(rows, n)
    g = gamma(n + 4, 2.0**-53)
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        mag = np.maximum(np.abs(lo), np.abs(hi))
        sl = mag.sum(-1, keepdims=True) / n
        m_lo = down(lo.sum(-1, keepdims=True) / n - 2 * g * sl)
        m_hi = up(hi.sum(-1, keepdims=True) / n + 2 * g * sl)
        d_lo, d_hi = down(lo - m_hi), up(hi - m_lo)
        sq = np.where((d_lo <= 0) & (d_hi >= 0), 0.0, np.minimum(d_lo * d_lo, d_hi * d_hi))
        v_lo = np.maximum(sq.sum(-1, keepdims=True) / n * (1 - 4 * g)
                          - 4 * tiny, 0.0)  # the squares' underflow (`_tiny`)
        r_hi = up(1.0 / down(np.sqrt(down(v_lo + eps_lo))) * (1 + 4 * g))
        # and the mean kept in the dtype below its normal range: an absolute error up to its
        # smallest normal (bfloat16 x ~ 1e-40 with eps 1e-45: 8.5% of y), 1/(8 uf) of it here
        out = (mag.max(-1, keepdims=True) + get_format(fmt).min_normal / (8 * u_out(fmt))) * r_hi
    out = np.where(np.isnan(out), np.inf, out)
    return np.broadcast_to(out, (rows, n))


def _vec(p: dict, name: str, get) -> Interval | None:
    t = p[name]
    return get(t) if is_tensor(t) else None


def _r_batch_norm(rec, get, fmt):
    sig = _SIGS["batch_norm"] if rec.func is not torch.batch_norm else _ATEN_BN
    a = sig.bind(*rec.args, **rec.kwargs)
    a.apply_defaults()
    p = a.arguments
    x = get(p["input"])
    w, b = _vec(p, "weight", get), _vec(p, "bias", get)
    if x.ndim < 2:
        raise UnsupportedOperation(f"batch_norm takes an input of shape (N, C, ...); got "
                                   f"{x.shape}")
    stats = is_tensor(p["running_mean"]) and is_tensor(p["running_var"])
    if stats and not p["training"]:
        return [running_stats_bound(x, get(p["running_mean"]), get(p["running_var"]), w, b,
                                    float(p["eps"]), fmt)]
    # batch statistics per channel: the channel axis moved first, (1, C, N * spatial) rows
    c = x.shape[1]
    lo, hi = (np.ascontiguousarray(np.moveaxis(z, 1, 0)) for z in (x.lo, x.hi))
    shape = lo.shape
    y = batch_stats_bound(mk(lo.reshape(1, c, -1), hi.reshape(1, c, -1)), c, w, b,
                          float(p["eps"]), fmt)
    return [mk(*(np.moveaxis(z.reshape(shape), 0, 1) for z in (y.lo, y.hi)))]


def _r_group_norm(rec, get, fmt):
    a = _SIGS["group_norm"].bind(*rec.args, **rec.kwargs)
    a.apply_defaults()
    p = a.arguments
    x = get(p["input"])
    g = int(p["num_groups"])
    if x.ndim < 2 or x.shape[1] % g:
        raise UnsupportedOperation(
            f"group_norm takes an input (N, C, ...) with C divisible by num_groups; got shape "
            f"{x.shape} and num_groups={g}")
    return [batch_stats_bound(x, x.shape[0] * g, _vec(p, "weight", get), _vec(p, "bias", get),
                              float(p["eps"]), fmt)]


def _r_instance_norm(rec, get, fmt):
    a = _SIGS["instance_norm"].bind(*rec.args, **rec.kwargs)
    a.apply_defaults()
    p = a.arguments
    x = get(p["input"])
    w, b = _vec(p, "weight", get), _vec(p, "bias", get)
    if x.ndim < 3:
        raise UnsupportedOperation(f"instance_norm takes an input of shape (N, C, L, ...); got "
                                   f"{x.shape}")
    if not p["use_input_stats"]:
        return [running_stats_bound(x, get(p["running_mean"]), get(p["running_var"]), w, b,
                                    float(p["eps"]), fmt)]
    return [batch_stats_bound(x, x.shape[0] * x.shape[1], w, b, float(p["eps"]), fmt)]


NORM_RULES = {"batch_norm": _r_batch_norm, "group_norm": _r_group_norm,
              "instance_norm": _r_instance_norm}
