"""Interval helpers shared by triage's rules: outward float64 steps, rounding into formats, the
kernel model's budgets (see `rules` for the model), leaves, arguments and matrix products."""

from __future__ import annotations

import math

import numpy as np
import torch

from .. import intervals as iv
from ..formats import get_format
from . import fused

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
    return t.detach().to(torch.float64).cpu().numpy()


def _t(a: np.ndarray) -> torch.Tensor:
    """A float64 tensor of a's values: a's own memory when it is contiguous and writable."""
    a = np.asarray(a, dtype=np.float64)
    if a.flags.c_contiguous and a.flags.writeable:
        return torch.from_numpy(a)
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


def _nudge(y: np.ndarray, wrong: np.ndarray, sign: int) -> np.ndarray:
    """y (float32/float16) moved one step toward sign * inf where `wrong`: on the sign-magnitude
    bit pattern i, adding (i >> top bit) | 1 (+1 for a positive pattern, -1 for a negative one)
    grows the magnitude by one step (from +-0 to +-q, from +-max_finite to +-inf), subtracting
    it shrinks it (from an infinity to +-max_finite)."""
    i = y.view(np.int32 if y.dtype == np.float32 else np.int16)
    step = ((i >> (8 * i.itemsize - 1)) | 1) * wrong
    return (i + step if sign > 0 else i - step).view(y.dtype)


def _directed(a: np.ndarray, fmt: str, sign: int) -> np.ndarray:
    """RD (sign -1) or RU (sign 1) of float64 values into fmt (float32, bfloat16, float16):
    NumPy's cast to nearest, then one step toward sign * inf where it landed on the wrong side;
    bfloat16 (whose values are float32 values) from the float32 result by clearing the low 16
    bits of the pattern after adding 0xFFFF where that grows the magnitude (negative
    sign for RD, positive for RU). Past the range: +-max_finite or +-inf, as IEEE directed
    rounding gives; infinities stay."""
    a = np.asarray(a, dtype=np.float64)
    with np.errstate(over="ignore"):
        y = a.astype(np.float16 if fmt == "float16" else np.float32)
    wrong = (y > a) if sign < 0 else (y < a)
    if wrong.any():  # none where a's values are values of the format already
        y = _nudge(y, wrong, sign)
    if fmt == "bfloat16":
        i = y.view(np.int32)
        grow = (i < 0) if sign < 0 else (i >= 0)
        y = ((i + grow * np.int32(0xFFFF)) & np.int32(-65536)).view(np.float32)
    return y.astype(np.float64)


def _round_into(x: iv.Interval, fmt: str) -> iv.Interval:
    """[RD_fmt(lo), RU_fmt(hi)] (a no-op for float64); intervals.cast's bounds, by `_directed`.
    The formats' values nest (float16, bfloat16 inside float32 inside float64), so rounding
    into float32 first and then into fmt gives the same bounds: callers round once."""
    if fmt == "float64":
        return x
    return _mk(_directed(x.lo, fmt, -1), _directed(x.hi, fmt, 1))


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


def leaf(t: torch.Tensor) -> iv.Interval:
    """Every real that rounds to t in t's format: t -+ ulp/2 (exact for float64, integers, bools)."""
    v = _np(t)
    if not t.is_floating_point() or t.dtype == torch.float64:
        return _mk(v, v)
    f = get_format(fmt_of(t.dtype))
    lo, hi = np.empty(v.shape), np.empty(v.shape)  # v -+ ulp/2, exact in float64, in one pass
    fused.leaf_box(fused.flat(v), f.emin, f.mantissa_bits, f.min_subnormal / 2, lo.reshape(-1),
                   hi.reshape(-1))
    return _mk(lo, hi)


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


# --------------------------------------------------------------------------- matrix products


def _gamma(k: int, u: float) -> float:
    ku = k * u
    return ku / (1 - ku) if ku < 1 else math.inf


_SUBSETS = {"float16": ("float16",), "bfloat16": ("bfloat16",),
            "float32": ("float16", "bfloat16", "float32"),
            "float64": ("float16", "bfloat16", "float32", "float64")}


