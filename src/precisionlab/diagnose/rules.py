"""Interval rules for the torch operations `triage` bounds: each maps the bounds of an operation's
tensor inputs to a bound on every value the operation may return in a given format.

Conventions (the kernel model `triage` assumes where it knows nothing else):
* bounds are `intervals.Interval`s in float64; every float64 step is rounded outward (one
  float64 ulp, or a relative slack of 2^-44 around torch's float64 exp/log/erf/tanh);
* an operation returning float16, bfloat16 or float32 computes internally in float32 (as
  torch's CPU and CUDA kernels do) and rounds once into its dtype, outward here; float64 in
  float64. Correctly rounded operations (+, -, *, casts) cost half an ulp; division 1.5 ulps
  (a division by a scalar may be a multiplication by its reciprocal); exp, log, tanh,
  sigmoid, erf-based GELU, SiLU 4 ulps of the internal format; softmax and log-softmax over n
  entries n + 4 ulps; layer norm an absolute (2n + 16) u max|x| / std |w| + 4 u |y| + 2 u |b|;
* matrix products are order-oblivious (any summation order) with float32 accumulation of
  exact products (float64 for float64): |fl(sum) - sum| <= gamma_(k+1) sum |a_i b_i|, and
  operands are first rounded to the output's dtype when it is narrower (autocast);
* shape operations (view, reshape, transpose, cat, chunk, indexing, ...) are exact: the same
  operation is applied to the lower and the upper bounds.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from .. import intervals as iv
from ..formats import get_format

__all__ = ["EXACT", "RULES", "UnsupportedOperation", "bound", "leaf", "supported"]

_FN_ULPS = 4.0
_REL = 2.0**-44  # slack around torch's float64 transcendental functions
_TINY = 2.0**-1070


class UnsupportedOperation(ValueError):
    """triage met an operation it has no interval rule for."""


# --------------------------------------------------------------------------- numpy helpers


def _dn(x):
    return np.nextafter(x, -np.inf)


def _up(x):
    return np.nextafter(x, np.inf)


def _np(t: torch.Tensor) -> np.ndarray:
    return t.detach().to(torch.float64).cpu().numpy()


def _t(a: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(a, dtype=np.float64))


def fmt_of(dtype: torch.dtype) -> str:
    """The format name of a floating dtype."""
    names = {torch.float16: "float16", torch.bfloat16: "bfloat16", torch.float32: "float32",
             torch.float64: "float64"}
    if dtype not in names:
        raise UnsupportedOperation(f"triage bounds float16, bfloat16, float32 and float64 "
                                   f"tensors; got dtype {dtype}")
    return names[dtype]


def _internal(fmt: str) -> str:
    return "float64" if fmt == "float64" else "float32"


def _mk(lo, hi) -> iv.Interval:
    lo = np.asarray(lo, dtype=np.float64)
    hi = np.asarray(hi, dtype=np.float64)
    bad = np.isnan(lo) | np.isnan(hi)
    if bad.any():  # no information: the whole line
        lo, hi = np.where(bad, -np.inf, lo), np.where(bad, np.inf, hi)
    return iv.Interval(lo, hi, None, "oblivious")


def _round_into(x: iv.Interval, fmt: str) -> iv.Interval:
    """[RD_fmt(lo), RU_fmt(hi)] (a no-op for float64)."""
    if fmt == "float64":
        return x
    y = iv.cast(x, fmt)
    return _mk(y.lo, y.hi)


def _widen_rel(x: iv.Interval, ulps: float, fmt: str) -> iv.Interval:
    """Bounds on values within ulps ulps of fmt of some value in x: lo - ulps max(eps|lo|, q), ..."""
    f = get_format(fmt)
    with np.errstate(invalid="ignore", over="ignore"):
        dlo = _up(ulps * np.maximum(_up(f.eps * np.abs(x.lo)), f.min_subnormal))
        dhi = _up(ulps * np.maximum(_up(f.eps * np.abs(x.hi)), f.min_subnormal))
        return _mk(_dn(x.lo - dlo), _up(x.hi + dhi))


def _widen_abs(x: iv.Interval, r) -> iv.Interval:
    with np.errstate(invalid="ignore", over="ignore"):
        return _mk(_dn(x.lo - r), _up(x.hi + r))


def _finish(x: iv.Interval, fmt: str, ulps: float) -> iv.Interval:
    """A result computed in the internal format within ulps ulps, then rounded once into fmt."""
    inner = _internal(fmt)
    y = _widen_rel(x, ulps, inner) if ulps > 0 else x
    if inner != "float64":
        y = _round_into(y, inner)
    return _round_into(y, fmt)


def leaf(t: torch.Tensor) -> iv.Interval:
    """Every real that rounds to t in t's format: t -+ ulp/2 (exact for float64, integers, bools)."""
    v = _np(t)
    if not t.is_floating_point() or t.dtype == torch.float64:
        return _mk(v, v)
    f = get_format(fmt_of(t.dtype))
    with np.errstate(divide="ignore", invalid="ignore"):
        _, e = np.frexp(np.abs(v))
        half = np.ldexp(1.0, np.maximum(e - 1, f.emin) - f.mantissa_bits - 1)
    lo, hi = v - half, v + half  # exact: both fit float64
    return _mk(np.where(np.isfinite(v), lo, v), np.where(np.isfinite(v), hi, v))


