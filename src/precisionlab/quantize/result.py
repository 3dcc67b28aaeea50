"""`Quantized`: elements q, scales d per block, and what the rounding did (x ~ q * d, exact to dequantize)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..formats import FloatFormat
from ..rounding import round_to
from .grid import blocked
from .shares import count_shares, overflow_threshold

__all__ = ["Quantized", "encode"]


@dataclass(frozen=True)
class Quantized:
    """x ~ values * decode per block; shares of x's elements: saturated (x m rounds past max_E), underflowed (x != 0, q = 0), subnormal q."""

    values: torch.Tensor  # q: float32, x's shape, every entry a value of `elem`
    scales: torch.Tensor  # the stored scale per block (float32 values of scale_format), shape
    #                       (n_0/b_0, n_1/b_1, ...): one entry per block
    decode: torch.Tensor  # float64, same shape: what q is multiplied by (scales * tensor_scale
    #                       for two-level, else scales)
    elem: str
    scale_format: str
    block: tuple[int, ...]  # the block's size along each dimension of x
    saturated: float
    underflowed: float
    subnormal: float
    tensor_scale: float | None = None  # the second level's float32 scale (two-level only)

    def dequantize(self) -> torch.Tensor:
        """q * d per block in float64: exact, since q has <= 4 and d <= 28 significant bits."""
        q = blocked(self.values.to(torch.float64), self.block)
        d = self.decode.reshape([v for n in self.decode.shape for v in (n, 1)])
        return (q * d).reshape(self.values.shape)

    @property
    def shares(self) -> dict[str, float]:
        """{'saturated', 'underflowed', 'subnormal'}: fractions of all elements of x."""
        return {"saturated": self.saturated, "underflowed": self.underflowed,
                "subnormal": self.subnormal}


def encode(x: torch.Tensor, block: tuple[int, ...], amax: torch.Tensor, m: torch.Tensor,
           d: torch.Tensor, elem: FloatFormat, scale_format: str,
           stored: torch.Tensor | None = None, tensor_scale: float | None = None) -> Quantized:
    """q = fl_E(fl32(x * m_k)) per block k, saturating at +-max_E; the shares of elements it clips, zeroes, leaves subnormal."""
    xb = blocked(x, block)
    y = (xb * m.to(torch.float32)).reshape(x.shape)  # one float32 product per element: IEEE
    q = round_to(y, elem, saturate=True)
    # max |y| over block k is fl32(amax_k * m_k) (rounding is monotonic): no clamp if it is small.
    t, _ = overflow_threshold(elem)
    big = float((amax.to(torch.float32) * m.to(torch.float32)).max()) if x.numel() else 0.0
    saturated, underflowed, subnormal = count_shares(x.numpy(), y.numpy(), q.numpy(), elem,
                                                     big >= t)
    grid = [n // b for n, b in zip(x.shape, block, strict=True)]  # blocks along each dimension
    kept = d if stored is None else stored
    return Quantized(values=q, scales=kept.to(torch.float32).reshape(grid),
                     decode=d.to(torch.float64).reshape(grid), elem=elem.name,
                     scale_format=scale_format, block=tuple(block), saturated=saturated,
                     underflowed=underflowed, subnormal=subnormal,
                     tensor_scale=tensor_scale)
