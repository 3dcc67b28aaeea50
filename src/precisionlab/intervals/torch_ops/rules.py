"""Interval rules for the torch operations `triage` bounds: each maps the bounds of an operation's
tensor inputs to a bound on every value the operation may return in a given format.

Conventions (the kernel model `triage` assumes where it knows nothing else; each clause was
found necessary by tests/test_diagnose_rules.py against torch's own CPU kernels):
* bounds are `intervals.Interval`s in float64; every float64 step is rounded outward (one
  float64 ulp, or a relative slack of 2^-44 around torch's float64 exp/log/erf/tanh);
* an operation returning float16, bfloat16 or float32 computes internally in float32 and rounds
  into its dtype, outward here; float64 in float64. Correctly rounded operations (+, -, *,
  casts) cost half an ulp; an integer power x^n other than x^2 max(2, |n|) ulps (repeated
  multiplication or libm pow) and 1 ulp of a float16/bfloat16 dtype more; division 1.5 ulps (a division by a scalar may be a multiplication by
  its reciprocal); exp, log, tanh, sigmoid, erf-based GELU, SiLU 4 ulps of the internal format;
  softmax and log-softmax over n entries n + 4 ulps, after x - max is rounded; layer norm an
  absolute (2n + 16) u max|x| / std |w| + 4 u |y| + 2 u |b|;
* results below the internal format's smallest normal may be flushed to zero, and
  1 / (1 + e^-x) (sigmoid, SiLU) is 0 where e^-x overflows;
* float16/bfloat16 kernels may keep intermediates in their dtype: rsqrt (1 more ulp), softmax
  (2 more), log-softmax and cross entropy (x - max, the sum and its log: an absolute
  2 u (|x - max| + |y| + 1)), norms (x-hat, x-hat w, + b), and cross entropy's reductions,
  whose partial sums of m terms stay within (1 +- u)^(m - 1) (float16 may overflow to inf);
* RMS norm without eps uses finfo(float32).eps or finfo(float64).eps (torch's type of
  computation): both are allowed;
* matrix products are order-oblivious (any summation order) with float32 accumulation of
  exact products (float64 for float64): |fl(sum) - sum| <= gamma_(k+1) sum |a_i b_i|, and
  operands are first rounded to the output's dtype when it is narrower (autocast); a
  float16/bfloat16 product may be rounded into its dtype before its bias is added;
* convolutions, scaled dot-product attention (grouped-query heads repeated) and
  nn.MultiheadAttention are bounded as one operation each (`layers`); dropout in training mode
  is refused (it is random); cos and sin by monotone pieces within 4 ulps and 4 u (1 + |x|)
  (`trig`); pooling (`pooling`); batch, group and instance norm (`channel_norms`); LSTM, GRU
  and RNN layers unrolled step by step (`recurrent`);
* shape operations (view, reshape, transpose, cat, chunk, indexing, ...) are exact: the same
  operation is applied to the lower and the upper bounds;
* the whole line [-inf, inf] means "no information": the value may be NaN there (0 * inf,
  sqrt or log of a possibly negative input, a fully masked softmax row, a sum that may
  overflow); NaN is outside every other bound.
"""

from __future__ import annotations

import functools
import math

import numpy as np
import torch

from ...formats import get_format
from .. import ops
from ..interval import Interval
from . import fused, small
from .arith import (
    ABS_SLACK,
    REL_SLACK,
    UnsupportedOperation,
    arg,
    bare,
    down,
    finish,
    internal,
    is_tensor,
    lazy,
    leaf,
    mk,
    nan_where,
    round_into,
    rounding,
    scalar,
    up,
    whole,
)
from .channel_norms import NORM_RULES
from .layers import LAYER_RULES
from .pooling import POOL_RULES
from .products import Leaf, cuda_operand_rel, mm
from .recurrent import RECURRENT_RULES
from .rows import rule_cross_entropy, rule_layer_norm, rule_rms_norm, rule_softmax, rule_sum
from .trig import TRIG_RULES

__all__ = ["EXACT", "FILLS", "RULES", "UnsupportedOperation", "bound", "leaf", "supported"]


# --------------------------------------------------------------------------- the rule table

