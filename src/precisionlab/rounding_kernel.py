"""The emulated back end of `rounding.round_to`: integer arithmetic on float32/float64 bit
patterns, one recipe in three tiers that give the same bits.

The recipe (`_round_word`): add a mode-dependent increment below the bits the target format
keeps, then clear them. Carries ripple into the exponent on their own, which is why it is
exact; a value below the format's smallest subnormal goes to 0 or to it, and overflow and the
special values follow the format's rules (`_finish`). Stochastic mode draws element i's 63
random bits from SplitMix64(seed + i). The tiers: `python_words` runs the recipe on Python ints
(a handful of values), `numpy_words` as whole-array NumPy operations, and `numba_kernel` builds
it as a fused numba loop, serial or parallel, from the same source (`_twin`), one build per mode
so that LLVM compiles only that mode's arithmetic. Float32 words rounded to nearest even into a
format whose emin is above float32's take a shorter route to the same bits
(`_nearest_word_f32`: float32 addition rounds onto the subnormal grid), and into float16 on
an x86-64 CPU with F16C the CPU's own conversion there and back (`_nearest_word_f16_hw`,
where `hardware_half`); both are checked against the recipe on all 2^32 float32 patterns
(``python tests/test_rounding_native.py --exhaustive``). Rounded stochastically, such words
take the recipe in 32-bit lanes (`_stochastic_word_f32`; checked the same way by
``python tests/test_rounding_stochastic_kernel.py --exhaustive``).
`word_params` gives the recipe's scalar arguments for a format in a container (`F32`,
`F64`); the mode codes are the modes' positions in `rounding.MODES`. Which tier runs depends on the input's length
alone (`emulate_into`, `emulate_mx_into`: what `rounding.round_to` calls).
"""

from __future__ import annotations

import functools
import types
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from .formats import FloatFormat

__all__ = [
    "DOWN",
    "F32",
    "F64",
    "NEAREST_AWAY",
    "NEAREST_EVEN",
    "NUMBA_MIN_SIZE",
    "PARALLEL_MIN_SIZE",
    "PYTHON_MAX_SIZE",
    "STOCHASTIC",
    "TOWARD_ZERO",
    "UP",
    "Container",
    "emulate_into",
    "emulate_mx_into",
    "hardware_half",
    "inline_word",
    "is_binary16",
    "nearest_params",
    "numba_kernel",
    "numpy_words",
    "python_words",
    "word_params",
]

# The mode codes the recipe branches on: each mode's position in rounding.MODES
# (nearest_even, nearest_away, toward_zero, up, down, stochastic).
NEAREST_EVEN, NEAREST_AWAY, TOWARD_ZERO, UP, DOWN, STOCHASTIC = range(6)


@dataclass(frozen=True)
class Container:
    """The binary float a computation is carried in: float32 or float64."""

    dtype: Any
    int_dtype: Any
    width: int  # W bits in a word
    mantissa_bits: int  # P stored fraction bits
    bias: int


F32 = Container(np.dtype(np.float32), np.dtype(np.int32), 32, 23, 127)
F64 = Container(np.dtype(np.float64), np.dtype(np.int64), 64, 52, 1023)


def _bits(value: float, c: Container) -> int:
    """The container's bit pattern of a non-negative value, as a Python int."""
    return int(np.array(value, dtype=c.dtype).view(c.int_dtype).item())


@functools.cache
def word_params(fmt: FloatFormat, c: Container, saturate: bool) -> tuple[int, ...]:
    """The scalar arguments of _round_word for fmt in container c, as Python ints."""
    exp_mask = ((1 << (c.width - 1 - c.mantissa_bits)) - 1) << c.mantissa_bits
    nan_bits = exp_mask | (1 << (c.mantissa_bits - 1))  # the quiet NaN
    max_bits = _bits(fmt.max_finite, c)
    if saturate:
        overflow_bits = inf_bits = max_bits
    else:
        overflow_bits = inf_bits = exp_mask if fmt.has_inf else nan_bits
    return (c.mantissa_bits, c.mantissa_bits - fmt.mantissa_bits, fmt.emin + c.bias,
            _bits(fmt.min_subnormal, c), _bits(fmt.min_subnormal / 2, c), max_bits,
            overflow_bits, inf_bits, nan_bits, exp_mask, -(1 << (c.width - 1)))


def _splitmix64(z):
    """One SplitMix64 output for state z (uint64): a well-mixed 64-bit hash of a counter."""
    z = z + np.uint64(0x9E3779B97F4A7C15)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


