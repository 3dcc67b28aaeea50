"""Independent reference rounding for the tests: exact rationals and sorted tables of values;
and the helpers several test files share.

Nothing here but `rn` calls precisionlab's kernel: the tables are decoded by ml_dtypes (or, for
tf32, by masking float32 bit patterns) and the rational oracle follows the textbook definition.
`rn` is the shorthand the interval tests use to put their inputs on a format's grid, with
round_to itself (which tests/test_rounding.py holds to the oracles here). `sound(n)` is the
derandomised Hypothesis profile of the interval tests. `identical_values` and `equal_with_nan`
compare arrays elementwise, with and without the sign of zero.
"""

from __future__ import annotations

import math
from fractions import Fraction

import ml_dtypes
import numpy as np
from hypothesis import HealthCheck, settings

from precisionlab.formats import FloatFormat, get_format
from precisionlab.rounding import round_to

ML_DTYPES = {
    "float16": np.float16,
    "bfloat16": ml_dtypes.bfloat16,
    "float8_e4m3fn": ml_dtypes.float8_e4m3fn,
    "float8_e5m2": ml_dtypes.float8_e5m2,
}
BITS_DTYPE = {2: np.uint16, 1: np.uint8}


def all_patterns(name: str) -> np.ndarray:
    """Every bit pattern of a 16- or 8-bit format, decoded by ml_dtypes/NumPy into float32."""
    dt = np.dtype(ML_DTYPES[name])
    n = 2 ** (8 * dt.itemsize)
    return np.arange(n, dtype=np.uint32).astype(BITS_DTYPE[dt.itemsize]).view(dt).astype(np.float32)


def finite_values(fmt) -> np.ndarray:
    """Sorted float64 array of every finite value of fmt (zero once)."""
    fmt = get_format(fmt)
    if fmt.name == "tf32":
        # tf32 values are float32 patterns whose 13 low bits are zero.
        mags = (np.arange(2**18 - 2**10, dtype=np.uint32) << np.uint32(13)).view(np.float32)
        v = mags.astype(np.float64)
    else:
        v = all_patterns(fmt.name).astype(np.float64)
    v = v[np.isfinite(v)]
    return np.unique(np.concatenate([v, -v]))


def overflow_neighbour(fmt: FloatFormat) -> float:
    """The first value past max_finite on fmt's grid (inf's place, or e4m3fn's NaN pattern)."""
    return fmt.max_finite + 2.0 ** (fmt.emax - fmt.mantissa_bits)


def table_round(x: np.ndarray, fmt, mode: str, saturate: bool = False) -> np.ndarray:
    """Deterministic rounding by searching the sorted table of values (exact comparisons)."""
    fmt = get_format(fmt)
    x = np.asarray(x, dtype=np.float64)
    big = overflow_neighbour(fmt)
    table = np.concatenate([[-big], finite_values(fmt), [big]])
    xc = np.clip(np.nan_to_num(x, nan=0.0, posinf=big, neginf=-big), -big, big)
    i = np.clip(np.searchsorted(table, xc, side="right") - 1, 0, len(table) - 1)
    lo = table[i]
    hi = np.where(lo == xc, lo, table[np.minimum(i + 1, len(table) - 1)])
    mid = (lo + hi) / 2  # exact: two neighbours with at most 24 significant bits
    pos_table = table[table >= 0]
    lo_even = np.searchsorted(pos_table, np.abs(lo)) % 2 == 0
    neg = np.signbit(x)
    if mode == "nearest_even":
        r = np.where(xc < mid, lo, np.where(xc > mid, hi, np.where(lo_even, lo, hi)))
    elif mode == "nearest_away":
        r = np.where(xc < mid, lo, np.where(xc > mid, hi, np.where(neg, lo, hi)))
    elif mode == "toward_zero":
        r = np.where(neg, hi, lo)
    elif mode == "up":
        r = hi
    elif mode == "down":
        r = lo
    else:
        raise ValueError(mode)
    toward_zero = (mode == "toward_zero") | ((mode == "up") & neg) | ((mode == "down") & ~neg)
    over = np.inf if fmt.has_inf else np.nan
    over_val = np.where(toward_zero | saturate, fmt.max_finite, over)
    r = np.where(np.abs(r) == big, np.copysign(over_val, x), r)
    r = np.where(r == 0, np.copysign(0.0, x), r)
    inf_val = fmt.max_finite if saturate else over
    r = np.where(np.isinf(x), np.copysign(inf_val, x), r)
    return np.where(np.isnan(x), np.nan, r)


def fraction_round(x: float, fmt, mode: str) -> float:
    """fl(x) by exact rational arithmetic: the textbook definition, one value at a time."""
    fmt = get_format(fmt)
    if math.isnan(x) or math.isinf(x):
        raise ValueError("finite inputs only")
    if x == 0:
        return x
    q, neg = abs(Fraction(x)), x < 0
    e = q.numerator.bit_length() - q.denominator.bit_length()
    while Fraction(2) ** e > q:
        e -= 1
    while Fraction(2) ** (e + 1) <= q:
        e += 1
    quantum = Fraction(2) ** (max(e, fmt.emin) - fmt.mantissa_bits)
    k = q / quantum
    k0 = k.numerator // k.denominator
    frac = k - k0
    if mode == "nearest_even":
        k1 = k0 + (frac > Fraction(1, 2) or (frac == Fraction(1, 2) and k0 % 2 == 1))
    elif mode == "nearest_away":
        k1 = k0 + (frac >= Fraction(1, 2))
    elif mode == "toward_zero":
        k1 = k0
    elif mode in ("up", "down"):
        away = (mode == "up") != neg
        k1 = k0 + (away and frac > 0)
    else:
        raise ValueError(mode)
    mag = k1 * quantum
    if mag > Fraction(fmt.max_finite):
        toward_zero = mode == "toward_zero" or (mode == "up" and neg) or (mode == "down" and not neg)
        mag = Fraction(fmt.max_finite) if toward_zero else None
    if mag is None:
        val = math.inf if fmt.has_inf else math.nan
    else:
        val = float(mag)
    return -val if neg else val


def identical_values(a, b) -> np.ndarray:
    """Elementwise: equal including the sign of zero, or both NaN."""
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    return ((a == b) & (np.signbit(a) == np.signbit(b))) | (np.isnan(a) & np.isnan(b))


def equal_with_nan(a, b) -> bool:
    """Arrays equal elementwise, NaN equal to NaN (0.0 equal to -0.0)."""
    return np.array_equal(np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64), equal_nan=True)


def rn(x, fmt) -> np.ndarray:
    """x rounded to nearest (ties to even) in fmt by round_to, as a float64 array."""
    return np.asarray(round_to(np.ascontiguousarray(x, dtype=np.float64), fmt), dtype=np.float64)


def sound(n: int) -> settings:
    """Derandomised (the same examples on every run) and without deadline: n examples."""
    return settings(max_examples=n, deadline=None, derandomize=True, database=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def fsum_sqnr(x, xhat) -> float:
    """10 log10(sum x^2 / sum (x - xhat)^2) with exactly rounded sums (math.fsum)."""
    a = np.asarray(x, dtype=np.float64).ravel()
    e = a - np.asarray(xhat, dtype=np.float64).ravel()
    noise = math.fsum(e * e)
    return math.inf if noise == 0 else 10 * math.log10(math.fsum(a * a) / noise)
