"""Scale rules: from a block's amax to the stored scale d (x ~ q * d) and the encode multiplier m (q = fl(x * m))."""

from __future__ import annotations

import torch

from ..formats import FloatFormat
from ..rounding import round_to

__all__ = ["e4m3_scale", "e8m0_scale", "float32_scale", "scale_for"]

_F32_MAX = torch.finfo(torch.float32).max


def float32_scale(amax: torch.Tensor, elem: FloatFormat, margin: int):
    """m = fl32(fl32(max_E / amax) / 2^margin) (1 where amax = 0, float32 max on overflow), d = fl32(1 / m)."""
    # Transformer Engine's rule, in float32 as its kernels compute it.
    a = amax.to(torch.float32)
    m = torch.tensor(elem.max_finite, dtype=torch.float32) / a / torch.tensor(2.0**margin)
    m = torch.where(a == 0, torch.ones_like(m), m)
    m = torch.where(torch.isinf(m), torch.full_like(m, _F32_MAX), m)
    return m, (1 / m).to(torch.float64)


def e8m0_scale(amax: torch.Tensor, elem: FloatFormat, margin: int, rule: str):
    """d = 2^k, k = floor(log2 amax) - emax_E + margin (OCP MX), 'ceil': least k with amax <= max_E 2^(k - margin); |k| <= 127."""
    a = amax.to(torch.float64)
    _, e = torch.frexp(torch.where(a > 0, a, torch.ones_like(a)))
    k = (e - 1 - elem.emax).to(torch.float64)  # floor(log2 amax) - emax_E; exact via frexp
    if rule == "ceil":  # amax / 2^k < 2 max_E, so one step up at most reaches amax <= max_E 2^k
        k = k + (a > elem.max_finite * torch.exp2(k)).to(torch.float64)
    k = torch.where(a > 0, k + margin, torch.full_like(k, -127.0)).clamp(-127, 127)
    return torch.exp2(-k).to(torch.float32), torch.exp2(k)


def e4m3_scale(amax: torch.Tensor, elem: FloatFormat, margin: int):
    """d = fl_e4m3(amax 2^margin / max_E) (saturating; float64 quotient, one rounding), m = fl32(1 / d), m = 0 where d = 0."""
    d = round_to(amax.to(torch.float64) * 2.0**margin / elem.max_finite, "float8_e4m3fn",
                 saturate=True)
    m = torch.where(d > 0, 1 / d.to(torch.float32), torch.zeros((), dtype=torch.float32))
    return m, d


def scale_for(amax: torch.Tensor, elem: FloatFormat, scale_format: FloatFormat, margin: int,
              e8m0_rule: str):
    """(m, d) for each block's amax: float32 (Transformer Engine), float8_e8m0fnu (OCP MX) or float8_e4m3fn."""
    fmt = scale_format.name
    if fmt == "float32":
        return float32_scale(amax, elem, margin)
    if fmt == "float8_e8m0fnu":
        return e8m0_scale(amax, elem, margin, e8m0_rule)
    return e4m3_scale(amax, elem, margin)
