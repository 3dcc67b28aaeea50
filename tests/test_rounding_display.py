"""The display helpers decompose and rounding_trace against ml_dtypes' bit patterns and round_to.

Oracles: the stored bit patterns of every fp8 value and a spread of 16-bit ones (ml_dtypes),
the sign/exponent/fraction fields of ml_dtypes' casts, round_to on random values, and fields
written out by hand, among them a tie whose kept bit is the implicit one.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from oracles import ML_DTYPES, all_patterns, identical_values
from test_rounding import DETERMINISTIC, NARROW, SMALL

from precisionlab.formats import FORMATS, get_format
from precisionlab.rounding import decompose, round_to, rounding_trace

_UINT = {1: np.uint8, 2: np.uint16}


def _fields(x: float, name: str) -> tuple[int, int, int]:
    """(sign, exponent field, fraction field) of x cast by ml_dtypes."""
    f = get_format(name)
    dt = np.dtype(ML_DTYPES[name])
    with np.errstate(over="ignore", invalid="ignore"):
        w = int(np.array(x).astype(dt).view(_UINT[dt.itemsize]))
    m, e = f.mantissa_bits, f.exponent_bits
    return w >> (m + e), (w >> m) & ((1 << e) - 1), w & ((1 << m) - 1)


# ------------------------------------------------------------------ decompose


@pytest.mark.parametrize("name", SMALL)
def test_decompose_fields_equal_the_stored_bit_patterns(name):
    fmt = FORMATS[name]
    dt = np.dtype(ML_DTYPES[name])
    step = 1 if dt.itemsize == 1 else 97  # every fp8 pattern, a spread of 16-bit ones
    values = all_patterns(name)
    for pattern in range(0, 2 ** (8 * dt.itemsize), step):
        v = float(values[pattern])
        f = decompose(v, name)
        if math.isnan(v):
            assert f.kind == "nan"
            continue
        want = f"{pattern:0{fmt.total_bits}b}"
        assert f.bits.replace(" ", "") == want, (name, v, f.bits, want)


@pytest.mark.parametrize("name", ["float16", "bfloat16", "float8_e4m3fn", "float8_e5m2"])
def test_decompose_matches_the_bit_patterns_of_ml_dtypes(name):
    f = get_format(name)
    for x in (1.0, -1.5, f.max_finite, f.min_normal, f.min_subnormal, -3 * f.min_subnormal,
              0.0, -0.0, math.nan, math.inf if f.has_inf else None):
        if x is None:
            continue
        d = decompose(x, name)
        assert (d.sign, d.exponent, d.mantissa) == _fields(x, name), (name, x)
        assert d.bits == f"{d.sign} {d.exponent:0{f.exponent_bits}b} {d.mantissa:0{f.mantissa_bits}b}"
        assert identical_values([d.value], [x]).all() and d.fmt == f.name
    assert decompose(1.5, name).kind == "normal"
    assert decompose(f.min_subnormal, name).kind == "subnormal"
    assert decompose(math.nan, name).kind == "nan" and decompose(math.nan, name).meaning == "NaN"


def test_decompose_writes_out_the_meaning():
    assert decompose(-1.5, "float16").meaning == "(-1)^1 * 2^0 * 1.1000000000b = -1.5"
    assert decompose(2.0**-24, "float16").meaning == "(-1)^0 * 2^-14 * 0.0000000001b = 5.960464477539063e-08"
    inf = decompose(-math.inf, "float16")
    assert (inf.kind, inf.meaning, inf.exponent, inf.mantissa) == ("inf", "-inf", 31, 0)
    assert decompose(-0.0, "bfloat16").meaning == "-0"
    assert str(decompose(1.0, "bfloat16")) == \
        "      bfloat16  0 01111111 0000000  normal     (-1)^0 * 2^0 * 1.0000000b = 1.0"
    s = decompose(1 + 2.0**-12, "float16", "stochastic")  # draws from a fixed generator
    assert s.value in (1.0, 1 + 2.0**-10)


# ------------------------------------------------------------------ rounding_trace


def test_rounding_trace_agrees_with_round_to():
    rng = np.random.default_rng(12)
    for name in NARROW:
        for mode in DETERMINISTIC:
            signs = rng.choice([-1.0, 1.0], size=50)
            for x in (signs * np.exp(rng.uniform(np.log(0.01), np.log(100), size=50))).astype(np.float32):
                t = rounding_trace(float(x), name, mode)
                assert t.value_out == float(round_to(np.float32(x).reshape(1), name, mode)[0])
    with pytest.raises(ValueError) as err:
        rounding_trace(1.0, "bfloat16", "stochastic")
    assert "mode='stochastic'" in str(err.value)
    assert "valid choices: " + ", ".join(DETERMINISTIC) in str(err.value)


def test_rounding_trace_at_a_tie_whose_kept_bit_is_the_implicit_one():
    # float8_e4m3fn's two smallest subnormals, 2^-9 (odd) and 2^-8: the tie goes to 2^-8
    x = 1.5 * 2.0**-9
    t = rounding_trace(x, "float8_e4m3fn")
    assert t.dropped_bits == 23 and t.value_out == 2.0**-8 == round_to(x, "float8_e4m3fn")
    assert t.bits_in == "0 01110110 |10000000000000000000000"
    assert t.bits_out == "0 01110111 |00000000000000000000000"
    assert t.increment == 2**22


def test_rounding_trace_fields_for_one_value():
    t = rounding_trace(-1.0 - 2.0**-8 - 2.0**-9, "bfloat16", "nearest_even")
    assert (t.x, t.fmt, t.mode, t.dropped_bits, t.increment) == (-1.0 - 3 * 2.0**-9, "bfloat16",
                                                                  "nearest_even", 16, 0x7FFF)
    assert t.bits_in == "1 01111111 0000000|1100000000000000"
    assert t.bits_out == "1 01111111 0000001|0000000000000000"
    assert t.value_out == -1.0 - 2.0**-7