class Leaf:
    """A weight, input or constant held as its target value t with |x - t| <= rho |t| + tau for
    every x in its box (the reals that round to it, joined with the reference's copy): matrix
    products use this form directly, any other rule the exact box from `box()`."""

    __slots__ = ("_make", "_max", "fmts", "rho", "t", "tau")

    def __init__(self, t: torch.Tensor, rho: float, tau: float, fmts: frozenset, make):
        self.t, self.rho, self.tau, self.fmts, self._make = t, rho, tau, fmts, make
        self._max = None

    @property
    def amax(self) -> float:
        """max |t| (NaN when t holds a NaN), computed once."""
        if self._max is None:
            self._max = float(self.t.detach().abs().max()) if self.t.numel() else 0.0
        return self._max

    @property
    def shape(self) -> tuple:
        """The leaf's shape."""
        return tuple(self.t.shape)

    @property
    def ndim(self) -> int:
        """Number of axes."""
        return self.t.ndim

    def box(self, index=None) -> iv.Interval:
        """The exact box (of the entries at `index`, a gather, when given)."""
        return self._make(index)

    def part(self, index) -> Leaf:
        """The leaf's entries at `index` (a slice along the first axis, say) as a Leaf."""
        make = self._make

        def sub(j, i=index):
            box = make(i)
            return box if j is None else box[j]
        return Leaf(self.t[index], self.rho, self.tau, self.fmts, sub)

    def radius(self, fmt: str) -> tuple[float, float] | None:
        """(rho, tau) after the operands are rounded outward into fmt, when some value the box
        is built from (a format in `fmts`) is not a value of fmt: one more ulp of fmt; None
        when that rounding may overflow (then only the box is sound)."""
        if fmt == "float64" or all(f in _SUBSETS[fmt] for f in self.fmts):
            return self.rho, self.tau
        f = get_format(fmt)
        e = f.eps * (1 + 2.0**-40)  # RD/RU move an endpoint by < ulp <= eps |x| + q
        if not self.amax * (1 + self.rho) + self.tau < f.max_finite / 2:
            return None
        return self.rho + e * (1 + self.rho), self.tau * (1 + e) + f.min_subnormal


def _midrad_np(lo: np.ndarray, hi: np.ndarray, g64: float) -> tuple[np.ndarray, np.ndarray]:
    """(m, r) float64 arrays with [lo, hi] inside [m - r, m + r] (r rounded up generously)."""
    with np.errstate(invalid="ignore", over="ignore"):
        m = np.asarray(lo / 2 + hi / 2)
        r = np.asarray(np.maximum(hi - m, m - lo) * (1 + 4 * g64))
    return m, r


def _midrad(x: iv.Interval, g64: float) -> tuple[torch.Tensor, torch.Tensor]:
    """`_midrad_np` of x's ends, as float64 tensors."""
    m, r = _midrad_np(np.asarray(x.lo, dtype=np.float64), np.asarray(x.hi, dtype=np.float64), g64)
    return torch.from_numpy(m), torch.from_numpy(r)


_F32_INF = torch.tensor(math.inf, dtype=torch.float32)
_EXACT_IN_F32 = (torch.float32, torch.bfloat16, torch.float16)


def _ieee_float32() -> bool:
    """Whether torch's float32 CPU matmul is IEEE float32 (no bfloat16/TF32 oneDNN mode set, as
    torch.set_float32_matmul_precision("medium") does)."""
    try:
        flags = (torch.backends.fp32_precision, torch.backends.mkldnn.fp32_precision,
                 torch.backends.mkldnn.matmul.fp32_precision)
    except (AttributeError, RuntimeError):  # another torch: use float64 only
        return False
    return all(f in ("none", "ieee") for f in flags)


def upper_product(left: torch.Tensor, right: torch.Tensor, right_max: float | None = None
                  ) -> torch.Tensor:
    """An upper bound (float64) of left @ right for nonnegative (..., M, k) @ (..., k, N).

    In float32 when torch's float32 matmul is IEEE: operands rounded up into float32 (exact for
    float32/bfloat16/float16 values), any summation order within gamma_(k+2)(2^-24) of the
    exact sum, and k 2^-126 (1 + max left + max right) twice over for the subnormal range
    (gradual or flushed to zero, inputs or results); else in float64 within gamma_(k+4)(2^-53).
    right_max: max(right) when the caller knows it."""
    k = left.shape[-1]
    if not _ieee_float32():
        return (left.to(torch.float64) @ right.to(torch.float64)) * (1 + 2 * _gamma(k + 4, 2.0**-53))

    def up32(t):
        y = t.to(torch.float32)
        return y if t.dtype in _EXACT_IN_F32 else torch.nextafter(y, _F32_INF)
    a, b = up32(left), up32(right)
    if right_max is None or right.dtype not in _EXACT_IN_F32:
        right_max = float(b.max()) if b.numel() else 0.0
    top = (float(a.max()) if a.numel() else 0.0) + right_max
    return (a @ b).to(torch.float64) * (1 + 2 * _gamma(k + 2, 2.0**-24)) + 2 * k * 2.0**-126 * (
        1 + top)