def _increment(mag, rnd, mask, lsb, neg, mode):
    """What to add below the kept bits before clearing them (mask = the dropped bits)."""
    half_m1 = mask >> 1
    # "away" = a directed mode that moves this sign's magnitude away from zero.
    away = ((mode == 3) & (not neg)) | ((mode == 4) & neg)
    inc = 0
    inc = half_m1 + lsb if mode == 0 else inc  # ties to even: half - 1, + 1 if the lsb is odd
    inc = half_m1 + 1 if mode == 1 else inc  # ties away: exactly half
    inc = (mask if away else 0) if (mode == 3) | (mode == 4) else inc
    return (rnd & mask) if mode == 5 else inc  # uniform in [0, 2^sh): P(up) = dropped / 2^sh


def _finish(r, mag, neg, max_bits, overflow_bits, inf_bits, nan_bits, exp_mask, sign_value, mode):
    """Apply overflow and special-value rules to the rounded magnitude r, then the sign."""
    # Overflow: directed modes toward zero stop at the largest finite value.
    toward = (mode == 2) | ((mode == 3) & neg) | ((mode == 4) & (not neg))
    r = (max_bits if toward else overflow_bits) if r > max_bits else r
    r = (inf_bits if mag == exp_mask else nan_bits) if mag >= exp_mask else r
    return (r + sign_value) if neg else r


def _round_word(v, rnd, mant_bits, shift_base, emin_b, qmin, half_qmin, max_bits,
                overflow_bits, inf_bits, nan_bits, exp_mask, sign_value, mode):
    """Bits of fl(x) for one word v: |x| rounded to a multiple of 2^sh container ulps.

    Written with selects, not branches, so that LLVM vectorises the loop that calls it.
    rnd: 63 uniform random bits (used by stochastic mode only).
    """
    neg = v < 0
    mag = v & ~sign_value  # clear the sign bit (sign_value is -2^(W-1))
    big_e = mag >> mant_bits
    e_eff = max(big_e, 1)  # subnormals share the smallest normal exponent
    # Bits to drop: the precision gap, plus one per binade below the target's emin.
    sh = shift_base + max(emin_b - e_eff, 0)
    tiny = sh > mant_bits  # |x| below the smallest subnormal q: the answer is 0 or q
    shc = min(sh, mant_bits)
    mask = (1 << shc) - 1
    implicit = 1 << mant_bits
    # The kept part's last bit; or-ing in the implicit bit matters when sh == P.
    lsb = ((mag | implicit) >> shc) & 1
    r = (mag + _increment(mag, rnd, mask, lsb, neg, mode)) & ~mask
    # Tiny inputs: compare with q/2, or for stochastic draw up with P = |x|/q = sig / 2^sh.
    away = ((mode == 3) & (not neg)) | ((mode == 4) & neg)
    sig = (mag & (implicit - 1)) | (implicit if big_e > 0 else 0)
    thr = (sig << max(63 - sh, 0)) >> min(max(sh - 63, 0), 63)
    up = mag > half_qmin
    up = (mag >= half_qmin) if mode == 1 else up
    up = False if mode == 2 else up
    up = (away & (mag != 0)) if (mode == 3) | (mode == 4) else up
    up = (rnd < thr) if mode == 5 else up
    r = (qmin if up else 0) if tiny else r
    return _finish(r, mag, neg, max_bits, overflow_bits, inf_bits, nan_bits, exp_mask,
                   sign_value, mode)


def _round_word_uniform(v, rnd, mant_bits, shift_base, emin_b, qmin, half_qmin, max_bits,
                        overflow_bits, inf_bits, nan_bits, exp_mask, sign_value, mode):
    """_round_word when fmt's emin is the container's own (bf16, tf32 from float32).

    Then every finite input drops exactly shift_base bits and none is below fmt's smallest
    subnormal, so the per-element shift and the tiny case disappear (about 1.6x faster).
    """
    neg = v < 0
    mag = v & ~sign_value
    mask = (1 << shift_base) - 1
    lsb = (mag >> shift_base) & 1
    r = (mag + _increment(mag, rnd, mask, lsb, neg, mode)) & ~mask
    return _finish(r, mag, neg, max_bits, overflow_bits, inf_bits, nan_bits, exp_mask,
                   sign_value, mode)


