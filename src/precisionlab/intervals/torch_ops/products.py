"""Matrix products for triage's rules in midpoint-radius form: leaves as t +- (rho |t| + tau)
(`Leaf`), operands and products in float64 and float32 BLAS with rigorous upper bounds
(`upper_product`, `leaf_products`, `box_products`), and the bound of the accumulated sum
(`close_products`); `mm` takes compiled passes (`kernels`; their NumPy twins in `small` for
small inputs) around the two BLAS products where torch's float32 matmul is IEEE (kernel model:
`rules`)."""

from __future__ import annotations

import math

import numpy as np
import torch

from ...formats import contains, get_format
from ..bounds import matmul as kernel_matmul
from ..interval import Interval
from ..ops import add as kernel_add
from . import fused, small
from .arith import (
    ABS_SLACK,
    UnsupportedOperation,
    arg,
    bare,
    down,
    gamma,
    internal,
    mk,
    reduced,
    round_into,
    rounding,
    up,
)

__all__ = ["CLOSE_COMPILED_MIN", "TF32_OPERANDS", "Leaf", "box_products", "close_products",
           "cuda_operand_rel", "declared_mm", "leaf_products", "midrad", "mm", "upper_product"]

# From this many outputs on, close_products takes its compiled pass (fused.close_tail); below
# it the NumPy steps, the same bits without the pass's cold compile (about a second).
CLOSE_COMPILED_MIN = 1 << 16

# Both operands of a product rounded to TF32 (10 fraction bits) in any direction: relative
# error of the product at most (1 + 2^-10)^2 - 1 (NVIDIA's conversion rounds to nearest or
# truncates, by kernel; either is inside).
TF32_OPERANDS = (1 + 2.0**-10) ** 2 - 1


def cuda_operand_rel(t: torch.Tensor, fmt: str) -> float:
    """The extra relative error per product a CUDA GEMM on t's device may add beyond the kernel
    model of `rules` (IEEE products, float32 accumulation): TF32 operands for float32 when
    torch.backends.cuda.matmul allows TF32 (torch.set_float32_matmul_precision("high"));
    0 on the CPU.

    Raises UnsupportedOperation for float16/bfloat16 GEMMs on CUDA while cuBLAS may reduce
    split-K partial sums in that format (allow_fp16/bf16_reduced_precision_reduction, on by
    default): partials rounded to 16 bits can overflow or flush where a float32 sum does not,
    which the float32-inside model does not bound."""
    if not isinstance(t, torch.Tensor) or t.device.type != "cuda":
        return 0.0
    m = torch.backends.cuda.matmul
    if fmt == "float32":
        tf32 = bool(getattr(m, "allow_tf32", False))
        try:
            tf32 = tf32 or getattr(m, "fp32_precision", "ieee") == "tf32"
        except RuntimeError:  # a torch that refuses to mix the old and new switches
            pass
        return TF32_OPERANDS if tf32 else 0.0
    flag = {"float16": "allow_fp16_reduced_precision_reduction",
            "bfloat16": "allow_bf16_reduced_precision_reduction"}.get(fmt)
    if flag is not None and bool(getattr(m, flag, False)):
        raise UnsupportedOperation(
            f"a {fmt} matrix product on CUDA with torch.backends.cuda.matmul.{flag} = True "
            "may round cuBLAS's split-K partial sums to 16 bits, which triage's kernel model "
            f"(float32 accumulation) does not bound; set it to False for the triage run, or "
            "declare the kernel with triage(..., kernels={...: intervals.Kernel(...)})")
    return 0.0


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

    def box(self, index=None) -> Interval:
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
        if fmt == "float64" or all(contains(fmt, f) for f in self.fmts):
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


