"""The tensor-core block fused multiply-add at bit level, as measured by Fasi et al. (2021).

One mma step computes d = c + a_1 b_1 + ... + a_B b_B for a block of B products. On the
V100, T4 and A100 tensor cores, Fasi, Higham, Mikaitis and Pranesh found (PeerJ Computer
Science 7:e330; test programs in north-numerical-computing/tensor-cores-numerical-behavior):

1. the products a_i b_i are exact;
2. c and the products are aligned to the term of largest magnitude: with that term's
   exponent e_max, each significand keeps the bits down to 2^(e_max - 23 - g), where g
   extra alignment bits exist below float32's 24 (g = 0 on V100, g = 1 on T4 and A100), and
   the bits shifted out are cut off (truncation, toward zero);
3. the aligned terms are added as fixed-point numbers with no normalisation inside the block;
   extra bits above the leading bit hold the carries (their tests find three, enough for
   the five terms of a 4-product block; a model must have enough for its block size);
4. the block result is normalised once, truncating to float32 - so positive results round
   down and negative ones round up; with a float16 output it is then rounded to nearest.

FP8 inputs (E4M3, E5M2) follow the same steps with a narrower accumulator: DeepSeek-AI (2024)
found that Hopper's FP8 tensor cores keep only about 14 bits when they accumulate, and
promote partial sums into float32 on the CUDA cores every 128 elements of k to make up for
it. `acc_bits` sets the significand the block FMA keeps (24 for float32, 14 for "H100-FP8"),
and `tensor_core_matmul(..., promote_every=N_c)` adds the accumulator into a float32 sum
(round to nearest) and clears it every N_c elements. The 14 bits are DeepSeek-AI's finding;
the 32-product block, no extra alignment bit and truncation are this model's assumptions,
carried over from the earlier generations Fasi et al. measured.

Consequences they demonstrate, reproduced in tests/test_gpu_tensorcore.py: the sum starts
from the largest term whatever its position, tiny terms vanish next to a large one although
float32 could hold their sum, and the dot product is not monotonic (a larger c can give a
smaller d). Khattak and Mikaitis (2025) extend such models, bit-accurately, to H100 and B200
with wider blocks; `TensorCoreModel` takes the block size, g and carry bits as parameters.

How float32 data reach a tf32 tensor core is a separate choice (`operands`): software can
convert each value first with cvt.rna.tf32.f32 (round to nearest, ties away), or hand the
raw float32 words to the hardware, which reads only their top 19 bits (truncation toward
zero). Fasi et al.'s A100 tf32 test feeds raw words: (1 - 2^-24)^2 comes out as
(1 - 2^-11)^2 = 0.99902..., where converted operands give 1.0.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cache

import numpy as np

from ..checks import check_choice
from ..formats import FloatFormat, get_format
from ..rounding import round_to
from .arith import CONVERT_NUMPY_MAX
from .profiles import lookup

__all__ = [
    "OPERAND_FEEDS",
    "TENSOR_CORE_MODELS",
    "TensorCoreModel",
    "accumulator_format",
    "block_fma",
    "get_tensor_core_model",
    "tensor_core_matmul",
]

_ACC_PRECISION = 24  # float32 significand bits: the accumulator of the generations Fasi et al. measured
_OUTPUTS = ("float32", "float16")
_INPUTS = ("float16", "bfloat16", "tf32", "float8_e4m3fn", "float8_e5m2")
# How a and b reach the tensor core: "exact" (already values of the input format), "converted"
# (rounded by software first: cvt.rna for tf32, round-to-nearest-even for float16/bfloat16) or
# "raw" (float32 words loaded unconverted into tf32 fragments: the hardware truncates them).
OPERAND_FEEDS: tuple[str, ...] = ("exact", "converted", "raw")


@dataclass(frozen=True)
class TensorCoreModel:
    """Block FMA parameters: B products per block, g alignment bits, carry bits above the lead bit."""

    name: str
    block: int
    align_bits: int
    carry_bits: int
    description: str
    inputs: tuple[str, ...] = _INPUTS[:3]  # operand formats this generation's tensor cores take
    acc_bits: int = _ACC_PRECISION  # significant bits the block result keeps (float32: 24)

    def __post_init__(self):
        if isinstance(self.acc_bits, bool) or not isinstance(self.acc_bits, int) \
                or not 2 <= self.acc_bits <= _ACC_PRECISION:
            raise ValueError(f"acc_bits must be an integer from 2 to {_ACC_PRECISION} (float32's "
                             f"significand); got acc_bits={self.acc_bits!r}")
        # c and B products, each below 2^(e_max + 1), sum to less than (B + 1) 2^(e_max + 1):
        # the register needs ceil(log2(B + 1)) bits above the leading one to never overflow.
        if self.block < 1 or self.align_bits < 0 or self.align_bits > 20:
            raise ValueError(f"need block >= 1 and 0 <= align_bits <= 20; got block={self.block}, "
                             f"align_bits={self.align_bits}")
        if 2**self.carry_bits < self.block + 1:
            raise ValueError(
                f"{self.block}-product blocks need at least {(self.block).bit_length()} carry bits "
                f"to hold their sum; got carry_bits={self.carry_bits}"
            )
        for f in self.inputs:
            check_choice(f, "tensor-core input format", _INPUTS)


TENSOR_CORE_MODELS: dict[str, TensorCoreModel] = {
    m.name: m
    for m in (
        TensorCoreModel("V100", 4, 0, 3, "Volta: 4-product blocks, no extra alignment bit "
                        "(Fasi et al. 2021, binary16 inputs)", ("float16",)),
        TensorCoreModel("T4", 4, 1, 3, "Turing: 4-product blocks, one extra alignment bit "
                        "(Fasi et al. 2021, binary16 inputs)", ("float16",)),
        TensorCoreModel("A100", 4, 1, 3, "Ampere: one extra alignment bit for binary16, bfloat16 "
                        "and tf32 inputs (Fasi et al. 2021; their tests use 4-product blocks)"),
        TensorCoreModel("H100-FP8", 32, 0, 6, "Hopper FP8: E4M3/E5M2 inputs accumulated with "
                        "about 14 significant bits (DeepSeek-AI 2024); 32-product blocks, no "
                        "extra alignment bit and truncation assumed", _INPUTS[3:], 14),
    )
}


@cache
def accumulator_format(bits: int) -> FloatFormat:
    """The block FMA's result format: float32's exponent range with a `bits`-bit significand (24: float32)."""
    if bits == _ACC_PRECISION:
        return get_format("float32")
    m = bits - 1
    return FloatFormat(
        name=f"acc{bits}", exponent_bits=8, mantissa_bits=m, bias=127, has_inf=True,
        max_finite=(2 - 2.0**-m) * 2.0**127, min_normal=2.0**-126,
        min_subnormal=2.0**(-126 - m), eps=2.0**-m,
        description=f"tensor-core accumulator: float32 range, {bits}-bit significand")


def get_tensor_core_model(model: str | TensorCoreModel) -> TensorCoreModel:
    """The registered model of that name (a TensorCoreModel passes through)."""
    return lookup(TENSOR_CORE_MODELS, model, "tensor-core model", TensorCoreModel)


def _check_values(x: np.ndarray, fmt, name: str, hint: str = "round them first, e.g. with "
                  "precisionlab.rounding.round_to, or pass operands='converted'") -> None:
    """Raise unless every entry of x is already a value of fmt (the model takes hardware operands)."""
    # one rounding per value: the NumPy tier up to CONVERT_NUMPY_MAX values (no cold compile)
    bad = np.asarray(round_to(x, fmt, compiled=x.size > CONVERT_NUMPY_MAX)) != x
    if np.any(bad):
        raise ValueError(f"{name} must hold {get_format(fmt).name} values; {x[bad].ravel()[:3]} "
                         f"are not ({hint})")


def _check_inputs(m: TensorCoreModel, inputs, operands) -> str:
    """The input format's name, if model m takes it and `operands` is a feed that format allows."""
    name = inputs if isinstance(inputs, str) else getattr(inputs, "name", inputs)
    if name not in m.inputs:
        raise ValueError(f"inputs={inputs!r} is not an operand format of the {m.name} tensor-core "
                         f"model; valid choices: {', '.join(m.inputs)}")
    check_choice(operands, "operand feed (operands)", OPERAND_FEEDS)
    if operands == "raw" and name != "tf32":
        raise ValueError(f"operands='raw' (float32 words read by the tensor core) exists only for "
                         f"inputs='tf32'; got inputs={name!r}; valid choices for it: exact, converted")
    return name


