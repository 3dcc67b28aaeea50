"""Chapter 9, the matrix product itself: FP8 accumulation and training with every product quantized.

* `fp8_operands` and `accumulation_errors`: random matrices quantized to E4M3 by a scale per
  tensor, multiplied by `gpu.tensorcore`'s Hopper FP8 model (14-bit accumulator, with and
  without promotion into float32 every N_c elements), against the exact product, for a range
  of inner dimensions K;
* `ThreeProductTask` and `train_three_products`: a small MLP learning a teacher's outputs
  with every layer's forward, input-gradient and weight-gradient products quantized by a
  recipe (`emulate.RecipeLinear`), the runs scripts/ch9_three_products.py stores and
  `load_three_products` reads back; `WGRAD_RECIPES`, the weight-gradient study: plain MXFP4
  and NVFP4 with the weight-gradient product's operands quantized or kept in BF16.

Every number is portable: normal samples by `emulate.randn`, roundings by `round_to`, the
block FMAs in exact float64 integer arithmetic, error norms by `math.fsum`.

Chapter code (`precisionlab.chapters`): imports `gpu`, `quantize` and `emulate`.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import numpy as np
import torch

from .. import emulate
from ..checks import check_choice, check_count
from ..emulate.recipe_linear import LinearRecipe, Operand, RecipeLinear
from ..gpu.arith import CONVERT_NUMPY_MAX
from ..gpu.tensorcore import tensor_core_matmul
from ..quantize import RECIPES, Recipe

__all__ = ["THREE_PRODUCT_RECIPES", "WGRAD_RECIPES", "AccumulationErrors", "ThreeProductRun",
           "ThreeProductTask", "accumulation_errors", "exact_fp8_matmul", "fp8_operands", "load_three_products",
           "train_three_products"]


@functools.lru_cache(maxsize=8)
def _normal_pair(m: int, k: int, n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """N(0, 1) matrices (m, k) and (k, n) in float32, drawn once per shape and seed.

    The signed and the |N(0, 1)| operands of one K share these draws, so a chapter that
    measures both draws them once. Callers must not write to them (fp8_operands does not).
    """
    gen = torch.Generator().manual_seed(seed)
    a = emulate.randn(m, k, generator=gen, dtype=torch.float64).to(torch.float32)
    b = emulate.randn(k, n, generator=gen, dtype=torch.float64).to(torch.float32)
    return a, b


def fp8_operands(m: int, k: int, n: int, *, seed: int = 0, recipe: str = "fp8_tensor",
                 positive: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """(A, B): N(0, 1) matrices (m, k) and (k, n) (|N(0, 1)| if positive) quantized by `recipe`: the E4M3 elements q the tensor cores multiply (float64)."""
    for v, name in ((m, "m"), (k, "k"), (n, "n")):
        check_count(v, name)
    a, b = _normal_pair(int(m), int(k), int(n), int(seed))
    if positive:
        a, b = a.abs(), b.abs()
    q = RECIPES[recipe]
    # A per-tensor scale multiplies the finished sum; the K reduction sees the elements alone.
    return (q(a).values.to(torch.float64).numpy(), q(b).values.to(torch.float64).numpy())


def exact_fp8_matmul(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """A·B exactly, for E4M3 element matrices of moderate size: float64, any summation order.

    Every E4M3 value is a multiple of 2^-9 (its smallest subnormal), so every product and
    every partial sum is an integer multiple of 2^-18; while the sums of |a_ik b_kj| stay
    below 2^35 those integers stay below 2^53, and float64 holds every partial sum exactly,
    whatever order (or BLAS kernel, with or without FMA) adds them. Both conditions are
    checked; any multiple of 2^-9 passes, since the bound keeps each product below 2^35 as
    well. The bound is summed in float64 too: exactly while below 2^35, and a sum of
    non-negative terms rounded to nearest cannot fall back below 2^35 once it reaches it.
    """
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    if a.ndim != 2 or b.ndim != 2 or a.shape[1] != b.shape[0]:
        raise ValueError(f"need matrices a (m, k) and b (k, n); got shapes {a.shape} and "
                         f"{b.shape}")
    grain = 2.0**-18  # E4M3's smallest subnormal, 2^-9, squared
    if not (np.isfinite(a).all() and np.isfinite(b).all()) or np.any(
            np.mod(a, 2.0**-9)) or np.any(np.mod(b, 2.0**-9)):
        raise ValueError("a and b must hold E4M3 values (multiples of 2^-9); quantize them "
                         "first, e.g. with fp8_operands")
    # torch's float64 product (under torch's thread setting; NumPy's BLAS threads can be
    # many times slower on a busy machine): exact in any order, as shown above.
    ta, tb = torch.from_numpy(a), torch.from_numpy(b)
    bound = ta.abs() @ tb.abs()
    if bound.numel() and float(bound.max()) >= 2.0**53 * grain:
        raise ValueError("the sums of |a_ik b_kj| reach 2^35: float64 no longer holds them "
                         "exactly; use smaller matrices")
    return (ta @ tb).numpy()


@dataclass(frozen=True)
class AccumulationErrors:
    """Per K: ||C - C*||_F / ||C*||_F and max |C - C*| / |C*| for each accumulation (key: promote_every or None)."""

    ks: tuple[int, ...]
    normwise: dict[int | None, np.ndarray]
    entrywise: dict[int | None, np.ndarray]


def _frobenius(x: np.ndarray) -> float:
    """sqrt(sum x^2) with the sum exact (math.fsum): the same bits on every machine."""
    return math.sqrt(math.fsum((x * x).ravel().tolist()))


def accumulation_errors(ks: Sequence[int], m: int = 16, n: int = 16, *, seed: int = 0,
                        promote: Sequence[int | None] = (None, 128),
                        model: str = "H100-FP8", positive: bool = False) -> AccumulationErrors:
    """For each K: fp8_operands(m, K, n) multiplied by the tensor-core model with each promote_every, against the exact product."""
    ks = tuple(check_count(k, "K") for k in ks)
    normwise = {p: [] for p in promote}
    entrywise = {p: [] for p in promote}
    for k in ks:
        a, b = fp8_operands(m, k, n, seed=seed, positive=positive)
        exact = exact_fp8_matmul(a, b)
        for p in promote:
            c = tensor_core_matmul(a, b, model=model, inputs="float8_e4m3fn",
                                   operands="exact", promote_every=p)
            err = c - exact
            normwise[p].append(_frobenius(err) / _frobenius(exact))
            with np.errstate(divide="ignore", invalid="ignore"):
                rel = np.where(exact != 0, np.abs(err) / np.abs(exact), np.where(err != 0, np.inf, 0))
            entrywise[p].append(float(rel.max()))
    return AccumulationErrors(ks, {p: np.array(v) for p, v in normwise.items()},
                              {p: np.array(v) for p, v in entrywise.items()})


# ------------------------------------------------------------------ all three products


def _recipes() -> dict[str, LinearRecipe]:
    """The recipes of the three-product runs: BF16, per-tensor FP8 HYBRID, MXFP8, NVFP4 and its ablations."""
    e4, e5 = RECIPES["fp8_tensor"], RECIPES["fp8_tensor_e5m2"]
    mx = Recipe("mxfp8_ceil", "float8_e4m3fn", "block", 32, "float8_e8m0fnu", e8m0_rule="ceil")
    nv = RECIPES["nvfp4"]  # 1x16 blocks along the axis given
    m4 = RECIPES["mxfp4"]  # E2M1, an E8M0 scale per 32 (the OCP rule)
    nv2d = Recipe("nvfp4_16x16", "float4_e2m1fn", "two_level", (16, 16), "float8_e4m3fn")
    bf = Operand("bfloat16")

    def nvfp4(name, *, rht=True, sr=True, two_d=True):
        w = Operand(nv2d) if two_d else Operand(nv)
        return LinearRecipe(name, x=Operand(nv), w=w, dgrad_dy=Operand(nv, stochastic=sr),
                            dgrad_w=Operand(nv2d) if two_d else Operand(nv, axis=0),
                            wgrad_dy=Operand(nv, axis=0, stochastic=sr),
                            wgrad_x=Operand(nv, axis=0), hadamard=rht)

    return {
        "bf16": LinearRecipe("bf16", bf, bf, bf, bf, bf, bf),
        "fp8_hybrid": LinearRecipe("fp8_hybrid", Operand(e4), Operand(e4), Operand(e5),
                                   Operand(e4), Operand(e5), Operand(e4)),
        "mxfp8": LinearRecipe("mxfp8", Operand(mx), Operand(mx), Operand(mx),
                              Operand(mx, axis=0), Operand(mx, axis=0), Operand(mx, axis=0)),
        "nvfp4": nvfp4("nvfp4"),
        "nvfp4, no Hadamard": nvfp4("nvfp4, no Hadamard", rht=False),
        "nvfp4, no stochastic rounding": nvfp4("nvfp4, no stochastic rounding", sr=False),
        "nvfp4, 1x16 weight blocks": nvfp4("nvfp4, 1x16 weight blocks", two_d=False),
        # The plain OCP MXFP4 of the weight-gradient study: E2M1, 32-element E8M0 blocks
        # along each product's reduction axis, nearest rounding, no transform.
        "mxfp4": LinearRecipe("mxfp4", Operand(m4), Operand(m4), Operand(m4),
                              Operand(m4, axis=0), Operand(m4, axis=0), Operand(m4, axis=0)),
    }


THREE_PRODUCT_RECIPES: tuple[str, ...] = (
    "bf16", "fp8_hybrid", "mxfp8", "nvfp4", "nvfp4, no Hadamard",
    "nvfp4, no stochastic rounding", "nvfp4, 1x16 weight blocks", "nvfp4, last layer bf16")

# The weight-gradient study: a 4-bit recipe with its weight-gradient product's two operands
# quantized (the recipe itself) or kept in BF16 (", wgrad bf16": forward and input-gradient
# products as the recipe has them, dW = dy^T x from BF16 operands, no Hadamard transform).
WGRAD_RECIPES: tuple[str, ...] = ("mxfp4", "mxfp4, wgrad bf16", "nvfp4, wgrad bf16")

_WGRAD_BF16 = ", wgrad bf16"


def _recipe(name: str) -> LinearRecipe:
    """The LinearRecipe of every layer of run `name` (the last layer of "nvfp4, last layer bf16" apart)."""
    table = _recipes()
    if name == "nvfp4, last layer bf16":
        return table["nvfp4"]
    if name.endswith(_WGRAD_BF16):
        bf = Operand("bfloat16")
        return dataclasses.replace(table[name.removesuffix(_WGRAD_BF16)], name=name,
                                   wgrad_dy=bf, wgrad_x=bf, hadamard=False)
    return table[name]


@dataclass(frozen=True)
class ThreeProductTask:
    """A teacher MLP's outputs to learn: inputs (tokens, widths[0]) with a few outlier channels, targets (tokens, widths[-1])."""

    widths: tuple[int, ...] = (64, 128, 128, 32)
    tokens: int = 1024
    batch: int = 128
    outlier: float = 20.0
    outlier_channels: tuple[int, ...] = (5, 40)
    seed: int = 0

    def data(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(x, y): x ~ N(0, 1) with the outlier channels scaled, y = teacher(x), float32 (emulated)."""
        gen = torch.Generator().manual_seed(self.seed)
        x = emulate.randn(self.tokens, self.widths[0], generator=gen, dtype=torch.float64)
        x[:, list(self.outlier_channels)] *= self.outlier
        x = x.to(torch.float32)
        h = x
        for i, w in enumerate(_init(self.widths, self.seed + 1000)):
            h = emulate.linear(h, w, None, "float32")
            if i < len(self.widths) - 2:
                h = emulate.gelu(h, "float32")
        return x, h.detach()


def _init(widths: Sequence[int], seed: int) -> list[torch.Tensor]:
    """W_l ~ N(0, 1 / fan_in), float32, one per layer."""
    gen = torch.Generator().manual_seed(int(seed))
    return [(emulate.randn(o, i, generator=gen, dtype=torch.float64) / math.sqrt(i)).to(
        torch.float32) for i, o in itertools.pairwise(widths)]


class ThreeProductRun(NamedTuple):
    """One run: the training loss per step (mean over the batch, relative to mean(y^2))."""

    recipe: str
    losses: np.ndarray


def train_three_products(task: ThreeProductTask, recipe: str, steps: int = 400, *,
                         lr: float = 3e-3) -> ThreeProductRun:
    """Adam on the student MLP, every linear layer's three products quantized by `recipe` (one of THREE_PRODUCT_RECIPES or WGRAD_RECIPES)."""
    check_choice(recipe, "recipe", THREE_PRODUCT_RECIPES + WGRAD_RECIPES)
    x, y = task.data()
    n_layers = len(task.widths) - 1
    per_layer = [_recipe(recipe)] * n_layers
    if recipe == "nvfp4, last layer bf16":
        per_layer[-1] = _recipe("bf16")
    # Each step rounds each layer's six operands once: a short run (a replay of a few steps)
    # stays on rounding's NumPy tier rather than pay for cold compiles (the same bits).
    work = int(steps) * sum(2 * (task.batch * (a + b) + a * b)
                            for a, b in itertools.pairwise(task.widths))
    layers = [RecipeLinear(w, r, seed=task.seed * 100 + i, compiled=work > CONVERT_NUMPY_MAX)
              for i, (w, r) in enumerate(zip(_init(task.widths, task.seed), per_layer,
                                             strict=True))]
    opt = emulate.Adam([p for lay in layers for p in lay.parameters()], lr=lr)
    y0 = float(emulate.fixed_sum((y.double() ** 2).reshape(-1))) / y.numel()
    losses = []
    per_epoch = task.tokens // task.batch
    for step in range(int(steps)):
        b = step % per_epoch
        xb, yb = x[b * task.batch:(b + 1) * task.batch], y[b * task.batch:(b + 1) * task.batch]
        opt.zero_grad()
        h = xb
        for i, lay in enumerate(layers):
            h = lay(h)
            if i < n_layers - 1:
                h = emulate.gelu(h, "float32")
        loss = emulate.mse_loss(h, yb, "float32")
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()) / y0)
    return ThreeProductRun(recipe, np.array(losses))


def load_three_products(path) -> tuple[ThreeProductTask, float, dict[str, np.ndarray]]:
    """(task, lr, recipe -> losses per step) from the .json (and its .npz) scripts/ch9_three_products.py writes."""
    path = Path(path)
    doc = json.loads(path.read_text())
    task = ThreeProductTask(**{k: tuple(v) if isinstance(v, list) else v
                               for k, v in doc["task"].items()})
    with np.load(path.parent / doc["arrays"]) as z:
        runs = {name: np.array(z[f"run{i}"], dtype=np.float64)
                for i, name in enumerate(doc["runs"])}
    return task, float(doc["lr"]), runs