def midrad(x: Interval, g64: float) -> tuple[torch.Tensor, torch.Tensor]:
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
        g = gamma(k + 4, 2.0**-53)
        return (left.to(torch.float64) @ right.to(torch.float64)) * (1 + 2 * g)

    def up32(t):
        y = t.to(torch.float32)
        return y if t.dtype in _EXACT_IN_F32 else torch.nextafter(y, _F32_INF)
    a, b = up32(left), up32(right)
    if right_max is None or right.dtype not in _EXACT_IN_F32:
        right_max = float(b.max()) if b.numel() else 0.0
    top = (float(a.max()) if a.numel() else 0.0) + right_max
    return (a @ b).to(torch.float64) * (1 + 2 * gamma(k + 2, 2.0**-24)) + 2 * k * 2.0**-126 * (
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


def close_products(pm, pr, s, terms: int, bias: Interval | None, fmt: str, g64: float):
    """(lo, hi) float64 arrays bounding sum_i a_i b_i (+ bias) accumulated in fmt's internal
    format in any order: |error| <= gamma_terms(u) s + terms q, plus float64's own error in pm
    (3 g64 s) and in forming the radius (a factor 1 + 8 g64). With a bias and a float16/bfloat16
    fmt, a kernel may also round the product into fmt before adding the bias: u_fmt |product|
    + q_fmt / 2 more (charged 1.01 u_fmt s + q_fmt), and the whole line where that rounding may
    overflow. A bias entry that is exactly +-inf gives that infinity; a sum that may overflow
    the accumulator the whole line."""
    pm, pr, s = pm.numpy(), pr.numpy(), s.numpy()  # the same float64 steps, in NumPy
    if pm.size >= CLOSE_COMPILED_MIN and (
            bias is None or (bias.lo.ndim <= pm.ndim and bias.lo.shape[-1:] == pm.shape[-1:] and
                             bias.lo.size == pm.shape[-1] and bias.hi.shape == bias.lo.shape)):
        return _close_fused(pm, pr, s, terms, bias, fmt, g64)
    return _close_numpy(pm, pr, s, terms, bias, fmt, g64)


def _close_numpy(pm, pr, s, terms: int, bias: Interval | None, fmt: str, g64: float):
    """`close_products` on float64 arrays in NumPy steps (any bias shape)."""
    acc = get_format(internal(fmt))
    inf_b = None
    extra = 0.0
    with np.errstate(invalid="ignore", over="ignore"):
        over = None
        if bias is not None:
            if reduced(fmt):
                f = get_format(fmt)
                extra = 1.01 * f.unit_roundoff * s + f.min_subnormal
                over = _over(s, 1 + gamma(terms, acc.unit_roundoff), f.max_finite * 0.999)
            blo, bhi = bias.lo, bias.hi
            inf_b = (blo == bhi) & np.isinf(blo)
            if inf_b.any():
                blo, bhi = np.where(inf_b, 0.0, blo), np.where(inf_b, 0.0, bhi)
            bmid, brad = _midrad_np(blo, bhi, g64)
            pm, pr, s = pm + bmid, pr + brad, s + np.abs(bmid) + brad
            terms += 1
        u = acc.unit_roundoff
        rad = (pr + (gamma(terms, u) + 3 * g64) * s + extra) * (1 + 8 * g64) + terms * (
            acc.min_subnormal + ABS_SLACK)
        lo, hi = down(pm - rad), up(pm + rad)
        acc_over = _over(s, 1 + gamma(terms, u), acc.max_finite)
        if acc_over is not None:
            over = acc_over if over is None else acc_over | over
    if inf_b is not None and inf_b.any():
        lo, hi = np.where(inf_b, bias.lo, lo), np.where(inf_b, bias.hi, hi)
    if over is None or not over.any():
        return lo, hi
    return np.where(over, -np.inf, lo), np.where(over, np.inf, hi)


def _close_args(terms: int, bias: Interval | None, fmt: str, g64: float) -> tuple:
    """`fused.close_tail`'s arguments after (pm, pr, s, ncol): the bias and the constants."""
    acc = get_format(internal(fmt))
    uf, qf, grow_f, limit_f = 0.0, 0.0, 1.0, math.inf
    blo = bhi = _ZERO
    if bias is not None:
        if reduced(fmt):
            f = get_format(fmt)
            uf, qf = f.unit_roundoff, f.min_subnormal
            grow_f, limit_f = 1 + gamma(terms, acc.unit_roundoff), f.max_finite * 0.999
        blo, bhi = fused.flat(bias.lo), fused.flat(bias.hi)
        terms += 1
    u = acc.unit_roundoff
    c1, c2 = gamma(terms, u) + 3 * g64, 1 + 8 * g64
    c3 = terms * (acc.min_subnormal + ABS_SLACK)
    return (bias is not None, blo, bhi, g64, c1, c2, c3, uf, qf, grow_f, limit_f,
            1 + gamma(terms, u), acc.max_finite)


_ZERO = np.zeros(1)


def _close_fused(pm, pr, s, terms: int, bias: Interval | None, fmt: str, g64: float):
    """`_close_numpy`'s values in one compiled pass, for no bias or one bias entry per column."""
    n = pm.shape[-1] if pm.ndim and pm.size else 1
    lo, hi = np.empty(pm.shape), np.empty(pm.shape)  # a bias broadcasts to pm's shape
    fused.close_tail(fused.flat(pm), fused.flat(pr), fused.flat(s), n,
                     *_close_args(terms, bias, fmt, g64), lo.reshape(-1), hi.reshape(-1))
    return lo, hi


def _over(s: np.ndarray, grow: float, limit: float) -> np.ndarray | None:
    """s grow >= limit elementwise, or None where no entry reaches it: the largest s screens
    (rounded products are monotone in s; a NaN in s gives the elementwise test)."""
    if s.size == 0 or float(s.max()) * grow < limit:
        return None
    return s * grow >= limit


def mm(a, b, bias: Interval | None, fmt: str, b_t: bool = False, operand_rel: float = 0.0):
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
    if fmt != "float64" and _ieee_float32():
        y = _mm32(a, b, bias, fmt, b_t, operand_rel, rr)
        if y is not None:
            return y
    return _mm_blas(a, b, bias, fmt, b_t, operand_rel, rr)


def _mm_blas(a: Interval, b, bias, fmt: str, b_t: bool, operand_rel: float, rr):
    """`mm` in torch and NumPy steps around the BLAS products (b a `Leaf` with radius rr, or an
    Interval when rr is None)."""
    if fmt != "float64":  # autocast: operands rounded into the output's format first
        a = round_into(a, fmt)
        if bias is not None:
            bias = round_into(bias, fmt)
    k = a.shape[-1]
    g64 = gamma(k + 4, 2.0**-53)
    am, ar = midrad(a, g64)
    lead = None
    if len(b.shape) == 2 and am.ndim != 2:  # one GEMM for a weight matrix (or a vector)
        lead = am.shape[:-1]
        am, ar = am.reshape(-1, k), ar.reshape(-1, k)
    with np.errstate(invalid="ignore", over="ignore"):
        if rr is not None:
            pm, pr, s = leaf_products(am, ar, b.t, *rr, g64, w_t=b_t, w_max=b.amax)
        else:
            if fmt != "float64":
                b = round_into(b, fmt)
            bm, br = midrad(b, g64)
            if b_t:
                bm, br = bm.transpose(-1, -2), br.transpose(-1, -2)
            pm, pr, s = box_products(am, ar, bm, br, g64)
        if operand_rel:
            pr = pr + operand_rel * s
            s = s * (1 + operand_rel)
    lo, hi = close_products(pm, pr, s, k, bias, fmt, g64)
    if lead is not None:
        lo, hi = lo.reshape(*lead, -1), hi.reshape(*lead, -1)
    return round_into(mk(lo, hi), fmt)


def _operand(x: Interval, nb: int, nr: int, nc: int, by_rows: bool, fmt: str, g64: float):
    """`kernels.mm_operand` (its NumPy twin in the small tier) of x as nb blocks of nr x nc:
    (mid, float32 stack, row sums, max)."""
    mid = np.empty(nb * nr * nc)
    stack = np.empty(2 * nb * nr * nc, dtype=np.float32)
    rows = np.empty(nb * nr if by_rows else 1)
    top = small.mm_operand(fused.flat(x.lo), fused.flat(x.hi), nb, nr, nc, by_rows,
                           *rounding(fmt), 1 + 4 * g64, 1 + 2 * g64, mid, stack, rows)
    return torch.from_numpy(mid), torch.from_numpy(stack), rows, top


def _mm32(a: Interval, b, bias, fmt: str, b_t: bool, orel: float, rr):
    """`mm`'s bounds for a float16/bfloat16/float32 result (float32 accumulation) when torch's
    float32 matmul is IEEE: the same steps (`leaf_products` for a `Leaf` b with radius rr, else
    `box_products`; `close_products`) in compiled passes (`small`'s twins for small inputs)
    around the two BLAS products, the same values but for the order of the row sums that tau
    multiplies (any order is within their slack); None where it does not apply (empty, broadcast batch axes, a bias that is
    not one entry per column, a float64 leaf)."""
    leaf = rr is not None
    bshape = tuple(b.shape)
    k = a.shape[-1]
    if len(bshape) < 2 or a.ndim < 2 or (leaf and b.t.dtype not in _EXACT_IN_F32):
        return None
    n = bshape[-2] if b_t else bshape[-1]
    flat2 = len(bshape) == 2
    if not flat2 and (a.ndim != len(bshape) or tuple(a.shape[:-2]) != bshape[:-2]):
        return None
    if bias is not None and not (bias.lo.ndim <= a.ndim and bias.lo.shape[-1:] == (n,) and
                                 bias.lo.size == n and bias.hi.shape == bias.lo.shape):
        return None
    m = math.prod(a.shape[:-1]) if flat2 else a.shape[-2]
    nb = 1 if flat2 else math.prod(a.shape[:-2])
    if not (m and k and n and nb):
        return None
    g64 = gamma(k + 4, 2.0**-53)
    lead = () if flat2 else (nb,)  # 2-D products for a weight matrix, as `mm` does
    am, sa, rows, top_a = _operand(a, nb, m, k, True, fmt, g64)
    am, sa = am.view(*lead, m, k), sa.view(*lead, 2 * m, k)
    if leaf:
        w = b.t.detach().cpu().reshape(*lead, *bshape[-2:])
        wm, wa = w.to(torch.float64), w.abs().to(torch.float32)
        if b_t:
            wm, wa = wm.transpose(-1, -2), wa.transpose(-1, -2)
        pm, prod, top = am @ wm, sa @ wa, top_a + b.amax
        rho, tau = rr
    else:
        blo, bhi = (np.swapaxes(b.lo, -1, -2), np.swapaxes(b.hi, -1, -2)) if b_t else (b.lo, b.hi)
        bm, sb, _, top_b = _operand(bare(blo, bhi), nb, k, n, False, fmt, g64)
        pm, prod, top = am @ bm.view(*lead, k, n), sa @ sb.view(*lead, k, 2 * n), top_a + top_b
        rho = tau = 0.0
    if bias is not None:
        bias = round_into(bias, fmt)
    lo, hi = np.empty(nb * m * n), np.empty(nb * m * n)
    pm = pm.numpy().reshape(-1)
    if small.mm_close(pm, prod.numpy().reshape(-1), nb, m, n, leaf, rows, rho, tau,
                      1 + 2 * gamma(k + 2, 2.0**-24), 2 * k * 2.0**-126 * (1 + top),
                      float(orel), n, *_close_args(k, bias, fmt, g64), *rounding(fmt), lo, hi):
        return bare(lo.reshape(*a.shape[:-1], n), hi.reshape(*a.shape[:-1], n))
    return mk(lo.reshape(*a.shape[:-1], n), hi.reshape(*a.shape[:-1], n))


def declared_mm(rec, get, kernel, fmt: str) -> list:
    """linear / matmul / mm / bmm of a traced call whose kernel the user declared
    (triage(..., kernels=...)): `intervals.matmul` per matrix under the structure-aware rule of
    that `intervals.Kernel`, then rounded outward into fmt."""
    if rec.name == "linear":
        x, w = get(rec.args[0]), get(arg(rec.args, rec.kwargs, 1, "weight"))
        b = arg(rec.args, rec.kwargs, 2, "bias")
        lead = x.shape[:-1]
        a = Interval(x.lo.reshape(-1, x.shape[-1]), x.hi.reshape(-1, x.shape[-1]), None,
                     "structure")
        y = kernel_matmul(a, Interval(w.lo.T, w.hi.T, None, "structure"), kernel)
        if isinstance(b, torch.Tensor):
            y = kernel_add(y, get(b).with_rule("structure"), kernel.out_format.name)
        return [round_into(mk(y.lo.reshape(*lead, -1), y.hi.reshape(*lead, -1)), fmt)]
    A, B = get(rec.args[0]), get(arg(rec.args, rec.kwargs, 1, "other"))
    shape = np.broadcast_shapes(A.shape[:-2], B.shape[:-2])
    alo, ahi = (np.broadcast_to(z, (*shape, *A.shape[-2:])) for z in (A.lo, A.hi))
    blo, bhi = (np.broadcast_to(z, (*shape, *B.shape[-2:])) for z in (B.lo, B.hi))
    lo = np.empty((*shape, A.shape[-2], B.shape[-1]))
    hi = np.empty_like(lo)
    for idx in np.ndindex(*shape):
        y = kernel_matmul(Interval(alo[idx], ahi[idx], None, "structure"),
                          Interval(blo[idx], bhi[idx], None, "structure"), kernel)
        lo[idx], hi[idx] = y.lo, y.hi
    return [round_into(mk(lo, hi), fmt)]
