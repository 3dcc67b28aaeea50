"""Portable reduced-precision arithmetic: the same bits on every CPU, thread count and torch version.

torch's own float16/bfloat16 (and float32) CPU kernels pick their summation order, vector
width and fused multiply-adds by instruction set and thread count, so one network gives
different digits on different machines. Every number this book states is computed here
instead, with arithmetic whose semantics are written down:

* **Storage.** A value "in format F" is a float32 tensor (float64 for F = float64) holding a
  number representable in F. `Precision` names F, the accumulator and the back end.
* **Matrix products** (`matmul`, `linear`): operands rounded to F; each product rounded to
  the accumulator (exact for every operand format narrower than it: the way tensor cores
  form products), summed in the accumulator in the fixed order k = 0, 1, ..., K-1; the bias
  added last in the accumulator; one rounding of the result to F. A small numba loop with no
  fused multiply-adds and no reassociation does this, so the order is the code's, not the CPU's.
* **Everything else** (elementwise functions, norms, softmax, losses, reductions, optimizer
  updates) is evaluated in float64 from the stored values, with sums taken by a fixed
  pairwise tree (`fixed_sum`) and exp/log built from +, -, *, / (`exp64`, `log64`), then
  rounded once to F with `round_to`. IEEE 754 makes float64 +, -, *, /, sqrt correctly rounded
  on every machine, which is what makes the result portable.
* **Gradients** are computed the same way and stored in F: each backward op rounds its
  incoming gradient to F, computes in the accumulator (matmul) or float64 (the rest), and
  rounds what it returns to F. A cast (`cast`) passes gradients straight through, as
  autocast's casts do.

`backend="native"` runs the same op with torch's own kernels in F's torch dtype instead: what
*this* machine's hardware gives, for the book's "your hardware" cells. Never `torch.compile`
an emulated op: fusion could drop the rounding steps.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

import numba
import numpy as np
import torch

from .checks import check_choice
from .formats import get_format
from .rounding import round_to

__all__ = [
    "ACCUMULATORS",
    "BACKENDS",
    "SGD",
    "Adam",
    "Linear",
    "Precision",
    "cast",
    "exp",
    "exp64",
    "fixed_sum",
    "gelu",
    "group_norm",
    "linear",
    "log",
    "log64",
    "log_softmax",
    "matmul",
    "mean",
    "mse_loss",
    "randn",
    "rms_norm",
    "sigmoid",
    "silu",
    "sum",
    "tanh",
]

ACCUMULATORS: tuple[str, ...] = ("float32", "float64")
BACKENDS: tuple[str, ...] = ("emulated", "native")


# --------------------------------------------------------------------------- the precision


@dataclass(frozen=True)
class Precision:
    """Storage format F of operands and results, the matmul accumulator, and the back end."""

    fmt: str = "float32"
    accumulate: str = "float32"
    backend: str = "emulated"

    def __post_init__(self):
        object.__setattr__(self, "fmt", get_format(self.fmt).name)
        check_choice(self.accumulate, "accumulate", ACCUMULATORS)
        check_choice(self.backend, "backend", BACKENDS)
        f, acc = get_format(self.fmt), get_format(self.accumulate)
        if f.mantissa_bits > acc.mantissa_bits:
            raise ValueError(
                f"accumulate={self.accumulate!r} is narrower than fmt={self.fmt!r}; valid "
                f"accumulators for it: {', '.join(a for a in ACCUMULATORS if get_format(a).mantissa_bits >= f.mantissa_bits)}"
            )
        if self.backend == "native" and f.torch_dtype is None:
            raise ValueError(f"backend='native' needs a torch dtype; fmt={self.fmt!r} has none")

    @property
    def container(self) -> torch.dtype:
        """The torch dtype that stores values of F: float64 for float64, float32 otherwise."""
        return torch.float64 if self.fmt == "float64" else torch.float32

    @property
    def native(self) -> bool:
        """True when torch's own kernels run the ops."""
        return self.backend == "native"

    def round(self, x: torch.Tensor) -> torch.Tensor:
        """fl_F(x) (round to nearest even), in the container dtype, without gradient."""
        return round_to(x.detach(), self.fmt).to(self.container)


def _prec(prec) -> Precision:
    if isinstance(prec, Precision):
        return prec
    if isinstance(prec, str):
        return Precision(prec)
    raise TypeError(f"prec must be a Precision or a format name; got prec={prec!r}")


