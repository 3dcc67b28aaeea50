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

    Parameters
    ----------
    x : torch.Tensor or numpy.ndarray or sequence
        Finite floating-point values (converted to a float32 tensor; float64 is rounded to
        nearest even once).
    elem : {"float8_e4m3fn", "float8_e5m2", "float6_e3m2fn", "float6_e2m3fn", "float4_e2m1fn"}, default "float8_e4m3fn"
        The element format (`ELEMENT_FORMATS`; aliases such as "e4m3" are accepted).
    block : int or tuple of int, default 32
        Consecutive elements along axis that share a scale, or one size per dimension
        (a tile); each size must divide x's size along its dimension.
    axis : int, default -1
        The axis an int block runs along (ignored for a tile).
    scale_format : {"float8_e8m0fnu", "float32", "float8_e4m3fn"}, default "float8_e8m0fnu"
        How each block's scale is chosen and stored (`SCALE_FORMATS`).
    e8m0_rule : {"floor", "ceil"}, default "floor"
        For E8M0 scales: OCP MX's floor(log2 amax) - emax_E, where the block's largest
        element may saturate, or the least exponent with nothing saturating.
    margin : int, default 0
        Headroom: every scale is multiplied by 2^margin.

    Returns
    -------
    Quantized
        The elements q (float32, x's shape), the stored scale and the decode scale per
        block, and the shares saturated, underflowed to zero and left subnormal.

    Raises
    ------
    ValueError
        If elem, scale_format or e8m0_rule is unknown, margin is not an integer, block
        does not divide x's shape (the message lists the sizes that do) or axis is out of
        range, or x has inf/NaN entries.
    TypeError
        If x does not hold floating-point numbers.

    Examples
    --------
    Two rows four orders of magnitude apart, MX FP8 style with a power-of-two scale per
    row of 4: each row is scaled into E4M3's range on its own (100 / 0.25 = 400 is a tie
    between E4M3's 384 and 416 and goes to the even 384).

    >>> import torch
    >>> from precisionlab.quantize import quantize_blocks
    >>> x = torch.tensor([[0.5, -1.0, 3.0, 100.0], [1e-3, 2e-3, -4e-3, 8e-3]])
    >>> q = quantize_blocks(x, "float8_e4m3fn", block=4)
    >>> q.scales.tolist()
    [[0.25], [3.0517578125e-05]]
    >>> q.values.tolist()
    [[2.0, -4.0, 12.0, 384.0], [32.0, 64.0, -128.0, 256.0]]
    >>> q.dequantize()[0].tolist()
    [0.5, -1.0, 3.0, 96.0]

    In FP4 (E2M1, largest value 6) the first row keeps only its largest entry:

    >>> q = quantize_blocks(x, "float4_e2m1fn", block=4)
    >>> q.values[0].tolist(), q.underflowed
    ([0.0, -0.0, 0.0, 6.0], 0.375)
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
    """Current scaling: one scale from this tensor's own amax, m = fl32(max_E / amax) / 2^margin (Transformer Engine).

    quantize_blocks with one block as large as x: the rules for elem, scale_format,
    e8m0_rule and margin are the same.

    Parameters
    ----------
    x : torch.Tensor or numpy.ndarray or sequence
        Finite floating-point values (converted to a float32 tensor).
    elem : {"float8_e4m3fn", "float8_e5m2", "float6_e3m2fn", "float6_e2m3fn", "float4_e2m1fn"}, default "float8_e4m3fn"
        The element format.
    scale_format : {"float32", "float8_e8m0fnu", "float8_e4m3fn"}, default "float32"
        The scale rule: Transformer Engine's float32 m = max_E / amax, a power of two
        (E8M0) or an E4M3 scale.
    e8m0_rule : {"floor", "ceil"}, default "floor"
        For E8M0 scales, as in quantize_blocks.
    margin : int, default 0
        Headroom: the scale is multiplied by 2^margin.

    Returns
    -------
    Quantized
        With one scale (scales has shape (1, ..., 1)).

    Raises
    ------
    ValueError
        If elem, scale_format or e8m0_rule is unknown, margin is not an integer, or x has
        inf/NaN entries.
    TypeError
        If x does not hold floating-point numbers.

    Examples
    --------
    One scale for both rows of quantize_blocks' example: the largest entry lands on
    E4M3's maximum, 448, and the small row's smallest entry is left subnormal.

    >>> import torch
    >>> from precisionlab.quantize import quantize_per_tensor
    >>> x = torch.tensor([[0.5, -1.0, 3.0, 100.0], [1e-3, 2e-3, -4e-3, 8e-3]])
    >>> q = quantize_per_tensor(x)
    >>> q.values[0].tolist()
    [2.25, -4.5, 13.0, 448.0]
    >>> q.shares
    {'saturated': 0.0, 'underflowed': 0.0, 'subnormal': 0.25}
    """
    x32 = torch.as_tensor(x)
    return quantize_blocks(x, elem, tuple(x32.shape), scale_format=scale_format,
                           e8m0_rule=e8m0_rule, margin=margin)
