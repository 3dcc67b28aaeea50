"""Rounding real numbers into a float format: fl(x) for six rounding modes, ulp and neighbours.

Two back ends give bit-identical answers:

* **native** (`rounding_native`) — where a library already casts exactly (round-to-nearest-
  even from float32 into float16, bfloat16 and the float8 formats with torch, float64 into
  float32 with NumPy), casting there and back, NaNs given the kernel's pattern.
* **emulated** — integer arithmetic on the bit patterns: add a mode-dependent increment
  below the kept bits, then clear them. Carries ripple into the exponent on their own, which
  is why this recipe is exact. It covers everything the libraries lack (tf32, nearest-away,
  directed and stochastic modes, float64 inputs without double rounding, non-saturating
  e4m3fn, saturating IEEE formats). Its three tiers (`rounding_kernel`: Python ints, NumPy
  below 4096 values, a numba loop from 4096 on, parallel from 2^20 on several threads; the
  float16 nearest-even loop converts in hardware where the CPU has F16C) differ only in
  speed and are picked by the input's length alone, so short arrays never wait for a
  compiler and no call depends on earlier ones. Each element is rounded on its own, and
  stochastic mode draws element i from SplitMix64(seed + i): results do not depend on the
  tier, the thread count or the CPU (under the default round-to-nearest floating-point
  environment, which Python and torch never change).

`backend="auto"` uses the native cast for float32 targets and for float32 inputs below 4096
values (a float32 CPU tensor is cast in torch, without NumPy), and the kernel elsewhere: a
round trip through torch's narrow dtypes is two casts and a temporary, faster than NumPy
on short arrays and slower than the kernel's single pass from 4096 values on (see
benchmarks/bench_rounding.py); the tests hold both back ends to the oracles, and to each
other on every float32 bit pattern (tests/test_rounding_native.py).

Inputs may be NumPy arrays, Python scalars or torch tensors; the result is of the same kind.
float32 and float64 inputs keep their dtype; narrower float inputs are widened to float32
first (exactly), since the rounded values need not fit the input's own format.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from .checks import check_choice
from .exact import as_float64
from .formats import FORMATS, get_format
from .plan import numpy_planned
from .rounding_kernel import (
    DOWN,
    NEAREST_AWAY,
    NEAREST_EVEN,
    STOCHASTIC,
    TOWARD_ZERO,
    UP,
    emulate_into,
    emulate_mx_into,
)
from .rounding_native import auto_takes_native, native_cast, native_tensor

__all__ = [
    "DETERMINISTIC_MODES",
    "MODES",
    "BitFields",
    "RoundingTrace",
    "check_mode",
    "decompose",
    "next_down",
    "next_up",
    "round_to",
    "rounding_trace",
    "seed_generator",
    "ulp",
]

MODES: tuple[str, ...] = ("nearest_even", "nearest_away", "toward_zero", "up", "down", "stochastic")
DETERMINISTIC_MODES: tuple[str, ...] = MODES[:-1]
BACKENDS = ("auto", "native", "emulated")


def check_mode(mode: str, stochastic: bool = False) -> str:
    """mode if it is a rounding mode (stochastic only where allowed), else ValueError naming them.

    Parameters
    ----------
    mode : str
        The name to check: one of `DETERMINISTIC_MODES`, or "stochastic" when allowed.
    stochastic : bool, default False
        Whether "stochastic" is allowed.

    Returns
    -------
    str
        mode, unchanged.

    Raises
    ------
    ValueError
        If mode is not a (permitted) rounding mode; the message lists the valid ones.

    Examples
    --------
    >>> from precisionlab.rounding import check_mode
    >>> check_mode("up"), check_mode("stochastic", stochastic=True)
    ('up', 'stochastic')
    >>> check_mode("stochastic")
    Traceback (most recent call last):
        ...
    ValueError: unknown rounding mode 'stochastic'; valid choices: nearest_even, nearest_away, toward_zero, up, down
    """
    return check_choice(mode, "rounding mode", MODES if stochastic else DETERMINISTIC_MODES)


def seed_generator(seed, name: str = "seed") -> np.random.Generator:
    """np.random.default_rng(seed) for an integer seed >= 0, else ValueError naming the parameter.

    Parameters
    ----------
    seed : int
        The seed (a Python or NumPy integer >= 0; bool is refused).
    name : str, default "seed"
        The parameter's name, for the error message.

    Returns
    -------
    numpy.random.Generator
        A fresh generator; the same seed gives the same stream.

    Raises
    ------
    ValueError
        If seed is not an integer >= 0.

    Examples
    --------
    >>> from precisionlab.rounding import seed_generator
    >>> a, b = seed_generator(7), seed_generator(7)
    >>> bool((a.integers(0, 100, 5) == b.integers(0, 100, 5)).all())
    True
    >>> seed_generator(-1, "atomic_seed")
    Traceback (most recent call last):
        ...
    ValueError: atomic_seed must be an integer >= 0 (the seed of np.random.default_rng); got atomic_seed=-1
    """
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise ValueError(f"{name} must be an integer >= 0 (the seed of np.random.default_rng); "
                         f"got {name}={seed!r}")
    return np.random.default_rng(int(seed))


# --------------------------------------------------------------------------- public API


def _mode_code(mode: str) -> int:
    return MODES.index(check_mode(mode, stochastic=True))


def _to_numpy(x):
    """(contiguous float32/float64 array, function that turns a result back into x's kind)."""
    if isinstance(x, torch.Tensor):
        if not x.is_floating_point():
            raise TypeError(f"round_to needs a floating-point tensor, got dtype {x.dtype}")
        t = x.detach()
        device = t.device
        if t.dtype not in (torch.float32, torch.float64):
            t = t.to(torch.float32)  # exact: every narrower float is a float32
        return t.cpu().contiguous().numpy(), lambda r: torch.from_numpy(r).to(device)
    if isinstance(x, (bool, int, float)):
        return np.asarray(x, dtype=np.float64).reshape(1), lambda r: float(r[0])
    a = np.asarray(x)
    if a.dtype in (np.float32, np.float64):
        pass
    elif a.dtype.kind in "iub":
        a = a.astype(np.float64)
    elif a.dtype.itemsize <= 2 and (a.dtype.kind == "f" or a.dtype.name in FORMATS):
        a = a.astype(np.float32)  # float16 and the ml_dtypes formats widen exactly
    else:
        raise TypeError(
            f"round_to cannot read dtype {a.dtype}; give float16/32/64, bfloat16, float8 or integers"
        )
    shape = a.shape  # np.ascontiguousarray makes 0-d arrays 1-d; give the shape back
    return np.ascontiguousarray(a), lambda r: r if r.shape == shape else r.reshape(shape)


def round_to(x, fmt, mode: str = "nearest_even", generator: np.random.Generator | None = None,
             *, saturate: bool = False, backend: str = "auto", out: np.ndarray | None = None,
             compiled: bool = True):
    """fl(x): x rounded into `fmt` by `mode` (overflow gives inf, or NaN in e4m3fn, unless `saturate`).

    Overflow: saturate sends overflow and inf to +-max_finite. torch 2.13 and later (2.13 to
    2.15 measured) cast to float8_e4m3fn this way; ml_dtypes (0.4 to 0.7.0) and torch 2.3 to
    2.12 give NaN, this function's default. Directed modes rounding toward zero always stop at
    +-max_finite, as IEEE 754 prescribes.
    MX formats (OCP MX v1.0; ml_dtypes 0.5.1 and later agree bit for bit except where noted;
    0.5.0 rounds e8m0fnu ties to the even exponent code and does not overflow to NaN):
    float4_e2m1fn and float6_* have neither inf nor NaN, so overflow and +-inf saturate (the
    spec's clamp); a NaN input comes back NaN (ml_dtypes 0.5 to 0.7.0 return a zero).
    float8_e8m0fnu holds 2^k, -127 <= k <= 127: nearest_even ties go up (a 0-bit mantissa's
    last kept bit is the implicit 1), values below 2^-127 go to 2^-127 in every mode, overflow
    and +inf give NaN (0xFF) unless `saturate` (then 2^127), and 0, negatives and NaN give
    NaN, as ml_dtypes does (torch 2.13 gives 2^-127 for 0 and drops the sign).
    Where a library's cast strays from one correct rounding, this function does not follow:
    ml_dtypes before 0.7.0 casts float64 into these formats (and bfloat16, float8) through
    float32, rounding twice, and takes float32 subnormals in (2^-127, 1.5 * 2^-127) up to
    2^-126 in e8m0fnu; 0.7.0 rounds once, to the nearest value. torch 2.13 does both.

    Parameters
    ----------
    x : float or int or numpy.ndarray or torch.Tensor
        The values to round: a Python number, a NumPy array (float16/32/64, bfloat16 or
        float8 from ml_dtypes, or integers) or a floating-point torch tensor on any device.
        float32 and float64 inputs keep their dtype; narrower floats are widened to float32
        exactly.
    fmt : str or FloatFormat or torch.dtype
        The target format: anything `formats.get_format` accepts ("bfloat16", "fp16",
        "float8_e4m3fn", "tf32", "float4_e2m1fn", torch.float16, ...).
    mode : {"nearest_even", "nearest_away", "toward_zero", "up", "down", "stochastic"}, default "nearest_even"
        The rounding mode (`MODES`): nearest_away is NVIDIA's fp32->tf32 conversion; up is
        toward +inf, down toward -inf; stochastic rounds up with probability equal to the
        distance from the value below, in ulps, continuing `generator`'s stream.
    generator : numpy.random.Generator or None, default None
        Required for mode "stochastic" (np.random.default_rng(seed)); ignored otherwise.
    saturate : bool, default False
        Overflow and +-inf go to +-max_finite instead of inf (or NaN in float8_e4m3fn).
    backend : {"auto", "native", "emulated"}, default "auto"
        Which implementation runs; all give the same bits. "auto" takes the library cast
        where it is fastest (module docstring), "native" forces it and raises where none is
        exact, "emulated" always runs the kernel.
    out : numpy.ndarray or None, default None
        For a NumPy input only: a C-contiguous array of x's shape and dtype to write into
        (saves allocating, and first touching, a fresh result on every call).
    compiled : bool, default True
        False keeps the emulated recipe on its NumPy tier at any length, never compiling a
        numba loop: cheaper for a one-off rounding of up to a few million values from a cold
        cache (NumPy takes about 15 ns a value, a cold compile a second or more). The same
        bits either way. Inside a short `planned_products` block (`precisionlab.plan`) every
        call takes the NumPy tier, as with False.

    Returns
    -------
    float or numpy.ndarray or torch.Tensor
        fl(x), of x's kind: a Python float for a number, an array of x's shape for an array
        (float32 or float64), a tensor on x's device for a tensor. Every value is a value of
        fmt, held in the wider dtype.

    Raises
    ------
    ValueError
        If fmt, mode or backend is unknown, mode is "stochastic" without a generator,
        backend is "native" where no library cast is exact, out does not fit x, or
        compiled is not a bool.
    TypeError
        If x is an integer tensor, or an array of a dtype that cannot be read.

    Examples
    --------
    >>> import numpy as np
    >>> from precisionlab.rounding import round_to
    >>> round_to(0.1, "bfloat16")
    0.10009765625
    >>> round_to(0.1, "float16"), round_to(0.1, "bfloat16", "toward_zero")
    (0.0999755859375, 0.099609375)
    >>> round_to(1e6, "float16"), round_to(1e6, "float16", saturate=True)
    (inf, 65504.0)
    >>> round_to(500.0, "e4m3"), round_to(500.0, "e4m3", saturate=True)
    (nan, 448.0)
    >>> round_to(np.array([0.1, 0.2, 0.3], dtype=np.float32), "bf16").tolist()
    [0.10009765625, 0.2001953125, 0.30078125]

    Stochastic rounding of 1 + 2^-9, a quarter of the way from 1 to the next bfloat16 value
    1.0078125: about one value in four rounds up, the same draws on every machine for one
    seed.

    >>> x = np.full(8, 1.0 + 2**-9)
    >>> rng = np.random.default_rng(0)
    >>> round_to(x, "bfloat16", "stochastic", rng).tolist()
    [1.0078125, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0]
    """
    fmt = get_format(fmt)
    code = _mode_code(mode)
    check_choice(backend, "backend", BACKENDS)
    if not isinstance(compiled, bool):
        raise ValueError(f"compiled must be True or False; got compiled={compiled!r}")
    compiled = compiled and not numpy_planned()  # a short computation's plan: no compile
    if code == STOCHASTIC and not isinstance(generator, np.random.Generator):
        raise ValueError(
            "stochastic rounding needs generator=np.random.default_rng(seed), "
            f"got generator={generator!r}"
        )
    if isinstance(x, torch.Tensor) and out is None and code == NEAREST_EVEN:
        fast = native_tensor(x.detach(), fmt, saturate, backend)
        if fast is not None:
            return fast
    a, restore = _to_numpy(x)
    if out is None:
        out = np.empty_like(a)
    elif not (isinstance(out, np.ndarray) and isinstance(x, np.ndarray) and out.shape == a.shape
              and out.dtype == a.dtype and out.flags.c_contiguous):
        raise ValueError(
            f"out must be a C-contiguous NumPy array of shape {a.shape} and dtype {a.dtype} "
            f"for a NumPy input; got {type(out).__name__} {getattr(out, 'shape', '')} "
            f"{getattr(out, 'dtype', '')}"
        )
    if fmt.name == "float64" or (fmt.name == "float32" and a.dtype == np.float32):
        np.copyto(out, a)  # every input value is already representable
        return restore(out)
    native = native_cast(a, fmt, saturate) if code == NEAREST_EVEN else None
    if backend == "native" and native is None:
        raise ValueError(
            f"no exact native cast for {a.dtype} -> {fmt.name} with mode={mode!r}, "
            f"saturate={saturate}; use backend='auto' or 'emulated'"
        )
    if native is not None and (backend == "native"
                               or (backend == "auto" and auto_takes_native(a, fmt))):
        native(out)
    elif fmt.has_nan and fmt.signed:
        emulate_into(a, out, fmt, code, generator, saturate, compiled)
    else:
        emulate_mx_into(a, out, fmt, code, generator, saturate, compiled)
    return restore(out)


def _as_float64(x):
    """(as_float64(x), function returning a result in x's kind)."""
    if isinstance(x, torch.Tensor):
        device = x.device
        return (as_float64(x),
                lambda r: torch.from_numpy(np.asarray(r, dtype=np.float64)).to(device))
    if isinstance(x, (bool, int, float)):
        return as_float64(x), float
    return as_float64(x), lambda r: r


def ulp(x, fmt):
    """ulp(x) = 2^(max(floor(log2|x|), emin) - m): the gap between fmt's values in x's binade.

    Returned as float64 (of x's kind); ulp(0) is the smallest subnormal, binades past emax
    use emax, ulp(+-inf) = inf and ulp(NaN) = NaN.

    Parameters
    ----------
    x : float or numpy.ndarray or torch.Tensor
        The values whose binade sets the gap; they need not be values of fmt.
    fmt : str or FloatFormat or torch.dtype
        The format, as `formats.get_format` accepts it.

    Returns
    -------
    float or numpy.ndarray or torch.Tensor
        ulp(x) in float64: a float for a Python number, an array for an array, a float64
        tensor on x's device for a tensor.

    Raises
    ------
    ValueError
        If fmt names no format.

    Examples
    --------
    >>> import numpy as np
    >>> from precisionlab.rounding import ulp
    >>> ulp(1.0, "bfloat16"), ulp(1.0, "float16")
    (0.0078125, 0.0009765625)
    >>> ulp(0.0, "float16") == 2.0**-24  # the smallest subnormal
    True
    >>> ulp(np.array([1.0, 3.0, 1e4]), "float16").tolist()
    [0.0009765625, 0.001953125, 8.0]
    """
    fmt = get_format(fmt)
    a, restore = _as_float64(x)
    _, e = np.frexp(np.abs(a))  # |x| = f * 2^e with f in [0.5, 1): floor(log2|x|) = e - 1
    e = np.where(a == 0, fmt.emin, np.clip(e - 1, fmt.emin, fmt.emax))
    out = np.ldexp(1.0, e - fmt.mantissa_bits)
    out = np.where(np.isinf(a), np.inf, np.where(np.isnan(a), np.nan, out))
    return restore(out)


def next_up(x, fmt):
    """The smallest value of fmt strictly greater than x (float64; inf or NaN past the top).

    Past max_finite the answer is inf in formats with infinities and NaN in the MX formats,
    which saturate; next_up(-inf) is -max_finite.

    Parameters
    ----------
    x : float or numpy.ndarray or torch.Tensor
        The values to step from; they need not be values of fmt.
    fmt : str or FloatFormat or torch.dtype
        The format, as `formats.get_format` accepts it.

    Returns
    -------
    float or numpy.ndarray or torch.Tensor
        The next value of fmt above x, in float64, of x's kind.

    Raises
    ------
    ValueError
        If fmt names no format.

    Examples
    --------
    >>> from precisionlab.rounding import next_up
    >>> next_up(1.0, "bfloat16"), next_up(1.001, "bfloat16")
    (1.0078125, 1.0078125)
    >>> next_up(65504.0, "float16")
    inf
    >>> next_up(0.0, "float16") == 2.0**-24
    True
    """
    fmt = get_format(fmt)
    a, restore = _as_float64(x)
    if fmt.name == "float64":
        return restore(np.nextafter(a, np.inf))
    up = round_to(a, fmt, "up")
    # x already representable: step half an ulp up (exact in float64), then round up again.
    with np.errstate(invalid="ignore"):  # -inf + inf: that entry is replaced below
        stepped = round_to(a + np.asarray(ulp(a, fmt)) / 2, fmt, "up")
    out = np.where(up > a, up, stepped)
    out = np.where(a == -np.inf, -fmt.max_finite, out)
    if not (fmt.has_nan and fmt.signed):  # the MX formats saturate: nothing above max_finite
        out = np.where(a >= fmt.max_finite, np.nan, out)
    return restore(out)


def next_down(x, fmt):
    """The largest value of fmt strictly less than x: -next_up(-x), or, in the unsigned
    float8_e8m0fnu, the value x's float64 predecessor rounds down to (NaN below 2^-127).

    Parameters
    ----------
    x : float or numpy.ndarray or torch.Tensor
        The values to step from; they need not be values of fmt.
    fmt : str or FloatFormat or torch.dtype
        The format, as `formats.get_format` accepts it.

    Returns
    -------
    float or numpy.ndarray or torch.Tensor
        The next value of fmt below x, in float64, of x's kind.

    Raises
    ------
    ValueError
        If fmt names no format.

    Examples
    --------
    >>> from precisionlab.rounding import next_down
    >>> next_down(1.0, "bfloat16"), next_down(1.0, "float16")
    (0.99609375, 0.99951171875)
    >>> next_down(-65504.0, "float16")
    -inf
    >>> next_down(1.0, "float8_e8m0fnu")
    0.5
    """
    a, restore = _as_float64(x)
    f = get_format(fmt)
    if f.signed:
        return restore(-np.asarray(next_up(-a, f)))
    # no sign: -x is no value. RD of the float64 just below x is the largest value below it
    # (x > 2^-127); at or below 2^-127 there is none (RD stops at 2^-127: no zero).
    with np.errstate(invalid="ignore"):
        below = np.asarray(round_to(np.nextafter(a, -np.inf), f, "down"), dtype=np.float64)
    return restore(np.where(below < a, below, np.nan))


# --------------------------------------------------------------------------- for display


@dataclass(frozen=True)
class BitFields:
    """The fields of one value of a format and what they mean."""

    value: float
    fmt: str
    sign: int
    exponent: int  # the stored (biased) exponent field E
    mantissa: int  # the stored fraction field f, an m-bit integer
    kind: str  # zero, subnormal, normal, inf or nan
    bits: str  # "s eeeee ffffffffff"
    meaning: str  # the value written out from the fields

    def __str__(self) -> str:
        return f"{self.fmt:>14}  {self.bits}  {self.kind:<9}  {self.meaning}"


def decompose(x: float, fmt, mode: str = "nearest_even") -> BitFields:
    """Round scalar x into fmt and split it into sign, exponent and mantissa fields.

    Parameters
    ----------
    x : float
        The value to round and show.
    fmt : str or FloatFormat or torch.dtype
        The format, as `formats.get_format` accepts it.
    mode : {"nearest_even", "nearest_away", "toward_zero", "up", "down", "stochastic"}, default "nearest_even"
        The rounding mode, as for `round_to` (stochastic draws from
        np.random.default_rng(0)).

    Returns
    -------
    BitFields
        The rounded value, its sign, biased exponent field E and fraction field f (as
        integers), its kind ("zero", "subnormal", "normal", "inf" or "nan"), the bits as
        text ("s eeeeeeee fffffff") and the value written out from the fields; printing it
        gives one line.

    Raises
    ------
    ValueError
        If fmt or mode is unknown.

    Examples
    --------
    >>> from precisionlab.rounding import decompose
    >>> d = decompose(0.1, "bfloat16")
    >>> d.bits, d.kind
    ('0 01111011 1001101', 'normal')
    >>> d.meaning
    '(-1)^0 * 2^-4 * 1.1001101b = 0.10009765625'
    >>> d = decompose(1e-6, "float16")
    >>> d.kind, d.exponent, d.mantissa, d.bits
    ('subnormal', 0, 17, '0 00000 0000010001')
    """
    fmt = get_format(fmt)
    v = float(round_to(float(x), fmt, mode, generator=np.random.default_rng(0)))
    e_bits, m_bits = fmt.exponent_bits, fmt.mantissa_bits
    sign = int(np.signbit(v))
    top = 2**e_bits - 1
    if np.isnan(v):
        kind, big_e, frac = "nan", top, (2**m_bits - 1 if not fmt.has_inf else 2 ** (m_bits - 1))
        meaning = "NaN"
    elif np.isinf(v):
        kind, big_e, frac, meaning = "inf", top, 0, ("-" if sign else "+") + "inf"
    elif v == 0:
        kind, big_e, frac, meaning = "zero", 0, 0, ("-" if sign else "+") + "0"
    elif abs(v) < fmt.min_normal:
        kind, big_e = "subnormal", 0
        frac = int(abs(v) / fmt.min_subnormal)
        meaning = f"(-1)^{sign} * 2^{fmt.emin} * 0.{frac:0{m_bits}b}b = {v!r}"
    else:
        kind = "normal"
        _, e = np.frexp(abs(v))
        big_e = int(e) - 1 + fmt.bias
        frac = int(np.ldexp(abs(v), m_bits - (int(e) - 1))) - 2**m_bits
        meaning = f"(-1)^{sign} * 2^{int(e) - 1} * 1.{frac:0{m_bits}b}b = {v!r}"
    bits = f"{sign} {big_e:0{e_bits}b} {frac:0{m_bits}b}"
    if not fmt.signed:  # float8_e8m0fnu: its eight bits are the exponent alone
        bits = f"{big_e:0{e_bits}b}"
    return BitFields(v, fmt.name, sign, big_e, frac, kind, bits, meaning)


@dataclass(frozen=True)
class RoundingTrace:
    """One float32 value rounded by hand: which bits are kept, what is added, what is left."""

    x: float
    fmt: str
    mode: str
    dropped_bits: int  # how many low bits of the float32 pattern are cleared
    bits_in: str  # the float32 pattern, kept | dropped
    increment: int  # added to the pattern before clearing
    bits_out: str
    value_out: float

    def __str__(self) -> str:
        return (f"x = {self.x!r} (float32)   {self.bits_in}\n"
                f"+ increment {self.increment:#x} ({self.mode})\n"
                f"= clear {self.dropped_bits} low bits   {self.bits_out}   -> {self.value_out!r}")


def rounding_trace(x: float, fmt, mode: str = "nearest_even") -> RoundingTrace:
    """Show the add-then-clear recipe on one normal float32 value (not the tiny or overflow cases).

    x is first rounded to float32; its bit pattern gets the mode's increment, then the low
    bits that fmt does not keep are cleared, as `round_to`'s integer kernel does.

    Parameters
    ----------
    x : float
        The value, a nonzero float32 within fmt's range.
    fmt : str or FloatFormat or torch.dtype
        The target format (narrower than float32: bfloat16, float16, tf32, float8, ...).
    mode : {"nearest_even", "nearest_away", "toward_zero", "up", "down"}, default "nearest_even"
        The rounding mode (stochastic draws its increment, so it has no fixed trace).

    Returns
    -------
    RoundingTrace
        The bits in and out, the increment and the result; print it for the three-line
        working.

    Raises
    ------
    ValueError
        If fmt or mode is unknown, mode is "stochastic", or x is 0, not finite, beyond fmt's
        largest finite value or too small for fmt to keep a bit.

    Examples
    --------
    >>> from precisionlab.rounding import rounding_trace
    >>> print(rounding_trace(1.1, "bfloat16"))
    x = 1.100000023841858 (float32)   0 01111111 0001100|1100110011001101
    + increment 0x7fff (nearest_even)
    = clear 16 low bits   0 01111111 0001101|0000000000000000   -> 1.1015625
    >>> rounding_trace(1.1, "bfloat16", "toward_zero").value_out
    1.09375
    """
    fmt = get_format(fmt)
    code = _mode_code(mode)
    if code == STOCHASTIC:
        raise ValueError(f"rounding_trace shows a fixed increment, which stochastic rounding draws at "
                         f"random; got mode={mode!r}; valid choices: {', '.join(DETERMINISTIC_MODES)}")
    a = np.float32(x)
    word = int(np.array(a).view(np.uint32))
    mag, neg = word & 0x7FFFFFFF, word >> 31
    big_e = mag >> 23
    sh = 23 - fmt.mantissa_bits + max(0, fmt.emin + 127 - max(big_e, 1))
    if not (np.isfinite(a) and a != 0 and sh <= 23 and abs(float(a)) <= fmt.max_finite):
        raise ValueError(
            f"rounding_trace needs a nonzero float32 within {fmt.name}'s range that keeps at "
            f"least one bit; got {x!r}"
        )
    mask = (1 << sh) - 1
    away = (code == UP and not neg) or (code == DOWN and neg)
    inc = {
        NEAREST_EVEN: (mask >> 1) + (((mag | 1 << 23) >> sh) & 1),
        NEAREST_AWAY: (mask >> 1) + 1,
        TOWARD_ZERO: 0,
    }.get(code, mask if away else 0)
    out = ((mag + inc) & ~mask) | (neg << 31)

    def show(w: int) -> str:
        s = f"{w:032b}"
        return f"{s[0]} {s[1:9]} {s[9:32 - sh]}|{s[32 - sh:]}"

    value = float(np.array(out, dtype=np.uint32).view(np.float32))
    return RoundingTrace(float(a), fmt.name, mode, sh, show(word), inc, show(out), value)