# --------------------------------------------------------------------------- arguments


def _scalar(v, fmt: str) -> iv.Interval:
    """A Python number used with a tensor: its value, as converted to float32 or to fmt."""
    x = float(v)
    vals = [x]
    if fmt != "float64" and math.isfinite(x):
        vals += [float(iv.cast(np.array(x), "float32")), float(iv.cast(np.array(x), fmt))]
    return _mk(min(vals), max(vals))


def _arg(args, kwargs, i, name, default=None):
    if len(args) > i:
        return args[i]
    return kwargs.get(name, default)


def _is_t(x) -> bool:
    return isinstance(x, torch.Tensor)


# --------------------------------------------------------------------------- matrix products


def _gamma(k: int, u: float) -> float:
    ku = k * u
    return ku / (1 - ku) if ku < 1 else math.inf


def _mm(a: iv.Interval, b: iv.Interval, bias: iv.Interval | None, fmt: str, b_t: bool = False):
    """Bound of a @ b (+ bias) for (..., m, k) @ (..., k, n); b_t: b is given as (..., n, k)."""
    acc = _internal(fmt)
    if fmt != "float64":  # autocast: operands rounded into the output's format first
        a, b = _round_into(a, fmt), _round_into(b, fmt)
        if bias is not None:
            bias = _round_into(bias, fmt)
    alo, ahi, blo, bhi = _t(a.lo), _t(a.hi), _t(b.lo), _t(b.hi)
    if b_t:
        blo, bhi = blo.transpose(-1, -2), bhi.transpose(-1, -2)
    k = alo.shape[-1]
    lead = None
    if blo.ndim == 2 and alo.ndim > 2:  # one GEMM for a weight matrix
        lead = alo.shape[:-1]
        alo, ahi = alo.reshape(-1, k), ahi.reshape(-1, k)
    am, bm = alo / 2 + ahi / 2, blo / 2 + bhi / 2
    ar = torch.maximum(ahi - am, am - alo)
    br = torch.maximum(bhi - bm, bm - blo)
    g64 = _gamma(k + 4, 2.0**-53)
    ar, br = ar * (1 + 4 * g64), br * (1 + 4 * g64)  # round the radii up generously
    aa, ba = am.abs() + ar, bm.abs() + br
    with np.errstate(invalid="ignore", over="ignore"):
        pm = am @ bm
        pr = am.abs() @ br + ar @ bm.abs() + ar @ br
        s = aa @ ba
        terms = k
        if bias is not None:
            blo_, bhi_ = _t(bias.lo), _t(bias.hi)
            bmid = blo_ / 2 + bhi_ / 2
            brad = torch.maximum(bhi_ - bmid, bmid - blo_) * (1 + 4 * g64)
            pm, pr, s = pm + bmid, pr + brad, s + bmid.abs() + brad
            terms += 1
        u = get_format(acc).unit_roundoff
        q = get_format(acc).min_subnormal
        rad = (pr + (_gamma(terms, u) + 3 * g64) * s) * (1 + 8 * g64) + terms * (q + _TINY)
        lo, hi = _dn((pm - rad).numpy()), _up((pm + rad).numpy())
        over = (s * (1 + _gamma(terms, u))).numpy() >= get_format(acc).max_finite
    lo, hi = np.where(over, -np.inf, lo), np.where(over, np.inf, hi)
    if lead is not None:
        lo, hi = lo.reshape(*lead, -1), hi.reshape(*lead, -1)
    return _round_into(_mk(lo, hi), fmt)


# --------------------------------------------------------------------------- elementwise


def _mul_iv(a: iv.Interval, b: iv.Interval) -> iv.Interval:
    """Exact product bounds (float64, outward)."""
    c = [a.lo * b.lo, a.lo * b.hi, a.hi * b.lo, a.hi * b.hi]
    with np.errstate(invalid="ignore"):
        c = [np.where(np.isnan(x), 0.0, x) for x in c]  # 0 * inf: the product is 0 or unbounded
    return _mk(_dn(np.minimum.reduce(c)), _up(np.maximum.reduce(c)))


