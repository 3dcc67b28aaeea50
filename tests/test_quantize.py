"""Quantizers against independent oracles: a per-block reference written with loops and fractions,
ml_dtypes and torch casts of the scaled tensor, and hypothesis properties.

The reference below never calls precisionlab: the value tables come from ml_dtypes, the
rounding is nearest-by-search over exact fractions, and every block is visited in a Python loop.
"""

from __future__ import annotations

import bisect
import functools
import itertools
import math
from fractions import Fraction

import ml_dtypes
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from precisionlab.quantize import (
    E8M0_RULES,
    ELEMENT_FORMATS,
    SCALE_FORMATS,
    quantize_blocks,
    quantize_per_tensor,
    quantize_two_level,
)

ML = {
    "float8_e4m3fn": ml_dtypes.float8_e4m3fn,
    "float8_e5m2": ml_dtypes.float8_e5m2,
    "float6_e3m2fn": ml_dtypes.float6_e3m2fn,
    "float6_e2m3fn": ml_dtypes.float6_e2m3fn,
    "float4_e2m1fn": ml_dtypes.float4_e2m1fn,
}
F32_MAX = np.float32(np.finfo(np.float32).max)


@functools.cache
def table(name: str) -> tuple[list[Fraction], list[int]]:
    """Every finite value of a format as a sorted list of fractions, with its bit pattern."""
    patterns = np.arange(256 if name.startswith("float8") else 64, dtype=np.uint8)
    if name.startswith("float4"):
        patterns = patterns[:16]
    vals = patterns.view(ML[name]).astype(np.float64)
    rows = sorted((Fraction(float(v)), int(p)) for v, p in zip(vals, patterns, strict=True)
                  if np.isfinite(v) and not (v == 0 and np.signbit(v)))
    return [r[0] for r in rows], [r[1] for r in rows]


def exact_round(v: Fraction, name: str) -> Fraction:
    """v rounded to nearest (ties to the even bit pattern) in the format, saturating at +-max."""
    vals, codes = table(name)
    if v >= vals[-1]:
        return vals[-1]
    if v <= vals[0]:
        return vals[0]
    i = bisect.bisect_left(vals, v)
    if vals[i] == v:
        return v
    lo, hi = vals[i - 1], vals[i]
    if v - lo != hi - v:
        return lo if v - lo < hi - v else hi
    return lo if codes[i - 1] % 2 == 0 else hi


def overflows(y: Fraction, name: str) -> bool:
    """True if |y| rounds past the format's max to nearest: beyond max + ulp/2, or on it with max's last bit odd."""
    vals, codes = table(name)
    top = vals[-1]
    ulp = Fraction(2) ** (math.frexp(float(top))[1] - 1 - ml_dtypes.finfo(ML[name]).nmant)
    return abs(y) > top + ulp / 2 or (abs(y) == top + ulp / 2 and codes[-1] % 2 == 1)


def block_scale(amax: float, elem: str, scale_format: str, rule: str, margin: int):
    """(m, d) for one block's amax, written from the documented rules (numpy float32, fractions)."""
    top = float(table(elem)[0][-1])
    if scale_format == "float32":
        if amax == 0:
            m = np.float32(1)
        else:
            with np.errstate(over="ignore"):
                m = np.float32(top) / np.float32(amax) / np.float32(2.0**margin)
            m = F32_MAX if np.isinf(m) else m
        return Fraction(float(m)), Fraction(float(np.float32(1) / m))
    if scale_format == "float8_e8m0fnu":
        if amax == 0:
            k = -127
        else:
            k = math.floor(math.log2(amax))  # fixed up below where log2 rounds across an integer
            while Fraction(2) ** k > Fraction(amax):
                k -= 1
            while Fraction(2) ** (k + 1) <= Fraction(amax):
                k += 1
            k -= ml_dtypes.finfo(ML[elem]).maxexp - 1
            while rule == "ceil" and Fraction(amax) > Fraction(top) * Fraction(2) ** k:
                k += 1
            k = min(max(k + margin, -127), 127)
        return Fraction(2) ** -k, Fraction(2) ** k
    d = exact_round(Fraction(amax) * Fraction(2) ** margin / Fraction(top), "float8_e4m3fn")
    return (Fraction(float(np.float32(1) / np.float32(d))) if d else Fraction(0)), d


