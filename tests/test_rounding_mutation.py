"""precisionlab.rounding on the cases a mutation run (scripts/mutation_run.py) found untested.

* Inputs of a handful of values (round_to's Python-int tier) in every format, deterministic
  mode, container (float32, float64) and overflow rule, on values placed at every boundary
  the kernel compares: ties, one container ulp either side, half the smallest subnormal,
  the subnormal/normal seam, the last binade before overflow and past it. Oracle: the
  sorted table of the format's values decoded by ml_dtypes (tests/oracles.py).
* Stochastic rounding against fixed values derived independently: SplitMix64 written out
  from its published definition (checked on its known first outputs), the documented draw
  per element (SplitMix64(seed + i), 63 bits) and the decision rule in exact rationals:
  up iff (draw mod N) + k >= N with N, k the neighbours' gap and the dropped part in
  container ulps; below the smallest subnormal q, up iff draw < (|x| / q) 2^63.
* ulp/next_up/next_down at the infinities, the float64 -> float32 native cast, decompose
  against ml_dtypes' bit patterns, rounding_trace at a tie whose kept bit is the implicit one.
"""

from __future__ import annotations

import math
from fractions import Fraction

import ml_dtypes
import numpy as np
import pytest
import torch
from oracles import ML_DTYPES, finite_values, same_bits, table_round

from precisionlab.formats import get_format
from precisionlab.rounding import (
    DETERMINISTIC_MODES,
    decompose,
    next_down,
    next_up,
    round_to,
    rounding_trace,
    seed_generator,
    ulp,
)

FORMATS = ("float16", "bfloat16", "tf32", "float8_e4m3fn", "float8_e5m2")
HANDFUL = 4  # inputs of up to this many values take the Python-int tier