def _feed(x: np.ndarray, inputs: str, operands: str, name: str) -> np.ndarray:
    """The operand as the tensor core multiplies it: checked ('exact'), fl_rna/fl_rne ('converted'), truncated ('raw')."""
    if operands == "exact":
        _check_values(x, inputs, name)
        return x
    # A conversion rounds each value once: on rounding's NumPy tier up to CONVERT_NUMPY_MAX
    # values, as RoundedAdder.convert does (cheaper than a cold compile there; the same bits).
    compiled = x.size > CONVERT_NUMPY_MAX
    if operands == "raw":
        _check_values(x, "float32", name, "raw operands are float32 words")
        return np.asarray(round_to(x, "tf32", "toward_zero", compiled=compiled), dtype=np.float64)
    mode = "nearest_away" if inputs == "tf32" else "nearest_even"
    return np.asarray(round_to(x, inputs, mode, compiled=compiled), dtype=np.float64)


def block_fma(a, b, c, model: str | TensorCoreModel = "V100", inputs: str = "float16",
              out: str = "float32", operands: str = "exact") -> np.ndarray:
    """d = c + sum_i a_i b_i with exact products, truncating alignment to the largest term, one truncating normalisation.

    a, b: (..., B') arrays with B' <= the model's block size; c: (...) array of `out` values.
    inputs: an operand format the model takes (V100, T4: float16; A100: float16, bfloat16,
    tf32). operands: "exact" (a, b already hold `inputs` values), "converted" (software
    rounds them first: nearest-away for tf32 as cvt.rna does, nearest-even otherwise) or
    "raw" (tf32 only: float32 words the hardware truncates to their top 19 bits).
    out: "float32" (truncated) or "float16" (the truncated float32 result, then rounded to
    nearest). Returns a float64 array of shape (...).
    """
    m = get_tensor_core_model(model)
    inputs = _check_inputs(m, inputs, operands)
    check_choice(out, "tensor-core output", _OUTPUTS)
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    c = np.asarray(c, dtype=np.float64)
    try:
        a, b = np.broadcast_arrays(a, b)
    except ValueError:
        raise ValueError(f"a and b must broadcast to one shape (..., block); got {a.shape} and {b.shape}") from None
    if a.ndim == 0:
        raise ValueError("a and b need a last axis holding the block's products")
    if a.shape[-1] > m.block:
        raise ValueError(f"{m.name} blocks hold at most {m.block} products; got {a.shape[-1]}")
    a = _feed(a, inputs, operands, "a")
    b = _feed(b, inputs, operands, "b")
    _check_values(c, out, "c", "round it to the output format first")
    results = math.prod(np.broadcast_shapes(a.shape[:-1], c.shape))  # the values rounded
    return _block_fma(a, b, c, m, out, compiled=results > CONVERT_NUMPY_MAX)


