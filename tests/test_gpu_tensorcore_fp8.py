"""The tensor-core model's FP8 path: a 14-bit accumulator and promotion into float32.

Oracles: the block FMA re-enacted in exact fractions from its description (align every term
to the largest, cut each below the accumulator's last bit toward zero, add exactly, cut the
sum to acc_bits significant bits toward zero), promotion as a float32 add of the exact sum of
two float32 values (correctly rounded by Figueroa's innocuous double rounding through
float64), and a rigorous error bound for the promoted product, checked by hypothesis.
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from precisionlab.chapters import matrix_products
from precisionlab.gpu.tensorcore import (
    TENSOR_CORE_MODELS,
    TensorCoreModel,
    accumulator_format,
    block_fma,
    tensor_core_matmul,
)
from precisionlab.rounding import round_to

H100 = TENSOR_CORE_MODELS["H100-FP8"]


def _e4m3(x) -> np.ndarray:
    return np.asarray(round_to(np.asarray(x, dtype=np.float64), "float8_e4m3fn", saturate=True),
                      dtype=np.float64)


def _cut(x: Fraction, lsb: int) -> Fraction:
    """x truncated toward zero to a multiple of 2^lsb."""
    unit = Fraction(2) ** lsb
    q = abs(x) // unit
    return (q * unit) * (1 if x >= 0 else -1)


def _floor_log2(x: Fraction) -> int:
    e = x.numerator.bit_length() - x.denominator.bit_length()
    return e if Fraction(2) ** e <= x else e - 1


def _block_oracle(a, b, c: Fraction, bits: int, g: int) -> Fraction:
    """One block FMA in fractions: align to the largest term, cut, add exactly, cut to `bits`."""
    terms = [c] + [Fraction(float(x)) * Fraction(float(y)) for x, y in zip(a, b, strict=True)]
    nonzero = [abs(t) for t in terms if t != 0]
    if not nonzero:
        return Fraction(0)
    lsb = _floor_log2(max(nonzero)) - (bits - 1) - g
    s = sum(_cut(t, lsb) for t in terms)
    if s == 0:
        return s
    return _cut(s, _floor_log2(abs(s)) - (bits - 1))


def _matmul_oracle(a, b, model: TensorCoreModel, promote: int | None) -> np.ndarray:
    m, k = a.shape
    out = np.zeros((m, b.shape[1]))
    for i in range(m):
        for j in range(b.shape[1]):
            d, total = Fraction(0), Fraction(0)
            for k0 in range(0, k, model.block):
                blk = slice(k0, k0 + model.block)
                d = _block_oracle(a[i, blk], b[blk, j], d, model.acc_bits, model.align_bits)
                end = min(k0 + model.block, k)
                if promote and (end % promote == 0 or end == k):
                    total = Fraction(float(np.float32(float(total + d))))
                    d = Fraction(0)
            out[i, j] = float(total if promote else d)
    return out


def test_the_hopper_model_is_the_14_bit_accumulator_deepseek_reports():
    assert (H100.acc_bits, H100.block, H100.align_bits) == (14, 32, 0)
    assert H100.inputs == ("float8_e4m3fn", "float8_e5m2")
    f = accumulator_format(14)
    assert f.precision == 14 and f.emax == 127 and f.emin == -126
    assert accumulator_format(24).name == "float32"
    # The 14-bit grid: 1 + 2^-13 is a value, 1 + 2^-14 truncates to 1.
    assert float(round_to(1 + 2.0**-13, f, "toward_zero")) == 1 + 2.0**-13
    assert float(round_to(1 + 2.0**-14, f, "toward_zero")) == 1.0


@pytest.mark.parametrize("seed", range(4))
def test_block_fma_against_the_fraction_oracle(seed):
    rng = np.random.default_rng(seed)
    a = _e4m3(rng.normal(size=(5, 32)) * 4)
    b = _e4m3(rng.normal(size=(5, 32)))
    c = np.asarray(round_to(rng.normal(size=5) * 2.0 ** rng.integers(-4, 8, 5),
                            accumulator_format(14)), dtype=np.float64)
    d = block_fma(a, b, c, "H100-FP8", "float8_e4m3fn")
    for r in range(5):
        assert d[r] == float(_block_oracle(a[r], b[r], Fraction(float(c[r])), 14, 0))


def test_a_small_product_vanishes_beside_a_large_sum():
    # 1 + 2^-14: the 14-bit register has no bit for 2^-14 (float32 would keep it).
    a = np.array([[1.0, 2.0**-7]])
    b = np.array([[1.0, 2.0**-7]])
    assert block_fma(a, b, np.zeros(1), "H100-FP8", "float8_e4m3fn")[0] == 1.0
    wide = TensorCoreModel("fp8-acc24", 32, 0, 6, "FP8 inputs, float32 accumulator",
                           ("float8_e4m3fn",))
    assert block_fma(a, b, np.zeros(1), wide, "float8_e4m3fn")[0] == 1 + 2.0**-14


@pytest.mark.parametrize("promote", [None, 32, 128])
@pytest.mark.parametrize("k", [64, 320])
def test_tensor_core_matmul_against_the_fraction_oracle(promote, k):
    a, b = matrix_products.fp8_operands(3, k, 2, seed=k)
    got = tensor_core_matmul(a, b, model="H100-FP8", inputs="float8_e4m3fn",
                             operands="exact", promote_every=promote)
    assert np.array_equal(got, _matmul_oracle(a, b, H100, promote))


def test_exact_fp8_matmul_is_exact():
    a, b = matrix_products.fp8_operands(3, 2048, 3, seed=1)
    exact = matrix_products.exact_fp8_matmul(a, b)
    for i in range(3):
        for j in range(3):
            want = sum(Fraction(float(x)) * Fraction(float(y)) for x, y in zip(a[i], b[:, j],
                                                                                  strict=True))
            assert exact[i, j] == want  # float64 holds the exact sum
    with pytest.raises(ValueError, match="E4M3"):
        matrix_products.exact_fp8_matmul(a + 2.0**-12, b)


def _promoted_bound(a: np.ndarray, b: np.ndarray, block: int, every: int) -> float:
    """|C - C*| <= sum over intervals of (blocks) (B + 2) 2^-13 S_int + u32 (intervals) S_all.

    Per block: each of the B + 1 aligned terms loses under 2^lsb <= 2^-13 max|term|, the final
    cut under 2^-13 |d|; |c|, |d| and every term are at most S_int, the interval's sum of
    |a_k b_k| (truncation never grows a magnitude). Each float32 add of a partial loses at most
    u32 = 2^-24 of a total no larger than 1.01 S_all.
    """
    k = a.shape[0]
    mags = np.abs(a * b)
    total = 0.0
    for k0 in range(0, k, every):
        s = math.fsum(mags[k0:k0 + every].tolist())
        blocks = -(-min(every, k - k0) // block)
        total += blocks * (block + 2) * 2.0**-13 * s
    intervals = -(-k // every)
    return 1.01 * (total + intervals * 2.0**-24 * math.fsum(mags.tolist()))


@settings(max_examples=40, deadline=None)
@given(k_blocks=st.integers(1, 24), seed=st.integers(0, 2**31 - 1),
       positive=st.booleans(), every=st.sampled_from([32, 64, 128]))
def test_promotion_error_stays_within_its_bound(k_blocks, seed, positive, every):
    k = 32 * k_blocks
    rng = np.random.default_rng(seed)
    a = _e4m3(rng.normal(size=k) * 2.0 ** rng.integers(-3, 4, k))
    b = _e4m3(rng.normal(size=k))
    if positive:
        a, b = np.abs(a), np.abs(b)
    exact = math.fsum((a * b).tolist())
    got = tensor_core_matmul(a[None, :], b[:, None], model="H100-FP8",
                             inputs="float8_e4m3fn", operands="exact", promote_every=every)[0, 0]
    assert abs(got - exact) <= _promoted_bound(a, b, 32, every)
    # Without promotion the same bound holds with one interval spanning all of K.
    whole = tensor_core_matmul(a[None, :], b[:, None], model="H100-FP8",
                               inputs="float8_e4m3fn", operands="exact")[0, 0]
    assert abs(whole - exact) <= _promoted_bound(a, b, 32, k)


def test_promotion_arguments_are_checked():
    a, b = matrix_products.fp8_operands(2, 64, 2, seed=0)
    for bad in (0, 48, True, 16):
        with pytest.raises(ValueError, match="promote_every"):
            tensor_core_matmul(a, b, model="H100-FP8", inputs="float8_e4m3fn",
                               operands="exact", promote_every=bad)
    with pytest.raises(ValueError, match="out='float32'"):
        tensor_core_matmul(a, b, model="H100-FP8", inputs="float8_e4m3fn", operands="exact",
                           out="float16", promote_every=32)
    with pytest.raises(ValueError, match="acc_bits"):
        TensorCoreModel("bad", 4, 0, 3, "x", acc_bits=25)
    with pytest.raises(ValueError, match="operand format"):
        tensor_core_matmul(a, b, model="V100", inputs="float8_e4m3fn", operands="exact")


def test_accumulation_errors_grow_without_promotion_and_not_with_it():
    r = matrix_products.accumulation_errors((256, 2048), m=4, n=4, positive=True)
    assert r.entrywise[None][1] > 4 * r.entrywise[None][0]
    assert r.entrywise[128][1] < 2 * r.entrywise[128][0]
    assert (r.normwise[128] < r.normwise[None]).all()