def _nearest_word_f32(v, x, shift_base, min_normal_bits, magic, max_bits, overflow_bits,
                      inf_bits, nan_bits, exp_mask, sign_value):
    """_round_word's nearest-even bits for a float32 word v (x: the same value as a float32).

    The same rounding by a shorter route, for formats whose emin is above float32's: from
    fmt's smallest normal up every value drops exactly shift_base bits (as in
    _round_word_uniform); below it, float32 addition itself rounds to the subnormal grid:
    magic = 2^(emin - m + 23) has ulp 2^(emin - m), the format's smallest subnormal, so
    (|x| + magic) - magic is |x| rounded to nearest even on that grid (the subtraction is
    exact, Sterbenz). No per-element shift, no tiny case: about twice as fast, and held to
    _round_word on every float32 bit pattern (tests/test_rounding_native.py).
    """
    neg = v < 0
    mag = v & ~sign_value
    mask = (1 << shift_base) - 1
    r = (mag + (mask >> 1) + ((mag >> shift_base) & 1)) & ~mask
    small = _float_bits((abs(x) + magic) - magic)  # noqa: F821 - bound by _inline_helpers
    r = small if mag < min_normal_bits else r
    return _finish(r, mag, neg, max_bits, overflow_bits, inf_bits, nan_bits, exp_mask,
                   sign_value, 0)


def _nearest_word_f16_hw(v, x, max_bits, overflow_bits, inf_bits, nan_bits, exp_mask,
                         sign_value):
    """_round_word's float16 nearest-even bits for a float32 word v, by the CPU's own casts.

    |x| goes to IEEE binary16 and back (`_via_half`: the F16C conversions vcvtps2ph/vcvtph2ps,
    8 lanes wide with AVX2 and 16 with AVX-512, or AVX512-FP16's vcvtps2phx/vcvtph2psx where
    the CPU has those): nearest even under the default rounding mode, subnormals kept,
    overflow to inf, which is fl(|x|) exactly. Only the special values and the sign are the
    package's own (`_finish`): overflow becomes overflow_bits (inf, or max_finite when
    saturating), NaN the quiet NaN. Built only where `hardware_half` says so; held to
    _round_word on every float32 bit pattern (tests/test_rounding_native.py).
    """
    neg = v < 0
    mag = v & ~sign_value
    r = _float_bits(_via_half(abs(x)))  # noqa: F821 - bound by _inline_helpers
    return _finish(r, mag, neg, max_bits, overflow_bits, inf_bits, nan_bits, exp_mask,
                   sign_value, 0)


def _stochastic_word_f32(v, rnd, shift_base, emin_b, qmin, max_bits, overflow_bits, inf_bits,
                         nan_bits, exp_mask, sign_value):
    """_round_word's stochastic bits for a float32 word v, in 32-bit lanes where it can be.

    The same recipe for float32 words (P = 23): numba types integer arithmetic as int64, so
    the generic word runs every lane 64 bits wide (16 lanes in two AVX-512 registers); here
    the shift, mask, add and clear steps are cut back to int32, 16 lanes in one register, and
    the dropped-bits mask is a 32-bit shift (`_shl32`). The SplitMix64 draw stays 64-bit, and
    so does the tiny case, which needs the draw's 63 bits: its threshold
    sig 2^(63 - sh) is computed as (sig 2^39) >> (sh - 24), the same integer for every
    sh >= 24 (sig < 2^24, so a right shift of at most 39 drops only zeros, and a longer one
    is the floor the recipe's right shift takes). About 1.3x the generic loop; held to it on
    every float32 bit pattern (tests/test_rounding_stochastic_kernel.py).
    """
    i32 = np.int32
    neg = v < 0
    mag = i32(v & i32(0x7FFFFFFF))
    big_e = i32(mag >> i32(23))
    sh = i32(shift_base + max(i32(emin_b - max(big_e, i32(1))), i32(0)))
    tiny = sh > i32(23)
    mask = i32(_shl32(i32(1), min(sh, i32(23))) - i32(1))  # noqa: F821 - bound by _inline_helpers
    r = i32(i32(mag + i32(i32(rnd) & mask)) & ~mask)  # i32(rnd): the draw's low 32 bits
    sig = i32(i32(mag & i32(0x7FFFFF)) | (i32(0x800000) if big_e > i32(0) else i32(0)))
    thr = (np.int64(sig) << np.int64(39)) >> np.int64(min(max(i32(sh - i32(24)), i32(0)), i32(63)))
    r = (qmin if rnd < thr else i32(0)) if tiny else r
    return _finish(r, mag, neg, max_bits, overflow_bits, inf_bits, nan_bits, exp_mask,
                   sign_value, 5)


