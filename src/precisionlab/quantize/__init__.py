"""Scaling at finer grain: 8-, 6- and 4-bit tensors with a scale per tensor, per block or both.

Every quantizer returns a `Quantized`: elements q in the element format (float32 storage),
the stored scales, the exact decode scale d per block (x ~ q * d; `dequantize()` multiplies
exactly in float64) and the shares of elements that saturated, underflowed to zero and
landed subnormal. Arithmetic is portable: one float32 product x * m per element, then
`round_to` (saturating): the same bits on every CPU and thread count; no Python loop runs
over elements or blocks. The layer sits above `formats`/`rounding` and below `emulate`,
whose `QuantizedLinear` feeds a matmul through these quantizers.

Files, one concept each (lowest first):

* `choices`: the element formats, scale formats, E8M0 exponent rules and their checks;
* `grid`: block shapes (an int along an axis, or a tile such as 1x128 or 128x128), the
  blocked view and the per-block amax (which refuses inf/NaN input);
* `scales`: the scale rules (float32 as Transformer Engine, E8M0 as OCP MX, E4M3);
* `shares`: counting saturated, underflowed and subnormal elements;
* `result`: `Quantized` and `encode` (x * m, rounded, counted);
* `blocks`: `quantize_blocks` and `quantize_per_tensor` (current scaling);
* `delayed`: `DelayedScaling`, the per-tensor scale from an amax history;
* `two_level`: `quantize_two_level`, NVFP4's E4M3 block scales under a float32 tensor scale;
* `recipes`: `Recipe` (a named setting, called on x) and the presets `RECIPES` / `recipe(name)`:
  fp8_tensor, fp8_tensor_e5m2, mxfp8, mxfp6, mxfp4, nvfp4, deepseek_act, deepseek_weight.
"""

from .blocks import quantize_blocks, quantize_per_tensor
from .choices import E8M0_RULES, ELEMENT_FORMATS, SCALE_FORMATS
from .delayed import AMAX_COMPUTE_ALGOS, DelayedScaling
from .recipes import GRAINS, RECIPES, Recipe, recipe
from .result import Quantized
from .two_level import quantize_two_level

__all__ = [
    "AMAX_COMPUTE_ALGOS",
    "E8M0_RULES",
    "ELEMENT_FORMATS",
    "GRAINS",
    "RECIPES",
    "SCALE_FORMATS",
    "DelayedScaling",
    "Quantized",
    "Recipe",
    "quantize_blocks",
    "quantize_per_tensor",
    "quantize_two_level",
    "recipe",
]