def _square(a: iv.Interval) -> iv.Interval:
    lo2, hi2 = a.lo * a.lo, a.hi * a.hi
    straddle = (a.lo <= 0) & (a.hi >= 0)
    return _mk(np.where(straddle, 0.0, _dn(np.minimum(lo2, hi2))), _up(np.maximum(lo2, hi2)))


def _fn64(fn, x: np.ndarray) -> np.ndarray:
    with np.errstate(invalid="ignore"):
        return fn(_t(x)).numpy()


def _mono(x: iv.Interval, fn, increasing: bool = True) -> iv.Interval:
    """fn applied to both ends of a monotone function, with float64 slack."""
    a, b = _fn64(fn, x.lo), _fn64(fn, x.hi)
    lo, hi = (a, b) if increasing else (b, a)
    with np.errstate(invalid="ignore", over="ignore"):
        return _mk(_dn(lo - np.abs(lo) * _REL - _TINY), _up(hi + np.abs(hi) * _REL + _TINY))


def _unimodal(x: iv.Interval, fn, xmin: float) -> iv.Interval:
    """fn decreasing up to xmin and increasing after it: [min incl. fn(xmin) if inside, max of ends]."""
    a, b = _fn64(fn, x.lo), _fn64(fn, x.hi)
    fmin = float(fn(torch.tensor(xmin, dtype=torch.float64)))
    inside = (x.lo <= xmin) & (x.hi >= xmin)
    lo = np.where(inside, fmin - abs(fmin) * 1e-6, np.minimum(a, b))  # fmin's location is rounded
    hi = np.maximum(a, b)
    with np.errstate(invalid="ignore", over="ignore"):
        return _mk(_dn(lo - np.abs(lo) * _REL - _TINY), _up(hi + np.abs(hi) * _REL + _TINY))


def _gelu64(approximate):
    return lambda z: torch.nn.functional.gelu(z, approximate=approximate)


# --------------------------------------------------------------------------- softmax family


def _lse_parts(x: iv.Interval):
    """Per row (last axis) of the box: S_hi = sum e^(hi - c) and S_lo = sum e^(lo - c), c = max hi."""
    c = np.max(x.hi, axis=-1, keepdims=True)
    c = np.where(np.isfinite(c), c, 0.0)
    with np.errstate(invalid="ignore", over="ignore"):
        e_hi = np.exp(x.hi - c) * (1 + _REL) + _TINY
        e_lo = np.maximum(np.exp(x.lo - c) * (1 - _REL) - _TINY, 0.0)
    n = x.shape[-1]
    g = _gamma(n + 2, 2.0**-53)
    s_hi = np.sum(e_hi, axis=-1, keepdims=True) * (1 + g)
    s_lo = np.sum(e_lo, axis=-1, keepdims=True) * (1 - g)
    return c, e_lo, e_hi, s_lo, s_hi


def _softmax_exact(x: iv.Interval) -> iv.Interval:
    """s_i in [e^lo_i / (e^lo_i + sum_(j!=i) e^hi_j), e^hi_i / (e^hi_i + sum_(j!=i) e^lo_j)]."""
    _, e_lo, e_hi, s_lo, s_hi = _lse_parts(x)
    with np.errstate(invalid="ignore", divide="ignore"):
        other_hi = np.maximum(s_hi - e_lo, 0.0) * (1 + 2.0**-50) + _TINY  # >= sum_(j != i) e^hi_j
        other_lo = np.maximum(s_lo - e_hi, 0.0) * (1 - 2.0**-50)
        lo = e_lo / (e_lo + other_hi) * (1 - 2.0**-50)
        hi = e_hi / (e_hi + other_lo) * (1 + 2.0**-50)
    lo = np.where(np.isnan(lo), 0.0, lo)
    hi = np.where(np.isnan(hi), 1.0, hi)
    return _mk(np.clip(lo, 0, 1), np.clip(hi, 0, 1))


def _log_softmax_exact(x: iv.Interval) -> iv.Interval:
    """log s_i in [lo_i - c - log S_hi', hi_i - c - log S_lo'] over the box."""
    c, e_lo, e_hi, s_lo, s_hi = _lse_parts(x)
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        other_hi = np.maximum(s_hi - e_lo, 0.0) * (1 + 2.0**-50) + _TINY
        other_lo = np.maximum(s_lo - e_hi, 0.0) * (1 - 2.0**-50)
        lo = (x.lo - c) - np.log(e_lo + other_hi)
        hi = (x.hi - c) - np.log(np.maximum(e_hi + other_lo, _TINY))
        lo = _dn(lo - np.abs(lo) * _REL - 2.0**-60)
        hi = np.minimum(_up(hi + np.abs(hi) * _REL + 2.0**-60), 0.0)
    return _mk(np.where(np.isnan(lo), -np.inf, lo), np.where(np.isnan(hi), 0.0, hi))


