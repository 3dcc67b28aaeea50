"""One pass over every format in the registry (as ml_dtypes' tests loop over its dtype list):
for each of `formats.FORMATS`, the values its bit layout defines, built here from the layout
formula alone, against `round_to` in every deterministic mode and in each of its three tiers,
`next_up`, `next_down`, `ulp`, `decompose`, the name table and `contains`.

The oracle: the values of a format are 2^(e - m)(2^m + j) for normal binades e (j < 2^m) and
k 2^(emin - m) below (k < 2^m), up to max_finite; float8_e8m0fnu is 2^e alone. A value of the
format rounds to itself; the midpoint of two neighbours goes to the one with the even last
bit (nearest_even; e8m0fnu's ties go up, its one kept bit being the implicit 1) or the larger
magnitude (nearest_away); a quarter of the way goes to the nearer; the directed modes pick the
neighbour on their side. float32 and float64 are tested on windows of consecutive values
(bottom, around 1, top); float64's midpoints are no float64 values, so it is checked on its
own values only.
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from precisionlab.formats import FORMATS, contains, get_format, short_name
from precisionlab.rounding import DETERMINISTIC_MODES, decompose, next_down, next_up, round_to, ulp

NAMES = list(FORMATS)
WINDOW = 24  # consecutive values per window of the two wide formats


def _magnitudes(f) -> list[tuple[float, int]]:
    """(value, bit pattern) of every non-negative finite value of f in layout order (float32
    and float64: of their windows), the segments of `_segments` joined."""
    return [v for seg in _segments(f) for v in seg]


def _value(f, pattern: int) -> float:
    """The value of a non-negative bit pattern of f, by the layout formula (exact in float64)."""
    m = f.mantissa_bits
    e_field, j = pattern >> m, pattern & ((1 << m) - 1)
    if not f.signed and m == 0:  # e8m0fnu: 2^(E - bias), no zero, no subnormals
        return math.ldexp(1.0, e_field - f.bias)
    if e_field == 0:
        return math.ldexp(float(j), f.emin - m)
    return math.ldexp(float((1 << m) + j), e_field - f.bias - m)


def _segments(f) -> list[list[tuple[float, int]]]:
    """Runs of consecutive non-negative values (value, pattern), each run in increasing order."""
    top = 0
    while _value(f, top + 1) <= f.max_finite and not math.isnan(_value(f, top + 1)):
        top += 1
        if top > 1 << 20:  # float32 and float64: windows, not every value
            break
    if top <= 1 << 20:
        return [[(_value(f, p), p) for p in range(top + 1)]]
    m = f.mantissa_bits
    one = f.bias << m  # the pattern of 1.0
    last = int(np.array(f.max_finite, dtype=f"float{f.total_bits}")
               .view(f"uint{f.total_bits}"))
    starts = (0, (1 << m) - WINDOW // 2, one - WINDOW // 2, last - WINDOW + 1)
    return [[(_value(f, p), p) for p in range(s, s + WINDOW)] for s in starts]


def _tie_goes_up(f, a_pattern: int, b_pattern: int) -> bool:
    """Where nearest_even sends the midpoint of neighbours a < b: to b when a's last bit is odd
    (to b, too, in e8m0fnu, whose last kept bit is the implicit 1)."""
    if not f.signed and f.mantissa_bits == 0:
        return True
    return a_pattern % 2 == 1


def _rounded(x: np.ndarray, name: str, mode: str) -> np.ndarray:
    """round_to of x in each tier (3 values: Python ints, 700: NumPy, the rest: numba)."""
    x = np.asarray(x, dtype=np.float64)
    parts = [np.asarray(round_to(x[:3], name, mode), dtype=np.float64),
             np.asarray(round_to(x[3:703], name, mode), dtype=np.float64),
             np.asarray(round_to(x[703:], name, mode), dtype=np.float64)]
    return np.concatenate(parts)


@pytest.mark.parametrize("name", NAMES)
def test_the_oracle_reaches_the_formats_limits(name):
    f = FORMATS[name]
    vals = [v for v, _ in _magnitudes(f)]
    assert max(vals) == f.max_finite
    positive = [v for v in vals if v > 0]
    assert min(positive) == f.min_subnormal
    assert (0.0 in vals) == f.signed  # e8m0fnu has no zero


@pytest.mark.parametrize("mode", DETERMINISTIC_MODES)
@pytest.mark.parametrize("name", NAMES)
def test_every_value_rounds_to_itself_in_every_mode(name, mode):
    f = FORMATS[name]
    v = np.array([v for v, _ in _magnitudes(f)])
    both = np.concatenate([v, -v[v > 0]]) if f.signed else v
    np.testing.assert_array_equal(_rounded(both, name, mode), both)


@pytest.mark.parametrize("mode", DETERMINISTIC_MODES)
@pytest.mark.parametrize("name", [n for n in NAMES if n != "float64"])
def test_midpoints_and_quarter_points_go_where_the_mode_says(name, mode):
    f = FORMATS[name]
    a, b, tie_up = [], [], []
    for seg in _segments(f):
        for (va, pa), (vb, pb) in itertools.pairwise(seg):
            a.append(va)
            b.append(vb)
            tie_up.append(_tie_goes_up(f, pa, pb))
    a, b, tie_up = np.array(a), np.array(b), np.array(tie_up)
    points = {"mid": (a + b) / 2, "low": a + (b - a) / 4, "high": a + 3 * (b - a) / 4}  # exact
    for kind, sign in (("mid", 1), ("low", 1), ("high", 1), ("mid", -1), ("low", -1)):
        if sign < 0 and not f.signed:
            continue
        lo, hi = (a, b) if sign > 0 else (-b, -a)  # x's two neighbours
        if mode == "up":
            want = hi
        elif mode == "down":
            want = lo
        elif mode == "toward_zero":
            want = sign * a
        elif kind == "mid":  # a tie
            up = tie_up if mode == "nearest_even" else np.ones_like(tie_up)
            want = sign * np.where(up, b, a)
        else:  # the nearer neighbour
            want = sign * (a if kind == "low" else b)
        got = _rounded(sign * points[kind], name, mode)
        np.testing.assert_array_equal(got, want, err_msg=f"{name} {mode} {sign * 1:+d} {kind}")


@pytest.mark.parametrize("name", NAMES)
def test_next_up_next_down_and_ulp_walk_the_values(name):
    f = FORMATS[name]
    for seg in _segments(f):
        a = np.array([v for v, _ in seg[:-1]])
        b = np.array([v for v, _ in seg[1:]])
        np.testing.assert_array_equal(next_up(a, name), b)
        np.testing.assert_array_equal(next_down(b, name), a)
        np.testing.assert_array_equal(ulp(a[a > 0], name), (b - a)[a > 0])


@pytest.mark.parametrize("name", NAMES)
def test_decompose_gives_the_fields_of_the_layout(name):
    f = FORMATS[name]
    mags = _magnitudes(f)
    picks = [mags[i] for i in np.linspace(0, len(mags) - 1, 40).astype(int)]
    for value, pattern in picks:
        fields = decompose(value, name)
        assert fields.value == value
        assert (fields.exponent, fields.mantissa) == divmod(pattern, 1 << f.mantissa_bits)


@pytest.mark.parametrize("name", NAMES)
def test_names_short_names_and_dtypes_lead_back_to_the_format(name):
    f = FORMATS[name]
    assert get_format(name) is f and get_format(f) is f
    assert get_format(short_name(name)) is f
    if f.torch_dtype is not None:
        assert get_format(f.torch_dtype) is f
    assert contains(name, name) and contains("float64", name)
    assert contains(name, "float64") == (name == "float64")