EXACT = frozenset({
    "reshape", "view", "view_as", "reshape_as", "transpose", "permute", "flatten", "unflatten",
    "squeeze", "unsqueeze", "contiguous", "chunk", "split", "tensor_split", "cat", "concat",
    "concatenate", "stack", "expand", "expand_as", "repeat", "__getitem__", "narrow", "t",
    "select", "unbind", "clone", "detach", "movedim", "swapaxes", "roll", "flip", "triu",
    "tril", "index_select", "gather", "take_along_dim", "T", "mT", "data", "masked_fill",
    "masked_fill_", "split_with_sizes", "pad", "__setitem__", "copy_", "fill_", "zero_",
    "repeat_interleave", "tile", "broadcast_to",
})
_CASTS = frozenset({"float", "half", "bfloat16", "double"})  # Tensor.float() etc.: casts


_WRITES = frozenset({"masked_fill_", "__setitem__", "copy_", "fill_", "zero_"})
FILLS = frozenset({"masked_fill", "masked_fill_", "pad", "__setitem__", "copy_", "fill_"})


def _apply_exact(rec, get, fmt_out):
    """Run the operation on the lower bounds, then on the upper bounds (float64 tensors; copies
    for an in-place operation, else views of the bounds, which no rule writes into)."""
    los, his = {}, {}
    write = rec.name in _WRITES

    def sub(obj, which):
        if is_tensor(obj) and obj.is_floating_point():
            b = get(obj)
            t = _t(b.lo if which == "lo" else b.hi)
            return t.clone() if write else t
        if isinstance(obj, (list, tuple)):
            return type(obj)(sub(o, which) for o in obj)
        return obj

    for which, store in (("lo", los), ("hi", his)):
        a = [sub(x, which) for x in rec.args]
        kw = {k: sub(v, which) for k, v in rec.kwargs.items()}
        out = rec.func(*a, **kw)
        store["out"] = a[0] if rec.name == "__setitem__" else out
    lo, hi = los["out"], his["out"]
    if is_tensor(lo):
        lo, hi = [lo], [hi]
    outs = []
    fills = rec.name in FILLS
    for a, b in zip(lo, hi, strict=True):
        a, b = a.numpy(), b.numpy()
        if not fills:  # the same gather of ordered ends: ordered, no NaN
            outs.append(bare(a, b))
            continue
        y = bare(a, b) if (a <= b).all() else mk(np.minimum(a, b), np.maximum(a, b))
        outs.append(round_into(y, fmt_out))
    return outs


def supported() -> tuple[str, ...]:
    """Names of every operation triage can bound.

    Returns
    -------
    tuple of str
        The torch function, method and operator names (F.linear is "linear",
        Tensor.__add__ is "__add__"), sorted.

    Examples
    --------
    >>> from precisionlab.diagnose import supported
    >>> "linear" in supported(), "scaled_dot_product_attention" in supported()
    (True, True)
    >>> "cumprod" in supported()
    False
    """
    return tuple(sorted(set(RULES) | EXACT | set(_CASTS) | {"to", "type", "type_as"}))


# --------------------------------------------------------------------------- elementwise

_FN_ULPS = 4.0  # exp, log, tanh, sigmoid, erf-based GELU, SiLU: ulps of the internal format


def _finite(x: Interval) -> bool:
    """Whether every end of x is finite."""
    return bool(np.isfinite(x.lo).all() and np.isfinite(x.hi).all())


def _add_finite(a: Interval, b: Interval, minus: bool, fmt: str) -> Interval:
    """intervals.add(a, b, fmt) (intervals.sub when minus) for finite a and b, the same bounds in
    fewer passes: the float64 sums of the ends stepped outward (+-max64 where a sum of finite
    ends overflowed), then rounded outward into fmt (correctly rounded: half an ulp)."""
    blo, bhi = (-b.hi, -b.lo) if minus else (b.lo, b.hi)
    with np.errstate(over="ignore"):
        raw_lo, raw_hi = a.lo + blo, a.hi + bhi
    lo, hi = down(raw_lo), up(raw_hi)
    over_lo, over_hi = raw_lo == np.inf, raw_hi == -np.inf
    if over_lo.any() or over_hi.any():
        big = np.finfo(np.float64).max
        lo, hi = np.where(over_lo, big, lo), np.where(over_hi, -big, hi)
    return round_into(mk(lo, hi), fmt)


