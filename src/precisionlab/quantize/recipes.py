"""Recipes: a named quantizer setting (element format, grain, block, scale format) called on a tensor."""

from __future__ import annotations

import numbers
from dataclasses import dataclass, field

import torch

from ..checks import check_choice, check_integer
from .blocks import quantize_blocks, quantize_per_tensor
from .choices import (
    E8M0_RULES,
    ELEMENT_FORMATS,
    SCALE_FORMATS,
    check_format,
    check_margin,
    check_rule,
)
from .grid import block_shape
from .result import Quantized
from .two_level import quantize_two_level

__all__ = ["GRAINS", "RECIPES", "Recipe", "recipe"]

# tensor: one scale for the whole tensor (current scaling); block: one scale per block or
# tile; two_level: an E4M3 scale per block under one float32 scale per tensor (NVFP4).
GRAINS: tuple[str, ...] = ("tensor", "block", "two_level")


@dataclass(frozen=True)
class Recipe:
    """x -> Quantized: q = fl_elem(fl32(x m_k)) with one scale per tensor, per block, or per block under a tensor scale.

    block: None for grain "tensor"; an int (that many consecutive elements along `axis`) or
    a tile tuple such as (1, 128) or (128, 128). A tile shorter than x's rank covers x's last
    dimensions (leading sizes 1, as NumPy aligns shapes); a tile longer than x's rank may
    only have extra leading 1s. A block that does not divide x raises ValueError (no
    padding). Two-level recipes take scale_format "float8_e4m3fn" and margin 0 (NVFP4).

    Parameters
    ----------
    name : str
        A non-empty name (the key in reports such as `diagnose.gradients(recipe=...)`).
    elem : str
        The element format: "float8_e4m3fn", "float8_e5m2", "float6_e3m2fn",
        "float6_e2m3fn" or "float4_e2m1fn" (or an alias; stored by its registry name).
    grain : {"tensor", "block", "two_level"}
        One scale per tensor (current scaling), one per block or tile, or an E4M3 scale
        per block under a float32 tensor scale (`GRAINS`).
    block : int or tuple of int or None, default None
        None for grain "tensor"; else an int (elements along axis) or a tile tuple.
    scale_format : {"float32", "float8_e8m0fnu", "float8_e4m3fn"}, default "float32"
        The scale rule, as in `quantize_blocks`.
    axis : int, default -1
        The axis an int block runs along.
    margin : int, default 0
        Headroom: every scale is multiplied by 2^margin (0 for two_level).
    e8m0_rule : {"floor", "ceil"}, default "floor"
        For E8M0 scales, as in `quantize_blocks`.
    doc : str, default ""
        A sentence on where the recipe comes from (not compared).

    Raises
    ------
    ValueError
        If name is empty, elem, scale_format, grain or e8m0_rule is unknown, margin or axis
        is not an integer, block does not fit the grain (None for "tensor", sizes >= 1
        otherwise), or a two_level recipe has another scale format or a margin.

    Examples
    --------
    >>> import torch
    >>> from precisionlab.quantize import Recipe
    >>> mx16 = Recipe("mxfp4_16", "e2m1", "block", 16, "float8_e8m0fnu")
    >>> print(mx16.describe())
    mxfp4_16: float4_e2m1fn elements, 16-element blocks along axis -1,
    float8_e8m0fnu scales
    >>> mx16.block_sizes((4, 32))
    (1, 16)
    >>> q = mx16(torch.linspace(-1, 1, 32).reshape(2, 16))
    >>> q.scales.shape, q.elem
    (torch.Size([2, 1]), 'float4_e2m1fn')
    """

    name: str
    elem: str
    grain: str
    block: int | tuple[int, ...] | None = None
    scale_format: str = "float32"
    axis: int = -1
    margin: int = 0
    e8m0_rule: str = "floor"
    doc: str = field(default="", compare=False)

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"name must be a non-empty string; got name={self.name!r}")
        set_ = object.__setattr__  # frozen: store the canonical names once
        set_(self, "elem", check_format(self.elem, "elem", ELEMENT_FORMATS).name)
        set_(self, "scale_format",
             check_format(self.scale_format, "scale_format", SCALE_FORMATS).name)
        check_choice(self.grain, "grain", GRAINS)
        set_(self, "margin", check_margin(self.margin))
        check_rule(self.e8m0_rule)
        check_integer(self.axis, "axis")
        if self.grain == "tensor":
            if self.block is not None:
                raise ValueError(f"grain 'tensor' takes block=None (one scale for all of x); "
                                 f"got block={self.block!r}")
            return
        if isinstance(self.block, (tuple, list)):
            set_(self, "block", tuple(self.block))
            block_shape(self.block, self.block, -1)  # every size an integer >= 1
        else:
            block_shape((self.block,) if isinstance(self.block, numbers.Integral) else (1,),
                        self.block, -1)  # an integer >= 1, else the clear error
        if self.grain == "two_level" and (self.scale_format != "float8_e4m3fn" or self.margin):
            raise ValueError(f"grain 'two_level' stores E4M3 block scales under a float32 tensor "
                             f"scale: scale_format must be 'float8_e4m3fn' and margin 0; got "
                             f"scale_format={self.scale_format!r}, margin={self.margin!r}")

    def block_sizes(self, shape) -> tuple[int, ...]:
        """(b_0, ..., b_{d-1}): the block's size along each dimension of a tensor of `shape`, or ValueError saying why none fits.

        Parameters
        ----------
        shape : tuple of int
            A tensor's shape.

        Returns
        -------
        tuple of int
            One block size per dimension (the whole shape for grain "tensor").

        Raises
        ------
        ValueError
            If the block does not divide the shape (the message lists the sizes that do),
            or a tile does not fit its rank.

        Examples
        --------
        >>> from precisionlab.quantize import RECIPES
        >>> RECIPES["mxfp8"].block_sizes((4, 64))
        (1, 32)
        >>> RECIPES["deepseek_act"].block_sizes((8, 256))
        (1, 128)
        >>> RECIPES["mxfp8"].block_sizes((4, 30))
        Traceback (most recent call last):
        ...
        ValueError: block=32 does not divide x's size 30 along axis 1;
        valid block sizes along that axis: 1, 2, 3, 5, 6, 10, 15, 30
        """
        shape = tuple(int(n) for n in shape)
        if self.grain == "tensor":
            return shape
        block = self.block
        if isinstance(block, tuple):
            extra = len(block) - len(shape)
            if extra > 0 and all(b == 1 for b in block[:extra]):
                block = block[extra:]
            elif extra < 0:
                block = (1,) * -extra + block
        return block_shape(shape, block, self.axis)

    def __call__(self, x) -> Quantized:
        """The quantized x under this recipe (quantize_per_tensor, quantize_blocks or quantize_two_level).

        Parameters
        ----------
        x : torch.Tensor or numpy.ndarray or sequence
            Finite floating-point values whose shape the recipe's block divides.

        Returns
        -------
        Quantized
            The elements, scales and shares.

        Raises
        ------
        ValueError
            If the block does not divide x's shape, or x has inf/NaN entries.
        TypeError
            If x does not hold floating-point numbers.
        """
        if self.grain == "tensor":
            return quantize_per_tensor(x, self.elem, self.scale_format,
                                       e8m0_rule=self.e8m0_rule, margin=self.margin)
        block = self._block_for(x)
        if self.grain == "block":
            return quantize_blocks(x, self.elem, block, self.axis, self.scale_format,
                                   e8m0_rule=self.e8m0_rule, margin=self.margin)
        return quantize_two_level(x, self.elem, block, self.axis)

    def _block_for(self, x):
        """self.block, or a tile aligned to x's rank (an int block is passed on as it is)."""
        if not isinstance(self.block, tuple):
            return self.block
        shape = tuple(torch.as_tensor(x).shape)
        return self.block_sizes(shape) if len(shape) != len(self.block) else self.block

    def describe(self) -> str:
        """One line: name, element format, grain and block, scale format (and margin).

        Returns
        -------
        str
            The line, as report tables use it for their caption.
        """
        if self.grain == "tensor":
            grain = "one scale per tensor"
        else:
            size = ("x".join(str(b) for b in self.block) + " tiles"
                    if isinstance(self.block, tuple) else f"{self.block}-element blocks")
            grain = f"{size} along axis {self.axis}" if not isinstance(self.block, tuple) \
                else size
        scale = f"{self.scale_format} scales"
        if self.grain == "two_level":
            scale = f"{self.scale_format} block scales under a float32 tensor scale"
        extra = f", margin {self.margin}" if self.margin else ""
        extra += f", E8M0 rule {self.e8m0_rule}" if self.e8m0_rule != E8M0_RULES[0] else ""
        return f"{self.name}: {self.elem} elements, {grain}, {scale}{extra}"


