"""The interval arithmetic the torch-operation rules share: outward float64 steps (`down`, `up`),
intervals built without copies (`mk`, `bare`), rounding and widening into a format
(`round_into`, `widen_rel`, `widen_abs`, `finish`: the kernel model's budgets, see `rules`),
elements without information (`whole`, `nan_where`), leaves (`leaf`, `leaf_pairs`), a rule's
arguments (`arg`, `is_tensor`, `scalar`, `lazy`) and the gamma_k factor of a sum."""

from __future__ import annotations

import functools
import math

import numpy as np
import torch

from ...formats import get_format
from .. import ops
from ..interval import Interval
from . import fused, small

REL_SLACK = 2.0**-44  # relative slack around torch's float64 exp, log, erf, tanh, ...
ABS_SLACK = 2.0**-1070  # absolute slack beside it (and per term of a product's sum)


class UnsupportedOperation(ValueError):
    """An operation (or an argument of one) that no interval rule bounds."""


# --------------------------------------------------------------------------- numpy helpers


def _step(x, sign: int) -> np.ndarray:
    """nextafter(x, sign inf) in one compiled pass; infinities stay (past every format's range)."""
    a = np.asarray(x, dtype=np.float64)
    out = np.empty(a.shape)
    small.step(fused.flat(a), float(sign), out.reshape(-1))
    return out


def down(x):
    """The float64 below x."""
    return _step(x, -1)


def up(x):
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


def fmt_of(dtype: torch.dtype) -> str:
    """The format name of a floating dtype."""
    name = _FMT_NAMES.get(dtype)
    if name is None:
        raise UnsupportedOperation(f"triage bounds {', '.join(_BOUNDED[:-1])} and {_BOUNDED[-1]} "
                                   f"tensors; got dtype {dtype}")
    return name


_BOUNDED: tuple[str, ...] = ("float16", "bfloat16", "float32", "float64")  # the formats triage bounds
_FMT_NAMES = {get_format(name).torch_dtype: name for name in _BOUNDED}


@functools.cache
def rounding(fmt: str) -> tuple[int, int, float, float]:
    """(fraction bits, -1 for float64: no rounding; smallest normal exponent; largest finite;
    smallest subnormal): the arguments by which `fused`'s kernels round outward into fmt."""
    f = get_format(fmt)
    return (-1 if f.name == "float64" else f.mantissa_bits, f.emin, f.max_finite,
            f.min_subnormal)


def internal(fmt: str) -> str:
    """The format a kernel computes a result of fmt in: float64 for float64, else float32."""
    return "float64" if fmt == "float64" else "float32"


def mk(lo, hi) -> Interval:
    """[lo, hi] as an order-oblivious Interval; a NaN end means no information (the whole line).

    Where every lo <= hi (no NaN, no empty range) the Interval is assembled directly: its
    constructor's checks (NaN ends, lo > hi) are the ones just made, and its copies are not
    needed (no rule writes into a bound's arrays)."""
    lo = np.asarray(lo, dtype=np.float64)
    hi = np.asarray(hi, dtype=np.float64)
    if lo.shape != hi.shape:
        lo, hi = np.broadcast_arrays(lo, hi)
    if (lo <= hi).all():
        return bare(lo, hi)
    bad = np.isnan(lo) | np.isnan(hi)
    if bad.any():  # no information: the whole line
        lo, hi = np.where(bad, -np.inf, lo), np.where(bad, np.inf, hi)
    return Interval(lo, hi, None, "oblivious")


def bare(lo: np.ndarray, hi: np.ndarray) -> Interval:
    """[lo, hi] for float64 arrays of one shape with every lo <= hi (no check)."""
    x = _BARE(Interval)
    x.lo, x.hi, x.nan, x.value, x.rule = lo, hi, np.zeros(lo.shape, bool), None, "oblivious"
    return x


_BARE = object.__new__


def round_into(x: Interval, fmt: str) -> Interval:
    """[RD_fmt(lo), RU_fmt(hi)] (a no-op for float64): intervals.cast's bounds (those of
    `outward.round_out`) in one compiled pass (`fused.round_out`).
    The formats' values nest (float16, bfloat16 inside float32 inside float64), so rounding
    into float32 first and then into fmt gives the same bounds: callers round once."""
    if fmt == "float64":
        return x
    lo, hi = np.asarray(x.lo, dtype=np.float64), np.asarray(x.hi, dtype=np.float64)
    if lo.shape != hi.shape:
        lo, hi = np.broadcast_arrays(lo, hi)
    out_lo, out_hi = np.empty(lo.shape), np.empty(lo.shape)
    if small.round_out(fused.flat(lo), fused.flat(hi), *rounding(fmt), out_lo.reshape(-1),
                       out_hi.reshape(-1)):
        return bare(out_lo, out_hi)
    return mk(out_lo, out_hi)


def widen_rel(x: Interval, ulps: float, fmt: str, ftz: bool = False) -> Interval:
    """[lo - ulps max(eps|lo|, q), hi + ulps max(eps|hi|, q)] outward, inf kept; ftz: `_ftz`."""
    # an exact -inf (a masked score) is no neighbour of finite values; one compiled pass
    f = get_format(fmt)
    lo, hi = np.asarray(x.lo, dtype=np.float64), np.asarray(x.hi, dtype=np.float64)
    if lo.shape != hi.shape:
        lo, hi = np.broadcast_arrays(lo, hi)
    out_lo, out_hi = np.empty(lo.shape), np.empty(lo.shape)
    if small.widen_rel(fused.flat(lo), fused.flat(hi), float(ulps), f.eps, f.min_subnormal,
                       f.min_normal if ftz else 0.0, out_lo.reshape(-1), out_hi.reshape(-1)):
        return bare(out_lo, out_hi)
    return mk(out_lo, out_hi)


