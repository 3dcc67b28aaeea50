"""A linear layer with all three matrix products quantized by a training recipe.

y = x W^T has three products, and a low-precision recipe quantizes both operands of each,
blocked along that product's own reduction axis:

* forward, y = x^ W^^T: x along its channels, W along its inputs;
* input gradient, dx = dy^ W^: dy along the outputs, W along the outputs;
* weight gradient, dW = dy^T x: dy and x along the tokens (optionally after a random
  Hadamard transform of both along the tokens, 16 at a time, which leaves the exact product
  unchanged: R^T R = I).

Each operand's quantizer is an `Operand`: a `quantize.Recipe` (or "bfloat16", a plain cast,
or None for float32), an axis for its blocks, and nearest or stochastic rounding of the
elements. A 2D tile recipe (NVFP4's 16x16 weight blocks) is the same whichever axis a product
sums over, so the forward and backward products see one quantized weight. The products run in
`linear`'s portable fixed-order float32 kernel; stochastic rounding draws from a NumPy
generator seeded per layer and consumed in call order, and the Hadamard's 16 random signs are
drawn once per layer (from the generator of seed + 1) and kept for the whole run, so a run is
the same on every machine.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np
import torch

from ..quantize import Recipe
from ..rounding import round_to
from .products import linear
from .summation import fixed_sum

__all__ = ["LinearRecipe", "Operand", "RecipeLinear", "hadamard_16", "random_hadamard"]


def hadamard_16() -> torch.Tensor:
    """H / 4 for the 16x16 Sylvester Hadamard matrix H (entries +-1): orthogonal, float64."""
    h = torch.ones(1, 1, dtype=torch.float64)
    for _ in range(4):
        h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)], 0)
    return h / 4


def random_hadamard(t: torch.Tensor, signs: torch.Tensor) -> torch.Tensor:
    """R t along dim 0 in groups of 16: (R t)_g = H diag(signs) t_g, summed in a fixed order, fl32 once."""
    n = t.shape[0]
    if n % 16:
        raise ValueError(f"the random Hadamard transform mixes 16 rows at a time; got {n} rows")
    h = hadamard_16() * signs.to(torch.float64)[None, :]  # H diag(s): entries +-1/4
    g = t.detach().to(torch.float64).reshape(n // 16, 1, 16, *t.shape[1:])
    hb = h.reshape(1, 16, 16, *([1] * (t.dim() - 1)))
    # Each term +-t/4 is exact; the 16 of a row add in one fixed (pairwise) order.
    return fixed_sum(hb * g, 2).reshape(t.shape).to(torch.float32)


@dataclass(frozen=True)
class Operand:
    """How one operand of one product is quantized: q = recipe(t), blocks along `axis`; stochastic rounds the elements stochastically."""

    recipe: Recipe | str | None = None  # a Recipe, "bfloat16" (a cast), or None (float32)
    axis: int = -1  # the axis an int block runs along (a tile ignores it)
    stochastic: bool = False

    def __post_init__(self) -> None:
        if not (self.recipe is None or self.recipe == "bfloat16" or isinstance(self.recipe, Recipe)):
            raise ValueError(f"recipe must be a quantize.Recipe, 'bfloat16' or None; "
                             f"got {self.recipe!r}")
        if self.stochastic and not isinstance(self.recipe, Recipe):
            raise ValueError("stochastic rounding needs a Recipe (its element format); "
                             f"got recipe={self.recipe!r}")

    def __call__(self, t: torch.Tensor, generator: np.random.Generator | None = None,
                 compiled: bool = True) -> torch.Tensor:
        """fl32 of the dequantized operand: q d per block (float32), t itself for None
        (compiled=False: the bfloat16 cast and the stochastic rounding on rounding's NumPy
        tier)."""
        t = t.detach().to(torch.float32)
        if self.recipe is None:
            return t
        if self.recipe == "bfloat16":
            return round_to(t, "bfloat16", compiled=compiled)
        moved = isinstance(self.recipe.block, int) and self.axis % t.dim() != t.dim() - 1
        src = t.movedim(self.axis, -1).contiguous() if moved else t
        q = self.recipe(src)
        if self.stochastic:
            if generator is None:
                raise ValueError("stochastic rounding draws from a stream: pass a "
                                 "np.random.Generator")
            d = dataclasses.replace(q, values=torch.ones_like(q.values)).dequantize()
            m = torch.where(d > 0, 1 / d, torch.zeros_like(d)).to(torch.float32)
            y = src * m  # one float32 product per element, as the nearest path does
            v = round_to(y, self.recipe.elem, "stochastic", generator, saturate=True,
                         compiled=compiled)
            q = dataclasses.replace(q, values=torch.as_tensor(v, dtype=torch.float32))
        out = q.dequantize().to(torch.float32)
        return out.movedim(-1, self.axis).contiguous() if moved else out


@dataclass(frozen=True)
class LinearRecipe:
    """The six operand quantizers of y = x W^T's three products, and the weight-gradient Hadamard transform."""

    name: str
    x: Operand = Operand()  # forward: x, blocks along the channels
    w: Operand = Operand()  # forward: W (out, in), along the inputs
    dgrad_dy: Operand = Operand()  # dx = dy W: dy along the outputs
    dgrad_w: Operand = Operand(axis=0)  # ... and W along the outputs
    wgrad_dy: Operand = Operand(axis=0)  # dW = dy^T x: dy along the tokens
    wgrad_x: Operand = Operand(axis=0)  # ... and x along the tokens
    hadamard: bool = False  # R = blockdiag(H diag(s)) over 16 tokens on both wgrad inputs
    doc: str = dataclasses.field(default="", compare=False)