RECIPES: dict[str, Recipe] = {r.name: r for r in (
    Recipe("fp8_tensor", "float8_e4m3fn", "tensor", None, "float32",
           doc="FP8 E4M3 with one float32 scale per tensor from its own amax "
               "(Transformer Engine's current scaling)."),
    Recipe("fp8_tensor_e5m2", "float8_e5m2", "tensor", None, "float32",
           doc="FP8 E5M2 (the gradient format) with one float32 scale per tensor, current "
               "scaling."),
    Recipe("mxfp8", "float8_e4m3fn", "block", 32, "float8_e8m0fnu",
           doc="OCP MX FP8: E4M3 elements, a power-of-two E8M0 scale per 32 elements."),
    Recipe("mxfp6", "float6_e2m3fn", "block", 32, "float8_e8m0fnu",
           doc="OCP MX FP6: E2M3 elements, a power-of-two E8M0 scale per 32 elements."),
    Recipe("mxfp4", "float4_e2m1fn", "block", 32, "float8_e8m0fnu",
           doc="OCP MX FP4: E2M1 elements, a power-of-two E8M0 scale per 32 elements."),
    Recipe("nvfp4", "float4_e2m1fn", "two_level", 16, "float8_e4m3fn",
           doc="NVFP4: E2M1 elements, an E4M3 scale per 16 elements under a float32 tensor "
               "scale."),
    Recipe("deepseek_act", "float8_e4m3fn", "block", (1, 128), "float32",
           doc="DeepSeek-V3 activations: E4M3 with a float32 scale per 1x128 tile (per token, "
               "per 128 channels)."),
    Recipe("deepseek_weight", "float8_e4m3fn", "block", (128, 128), "float32",
           doc="DeepSeek-V3 weights: E4M3 with a float32 scale per 128x128 block."),
)}
"""The preset recipes by name, each a Recipe whose `doc` says where it comes from.

fp8_tensor and fp8_tensor_e5m2 (one float32 scale per tensor, Transformer Engine's current
scaling), mxfp8, mxfp6 and mxfp4 (OCP MX: a power-of-two E8M0 scale per 32 elements),
nvfp4 (E2M1 with an E4M3 scale per 16 elements under a float32 tensor scale), deepseek_act
and deepseek_weight (E4M3 with a float32 scale per 1x128 tile and per 128x128 block).
`recipe(name)` looks one up (its examples list them); every name is accepted wherever a
recipe is, as in `diagnose.gradients(..., recipe="mxfp8")`.
"""


