"""Input checks shared by every module: each error names the bad value and what is allowed."""

from __future__ import annotations

import math
from collections.abc import Iterable

__all__ = ["check_choice", "check_nonnegative", "check_positive"]


def check_choice(value, name: str, choices: Iterable[str]):
    """value if it is one of choices, else ValueError listing them."""
    choices = tuple(choices)
    if value not in choices:
        raise ValueError(f"unknown {name} {value!r}; valid choices: {', '.join(choices)}")
    return value


def _real(value) -> float:
    """float(value) for a real number (not a bool or a string), NaN for anything else."""
    try:
        return float(value) if not isinstance(value, (bool, str)) else math.nan
    except (TypeError, ValueError):
        return math.nan


def check_positive(value, name: str) -> float:
    """float(value) if it is a finite real number > 0 (not a bool or a string), else ValueError."""
    v = _real(value)
    if not (math.isfinite(v) and v > 0):
        raise ValueError(f"{name} must be a finite number > 0; got {name}={value!r}")
    return v


def check_nonnegative(value, name: str, what: str = "") -> float:
    """float(value) if it is a finite real number >= 0 (not a bool or a string), else ValueError."""
    v = _real(value)
    if not (math.isfinite(v) and v >= 0):
        raise ValueError(f"{name} must be a finite number >= 0{what}; got {name}={value!r}")
    return v