def _deterministic_loop(src, dst, mant_bits, shift_base, emin_b, qmin, half_qmin, max_bits,
                        overflow_bits, inf_bits, nan_bits, exp_mask, sign_value):
    """dst = bits of fl(src) in mode MODE (0-4); int32/int64 views of floats.

    MODE and WORD (the container's integer type) are bound when numba_kernel builds the loop,
    so each build is compiled for one mode and LLVM drops the other modes' selects.
    """
    for i in numba.prange(src.size):  # noqa: F821 - bound by numba_kernel's globals
        dst[i] = _round_word(WORD(src[i]), WORD(0), mant_bits, shift_base,  # noqa: F821
                             emin_b, qmin, half_qmin, max_bits, overflow_bits, inf_bits,
                             nan_bits, exp_mask, sign_value, MODE)  # noqa: F821


def _mode_loop(src, dst, mant_bits, shift_base, emin_b, qmin, half_qmin, max_bits,
               overflow_bits, inf_bits, nan_bits, exp_mask, sign_value, mode):
    """_deterministic_loop with the mode (1-4) an argument: one build serves four modes."""
    for i in numba.prange(src.size):  # noqa: F821 - bound by numba_kernel's globals
        dst[i] = _round_word(WORD(src[i]), WORD(0), mant_bits, shift_base,  # noqa: F821
                             emin_b, qmin, half_qmin, max_bits, overflow_bits, inf_bits,
                             nan_bits, exp_mask, sign_value, mode)


def _stochastic_loop(src, dst, mant_bits, shift_base, emin_b, qmin, half_qmin, max_bits,
                     overflow_bits, inf_bits, nan_bits, exp_mask, sign_value, seed):
    """dst = bits of stochastically rounded src; element i draws SplitMix64(seed + i)."""
    for i in numba.prange(src.size):  # noqa: F821 - bound by numba_kernel's globals
        rnd = np.int64(_splitmix64(np.uint64(seed) + np.uint64(i)) >> np.uint64(1))
        dst[i] = _round_word(WORD(src[i]), rnd, mant_bits, shift_base,  # noqa: F821
                             emin_b, qmin, half_qmin, max_bits, overflow_bits, inf_bits,
                             nan_bits, exp_mask, sign_value, 5)


def _stochastic_f32_loop(src, dst, mant_bits, shift_base, emin_b, qmin, half_qmin, max_bits,
                         overflow_bits, inf_bits, nan_bits, exp_mask, sign_value, seed):
    """_stochastic_loop for float32 words and a format whose emin is above float32's, by
    _stochastic_word_f32 (the same arguments; mant_bits and half_qmin unused)."""
    for i in numba.prange(src.size):  # noqa: F821 - bound by numba_kernel's globals
        rnd = np.int64(_splitmix64(np.uint64(seed) + np.uint64(i)) >> np.uint64(1))
        dst[i] = _stochastic_word_f32(src[i], rnd, shift_base, emin_b, qmin, max_bits,
                                      overflow_bits, inf_bits, nan_bits, exp_mask, sign_value)


def _nearest_f32_loop(x, src, dst, shift_base, min_normal_bits, magic, max_bits,
                      overflow_bits, inf_bits, nan_bits, exp_mask, sign_value):
    """dst = bits of fl(x) to nearest even by _nearest_word_f32; src is x's int32 view."""
    for i in numba.prange(src.size):  # noqa: F821 - bound by numba_kernel's globals
        dst[i] = _nearest_word_f32(src[i], x[i], shift_base, min_normal_bits, magic, max_bits,
                                   overflow_bits, inf_bits, nan_bits, exp_mask, sign_value)


def _nearest_f16_hw_loop(x, src, dst, shift_base, min_normal_bits, magic, max_bits,
                         overflow_bits, inf_bits, nan_bits, exp_mask, sign_value):
    """_nearest_f32_loop for float16 by _nearest_word_f16_hw (the same arguments; the first
    three scalars unused)."""
    for i in numba.prange(src.size):  # noqa: F821 - bound by numba_kernel's globals
        dst[i] = _nearest_word_f16_hw(src[i], x[i], max_bits, overflow_bits,
                                      inf_bits, nan_bits, exp_mask, sign_value)