def recipe(name) -> Recipe:
    """The preset called name (a Recipe is returned as it is), else ValueError listing RECIPES.

    Parameters
    ----------
    name : str or Recipe
        A key of `RECIPES` ("fp8_tensor", "fp8_tensor_e5m2", "mxfp8", "mxfp6", "mxfp4",
        "nvfp4", "deepseek_act", "deepseek_weight"), or a Recipe.

    Returns
    -------
    Recipe
        The preset, or name itself when it is a Recipe.

    Raises
    ------
    ValueError
        If name is no preset; the message lists them.

    Examples
    --------
    >>> from precisionlab.quantize import RECIPES, recipe
    >>> list(RECIPES)
    ['fp8_tensor', 'fp8_tensor_e5m2', 'mxfp8', 'mxfp6', 'mxfp4', 'nvfp4',
     'deepseek_act', 'deepseek_weight']
    >>> mx = recipe("mxfp8")
    >>> mx is RECIPES["mxfp8"], mx.elem, mx.block, mx.scale_format
    (True, 'float8_e4m3fn', 32, 'float8_e8m0fnu')
    >>> print(RECIPES["deepseek_weight"].doc)
    DeepSeek-V3 weights: E4M3 with a float32 scale per 128x128 block.
    >>> print(recipe("nvfp4").describe())
    nvfp4: float4_e2m1fn elements, 16-element blocks along axis -1,
    float8_e4m3fn block scales under a float32 tensor scale
    >>> recipe("fp7")
    Traceback (most recent call last):
    ...
    ValueError: unknown recipe 'fp7'; valid choices: fp8_tensor,
    fp8_tensor_e5m2, mxfp8, mxfp6, mxfp4, nvfp4, deepseek_act, deepseek_weight
    (or a Recipe)
    """
    if isinstance(name, Recipe):
        return name
    if isinstance(name, str) and name in RECIPES:
        return RECIPES[name]
    raise ValueError(f"unknown recipe {name!r}; valid choices: {', '.join(RECIPES)} "
                     f"(or a Recipe)")