def _mul_iv(a: Interval, b: Interval) -> Interval:
    """Exact product bounds (float64, outward)."""
    if b.lo.size <= a.lo.size and (b.lo > 0).all() and (b.hi < np.inf).all():
        # b within (0, inf) everywhere: no 0 * inf, and a.lo * b (a.hi * b) holds the least
        # (greatest) of the four products; the same bounds from two products
        with np.errstate(over="ignore"):
            lo = down(np.minimum(a.lo * b.lo, a.lo * b.hi))
            hi = up(np.maximum(a.hi * b.lo, a.hi * b.hi))
        return mk(lo, hi)
    with np.errstate(invalid="ignore", over="ignore"):
        c = [a.lo * b.lo, a.lo * b.hi, a.hi * b.lo, a.hi * b.hi]
        nan = np.logical_or.reduce([np.isnan(x) for x in c])  # 0 * inf: NaN in the program
        lo, hi = down(np.minimum.reduce(c)), up(np.maximum.reduce(c))
    return mk(np.where(nan, -np.inf, lo), np.where(nan, np.inf, hi))


def _square(a: Interval) -> Interval:
    lo2, hi2 = a.lo * a.lo, a.hi * a.hi
    straddle = (a.lo <= 0) & (a.hi >= 0)
    return mk(np.where(straddle, 0.0, down(np.minimum(lo2, hi2))), up(np.maximum(lo2, hi2)))


def _fn64(fn, x: np.ndarray) -> np.ndarray:
    with np.errstate(invalid="ignore"):
        return fn(_t(x)).numpy()


def _mono(x: Interval, fn, increasing: bool = True) -> Interval:
    """fn applied to both ends of a monotone function, with float64 slack."""
    a, b = _fn64(fn, x.lo), _fn64(fn, x.hi)
    lo, hi = (a, b) if increasing else (b, a)
    with np.errstate(invalid="ignore", over="ignore"):
        return mk(down(lo - np.abs(lo) * REL_SLACK - ABS_SLACK),
                  up(hi + np.abs(hi) * REL_SLACK + ABS_SLACK))


def unary_bound(x: Interval, fn, fmt: str, ulps: float, kind: int, xmin: float = 0.0,
                absc: float = 0.0, over: float = math.inf, flush: float = -math.inf,
                domain: bool = False) -> Interval:
    """A unary rule after fn (float64 torch) at both ends: `_mono` (kind 0 increasing, 1
    decreasing) or unimodal (kind 2, minimum at xmin), `widen_abs` by absc max|x| (one
    compiled pass, `kernels.unary_ends`), `finish` with ulps, hi = inf where x's hi >= over
    (finite), 0 included where x's lo < flush, and the whole line where x is (domain: where
    its lo may be < 0)."""
    lo, hi = np.asarray(x.lo, dtype=np.float64), np.asarray(x.hi, dtype=np.float64)
    fa, fb = _fn64(fn, lo), _fn64(fn, hi)
    fminv = 0.0
    if kind == 2:
        fmin = _at(fn, xmin)
        fminv = fmin - abs(fmin) * 1e-6  # fmin's location is rounded
    a, b = np.empty(lo.shape), np.empty(lo.shape)
    small.unary_ends(fused.flat(lo), fused.flat(hi), fused.flat(fa), fused.flat(fb), kind,
                     float(xmin), fminv, REL_SLACK, ABS_SLACK, float(absc), a.reshape(-1),
                     b.reshape(-1))
    y = finish(mk(a, b), fmt, ulps)
    if over < math.inf:
        y = mk(y.lo, np.where(hi >= over, np.inf, y.hi))
    if flush > -math.inf:
        low = lo < flush
        y = mk(np.where(low, np.minimum(y.lo, 0.0), y.lo), np.where(low, np.maximum(y.hi, 0.0),
                                                                      y.hi))
    mask = whole(x) | ((x.lo < 0) | np.isnan(x.lo) if domain else False)
    return nan_where(y, mask)


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