def leaf_products(am, ar, w: torch.Tensor, rho: float, tau: float, g64: float, w_t: bool = False,
                  w_max: float | None = None):
    """(pm, pr, s) for a @ b with a in am +- ar and b the `Leaf` w +- (rho |w| + tau) (w_t: b is
    w transposed): pm = am w in float64, |a b - am w| <= pr elementwise-summed, and
    sum |a_i b_i| <= s, from |am| |w| and ar |w| (`upper_product`)."""
    m = am.shape[-2]
    w = w.detach().cpu()
    wm = w.to(torch.float64)
    pm = am @ (wm.transpose(-1, -2) if w_t else wm)
    del wm
    stack = torch.cat([am.abs(), ar], dim=-2)
    wa = w.abs()
    qr = upper_product(stack, wa.transpose(-1, -2) if w_t else wa, w_max)
    del wa
    q, r = qr[..., :m, :], qr[..., m:, :]
    rows = (stack[..., :m, :].sum(-1, keepdim=True) +
            stack[..., m:, :].sum(-1, keepdim=True)) * (1 + 2 * g64)
    return pm, rho * q + (1 + rho) * r + tau * rows, (1 + rho) * (q + r) + tau * rows


def box_products(am, ar, bm, br, g64: float):
    """(pm, pr, s) as `leaf_products` for b in bm +- br: |am| |bm|, |am| br, ar |bm| and ar br
    from one product of stacked operands."""
    m, n = am.shape[-2], bm.shape[-1]
    pm = am @ bm
    blk = upper_product(torch.cat([am.abs(), ar], dim=-2), torch.cat([bm.abs(), br], dim=-1))
    q, pr = blk[..., :m, :n], blk[..., :m, n:] + blk[..., m:, :n] + blk[..., m:, n:]
    return pm, pr, q + pr


def close_products(pm, pr, s, terms: int, bias: iv.Interval | None, fmt: str, g64: float):
    """(lo, hi) float64 arrays bounding sum_i a_i b_i (+ bias) accumulated in fmt's internal
    format in any order: |error| <= gamma_terms(u) s + terms q, plus float64's own error in pm
    (3 g64 s) and in forming the radius (a factor 1 + 8 g64). With a bias and a float16/bfloat16
    fmt, a kernel may also round the product into fmt before adding the bias: u_fmt |product|
    + q_fmt / 2 more (charged 1.01 u_fmt s + q_fmt), and the whole line where that rounding may
    overflow. A bias entry that is exactly +-inf gives that infinity; a sum that may overflow
    the accumulator the whole line."""
    pm, pr, s = pm.numpy(), pr.numpy(), s.numpy()  # the same float64 steps, in NumPy
    if bias is None or (bias.lo.ndim <= pm.ndim and bias.lo.shape[-1:] == pm.shape[-1:] and
                        bias.lo.size == pm.shape[-1] and bias.hi.shape == bias.lo.shape):
        return _close_fused(pm, pr, s, terms, bias, fmt, g64)
    return _close_numpy(pm, pr, s, terms, bias, fmt, g64)


def _close_numpy(pm, pr, s, terms: int, bias: iv.Interval | None, fmt: str, g64: float):
    """`close_products` on float64 arrays in NumPy steps (any bias shape)."""
    acc = get_format(_internal(fmt))
    inf_b = None
    extra = 0.0
    with np.errstate(invalid="ignore", over="ignore"):
        over = None
        if bias is not None:
            if _reduced(fmt):
                f = get_format(fmt)
                extra = 1.01 * f.unit_roundoff * s + f.min_subnormal
                over = _over(s, 1 + _gamma(terms, acc.unit_roundoff), f.max_finite * 0.999)
            blo, bhi = bias.lo, bias.hi
            inf_b = (blo == bhi) & np.isinf(blo)
            if inf_b.any():
                blo, bhi = np.where(inf_b, 0.0, blo), np.where(inf_b, 0.0, bhi)
            bmid, brad = _midrad_np(blo, bhi, g64)
            pm, pr, s = pm + bmid, pr + brad, s + np.abs(bmid) + brad
            terms += 1
        u = acc.unit_roundoff
        rad = (pr + (_gamma(terms, u) + 3 * g64) * s + extra) * (1 + 8 * g64) + terms * (
            acc.min_subnormal + _TINY)
        lo, hi = _dn(pm - rad), _up(pm + rad)
        acc_over = _over(s, 1 + _gamma(terms, u), acc.max_finite)
        if acc_over is not None:
            over = acc_over if over is None else acc_over | over
    if inf_b is not None and inf_b.any():
        lo, hi = np.where(inf_b, bias.lo, lo), np.where(inf_b, bias.hi, hi)
    if over is None or not over.any():
        return lo, hi
    return np.where(over, -np.inf, lo), np.where(over, np.inf, hi)