def _moved(x: iv.Interval, dim: int, fn) -> iv.Interval:
    lo, hi = np.moveaxis(x.lo, dim, -1), np.moveaxis(x.hi, dim, -1)
    y = fn(_mk(lo, hi))
    return _mk(np.moveaxis(y.lo, -1, dim), np.moveaxis(y.hi, -1, dim))


def _softmax_rule(x, dim, fmt, log=False):
    n = x.shape[dim] if x.ndim else 1
    if log:
        def fn(z):
            y = _log_softmax_exact(z)
            inner = get_format(_internal(fmt))
            r = (n + 4) * inner.unit_roundoff * (np.abs(z.lo - np.max(z.hi, -1, keepdims=True))
                                                 + np.abs(y.lo) + 1.0)
            r = np.where(np.isfinite(r), r, 0.0)
            return _widen_abs(y, r)
        y = _moved(x, dim, fn)
        return _round_into(_round_into(y, _internal(fmt)), fmt)
    y = _moved(x, dim, _softmax_exact)
    y = _finish(y, fmt, n + 4)
    return _mk(np.maximum(y.lo, 0.0), np.minimum(y.hi, 1.0))


# --------------------------------------------------------------------------- normalisation


def _norm_rule(x: iv.Interval, nshape, w, b, eps: float, fmt: str, rms: bool = False):
    k = len(nshape)
    lead = x.shape[: x.ndim - k]
    n = int(np.prod(nshape)) if k else 1
    lo, hi = x.lo.reshape(*lead, n), x.hi.reshape(*lead, n)
    g = _gamma(n + 4, 2.0**-53)
    if rms:
        d = _mk(lo, hi)
    else:
        m_lo = np.sum(lo, -1, keepdims=True) / n
        m_hi = np.sum(hi, -1, keepdims=True) / n
        sl = np.sum(np.abs(lo), -1, keepdims=True) / n + np.sum(np.abs(hi), -1, keepdims=True) / n
        m_lo, m_hi = _dn(m_lo - g * sl), _up(m_hi + g * sl)
        d = _mk(_dn(lo - m_hi), _up(hi - m_lo))
    sq = _square(d)
    v_lo = _dn(np.sum(sq.lo, -1, keepdims=True) / n * (1 - g))
    v_hi = _up(np.sum(sq.hi, -1, keepdims=True) / n * (1 + g))
    r_hi = _up(1.0 / np.sqrt(_dn(np.maximum(v_lo, 0.0) + eps)) * (1 + g))
    r_lo = _dn(1.0 / np.sqrt(_up(v_hi + eps)) * (1 - g))
    y = _mul_iv(d, _mk(r_lo, r_hi))
    xmax = np.max(np.maximum(np.abs(lo), np.abs(hi)), -1, keepdims=True)
    wabs = 1.0
    if w is not None:
        wi = _mk(w.lo.reshape(n), w.hi.reshape(n))
        y = _mul_iv(y, wi)
        wabs = np.maximum(np.abs(wi.lo), np.abs(wi.hi))
    babs = 0.0
    if b is not None:
        bi = _mk(b.lo.reshape(n), b.hi.reshape(n))
        y = _mk(_dn(y.lo + bi.lo), _up(y.hi + bi.hi))
        babs = np.maximum(np.abs(bi.lo), np.abs(bi.hi))
    u = get_format(_internal(fmt)).unit_roundoff
    yabs = np.maximum(np.abs(y.lo), np.abs(y.hi))
    with np.errstate(invalid="ignore", over="ignore"):
        r = u * ((2 * n + 16) * xmax * r_hi * wabs + 4 * yabs + 2 * babs)
    y = _widen_abs(y, np.where(np.isnan(r), np.inf, r))
    y = _round_into(_round_into(y, _internal(fmt)), fmt)
    return _mk(y.lo.reshape(x.shape), y.hi.reshape(x.shape))