def _t(a: np.ndarray) -> torch.Tensor:
    """A float64 tensor of a's values: a's own memory when it is contiguous and writable."""
    a = np.asarray(a, dtype=np.float64)
    if a.flags.c_contiguous and a.flags.writeable:
        return torch.from_numpy(a)
    return torch.from_numpy(np.array(a, dtype=np.float64, order="C"))  # keeps 0-d arrays 0-d


def _binary(name):
    def rule(rec, get, fmt):
        a, b = rec.args[0], arg(rec.args, rec.kwargs, 1, "other")
        if name in ("__rsub__", "rsub", "__rtruediv__", "__rdiv__"):
            a, b = b, a
        A = get(a) if is_tensor(a) else scalar(a, fmt)
        B = get(b) if is_tensor(b) else scalar(b, fmt)
        alpha = rec.kwargs.get("alpha", 1)
        if alpha != 1:
            B = _mul_iv(B, mk(float(alpha), float(alpha)))
        op = name.strip("_").removeprefix("r").removeprefix("i").rstrip("_")
        inner = internal(fmt)
        if op in ("add", "sub", "subtract"):
            y = _add_fused(A, B, op != "add", fmt)
            if y is not None:
                return [y]
        if op in ("add", "sub", "subtract") and _finite(A) and _finite(B):
            return [round_into(_add_finite(A, B, op != "add", inner), fmt)]
        if op in ("add",):
            y = ops.add(A, B, inner)
        elif op in ("sub", "subtract"):
            y = ops.sub(A, B, inner)
        elif op in ("mul", "multiply"):
            y = ops.mul(A, B, inner)
        else:
            y = ops.div(A, B, inner, ulps=1.5)
        return [round_into(mk(y.lo, y.hi), fmt)]
    return rule


def _add_fused(A: Interval, B: Interval, minus: bool, fmt: str) -> Interval | None:
    """`_add_finite` into the internal format and rounded into fmt in one compiled pass (the same
    bounds: float16/bfloat16 values nest in float32's); None where an end is not finite."""
    alo, ahi, blo, bhi = A.lo, A.hi, B.lo, B.hi
    if not (alo.shape == ahi.shape == blo.shape == bhi.shape):
        alo, ahi, blo, bhi = np.broadcast_arrays(alo, ahi, blo, bhi)
    lo, hi = np.empty(alo.shape), np.empty(alo.shape)
    ok = small.add_out(*(fused.flat(z) for z in (alo, ahi, blo, bhi)), minus, *rounding(fmt),
                       lo.reshape(-1), hi.reshape(-1))
    if ok < 0:
        return None
    return bare(lo, hi) if ok else mk(lo, hi)


def _r_linear(rec, get, fmt):
    x, w = get(rec.args[0]), lazy(get, arg(rec.args, rec.kwargs, 1, "weight"))
    b = arg(rec.args, rec.kwargs, 2, "bias")
    return [mm(x, w, get(b) if is_tensor(b) else None, fmt, b_t=True,
               operand_rel=cuda_operand_rel(rec.args[0], fmt))]


def _r_matmul(rec, get, fmt):
    a, b = rec.args[0], arg(rec.args, rec.kwargs, 1, "other")
    A, B = get(a), lazy(get, b)
    if A.ndim < 2 or B.ndim < 2:
        raise UnsupportedOperation("triage bounds matmul of operands with >= 2 axes; got shapes "
                                   f"{A.shape} and {B.shape}")
    return [mm(A, B, None, fmt, operand_rel=cuda_operand_rel(a, fmt))]


def _r_addmm(rec, get, fmt):
    bias, a, b = (get(t) for t in rec.args[:3])
    if rec.kwargs.get("beta", 1) != 1 or rec.kwargs.get("alpha", 1) != 1:
        raise UnsupportedOperation("triage bounds addmm/baddbmm with alpha = beta = 1 only")
    return [mm(a, b, bias, fmt, operand_rel=cuda_operand_rel(rec.args[1], fmt))]


def _r_embedding(rec, get, fmt):
    idx, w = rec.args[0], lazy(get, arg(rec.args, rec.kwargs, 1, "weight"))
    if arg(rec.args, rec.kwargs, 3, "max_norm") is not None:
        raise UnsupportedOperation("triage cannot bound embedding with max_norm (it rescales rows)")
    i = idx.detach().cpu().numpy()
    if isinstance(w, Leaf):  # only the rows looked up
        return [w.box(torch.from_numpy(i))]
    return [mk(w.lo[i], w.hi[i])]