# --------------------------------------------------------------------------- float64 building blocks

_LN2_HI = float.fromhex("0x1.62e42feep-1")  # ln 2 with 21 low bits cleared: n * _LN2_HI is exact
_LN2_LO = float.fromhex("0x1.a39ef35793c76p-33")  # ln 2 - _LN2_HI
_INV_LN2 = float.fromhex("0x1.71547652b82fep0")
_EXP_COEF = [1.0 / math.factorial(k) for k in range(14)]  # Taylor to r^13: error < 5e-18 for |r| <= ln2/2
_LOG_COEF = [2.0 / (2 * k + 1) for k in range(13)]  # 2 atanh(s) = sum 2 s^(2k+1)/(2k+1)


def _pow2(n: torch.Tensor) -> torch.Tensor:
    """2^n for integer-valued float64 n in [-1022, 1023], built from the exponent bits."""
    return ((n.to(torch.int64) + 1023) << 52).view(torch.float64)


def exp64(x: torch.Tensor) -> torch.Tensor:
    """e^x in float64 from +, -, *: x = n ln2 + r, |r| <= ln2/2, e^r by Horner, times 2^n."""
    x = x.to(torch.float64)
    n = torch.round(x * _INV_LN2).clamp(-1100.0, 1100.0)
    r = (x - n * _LN2_HI) - n * _LN2_LO
    p = torch.full_like(r, _EXP_COEF[-1])
    for c in reversed(_EXP_COEF[:-1]):
        p = p * r + c
    half = torch.floor(n * 0.5)
    y = p * _pow2(half) * _pow2(n - half)
    y = torch.where(x > 709.8, torch.inf, y)
    y = torch.where(x < -745.2, 0.0, y)
    return torch.where(torch.isnan(x), x, y)


def log64(x: torch.Tensor) -> torch.Tensor:
    """ln x in float64 from +, -, *, /: x = m 2^e, m in [1/sqrt2, sqrt2), ln m = 2 atanh((m-1)/(m+1))."""
    x = x.to(torch.float64)
    m, e = torch.frexp(x)
    low = m < math.sqrt(0.5)
    m = torch.where(low, m * 2.0, m)
    e = (e - low.to(e.dtype)).to(torch.float64)
    s = (m - 1.0) / (m + 1.0)
    s2 = s * s
    p = torch.full_like(s, _LOG_COEF[-1])
    for c in reversed(_LOG_COEF[:-1]):
        p = p * s2 + c
    y = e * _LN2_HI + (e * _LN2_LO + s * p)
    y = torch.where(x == 0, -torch.inf, y)
    y = torch.where(x == torch.inf, torch.inf, y)
    return torch.where((x < 0) | torch.isnan(x), torch.nan, y)


def _tanh64(x: torch.Tensor) -> torch.Tensor:
    """tanh x = sign(x) (1 - 2 / (e^(2|x|) + 1)) in float64."""
    return torch.sign(x) * (1.0 - 2.0 / (exp64(2.0 * x.abs()) + 1.0))


def _sigmoid64(x: torch.Tensor) -> torch.Tensor:
    """1 / (1 + e^-x) in float64."""
    return 1.0 / (1.0 + exp64(-x))


def _cos_2pi64(u: torch.Tensor) -> torch.Tensor:
    """cos(2 pi u) in float64 from +, -, *: u = q/4 + r exactly, |r| <= 1/8, Taylor in 2 pi r."""
    q = torch.round(4.0 * u)
    t = (u - 0.25 * q) * (2.0 * math.pi)  # u - q/4 is exact; |t| <= pi/4
    t2 = t * t
    c = torch.full_like(t, (-1) ** 9 / math.factorial(18))
    s = torch.full_like(t, (-1) ** 9 / math.factorial(19))
    for k in range(8, -1, -1):
        c = c * t2 + (-1) ** k / math.factorial(2 * k)
        s = s * t2 + (-1) ** k / math.factorial(2 * k + 1)
    s = s * t
    quadrant = torch.remainder(q, 4.0)
    return torch.where(quadrant == 0, c, torch.where(quadrant == 1, -s, torch.where(quadrant == 2, -c, s)))