def reference(x: np.ndarray, elem: str, block: tuple[int, ...], scale_format: str,
              rule: str = "floor", margin: int = 0, two_level: bool = False) -> dict:
    """The quantizer by hand: a loop over blocks, a loop over their elements, fractions throughout."""
    grid = tuple(n // b for n, b in zip(x.shape, block, strict=True))
    q = np.zeros(x.shape, np.float64)
    d = np.zeros(grid, dtype=object)
    counts = {"saturated": 0, "underflowed": 0, "subnormal": 0}
    top = float(table(elem)[0][-1])
    min_normal = Fraction(float(ml_dtypes.finfo(ML[elem]).smallest_normal))
    if two_level:
        t = float(np.max(np.abs(x))) if x.size else 0.0
        s = np.float32(1) if t == 0 else np.float32(448 * top) / np.float32(t)
        g = Fraction(float(np.float32(1) / s))
    for idx in itertools.product(*(range(n) for n in grid)):
        sl = tuple(slice(i * b, (i + 1) * b) for i, b in zip(idx, block, strict=True))
        xs = x[sl]
        amax = max((abs(float(v)) for v in xs.flat), default=0.0)
        if two_level:
            b_k = exact_round(Fraction(amax) * Fraction(float(s)) / Fraction(top), "float8_e4m3fn")
            m = Fraction(float(s / np.float32(b_k))) if b_k else Fraction(0)
            d[idx] = b_k * g
        else:
            m, d[idx] = block_scale(amax, elem, scale_format, rule, margin)
        qs = np.zeros(xs.shape)
        for j in itertools.product(*(range(n) for n in xs.shape)):
            y = Fraction(float(np.float32(xs[j]) * np.float32(m)))
            r = exact_round(y, elem)
            qs[j] = math.copysign(float(r), float(xs[j])) if r == 0 else float(r)
            counts["saturated"] += overflows(y, elem)
            counts["underflowed"] += bool(xs[j] != 0 and r == 0)
            counts["subnormal"] += bool(r != 0 and abs(r) < min_normal)
        q[sl] = qs
    n = max(x.size, 1)
    return {"q": q, "d": d, **{k: v / n for k, v in counts.items()}}


def check_against_reference(r, ref: dict) -> None:
    """Same elements (bit for bit, signs of zeros too), same scales, same shares; exact dequantization."""
    q = r.values.numpy().astype(np.float64)
    assert np.array_equal(q, ref["q"]) and np.array_equal(np.signbit(q), np.signbit(ref["q"]))
    assert [Fraction(float(v)) for v in r.decode.numpy().flat] == list(ref["d"].flat)
    assert (r.saturated, r.underflowed, r.subnormal) == (
        ref["saturated"], ref["underflowed"], ref["subnormal"])
    deq = r.dequantize().numpy()
    block = r.block
    for i in itertools.product(*(range(n) for n in q.shape)):
        k = tuple(a // b for a, b in zip(i, block, strict=True))
        assert Fraction(float(deq[i])) == Fraction(float(q[i])) * ref["d"][k]


def hard_tensor(shape: tuple[int, ...], seed: int, block_len: int = 8) -> np.ndarray:
    """Normal values over 40 binades, with blocks that are all zero, one huge outlier, ties, tiny values."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(shape) * 2.0 ** rng.integers(-20, 20, (*shape[:-1], 1))
    flat = x.reshape(-1, block_len)  # rows of block_len consecutive elements
    flat[0] = 0.0  # an all-zero block
    flat[1, 3] *= 1e4  # one outlier among ordinary values
    ties = np.array([1.5, 1.25, 1.75, 1.0625, -3.5, 1.9, 0.75, 2.0**-12])  # halfway in fp4/fp6/fp8
    flat[2] = np.resize(ties, block_len) * 2.0**6
    if len(flat) > 3:
        flat[3] = 2.0 ** -20 * rng.standard_normal(block_len)  # tiny block: subnormal elements
        flat[3, 0] = 2.0**10  # ... next to a large one
    if len(flat) > 4:
        flat[4, : block_len // 2] = -0.0
    return x.astype(np.float32)


CASES = [  # (shape, block, axis)
    ((4, 16), 8, -1),
    ((8, 8), 4, 0),
    ((8, 16), (1, 8), -1),  # a 1 x 8 tile: DeepSeek-V3's 1 x 128 in small
    ((8, 16), (4, 8), -1),  # a square-ish tile: 128 x 128 in small
    ((2, 4, 8), 8, -1),
]


@pytest.mark.parametrize("scale_format", SCALE_FORMATS)
@pytest.mark.parametrize("elem", ELEMENT_FORMATS)
@pytest.mark.parametrize("shape, block, axis", CASES)
def test_blocks_match_the_loop_reference(shape, block, axis, elem, scale_format):
    x = hard_tensor(shape, seed=len(elem) + len(scale_format))
    r = quantize_blocks(torch.from_numpy(x), elem, block, axis, scale_format)
    check_against_reference(r, reference(x, elem, r.block, scale_format))


@pytest.mark.parametrize("rule", E8M0_RULES)
@pytest.mark.parametrize("margin", [-1, 0, 2])
def test_e8m0_rules_and_margin_match_the_reference(rule, margin):
    x = hard_tensor((4, 16), seed=margin + 3)
    r = quantize_blocks(x, "float8_e4m3fn", 8, scale_format="e8m0", e8m0_rule=rule, margin=margin)
    check_against_reference(r, reference(x, "float8_e4m3fn", r.block, "float8_e8m0fnu", rule,
                                         margin))


def test_ceil_rule_never_saturates_and_floor_does_on_large_mantissas():
    x = torch.tensor([[1.9, 0.5, -0.25, 1.0] * 8])  # amax = 1.9 * 2^0: 1.9 * 256 > 448 + 16
    floor = quantize_blocks(x, "float8_e4m3fn", 32, scale_format="float8_e8m0fnu")
    ceil = quantize_blocks(x, "float8_e4m3fn", 32, scale_format="float8_e8m0fnu", e8m0_rule="ceil")
    assert floor.saturated == 8 / 32 and float(floor.scales) == 2.0**-8
    assert ceil.saturated == 0 and float(ceil.scales) == 2.0**-7


@pytest.mark.parametrize("elem", ELEMENT_FORMATS)
@pytest.mark.parametrize("scale_format", ["float32", "float8_e8m0fnu"])
def test_per_tensor_matches_the_reference(elem, scale_format):
    x = hard_tensor((4, 8), seed=7)
    r = quantize_per_tensor(x, elem, scale_format, margin=1)
    assert r.block == (4, 8) and r.scales.shape == (1, 1)
    check_against_reference(r, reference(x, elem, (4, 8), scale_format, margin=1))


@pytest.mark.parametrize("elem", ELEMENT_FORMATS)
@pytest.mark.parametrize("shape, block, axis", CASES)
def test_two_level_matches_the_reference(shape, block, axis, elem):
    x = hard_tensor(shape, seed=11)
    r = quantize_two_level(x, elem, block, axis)
    ref = reference(x, elem, r.block, "float8_e4m3fn", two_level=True)
    check_against_reference(r, ref)
    assert Fraction(r.tensor_scale) * Fraction(float(r.scales.flatten()[0])) == ref["d"].flat[0]


def test_two_level_puts_the_largest_block_scale_at_448():
    x = torch.linspace(-3, 5, 64).reshape(4, 16)
    r = quantize_two_level(x)
    assert float(r.scales.max()) == 448.0 and r.scale_format == "float8_e4m3fn"


# --------------------------------------------------------------------------- library casts


@pytest.mark.parametrize("tile", [(1, 128), (128, 128)])
@pytest.mark.parametrize("elem", ["float8_e4m3fn", "float8_e5m2"])
def test_deepseek_tiles_match_torch_casts_of_the_scaled_tensor(tile, elem):
    x = hard_tensor((256, 256), seed=5, block_len=128)
    r = quantize_blocks(x, elem, tile, scale_format="float32")
    # The vectorised oracle: numpy amax per tile, float32 scale, torch's own saturated cast.
    g = x.reshape(256 // tile[0], tile[0], 256 // tile[1], tile[1])
    amax = np.abs(g).max(axis=(1, 3), keepdims=True)
    top = np.float32(table(elem)[0][-1])
    with np.errstate(divide="ignore"):
        m = np.where(amax == 0, np.float32(1), top / amax).astype(np.float32)
    y = np.clip(g * m, -top, top).reshape(x.shape)
    q = torch.from_numpy(y).to(getattr(torch, elem)).float()
    assert torch.equal(r.values, q)
    assert np.array_equal(r.decode.numpy(), (np.float32(1) / m).astype(np.float64).reshape(
        r.decode.shape))


@pytest.mark.parametrize("elem", ELEMENT_FORMATS)
def test_mx_blocks_match_ml_dtypes_casts_and_torch_e8m0_scales(elem):
    x = hard_tensor((64, 256), seed=2, block_len=32)
    r = quantize_blocks(x, elem, 32)  # MX: 32 elements along the last axis, E8M0 scales
    d = r.decode.numpy()
    # The scales are E8M0 values: torch's e8m0fnu cast leaves them unchanged.
    e8 = torch.from_numpy(d.astype(np.float32)).to(torch.float8_e8m0fnu).float().numpy()
    assert np.array_equal(e8, d.astype(np.float32))
    top = np.float32(table(elem)[0][-1])
    y = np.clip(x.reshape(64, 8, 32) / d[:, :, None].astype(np.float32), -top, top)
    q = y.reshape(x.shape).astype(ML[elem]).astype(np.float32)
    assert np.array_equal(r.values.numpy(), q)


@pytest.mark.parametrize("elem", ["float8_e4m3fn", "float8_e5m2"])
@pytest.mark.parametrize("shape", [(16, 64), (256, 512)])  # the NumPy counts and the compiled pass
def test_shares_match_ml_dtypes_overflow_and_zero_counts(elem, shape):
    x = hard_tensor(shape, seed=9, block_len=32)
    x[::7] *= 2.0**-30  # rows whose small entries underflow or land subnormal
    r = quantize_blocks(x, elem, 32)  # OCP's floor rule: large mantissas saturate
    y = x.reshape(shape[0], -1, 32) / r.decode.numpy()[:, :, None].astype(np.float32)
    with np.errstate(over="ignore", invalid="ignore"):
        free = y.astype(ML[elem]).astype(np.float32)  # ml_dtypes' cast, without saturation
    q = r.values.numpy().reshape(y.shape)
    n = x.size
    assert r.saturated == np.count_nonzero(~np.isfinite(free)) / n > 0
    assert r.underflowed == np.count_nonzero((y != 0) & (q == 0)) / n > 0
    tiny = float(ml_dtypes.finfo(ML[elem]).smallest_normal)
    assert r.subnormal == np.count_nonzero((q != 0) & (np.abs(q) < tiny)) / n > 0


# --------------------------------------------------------------------------- properties


@st.composite
def quantizer_cases(draw):
    rows = draw(st.sampled_from([1, 2, 4]))
    cols = draw(st.sampled_from([4, 8, 16]))
    block = draw(st.sampled_from([b for b in (1, 2, 4, 8, 16) if cols % b == 0]))
    vals = draw(st.lists(st.floats(-1e6, 1e6, width=32), min_size=rows * cols,
                         max_size=rows * cols))
    x = np.array(vals, np.float32).reshape(rows, cols)
    return (x, block, draw(st.sampled_from(ELEMENT_FORMATS)), draw(st.sampled_from(SCALE_FORMATS)),
            draw(st.sampled_from(E8M0_RULES)))


@settings(max_examples=60, deadline=None)
@given(case=quantizer_cases())
def test_blocks_property_matches_the_reference(case):
    x, block, elem, scale_format, rule = case
    r = quantize_blocks(x, elem, block, scale_format=scale_format, e8m0_rule=rule)
    check_against_reference(r, reference(x, elem, r.block, scale_format, rule))
    assert float(r.values.abs().max()) <= float(table(elem)[0][-1])


@settings(max_examples=30, deadline=None)
@given(case=quantizer_cases())
def test_two_level_property_matches_the_reference(case):
    x, block, elem, _, _ = case
    r = quantize_two_level(x, elem, block)
    check_against_reference(r, reference(x, elem, r.block, "", two_level=True))


# --------------------------------------------------------------------------- bad input


@pytest.mark.parametrize("call, words", [
    (lambda x: quantize_blocks(x, block=5), ["block=5", "axis 1", "1, 2, 4, 8, 16, 32"]),
    (lambda x: quantize_blocks(x, block=(3, 32)), ["axis 0", "1, 2, 4"]),
    (lambda x: quantize_blocks(x, block=(4,)), ["one size per dimension"]),
    (lambda x: quantize_blocks(x, block=0), ["block must be an integer >= 1"]),
    (lambda x: quantize_blocks(x, block=True), ["block=True"]),
    (lambda x: quantize_blocks(x, axis=2), ["axis must be an integer in [-2, 1]", "axis=2"]),
    (lambda x: quantize_blocks(x, "int8"), ["elem 'int8'", "float8_e4m3fn, float8_e5m2"]),
    (lambda x: quantize_blocks(x, "float16"), ["valid choices: float8_e4m3fn"]),
    (lambda x: quantize_blocks(x, scale_format="e5m2"),
     ["scale_format 'e5m2'", "float32, float8_e8m0fnu, float8_e4m3fn"]),
    (lambda x: quantize_blocks(x, e8m0_rule="round"), ["e8m0_rule 'round'", "floor, ceil"]),
    (lambda x: quantize_per_tensor(x, margin=0.5), ["margin=0.5"]),
    (lambda x: quantize_two_level(x, "float8_e8m0fnu"), ["elem 'float8_e8m0fnu'"]),
])
def test_bad_arguments_name_themselves_and_the_choices(call, words):
    with pytest.raises(ValueError) as err:
        call(torch.ones(4, 32))
    assert all(w in str(err.value) for w in words), str(err.value)


@pytest.mark.parametrize("bad", [float("inf"), float("nan"), -float("inf")])
@pytest.mark.parametrize("quantize", [quantize_per_tensor, quantize_blocks, quantize_two_level])
def test_inf_and_nan_inputs_raise(bad, quantize):
    x = torch.ones(2, 32)
    x[1, 3] = bad
    with pytest.raises(ValueError, match="1 inf/NaN entries"):
        quantize(x)


def test_float64_input_is_rounded_once_to_float32_and_integers_are_refused():
    x = torch.tensor([[1 + 2.0**-30, 3.0]], dtype=torch.float64)
    r = quantize_per_tensor(x, scale_format="float8_e8m0fnu")
    assert r.values.dtype == torch.float32
    with pytest.raises(TypeError, match="floating-point"):
        quantize_per_tensor(torch.ones(2, 2, dtype=torch.int32))


def test_shares_counted_in_one_compiled_pass_match_numpys_counts():
    # 2^20 elements take count_shares' compiled pass, each half of them NumPy's passes; the
    # 32-element blocks of a row do not depend on the other rows, so the counts must add up.
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(1024, 1024, generator=gen) * torch.logspace(-12, 3, 1024)
    x[::7, ::5] = 0.0
    full = quantize_blocks(x)  # MXFP8: the OCP floor rule saturates some blocks
    halves = [quantize_blocks(h) for h in (x[:512], x[512:])]
    for share in ("saturated", "underflowed", "subnormal"):
        whole = round(getattr(full, share) * x.numel())
        parts = sum(round(getattr(h, share) * x.numel() / 2) for h in halves)
        assert whole == parts, share
    assert full.saturated > 0 and full.underflowed > 0 and full.subnormal > 0