def _negative(x: Interval) -> np.ndarray:
    """Elements whose argument may be < 0 (sqrt, log, rsqrt give NaN there) or unknown."""
    return (x.lo < 0) | np.isnan(x.lo)


def _r_unary(fn, ulps, kind="mono", xmin=None, flush=False, domain=False):
    def rule(rec, get, fmt):
        # sigmoid / SiLU as 1 / (1 + e^-x): where e^-x may overflow the internal format, the
        # kernel returns 0 for a tiny nonzero exact value: 0 included there
        t = -(math.log(get_format(internal(fmt)).max_finite) - 1.0) if flush else -math.inf
        return [unary_bound(get(rec.args[0]), fn, fmt, ulps, {"mono": 0, "dec": 1}.get(kind, 2),
                            xmin or 0.0, flush=t, domain=domain)]
    return rule


def _r_gelu(rec, get, fmt):
    approx = arg(rec.args, rec.kwargs, 1, "approximate", "none")
    inner = get_format(internal(fmt))
    # x Phi(x) with Phi = (1 + erf(x / sqrt 2)) / 2: Phi's absolute error (cancellation for
    # x < 0) times |x|, beside the relative budget; x (1 + erf(x / sqrt 2)) / 2 overflows
    # before the halving when x > max / 2
    return [unary_bound(get(rec.args[0]), _gelu64(approx), fmt,
                        _FN_ULPS + (4 if approx == "tanh" else 0), 2, -0.7517916243,
                        8 * inner.unit_roundoff, inner.max_finite / 2)]


def _r_relu(rec, get, fmt):
    x = get(rec.args[0])
    return [nan_where(mk(np.maximum(x.lo, 0.0), np.maximum(x.hi, 0.0)), whole(x))]


def _r_sqrt(rec, get, fmt):
    """sqrt(x), 0.5 ulp. torch's CPU root is MKL's (x86 wheels), faithful but not correctly
    rounded (0.53 eps |y| off in float32 on an AVX-512 Intel Xeon): still inside. In float32
    (and the 16-bit formats, computed in it) the ends are rounded outward onto the format's
    grid, and a faithful root lies between the two neighbours of the exact one; in float64
    the 2^-44 relative slack `_mono` adds is far wider than an ulp."""
    x = get(rec.args[0])
    y = _mono(mk(np.maximum(x.lo, 0), np.maximum(x.hi, 0)), torch.sqrt)
    return [nan_where(finish(y, fmt, 0.5), _negative(x))]


def _r_rsqrt(rec, get, fmt):
    """1/sqrt(x): 2 float32 ulps; torch's scalar float16/bfloat16 path rounds sqrt(x) into the
    dtype before dividing (1.33 ulps measured): 1 ulp of the dtype more."""
    x = get(rec.args[0])
    y = _mono(mk(np.maximum(x.lo, 0), np.maximum(x.hi, 0)), torch.rsqrt, increasing=False)
    return [nan_where(finish(y, fmt, 2.0, extra=1.0), _negative(x))]


def _int_pow(x: Interval, n: int) -> Interval:
    """The real range of x^n over x for an integer n != 0, 1 (float64 ends, rounded outward):
    odd n > 0 monotone; even n > 0 has its minimum 0 where x spans 0; n < 0 is 1 / x^-n, whose
    range over an x spanning 0 is [1 / max, inf] (even) or the whole line (odd). Where x may be
    NaN (the whole line) so may x^n."""
    lo, hi = np.asarray(x.lo, dtype=np.float64), np.asarray(x.hi, dtype=np.float64)
    a, b = _fn64(lambda t: torch.pow(t, n), lo), _fn64(lambda t: torch.pow(t, n), hi)
    y_lo, y_hi = np.minimum(a, b), np.maximum(a, b)
    with np.errstate(invalid="ignore", over="ignore"):
        # torch's float64 pow within REL_SLACK; an end that overflowed float64 (inf) is an
        # exact value above float64's largest: that largest is below it
        y_lo = np.where(np.isposinf(y_lo), np.finfo(np.float64).max,
                        down(y_lo - np.abs(y_lo) * REL_SLACK - ABS_SLACK))
        y_hi = np.where(np.isneginf(y_hi), -np.finfo(np.float64).max,
                        up(y_hi + np.abs(y_hi) * REL_SLACK + ABS_SLACK))
    span = (lo <= 0) & (hi >= 0)
    if n % 2 == 0 and n > 0:
        y_lo = np.where(span, 0.0, y_lo)
    elif n % 2 == 0:
        y_hi = np.where(span, np.inf, y_hi)
    elif n < 0:
        y_lo, y_hi = np.where(span, -np.inf, y_lo), np.where(span, np.inf, y_hi)
    return nan_where(mk(y_lo, y_hi), whole(x) | np.isnan(lo) | np.isnan(hi))


