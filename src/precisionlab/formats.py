"""Binary floating-point formats: bit layout, exact limits and special-value rules.

Every constant is written as a hex float, so it is exact; `tests/test_formats.py` checks
each one against `ml_dtypes.finfo`, `torch.finfo` and the layout formula.

`FORMAT_NAMES` are the formats the chapters tabulate and sweep; `MX_FORMAT_NAMES` adds the
OCP Microscaling (MX) element formats (float6_e3m2fn, float6_e2m3fn, float4_e2m1fn: neither
inf nor NaN) and the MX scale format float8_e8m0fnu (a bare power of two: no sign, no zero,
no subnormals, one NaN pattern). Both lists name entries of the one registry `FORMATS`.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Any

__all__ = ["ALIASES", "FORMATS", "FORMAT_NAMES", "MX_FORMAT_NAMES", "FloatFormat", "contains",
           "get_format", "short_name"]


@dataclass(frozen=True)
class FloatFormat:
    """A binary format: value = (-1)^s · 2^(E - bias) · 1.f for 0 < E, and 2^(1 - bias) · 0.f for E = 0.

    Look formats up with `get_format` rather than building one: the registry `FORMATS`
    holds every format the package rounds into, each constant an exact hex float.

    Attributes
    ----------
    name : str
        The registry name: "float64", "float32", "tf32", "float16", "bfloat16",
        "float8_e4m3fn", "float8_e5m2", "float6_e3m2fn", "float6_e2m3fn", "float4_e2m1fn"
        or "float8_e8m0fnu".
    exponent_bits : int
        Bits of the stored exponent field E.
    mantissa_bits : int
        Stored fraction bits m; the precision is p = m + 1.
    bias : int
        The exponent bias: a normal value is 2^(E - bias) · 1.f.
    has_inf : bool
        Whether the format has infinities (False for float8_e4m3fn, the MX formats and
        float8_e8m0fnu: overflow gives NaN or saturates instead).
    max_finite : float
        The largest finite value M.
    min_normal : float
        The smallest positive normal value n = 2^emin.
    min_subnormal : float
        The smallest positive subnormal value q (min_normal for formats without
        subnormals).
    eps : float
        2^-m, the gap between 1 and the next larger value.
    description : str
        One line on where the format comes from.
    has_nan : bool, default True
        False for the MX element formats float4/float6: every bit pattern is a number.
    signed : bool, default True
        False for float8_e8m0fnu: 2^(E - 127) for E < 255, no sign bit, no zero.

    Examples
    --------
    >>> from precisionlab.formats import get_format
    >>> bf16 = get_format("bfloat16")
    >>> bf16.exponent_bits, bf16.mantissa_bits, bf16.precision, bf16.bias
    (8, 7, 8, 127)
    >>> bf16.total_bits, bf16.eps, bf16.unit_roundoff
    (16, 0.0078125, 0.00390625)
    >>> bf16.max_finite == float.fromhex("0x1.fep+127")
    True
    >>> get_format("float16").emin, get_format("float16").emax
    (-14, 15)
    """

    name: str
    exponent_bits: int
    mantissa_bits: int  # stored fraction bits m; precision p = m + 1
    bias: int
    has_inf: bool  # False for float8_e4m3fn: its only special value is NaN (S.1111.111)
    max_finite: float
    min_normal: float
    min_subnormal: float
    eps: float  # 2^-m: gap between 1 and the next larger value
    description: str
    has_nan: bool = True  # False for the MX element formats float4/float6: every pattern is a number
    signed: bool = True  # False for float8_e8m0fnu: 2^(E - 127) for E < 255, no sign bit, no zero

    @property
    def precision(self) -> int:
        """p = m + 1 significant bits, counting the implicit leading one."""
        return self.mantissa_bits + 1

    @property
    def total_bits(self) -> int:
        """Sign bit (if any) + exponent bits + mantissa bits (tf32 is stored in 32-bit words)."""
        return int(self.signed) + self.exponent_bits + self.mantissa_bits

    @property
    def emin(self) -> int:
        """Exponent of the smallest normal number: log2(min_normal) = 1 - bias (-bias for e8m0fnu)."""
        return math.frexp(self.min_normal)[1] - 1

    @property
    def emax(self) -> int:
        """Exponent of the largest finite number: floor(log2(max_finite))."""
        # IEEE formats reserve the all-ones exponent for inf/NaN; e4m3fn and the MX element
        # formats use it for numbers; e8m0fnu's all-ones pattern is its NaN.
        return math.frexp(self.max_finite)[1] - 1

    @property
    def unit_roundoff(self) -> float:
        """u = 2^-p = eps / 2: the largest relative error of round-to-nearest in the normal range."""
        return self.eps / 2

    @property
    def torch_dtype(self) -> Any:
        """The torch dtype with this exact format, or None where torch has none (tf32)."""
        import torch  # optional here: formats is the ground floor and imports no framework

        return getattr(torch, self.name, None) if self.name != "tf32" else None

    def __str__(self) -> str:
        return self.name


def _fmt(name, e, m, bias, has_inf, max_finite, min_normal, min_subnormal, description,
         **rules):
    return FloatFormat(
        name=name,
        exponent_bits=e,
        mantissa_bits=m,
        bias=bias,
        has_inf=has_inf,
        max_finite=float.fromhex(max_finite),
        min_normal=float.fromhex(min_normal),
        min_subnormal=float.fromhex(min_subnormal),
        eps=2.0**-m,
        description=description,
        **rules,
    )


FORMATS: dict[str, FloatFormat] = {
    f.name: f
    for f in (
        _fmt("float64", 11, 52, 1023, True, "0x1.fffffffffffffp+1023", "0x1p-1022", "0x1p-1074",
             "IEEE binary64"),
        _fmt("float32", 8, 23, 127, True, "0x1.fffffep+127", "0x1p-126", "0x1p-149",
             "IEEE binary32"),
        _fmt("tf32", 8, 10, 127, True, "0x1.ffcp+127", "0x1p-126", "0x1p-136",
             "NVIDIA TensorFloat-32: float32 range, float16 precision (tensor-core inputs)"),
        _fmt("float16", 5, 10, 15, True, "0x1.ffcp+15", "0x1p-14", "0x1p-24",
             "IEEE binary16"),
        _fmt("bfloat16", 8, 7, 127, True, "0x1.fep+127", "0x1p-126", "0x1p-133",
             "brain float: float32 range, 8-bit precision"),
        _fmt("float8_e4m3fn", 4, 3, 7, False, "0x1.cp+8", "0x1p-6", "0x1p-9",
             "OCP FP8 E4M3: finite only (no inf), one NaN pattern per sign"),
        _fmt("float8_e5m2", 5, 2, 15, True, "0x1.cp+15", "0x1p-14", "0x1p-16",
             "OCP FP8 E5M2: IEEE-style, with inf and NaN"),
        _fmt("float6_e3m2fn", 3, 2, 3, False, "0x1.cp+4", "0x1p-2", "0x1p-4",
             "OCP MX FP6 E3M2: finite only, no NaN", has_nan=False),
        _fmt("float6_e2m3fn", 2, 3, 1, False, "0x1.ep+2", "0x1p+0", "0x1p-3",
             "OCP MX FP6 E2M3: finite only, no NaN", has_nan=False),
        _fmt("float4_e2m1fn", 2, 1, 1, False, "0x1.8p+2", "0x1p+0", "0x1p-1",
             "OCP MX FP4 E2M1: finite only, no NaN", has_nan=False),
        _fmt("float8_e8m0fnu", 8, 0, 127, False, "0x1p+127", "0x1p-127", "0x1p-127",
             "OCP MX scale E8M0: 2^(E-127), unsigned, no zero, NaN = 0xFF", signed=False),
    )
}

# The formats the chapters tabulate (chapter 1's format table, plotting colours): unchanged
# when the MX formats joined the registry, so no checked output moves.
FORMAT_NAMES: tuple[str, ...] = (
    "float64", "float32", "tf32", "float16", "bfloat16", "float8_e4m3fn", "float8_e5m2"
)
MX_FORMAT_NAMES: tuple[str, ...] = ("float6_e3m2fn", "float6_e2m3fn", "float4_e2m1fn",
                                    "float8_e8m0fnu")

# Short names people type; each maps to one registry name. The one table of format names.
ALIASES = {
    "fp64": "float64", "double": "float64",
    "fp32": "float32", "single": "float32",
    "fp16": "float16", "half": "float16",
    "bf16": "bfloat16",
    "fp8_e4m3": "float8_e4m3fn", "e4m3": "float8_e4m3fn",
    "fp8_e5m2": "float8_e5m2", "e5m2": "float8_e5m2",
    "fp6_e3m2": "float6_e3m2fn", "e3m2": "float6_e3m2fn",
    "fp6_e2m3": "float6_e2m3fn", "e2m3": "float6_e2m3fn",
    "fp4_e2m1": "float4_e2m1fn", "e2m1": "float4_e2m1fn",
    "e8m0": "float8_e8m0fnu",
}


def get_format(fmt: str | FloatFormat | Any) -> FloatFormat:
    """Look up a format by registry name, common alias (fp16, bf16, ...) or torch dtype.

    Parameters
    ----------
    fmt : str or FloatFormat or torch.dtype
        A registry name ("float64", "float32", "tf32", "float16", "bfloat16",
        "float8_e4m3fn", "float8_e5m2", "float6_e3m2fn", "float6_e2m3fn", "float4_e2m1fn",
        "float8_e8m0fnu"), an alias from `ALIASES` ("fp16", "half", "bf16", "e4m3", ...;
        names are not case-sensitive), a torch dtype of one of these formats, or a
        FloatFormat (returned as it is).

    Returns
    -------
    FloatFormat
        The registry's format of that name.

    Raises
    ------
    ValueError
        If fmt names no format; the message lists the registry names and the aliases.

    Examples
    --------
    >>> import torch
    >>> from precisionlab.formats import get_format
    >>> get_format("bf16").name, get_format("HALF").name
    ('bfloat16', 'float16')
    >>> get_format(torch.float8_e5m2).name
    'float8_e5m2'
    >>> get_format("float16").max_finite
    65504.0
    >>> get_format("fp12")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    ValueError: unknown float format 'fp12'; valid choices: float64, float32, ...
    """
    if isinstance(fmt, FloatFormat):
        return fmt
    name = fmt
    if not isinstance(fmt, str):
        # torch dtypes print as "torch.bfloat16"; accept them without importing torch here.
        name = str(fmt).removeprefix("torch.")
    key = ALIASES.get(name.lower(), name.lower()) if isinstance(name, str) else name
    try:
        return FORMATS[key]
    except (KeyError, TypeError):
        raise ValueError(
            f"unknown float format {fmt!r}; valid choices: {', '.join(FORMATS)} "
            f"(aliases: {', '.join(sorted(ALIASES))})"
        ) from None


def short_name(fmt) -> str:
    """The first alias of a format in ALIASES (fp32, bf16, fp16, ...), else its registry name.

    Parameters
    ----------
    fmt : str or FloatFormat or torch.dtype
        Anything `get_format` accepts.

    Returns
    -------
    str
        The short name, as the chapters' tables print it.

    Raises
    ------
    ValueError
        If fmt names no format.

    Examples
    --------
    >>> from precisionlab.formats import short_name
    >>> short_name("bfloat16"), short_name("float8_e4m3fn")
    ('bf16', 'fp8_e4m3')
    >>> short_name("tf32")  # no alias: the registry name
    'tf32'
    """
    name = get_format(fmt).name
    return next((k for k, v in ALIASES.items() if v == name), name)


def contains(wide, narrow) -> bool:
    """Whether every value of format `narrow` is a value of format `wide` (so a cast from narrow
    to wide is exact): float32 contains bfloat16 and float16, which contain neither each other
    nor float32. Each format contains itself.

    Parameters
    ----------
    wide, narrow : str or FloatFormat or torch.dtype
        The two formats, anything `get_format` accepts.

    Returns
    -------
    bool
        True when the cast from narrow to wide never rounds (nor overflows).

    Raises
    ------
    ValueError
        If either names no format.

    Examples
    --------
    >>> from precisionlab.formats import contains
    >>> contains("float32", "bfloat16"), contains("float16", "float8_e4m3fn")
    (True, True)
    >>> contains("bfloat16", "float16"), contains("float16", "bfloat16")
    (False, False)
    """
    return _contains(get_format(wide).name, get_format(narrow).name)


@functools.cache
def _contains(wide: str, narrow: str) -> bool:
    w, n = FORMATS[wide], FORMATS[narrow]
    # a grid at least as fine in every binade (more fraction bits, a smaller or equal smallest
    # step), reaching at least as far, with the signs and the special values narrow has
    return (n.mantissa_bits <= w.mantissa_bits and n.min_subnormal >= w.min_subnormal
            and n.max_finite <= w.max_finite and (w.signed or not n.signed)
            and (w.has_inf or not n.has_inf) and (w.has_nan or not n.has_nan))
