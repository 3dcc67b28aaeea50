"""Interval rules for the row-wise operations triage bounds: softmax and log-softmax, layer and
RMS norm, sums and means, and cross entropy (kernel model: `rules`)."""

from __future__ import annotations

import math

import numpy as np
import torch

from ...formats import get_format
from ..interval import Interval
from . import fused, small
from .arith import (
    ABS_SLACK,
    REL_SLACK,
    UnsupportedOperation,
    arg,
    down,
    finish,
    gamma,
    internal,
    is_tensor,
    mk,
    nan_where,
    reduced,
    round_into,
    rounding,
    u_out,
    up,
    whole,
    widen_abs,
)

# --------------------------------------------------------------------------- softmax family


def _lse_parts(x: Interval):
    """Per row (last axis) of the box: S_hi = sum e^(hi - c) and S_lo = sum e^(lo - c), c = max hi."""
    c = np.max(x.hi, axis=-1, keepdims=True)
    c = np.where(np.isfinite(c), c, 0.0)
    with np.errstate(invalid="ignore", over="ignore"):
        e_hi = np.exp(x.hi - c) * (1 + REL_SLACK) + ABS_SLACK
        e_lo = np.maximum(np.exp(x.lo - c) * (1 - REL_SLACK) - ABS_SLACK, 0.0)
    n = x.shape[-1]
    g = gamma(n + 2, 2.0**-53)
    s_hi = np.sum(e_hi, axis=-1, keepdims=True) * (1 + g)
    s_lo = np.sum(e_lo, axis=-1, keepdims=True) * (1 - g)
    return c, e_lo, e_hi, s_lo, s_hi


def _log_softmax_exact(x: Interval) -> Interval:
    """log s_i in [lo_i - c - log S_hi', hi_i - c - log S_lo'] over the box."""
    c, e_lo, e_hi, s_lo, s_hi = _lse_parts(x)
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        other_hi = np.maximum(s_hi - e_lo, 0.0) * (1 + 2.0**-50) + ABS_SLACK
        other_lo = np.maximum(s_lo - e_hi, 0.0) * (1 - 2.0**-50)
        lo = (x.lo - c) - np.log(e_lo + other_hi)
        hi = (x.hi - c) - np.log(np.maximum(e_hi + other_lo, ABS_SLACK))
        lo = down(lo - np.abs(lo) * REL_SLACK - 2.0**-60)
        hi = np.minimum(up(hi + np.abs(hi) * REL_SLACK + 2.0**-60), 0.0)
    return mk(np.where(np.isnan(lo), -np.inf, lo), np.where(np.isnan(hi), 0.0, hi))


def _moved(x: Interval, dim: int, fn) -> Interval:
    """fn applied along axis dim (moved last and back)."""
    if x.ndim and dim % x.ndim == x.ndim - 1:
        return fn(x)
    lo, hi = np.moveaxis(x.lo, dim, -1), np.moveaxis(x.hi, dim, -1)
    y = fn(mk(lo, hi))
    return mk(np.moveaxis(y.lo, -1, dim), np.moveaxis(y.hi, -1, dim))


def _row_nan(z: Interval) -> np.ndarray:
    """Rows (last axis) whose softmax may be NaN: an entry without information or every entry
    -inf (torch returns NaN for a fully masked row)."""
    return (whole(z).any(-1, keepdims=True)
            | (z.hi == -np.inf).all(-1, keepdims=True))


