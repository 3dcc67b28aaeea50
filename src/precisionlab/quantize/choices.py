"""The formats a quantizer takes: element formats, scale formats, the E8M0 exponent rules, margins."""

from __future__ import annotations

import numbers

from ..formats import FloatFormat, get_format

__all__ = ["E8M0_RULES", "ELEMENT_FORMATS", "SCALE_FORMATS", "check_format", "check_margin",
           "check_rule"]

ELEMENT_FORMATS: tuple[str, ...] = ("float8_e4m3fn", "float8_e5m2", "float6_e3m2fn",
                                    "float6_e2m3fn", "float4_e2m1fn")
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
    if rule not in E8M0_RULES:
        raise ValueError(f"unknown e8m0_rule {rule!r}; valid choices: {', '.join(E8M0_RULES)}")
    return rule


def check_margin(margin) -> int:
    """margin if it is an integer (not a bool), else ValueError naming it."""
    if isinstance(margin, bool) or not isinstance(margin, numbers.Integral):
        raise ValueError(f"margin must be an integer (the scale gets 2^margin of headroom); "
                         f"got margin={margin!r}")
    return int(margin)
