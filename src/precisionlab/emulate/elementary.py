"""The package's one portable exp, log and sqrt, and the functions built on them, in float64.

Each is made of +, -, *, / (and frexp / exponent bits) or IEEE's square root, which IEEE 754
rounds correctly on every machine, so the results are the same bits everywhere; `kernels`
holds their compiled twins. The constants are exact hex floats; ln 2 is split so that
n * LN2_HI is exact.

torch's own sqrt (also pow(x, 0.5) and x ** 0.5), exp, log, log2, log10, sin, cos, tan, tanh,
acos, asin, atan, erf, erfc and erfinv on CPU float32/float64 tensors run Intel MKL's vector
math library where torch was built with MKL (the PyPI wheels for x86): faithful, not
correctly rounded, and their bits follow the code path MKL picks for the CPU
(MKL_ENABLE_INSTRUCTIONS=AVX2 changes them). Measured with torch 2.13.0 on an AVX-512 Intel
Xeon: torch.sqrt is 1 ulp off the correctly rounded root in 0.6% of normal float64 values
on MKL's AVX-512 path and 1.4% on its AVX2 path; in float32 0.59% (up to 0.56 ulp), 0.09%
(0.75 ulp) and, on its SSE4.2 path, 17% (0.81 ulp).
"""

from __future__ import annotations

import math

import numpy as np
import torch

__all__ = ["EXP_COEF", "INV_LN2", "LN2_HI", "LN2_LO", "LOG_COEF", "cos2pi64", "exp64", "log64",
           "pow2", "sigmoid64", "sqrt64", "tanh64"]

LN2_HI = float.fromhex("0x1.62e42feep-1")  # ln 2 with 21 low bits cleared: n * LN2_HI is exact
LN2_LO = float.fromhex("0x1.a39ef35793c76p-33")  # ln 2 - LN2_HI
INV_LN2 = float.fromhex("0x1.71547652b82fep0")  # 1 / ln 2
EXP_COEF = tuple(1.0 / math.factorial(k) for k in range(14))  # Taylor to r^13: error < 5e-18 for |r| <= ln2/2
LOG_COEF = tuple(2.0 / (2 * k + 1) for k in range(13))  # 2 atanh(s) = sum 2 s^(2k+1)/(2k+1)


def pow2(n: torch.Tensor) -> torch.Tensor:
    """2^n for integer-valued float64 n in [-1022, 1023], built from the exponent bits."""
    return ((n.to(torch.int64) + 1023) << 52).view(torch.float64)


def exp64(x: torch.Tensor) -> torch.Tensor:
    """e^x in float64 from +, -, *: x = n ln2 + r, |r| <= ln2/2, e^r by Horner, times 2^n."""
    x = x.to(torch.float64)
    n = torch.round(x * INV_LN2).clamp(-1100.0, 1100.0)
    r = (x - n * LN2_HI) - n * LN2_LO
    p = torch.full_like(r, EXP_COEF[-1])
    for c in reversed(EXP_COEF[:-1]):
        p = p * r + c
    half = torch.floor(n * 0.5)
    y = p * pow2(half) * pow2(n - half)
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
    p = torch.full_like(s, LOG_COEF[-1])
    for c in reversed(LOG_COEF[:-1]):
        p = p * s2 + c
    y = e * LN2_HI + (e * LN2_LO + s * p)
    y = torch.where(x == 0, -torch.inf, y)
    y = torch.where(x == torch.inf, torch.inf, y)
    return torch.where((x < 0) | torch.isnan(x), torch.nan, y)


def tanh64(x: torch.Tensor) -> torch.Tensor:
    """tanh x = sign(x) (1 - 2 / (e^(2|x|) + 1)) in float64."""
    return torch.sign(x) * (1.0 - 2.0 / (exp64(2.0 * x.abs()) + 1.0))


def sigmoid64(x: torch.Tensor) -> torch.Tensor:
    """1 / (1 + e^-x) in float64."""
    return 1.0 / (1.0 + exp64(-x))


def cos2pi64(u: torch.Tensor) -> torch.Tensor:
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


class _Sqrt64(torch.autograd.Function):
    """IEEE's square root through NumPy (correctly rounded on every CPU); d/dx = g / (2 sqrt x)."""

    @staticmethod
    def forward(ctx, x):
        with np.errstate(invalid="ignore"):  # sqrt(x < 0) is NaN (the CPU's default NaN)
            y = torch.from_numpy(np.asarray(np.sqrt(x.detach().cpu().numpy()))).to(x.device)
        ctx.save_for_backward(y)
        return y

    @staticmethod
    def backward(ctx, g):
        (y,) = ctx.saved_tensors
        return g / (2.0 * y)  # torch.sqrt's own derivative formula


def sqrt64(x: torch.Tensor) -> torch.Tensor:
    """The correctly rounded square root of x in float64 (torch.sqrt's is MKL's: see above)."""
    return _Sqrt64.apply(x.to(torch.float64))
