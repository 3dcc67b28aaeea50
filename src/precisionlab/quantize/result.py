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
    """x ~ values * decode per block; shares of x's elements: saturated (x m rounds past max_E), underflowed (x != 0, q = 0), subnormal q.

    Every quantizer returns one; it is plain data (a frozen dataclass).

    Attributes
    ----------
    values : torch.Tensor
        q: float32, x's shape, every entry a value of elem.
    scales : torch.Tensor
        The stored scale per block (float32 values of scale_format), shape
        (n_0/b_0, n_1/b_1, ...).
    decode : torch.Tensor
        float64, the same shape: what q is multiplied by (scales times tensor_scale for
        two-level scaling, else scales).
    elem : str
        The element format's registry name.
    scale_format : str
        The scale format's registry name.
    block : tuple of int
        The block's size along each dimension of x.
    saturated : float
        Share of x's elements whose scaled value rounds past the element format's largest
        value (clipped there).
    underflowed : float
        Share of x's elements that are nonzero but quantize to zero.
    subnormal : float
        Share of x's elements whose q is subnormal.
    tensor_scale : float or None
        The second level's float32 scale g (two-level scaling only).

    Examples
    --------
    >>> import torch
    >>> from precisionlab.quantize import quantize_blocks
    >>> q = quantize_blocks(torch.tensor([[0.5, -1.0, 3.0, 100.0]]), block=4)
    >>> q.elem, q.scale_format, q.block, q.decode.tolist()
    ('float8_e4m3fn', 'float8_e8m0fnu', (1, 4), [[0.25]])
    >>> q.dequantize().tolist()  # float64, exact: 100 came back as 96
    [[0.5, -1.0, 3.0, 96.0]]
    """

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
        """q * d per block in float64: exact, since q has <= 4 and d <= 28 significant bits.

        Returns
        -------
        torch.Tensor
            float64, x's shape.
        """
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