def _sum_rule(x: iv.Interval, dim, keepdim: bool, fmt: str, mean: bool):
    axes = tuple(range(x.ndim)) if dim is None else ((dim,) if isinstance(dim, int) else tuple(dim))
    axes = tuple(a % max(x.ndim, 1) for a in axes)
    n = int(np.prod([x.shape[a] for a in axes])) if axes else 1
    u = get_format(_internal(fmt)).unit_roundoff
    g = _gamma(n, u) + _gamma(n + 2, 2.0**-53)
    with np.errstate(invalid="ignore", over="ignore"):
        slo = np.sum(x.lo, axis=axes, keepdims=keepdim)
        shi = np.sum(x.hi, axis=axes, keepdims=keepdim)
        sa = np.sum(np.maximum(np.abs(x.lo), np.abs(x.hi)), axis=axes, keepdims=keepdim)
        lo, hi = _dn(slo - g * sa), _up(shi + g * sa)
        if mean:
            lo, hi = _dn(lo / n), _up(hi / n)
    return _finish(_mk(lo, hi), fmt, 0.5 if mean else 0)


# --------------------------------------------------------------------------- the rule table

EXACT = frozenset({
    "reshape", "view", "view_as", "reshape_as", "transpose", "permute", "flatten", "unflatten",
    "squeeze", "unsqueeze", "contiguous", "chunk", "split", "tensor_split", "cat", "concat",
    "concatenate", "stack", "expand", "expand_as", "repeat", "__getitem__", "narrow", "t",
    "select", "unbind", "clone", "detach", "movedim", "swapaxes", "roll", "flip", "triu",
    "tril", "index_select", "gather", "take_along_dim", "T", "mT", "data", "masked_fill",
    "masked_fill_", "split_with_sizes", "pad", "__setitem__", "copy_", "fill_", "zero_",
})
_CASTS = {"float": torch.float32, "half": torch.float16, "bfloat16": torch.bfloat16,
          "double": torch.float64}


def _apply_exact(rec, get, fmt_out):
    """Run the operation on the lower bounds, then on the upper bounds (float64 tensors)."""
    los, his = {}, {}

    def sub(obj, which):
        if _is_t(obj) and obj.is_floating_point():
            b = get(obj)
            return _t(b.lo if which == "lo" else b.hi).clone()
        if isinstance(obj, (list, tuple)):
            return type(obj)(sub(o, which) for o in obj)
        return obj

    for which, store in (("lo", los), ("hi", his)):
        a = [sub(x, which) for x in rec.args]
        kw = {k: sub(v, which) for k, v in rec.kwargs.items()}
        out = rec.func(*a, **kw)
        store["out"] = a[0] if rec.name == "__setitem__" else out
    lo, hi = los["out"], his["out"]
    if _is_t(lo):
        lo, hi = [lo], [hi]
    outs = []
    for a, b in zip(lo, hi, strict=True):
        y = _mk(np.minimum(a.numpy(), b.numpy()), np.maximum(a.numpy(), b.numpy()))
        fills = ("masked_fill", "masked_fill_", "pad", "__setitem__", "copy_", "fill_")
        outs.append(_round_into(y, fmt_out) if rec.name in fills else y)
    return outs


def supported() -> tuple[str, ...]:
    """Names of every operation triage can bound."""
    return tuple(sorted(set(RULES) | EXACT | set(_CASTS) | {"to", "type", "type_as"}))


def _binary(name):
    def rule(rec, get, fmt):
        a, b = rec.args[0], _arg(rec.args, rec.kwargs, 1, "other")
        if name in ("__rsub__", "rsub", "__rtruediv__"):
            a, b = b, a
        A = get(a) if _is_t(a) else _scalar(a, fmt)
        B = get(b) if _is_t(b) else _scalar(b, fmt)
        alpha = rec.kwargs.get("alpha", 1)
        if alpha != 1:
            B = _mul_iv(B, _mk(float(alpha), float(alpha)))
        op = name.strip("_").removeprefix("r").removeprefix("i").rstrip("_")
        inner = _internal(fmt)
        if op in ("add",):
            y = iv.add(A, B, inner)
        elif op in ("sub", "subtract"):
            y = iv.sub(A, B, inner)
        elif op in ("mul", "multiply"):
            y = iv.mul(A, B, inner)
        else:
            y = iv.div(A, B, inner, ulps=1.5)
        return [_round_into(_mk(y.lo, y.hi), fmt)]
    return rule


def _r_linear(rec, get, fmt):
    x, w = get(rec.args[0]), get(_arg(rec.args, rec.kwargs, 1, "weight"))
    b = _arg(rec.args, rec.kwargs, 2, "bias")
    return [_mm(x, w, get(b) if _is_t(b) else None, fmt, b_t=True)]


def _r_matmul(rec, get, fmt):
    a, b = rec.args[0], _arg(rec.args, rec.kwargs, 1, "other")
    A, B = get(a), get(b)
    if A.ndim < 2 or B.ndim < 2:
        raise UnsupportedOperation("triage bounds matmul of operands with >= 2 axes; got shapes "
                                   f"{A.shape} and {B.shape}")
    return [_mm(A, B, None, fmt)]


