"""Interval helpers shared by triage's rules: outward float64 steps, rounding into formats, the
kernel model's budgets (see `rules` for the model), leaves, arguments and matrix products."""

from __future__ import annotations

import functools
import math

import numpy as np
import torch

from .. import intervals as iv
from ..formats import get_format
from . import fused, kernels

_FN_ULPS = 4.0
_REL = 2.0**-44  # slack around torch's float64 transcendental functions
_TINY = 2.0**-1070


class UnsupportedOperation(ValueError):
    """triage met an operation it has no interval rule for."""


# --------------------------------------------------------------------------- numpy helpers


def _step(x, sign: int) -> np.ndarray:
    """nextafter(x, sign inf) in one compiled pass; infinities stay (past every format's range)."""
    a = np.asarray(x, dtype=np.float64)
    out = np.empty(a.shape)
    fused.step(fused.flat(a), float(sign), out.reshape(-1))
    return out


def _dn(x):
    """The float64 below x."""
    return _step(x, -1)


def _up(x):
    """The float64 above x."""
    return _step(x, 1)


def _np(t: torch.Tensor) -> np.ndarray:
    """t's values as a float64 NumPy array (t's own memory where t is one already)."""
    return as_numpy(t, torch.float64)


def as_numpy(t: torch.Tensor, dtype: torch.dtype) -> np.ndarray:
    """t's values as a NumPy array of dtype, without the detach and copies it does not need."""
    if t.dtype != dtype:
        t = t.to(dtype)
    if t.is_cpu and not t.requires_grad:
        return t.numpy()
    return t.detach().cpu().numpy()


def _t(a: np.ndarray) -> torch.Tensor:
    """A float64 tensor of a's values: a's own memory when it is contiguous and writable."""
    a = np.asarray(a, dtype=np.float64)
    if a.flags.c_contiguous and a.flags.writeable:
        return torch.from_numpy(a)
    return torch.from_numpy(np.array(a, dtype=np.float64, order="C"))  # keeps 0-d arrays 0-d


def fmt_of(dtype: torch.dtype) -> str:
    """The format name of a floating dtype."""
    name = _FMT_NAMES.get(dtype)
    if name is None:
        raise UnsupportedOperation(f"triage bounds float16, bfloat16, float32 and float64 "
                                   f"tensors; got dtype {dtype}")
    return name


_FMT_NAMES = {torch.float16: "float16", torch.bfloat16: "bfloat16", torch.float32: "float32",
              torch.float64: "float64"}


@functools.cache
def rounding(fmt: str) -> tuple[int, int, float, float]:
    """(fraction bits, -1 for float64: no rounding; smallest normal exponent; largest finite;
    smallest subnormal): the arguments by which `fused`'s kernels round outward into fmt."""
    f = get_format(fmt)
    return (-1 if f.name == "float64" else f.mantissa_bits, f.emin, f.max_finite,
            f.min_subnormal)


def _internal(fmt: str) -> str:
    return "float64" if fmt == "float64" else "float32"


def _mk(lo, hi) -> iv.Interval:
    """[lo, hi] as an order-oblivious Interval; a NaN end means no information (the whole line).

    Where every lo <= hi (no NaN, no empty range) the Interval is assembled directly: its
    constructor's checks (NaN ends, lo > hi) are the ones just made, and its copies are not
    needed (no rule writes into a bound's arrays)."""
    lo = np.asarray(lo, dtype=np.float64)
    hi = np.asarray(hi, dtype=np.float64)
    if lo.shape != hi.shape:
        lo, hi = np.broadcast_arrays(lo, hi)
    if (lo <= hi).all():
        return _bare(lo, hi)
    bad = np.isnan(lo) | np.isnan(hi)
    if bad.any():  # no information: the whole line
        lo, hi = np.where(bad, -np.inf, lo), np.where(bad, np.inf, hi)
    return iv.Interval(lo, hi, None, "oblivious")


def _bare(lo: np.ndarray, hi: np.ndarray) -> iv.Interval:
    """[lo, hi] for float64 arrays of one shape with every lo <= hi (no check)."""
    x = _BARE(iv.Interval)
    x.lo, x.hi, x.nan, x.value, x.rule = lo, hi, np.zeros(lo.shape, bool), None, "oblivious"
    return x


_BARE = object.__new__


def _round_into(x: iv.Interval, fmt: str) -> iv.Interval:
    """[RD_fmt(lo), RU_fmt(hi)] (a no-op for float64); intervals.cast's bounds, by `_directed`.
    The formats' values nest (float16, bfloat16 inside float32 inside float64), so rounding
    into float32 first and then into fmt gives the same bounds: callers round once."""
    if fmt == "float64":
        return x
    lo, hi = np.asarray(x.lo, dtype=np.float64), np.asarray(x.hi, dtype=np.float64)
    if lo.shape != hi.shape:
        lo, hi = np.broadcast_arrays(lo, hi)
    out_lo, out_hi = np.empty(lo.shape), np.empty(lo.shape)  # `_directed`'s values, one pass
    if fused.round_out(fused.flat(lo), fused.flat(hi), *rounding(fmt), out_lo.reshape(-1),
                       out_hi.reshape(-1)):
        return _bare(out_lo, out_hi)
    return _mk(out_lo, out_hi)