def _twin(fn, name: str, **replace_globals):
    """fn under another name, optionally calling other helpers: one source, several builds.

    The new name keeps numba's on-disk cache entries apart; replaced globals let the same
    source call jitted helpers, or _round_word_uniform instead of _round_word.
    """
    code = fn.__code__.replace(co_name=name)
    if hasattr(code, "co_qualname"):  # Python >= 3.11
        code = code.replace(co_qualname=name)
    twin = types.FunctionType(code, {**fn.__globals__, **replace_globals}, name,
                              fn.__defaults__, fn.__closure__)
    twin.__doc__ = fn.__doc__
    return twin


_KERNELS: dict[tuple, Any] = {}  # compiled on first use


def _bit_casts(numba):
    """numba intrinsics: float32 bits as int32 (free: no instruction), float32 through
    binary16 and back (LLVM's fptrunc/fpext to half: F16C instructions where `hardware_half`),
    and an int32 shift left that stays 32 bits wide (numba's own `<<` widens to int64; the
    caller keeps the count in 0..31, since LLVM leaves a longer shift undefined)."""
    from llvmlite import ir
    from numba.core import types as nt
    from numba.extending import intrinsic

    @intrinsic
    def _float_bits(typingctx, x):
        if x != nt.float32:
            return None
        return nt.int32(nt.float32), lambda ctx, b, sig, args: b.bitcast(args[0], ir.IntType(32))

    @intrinsic
    def _via_half(typingctx, x):
        if x != nt.float32:
            return None

        def codegen(ctx, b, sig, args):
            return b.fpext(b.fptrunc(args[0], ir.HalfType()), ir.FloatType())
        return nt.float32(nt.float32), codegen

    @intrinsic
    def _shl32(typingctx, a, n):
        if a != nt.int32 or n != nt.int32:
            return None
        return nt.int32(nt.int32, nt.int32), lambda ctx, b, sig, args: b.shl(args[0], args[1])

    return {"_float_bits": _float_bits, "_via_half": _via_half, "_shl32": _shl32}


def is_binary16(fmt: FloatFormat) -> bool:
    """Whether fmt's grid is IEEE binary16's up to 65504 (float16: what `_via_half` rounds to)."""
    return (fmt.mantissa_bits, fmt.emin, fmt.max_finite) == (10, -14, 65504.0)


@functools.cache
def hardware_half() -> bool:
    """Whether float16 nearest-even takes the CPU's casts (`_nearest_word_f16_hw`).

    Yes on an x86-64 CPU with F16C (detected at run time: Intel Core and Xeon since Ivy
    Bridge, 2012, but not the AVX-less Pentium, Celeron and Atom parts; AMD since Piledriver
    and Jaguar) when numba compiles for the host: there LLVM turns the round trip into
    vcvtps2ph/vcvtph2ps, which round to nearest even under the default (MXCSR) rounding mode
    that numba's float arithmetic assumes everywhere (the integer loop's subnormal step is a
    float addition too), keep float16 subnormals, and whose bits FTZ and DAZ do not change
    (FTZ is ignored; a float32 subnormal read as zero rounds to zero anyway). No elsewhere:
    other CPUs, and whenever NUMBA_CPU_NAME or NUMBA_CPU_FEATURES is set at all (numba then
    compiles for that target, even an empty one, and without F16C LLVM emits calls to
    compiler-runtime routines that numba does not provide: the first call would crash).
    Those machines keep the integer loop, which gives the same bits.
    """
    import platform

    from llvmlite import binding
    from numba.core import config

    if platform.machine().lower() not in ("x86_64", "amd64"):
        return False
    if config.CPU_NAME is not None or config.CPU_FEATURES is not None:  # numba's own test
        return False
    return bool(binding.get_host_cpu_features().get("f16c", False))


@functools.cache
def _inline_helpers() -> dict[str, Any]:
    """The recipe's helpers jitted for inlining (numba imported here, on first use)."""
    import numba  # deferred: only arrays of 4096+ values need it (0.7 s to import)

    inline = numba.njit(inline="always")
    jitted: dict[str, Any] = _bit_casts(numba)
    for fn in (_splitmix64, _increment, _finish, _round_word, _round_word_uniform,
               _nearest_word_f32, _nearest_word_f16_hw, _stochastic_word_f32):
        jitted[fn.__name__] = inline(_twin(fn, fn.__name__, **jitted))
    return jitted