def _integer(e) -> bool:
    """Whether e is a Python or NumPy integer, or a float with an integer value."""
    if isinstance(e, bool):
        return False
    if isinstance(e, (int, np.integer)):
        return True
    return isinstance(e, (float, np.floating)) and math.isfinite(e) and float(e).is_integer()


# the integer exponents pow's rule takes: up to 64, far inside every format's exact integers
# (bfloat16 holds them to 256; torch rounds the exponent into the tensor's format), and -1.
# Below -1 it refuses: torch's bfloat16 x^-2 squares into bfloat16 first, and a square in the
# subnormal range (or flushed to zero) then loses up to 2 ulps in the reciprocal.
POW_MAX_EXPONENT = 64


def _r_pow(rec, get, fmt):
    """x^e for a number e: 1, 2, 0.5, -0.5 as before; any other integer n from -1 to
    POW_MAX_EXPONENT (GPT-2's x^3) by `_int_pow`, computed in the internal format within
    max(2, |n|) ulps (torch's kernels: repeated multiplication for 3, a reciprocal for -1, libm
    pow otherwise, measured within 1 ulp) and, for float16/bfloat16, 1 ulp more for an
    intermediate kept in the dtype; n = 0 gives 1 (for NaN and inf too)."""
    e = arg(rec.args, rec.kwargs, 1, "exponent")
    if not is_tensor(rec.args[0]):
        raise UnsupportedOperation(
            f"triage bounds pow of a tensor base; got the number {rec.args[0]!r} as the base "
            "(torch.pow(number, tensor)): compute it outside the two programs and pass its "
            "result in as an input")
    usable = not is_tensor(e) and (e in (1, 2, 0.5, -0.5) or (
        _integer(e) and -1 <= e <= POW_MAX_EXPONENT))
    if not usable:
        raise UnsupportedOperation(
            f"triage bounds pow with an integer exponent from -1 to {POW_MAX_EXPONENT}, 0.5 or "
            f"-0.5; got {e!r}. Write other powers from these (x.pow(-2) as 1 / x.pow(2)), or "
            "compute that part outside the two programs and pass its result in as an input")
    x = get(rec.args[0])
    if e == 0:
        return [mk(np.ones(x.shape), np.ones(x.shape))]
    if e not in (1, 2, 0.5, -0.5):
        n = int(e)
        return [finish(_int_pow(x, n), fmt, max(2.0, abs(n)), extra=1.0)]
    if e == 1:
        return [x]
    if e == 2:
        return [finish(_square(x), fmt, 0.5)]
    pos = mk(np.maximum(x.lo, 0), np.maximum(x.hi, 0))
    y = _mono(pos, torch.sqrt) if e == 0.5 else _mono(pos, torch.rsqrt, increasing=False)
    return [nan_where(finish(y, fmt, 2.0, extra=1.0), _negative(x))]


def _r_neg(rec, get, fmt):
    x = get(rec.args[0])
    return [mk(-x.hi, -x.lo)]


def _r_abs(rec, get, fmt):
    """|x|: exact, the box folded at 0 (NaN may come out where x has no information)."""
    x = get(rec.args[0])
    with np.errstate(invalid="ignore"):
        lo = np.where(x.lo >= 0, x.lo, np.where(x.hi <= 0, -x.hi, 0.0))
        hi = np.maximum(np.abs(x.lo), np.abs(x.hi))
    return [nan_where(round_into(mk(lo, hi), fmt), whole(x))]


