"""Per-block scaling: one scale per block along an axis (MX: 32 elements, E8M0) or per tile (1x128, 128x128)."""

from __future__ import annotations

import torch

from .choices import ELEMENT_FORMATS, SCALE_FORMATS, check_format, check_margin, check_rule
from .grid import as_float32, block_amax, block_shape, blocked
from .result import Quantized, encode
from .scales import scale_for

__all__ = ["quantize_blocks", "quantize_per_tensor"]


def quantize_blocks(x, elem="float8_e4m3fn", block=32, axis: int = -1,
                    scale_format="float8_e8m0fnu", *, e8m0_rule: str = "floor",
                    margin: int = 0) -> Quantized:
    """q = fl_E(fl32(x m_k)), x ~ q d_k, with (m_k, d_k) from block k's amax by the scale_format's rule.

    block: an int (that many consecutive elements along `axis`: 32 for MX, 16 for NVFP4's
    blocks, 128 for DeepSeek-V3's 1x128 activation tiles) or a tuple with one size per
    dimension (a tile: (1, 128) or (128, 128) for a matrix); it must divide x's shape.
    scale_format: float8_e8m0fnu, d = 2^k with k = floor(log2 amax) - emax_E (OCP MX v1.0;
    e8m0_rule="ceil": the least k with amax <= max_E 2^k, so nothing saturates), |k| <= 127;
    float32, Transformer Engine's m = fl32(max_E / amax) and d = fl32(1 / m); float8_e4m3fn,
    d = fl_e4m3(amax / max_E), m = fl32(1 / d). margin: 2^margin of headroom (d times 2^margin).
    Elements saturate at +-max_E, as every recipe clips; an all-zero block gets m = 1 (float32),
    k = -127 (e8m0) or d = 0 (e4m3), and its elements stay 0. x must be finite: an inf/NaN
    entry has no finite amax and raises ValueError.
    """
    e = check_format(elem, "elem", ELEMENT_FORMATS)
    sf = check_format(scale_format, "scale_format", SCALE_FORMATS)
    rule, margin = check_rule(e8m0_rule), check_margin(margin)
    x32 = as_float32(x)
    sizes = block_shape(tuple(x32.shape), block, axis)
    amax = block_amax(blocked(x32, sizes))
    m, d = scale_for(amax, e, sf, margin, rule)
    return encode(x32, sizes, amax, m, d, e, sf.name)


def quantize_per_tensor(x, elem="float8_e4m3fn", scale_format="float32", *,
                        e8m0_rule: str = "floor", margin: int = 0) -> Quantized:
    """Current scaling: one scale from this tensor's own amax, m = fl32(max_E / amax) / 2^margin (Transformer Engine)."""
    x32 = torch.as_tensor(x)
    return quantize_blocks(x, elem, tuple(x32.shape), scale_format=scale_format,
                           e8m0_rule=e8m0_rule, margin=margin)