def inline_word():
    """`_round_word`, the one rounding recipe, jitted for inlining into other numba kernels.

    `intervals.torch_ops.fused` rounds interval ends down and up with it, and
    `emulate.kernels` rounds to nearest even with it, so every compiled rounding in the package
    is this recipe. Its arguments are `word_params`' (for `F64` words) and a mode code.
    numba's on-disk cache keys a kernel by its own file, so after editing this recipe clear
    the callers' caches (``find src -name '*.nbi' -delete``).
    """
    return _inline_helpers()["_round_word"]


@functools.cache
def nearest_params(fmt: FloatFormat, saturate: bool) -> tuple:
    """_nearest_f32_loop's scalar arguments for fmt (float32 words, emin above float32's)."""
    (_, shift_base, _, _, _, max_bits, overflow_bits, inf_bits, nan_bits, exp_mask,
     sign_value) = word_params(fmt, F32, saturate)
    magic = np.float32(2.0 ** (fmt.emin - fmt.mantissa_bits + F32.mantissa_bits))
    return (shift_base, _bits(fmt.min_normal, F32), magic, max_bits, overflow_bits, inf_bits,
            nan_bits, exp_mask, sign_value)


def runtime_mode(mode: int, c: Container) -> bool:
    """Whether mode's float-c loop takes the mode as an argument (`_mode_loop`) rather than a build of its own.

    float64 inputs in the four modes besides nearest-even share one build: a chapter that
    rounds float64 arrays down and up pays one cold compile (about 0.5-1 s) instead of one
    per mode, for a loop about half as fast (1 ms per million values); the float32 loops,
    the hot ones, stay built per mode.
    """
    return c is F64 and mode in (NEAREST_AWAY, TOWARD_ZERO, UP, DOWN)


def numba_kernel(mode: int, uniform: bool, parallel: bool, c: Container = F64,
                 half: bool = False, narrow: bool = True):
    """The numba build of one loop variant, compiled or loaded from numba's cache on first use.

    mode: a mode code (the loop is built for that mode alone, except where `runtime_mode`:
    then the mode is its last argument); uniform: fmt's emin is the container's own; c: the
    container (its words are int32 or int64). Float32 words rounded
    to nearest even into a non-uniform format take `_nearest_f32_loop`, whose arguments are
    the float32 array, its int32 view, the output view and `nearest_params`; half=True
    builds `_nearest_f16_hw_loop` instead (the same arguments; float16 only, and only where
    `hardware_half`). Float32 words rounded stochastically into a non-uniform format take
    `_stochastic_f32_loop` (32-bit lanes; the same arguments as `_stochastic_loop`), unless
    narrow=False, which builds the generic `_stochastic_loop` (for the tests that hold one
    to the other).
    """
    nearest32 = mode == NEAREST_EVEN and not uniform and c is F32
    half = half and nearest32
    narrow = narrow and mode == STOCHASTIC and not uniform and c is F32
    runtime = runtime_mode(mode, c)
    key = ("any" if runtime else mode, uniform, parallel, c.width, half, narrow)
    if key not in _KERNELS:
        import numba

        jitted = _inline_helpers()
        word = jitted["_round_word_uniform" if uniform else "_round_word"]
        if half:
            loop, tag = _nearest_f16_hw_loop, ""
        elif nearest32:
            loop, tag = _nearest_f32_loop, ""
        elif narrow:
            loop, tag = _stochastic_f32_loop, ""
        elif mode == STOCHASTIC:
            loop, tag = _stochastic_loop, ""
        elif runtime:
            loop, tag = _mode_loop, ""
        else:
            loop, tag = _deterministic_loop, f"_{mode}"
        name = (f"{loop.__name__}{tag}{'_uniform' if uniform else ''}_f{c.width}"
                f"{'_parallel' if parallel else '_serial'}")
        word_type = np.int32 if c is F32 else np.int64
        _KERNELS[key] = numba.njit(parallel=parallel, cache=True)(
            _twin(loop, name, numba=numba, _splitmix64=jitted["_splitmix64"], _round_word=word,
                  _nearest_word_f32=jitted["_nearest_word_f32"],
                  _nearest_word_f16_hw=jitted["_nearest_word_f16_hw"],
                  _stochastic_word_f32=jitted["_stochastic_word_f32"], MODE=mode,
                  WORD=word_type))
    return _KERNELS[key]