def _block_fma(a: np.ndarray, b: np.ndarray, c: np.ndarray, m: TensorCoreModel,
               out: str, compiled: bool) -> np.ndarray:
    """block_fma on operands already checked: a, b (..., B') of the input format, c (...) of `out`.

    compiled: whether the roundings may take rounding's numba tier (False: the caller's
    roundings come to at most CONVERT_NUMPY_MAX values, done sooner on NumPy's; the same bits).
    """
    prod = a * b  # exact: at most 2 x 11 significant bits (24 for tf32's raw feed)
    terms = np.concatenate([np.broadcast_to(c[..., None], (*prod.shape[:-1], 1)), prod], axis=-1)
    _, e = np.frexp(terms)  # |t| = f 2^e with f in [0.5, 1): floor(log2 |t|) = e - 1
    e = np.where(terms != 0, e - 1, np.iinfo(np.int32).min)
    e_max = e.max(axis=-1, keepdims=True)
    # The weight of the last kept bit; all-zero blocks get any finite weight.
    lsb = np.where(e_max > np.iinfo(np.int32).min, e_max - (m.acc_bits - 1) - m.align_bits, 0)
    fixed = np.trunc(np.ldexp(terms, -lsb))  # aligned significands, cut toward zero
    # Fixed-point sum, no normalisation: integers below 2^(acc_bits + g + carry_bits) <= 2^53, exact.
    # The carry bits (checked in TensorCoreModel) hold it, so no bit is lost before the end.
    total = fixed.sum(axis=-1)
    d = np.ldexp(total, lsb[..., 0])
    d = np.asarray(round_to(d, accumulator_format(m.acc_bits), "toward_zero", compiled=compiled),
                   dtype=np.float64)
    if out == "float16":
        d = np.asarray(round_to(d, "float16", "nearest_even", compiled=compiled),
                       dtype=np.float64)
    return d + 0.0  # no negative zeros from truncation