def _close_fused(pm, pr, s, terms: int, bias: iv.Interval | None, fmt: str, g64: float):
    """`_close_numpy`'s values in one compiled pass, for no bias or one bias entry per column."""
    acc = get_format(_internal(fmt))
    n = pm.shape[-1] if pm.ndim and pm.size else 1
    uf, qf, grow_f, limit_f = 0.0, 0.0, 1.0, math.inf
    bmid = brad = blo = bhi = np.zeros(1)
    if bias is not None:
        if _reduced(fmt):
            f = get_format(fmt)
            uf, qf = f.unit_roundoff, f.min_subnormal
            grow_f, limit_f = 1 + _gamma(terms, acc.unit_roundoff), f.max_finite * 0.999
        blo, bhi = fused.flat(bias.lo), fused.flat(bias.hi)
        binf = (blo == bhi) & np.isinf(blo)
        with np.errstate(invalid="ignore", over="ignore"):
            bmid, brad = _midrad_np(np.where(binf, 0.0, blo), np.where(binf, 0.0, bhi), g64)
        terms += 1
    u = acc.unit_roundoff
    c1, c2 = _gamma(terms, u) + 3 * g64, 1 + 8 * g64
    c3 = terms * (acc.min_subnormal + _TINY)
    lo, hi = np.empty(pm.shape), np.empty(pm.shape)  # a bias broadcasts to pm's shape
    fused.close_tail(fused.flat(pm), fused.flat(pr), fused.flat(s), n, bias is not None,
                     fused.flat(bmid), fused.flat(brad), blo, bhi, c1, c2, c3, uf, qf, grow_f,
                     limit_f, 1 + _gamma(terms, u), acc.max_finite, lo.reshape(-1),
                     hi.reshape(-1))
    return lo, hi


def _over(s: np.ndarray, grow: float, limit: float) -> np.ndarray | None:
    """s grow >= limit elementwise, or None where no entry reaches it: the largest s screens
    (rounded products are monotone in s; a NaN in s gives the elementwise test)."""
    if s.size == 0 or float(s.max()) * grow < limit:
        return None
    return s * grow >= limit


def _mm(a, b, bias: iv.Interval | None, fmt: str, b_t: bool = False, operand_rel: float = 0.0):
    """Bound of a @ b (+ bias) for (..., m, k) @ (..., k, n); b_t: b is given as (..., n, k);
    operand_rel: each product a_i b_i may also be off by that much relative (operands scaled
    and rounded inside the kernel), charged as operand_rel sum |a_i b_i|.

    Midpoint-radius form in float64 BLAS (`leaf_products`, `box_products`, `close_products`):
    each float64 product of k nonnegative terms is within gamma_(k+4)(2^-53) of the exact one
    (any order, with or without FMA), charged to the midpoint and divided out of the radii."""
    if isinstance(a, Leaf):
        a = a.box()
    rr = b.radius(fmt) if isinstance(b, Leaf) else None
    if rr is None and isinstance(b, Leaf):
        b = b.box()
    if fmt != "float64":  # autocast: operands rounded into the output's format first
        a = _round_into(a, fmt)
        if bias is not None:
            bias = _round_into(bias, fmt)
    k = a.shape[-1]
    g64 = _gamma(k + 4, 2.0**-53)
    am, ar = _midrad(a, g64)
    lead = None
    if len(b.shape) == 2 and am.ndim != 2:  # one GEMM for a weight matrix (or a vector)
        lead = am.shape[:-1]
        am, ar = am.reshape(-1, k), ar.reshape(-1, k)
    with np.errstate(invalid="ignore", over="ignore"):
        if rr is not None:
            pm, pr, s = leaf_products(am, ar, b.t, *rr, g64, w_t=b_t, w_max=b.amax)
        else:
            if fmt != "float64":
                b = _round_into(b, fmt)
            bm, br = _midrad(b, g64)
            if b_t:
                bm, br = bm.transpose(-1, -2), br.transpose(-1, -2)
            pm, pr, s = box_products(am, ar, bm, br, g64)
        if operand_rel:
            pr = pr + operand_rel * s
            s = s * (1 + operand_rel)
    lo, hi = close_products(pm, pr, s, k, bias, fmt, g64)
    if lead is not None:
        lo, hi = lo.reshape(*lead, -1), hi.reshape(*lead, -1)
    return _round_into(_mk(lo, hi), fmt)


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
