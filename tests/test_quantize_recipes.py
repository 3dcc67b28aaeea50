"""Recipes against an independent oracle: every preset recomputed block by block with NumPy
float32 products, ml_dtypes casts of the scaled tensor and exact fractions for the E4M3 block
scale, compared bit for bit, including all-zero blocks, ties and saturating values.

The reference never calls precisionlab: block sizes, scales (float32 division, frexp
exponents, a nearest search over E4M3's values), roundings (ml_dtypes casts after a clip) and
shares (an unbounded-exponent rounding with Python's half-even round) are written out here.
"""

from __future__ import annotations

import functools
import itertools
import math
from fractions import Fraction

import ml_dtypes
import numpy as np
import pytest
import torch

from precisionlab.quantize import (
    GRAINS,
    RECIPES,
    Recipe,
    quantize_blocks,
    quantize_per_tensor,
    quantize_two_level,
    recipe,
)

# (element format, grain, block, scale format) as the presets are published: OCP MX v1.0,
# NVFP4, DeepSeek-V3's tiles, Transformer Engine's current scaling.
FACTS = {
    "fp8_tensor": ("float8_e4m3fn", "tensor", None, "float32"),
    "fp8_tensor_e5m2": ("float8_e5m2", "tensor", None, "float32"),
    "mxfp8": ("float8_e4m3fn", "block", 32, "float8_e8m0fnu"),
    "mxfp6": ("float6_e2m3fn", "block", 32, "float8_e8m0fnu"),
    "mxfp4": ("float4_e2m1fn", "block", 32, "float8_e8m0fnu"),
    "nvfp4": ("float4_e2m1fn", "two_level", 16, "float8_e4m3fn"),
    "deepseek_act": ("float8_e4m3fn", "block", (1, 128), "float32"),
    "deepseek_weight": ("float8_e4m3fn", "block", (128, 128), "float32"),
}


def ml(name: str):
    return getattr(ml_dtypes, name)


@functools.cache
def e4m3_values() -> list[tuple[Fraction, int]]:
    """Every finite nonnegative E4M3 value with its bit pattern, sorted."""
    codes = np.arange(128, dtype=np.uint8)
    vals = codes.view(ml_dtypes.float8_e4m3fn).astype(np.float64)
    return sorted((Fraction(float(v)), int(c)) for v, c in zip(vals, codes, strict=True)
                  if np.isfinite(v))


def e4m3_nearest(v: Fraction) -> Fraction:
    """v >= 0 rounded to nearest E4M3 (ties to the even pattern), saturating at 448."""
    table = e4m3_values()
    if v >= table[-1][0]:
        return table[-1][0]
    hi = next(i for i, (t, _) in enumerate(table) if t >= v)
    (a, ca), (b, _) = table[hi - 1], table[hi]
    if v == b:
        return b
    if v - a != b - v:
        return a if v - a < b - v else b
    return a if ca % 2 == 0 else b


def tile_of(name: str, shape: tuple[int, ...]) -> tuple[int, ...]:
    """The block sizes of a preset on a matrix of `shape`, from FACTS alone."""
    _, grain, block, _ = FACTS[name]
    if grain == "tensor":
        return shape
    if isinstance(block, tuple):
        return block
    return (1, block)


def unbounded_round(y: np.ndarray, name: str) -> np.ndarray:
    """y rounded to the format's precision with no exponent limit (half-even), for |y| >= min normal."""
    p = int(ml_dtypes.finfo(ml(name)).nmant) + 1
    m, e = np.frexp(y.astype(np.float64))
    return np.ldexp(np.round(np.ldexp(m, p)), e - p)


