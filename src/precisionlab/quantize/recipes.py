"""Recipes: a named quantizer setting (element format, grain, block, scale format) called on a tensor."""

from __future__ import annotations

import numbers
from dataclasses import dataclass, field

import torch

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
        if self.grain not in GRAINS:
            raise ValueError(f"unknown grain {self.grain!r}; valid choices: {', '.join(GRAINS)}")
        set_(self, "margin", check_margin(self.margin))
        check_rule(self.e8m0_rule)
        if isinstance(self.axis, bool) or not isinstance(self.axis, numbers.Integral):
            raise ValueError(f"axis must be an integer; got axis={self.axis!r}")
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
        """(b_0, ..., b_{d-1}): the block's size along each dimension of a tensor of `shape`, or ValueError saying why none fits."""
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
        """The quantized x under this recipe (quantize_per_tensor, quantize_blocks or quantize_two_level)."""
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
        """One line: name, element format, grain and block, scale format (and margin)."""
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


def recipe(name) -> Recipe:
    """The preset called name (a Recipe is returned as it is), else ValueError listing RECIPES."""
    if isinstance(name, Recipe):
        return name
    if isinstance(name, str) and name in RECIPES:
        return RECIPES[name]
    raise ValueError(f"unknown recipe {name!r}; valid choices: {', '.join(RECIPES)} "
                     f"(or a Recipe)")