def _r_addmm(rec, get, fmt):
    bias, a, b = (get(t) for t in rec.args[:3])
    if rec.kwargs.get("beta", 1) != 1 or rec.kwargs.get("alpha", 1) != 1:
        raise UnsupportedOperation("triage bounds addmm/baddbmm with alpha = beta = 1 only")
    return [_mm(a, b, bias, fmt)]


def _r_softmax(log):
    def rule(rec, get, fmt):
        dim = _arg(rec.args, rec.kwargs, 1, "dim")
        if dim is None:
            raise UnsupportedOperation("triage needs softmax's dim given explicitly")
        return [_softmax_rule(get(rec.args[0]), dim, fmt, log)]
    return rule


def _r_layer_norm(rec, get, fmt):
    x = get(rec.args[0])
    nshape = tuple(_arg(rec.args, rec.kwargs, 1, "normalized_shape"))
    w, b = _arg(rec.args, rec.kwargs, 2, "weight"), _arg(rec.args, rec.kwargs, 3, "bias")
    eps = float(_arg(rec.args, rec.kwargs, 4, "eps", 1e-5))
    return [_norm_rule(x, nshape, get(w) if _is_t(w) else None, get(b) if _is_t(b) else None,
                       eps, fmt)]


def _r_rms_norm(rec, get, fmt):
    x = get(rec.args[0])
    nshape = tuple(_arg(rec.args, rec.kwargs, 1, "normalized_shape"))
    w = _arg(rec.args, rec.kwargs, 2, "weight")
    eps = _arg(rec.args, rec.kwargs, 3, "eps")
    eps = torch.finfo(rec.args[0].dtype).eps if eps is None else float(eps)
    return [_norm_rule(x, nshape, get(w) if _is_t(w) else None, None, eps, fmt, rms=True)]


def _r_embedding(rec, get, fmt):
    idx, w = rec.args[0], get(_arg(rec.args, rec.kwargs, 1, "weight"))
    if _arg(rec.args, rec.kwargs, 3, "max_norm") is not None:
        raise UnsupportedOperation("triage cannot bound embedding with max_norm (it rescales rows)")
    i = idx.detach().cpu().numpy()
    return [_mk(w.lo[i], w.hi[i])]


def _r_unary(fn, ulps, kind="mono", xmin=None):
    def rule(rec, get, fmt):
        x = get(rec.args[0])
        if kind == "mono":
            y = _mono(x, fn)
        elif kind == "dec":
            y = _mono(x, fn, increasing=False)
        else:
            y = _unimodal(x, fn, xmin)
        return [_finish(y, fmt, ulps)]
    return rule


def _r_gelu(rec, get, fmt):
    approx = _arg(rec.args, rec.kwargs, 1, "approximate", "none")
    x = get(rec.args[0])
    y = _unimodal(x, _gelu64(approx), -0.7517916243)
    # x Phi(x) with Phi = (1 + erf(x / sqrt 2)) / 2: Phi's absolute error (cancellation for
    # x < 0) times |x|, beside the relative budget
    u = get_format(_internal(fmt)).unit_roundoff
    y = _widen_abs(y, 8 * u * np.maximum(np.abs(x.lo), np.abs(x.hi)))
    return [_finish(y, fmt, _FN_ULPS + (4 if approx == "tanh" else 0))]


def _r_relu(rec, get, fmt):
    x = get(rec.args[0])
    return [_mk(np.maximum(x.lo, 0.0), np.maximum(x.hi, 0.0))]


def _r_sqrt(rec, get, fmt):
    x = get(rec.args[0])
    y = _mono(_mk(np.maximum(x.lo, 0), np.maximum(x.hi, 0)), torch.sqrt)
    return [_finish(y, fmt, 0.5)]


def _r_rsqrt(rec, get, fmt):
    x = get(rec.args[0])
    y = _mono(_mk(np.maximum(x.lo, 0), np.maximum(x.hi, 0)), torch.rsqrt, increasing=False)
    return [_finish(y, fmt, 2.0)]


def _r_pow(rec, get, fmt):
    e = _arg(rec.args, rec.kwargs, 1, "exponent")
    x = get(rec.args[0])
    if _is_t(e) or e not in (1, 2, 0.5, -0.5):
        raise UnsupportedOperation(f"triage bounds pow with exponent 1, 2, 0.5 or -0.5; got {e!r}")
    if e == 1:
        return [x]
    if e == 2:
        return [_finish(_square(x), fmt, 0.5)]
    pos = _mk(np.maximum(x.lo, 0), np.maximum(x.hi, 0))
    y = _mono(pos, torch.sqrt) if e == 0.5 else _mono(pos, torch.rsqrt, increasing=False)
    return [_finish(y, fmt, 2.0)]


