"""The bit-level tensor-core model against the published behaviour of NVIDIA tensor cores.

Each test re-enacts one experiment of Fasi, Higham, Mikaitis & Pranesh, "Numerical behavior
of NVIDIA tensor cores" (PeerJ Comput. Sci. 7:e330, 2021; test programs in
north-numerical-computing/tensor-cores-numerical-behavior): the same inputs, and the outputs
the hardware produced. V100 uses float16 inputs with products of 1; the T4/A100 variants of
some tests scale by 0.5 where the published programs do. Where the generations differ (the
extra alignment bit), each gets its published answer. Several tests also check that an
IEEE-style "round every add to nearest" evaluation would NOT give the published answer, so
the observation really pins the model down.
"""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from oracles import fraction_round

from precisionlab.gpu import (
    TENSOR_CORE_MODELS,
    block_fma,
    get_tensor_core_model,
    tensor_core_matmul,
)
from precisionlab.gpu.tensorcore import TensorCoreModel

ALL = ["V100", "T4", "A100"]
INPUTS = {"V100": ["float16"], "T4": ["float16"], "A100": ["float16", "bfloat16", "tf32"]}
CASES = [(m, f) for m in ALL for f in INPUTS[m]]
ONE = np.ones(4)
U24 = 2.0**-24


def half_or_one(model):
    """The published T4/A100 programs use 0.5 where the V100 one uses 1 in some tests."""
    return 1.0 if model == "V100" else 0.5


def rn_sequential(c, a, b):
    """What IEEE float32 arithmetic would give: c + a1 b1 + ... each step rounded to nearest."""
    acc = Fraction(c)
    for x, y in zip(a, b, strict=True):
        acc = Fraction(fraction_round(acc + Fraction(x) * Fraction(y), "float32", "nearest_even"))
    return float(acc)


@pytest.mark.parametrize("model, inputs", CASES)
def test_products_are_exact(model, inputs):
    below_one = {"float16": 1 - 2.0**-11, "bfloat16": 1 - 2.0**-8, "tf32": 1 - 2.0**-11}[inputs]
    a = np.array([below_one, 0, 0, 0])
    want = below_one**2  # exact in float32 for these inputs: 1 - 2^-10 + 2^-22 (or bf16's)
    assert block_fma(a, a, 0.0, model, inputs) == want
    assert block_fma(np.full(4, below_one), np.full(4, below_one), 0.0, model, inputs) == 4 * want


def test_products_exact_in_float16_output_mode():
    b1 = 1 - 2.0**-11
    got = block_fma([b1, b1, 0, 0], [b1, 2.0**-11, 0, 0], 0.0, "V100", "float16", out="float16")
    assert got == 1 - 2.0**-10 + 2.0**-11


@pytest.mark.parametrize("model, inputs", CASES)
def test_products_are_accumulated_in_float32(model, inputs):
    # Four products far below float32's last bit of c = 1 vanish; a wider accumulator keeps them.
    h = half_or_one(model)
    assert block_fma(np.full(4, h), np.full(4, U24), 1.0, model, inputs) == 1.0
    assert rn_sequential(1.0, np.full(4, h), np.full(4, U24)) == 1.0  # consistent with float32


@pytest.mark.parametrize("model, inputs", CASES)
@pytest.mark.parametrize("j", range(4))
def test_sum_starts_from_the_largest_term(model, inputs, j):
    h = half_or_one(model)
    a, b = np.full(4, h), np.full(4, U24)
    a[j], b[j] = 1.0, 1.0
    assert block_fma(a, b, U24, model, inputs) == 1.0
    if model == "V100" and j > 0:  # in index order, float32 adds keep part of the small terms
        assert rn_sequential(U24, a, b) > 1.0


@pytest.mark.parametrize("model, inputs", CASES)
@pytest.mark.parametrize("sign", [1.0, -1.0])
def test_results_are_truncated_round_down_positive_round_up_negative(model, inputs, sign):
    b = sign * np.array([2.0, 2.0**-23 + 2.0**-24, 0, 0])
    assert block_fma(ONE, b, 0.0, model, inputs) == sign * 2.0
    assert rn_sequential(0.0, ONE, b) == sign * (2.0 + 2.0**-22)  # nearest would round away


def test_float16_output_is_rounded_to_nearest():
    got = block_fma([U24, U24, 0, 0], [0.5, 0.25, 0, 0], 0.0, "V100", "float16", out="float16")
    assert got == U24  # 3/4 of float16's smallest subnormal rounds up, not down


@pytest.mark.parametrize("model, inputs, want", [("V100", "float16", 2.0**-23)]
                         + [(m, f, 2.0**-24) for m, f in CASES if m != "V100"])
def test_extra_alignment_bit(model, inputs, want):
    """1 - (1 - 2^-24): V100 loses c's last bit when aligning it to 1; T4/A100 keep one extra bit."""
    assert block_fma([1.0], [1.0], -(1 - U24), model, inputs) == want


@pytest.mark.parametrize("model, inputs", CASES)
def test_no_normalisation_inside_the_block_in_addition(model, inputs):
    got = block_fma(ONE, np.full(4, U24), 1 - U24, model, inputs)
    assert got == 1 + 2.0**-23
    assert rn_sequential(1 - U24, ONE, np.full(4, U24)) != got  # renormalising each add differs


@pytest.mark.parametrize("model, inputs, want", [("V100", "float16", 2.0**-23)]
                         + [(m, f, 0.0) for m, f in CASES if m != "V100"])