class _RecipeLinearFn(torch.autograd.Function):
    """y = x^ W^^T; dx = dy^ W^ and dW = (R dy)^^T (R x)^, each operand quantized for its product."""

    @staticmethod
    def forward(ctx, x, w, recipe, gen, signs, compiled):
        ctx.save_for_backward(x.detach(), w.detach())
        ctx.recipe, ctx.gen, ctx.signs, ctx.compiled = recipe, gen, signs, compiled
        with torch.no_grad():
            return linear(recipe.x(x, gen, compiled), recipe.w(w, gen, compiled), None,
                          "float32")

    @staticmethod
    def backward(ctx, dy):
        x, w = ctx.saved_tensors
        r, gen, c = ctx.recipe, ctx.gen, ctx.compiled
        with torch.no_grad():
            dx = linear(r.dgrad_dy(dy, gen, c), r.dgrad_w(w, gen, c).T.contiguous(), None,
                        "float32")
            xt, dyt = x, dy.detach().to(torch.float32)
            if r.hadamard:
                xt, dyt = random_hadamard(xt, ctx.signs), random_hadamard(dyt, ctx.signs)
            dw = linear(r.wgrad_dy(dyt, gen, c).T.contiguous(),
                        r.wgrad_x(xt, gen, c).T.contiguous(), None, "float32")
        return dx, dw, None, None, None, None


class RecipeLinear(torch.nn.Module):
    """y = x W^T (no bias) with its three products quantized by a LinearRecipe; float32 master weight.

    compiled=False keeps the layer's bfloat16 casts and stochastic roundings on rounding's
    NumPy tier, for a run too short to pay back their cold numba compiles (the same bits
    either way; the recipes' own nearest-even element roundings keep round_to's usual tiers).
    """

    def __init__(self, weight: torch.Tensor, recipe: LinearRecipe, *, seed: int = 0,
                 compiled: bool = True):
        super().__init__()
        if not isinstance(compiled, bool):
            raise ValueError(f"compiled must be True or False; got compiled={compiled!r}")
        self.compiled = compiled
        self.weight = torch.nn.Parameter(weight.detach().to(torch.float32).clone())
        self.recipe = recipe
        self.generator = np.random.default_rng(int(seed))  # stochastic rounding, in call order
        signs = np.random.default_rng(int(seed) + 1).integers(0, 2, 16) * 2 - 1
        self.signs = torch.as_tensor(signs, dtype=torch.float64)  # the Hadamard's sign vector

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x W^T through the recipe's quantizers (x: (tokens, in), tokens a multiple of 16 for the Hadamard)."""
        return _RecipeLinearFn.apply(x, self.weight, self.recipe, self.generator, self.signs,
                                     self.compiled)