def _r_neg(rec, get, fmt):
    x = get(rec.args[0])
    return [_mk(-x.hi, -x.lo)]


def _r_sum(mean):
    def rule(rec, get, fmt):
        dim = _arg(rec.args, rec.kwargs, 1, "dim")
        keep = bool(_arg(rec.args, rec.kwargs, 2, "keepdim", False))
        return [_sum_rule(get(rec.args[0]), dim, keep, fmt, mean)]
    return rule


def _r_amax(rec, get, fmt):
    x = get(rec.args[0])
    dim = _arg(rec.args, rec.kwargs, 1, "dim", ())
    keep = bool(_arg(rec.args, rec.kwargs, 2, "keepdim", False))
    axes = tuple(range(x.ndim)) if dim in ((), None) else ((dim,) if isinstance(dim, int) else
                                                            tuple(dim))
    return [_mk(np.max(x.lo, axis=axes, keepdims=keep), np.max(x.hi, axis=axes, keepdims=keep))]


def _r_where(rec, get, fmt):
    if rec.args[0].dtype == torch.bool:  # torch.where(condition, input, other)
        c, a, b = (_arg(rec.args, rec.kwargs, i, n) for i, n in ((0, "condition"), (1, "input"),
                                                                 (2, "other")))
    else:  # input.where(condition, other)
        a, c, b = (_arg(rec.args, rec.kwargs, i, n) for i, n in ((0, "input"), (1, "condition"),
                                                                 (2, "other")))
    cond = c.detach().cpu().numpy().astype(bool)
    A = get(a) if _is_t(a) else _scalar(a, fmt)
    B = get(b) if _is_t(b) else _scalar(b, fmt)
    y = _mk(np.where(cond, A.lo, B.lo), np.where(cond, A.hi, B.hi))
    return [_round_into(y, fmt)]


def _r_dropout(rec, get, fmt):
    p = _arg(rec.args, rec.kwargs, 1, "p", 0.5)
    training = _arg(rec.args, rec.kwargs, 2, "training", True)
    if training and p > 0:
        raise UnsupportedOperation("triage cannot bound dropout in training mode (it is random); "
                                   "call model.eval() first")
    return [get(rec.args[0])]


def _r_cross_entropy(rec, get, fmt):
    logits, target = get(rec.args[0]), rec.args[1]
    if _arg(rec.args, rec.kwargs, 2, "weight") is not None or \
            float(rec.kwargs.get("label_smoothing", 0.0)) != 0.0:
        raise UnsupportedOperation("triage bounds cross_entropy without weight= and "
                                   "label_smoothing=")
    if target.is_floating_point():
        raise UnsupportedOperation("triage bounds cross_entropy with class-index targets only")
    ignore = rec.kwargs.get("ignore_index", -100)
    reduction = rec.kwargs.get("reduction", "mean")
    lab = target.detach().cpu().numpy().astype(np.int64)
    if logits.ndim > 2:  # (N, C, d1, ...) -> (N, d1, ..., C)
        logits = _mk(np.moveaxis(logits.lo, 1, -1), np.moveaxis(logits.hi, 1, -1))
    keep = lab != ignore
    safe = np.where(keep, lab, 0)
    ls = _softmax_rule(logits, -1, "float64", log=True)
    inner = _internal(fmt)
    n = logits.shape[-1]
    u = get_format(inner).unit_roundoff
    lo = -np.take_along_axis(ls.hi, safe[..., None], -1)[..., 0]
    hi = -np.take_along_axis(ls.lo, safe[..., None], -1)[..., 0]
    zmax = np.max(np.maximum(np.abs(logits.lo), np.abs(logits.hi)), -1)
    r = (n + 4) * u * (zmax + np.abs(hi) + 1.0)
    per = _widen_abs(_mk(np.where(keep, lo, 0.0), np.where(keep, hi, 0.0)), np.where(keep, r, 0))
    if reduction == "none":
        return [_round_into(_round_into(per, inner), fmt)]
    m = int(keep.sum())
    total = _sum_rule(per, None, False, inner, mean=False)
    if reduction == "sum":
        return [_round_into(total, fmt)]
    if m == 0:
        return [_mk(-np.inf, np.inf)]
    y = _mk(_dn(total.lo / m), _up(total.hi / m))
    return [_finish(y, fmt, 0.5)]


