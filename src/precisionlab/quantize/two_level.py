"""Two-level scaling (NVFP4): an E4M3 scale per block under one float32 scale for the tensor."""

from __future__ import annotations

import torch

from ..formats import get_format
from ..rounding import round_to
from .choices import ELEMENT_FORMATS, check_format
from .grid import as_float32, block_amax, block_shape, blocked
from .result import Quantized, encode

__all__ = ["quantize_two_level"]

_F32_MAX = torch.finfo(torch.float32).max
_COMPILED_MIN_BLOCKS = 1 << 21  # block scales from which round_to may compile its loop


def quantize_two_level(x, elem="float4_e2m1fn", block=16, axis: int = -1) -> Quantized:
    """S = fl32(448 max_E / amax), b_k = fl_e4m3(amax_k S / max_E), q = fl_E(fl32(x fl32(S / b_k))), x ~ q b_k / S.

    The NVFP4 layout: 16-element blocks along `axis` (or a tile tuple, as in
    `quantize_blocks`), each with an E4M3 scale b_k, under a float32 tensor scale chosen so
    that the largest block scale is E4M3's max, 448. The decode scale of block k is
    b_k * g with g = fl32(1 / S) (stored as `tensor_scale`); dequantizing multiplies
    exactly in float64. S = 1 for an all-zero tensor, float32 max if 448 max_E / amax
    overflows; a block whose b_k rounds to 0 quantizes to 0. x must be finite.

    Parameters
    ----------
    x : torch.Tensor or numpy.ndarray or sequence
        Finite floating-point values (converted to a float32 tensor).
    elem : {"float4_e2m1fn", "float8_e4m3fn", "float8_e5m2", "float6_e3m2fn", "float6_e2m3fn"}, default "float4_e2m1fn"
        The element format (NVFP4: E2M1).
    block : int or tuple of int, default 16
        Elements along axis that share an E4M3 scale, or a tile; it must divide x's shape.
    axis : int, default -1
        The axis an int block runs along.

    Returns
    -------
    Quantized
        scales holds the E4M3 block scales b_k, tensor_scale the float32 g, decode b_k g.

    Raises
    ------
    ValueError
        If elem is unknown, block does not divide x's shape, axis is out of range, or x
        has inf/NaN entries.
    TypeError
        If x does not hold floating-point numbers.

    Examples
    --------
    >>> import torch
    >>> from precisionlab.quantize import quantize_two_level
    >>> x = torch.arange(1.0, 33.0).reshape(2, 16)
    >>> q = quantize_two_level(x)
    >>> q.scales.tolist()  # the larger block's scale is E4M3's max
    [[224.0], [448.0]]
    >>> g = torch.tensor(1 / 84, dtype=torch.float32)  # 1 / 84 = 32 / (448 * 6)
    >>> q.tensor_scale == float(g)
    True
    >>> q.values[1].tolist()
    [3.0, 3.0, 4.0, 4.0, 4.0, 4.0, 4.0, 4.0,
     4.0, 4.0, 6.0, 6.0, 6.0, 6.0, 6.0, 6.0]
    """
    e = check_format(elem, "elem", ELEMENT_FORMATS)
    e4m3 = get_format("float8_e4m3fn")
    x32 = as_float32(x)
    sizes = block_shape(tuple(x32.shape), block, axis)
    amax = block_amax(blocked(x32, sizes))
    top = torch.tensor(float(amax.max()) if amax.numel() else 0.0, dtype=torch.float32)
    s = torch.tensor(e4m3.max_finite * e.max_finite, dtype=torch.float32) / top
    s = torch.ones(()) if float(top) == 0 else torch.clamp(s, max=_F32_MAX)
    g = (1 / s).to(torch.float64)
    # amax_k * S is exact in float64 (24 + 24 bits); one rounding of it / max_E, then E4M3.
    # One scale per block: NumPy rounds them in well under the cold compile of a numba loop
    # (0.3-0.5 s, float64 words) until the blocks number millions; the same bits either way.
    b = round_to(amax * s.to(torch.float64) / e.max_finite, e4m3, saturate=True,
                 compiled=amax.numel() >= _COMPILED_MIN_BLOCKS)
    bf = b.to(torch.float32)
    m = torch.where(bf > 0, s / bf, torch.zeros((), dtype=torch.float32))
    return encode(x32, sizes, amax, m, b * g, e, "float8_e4m3fn", stored=bf,
                  tensor_scale=float(g))