def python_words(src, dst, params, mode, seed, uniform):
    """dst = bits of fl(src), running _round_word on Python ints: quickest for a few values."""
    word = _round_word_uniform if uniform else _round_word
    if mode == STOCHASTIC:  # element i draws SplitMix64(seed + i), as in _stochastic_loop
        counter = np.arange(src.size, dtype=np.uint64)
        counter += np.uint64(seed)
        rnds = (_splitmix64(counter) >> np.uint64(1)).astype(np.int64).tolist()
    else:
        rnds = [0] * src.size
    dst[:] = [word(v, rnd, *params, mode) for v, rnd in zip(src.tolist(), rnds, strict=True)]


def numpy_words(src, dst, mant_bits, shift_base, emin_b, qmin, half_qmin, max_bits,
                 overflow_bits, inf_bits, nan_bits, exp_mask, sign_value, mode, seed, uniform):
    """dst = bits of fl(src): _round_word's recipe as whole-array NumPy operations."""
    it = src.dtype.type  # int32 words for float32 (finite sums stay below 2^31), int64 else
    neg = src < 0
    mag = src & it(~sign_value)
    rnd = None
    if mode == STOCHASTIC:  # element i draws SplitMix64(seed + i), as in _stochastic_loop
        counter = np.arange(src.size, dtype=np.uint64)
        counter += np.uint64(seed)
        rnd = (_splitmix64(counter) >> np.uint64(1)).astype(np.int64)
    implicit = 1 << mant_bits
    if uniform:
        sh = shc = it(shift_base)
        tiny = None
    else:
        sh = np.maximum(emin_b - np.maximum(mag >> mant_bits, it(1)), it(0))
        sh += it(shift_base)
        tiny = sh > mant_bits
        shc = np.minimum(sh, it(mant_bits))
    mask = (it(1) << shc) - it(1)
    away = (~neg if mode == UP else neg) if mode in (UP, DOWN) else None
    if mode == NEAREST_EVEN:
        inc = (mask >> it(1)) + (((mag | implicit) >> shc) & it(1))
    elif mode == NEAREST_AWAY:
        inc = (mask >> it(1)) + it(1)
    elif mode == TOWARD_ZERO:
        inc = it(0)
    elif away is not None:
        inc = mask * away.astype(it)
    else:
        inc = (rnd & mask).astype(it)
    r = mag + inc  # NaN and inf patterns may wrap around here; they are replaced below
    r &= ~mask
    if tiny is not None and tiny.any():
        # |x| below fmt's smallest subnormal q: 0 or q, as in _round_word.
        t = np.flatnonzero(tiny)
        m = mag[t].astype(np.int64)
        if mode == NEAREST_EVEN:
            up = m > half_qmin
        elif mode == NEAREST_AWAY:
            up = m >= half_qmin
        elif mode == TOWARD_ZERO:
            up = np.zeros(t.size, dtype=bool)
        elif away is not None:
            up = away[t] & (m != 0)
        else:
            sh_t = sh[t].astype(np.int64)
            sig = (m & (implicit - 1)) | np.where(m >> mant_bits > 0, implicit, 0)
            thr = (sig << np.maximum(63 - sh_t, 0)) >> np.minimum(np.maximum(sh_t - 63, 0), 63)
            up = rnd[t] < thr
        r[t] = np.where(up, it(qmin), it(0))
    over = r > max_bits
    if mode == TOWARD_ZERO:  # directed toward zero: stop at max_finite
        np.copyto(r, it(max_bits), where=over)
    elif away is not None:
        np.copyto(r, it(max_bits), where=over & ~away)
        np.copyto(r, it(overflow_bits), where=over & away)
    else:
        np.copyto(r, it(overflow_bits), where=over)
    np.copyto(r, it(inf_bits), where=mag == exp_mask)
    np.copyto(r, it(nan_bits), where=mag > exp_mask)
    np.add(r, it(sign_value), out=dst, where=neg)
    np.copyto(dst, r, where=~neg)


# --------------------------------------------------------------------------- which tier runs