def softmax_rule(x, dim, fmt, log=False):
    """Softmax / log-softmax along dim. Kernel model: float32 (float64) internally, n + 4 ulps;
    a float16/bfloat16 result may also keep intermediates in its format: for softmax the
    exponentials and the reciprocal of the sum (2 more ulps); for log-softmax x - max, the sum,
    its log and the final difference (torch's CPU kernel keeps max and log-sum in the dtype),
    2 u (|x - max| + |y| + 1) more, u the format's unit roundoff."""
    n = x.shape[dim] if x.ndim else 1
    if log:
        def fn(z):
            y = _log_softmax_exact(z)
            u = get_format(internal(fmt)).unit_roundoff
            gap = np.max(z.hi, -1, keepdims=True) - z.lo  # >= max - x over the box
            with np.errstate(invalid="ignore", over="ignore"):
                mag = gap + np.maximum(np.abs(y.lo), np.abs(y.hi)) + 1.0
                r = ((n + 4) * u + 2 * u_out(fmt)) * mag
            r = np.where(z.hi == -np.inf, 0.0, r)  # an entry that is -inf stays -inf
            r = np.fmin(r, np.inf)
            return nan_where(widen_abs(y, r), _row_nan(z))
        y = _moved(x, dim, fn)
        return round_into(y, fmt)  # into float32, then fmt: the same bounds

    def fn(z):
        # x - max rounded in the internal format: e^x off by u |x - max| relative, i.e. the
        # softmax of an input moved by that much: the box widened by 2 u (max hi - lo), then s_i
        # in [e^lo_i / (e^lo_i + sum_(j!=i) e^hi_j), e^hi_i / (e^hi_i + sum_(j!=i) e^lo_j)], in
        # passes (`kernels.softmax_in`, `softmax_out`; their NumPy twins in `small` for small
        # inputs) around NumPy's exponentials
        if not z.lo.size:
            return z
        u = get_format(internal(fmt)).unit_roundoff
        a, b = np.empty(z.shape), np.empty(z.shape)
        rows = np.empty(z.lo.size // n, dtype=bool)
        lo, hi = np.empty(z.shape), np.empty(z.shape)
        small.softmax_in(fused.flat(z.lo), fused.flat(z.hi), n, 2 * u, a.reshape(-1),
                         b.reshape(-1), rows)
        with np.errstate(invalid="ignore", over="ignore"):
            np.exp(a, out=a)
            np.exp(b, out=b)
        small.softmax_out(a.reshape(-1), b.reshape(-1), n, gamma(n + 2, 2.0**-53), REL_SLACK,
                          ABS_SLACK, rows, lo.reshape(-1), hi.reshape(-1))
        return mk(lo, hi)
    y = _moved(x, dim, fn)
    nan = whole(y)
    y = finish(y, fmt, n + 4, extra=2.0)
    return nan_where(mk(np.maximum(y.lo, 0.0), np.minimum(y.hi, 1.0)), nan)


# --------------------------------------------------------------------------- normalisation


def _norm_rule(x: Interval, nshape, w, b, eps, fmt: str, rms: bool = False):
    """Layer / RMS norm over the trailing nshape axes; eps a number or an interval (lo, hi).
    Kernel model: moments in float32 (any order), the absolute error below; a float16/bfloat16
    result may keep x-hat, x-hat w and the sum with b in its format (2 u of each more).

    Per row, in float64 stepped outward (`kernels.norm_rows`; `small`'s twin for small inputs):
    the mean's interval from the sums of lo and hi, slack gamma_(n+4) sum |x| / n (and 2 n u
    tiny, tiny the internal format's smallest normal); d = x - mean; the variance from d's
    squares (gamma_(n+4) relative, and 4 tiny absolute: squares below tiny underflow); 1 /
    sqrt(var + eps) (gamma relative); y = d r (w) (+ b), widened by u ((2 n + 16) max|x| r_hi
    |w| + 4 |y| + 2 |b|) + 2 u_fmt (2 |x-hat| |w| + |b| + |y|); rounded outward into fmt. A row
    with an infinite end, or whose squares may overflow the internal format (4 n max|x|^2 >= its
    largest finite), is the whole line."""
    eps_lo, eps_hi = (eps, eps) if np.isscalar(eps) else eps
    k = len(nshape)
    n = math.prod(nshape) if k else 1
    g = gamma(n + 4, 2.0**-53)
    none = np.zeros(1)
    wlo, whi = (none, none) if w is None else (fused.flat(w.lo), fused.flat(w.hi))
    blo, bhi = (none, none) if b is None else (fused.flat(b.lo), fused.flat(b.hi))
    lo, hi = np.empty(x.shape), np.empty(x.shape)
    small.norm_rows(fused.flat(x.lo), fused.flat(x.hi), lo.size // n, n, rms, float(eps_lo),
                    float(eps_hi), w is not None, wlo, whi, b is not None, blo, bhi, g,
                    get_format(internal(fmt)).unit_roundoff, u_out(fmt),
                    get_format(internal(fmt)).max_finite, get_format(internal(fmt)).min_normal,
                    *rounding(fmt), lo.reshape(-1), hi.reshape(-1))
    return mk(lo, hi)


def sum_rule(x: Interval, dim, keepdim: bool, fmt: str, mean: bool):
    axes = tuple(range(x.ndim)) if dim is None else ((dim,) if isinstance(dim, int) else tuple(dim))
    axes = tuple(a % max(x.ndim, 1) for a in axes)
    n = math.prod(x.shape[a] for a in axes) if axes else 1
    u = get_format(internal(fmt)).unit_roundoff
    g = gamma(n, u) + gamma(n + 2, 2.0**-53)
    with np.errstate(invalid="ignore", over="ignore"):
        slo = np.sum(x.lo, axis=axes, keepdims=keepdim)
        shi = np.sum(x.hi, axis=axes, keepdims=keepdim)
        sa = np.sum(np.maximum(np.abs(x.lo), np.abs(x.hi)), axis=axes, keepdims=keepdim)
        lo, hi = down(slo - g * sa), up(shi + g * sa)
        if mean:
            lo, hi = down(lo / n), up(hi / n)
        # a partial sum may overflow the accumulator (inf, or NaN from inf - inf)
        over = sa * (1 + g) >= get_format(internal(fmt)).max_finite
    return nan_where(finish(mk(lo, hi), fmt, 0.5 if mean else 0), over)


def rule_softmax(log):
    def rule(rec, get, fmt):
        dim = arg(rec.args, rec.kwargs, 1, "dim")
        if dim is None:
            raise UnsupportedOperation("triage needs softmax's dim given explicitly")
        return [softmax_rule(get(rec.args[0]), dim, fmt, log)]
    return rule


def rule_layer_norm(rec, get, fmt):
    x = get(rec.args[0])
    nshape = tuple(arg(rec.args, rec.kwargs, 1, "normalized_shape"))
    w, b = arg(rec.args, rec.kwargs, 2, "weight"), arg(rec.args, rec.kwargs, 3, "bias")
    eps = float(arg(rec.args, rec.kwargs, 4, "eps", 1e-5))
    return [_norm_rule(x, nshape, get(w) if is_tensor(w) else None,
                       get(b) if is_tensor(b) else None, eps, fmt)]


def rule_rms_norm(rec, get, fmt):
    x = get(rec.args[0])
    nshape = tuple(arg(rec.args, rec.kwargs, 1, "normalized_shape"))
    w = arg(rec.args, rec.kwargs, 2, "weight")
    eps = arg(rec.args, rec.kwargs, 3, "eps")
    if eps is None:  # torch's default is finfo(t).eps of the type it computes in: float32 for
        # float16/bfloat16/float32 inputs, float64 for float64; either program may be either
        eps = (torch.finfo(torch.float64).eps, torch.finfo(torch.float32).eps)
    else:
        eps = float(eps)
    return [_norm_rule(x, nshape, get(w) if is_tensor(w) else None, None, eps, fmt, rms=True)]


def rule_sum(mean):
    def rule(rec, get, fmt):
        dim = arg(rec.args, rec.kwargs, 1, "dim")
        keep = bool(arg(rec.args, rec.kwargs, 2, "keepdim", False))
        return [sum_rule(get(rec.args[0]), dim, keep, fmt, mean)]
    return rule


def rule_cross_entropy(rec, get, fmt):
    logits, target = get(rec.args[0]), rec.args[1]
    if arg(rec.args, rec.kwargs, 2, "weight") is not None or \
            float(rec.kwargs.get("label_smoothing", 0.0)) != 0.0:
        raise UnsupportedOperation("triage bounds cross_entropy without weight= and "
                                   "label_smoothing=")
    if target.is_floating_point():
        raise UnsupportedOperation("triage bounds cross_entropy with class-index targets only")
    ignore = rec.kwargs.get("ignore_index", -100)
    reduction = rec.kwargs.get("reduction", "mean")
    if rec.kwargs.get("size_average") is not None or rec.kwargs.get("reduce") is not None:
        raise UnsupportedOperation("triage bounds cross_entropy with reduction=; got the "
                                   "deprecated size_average=/reduce=")
    if reduction not in ("mean", "sum", "none"):
        raise UnsupportedOperation(f"cross_entropy reduction must be 'mean', 'sum' or 'none'; "
                                   f"got {reduction!r}")
    lab = target.detach().cpu().numpy().astype(np.int64)
    if logits.ndim > 2:  # (N, C, d1, ...) -> (N, d1, ..., C)
        logits = mk(np.moveaxis(logits.lo, 1, -1), np.moveaxis(logits.hi, 1, -1))
    keep = lab != ignore
    safe = np.where(keep, lab, 0)
    ls = softmax_rule(logits, -1, "float64", log=True)
    inner = internal(fmt)
    n = logits.shape[-1]
    u = get_format(inner).unit_roundoff
    lo = -np.take_along_axis(ls.hi, safe[..., None], -1)[..., 0]
    hi = -np.take_along_axis(ls.lo, safe[..., None], -1)[..., 0]
    zmax = np.max(np.maximum(np.abs(logits.lo), np.abs(logits.hi)), -1)
    with np.errstate(invalid="ignore", over="ignore"):
        r = (n + 4) * u * (zmax + np.abs(hi) + 1.0) + 2 * u_out(fmt) * (2 * zmax + np.abs(hi) + 1)
    r = np.fmin(r, np.inf)
    per = widen_abs(mk(np.where(keep, lo, 0.0), np.where(keep, hi, 0.0)), np.where(keep, r, 0))
    # the computed loss is >= 0: log of a computed sum >= 1 (the row maximum's term is exactly 1)
    nan = whole(per)
    per = nan_where(mk(np.maximum(per.lo, 0.0), np.maximum(per.hi, 0.0)), nan)
    per = round_into(per, fmt)  # into float32, then fmt: the same bounds
    if reduction == "none":
        return [per]
    m = int(keep.sum())
    if m == 0:  # 0 / 0
        return [mk(-np.inf, np.inf)]
    if not reduced(fmt):  # float32 (float64) accumulation in any order
        total = sum_rule(per, None, False, inner, mean=False)
        if reduction == "sum":
            return [round_into(total, fmt)]
        return [finish(mk(down(total.lo / m), up(total.hi / m)), fmt, 0.5)]
    # float16/bfloat16: torch's CPU nll_loss keeps its partial sums (of losses and of weights)
    # in the dtype; in any order, m nonnegative terms stay within (1 +- u)^(m - 1) of the sum
    uf = u_out(fmt)
    grow = math.exp((m - 1) * uf) * (1 + 2.0**-40)
    shrink = math.exp(-(m - 1) * uf / (1 - uf)) * (1 - 2.0**-40)
    with np.errstate(invalid="ignore", over="ignore"):
        s_lo = down(np.sum(per.lo) * (1 - gamma(m + 2, 2.0**-53)) * shrink)
        s_hi = up(np.sum(per.hi) * (1 + gamma(m + 2, 2.0**-53)) * grow)
    over = s_hi >= get_format(fmt).max_finite
    total = round_into(mk(s_lo, np.inf if over else s_hi), fmt)
    if reduction == "sum":
        return [nan_where(total, nan.any())]
    exact_w = m <= 2.0 ** (get_format(fmt).mantissa_bits + 1)
    w_lo, w_hi = (m, m) if exact_w else (m * shrink, m * grow)
    y = mk(down(total.lo / w_hi), np.inf if over else up(total.hi / w_lo))
    return [nan_where(finish(y, fmt, 0.5), nan.any())]