def widen_abs(x: Interval, r) -> Interval:
    """[lo - r, hi + r] stepped outward (r >= 0, a number or an array of x's shape)."""
    with np.errstate(invalid="ignore", over="ignore"):
        return mk(down(x.lo - r), up(x.hi + r))


def finish(x: Interval, fmt: str, ulps: float, extra: float = 0.0) -> Interval:
    """A result computed in the internal format within ulps ulps, then rounded into fmt; extra:
    further ulps of a float16/bfloat16 fmt for intermediates a kernel keeps in that format."""
    inner = internal(fmt)
    if inner == "float64":
        y = widen_rel(x, ulps, inner) if ulps > 0 else x
    else:  # widened, then flushed (`_ftz`)
        y = widen_rel(x, ulps, inner, ftz=True) if ulps > 0 else _ftz(x, inner)
        if not (extra > 0 and reduced(fmt)):  # rounded into float32, then into fmt: one step
            return round_into(y, fmt)
        y = round_into(y, inner)
    if extra > 0 and reduced(fmt):
        y = widen_rel(y, extra, fmt)
    return round_into(y, fmt)


def _ftz(y: Interval, fmt: str) -> Interval:
    """Vectorised kernels may flush results below fmt's smallest normal to zero: include 0."""
    n = get_format(fmt).min_normal
    low, high = (y.lo > 0) & (y.lo < n), (y.hi < 0) & (y.hi > -n)
    if not (low.any() or high.any()):
        return y
    return mk(np.where(low, 0.0, y.lo), np.where(high, 0.0, y.hi))


def reduced(fmt: str) -> bool:
    """Whether fmt is float16 or bfloat16 (a kernel may keep intermediates in it)."""
    return fmt in ("float16", "bfloat16")


def u_out(fmt: str) -> float:
    """The unit roundoff of fmt when it is float16/bfloat16 (intermediates kept in it), else 0."""
    return get_format(fmt).unit_roundoff if reduced(fmt) else 0.0


def whole(x: Interval) -> np.ndarray:
    """Elements with no information ([-inf, inf]): their value may also be NaN."""
    return (x.lo == -np.inf) & (x.hi == np.inf)


def nan_where(y: Interval, mask) -> Interval:
    """y, with the elements under mask widened to the whole line (the value may be NaN)."""
    mask = np.broadcast_to(mask, y.shape)
    if not mask.any():
        return y
    return mk(np.where(mask, -np.inf, y.lo), np.where(mask, np.inf, y.hi))


def leaf(t: torch.Tensor, other: torch.Tensor | None = None) -> Interval:
    """Every real that rounds to t in t's format: t -+ ulp/2 (exact for float64, integers, bools);
    with other (of t's shape), the hull of both such sets (one compiled pass each)."""
    lo, hi = np.empty(tuple(t.shape)), np.empty(tuple(t.shape))
    flo, fhi = lo.reshape(-1), hi.reshape(-1)
    for join, x in enumerate((t, other) if other is not None else (t,)):
        small.leaf_box(fused.flat(_np(x)), *_leaf_args(x.dtype), bool(join), flo, fhi)
    return mk(lo, hi)


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
            small.leaf_box(fused.flat(v), *_leaf_args(d), bool(join), lo, hi)
        ok = bool((lo <= hi).all())  # else a NaN: each part through `mk`
        at = 0
        for i, t in zip(idx, ts, strict=True):
            shape = tuple(pairs[i][0].shape)
            a, b = lo[at:at + t.numel()].reshape(shape), hi[at:at + t.numel()].reshape(shape)
            out[i] = bare(a, b) if ok else mk(a, b)
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


def scalar(v, fmt: str) -> Interval:
    """A Python number used with a tensor: its value, as converted to float32 or to fmt."""
    x = float(v)
    vals = [x]
    if fmt != "float64" and math.isfinite(x):
        vals += [float(ops.cast(np.array(x), "float32")), float(ops.cast(np.array(x), fmt))]
    return mk(min(vals), max(vals))


def arg(args, kwargs, i, name, default=None):
    """A call's argument given at position i or by keyword name, else default."""
    if len(args) > i:
        return args[i]
    return kwargs.get(name, default)


def is_tensor(x) -> bool:
    """Whether x is a torch.Tensor (not a Python number, None, ...)."""
    return isinstance(x, torch.Tensor)


def lazy(get, t):
    """t's `Leaf` form where the caller offers one (get.lazy) and t is a leaf, else get(t)."""
    f = getattr(get, "lazy", None)
    return get(t) if f is None else f(t)


# --------------------------------------------------------------------------- bounds of sums


def gamma(k: int, u: float) -> float:
    """gamma_k(u) = k u / (1 - k u), the bound of k roundings' relative error; inf when k u >= 1."""
    ku = k * u
    return ku / (1 - ku) if ku < 1 else math.inf