def _r_sdpa(rec, get, fmt):
    q, k, v = (get(rec.args[i]) for i in range(3))
    mask = _arg(rec.args, rec.kwargs, 3, "attn_mask")
    if float(_arg(rec.args, rec.kwargs, 4, "dropout_p", 0.0)) > 0:
        raise UnsupportedOperation("triage cannot bound attention dropout (dropout_p > 0)")
    causal = bool(_arg(rec.args, rec.kwargs, 5, "is_causal", False))
    scale = _arg(rec.args, rec.kwargs, 6, "scale")
    if rec.kwargs.get("enable_gqa", False):
        raise UnsupportedOperation("triage does not bound scaled_dot_product_attention with "
                                   "enable_gqa=True")
    d = q.shape[-1]
    scale = 1.0 / math.sqrt(d) if scale is None else float(scale)
    # a fused kernel may keep scores and probabilities in float32 or round them to the dtype:
    # rounding outward into the dtype covers both.
    s = _mm(q, _mk(np.swapaxes(k.lo, -1, -2), np.swapaxes(k.hi, -1, -2)), None, fmt)
    sc = _mk(float(scale * (1 - 2.0**-52)), float(scale * (1 + 2.0**-52)))
    s = _finish(_mul_iv(s, sc), fmt, 1.0)
    L, S = s.shape[-2], s.shape[-1]
    if causal:
        keep = np.tril(np.ones((L, S), dtype=bool))
        s = _mk(np.where(keep, s.lo, -np.inf), np.where(keep, s.hi, -np.inf))
    if _is_t(mask):
        if mask.dtype == torch.bool:
            mk = mask.detach().cpu().numpy()
            s = _mk(np.where(mk, s.lo, -np.inf), np.where(mk, s.hi, -np.inf))
        else:
            m = get(mask)
            s = _finish(_mk(_dn(s.lo + m.lo), _up(s.hi + m.hi)), fmt, 0.5)
    p = _softmax_rule(s, -1, fmt)
    return [_mm(p, v, None, fmt)]


RULES = {
    "linear": _r_linear, "matmul": _r_matmul, "__matmul__": _r_matmul, "__rmatmul__": None,
    "mm": _r_matmul, "bmm": _r_matmul, "addmm": _r_addmm, "baddbmm": _r_addmm,
    "softmax": _r_softmax(False), "log_softmax": _r_softmax(True),
    "layer_norm": _r_layer_norm, "rms_norm": _r_rms_norm, "embedding": _r_embedding,
    "gelu": _r_gelu, "relu": _r_relu, "relu_": _r_relu,
    "silu": _r_unary(torch.nn.functional.silu, _FN_ULPS, "uni", -1.2784645428),
    "tanh": _r_unary(torch.tanh, _FN_ULPS), "sigmoid": _r_unary(torch.sigmoid, _FN_ULPS),
    "exp": _r_unary(torch.exp, _FN_ULPS), "log": _r_unary(torch.log, _FN_ULPS),
    "sqrt": _r_sqrt, "rsqrt": _r_rsqrt, "pow": _r_pow, "__pow__": _r_pow, "square": None,
    "neg": _r_neg, "__neg__": _r_neg, "negative": _r_neg,
    "sum": _r_sum(False), "mean": _r_sum(True), "amax": _r_amax,
    "where": _r_where, "dropout": _r_dropout, "cross_entropy": _r_cross_entropy,
    "scaled_dot_product_attention": _r_sdpa,
}
for _n in ("add", "sub", "mul", "div"):
    for _v in (_n, f"__{_n}__", f"__r{_n}__", f"__i{_n}__", f"{_n}_"):
        RULES[_v] = _binary(_v)
for _v in ("true_divide", "__truediv__", "__rtruediv__", "__itruediv__", "subtract", "multiply",
           "rsub"):
    RULES[_v] = _binary(_v)
RULES["square"] = lambda rec, get, fmt: [_finish(_square(get(rec.args[0])), fmt, 0.5)]
del RULES["__rmatmul__"]


def bound(rec, get, fmt: str) -> list:
    """The operation's output bounds (one per output tensor) with results in fmt."""
    name = rec.name
    if name in EXACT:
        if name == "pad" and _arg(rec.args, rec.kwargs, 2, "mode", "constant") != "constant":
            raise UnsupportedOperation("triage bounds pad with mode='constant' only")
        return _apply_exact(rec, get, fmt)
    if name in _CASTS or name in ("to", "type", "type_as"):
        return [_round_into(get(rec.args[0]), fmt)]
    rule = RULES.get(name)
    if rule is None:
        raise UnsupportedOperation(name)
    return rule(rec, get, fmt)