def test_no_normalisation_in_subtraction(model, inputs, want):
    got = block_fma([1, 1, 0, 0.0], [1, -U24, 0, 0.0], -1 + U24, model, inputs)
    assert got == want


@pytest.mark.parametrize("model, inputs", CASES)
def test_carry_out_bits(model, inputs):
    c = 1 + 2.0**-22 + 2.0**-23
    for i in range(4):
        b = np.ones(4)
        b[i] = 2.0**-23
        assert block_fma(ONE, b, c, model, inputs) == 4 + 2.0**-21
    assert block_fma(ONE, [1, 1.5, 1.75, 1.875], 1.875, model, inputs) == 8.0  # the third carry bit
    assert block_fma(ONE, ONE, c, model, inputs) == 5.0  # truncated while normalising
    assert block_fma(ONE, -ONE, -c, model, inputs) == -5.0


def test_carry_bits_must_hold_a_full_block():
    TensorCoreModel("ok", 7, 1, 3, "8 terms fit under 2^3")
    with pytest.raises(ValueError, match="at least 4 carry bits"):
        TensorCoreModel("narrow", 8, 1, 3, "9 terms need 4 carry bits")


@pytest.mark.parametrize("model, inputs", CASES)
def test_dot_product_is_not_monotonic(model, inputs):
    """Raising c from 1 - 2^-24 to 1 lowers the result (published test 5 of section D)."""
    if model == "V100":
        a, b = ONE, np.full(4, U24)
    else:
        a, b = np.full(4, 0.5), np.array([U24, U24, U24, 2.0**-23 + U24])
    smaller_c = block_fma(a, b, 1 - U24, model, inputs)
    larger_c = block_fma(a, b, 1.0, model, inputs)
    assert larger_c < smaller_c
    assert rn_sequential(1.0, a, b) >= rn_sequential(1 - U24, a, b)  # IEEE adds are monotonic


@pytest.mark.parametrize("inputs, tiny", [("float16", 2.0**-24), ("bfloat16", 2.0**-133)])
def test_subnormal_inputs_and_outputs(inputs, tiny):
    assert block_fma([tiny], [4.0], 0.0, "A100", inputs) == 4 * tiny
    assert block_fma([0.0], [0.0], 2.0**-149, "A100", inputs) == 2.0**-149
    assert block_fma([2.0**-126 if inputs == "bfloat16" else 2.0**-14], [0.5], 0.0, "A100",
                     inputs) == (2.0**-127 if inputs == "bfloat16" else 2.0**-15)


@settings(max_examples=80, deadline=None)
@given(st.lists(st.integers(-64, 64), min_size=4, max_size=4),
       st.lists(st.integers(-64, 64), min_size=4, max_size=4), st.integers(-2**20, 2**20),
       st.sampled_from(ALL))
def test_exact_when_nothing_is_shifted_out(a, b, c, model):
    """Small integers: every aligned term fits, so the block returns the exact sum."""
    assert block_fma(np.array(a, float), np.array(b, float), float(c), model) == c + np.dot(a, b)


@settings(max_examples=150, deadline=None)
@given(st.lists(st.floats(0, 2.0**8, width=16), min_size=4, max_size=4),
       st.lists(st.floats(0, 2.0**8, width=16), min_size=4, max_size=4),
       st.floats(0, 2.0**16, width=32), st.sampled_from(ALL), st.sampled_from([1.0, -1.0]))
def test_never_rounds_away_from_zero(a, b, c, model, sign):
    """Same-sign terms: truncation everywhere means |d| <= |exact| and d >= the exact sum - one float32 step per term."""
    a = np.array(a)
    b = sign * np.array(b)
    c = sign * c
    d = Fraction(block_fma(a, b, c, model))
    exact = Fraction(c) + sum(Fraction(x) * Fraction(y) for x, y in zip(a, b, strict=True))
    assert abs(d) <= abs(exact)
    largest = max([abs(Fraction(c))] + [abs(Fraction(x) * Fraction(y)) for x, y in zip(a, b, strict=True)])
    assert abs(exact - d) <= 8 * largest * Fraction(2) ** -23


def test_matmul_chains_blocks_and_stays_close_to_float64():
    rng = np.random.default_rng(0)
    A, B = rng.standard_normal((12, 40)), rng.standard_normal((40, 9))
    D = tensor_core_matmul(A, B, model="V100")
    Ar = np.asarray(A, np.float16).astype(np.float64)
    Br = np.asarray(B, np.float16).astype(np.float64)
    # 10 blocks of 4: per block at most 5 truncations of 2^-23 relative to its largest term
    bound = 10 * 5 * 2.0**-23 * (np.abs(Ar) @ np.abs(Br) + 1)
    assert (np.abs(D - Ar @ Br) <= bound).all()
    # the first block alone is one block_fma call
    first = tensor_core_matmul(A[:, :4], B[:4], model="V100")
    assert np.array_equal(first, block_fma(Ar[:, None, :4], Br.T[None, :, :4], np.zeros((12, 9))))


def test_registry_and_errors():
    assert set(TENSOR_CORE_MODELS) == {"V100", "T4", "A100"}
    assert get_tensor_core_model("V100").align_bits == 0
    with pytest.raises(ValueError, match="valid choices: V100, T4, A100"):
        get_tensor_core_model("H100")
    with pytest.raises(ValueError, match="at most 4 products"):
        block_fma(np.ones(5), np.ones(5), 0.0)
    with pytest.raises(ValueError, match="float16 values"):
        block_fma([0.1], [1.0], 0.0)
    with pytest.raises(ValueError, match="valid choices: float32, float16"):
        block_fma([1.0], [1.0], 0.0, out="bfloat16")