def randn(*shape: int, generator: torch.Generator, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """N(0, 1) samples sqrt(-2 ln U1) cos(2 pi U2), U1, U2 ~ U(0, 1] from torch.rand in float64.

    torch.randn's float32 path uses vectorised approximations of log and cos whose bits depend
    on the CPU's instruction set; this Box-Muller transform uses exp64/log64-style arithmetic
    only, so a seed gives the same samples on every machine.
    """
    if not isinstance(generator, torch.Generator):
        raise TypeError(f"generator must be a torch.Generator; got generator={generator!r}")
    if dtype not in (torch.float32, torch.float64):
        raise ValueError(f"dtype must be torch.float32 or torch.float64; got dtype={dtype!r}")
    n = math.prod(shape)
    u = torch.rand(2, n, generator=generator, dtype=torch.float64)
    z = torch.sqrt(-2.0 * log64(1.0 - u[0])) * _cos_2pi64(u[1])
    return z.reshape(shape).to(dtype)


def fixed_sum(x: torch.Tensor, dim: int = -1, keepdim: bool = False) -> torch.Tensor:
    """sum over `dim` by a fixed pairwise tree, x_i + x_(i + h) with h = half the padded length."""
    x = x.movedim(dim, -1)
    while x.shape[-1] > 1:
        n = x.shape[-1]
        if n % 2:
            x = torch.nn.functional.pad(x, (0, 1))
            n += 1
        x = x[..., : n // 2] + x[..., n // 2:]
    if x.shape[-1] == 0:
        x = x.new_zeros((*x.shape[:-1], 1))
    x = x.movedim(-1, dim)
    return x if keepdim else x.squeeze(dim)


def _sum_to(g: torch.Tensor, shape: torch.Size) -> torch.Tensor:
    """Reduce a broadcast gradient back to `shape` with fixed_sum (undoes broadcasting)."""
    while g.dim() > len(shape):
        g = fixed_sum(g, 0)
    for d, n in enumerate(shape):
        if n == 1 and g.shape[d] != 1:
            g = fixed_sum(g, d, keepdim=True)
    return g


# --------------------------------------------------------------------------- the matmul kernel


@numba.njit(cache=True)
def _gemm_kernel(a, b, out):  # pragma: no cover - compiled
    """out[i, j] = (...((0 + a[i,0] b[0,j]) + a[i,1] b[1,j]) + ...), in a's dtype, no FMA."""
    m, k = a.shape
    n = b.shape[1]
    for i in range(m):
        for j in range(n):
            out[i, j] = 0.0
        for p in range(k):
            aip = a[i, p]
            for j in range(n):
                out[i, j] = out[i, j] + aip * b[p, j]


def _gemm(a: torch.Tensor, b: torch.Tensor, prec: Precision) -> torch.Tensor:
    """a @ b in the accumulator, sequential over k; result in the accumulator's dtype."""
    dt = np.float64 if prec.accumulate == "float64" else np.float32
    an = np.ascontiguousarray(a.detach().cpu().numpy(), dtype=dt)
    bn = np.ascontiguousarray(b.detach().cpu().numpy(), dtype=dt)
    out = np.empty((an.shape[0], bn.shape[1]), dtype=dt)
    if an.shape[1] == 0:
        out[:] = 0
    else:
        _gemm_kernel(an, bn, out)
    return torch.from_numpy(out)


class _MatMul(torch.autograd.Function):
    """C = fl_F(fl_F(A) fl_F(B)); dA = fl_F(fl_F(dC) B^T), dB = fl_F(A^T fl_F(dC))."""

    @staticmethod
    def forward(ctx, a, b, prec):
        ar, br = prec.round(a), prec.round(b)
        ctx.save_for_backward(ar, br)
        ctx.prec = prec
        return prec.round(_gemm(ar, br, prec))

    @staticmethod
    def backward(ctx, g):
        ar, br = ctx.saved_tensors
        prec = ctx.prec
        g = prec.round(g)
        ga = prec.round(_gemm(g, br.T, prec)) if ctx.needs_input_grad[0] else None
        gb = prec.round(_gemm(ar.T, g, prec)) if ctx.needs_input_grad[1] else None
        return ga, gb, None


class _Linear(torch.autograd.Function):
    """y = fl_F(acc(fl_F(x) fl_F(W)^T) + b): the bias joins the accumulator before the one rounding."""

    @staticmethod
    def forward(ctx, x, w, b, prec):
        xr, wr = prec.round(x), prec.round(w)
        acc = _gemm(xr, wr.T, prec)
        if b is not None:
            acc = acc + prec.round(b).to(acc.dtype)
        ctx.save_for_backward(xr, wr)
        ctx.prec, ctx.has_bias = prec, b is not None
        return prec.round(acc)

    @staticmethod
    def backward(ctx, g):
        xr, wr = ctx.saved_tensors
        prec = ctx.prec
        g = prec.round(g)
        gx = prec.round(_gemm(g, wr, prec)) if ctx.needs_input_grad[0] else None
        gw = prec.round(_gemm(g.T, xr, prec)) if ctx.needs_input_grad[1] else None
        gb = None
        if ctx.has_bias and ctx.needs_input_grad[2]:
            gb = prec.round(fixed_sum(g.to(torch.float64), 0))
        return gx, gw, gb, None


def matmul(a: torch.Tensor, b: torch.Tensor, prec="float32") -> torch.Tensor:
    """A @ B for A (M, K), B (K, N): operands and result in F, sequential accumulation over k."""
    prec = _prec(prec)
    if a.dim() != 2 or b.dim() != 2 or a.shape[1] != b.shape[0]:
        raise ValueError(f"matmul needs (M, K) @ (K, N); got shapes {tuple(a.shape)} and {tuple(b.shape)}")
    if prec.native:
        dt = get_format(prec.fmt).torch_dtype
        return (a.to(dt) @ b.to(dt)).to(prec.container)
    return _MatMul.apply(a, b, prec)


def linear(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None = None,
           prec="float32") -> torch.Tensor:
    """x W^T + b for x (..., K), W (N, K), b (N,): accumulated in the accumulator, rounded once to F."""
    prec = _prec(prec)
    if x.shape[-1] != w.shape[-1] or w.dim() != 2:
        raise ValueError(f"linear needs x (..., K) and W (N, K); got {tuple(x.shape)} and {tuple(w.shape)}")
    if prec.native:
        dt = get_format(prec.fmt).torch_dtype
        return torch.nn.functional.linear(x.to(dt), w.to(dt), None if b is None else b.to(dt)).to(
            prec.container)
    lead = x.shape[:-1]
    y = _Linear.apply(x.reshape(-1, x.shape[-1]), w, b, prec)
    return y.reshape(*lead, w.shape[0])


# --------------------------------------------------------------------------- casts and elementwise ops


class _Cast(torch.autograd.Function):
    """y = fl_F(x); dy/dx passes through unchanged (straight-through, like autocast's casts)."""

    @staticmethod
    def forward(ctx, x, prec):
        return prec.round(x)

    @staticmethod
    def backward(ctx, g):
        return g, None


def cast(x: torch.Tensor, prec) -> torch.Tensor:
    """fl_F(x) with a straight-through gradient."""
    prec = _prec(prec)
    if prec.native:
        return x.to(get_format(prec.fmt).torch_dtype).to(prec.container)
    return _Cast.apply(x, prec)


def _gelu_parts(x):
    """gelu(x) = x/2 (1 + tanh(c (x + 0.044715 x^3))), c = sqrt(2/pi), and its derivative, in float64."""
    c = math.sqrt(2.0 / math.pi)
    t = _tanh64(c * (x + 0.044715 * x * x * x))
    y = 0.5 * x * (1.0 + t)
    dy = 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * c * (1.0 + 3 * 0.044715 * x * x)
    return y, dy


def _silu_parts(x):
    """silu(x) = x sigmoid(x) and its derivative s (1 + x (1 - s)), in float64."""
    s = _sigmoid64(x)
    return x * s, s * (1.0 + x * (1.0 - s))


def _exp_parts(x):
    y = exp64(x)
    return y, y


def _log_parts(x):
    return log64(x), 1.0 / x


def _tanh_parts(x):
    t = _tanh64(x)
    return t, 1.0 - t * t


def _sigmoid_parts(x):
    s = _sigmoid64(x)
    return s, s * (1.0 - s)


_UNARY = {"exp": _exp_parts, "log": _log_parts, "tanh": _tanh_parts, "sigmoid": _sigmoid_parts,
          "gelu": _gelu_parts, "silu": _silu_parts}
_NATIVE_UNARY = {"exp": torch.exp, "log": torch.log, "tanh": torch.tanh, "sigmoid": torch.sigmoid,
                 "gelu": lambda x: torch.nn.functional.gelu(x, approximate="tanh"),
                 "silu": torch.nn.functional.silu}


class _Unary(torch.autograd.Function):
    """y = fl_F(f(x)), dx = fl_F(fl_F(dy) f'(x)), f and f' evaluated in float64."""

    @staticmethod
    def forward(ctx, x, name, prec):
        xr = prec.round(x)
        y, _ = _UNARY[name](xr.to(torch.float64))
        ctx.save_for_backward(xr)
        ctx.name, ctx.prec = name, prec
        return prec.round(y)

    @staticmethod
    def backward(ctx, g):
        (xr,) = ctx.saved_tensors
        prec = ctx.prec
        _, dy = _UNARY[ctx.name](xr.to(torch.float64))
        return prec.round(prec.round(g).to(torch.float64) * dy), None, None


def _unary(name: str, x: torch.Tensor, prec) -> torch.Tensor:
    prec = _prec(prec)
    if prec.native:
        dt = get_format(prec.fmt).torch_dtype
        return _NATIVE_UNARY[name](x.to(dt)).to(prec.container)
    return _Unary.apply(x, name, prec)


def exp(x: torch.Tensor, prec="float32") -> torch.Tensor:
    """fl_F(e^x), e^x from exp64."""
    return _unary("exp", x, prec)


def log(x: torch.Tensor, prec="float32") -> torch.Tensor:
    """fl_F(ln x), ln x from log64."""
    return _unary("log", x, prec)


def tanh(x: torch.Tensor, prec="float32") -> torch.Tensor:
    """fl_F(tanh x)."""
    return _unary("tanh", x, prec)


def sigmoid(x: torch.Tensor, prec="float32") -> torch.Tensor:
    """fl_F(1 / (1 + e^-x))."""
    return _unary("sigmoid", x, prec)


def gelu(x: torch.Tensor, prec="float32") -> torch.Tensor:
    """fl_F(x/2 (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))), the tanh form of GELU."""
    return _unary("gelu", x, prec)


def silu(x: torch.Tensor, prec="float32") -> torch.Tensor:
    """fl_F(x sigmoid(x))."""
    return _unary("silu", x, prec)


# --------------------------------------------------------------------------- norms, softmax, reductions, losses


class _RMSNorm(torch.autograd.Function):
    """y = fl_F(x / sqrt(mean(x^2) + eps)) over the last dim; one rounding, float64 inside."""

    @staticmethod
    def forward(ctx, x, eps, prec):
        xr = prec.round(x).to(torch.float64)
        r = 1.0 / torch.sqrt(fixed_sum(xr * xr, -1, keepdim=True) / xr.shape[-1] + eps)
        ctx.save_for_backward(xr, r)
        ctx.prec = prec
        return prec.round(xr * r)

    @staticmethod
    def backward(ctx, g):
        xr, r = ctx.saved_tensors
        prec = ctx.prec
        g = prec.round(g).to(torch.float64)
        y = xr * r
        # dx = r (g - y mean(g y)): the projection removes the component along y.
        dx = r * (g - y * (fixed_sum(g * y, -1, keepdim=True) / xr.shape[-1]))
        return prec.round(dx), None, None


def rms_norm(x: torch.Tensor, prec="float32", eps: float = 1e-6) -> torch.Tensor:
    """x / sqrt(mean_last(x^2) + eps), no learnable scale."""
    prec = _prec(prec)
    if prec.native:
        dt = get_format(prec.fmt).torch_dtype
        return torch.nn.functional.rms_norm(x.to(dt), (x.shape[-1],), eps=eps).to(prec.container)
    return _RMSNorm.apply(x, float(eps), prec)


def _group_stats64(x: torch.Tensor, groups: int, eps: float):
    """For float64 x (N, C, *): x_hat = (x - mean) r and r = 1/sqrt(var + eps) per (sample, group), grouped shape (N, G, m)."""
    xg = x.reshape(x.shape[0], groups, -1)
    m = xg.shape[-1]
    d = xg - fixed_sum(xg, -1, keepdim=True) / m
    r = 1.0 / torch.sqrt(fixed_sum(d * d, -1, keepdim=True) / m + eps)
    return d * r, r


def _channel_view(p: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """A per-channel vector (C,) shaped (1, C, 1, ...) to broadcast against x (N, C, *)."""
    return p.reshape(1, -1, *([1] * (x.dim() - 2)))


class _GroupNorm(torch.autograd.Function):
    """y = fl_F(x_hat gamma + beta), x_hat normalised over each (sample, group); float64 inside, one rounding."""

    @staticmethod
    def forward(ctx, x, groups, w, b, eps, prec):
        xr = prec.round(x).to(torch.float64)
        xhat, r = _group_stats64(xr, groups, eps)
        xhat = xhat.reshape(xr.shape)
        wr = None if w is None else _channel_view(prec.round(w).to(torch.float64), xr)
        y = xhat if wr is None else xhat * wr
        if b is not None:
            y = y + _channel_view(prec.round(b).to(torch.float64), xr)
        ctx.save_for_backward(xhat, r, wr)
        ctx.groups, ctx.prec, ctx.has = groups, prec, (w is not None, b is not None)
        return prec.round(y)

    @staticmethod
    def backward(ctx, g):
        xhat, r, wr = ctx.saved_tensors
        prec, groups = ctx.prec, ctx.groups
        g = prec.round(g).to(torch.float64)
        gy = g if wr is None else g * wr
        n = xhat.shape[0]
        gg, hg = gy.reshape(n, groups, -1), xhat.reshape(n, groups, -1)
        m = gg.shape[-1]
        # dx = r (g' - mean(g') - x_hat mean(g' x_hat)) per group, g' = g gamma.
        dx = r * (gg - fixed_sum(gg, -1, keepdim=True) / m
                  - hg * (fixed_sum(gg * hg, -1, keepdim=True) / m))
        per_channel = (0, *range(2, xhat.dim()))
        gw = gb = None
        if ctx.has[0] and ctx.needs_input_grad[2]:
            gw = prec.round(_sum_over(g * xhat, per_channel))
        if ctx.has[1] and ctx.needs_input_grad[3]:
            gb = prec.round(_sum_over(g, per_channel))
        return prec.round(dx.reshape(xhat.shape)), None, gw, gb, None, None


def _sum_over(x: torch.Tensor, dims) -> torch.Tensor:
    """fixed_sum over several dimensions, last first."""
    for d in sorted(dims, reverse=True):
        x = fixed_sum(x, d)
    return x


def group_norm(x: torch.Tensor, groups: int, weight: torch.Tensor | None = None,
               bias: torch.Tensor | None = None, prec="float32", eps: float = 1e-5) -> torch.Tensor:
    """(x - mean) / sqrt(var + eps) over each group of C/groups channels of x (N, C, *), times weight plus bias."""
    prec = _prec(prec)
    if x.dim() < 2 or int(groups) != groups or groups < 1 or x.shape[1] % groups:
        raise ValueError(f"group_norm needs x (N, C, *) with C divisible by groups; got shape "
                         f"{tuple(x.shape)} and groups={groups!r}")
    if prec.native:
        dt = get_format(prec.fmt).torch_dtype

        def cv(p):
            return None if p is None else p.to(dt)

        return torch.nn.functional.group_norm(x.to(dt), int(groups), cv(weight), cv(bias),
                                              eps).to(prec.container)
    return _GroupNorm.apply(x, int(groups), weight, bias, float(eps), prec)


class _LogSoftmax(torch.autograd.Function):
    """y = fl_F(x - max - ln sum e^(x - max)) over the last dim; dx = fl_F(g - e^y sum g)."""

    @staticmethod
    def forward(ctx, x, prec):
        xr = prec.round(x).to(torch.float64)
        z = xr - xr.amax(-1, keepdim=True)
        y = z - log64(fixed_sum(exp64(z), -1, keepdim=True))
        ctx.save_for_backward(y)
        ctx.prec = prec
        return prec.round(y)

    @staticmethod
    def backward(ctx, g):
        (y,) = ctx.saved_tensors
        prec = ctx.prec
        g = prec.round(g).to(torch.float64)
        return prec.round(g - exp64(y) * fixed_sum(g, -1, keepdim=True)), None


def log_softmax(x: torch.Tensor, prec="float32") -> torch.Tensor:
    """log softmax over the last dimension."""
    prec = _prec(prec)
    if prec.native:
        dt = get_format(prec.fmt).torch_dtype
        return torch.log_softmax(x.to(dt), -1).to(prec.container)
    return _LogSoftmax.apply(x, prec)


class _Sum(torch.autograd.Function):
    """y = fl_F(fixed_sum(x, dim) / d), d = 1 (sum) or the length (mean); dx = fl_F(dy / d) broadcast."""

    @staticmethod
    def forward(ctx, x, dim, keepdim, divide, prec):
        xr = prec.round(x).to(torch.float64)
        d = xr.shape[dim] if divide else 1
        ctx.shape, ctx.dim, ctx.keepdim, ctx.d, ctx.prec = x.shape, dim, keepdim, d, prec
        return prec.round(fixed_sum(xr, dim, keepdim) / d)

    @staticmethod
    def backward(ctx, g):
        prec = ctx.prec
        g = prec.round(g).to(torch.float64) / ctx.d
        if not ctx.keepdim:
            g = g.unsqueeze(ctx.dim)
        return prec.round(g.expand(ctx.shape)), None, None, None, None


def _reduce(x, dim, keepdim, divide, prec):
    prec = _prec(prec)
    if dim is None:
        x, dim = x.reshape(-1), 0
    if prec.native:
        dt = get_format(prec.fmt).torch_dtype
        f = torch.mean if divide else torch.sum
        return f(x.to(dt), dim, keepdim=keepdim).to(prec.container)
    return _Sum.apply(x, int(dim), bool(keepdim), bool(divide), prec)


def sum(x: torch.Tensor, dim: int | None = None, keepdim: bool = False, prec="float32") -> torch.Tensor:
    """sum over dim (all entries when None) by fixed_sum, rounded once to F."""
    return _reduce(x, dim, keepdim, False, prec)


def mean(x: torch.Tensor, dim: int | None = None, keepdim: bool = False, prec="float32") -> torch.Tensor:
    """mean over dim (all entries when None): fixed_sum / n, rounded once to F."""
    return _reduce(x, dim, keepdim, True, prec)


class _MSE(torch.autograd.Function):
    """L = fl_F(sum (x - t)^2 / n); dL/dx = fl_F(2 (x - t) dL / n)."""

    @staticmethod
    def forward(ctx, x, t, prec):
        diff = prec.round(x).to(torch.float64) - prec.round(t).to(torch.float64)
        ctx.save_for_backward(diff)
        ctx.prec = prec
        return prec.round(fixed_sum((diff * diff).reshape(-1), 0) / diff.numel())

    @staticmethod
    def backward(ctx, g):
        (diff,) = ctx.saved_tensors
        prec = ctx.prec
        gx = prec.round(2.0 * diff * (prec.round(g).to(torch.float64) / diff.numel()))
        return gx, None if not ctx.needs_input_grad[1] else -gx, None


def mse_loss(x: torch.Tensor, t: torch.Tensor, prec="float32") -> torch.Tensor:
    """mean((x - t)^2) over every entry, evaluated in float64 and rounded once to F."""
    prec = _prec(prec)
    if x.shape != t.shape:
        raise ValueError(f"mse_loss needs equal shapes; got {tuple(x.shape)} and {tuple(t.shape)}")
    if prec.native:
        dt = get_format(prec.fmt).torch_dtype
        return torch.nn.functional.mse_loss(x.to(dt), t.to(dt)).to(prec.container)
    return _MSE.apply(x, t, prec)


# --------------------------------------------------------------------------- modules and optimizers


class Linear(torch.nn.Module):
    """y = x W^T + b through `linear` with a fixed Precision; parameters stored in their own dtype."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, prec):
        super().__init__()
        self.prec = _prec(prec)
        self.weight = torch.nn.Parameter(self.prec.round(weight))
        self.bias = None if bias is None else torch.nn.Parameter(self.prec.round(bias))

    @classmethod
    def from_torch(cls, lin: torch.nn.Linear, prec) -> Linear:
        """An emulated copy of a torch.nn.Linear, its parameters rounded to F."""
        return cls(lin.weight.detach().float(), None if lin.bias is None else lin.bias.detach().float(),
                   prec)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x W^T + b in self.prec."""
        return linear(x, self.weight, self.bias, self.prec)


def _params(params: Iterable) -> list:
    params = list(params)
    if not params:
        raise ValueError("the optimizer got an empty parameter list")
    return params


class SGD(torch.optim.Optimizer):
    """b <- mu b + g (b = g at the first step), w <- fl_F(w - lr b); float64 inside, state in F."""

    def __init__(self, params, lr: float, momentum: float = 0.0, prec="float32"):
        if not (math.isfinite(lr) and lr > 0):
            raise ValueError(f"lr must be a finite number > 0; got lr={lr!r}")
        if not 0 <= momentum < 1:
            raise ValueError(f"momentum must be in [0, 1); got momentum={momentum!r}")
        super().__init__(_params(params), {"lr": float(lr), "momentum": float(momentum)})
        self.prec = _prec(prec)

    @torch.no_grad()
    def step(self, closure=None):
        """One update of every parameter that has a gradient."""
        p_ = self.prec
        for group in self.param_groups:
            lr, mu = group["lr"], group["momentum"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                g = p.grad.to(torch.float64)
                if mu:
                    st = self.state[p]
                    b = g if "buf" not in st else mu * st["buf"].to(torch.float64) + g
                    st["buf"] = p_.round(b)
                    g = st["buf"].to(torch.float64)
                p.copy_(p_.round(p.to(torch.float64) - lr * g))


class Adam(torch.optim.Optimizer):
    """torch's Adam: m, v moments, w <- w - lr m_hat / (sqrt(v_hat) + eps); float64 inside, state in F."""

    def __init__(self, params, lr: float = 1e-3, betas=(0.9, 0.999), eps: float = 1e-8,
                 prec="float32"):
        if not (math.isfinite(lr) and lr > 0):
            raise ValueError(f"lr must be a finite number > 0; got lr={lr!r}")
        for name, b in zip(("betas[0]", "betas[1]"), betas, strict=True):
            if not 0 <= b < 1:
                raise ValueError(f"{name} must be in [0, 1); got {b!r}")
        if not eps > 0:
            raise ValueError(f"eps must be > 0; got eps={eps!r}")
        super().__init__(_params(params), {"lr": float(lr), "betas": tuple(map(float, betas)),
                                           "eps": float(eps)})
        self.prec = _prec(prec)

    @torch.no_grad()
    def step(self, closure=None):
        """One Adam update of every parameter that has a gradient."""
        p_ = self.prec
        for group in self.param_groups:
            lr, (b1, b2), eps = group["lr"], group["betas"], group["eps"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                g = p.grad.to(torch.float64)
                st = self.state[p]
                if not st:
                    st["step"] = 0
                    st["m"] = torch.zeros_like(p)
                    st["v"] = torch.zeros_like(p)
                st["step"] += 1
                t = st["step"]
                m = p_.round(b1 * st["m"].to(torch.float64) + (1 - b1) * g)
                v = p_.round(b2 * st["v"].to(torch.float64) + (1 - b2) * g * g)
                st["m"].copy_(m)
                st["v"].copy_(v)
                m_hat = m.to(torch.float64) / (1 - b1**t)
                v_hat = v.to(torch.float64) / (1 - b2**t)
                p.copy_(p_.round(p.to(torch.float64) - lr * m_hat / (torch.sqrt(v_hat) + eps)))


# --------------------------------------------------------------------------- fake quantization

__all__ += ["fake_quantize"]


class _FakeQuantize(torch.autograd.Function):
    """y = (clamp(round(x/s) + z, qmin, qmax) - z) s; dy/dx = 1 where round(x/s) + z is in range, else 0."""

    @staticmethod
    def forward(ctx, x, scale, zero_point, qmin, qmax):
        q = torch.round(x.detach().to(torch.float64) / scale) + zero_point  # half to even, then shift
        inside = (q >= qmin) & (q <= qmax)
        ctx.save_for_backward(inside)
        return ((q.clamp(qmin, qmax) - zero_point) * scale).to(x.dtype)

    @staticmethod
    def backward(ctx, g):
        (inside,) = ctx.saved_tensors
        return g * inside.to(g.dtype), None, None, None, None


def fake_quantize(x: torch.Tensor, scale: float, zero_point: int = 0, quant_min: int = -128,
                  quant_max: int = 127) -> torch.Tensor:
    """(clamp(round(x/scale) + zp, qmin, qmax) - zp) * scale in float64, straight-through gradient inside the range.

    The forward and gradient mask of torch's fake_quantize_per_tensor_affine, which rounds
    x/scale half to even before adding the zero point (its documentation writes
    round(x/scale + zp): the two differ at ties when zp is odd). torch multiplies by a float32
    1/scale, which can differ from x/scale near ties unless scale is a power of two.
    """
    s = float(scale)
    if not (math.isfinite(s) and s > 0):
        raise ValueError(f"scale must be a finite number > 0; got scale={scale!r}")
    for name, v in (("zero_point", zero_point), ("quant_min", quant_min), ("quant_max", quant_max)):
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
            raise ValueError(f"{name} must be an integer; got {name}={v!r}")
    if not quant_min <= zero_point <= quant_max:
        raise ValueError(f"need quant_min <= zero_point <= quant_max; got quant_min={quant_min}, "
                         f"zero_point={zero_point}, quant_max={quant_max}")
    return _FakeQuantize.apply(x, s, float(zero_point), float(quant_min), float(quant_max))