def _widen_rel(x: iv.Interval, ulps: float, fmt: str, ftz: bool = False) -> iv.Interval:
    """[lo - ulps max(eps|lo|, q), hi + ulps max(eps|hi|, q)] outward, inf kept; ftz: `_ftz`."""
    # an exact -inf (a masked score) is no neighbour of finite values; one compiled pass
    f = get_format(fmt)
    lo, hi = np.asarray(x.lo, dtype=np.float64), np.asarray(x.hi, dtype=np.float64)
    if lo.shape != hi.shape:
        lo, hi = np.broadcast_arrays(lo, hi)
    out_lo, out_hi = np.empty(lo.shape), np.empty(lo.shape)
    if fused.widen_rel(fused.flat(lo), fused.flat(hi), float(ulps), f.eps, f.min_subnormal,
                       f.min_normal if ftz else 0.0, out_lo.reshape(-1), out_hi.reshape(-1)):
        return _bare(out_lo, out_hi)
    return _mk(out_lo, out_hi)


def _widen_abs(x: iv.Interval, r) -> iv.Interval:
    with np.errstate(invalid="ignore", over="ignore"):
        return _mk(_dn(x.lo - r), _up(x.hi + r))


def _finish(x: iv.Interval, fmt: str, ulps: float, extra: float = 0.0) -> iv.Interval:
    """A result computed in the internal format within ulps ulps, then rounded into fmt; extra:
    further ulps of a float16/bfloat16 fmt for intermediates a kernel keeps in that format."""
    inner = _internal(fmt)
    if inner == "float64":
        y = _widen_rel(x, ulps, inner) if ulps > 0 else x
    else:  # widened, then flushed (`_ftz`)
        y = _widen_rel(x, ulps, inner, ftz=True) if ulps > 0 else _ftz(x, inner)
        if not (extra > 0 and _reduced(fmt)):  # rounded into float32, then into fmt: one step
            return _round_into(y, fmt)
        y = _round_into(y, inner)
    if extra > 0 and _reduced(fmt):
        y = _widen_rel(y, extra, fmt)
    return _round_into(y, fmt)


def _ftz(y: iv.Interval, fmt: str) -> iv.Interval:
    """Vectorised kernels may flush results below fmt's smallest normal to zero: include 0."""
    n = get_format(fmt).min_normal
    low, high = (y.lo > 0) & (y.lo < n), (y.hi < 0) & (y.hi > -n)
    if not (low.any() or high.any()):
        return y
    return _mk(np.where(low, 0.0, y.lo), np.where(high, 0.0, y.hi))


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


def leaf(t: torch.Tensor, other: torch.Tensor | None = None) -> iv.Interval:
    """Every real that rounds to t in t's format: t -+ ulp/2 (exact for float64, integers, bools);
    with other (of t's shape), the hull of both such sets (one compiled pass each)."""
    lo, hi = np.empty(tuple(t.shape)), np.empty(tuple(t.shape))
    flo, fhi = lo.reshape(-1), hi.reshape(-1)
    for join, x in enumerate((t, other) if other is not None else (t,)):
        fused.leaf_box(fused.flat(_np(x)), *_leaf_args(x.dtype), bool(join), flo, fhi)
    return _mk(lo, hi)


def leaf_pairs(pairs: list) -> list:
    """`leaf`(t, other) for each (t, other), those of one pair of dtypes in one compiled pass over
    their values laid end to end."""
    out: list = [None] * len(pairs)
    groups: dict = {}
    for i, (t, o) in enumerate(pairs):
        groups.setdefault((t.dtype, o.dtype), []).append(i)
    for (dt, do), idx in groups.items():
        ts = [pairs[i][0].detach().reshape(-1) for i in idx]
        os_ = [pairs[i][1].detach().reshape(-1) for i in idx]
        n = sum(t.numel() for t in ts)
        lo, hi = np.empty(n), np.empty(n)
        for join, (parts, d) in enumerate(((ts, dt), (os_, do))):
            v = _np(torch.cat(parts) if len(parts) > 1 else parts[0])
            fused.leaf_box(fused.flat(v), *_leaf_args(d), bool(join), lo, hi)
        ok = bool((lo <= hi).all())  # else a NaN: each part through `_mk`
        at = 0
        for i, t in zip(idx, ts, strict=True):
            shape = tuple(pairs[i][0].shape)
            a, b = lo[at:at + t.numel()].reshape(shape), hi[at:at + t.numel()].reshape(shape)
            out[i] = _bare(a, b) if ok else _mk(a, b)
            at += t.numel()
    return out


@functools.cache
def _leaf_args(dtype: torch.dtype) -> tuple[int, int, float]:
    """`fused.leaf_box`'s (emin, fraction bits or -1: exact, half the smallest subnormal)."""
    if not dtype.is_floating_point or dtype == torch.float64:
        return 0, -1, 0.0
    f = get_format(fmt_of(dtype))
    return f.emin, f.mantissa_bits, f.min_subnormal / 2


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