def tensor_core_matmul(a, b, c=None, model: str | TensorCoreModel = "V100",
                       inputs: str = "float16", out: str = "float32",
                       operands: str = "converted", promote_every: int | None = None) -> np.ndarray:
    """D = C + A·B as a chain of block FMAs along k (blocks of the model's size), bit-level.

    operands="converted" (default): a (m, k) and b (k, n) are rounded to `inputs` by software
    (nearest; tf32 by nearest-away, like cvt.rna.tf32.f32); "raw": float32 matrices handed to
    tf32 tensor cores unconverted, truncated by the hardware; "exact": already `inputs`
    values. c (m, n) defaults to zeros and is rounded to `out`. promote_every (a multiple of
    the block size; out="float32" only): every that many elements of k, the tensor-core
    accumulator is added into a float32 sum that starts at c (one rounding to nearest, as a
    CUDA-core add) and cleared, as DeepSeek-V3 does with N_c = 128; None chains every block
    through the accumulator.
    """
    m = get_tensor_core_model(model)
    inputs = _check_inputs(m, inputs, operands)
    A = _feed(np.asarray(a, dtype=np.float64), inputs, operands, "a")
    B = _feed(np.asarray(b, dtype=np.float64), inputs, operands, "b")
    if A.ndim != 2 or B.ndim != 2 or A.shape[1] != B.shape[0]:
        raise ValueError(f"need a (m, k) and b (k, n); got shapes {A.shape} and {B.shape}")
    d = np.zeros((A.shape[0], B.shape[1])) if c is None else np.asarray(c, dtype=np.float64)
    check_choice(out, "tensor-core output", _OUTPUTS)
    d = np.asarray(round_to(d, out, compiled=d.size > CONVERT_NUMPY_MAX), dtype=np.float64)
    if promote_every is not None:
        if isinstance(promote_every, bool) or not isinstance(promote_every, int) \
                or promote_every < m.block or promote_every % m.block:
            raise ValueError(f"promote_every must be a positive multiple of the {m.name} block "
                             f"size {m.block}, or None; got promote_every={promote_every!r}")
        if out != "float32":
            raise ValueError(f"promotion adds partial sums into float32: it needs out='float32'; "
                             f"got out={out!r}")
    total, k = d, A.shape[1]
    compiled = d.size * -(-k // m.block) > CONVERT_NUMPY_MAX  # accumulator roundings in all
    if promote_every is not None:
        d = np.zeros_like(total)
    for k0 in range(0, k, m.block):
        blk = slice(k0, k0 + m.block)
        d = _block_fma(A[:, None, blk], B.T[None, :, blk], d, m, out, compiled)
        end = min(k0 + m.block, k)
        if promote_every is not None and (end % promote_every == 0 or end == k):
            # Two float32 values summed in float64 and rounded once: the correctly rounded sum.
            total = np.asarray(round_to(total + d, "float32"), dtype=np.float64)
            d = np.zeros_like(d)
    return (total if promote_every is not None else d) + 0.0
