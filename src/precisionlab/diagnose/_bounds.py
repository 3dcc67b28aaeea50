"""Interval helpers shared by triage's rules: outward float64 steps, rounding into formats, the
kernel model's budgets (see `rules` for the model), leaves, arguments and matrix products."""

from __future__ import annotations

import math

import numpy as np
import torch

from .. import intervals as iv
from ..formats import get_format

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
    return torch.from_numpy(np.array(a, dtype=np.float64, order="C"))  # keeps 0-d arrays 0-d


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


def _finish(x: iv.Interval, fmt: str, ulps: float, extra: float = 0.0) -> iv.Interval:
    """A result computed in the internal format within ulps ulps, then rounded into fmt; extra:
    further ulps of a float16/bfloat16 fmt for intermediates a kernel keeps in that format."""
    inner = _internal(fmt)
    y = _widen_rel(x, ulps, inner) if ulps > 0 else x
    if inner != "float64":
        y = _round_into(_ftz(y, inner), inner)
    if extra > 0 and _reduced(fmt):
        y = _widen_rel(y, extra, fmt)
    return _round_into(y, fmt)


def _ftz(y: iv.Interval, fmt: str) -> iv.Interval:
    """Vectorised kernels may flush results below fmt's smallest normal to zero: include 0."""
    n = get_format(fmt).min_normal
    lo = np.where((y.lo > 0) & (y.lo < n), 0.0, y.lo)
    hi = np.where((y.hi < 0) & (y.hi > -n), 0.0, y.hi)
    return _mk(lo, hi)


def _reduced(fmt: str) -> bool:
    return fmt in ("float16", "bfloat16")


def _u_out(fmt: str) -> float:
    """The unit roundoff of fmt when it is float16/bfloat16 (intermediates kept in it), else 0."""
    return get_format(fmt).unit_roundoff if _reduced(fmt) else 0.0


def _whole(x: iv.Interval) -> np.ndarray:
    """Elements with no information ([-inf, inf]): their value may also be NaN."""
    return (x.lo == -np.inf) & (x.hi == np.inf)


def _nan_where(y: iv.Interval, mask) -> iv.Interval:
    """y, with the elements under mask widened to the whole line (the value may be NaN)."""
    mask = np.broadcast_to(mask, y.shape)
    if not mask.any():
        return y
    return _mk(np.where(mask, -np.inf, y.lo), np.where(mask, np.inf, y.hi))


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
    with np.errstate(invalid="ignore", over="ignore"):
        c = [a.lo * b.lo, a.lo * b.hi, a.hi * b.lo, a.hi * b.hi]
        nan = np.logical_or.reduce([np.isnan(x) for x in c])  # 0 * inf: NaN in the program
        lo, hi = _dn(np.minimum.reduce(c)), _up(np.maximum.reduce(c))
    return _mk(np.where(nan, -np.inf, lo), np.where(nan, np.inf, hi))


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