def boundary_values(name: str, dtype) -> np.ndarray:
    """Values at every threshold the rounding kernel compares, in the container dtype."""
    fmt = get_format(name)
    v = finite_values(name)
    pos = v[v > 0]
    picks = np.concatenate([pos[:6], pos[len(pos) // 2 - 3: len(pos) // 2 + 3], pos[-6:],
                            pos[np.searchsorted(pos, fmt.min_normal) - 3:][:6]])
    nxt = pos[np.minimum(np.searchsorted(pos, picks) + 1, len(pos) - 1)]
    mids = (picks + nxt) / 2  # ties (exact in float64)
    q = fmt.min_subnormal
    top = fmt.max_finite + 2.0 ** (fmt.emax - fmt.mantissa_bits - 1)  # max + ulp/2: the overflow tie
    extra = [q / 2, q / 4, 0.75 * q, 1.25 * q, 1.5 * q, 3 * q / 8, top, 1.5 * fmt.max_finite, 1e30]
    base = np.concatenate([picks, mids, extra])
    c = np.dtype(dtype).type
    with np.errstate(over="ignore"):  # 1e30 and the overflow tie may not fit the container
        base = base.astype(dtype)
    out = [base]
    for x in base:  # one container ulp either side of each
        out.append(np.array([np.nextafter(x, c(0)), np.nextafter(x, c(np.inf))], dtype=dtype))
    if dtype == np.float64:  # not float32 values: a second rounding would go wrong here
        out.append((mids * (1 + 2.0**-40)).astype(dtype))
        out.append((mids * (1 - 2.0**-40)).astype(dtype))
    x = np.concatenate(out)
    x = x[np.isfinite(x)]
    x = np.concatenate([x, -x, np.array([0.0, -0.0, np.inf, -np.inf, np.nan], dtype=dtype)])
    return x.astype(dtype)


def in_handfuls(x: np.ndarray, fmt: str, mode: str, **kw) -> np.ndarray:
    """round_to over x, HANDFUL values per call."""
    return np.concatenate([round_to(np.ascontiguousarray(x[i:i + HANDFUL]), fmt, mode, **kw)
                           for i in range(0, len(x), HANDFUL)])


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("fmt", FORMATS)
def test_a_handful_of_values_rounds_like_the_table_in_every_mode(fmt, dtype):
    x = boundary_values(fmt, dtype)
    for saturate in (False, True) if fmt in ("float16", "float8_e4m3fn") else (False,):
        for mode in DETERMINISTIC_MODES:
            got = in_handfuls(x, fmt, mode, saturate=saturate, backend="emulated")
            want = table_round(x, fmt, mode, saturate=saturate)
            bad = ~same_bits(got, want)
            assert not bad.any(), (fmt, mode, saturate, x[bad][:4], got[bad][:4], want[bad][:4])


# --------------------------------------------------------------------------- stochastic rounding

_M64 = (1 << 64) - 1


def splitmix64(z: int) -> int:
    """SplitMix64's output for state z (Steele, Lea and Flood 2014; Vigna's reference code)."""
    z = (z + 0x9E3779B97F4A7C15) & _M64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _M64
    return z ^ (z >> 31)


def test_splitmix64_oracle_gives_the_published_first_outputs():
    assert splitmix64(0) == 0xE220A8397B1DCDAF
    assert splitmix64(0x9E3779B97F4A7C15) == 0x6E789E6AA1B965F4


def _container_ulp(x: float, dtype) -> Fraction:
    """The gap of the container format (float32 or float64) at |x|."""
    info = np.finfo(dtype)
    e = max(math.frexp(abs(x))[1] - 1, int(info.minexp))
    return Fraction(2) ** (e - int(info.nmant))


def stochastic_oracle(x: np.ndarray, fmt: str, seed: int, los=None, his=None) -> np.ndarray:
    """Element i rounds up (in magnitude) iff its draw SplitMix64(seed + i) >> 1 says so.

    Below q the draw is compared with (|x| / q) 2^63, unless fmt's normal range reaches down
    to the container's (bfloat16 from float32): then q is a multiple of the container's own
    subnormal gap and the rule of the normal range applies.
    """
    f = get_format(fmt)
    own_tiny = f.emin > np.finfo(x.dtype).minexp
    if los is None:  # the neighbours below and above |x| (may be given, for speed)
        los = np.abs(table_round(np.abs(x), fmt, "toward_zero"))
        his = np.abs(table_round(np.abs(x), fmt, "up"))
    out = np.empty(len(x))
    for i, (xi, lo, hi) in enumerate(zip(x.tolist(), los.tolist(), his.tolist(), strict=True)):
        r = splitmix64((seed + i) & _M64) >> 1
        if lo == hi:
            mag = lo
        elif own_tiny and abs(xi) < f.min_subnormal:
            mag = hi if r < Fraction(abs(xi)) / Fraction(f.min_subnormal) * 2**63 else 0.0
        else:
            u = _container_ulp(xi, x.dtype)
            n, k = (Fraction(hi) - Fraction(lo)) / u, (Fraction(abs(xi)) - Fraction(lo)) / u
            assert n.denominator == 1 and k.denominator == 1
            mag = hi if (r % int(n)) + int(k) >= int(n) else lo
        out[i] = -mag if xi < 0 else mag
    return out


def _seed_of(rng_seed: int) -> int:
    """The seed round_to draws from np.random.default_rng(rng_seed) for one call."""
    return int(np.random.default_rng(rng_seed).integers(0, 2**63))


@pytest.mark.parametrize("fmt", ["float16", "bfloat16", "float8_e5m2"])
@pytest.mark.parametrize("n", [3, 40])  # the Python-int tier and the NumPy tier
def test_stochastic_rounding_draws_splitmix64_per_element(fmt, n):
    f = get_format(fmt)
    g = np.random.default_rng(5)
    q = f.min_subnormal
    # normal values, subnormals and values below q (the tiny case), both signs
    x = np.concatenate([g.uniform(1, 2, n) * 2.0 ** g.integers(-3, 4, n),
                        g.uniform(0.01, 0.99, n) * q, g.uniform(1, 9, n) * q])
    x = (x * np.where(g.random(x.size) < 0.5, -1, 1)).astype(np.float32)
    for s in range(3):
        got = np.concatenate([round_to(x[i:i + n], fmt, "stochastic", generator=np.random.default_rng(s))
                              for i in range(0, len(x), n)])
        want = np.concatenate([stochastic_oracle(x[i:i + n], fmt, _seed_of(s))
                               for i in range(0, len(x), n)])
        assert same_bits(got, want).all(), (fmt, n, s)


def test_stochastic_rounding_of_a_float64_handful_uses_the_float64_words():
    x = np.array([1 + 2.0**-30, -(1 + 3 * 2.0**-12), 2.0**-26, 3 * 2.0**-25])
    got = round_to(x, "float16", "stochastic", generator=np.random.default_rng(9))
    assert same_bits(got, stochastic_oracle(x, "float16", _seed_of(9))).all()


@pytest.mark.parametrize("n", [4, 400])  # the Python-int tier and the NumPy tier
def test_stochastic_rounding_far_below_the_smallest_subnormal(n):
    # float64 values 1.9 2^-12 of float16's q = 2^-24 (so the draw's threshold is shifted
    # right, not left) and 1e-300 (never up); 10,000 draws see a few ups
    x = np.tile([1.9 * 2.0**-36, -1.9 * 2.0**-36, 1.9 * 2.0**-36, 1e-300], 2500)
    los = np.abs(table_round(np.abs(x), "float16", "toward_zero"))
    his = np.abs(table_round(np.abs(x), "float16", "up"))
    got, want = [], []
    for i in range(0, x.size, n):
        part = slice(i, i + n)
        got.append(round_to(x[part], "float16", "stochastic", generator=np.random.default_rng(i)))
        want.append(stochastic_oracle(x[part], "float16", _seed_of(i), los[part], his[part]))
    got, want = np.concatenate(got), np.concatenate(want)
    assert same_bits(got, want).all()
    assert 0 < np.count_nonzero(want) < 20 and not want[3::4].any()


def test_python_scalars_integers_and_shapes():
    assert round_to(7, "float8_e4m3fn") == 7.0 and round_to(True, "bfloat16") == 1.0
    assert round_to(2**60 + 1, "float32") == float(2**60)
    for shape in [(), (2, 2), (3, 5)]:
        x = np.arange(1, 1 + math.prod(shape), dtype=np.float32).reshape(shape) * 1.01
        got = round_to(x, "bfloat16", "up", backend="emulated")
        assert got.shape == shape
        assert same_bits(got, table_round(x, "bfloat16", "up")).all()


def test_formats_that_hold_every_input_copy_it():
    x = np.array([1 / 3, -1e-40, 3e38, np.nan], dtype=np.float32)
    for fmt in ("float32", "float64"):
        got = round_to(x, fmt)
        assert got.dtype == np.float32 and same_bits(got, x).all()
    y = x.astype(np.float64) * (1 + 2.0**-40)
    assert same_bits(round_to(y, "float64"), y).all()


def test_a_wrong_out_array_is_described():
    x = np.ones(4, dtype=np.float32)
    with pytest.raises(ValueError, match=r"^out must be a C-contiguous NumPy array of shape \(4,\) and dtype "
                                         r"float32 for a NumPy input; got ndarray \(3,\) float64$"):
        round_to(x, "bfloat16", out=np.empty(3))
    with pytest.raises(ValueError, match=r"got list  $"):
        round_to(x, "bfloat16", out=[0.0] * 4)


# --------------------------------------------------------------------------- neighbours and casts


@pytest.mark.parametrize("fmt", ["float16", "bfloat16", "float8_e5m2", "float32"])
def test_neighbours_at_the_infinities_and_nan(fmt):
    m = get_format(fmt).max_finite
    assert next_up(-math.inf, fmt) == -m and next_down(math.inf, fmt) == m
    assert next_up(math.inf, fmt) == math.inf and next_down(-math.inf, fmt) == -math.inf
    assert math.isnan(next_up(math.nan, fmt)) and math.isnan(next_down(math.nan, fmt))
    assert next_up(m, fmt) == math.inf and next_down(-m, fmt) == -math.inf
    got = next_up(torch.tensor([-math.inf, 0.0], dtype=torch.float64), fmt)
    assert isinstance(got, torch.Tensor) and got.tolist() == [-m, get_format(fmt).min_subnormal]
    assert ulp(torch.tensor([1.0]), fmt).tolist() == [get_format(fmt).eps]


def test_float64_to_float32_has_an_exact_native_cast():
    x = np.random.default_rng(1).standard_normal(50) * 1e3
    want = x.astype(np.float32)
    assert same_bits(round_to(x, "float32", backend="native"), want).all()
    assert same_bits(round_to(x, "float32", backend="emulated"), want).all()
    with pytest.raises(ValueError, match=r"no exact native cast for float64 -> float32 with mode='nearest_even', saturate=True"):
        round_to(x, "float32", saturate=True, backend="native")


# --------------------------------------------------------------------------- decompose and trace

_UINT = {1: np.uint8, 2: np.uint16}


def _fields(x: float, name: str) -> tuple[int, int, int]:
    """(sign, exponent field, fraction field) of x cast by ml_dtypes."""
    f = get_format(name)
    dt = np.dtype(ML_DTYPES[name])
    with np.errstate(over="ignore", invalid="ignore"):
        w = int(np.array(x).astype(dt).view(_UINT[dt.itemsize]))
    m, e = f.mantissa_bits, f.exponent_bits
    return w >> (m + e), (w >> m) & ((1 << e) - 1), w & ((1 << m) - 1)


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
        assert same_bits([d.value], [x]).all() and d.fmt == f.name
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


def test_seed_generator_names_the_parameter():
    assert seed_generator(3).integers(0, 100) == np.random.default_rng(3).integers(0, 100)
    with pytest.raises(ValueError, match=r"^seed must be an integer >= 0 \(the seed of np.random.default_rng\); got seed=-1$"):
        seed_generator(-1)
    with pytest.raises(ValueError, match=r"^steps must be an integer >= 0.*got steps=1.5$"):
        seed_generator(1.5, "steps")
    with pytest.raises(ValueError, match=r"got seed=True$"):
        seed_generator(True)
    assert seed_generator(np.int64(2)).integers(0, 100) == np.random.default_rng(2).integers(0, 100)


def test_a_bfloat16_tensor_input_is_widened_exactly():
    x = torch.tensor([1.0 + 2.0**-7, -3.0], dtype=torch.bfloat16)
    got = round_to(x, "float8_e5m2")
    assert got.dtype == torch.float32
    want = np.array([1.0 + 2.0**-7, -3.0], dtype=np.float32).astype(ml_dtypes.float8_e5m2).astype(np.float32)
    assert got.tolist() == want.tolist()