def reference(x: np.ndarray, name: str) -> dict:
    """q, decode and stored scale per block, and the three shares, for preset `name`."""
    elem, grain, _, scale_format = FACTS[name]
    fi = ml_dtypes.finfo(ml(elem))
    top, emax = float(fi.max), math.floor(math.log2(float(fi.max)))
    sizes = tile_of(name, x.shape)
    grid = [n // b for n, b in zip(x.shape, sizes, strict=True)]
    q = np.zeros(x.shape, np.float32)
    y_all = np.zeros(x.shape, np.float32)
    decode = np.zeros(grid, np.float64)
    stored = np.zeros(grid, np.float32)
    s = None
    if grain == "two_level":
        a_all = float(np.max(np.abs(x)))
        s = np.float32(448 * top) / np.float32(a_all) if a_all else np.float32(1)
        g = float(np.float32(1) / s)
    for idx in itertools.product(*(range(n) for n in grid)):
        sl = tuple(slice(i * b, (i + 1) * b) for i, b in zip(idx, sizes, strict=True))
        xb = x[sl]
        amax = float(np.max(np.abs(xb)))
        if grain == "two_level":
            b = e4m3_nearest(Fraction(amax) * Fraction(float(s)) / Fraction(top))
            m = s / np.float32(float(b)) if b else np.float32(0)
            stored[idx], decode[idx] = float(b), float(b) * g
        elif scale_format == "float32":
            with np.errstate(over="ignore"):
                m = np.float32(top) / np.float32(amax) if amax else np.float32(1)
            # Transformer Engine: a scale past float32's range becomes float32's max
            m = min(m, np.float32(np.finfo(np.float32).max))
            stored[idx] = decode[idx] = float(np.float32(1) / m)
        else:  # E8M0: k = floor(log2 amax) - emax_E in E8M0's range 2^-127..2^127,
            k = math.frexp(amax)[1] - 1 - emax if amax else -127  # -127 for all-zero blocks
            k = min(max(k, -127), 127)
            m = np.float32(2.0**-k)
            stored[idx] = decode[idx] = 2.0**k
        y = (xb * m).astype(np.float32)
        y_all[sl] = y
        q[sl] = np.clip(y, -top, top).astype(ml(elem)).astype(np.float32)
    n = x.size
    big = np.abs(y_all) >= top
    saturated = int(np.count_nonzero(np.abs(unbounded_round(y_all[big], elem)) > top))
    underflowed = int(np.count_nonzero((x != 0) & (q == 0)))
    subnormal = int(np.count_nonzero((q != 0) & (np.abs(q) < float(fi.smallest_normal))))
    return {"q": q, "decode": decode, "stored": stored, "saturated": saturated / n,
            "underflowed": underflowed / n, "subnormal": subnormal / n,
            "tensor_scale": None if s is None else g}


def hard_matrix(seed: int = 0) -> np.ndarray:
    """256 x 256 float32: magnitudes spread over 2^-30..2^10 per 16-block, zero blocks, ties, saturating maxima."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((256, 256)).astype(np.float32)
    spread = 2.0 ** rng.integers(-30, 11, size=(256, 16))
    x = (x * np.repeat(spread, 16, axis=1)).astype(np.float32)
    x[128:, :128] = 0  # a 128 x 128 tile, and every smaller block inside it, all zero
    x[3, 32:64] = 0  # one all-zero 32-block
    x[4, :16] = 0
    # mantissas 1.75, 1.875, 1.9375 at the top of a block: the E8M0 floor rule saturates them
    for r, mant in ((5, 1.75), (6, 1.875), (7, 1.9375)):
        x[r, 64:96] = rng.uniform(-1, 1, 32).astype(np.float32)
        x[r, 64] = mant * 2.0**3
        x[r, 65] = -mant * 2.0**3
    # ties: exact midpoints between E2M1 / E4M3 neighbours once a power-of-two scale applies
    x[8, 96:128] = np.array([1.25, 0.75, 2.5, 3.5, 5.0, 1.0625, 1.1875, 6.0] * 4, np.float32)
    x[9, :] = 2.0**-140  # subnormal float32 inputs
    x[9, 0] = 1.0
    return x


@pytest.mark.parametrize("name", list(FACTS))
def test_presets_are_the_published_settings(name):
    r = recipe(name)
    assert (r.elem, r.grain, r.block, r.scale_format) == FACTS[name]
    assert r is RECIPES[name] and r.name == name and r.axis == -1 and r.margin == 0
    assert r.doc and "\n" not in r.doc
    line = r.describe()
    assert "\n" not in line and line.startswith(name + ":") and r.elem in line


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("name", list(FACTS))
def test_every_preset_matches_the_block_by_block_reference(name, seed):
    x = hard_matrix(seed)
    got = recipe(name)(torch.from_numpy(x))
    ref = reference(x, name)
    assert got.values.dtype == torch.float32
    np.testing.assert_array_equal(got.values.numpy().view(np.uint32), ref["q"].view(np.uint32))
    np.testing.assert_array_equal(got.decode.numpy(), ref["decode"])
    np.testing.assert_array_equal(got.scales.numpy(), ref["stored"])
    assert (got.saturated, got.underflowed, got.subnormal) == (
        ref["saturated"], ref["underflowed"], ref["subnormal"])
    assert got.tensor_scale == ref["tensor_scale"]
    assert got.elem == FACTS[name][0] and got.block == tile_of(name, x.shape)


def test_the_hard_matrix_exercises_saturation_underflow_and_zero_blocks():
    """The oracle's cases are not empty: MX floor saturates, FP4 underflows, zero blocks exist."""
    x = hard_matrix(0)
    assert reference(x, "mxfp8")["saturated"] > 0
    assert reference(x, "mxfp4")["saturated"] > 0
    assert reference(x, "mxfp4")["underflowed"] > 0
    assert reference(x, "fp8_tensor")["underflowed"] > 0
    assert reference(x, "nvfp4")["subnormal"] > 0
    assert (reference(x, "deepseek_weight")["q"][128:, :128] == 0).all()


@pytest.mark.parametrize("name", list(FACTS))
def test_all_zero_tensor_stays_zero(name):
    got = recipe(name)(torch.zeros(128, 256))
    assert not got.values.any() and got.shares == {
        "saturated": 0.0, "underflowed": 0.0, "subnormal": 0.0}
    np.testing.assert_array_equal(got.dequantize().numpy(), np.zeros((128, 256)))


@pytest.mark.parametrize("name", list(FACTS))
def test_a_recipe_calls_the_quantizer_it_names(name):
    x = torch.from_numpy(hard_matrix(2))
    elem, grain, block, sf = FACTS[name]
    direct = (quantize_per_tensor(x, elem, sf) if grain == "tensor" else
              quantize_two_level(x, elem, block) if grain == "two_level" else
              quantize_blocks(x, elem, block, -1, sf))
    got = recipe(name)(x)
    assert torch.equal(got.values, direct.values) and torch.equal(got.decode, direct.decode)
    assert got.shares == direct.shares


def test_tiles_align_to_the_last_dimensions_of_a_higher_rank_tensor():
    x = torch.from_numpy(hard_matrix(3)).reshape(2, 128, 256)
    got = recipe("deepseek_act")(x)
    flat = recipe("deepseek_act")(x.reshape(256, 256))
    assert got.block == (1, 1, 128)
    assert torch.equal(got.values.reshape(256, 256), flat.values)
    assert recipe("deepseek_act").block_sizes((256,)) == (128,)  # a leading 1 dropped
    assert recipe("deepseek_weight").block_sizes((4, 256, 128)) == (1, 128, 128)
    with pytest.raises(ValueError, match="one size per dimension"):
        recipe("deepseek_weight").block_sizes((256,))


@pytest.mark.parametrize("name, shape, words", [
    ("mxfp8", (4, 48), "block=32 does not divide x's size 48 along axis 1; valid block sizes"),
    ("nvfp4", (3, 24), "block=16 does not divide x's size 24"),
    ("deepseek_act", (4, 100), "does not divide x's size 100 along axis 1"),
    ("deepseek_weight", (256, 64), "does not divide x's size 64 along axis 1"),
])
def test_a_block_that_does_not_divide_raises_instead_of_padding(name, shape, words):
    with pytest.raises(ValueError, match=words):
        recipe(name)(torch.ones(shape))
    with pytest.raises(ValueError, match=words):
        recipe(name).block_sizes(shape)


def test_per_tensor_recipes_take_any_shape():
    x = torch.from_numpy(hard_matrix(4)[:7, :5].copy())
    assert recipe("fp8_tensor")(x).values.shape == (7, 5)
    assert recipe("fp8_tensor").block_sizes((7, 5)) == (7, 5)


def test_custom_recipe_with_axis_margin_and_aliases():
    r = Recipe("cols", "e4m3", "block", 32, "e8m0", axis=0, margin=1)
    assert (r.elem, r.scale_format) == ("float8_e4m3fn", "float8_e8m0fnu")
    x = torch.from_numpy(hard_matrix(5))
    direct = quantize_blocks(x, "float8_e4m3fn", 32, 0, "float8_e8m0fnu", margin=1)
    assert torch.equal(r(x).values, direct.values)
    assert "axis 0" in r.describe() and "margin 1" in r.describe()
    assert r == Recipe("cols", "float8_e4m3fn", "block", 32, "float8_e8m0fnu", 0, 1)


@pytest.mark.parametrize("kwargs, words", [
    ({"name": "x", "elem": "float16", "grain": "tensor"}, "unknown elem 'float16'; valid"),
    ({"name": "x", "elem": "e4m3", "grain": "row"}, "unknown grain 'row'; valid choices: "
     + ", ".join(GRAINS)),
    ({"name": "x", "elem": "e4m3", "grain": "tensor", "block": 32}, "block=None"),
    ({"name": "x", "elem": "e4m3", "grain": "block"}, "block must be an integer >= 1"),
    ({"name": "x", "elem": "e4m3", "grain": "block", "block": 0}, "block must be an integer"),
    ({"name": "x", "elem": "e4m3", "grain": "block", "block": (1, 0)}, "block must be"),
    ({"name": "x", "elem": "e4m3", "grain": "block", "block": 32, "scale_format": "bf16"},
     "unknown scale_format 'bf16'; valid choices"),
    ({"name": "x", "elem": "e2m1", "grain": "two_level", "block": 16,
      "scale_format": "float32"}, "scale_format must be 'float8_e4m3fn'"),
    ({"name": "x", "elem": "e4m3", "grain": "block", "block": 32, "margin": 0.5}, "margin"),
    ({"name": "x", "elem": "e4m3", "grain": "block", "block": 32, "axis": "last"}, "axis"),
    ({"name": "", "elem": "e4m3", "grain": "tensor"}, "name must be"),
])
def test_bad_recipes_name_the_argument(kwargs, words):
    with pytest.raises(ValueError, match=words.replace("(", r"\(")):
        Recipe(**kwargs)


def test_unknown_recipe_lists_the_presets():
    with pytest.raises(ValueError) as info:
        recipe("mxfp5")
    assert all(name in str(info.value) for name in FACTS)
    r = Recipe("mine", "e5m2", "tensor")
    assert recipe(r) is r


def test_recipes_are_frozen_and_hashable():
    r = recipe("mxfp8")
    with pytest.raises(AttributeError):
        r.block = 16
    assert len({r, recipe("mxfp8"), recipe("mxfp4")}) == 2