def lazy(get, t):
    """t's `Leaf` form where the caller offers one (get.lazy) and t is a leaf, else get(t)."""
    f = getattr(get, "lazy", None)
    return get(t) if f is None else f(t)


# --------------------------------------------------------------------------- bounds of sums


def _gamma(k: int, u: float) -> float:
    ku = k * u
    return ku / (1 - ku) if ku < 1 else math.inf


# --------------------------------------------------------------------------- elementwise


def _finite(x: iv.Interval) -> bool:
    """Whether every end of x is finite."""
    return bool(np.isfinite(x.lo).all() and np.isfinite(x.hi).all())


def _add_finite(a: iv.Interval, b: iv.Interval, minus: bool, fmt: str) -> iv.Interval:
    """intervals.add(a, b, fmt) (intervals.sub when minus) for finite a and b, the same bounds in
    fewer passes: the float64 sums of the ends stepped outward (+-max64 where a sum of finite
    ends overflowed), then rounded outward into fmt (correctly rounded: half an ulp)."""
    blo, bhi = (-b.hi, -b.lo) if minus else (b.lo, b.hi)
    with np.errstate(over="ignore"):
        raw_lo, raw_hi = a.lo + blo, a.hi + bhi
    lo, hi = _dn(raw_lo), _up(raw_hi)
    over_lo, over_hi = raw_lo == np.inf, raw_hi == -np.inf
    if over_lo.any() or over_hi.any():
        big = np.finfo(np.float64).max
        lo, hi = np.where(over_lo, big, lo), np.where(over_hi, -big, hi)
    return _round_into(_mk(lo, hi), fmt)


def _mul_iv(a: iv.Interval, b: iv.Interval) -> iv.Interval:
    """Exact product bounds (float64, outward)."""
    if b.lo.size <= a.lo.size and (b.lo > 0).all() and (b.hi < np.inf).all():
        # b within (0, inf) everywhere: no 0 * inf, and a.lo * b (a.hi * b) holds the least
        # (greatest) of the four products; the same bounds from two products
        with np.errstate(over="ignore"):
            lo = _dn(np.minimum(a.lo * b.lo, a.lo * b.hi))
            hi = _up(np.maximum(a.hi * b.lo, a.hi * b.hi))
        return _mk(lo, hi)
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


def unary_bound(x: iv.Interval, fn, fmt: str, ulps: float, kind: int, xmin: float = 0.0,
                absc: float = 0.0, over: float = math.inf, flush: float = -math.inf,
                domain: bool = False) -> iv.Interval:
    """A unary rule after fn (float64 torch) at both ends: `_mono` (kind 0 increasing, 1
    decreasing) or unimodal (kind 2, minimum at xmin), `_widen_abs` by absc max|x| (one
    compiled pass, `kernels.unary_ends`), `_finish` with ulps, hi = inf where x's hi >= over
    (finite), 0 included where x's lo < flush, and the whole line where x is (domain: where
    its lo may be < 0)."""
    lo, hi = np.asarray(x.lo, dtype=np.float64), np.asarray(x.hi, dtype=np.float64)
    fa, fb = _fn64(fn, lo), _fn64(fn, hi)
    fminv = 0.0
    if kind == 2:
        fmin = _at(fn, xmin)
        fminv = fmin - abs(fmin) * 1e-6  # fmin's location is rounded
    a, b = np.empty(lo.shape), np.empty(lo.shape)
    kernels.unary_ends(fused.flat(lo), fused.flat(hi), fused.flat(fa), fused.flat(fb), kind,
                       float(xmin), fminv, _REL, _TINY, float(absc), a.reshape(-1),
                       b.reshape(-1))
    y = _finish(_mk(a, b), fmt, ulps)
    if over < math.inf:
        y = _mk(y.lo, np.where(hi >= over, np.inf, y.hi))
    if flush > -math.inf:
        low = lo < flush
        y = _mk(np.where(low, np.minimum(y.lo, 0.0), y.lo), np.where(low, np.maximum(y.hi, 0.0),
                                                                       y.hi))
    mask = _whole(x) | ((x.lo < 0) | np.isnan(x.lo) if domain else False)
    return _nan_where(y, mask)


@functools.cache
def _at(fn, x: float) -> float:
    """fn(x) in float64 (fn a float64 torch function)."""
    return float(fn(torch.tensor(x, dtype=torch.float64)))


@functools.cache
def _gelu64(approximate):
    """GELU in float64: torch's own formula for "none", x 0.5 (1 + erf(x / sqrt 2)), written out
    with torch.special.erf, which is vectorised where torch's float64 GELU kernel calls erf one
    value at a time (several times slower); both erfs are within a few ulps."""
    if approximate == "none":
        return lambda z: z * 0.5 * (1 + torch.special.erf(z * math.sqrt(0.5)))
    return lambda z: torch.nn.functional.gelu(z, approximate=approximate)
