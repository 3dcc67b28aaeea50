"""emulate.recipe_linear: the three quantized products of a linear layer.

Oracles: emulate.linear's own gradients (no quantizer: the same bits), the recipes called
directly (per operand, blocked along the axis asked for), the Hadamard matrix's exact
orthogonality in fractions, and stochastic rounding's two neighbours and unbiased mean.
"""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest
import torch

from precisionlab import emulate
from precisionlab.emulate.recipe_linear import (
    LinearRecipe,
    Operand,
    RecipeLinear,
    hadamard_16,
    random_hadamard,
)
from precisionlab.quantize import RECIPES, Recipe


def _data(seed=0, t=32, i=32, o=32):
    g = torch.Generator().manual_seed(seed)
    x = emulate.randn(t, i, generator=g)
    w = emulate.randn(o, i, generator=g) / 4
    dy = emulate.randn(t, o, generator=g)
    return x, w, dy


def test_hadamard_is_orthogonal_exactly():
    h = hadamard_16()
    hf = [[Fraction(float(v)) for v in row] for row in h]
    for a in range(16):
        for b in range(16):
            assert sum(hf[a][k] * hf[b][k] for k in range(16)) == (1 if a == b else 0)


def test_random_hadamard_keeps_the_weight_gradient_product():
    x, _, dy = _data()
    signs = torch.tensor([1, -1] * 8, dtype=torch.float64)
    rx, rdy = random_hadamard(x, signs), random_hadamard(dy, signs)
    want = dy.double().T @ x.double()
    got = rdy.double().T @ rx.double()
    assert torch.allclose(got, want, rtol=0, atol=1e-5)
    # each group of 16 rows: (H diag(s)) x_g, against float64
    h = hadamard_16() * signs[None, :]
    assert torch.allclose(rx[:16].double(), h @ x[:16].double(), rtol=0, atol=1e-6)
    with pytest.raises(ValueError, match="16 rows"):
        random_hadamard(x[:20], signs)


def test_no_quantizers_give_emulate_linears_bits():
    x, w, dy = _data(1)
    lay = RecipeLinear(w, LinearRecipe("float32"))
    xa = x.clone().requires_grad_(True)
    lay(xa).backward(dy)
    w2 = w.clone().requires_grad_(True)
    xb = x.clone().requires_grad_(True)
    emulate.linear(xb, w2, None, "float32").backward(dy)
    assert torch.equal(lay.weight.grad, w2.grad) and torch.equal(xa.grad, xb.grad)


def test_each_product_sees_its_operands_quantized_along_its_own_axis():
    x, w, dy = _data(2)
    mx = RECIPES["mxfp8"]
    r = LinearRecipe("mx", Operand(mx), Operand(mx), Operand(mx), Operand(mx, axis=0),
                     Operand(mx, axis=0), Operand(mx, axis=0))
    lay = RecipeLinear(w, r)
    xa = x.clone().requires_grad_(True)
    y = lay(xa)
    y.backward(dy)
    deq = lambda t: mx(t).dequantize().float()  # noqa: E731
    along0 = lambda t: mx(t.T.contiguous()).dequantize().float().T  # noqa: E731
    assert torch.equal(y, emulate.linear(deq(x), deq(w), None, "float32"))
    assert torch.equal(xa.grad, emulate.linear(deq(dy), along0(w).T.contiguous(), None,
                                               "float32"))
    assert torch.equal(lay.weight.grad, emulate.linear(along0(dy).T.contiguous(),
                                                       along0(x).T.contiguous(), None,
                                                       "float32"))


def test_a_2d_tile_is_one_quantized_weight_for_both_products():
    _, w, _ = _data(3)
    tile = Recipe("nv2d", "float4_e2m1fn", "two_level", (16, 16), "float8_e4m3fn")
    assert torch.equal(Operand(tile)(w), Operand(tile, axis=0)(w))
    assert not torch.equal(Operand(RECIPES["nvfp4"])(w), Operand(RECIPES["nvfp4"], axis=0)(w))


def test_stochastic_rounding_picks_a_neighbour_and_is_unbiased():
    x = torch.full((1, 16), 1.0)
    x[0, 1:] = 0.3  # amax 1 -> scale maps 1 to 6; 0.3 * 6 = 1.8 lies between 1.5 and 2
    op = Operand(RECIPES["nvfp4"], stochastic=True)
    near = Operand(RECIPES["nvfp4"])(x)
    gen = np.random.default_rng(0)
    draws = torch.stack([op(x, gen) for _ in range(400)])
    d = float(near[0, 0]) / 6  # the decode scale (x[0, 0] = 1 lands on 6 exactly)
    vals = set((draws[:, 0, 1:] / d).flatten().tolist())
    assert vals <= {1.5, 2.0}
    mean = float((draws[:, 0, 1:] / d).mean())
    assert abs(mean - 0.3 * 6) < 0.02
    with pytest.raises(ValueError, match="Generator"):
        op(x)
    with pytest.raises(ValueError, match="Recipe"):
        Operand("bfloat16", stochastic=True)


def _layer_run(compiled: bool):
    """y, dx and dW of a layer with bfloat16 casts and NVFP4 stochastic rounding, 8192-value operands."""
    x, w, dy = _data(5, t=128, i=64, o=64)
    nv = RECIPES["nvfp4"]
    r = LinearRecipe("mixed", Operand("bfloat16"), Operand(nv, stochastic=True),
                     Operand(nv, stochastic=True), Operand("bfloat16", axis=0),
                     Operand(nv, axis=0, stochastic=True), Operand("bfloat16", axis=0))
    lay = RecipeLinear(w, r, seed=3, compiled=compiled)
    xa = x.clone().requires_grad_(True)
    y = lay(xa)
    y.backward(dy)
    return y, xa.grad, lay.weight.grad


def test_a_layer_on_the_numpy_tier_gives_the_compiled_bits_and_builds_no_loop(monkeypatch):
    """compiled=False: the layer's own bfloat16 casts and stochastic roundings stay on NumPy's
    tier (the quantizers' nearest-even element roundings keep round_to's usual tiers)."""
    from precisionlab import rounding_kernel

    want = _layer_run(True)
    real = rounding_kernel.numba_into

    def refuse(a, src, dst, fmt, code, *rest):
        if code == rounding_kernel.STOCHASTIC or fmt.name == "bfloat16":
            raise AssertionError("compiled=False reached rounding's numba tier")
        return real(a, src, dst, fmt, code, *rest)

    monkeypatch.setattr(rounding_kernel, "numba_into", refuse)
    got = _layer_run(False)
    assert all(torch.equal(a, b) for a, b in zip(got, want, strict=True))
    with pytest.raises(AssertionError, match="numba tier"):
        _layer_run(True)  # the spy is live: the compiled run does reach it
    with pytest.raises(ValueError, match="compiled must be True or False; got compiled='no'"):
        RecipeLinear(torch.ones(2, 2), LinearRecipe("float32"), compiled="no")
