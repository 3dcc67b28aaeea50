"""Input checks shared by every module: each error names the bad value and what is allowed."""

from __future__ import annotations

import math
import numbers
from collections.abc import Iterable

__all__ = ["check_choice", "check_count", "check_integer", "check_nonnegative", "check_positive",
           "check_positive_int", "check_real"]


def check_choice(value, name: str, choices: Iterable[str]):
    """value if it is one of choices, else ValueError listing them."""
    choices = tuple(choices)
    if value not in choices:
        raise ValueError(f"unknown {name} {value!r}; valid choices: {', '.join(choices)}")
    return value


def _number(value) -> float | None:
    """float(value) for a real number (a NumPy scalar or a 0-d tensor too; not a bool, str or
    bytes), None for anything else."""
    if isinstance(value, (bool, str, bytes)):
        return None
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def check_real(value, name: str = "value") -> float:
    """float(value) if it is a finite real number (not a bool or a string), else ValueError naming it."""
    v = _number(value)
    if v is None:
        raise ValueError(f"{name} must be a real number; got {name}={value!r}")
    if not math.isfinite(v):
        raise ValueError(f"{name} must be finite; got {name}={value!r}")
    return v


def check_positive(value, name: str) -> float:
    """float(value) if it is a finite real number > 0 (not a bool or a string), else ValueError."""
    v = _number(value)
    if v is None or not (math.isfinite(v) and v > 0):
        raise ValueError(f"{name} must be a finite number > 0; got {name}={value!r}")
    return v


def check_nonnegative(value, name: str, what: str = "") -> float:
    """float(value) if it is a finite real number >= 0 (not a bool or a string), else ValueError."""
    v = _number(value)
    if v is None or not (math.isfinite(v) and v >= 0):
        raise ValueError(f"{name} must be a finite number >= 0{what}; got {name}={value!r}")
    return v


def _integral(value) -> bool:
    """Whether value is an integer (Python or NumPy), not a bool."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def check_integer(value, name: str, what: str = "") -> int:
    """int(value) if it is an integer (not a bool), else ValueError naming it."""
    if not _integral(value):
        raise ValueError(f"{name} must be an integer{what}; got {name}={value!r}")
    return int(value)


def check_count(value, name: str, lowest: int = 1, what: str = "") -> int:
    """int(value) if it is an integer >= lowest (not a bool), else ValueError naming it."""
    if not _integral(value) or value < lowest:
        raise ValueError(f"{name} must be an integer >= {lowest}{what}; got {name}={value!r}")
    return int(value)


def check_positive_int(value, name: str, upper: int | None = None) -> int:
    """int(value) if it is an integer >= 1 (and <= upper if given; not a bool), else ValueError."""
    if not _integral(value) or value < 1:
        raise ValueError(f"{name} must be a positive integer; got {name}={value!r}")
    if upper is not None and value > upper:
        raise ValueError(f"{name} must be at most {upper}; got {name}={value!r}")
    return int(value)