# The tier is a function of the input's length (all tiers give the same bits; only speed
# differs). numba is the third tier: a cold compile costs about 0.3-1 s per kernel variant
# (the first load from numba's on-disk cache in a process about 0.6 s, later variants
# 10-30 ms), while NumPy rounds about 15 ns per value plus 20 us per call and numba is
# 20-40x faster per value. Programs that round arrays of thousands of values do it
# thousands of times (chapter 6's training rounds 4k-64k values some 50,000 times: 18 s on
# NumPy, 3 s on numba, measured on a busy two-core machine), so from 4096 values on numba
# takes over; the many short roundings of the other chapters (a few dozen values per call)
# stay on NumPy.
PYTHON_MAX_SIZE = 4  # up to this many values, plain Python ints beat both array tiers
NUMBA_MIN_SIZE = 1 << 12
# Threads pay off only on long arrays: waking them costs milliseconds on a busy machine,
# and each parallel build is one more cold compile (about 0.5-0.7 s) for a gain of 0.01-0.05
# ms per call below a million values (measured on two cores), so shorter inputs take the
# serial build.
PARALLEL_MIN_SIZE = 1 << 20


def emulate_into(a: np.ndarray, out: np.ndarray, fmt: FloatFormat, code: int, generator,
                 saturate: bool, compiled: bool = True) -> None:
    """Write fl(a) into out by the add-then-clear recipe: Python, NumPy or numba tier
    (`compiled=False`: never numba, for one-off roundings a cold compile would not pay for)."""
    c = F32 if a.dtype == np.float32 else F64
    src, dst = a.view(c.int_dtype).ravel(), out.view(c.int_dtype).reshape(-1)
    params = word_params(fmt, c, saturate)
    uniform = fmt.emin + c.bias <= 1  # fmt's normal range reaches down to the container's
    seed = int(generator.integers(0, 2**63)) if code == STOCHASTIC else 0
    if a.size <= PYTHON_MAX_SIZE:
        python_words(src, dst, params, code, seed, uniform)
        return
    if a.size < NUMBA_MIN_SIZE or not compiled:
        numpy_words(src, dst, *params, code, seed, uniform)
        return
    numba_into(a, src, dst, fmt, code, params, seed, uniform, saturate, c)


def numba_into(a, src, dst, fmt: FloatFormat, code: int, params: tuple, seed: int,
               uniform: bool, saturate: bool, c: Container) -> None:
    """emulate_into's numba tier: the serial or parallel build for this mode and container."""
    # Follow torch's thread setting: one thread there means serial here too. numba's OpenMP
    # layer resets the process-wide OpenMP thread count, which torch shares, so it is put back.
    torch_threads = torch.get_num_threads()
    parallel = a.size >= PARALLEL_MIN_SIZE and torch_threads > 1
    half = code == NEAREST_EVEN and c is F32 and is_binary16(fmt) and hardware_half()
    kernel = numba_kernel(code, uniform, parallel, c, half)
    if code == NEAREST_EVEN and not uniform and c is F32:
        kernel(a.reshape(-1), src, dst, *nearest_params(fmt, saturate))
    elif code == STOCHASTIC:
        kernel(src, dst, *(c.int_dtype.type(p) for p in params), seed)
    elif runtime_mode(code, c):
        kernel(src, dst, *(c.int_dtype.type(p) for p in params), c.int_dtype.type(code))
    else:
        kernel(src, dst, *(c.int_dtype.type(p) for p in params))
    if parallel and torch.get_num_threads() != torch_threads:
        torch.set_num_threads(torch_threads)


def emulate_mx_into(a: np.ndarray, out: np.ndarray, fmt: FloatFormat, code: int, generator,
                    saturate: bool, compiled: bool = True) -> None:
    """fl(a) for the MX formats: float4/float6 saturate (no inf, no NaN); e8m0fnu is 2^k > 0 or NaN."""
    if fmt.signed:  # float4_e2m1fn, float6_*: overflow and +-inf can only go to +-max_finite
        emulate_into(a, out, fmt, code, generator, True, compiled)
        return  # a NaN input stays NaN: the format has no NaN, and ml_dtypes' zero would hide it
    # float8_e8m0fnu: 2^-127 is a float32 subnormal, below the kernel's float32 range, so the
    # kernel runs in float64, where e8m0fnu's grid is a 0-bit-mantissa format with emin = -127.
    with np.errstate(invalid="ignore"):  # signalling NaNs widen quietly: they become NaN (0xFF)
        wide = a.astype(np.float64)
    r = np.empty_like(wide)
    emulate_into(wide, r, fmt, code, generator, saturate, compiled)
    r[r == 0] = fmt.min_normal  # below 2^-127 there is no zero to round to: the smallest value
    r[~(wide > 0)] = np.nan  # 0, -0, negatives and NaN have no encoding: NaN (0xFF), as ml_dtypes
    np.copyto(out, r, casting="unsafe")  # every value 2^-127..2^127 is a float32: exact
