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
    OPERAND_FEEDS,
    TENSOR_CORE_MODELS,
    block_fma,
    describe,
    get_tensor_core_model,
    matmul,
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
    assert set(TENSOR_CORE_MODELS) == {"V100", "T4", "A100", "H100-FP8"}
    assert get_tensor_core_model("V100").align_bits == 0
    with pytest.raises(ValueError, match="valid choices: V100, T4, A100"):
        get_tensor_core_model("H100")
    with pytest.raises(ValueError, match="at most 4 products"):
        block_fma(np.ones(5), np.ones(5), 0.0)
    with pytest.raises(ValueError, match="float16 values"):
        block_fma([0.1], [1.0], 0.0)
    with pytest.raises(ValueError, match="valid choices: float32, float16"):
        block_fma([1.0], [1.0], 0.0, out="bfloat16")


# --------------------------------------------------------------------------- float32 words fed to tf32


BELOW_ONE = float(np.nextafter(np.float32(1), np.float32(0)))  # 1 - 2^-24, as the C test builds it


def top19(x) -> np.ndarray:
    """Independent oracle: keep a float32 word's sign, exponent and top 10 fraction bits (mask)."""
    words = np.asarray(x, dtype=np.float32).view(np.uint32) & np.uint32(0xFFFFE000)
    return words.view(np.float32).astype(np.float64)


def test_a100_tf32_test_with_raw_float32_operands():
    """Fasi et al., A100 tf32 program, "products are computed exactly": a = b = 1 - 2^-24 (float32).

    Its pass conditions are (1 - 2^-10 + 2^-22) for one product and four times that for four:
    the hardware read only the top 19 bits of each word, 1 - 2^-11. Software conversion by
    cvt.rna (nearest, ties away) would have turned the operands into 1.0 and given 1 and 4.
    """
    assert BELOW_ONE == 1 - 2.0**-24 and top19(BELOW_ONE) == 1 - 2.0**-11
    one = 1 - 2.0**-10 + 2.0**-22  # the published pass value
    assert Fraction(one) == Fraction(top19(BELOW_ONE).item()) ** 2
    a1 = np.array([BELOW_ONE, 0, 0, 0])
    a4 = np.full(4, BELOW_ONE)
    assert block_fma(a1, a1, 0.0, "A100", "tf32", operands="raw") == one
    assert block_fma(a4, a4, 0.0, "A100", "tf32", operands="raw") == 4 * one
    assert f"{one:.5f}" == "0.99902" and f"{4 * one:.5f}" == "3.99609"
    # The same operands converted by software first: the hardware answer is not reproduced.
    assert block_fma(a1, a1, 0.0, "A100", "tf32", operands="converted") == 1.0
    assert block_fma(a4, a4, 0.0, "A100", "tf32", operands="converted") == 4.0
    assert fraction_round(BELOW_ONE, "tf32", "nearest_away") == 1.0  # cvt.rna's answer
    # Whole matrices: the bit-level matmul and the idealised profiles tell the same story.
    A, B = a4[None, :], a4[:, None]
    assert tensor_core_matmul(A, B, model="A100", inputs="tf32", operands="raw")[0, 0] == 4 * one
    assert tensor_core_matmul(A, B, model="A100", inputs="tf32")[0, 0] == 4.0
    assert matmul(A, B, "tf32-raw")[0, 0] == 4 * one
    assert matmul(A, B, "tf32")[0, 0] == 4.0


@settings(max_examples=200, deadline=None)
@given(st.floats(width=32, allow_nan=False, allow_infinity=False, min_value=-2.0**100,
                 max_value=2.0**100))
def test_raw_and_converted_tf32_operands_against_bit_level_oracles(x):
    """One product x·1: 'raw' keeps the masked word, 'converted' the nearest-away tf32 value."""
    raw = block_fma([x], [1.0], 0.0, "A100", "tf32", operands="raw")
    assert Fraction(float(raw)) == Fraction(top19(x).item())
    conv = block_fma([x], [1.0], 0.0, "A100", "tf32", operands="converted")
    want = fraction_round(x, "tf32", "nearest_away")
    assert float(conv) == want
    if x == float(top19(x)):  # already a tf32 value: every feed agrees
        assert raw == conv == block_fma([x], [1.0], 0.0, "A100", "tf32")


def test_profiles_name_their_tf32_operand_conversion():
    assert "cvt.rna" in describe("tf32") and "tf32 (nearest_away)" in describe("tf32")
    assert "truncation" in describe("tf32-raw") and "tf32 (toward_zero)" in describe("tf32-raw")
    assert "stored as  float32" in describe("tf32-raw")


@pytest.mark.parametrize("call, words", [
    (lambda: block_fma(ONE, ONE, 0.0, inputs="float32"),
     ["inputs='float32'", "V100", "valid choices: float16"]),
    (lambda: block_fma(ONE, ONE, 0.0, "V100", inputs="bfloat16"),
     ["inputs='bfloat16'", "V100", "valid choices: float16"]),
    (lambda: block_fma(ONE, ONE, 0.0, "T4", inputs="tf32"),
     ["inputs='tf32'", "T4", "valid choices: float16"]),
    (lambda: block_fma(ONE, ONE, 0.0, "A100", inputs="float8_e4m3fn"),
     ["inputs='float8_e4m3fn'", "valid choices: float16, bfloat16, tf32"]),
    (lambda: block_fma(ONE, ONE, 0.0, "A100", "tf32", operands="rna"),
     ["operands", "'rna'", "valid choices: " + ", ".join(OPERAND_FEEDS)]),
    (lambda: block_fma(ONE, ONE, 0.0, "A100", "float16", operands="raw"),
     ["operands='raw'", "inputs='float16'", "exact, converted"]),
    (lambda: block_fma([0.1], [1.0], 0.0, "A100", "tf32", operands="raw"),
     ["a must hold float32 values", "float32 words"]),
    (lambda: tensor_core_matmul(np.ones((2, 4)), np.ones((4, 2)), inputs="bfloat16"),
     ["inputs='bfloat16'", "valid choices: float16"]),
    (lambda: tensor_core_matmul(np.ones((2, 4)), np.ones((4, 2)), model="A100", operands="raw"),
     ["operands='raw'", "inputs='float16'"]),
])
def test_bad_tensor_core_arguments_name_parameter_value_and_choices(call, words):
    with pytest.raises(ValueError) as err:
        call()
    assert all(w in str(err.value) for w in words), str(err.value)