def _r_amax(rec, get, fmt):
    x = get(rec.args[0])
    dim = arg(rec.args, rec.kwargs, 1, "dim", ())
    keep = bool(arg(rec.args, rec.kwargs, 2, "keepdim", False))
    axes = tuple(range(x.ndim)) if dim in ((), None) else ((dim,) if isinstance(dim, int) else
                                                            tuple(dim))
    return [mk(np.max(x.lo, axis=axes, keepdims=keep), np.max(x.hi, axis=axes, keepdims=keep))]


def _r_where(rec, get, fmt):
    if rec.args[0].dtype == torch.bool:  # torch.where(condition, input, other)
        c, a, b = (arg(rec.args, rec.kwargs, i, n) for i, n in ((0, "condition"), (1, "input"),
                                                                (2, "other")))
    else:  # input.where(condition, other)
        a, c, b = (arg(rec.args, rec.kwargs, i, n) for i, n in ((0, "input"), (1, "condition"),
                                                                (2, "other")))
    cond = c.detach().cpu().numpy().astype(bool)
    A = get(a) if is_tensor(a) else scalar(a, fmt)
    B = get(b) if is_tensor(b) else scalar(b, fmt)
    y = mk(np.where(cond, A.lo, B.lo), np.where(cond, A.hi, B.hi))
    return [round_into(y, fmt)]


RULES = {
    "linear": _r_linear, "matmul": _r_matmul, "__matmul__": _r_matmul, "__rmatmul__": None,
    "mm": _r_matmul, "bmm": _r_matmul, "addmm": _r_addmm, "baddbmm": _r_addmm,
    "softmax": rule_softmax(False), "log_softmax": rule_softmax(True),
    "layer_norm": rule_layer_norm, "rms_norm": rule_rms_norm, "embedding": _r_embedding,
    "gelu": _r_gelu, "relu": _r_relu, "relu_": _r_relu,
    "silu": _r_unary(torch.nn.functional.silu, _FN_ULPS, "uni", -1.2784645428, flush=True),
    "tanh": _r_unary(torch.tanh, _FN_ULPS),
    "sigmoid": _r_unary(torch.sigmoid, _FN_ULPS, flush=True),
    "exp": _r_unary(torch.exp, _FN_ULPS), "log": _r_unary(torch.log, _FN_ULPS, domain=True),
    "sqrt": _r_sqrt, "rsqrt": _r_rsqrt, "pow": _r_pow, "__pow__": _r_pow, "square": None,
    "neg": _r_neg, "__neg__": _r_neg, "negative": _r_neg,
    "abs": _r_abs, "__abs__": _r_abs, "absolute": _r_abs,
    "sum": rule_sum(False), "mean": rule_sum(True), "amax": _r_amax,
    "where": _r_where, "cross_entropy": rule_cross_entropy, **LAYER_RULES, **TRIG_RULES,
    **POOL_RULES, **NORM_RULES, **RECURRENT_RULES,
}
for _n in ("add", "sub", "mul", "div"):
    for _v in (_n, f"__{_n}__", f"__r{_n}__", f"__i{_n}__", f"{_n}_"):
        RULES[_v] = _binary(_v)
for _v in ("true_divide", "__truediv__", "__rtruediv__", "__itruediv__", "subtract", "multiply",
           "rsub"):
    RULES[_v] = _binary(_v)
RULES["square"] = lambda rec, get, fmt: [finish(_square(get(rec.args[0])), fmt, 0.5)]
del RULES["__rmatmul__"]


def bound(rec, get, fmt: str) -> list:
    """The operation's output bounds (one per output tensor) with results in fmt."""
    name = rec.name
    if name in EXACT:
        mode = arg(rec.args, rec.kwargs, 2, "mode", "constant")
        if name == "pad" and mode not in ("constant", "reflect", "replicate", "circular"):
            raise UnsupportedOperation("triage bounds pad with mode 'constant', 'reflect', "
                                       f"'replicate' or 'circular'; got {mode!r}")
        return _apply_exact(rec, get, fmt)
    if name in _CASTS or name in ("to", "type", "type_as"):
        return [round_into(get(rec.args[0]), fmt)]
    rule = RULES.get(name)
    if rule is None:
        raise UnsupportedOperation(name)
    return rule(rec, get, fmt)
