"""The formats a quantizer takes: element formats, scale formats, the E8M0 exponent rules, margins."""

from __future__ import annotations

from ..checks import check_choice, check_integer
from ..formats import FORMATS, FloatFormat, get_format

__all__ = ["E8M0_RULES", "ELEMENT_FORMATS", "SCALE_FORMATS", "check_format", "check_margin",
           "check_rule"]

# every signed format of at most 8 bits: FP8 (E4M3, E5M2) and the MX element formats FP6, FP4
ELEMENT_FORMATS: tuple[str, ...] = tuple(name for name, f in FORMATS.items()
                                         if f.signed and f.total_bits <= 8)
SCALE_FORMATS: tuple[str, ...] = ("float32", "float8_e8m0fnu", "float8_e4m3fn")
# floor: k = floor(log2 amax) - emax_E, the OCP MX v1.0 rule (the block's largest element may
# saturate); ceil: the least k with amax <= max_E 2^k (nothing saturates).
E8M0_RULES: tuple[str, ...] = ("floor", "ceil")


def check_format(value, name: str, choices: tuple[str, ...]) -> FloatFormat:
    """The format `value` names (registry name, alias or torch dtype) if it is one of choices, else ValueError."""
    try:
        fmt = get_format(value)
    except ValueError:
        fmt = None
    if fmt is None or fmt.name not in choices:
        raise ValueError(f"unknown {name} {value!r}; valid choices: {', '.join(choices)}")
    return fmt


def check_rule(rule) -> str:
    """rule if it is an E8M0 exponent rule, else ValueError naming them."""
    return check_choice(rule, "e8m0_rule", E8M0_RULES)


def check_margin(margin) -> int:
    """margin if it is an integer (not a bool), else ValueError naming it."""
    return check_integer(margin, "margin", " (the scale gets 2^margin of headroom)")
