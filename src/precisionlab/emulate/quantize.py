"""Fake quantization: torch's fake_quantize_per_tensor_affine, computed in float64."""

from __future__ import annotations

import math

import torch

from ..checks import check_integer

__all__ = ["fake_quantize"]


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
    """(clamp(round(x/scale) + zp, qmin, qmax) - zp) * scale in float64, straight-through gradient inside the range."""
    # The forward and gradient mask of torch's fake_quantize_per_tensor_affine, which rounds
    # x/scale half to even before adding the zero point (its documentation writes
    # round(x/scale + zp): the two differ at ties when zp is odd). torch multiplies by a float32
    # 1/scale, which can differ from x/scale near ties unless scale is a power of two.
    s = float(scale)
    if not (math.isfinite(s) and s > 0):
        raise ValueError(f"scale must be a finite number > 0; got scale={scale!r}")
    for name, v in (("zero_point", zero_point), ("quant_min", quant_min), ("quant_max", quant_max)):
        check_integer(v, name)
    if not quant_min <= zero_point <= quant_max:
        raise ValueError(f"need quant_min <= zero_point <= quant_max; got quant_min={quant_min}, "
                         f"zero_point={zero_point}, quant_max={quant_max}")
    return _FakeQuantize.apply(x, s, float(zero_point), float(quant_min), float(quant_max))
