"""The format registry against independent sources: ml_dtypes.finfo, torch.finfo and the layout formula.

The MX formats (float4/float6 elements, the e8m0fnu scale) are also rounded into by round_to
and checked against ml_dtypes casts over every value, every tie and random bit patterns.

ml_dtypes' casts are an oracle only where they are one correct rounding in every release
that pyproject.toml admits (ml_dtypes >= 0.4): from float32 inputs. From float64, releases
before 0.7 round through float32 (twice) and 0.7.0 rounds once, so the tests below hold
round_to to the exact answer (found by search in the sorted values, or with fractions) and
state each ml_dtypes behaviour for the releases it belongs to. ml_dtypes before 0.5 has no
MX dtypes: the MX tests are skipped there. ml_dtypes 0.5.0's e8m0fnu cast follows another rule
(ML_DTYPES_E8M0_DIFFERS below): the e8m0fnu comparisons with it are skipped there.
"""

import re
from fractions import Fraction

import ml_dtypes
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from precisionlab.formats import (
    FORMAT_NAMES,
    FORMATS,
    MX_FORMAT_NAMES,
    FloatFormat,
    contains,
    get_format,
)
from precisionlab.rounding import decompose, next_down, next_up, round_to

# The library dtype that has each format (tf32 has none: it is checked by formula and masking).
ML = {
    "float64": np.float64,
    "float32": np.float32,
    "float16": np.float16,
    "bfloat16": ml_dtypes.bfloat16,
    "float8_e4m3fn": ml_dtypes.float8_e4m3fn,
    "float8_e5m2": ml_dtypes.float8_e5m2,
}
ML.update({name: getattr(ml_dtypes, name) for name in MX_FORMAT_NAMES if hasattr(ml_dtypes, name)})
ML_DTYPES_VERSION = tuple(int(v) for v in re.findall(r"\d+", ml_dtypes.__version__)[:2])
# 0.7.0 casts float64 in one rounding and takes e8m0fnu's float32 subnormals to the nearest
# value; every earlier release rounds float64 through float32 and has the subnormal quirk.
ML_DTYPES_ROUNDS_ONCE = ML_DTYPES_VERSION >= (0, 7)
# ml_dtypes 0.5.0, the first release with MX dtypes, casts float32 into e8m0fnu by another tie
# rule: ties go to the even exponent code, so the tie 1.5 * 2^127 stays finite (code 254) where
# later releases round it up to NaN; values above it (1.9 * 2^127, inf) are NaN in every
# release. Measured: 0.75, 1.5, 3, 6, 12 and 1.5 * 2^127 give 0.5, 2, 2, 8, 8 and 2^127 there,
# but 1, 2, 4, 8, 16 and NaN in 0.5.1 to 0.7.0. So 0.5.0's e8m0fnu cast is no oracle; its other
# MX casts are.
ML_DTYPES_RELEASE = tuple(int(v) for v in re.findall(r"\d+", ml_dtypes.__version__)[:3])
ML_DTYPES_E8M0_DIFFERS = ML_DTYPES_RELEASE == (0, 5, 0)
E8M0_SKIP = (f"ml_dtypes {ml_dtypes.__version__} rounds e8m0fnu ties to the even exponent code "
             "(measured: 0.75, 3, 12 -> 0.5, 2, 8; 1.5 * 2^127 stays finite): no oracle")
needs_mx_dtypes = pytest.mark.skipif(
    not all(name in ML for name in MX_FORMAT_NAMES),
    reason=f"ml_dtypes {ml_dtypes.__version__} has no MX dtypes (they came with 0.5)")


def test_registry_has_the_seven_formats_in_order():
    assert FORMAT_NAMES == (
        "float64", "float32", "tf32", "float16", "bfloat16", "float8_e4m3fn", "float8_e5m2"
    )


def test_mx_formats_join_the_registry_after_the_chapter_list():
    assert MX_FORMAT_NAMES == ("float6_e3m2fn", "float6_e2m3fn", "float4_e2m1fn", "float8_e8m0fnu")
    assert tuple(FORMATS) == FORMAT_NAMES + MX_FORMAT_NAMES


@pytest.mark.parametrize("name", [n for n in FORMATS if n in ML])
def test_constants_match_ml_dtypes_finfo(name):
    f, fi = FORMATS[name], ml_dtypes.finfo(ML[name])
    assert f.max_finite == float(fi.max)
    assert f.min_normal == float(fi.smallest_normal)
    assert f.min_subnormal == float(fi.smallest_subnormal)
    assert f.eps == float(fi.eps)
    assert f.mantissa_bits == fi.nmant
    assert f.exponent_bits == fi.nexp
    assert f.total_bits == fi.bits
    assert f.emin == fi.minexp


@pytest.mark.parametrize("name", [n for n in FORMATS if FORMATS[n].torch_dtype is not None])
def test_constants_match_torch_finfo(name):
    f = FORMATS[name]
    fi = torch.finfo(f.torch_dtype)
    assert (f.max_finite, f.min_normal, f.eps) == (fi.max, fi.smallest_normal, fi.eps)
    assert f.torch_dtype.itemsize * 8 == f.total_bits


@pytest.mark.parametrize("f", FORMATS.values(), ids=list(FORMATS))
def test_constants_follow_the_layout(f: FloatFormat):
    e, m = f.exponent_bits, f.mantissa_bits
    assert f.bias == 2 ** (e - 1) - 1
    # Exponent field 0 holds subnormals when there is a fraction; e8m0fnu's field 0 is 2^-bias.
    emin = 1 - f.bias if m > 0 else -f.bias
    assert f.emin == emin
    assert f.min_normal == 2.0**emin
    assert f.min_subnormal == 2.0 ** (emin - m)
    # The all-ones exponent is inf/NaN in IEEE formats; e4m3fn keeps it for numbers but one
    # fraction (NaN); the MX element formats keep all of it; e8m0fnu's all-ones pattern is NaN.
    top_field = 2**e - 1 - (1 if f.has_inf or (f.has_nan and m == 0) else 0)
    top_fraction = 2**m - 1 - (1 if f.has_nan and not f.has_inf and m > 0 else 0)
    assert f.emax == top_field - f.bias
    assert f.max_finite == (1 + top_fraction / 2**m) * 2.0**f.emax
    assert f.unit_roundoff == 2.0 ** -f.precision
    assert f.total_bits == (1 if f.signed else 0) + e + m


def test_tf32_is_float32_with_thirteen_bits_cleared():
    bits = np.array([np.finfo(np.float32).max, np.finfo(np.float32).tiny], np.float32).view(np.uint32)
    masked = (bits & np.uint32(0xFFFFE000)).view(np.float32)
    tf32 = FORMATS["tf32"]
    assert float(masked[0]) == tf32.max_finite
    assert float(masked[1]) == tf32.min_normal
    assert tf32.min_subnormal == float(np.array(1 << 13, np.uint32).view(np.float32))


@pytest.mark.parametrize(
    "key, name",
    [("fp16", "float16"), ("BF16", "bfloat16"), ("e4m3", "float8_e4m3fn"), (torch.bfloat16, "bfloat16"),
     (torch.float8_e5m2, "float8_e5m2"), ("tf32", "tf32")],
)
def test_lookup_by_alias_and_torch_dtype(key, name):
    assert get_format(key) is FORMATS[name]
    assert get_format(FORMATS[name]) is FORMATS[name]


@pytest.mark.parametrize("bad", ["fp12", "float8", "", torch.int32])
def test_unknown_format_names_the_bad_value_and_the_choices(bad):
    with pytest.raises(ValueError) as err:
        get_format(bad)
    text = str(err.value)
    assert repr(bad) in text
    assert all(name in text for name in FORMAT_NAMES + MX_FORMAT_NAMES)


# --------------------------------------------------------------------------- MX formats in round_to

ALL_BITS = {"float4_e2m1fn": 16, "float6_e3m2fn": 64, "float6_e2m3fn": 64, "float8_e8m0fnu": 256}


def _values(name) -> np.ndarray:
    """Every value of an MX format, decoded by ml_dtypes from each bit pattern (NaN dropped)."""
    v = np.arange(ALL_BITS[name], dtype=np.uint8).view(ML[name]).astype(np.float64)
    return v[~np.isnan(v)]


def _same(a, b) -> bool:
    """Bitwise equal as float64, NaN matching NaN whatever its payload or sign."""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    nan = np.isnan(a)
    return bool(np.array_equal(nan, np.isnan(b)) and np.array_equal(a[~nan].view(np.int64),
                                                                     b[~nan].view(np.int64)))


def _oracle(x: np.ndarray, name: str) -> np.ndarray:
    """ml_dtypes' cast of x into the format, read back as x's dtype."""
    with np.errstate(invalid="ignore"):
        return x.astype(ML[name]).astype(x.dtype)


def _hard_inputs(name: str, dtype) -> np.ndarray:
    """Every value, every midpoint and its two float neighbours, the range ends, +-inf, -0."""
    v = np.unique(np.abs(_values(name)))
    mid = (v[:-1] + v[1:]) / 2  # exact in float64 and, for these grids, in float32
    top = v[-1] + (v[-1] - v[-2]) * np.array([0.25, 0.5, 0.75, 1.0, 4.0])  # past max_finite
    low = v[v > 0][0] * np.array([0.25, 0.5, 0.75, 2.0**-40])  # below the smallest value
    with np.errstate(over="ignore"):  # e8m0's points past 2^127 are inf in float32
        pts = np.concatenate([v, mid, top, low, [1e30, np.inf]]).astype(dtype)
    near = np.concatenate([np.nextafter(pts, pts.dtype.type(np.inf)),
                           np.nextafter(pts, pts.dtype.type(0))])
    pts = np.concatenate([pts, near])
    return np.concatenate([pts, -pts, [-0.0]]).astype(dtype)


def _nearest(x: np.ndarray, name: str) -> np.ndarray:
    """Round to nearest by search in the sorted values: ties to the even bit pattern (e8m0: up)."""
    f = FORMATS[name]
    codes = np.arange(ALL_BITS[name], dtype=np.uint8)
    vals = codes.view(ML[name]).astype(np.float64)
    keep = ~np.isnan(vals) & ~((vals == 0) & np.signbit(vals))
    vals, codes = vals[keep], codes[keep]
    order = np.argsort(vals)
    vals, codes = vals[order], codes[order]
    xc = np.clip(x, vals[0], vals[-1])  # saturate (e8m0 overflow is patched below)
    i = np.clip(np.searchsorted(vals, xc, side="left"), 1, len(vals) - 1)
    lo, hi = vals[i - 1], vals[i]
    tie_up = (codes[i] % 2 == 0) if f.signed else np.ones(len(x), bool)
    out = np.where(xc - lo < hi - xc, lo, np.where(xc - lo > hi - xc, hi,
                                                   np.where(tie_up, hi, lo)))
    out = np.where(xc == lo, lo, out)
    out = np.where((out == 0) & np.signbit(x), -0.0, out)  # a zero keeps x's sign
    if not f.signed:  # e8m0: NaN for x <= 0, NaN and for what rounds past 2^127
        over = x >= vals[-1] * 1.5
        out = np.where(~(x > 0) | over, np.nan, out)
    else:
        out = np.where(np.isnan(x), np.nan, out)
    return out


def _e8m0_quirk(x: np.ndarray) -> np.ndarray:
    """Where ml_dtypes before 0.7 (and torch 2.13) take a float32 to e8m0fnu's 2^-126, although
    2^-127 is nearer: the subnormals in (2^-127, 1.5 * 2^-127), a binade their bit recipe treats
    as evenly spaced. ml_dtypes 0.7.0 rounds them to the nearest value, 2^-127."""
    return (np.abs(x) > 2.0**-127) & (np.abs(x) < 1.5 * 2.0**-127)


@needs_mx_dtypes
@pytest.mark.parametrize("name", MX_FORMAT_NAMES)
def test_mx_round_to_is_nearest_and_matches_ml_dtypes_casts_of_float32(name):
    """Every value, tie and range end as float32: round_to is the nearest value, and so is
    ml_dtypes' cast, except in the e8m0fnu subnormal binade before ml_dtypes 0.7."""
    x = _hard_inputs(name, np.float32)
    got = round_to(x, name)
    assert _same(got, _nearest(x.astype(np.float64), name))
    # Every representable value is a fixed point, -0 included where the format has it.
    v = _values(name).astype(np.float32)
    assert _same(round_to(v, name), v)
    if name == "float8_e8m0fnu":
        if ML_DTYPES_E8M0_DIFFERS:
            pytest.skip(E8M0_SKIP)
        quirk = _e8m0_quirk(x) & (x > 0)
        assert quirk.any() and (got[quirk] == 2.0**-127).all()  # the nearest value
        old_rule = (_oracle(x[quirk], name) == 2.0**-126).all()
        assert old_rule != ML_DTYPES_ROUNDS_ONCE  # the quirk belongs to ml_dtypes < 0.7
        if not ML_DTYPES_ROUNDS_ONCE:
            x, got = x[~quirk], got[~quirk]
    assert _same(got, _oracle(x, name))


def _float32_tie_and_float64_neighbour(name: str) -> tuple[float, float]:
    """(t, x): t a tie between two neighbouring values (exact in float32), and x the float64 next
    to t on the side its tie rule does not take, so that float32(x) = t: rounded once x goes one
    way, rounded through float32 it lands on t and goes the other."""
    f = FORMATS[name]
    t = 1 + 2.0 ** -(f.mantissa_bits + 1)  # between 1 and 1 + 2^-m (e8m0fnu: 1.5, between 1 and 2)
    # ties to even go down to 1 (fraction 0); e8m0fnu's ties go up, to 2
    x = np.nextafter(t, np.inf) if f.signed else np.nextafter(t, 0.0)
    return t, float(x)


@needs_mx_dtypes
@pytest.mark.parametrize("name", MX_FORMAT_NAMES)
def test_mx_round_to_rounds_float64_once_where_float32_would_make_a_tie(name):
    x = _hard_inputs(name, np.float64)
    assert _same(round_to(x, name), _nearest(x, name))
    t, near_tie = _float32_tie_and_float64_neighbour(name)
    assert float(np.float32(near_tie)) == t  # float32 rounds the float64 input onto the tie
    once = float(round_to(near_tie, name))
    twice = float(round_to(float(round_to(near_tie, "float32")), name))
    lo, hi = 1.0, 1 + (2.0 ** -FORMATS[name].mantissa_bits if FORMATS[name].signed else 1.0)
    # the exact answer: the neighbour of x nearer in rational arithmetic; the tie rule at t
    nearer = lo if Fraction(near_tie) - Fraction(lo) < Fraction(hi) - Fraction(near_tie) else hi
    assert once == nearer and twice == ({lo, hi} - {nearer}).pop() != once
    if name == "float8_e8m0fnu" and ML_DTYPES_E8M0_DIFFERS:
        pytest.skip(E8M0_SKIP)
    # ml_dtypes' cast of the exact float32 tie is a single rounding in every release
    assert twice == float(np.array([t], np.float32).astype(ML[name]).astype(np.float64)[0])
    # from float64, ml_dtypes rounds once from 0.7.0 on, through float32 (twice) before
    by_ml_dtypes = float(_oracle(np.array([near_tie]), name)[0])
    assert by_ml_dtypes == (once if ML_DTYPES_ROUNDS_ONCE else twice)


@needs_mx_dtypes
@pytest.mark.parametrize("name", MX_FORMAT_NAMES)
@pytest.mark.parametrize("size", [3, 700, 5000])  # the Python, NumPy and numba tiers
def test_mx_round_to_matches_ml_dtypes_on_random_float32_patterns(name, size):
    bits = np.random.default_rng(size).integers(0, 2**32, size, dtype=np.uint64)
    x = bits.astype(np.uint32).view(np.float32)
    x = x[~np.isnan(x)] if FORMATS[name].signed else x  # the elements' NaN rule: next test
    if not FORMATS[name].signed and not ML_DTYPES_ROUNDS_ONCE:
        x = x[~_e8m0_quirk(x)]  # ml_dtypes < 0.7's subnormal quirk (tested above)
    with np.errstate(invalid="ignore", over="ignore"):  # signalling NaNs; e8m0's 2^128 range
        wide = x.astype(np.float64)
        # The same inputs folded into the format's own range, where most values are not extreme.
        y = (wide % (2 * FORMATS[name].max_finite)).astype(np.float32)
    assert _same(round_to(x, name), _nearest(wide, name))
    if not FORMATS[name].signed and ML_DTYPES_E8M0_DIFFERS:
        pytest.skip(E8M0_SKIP)
    assert _same(round_to(x, name), _oracle(x, name))
    assert _same(round_to(y, name), _oracle(y, name))


@needs_mx_dtypes
@pytest.mark.parametrize("name", ["float4_e2m1fn", "float6_e3m2fn", "float6_e2m3fn"])
def test_mx_element_formats_saturate_and_keep_nan_visible(name):
    f = FORMATS[name]
    x = np.array([np.inf, -np.inf, 1e30, -f.max_finite * 1.5, np.nan], np.float32)
    for saturate in (False, True):  # no inf, no NaN: overflow can only saturate
        r = round_to(x, name, saturate=saturate)
        assert list(r[:4]) == [f.max_finite, -f.max_finite, f.max_finite, -f.max_finite]
        assert np.isnan(r[4])  # documented: ml_dtypes 0.5 to 0.7 turn NaN into a zero instead
    if ML_DTYPES_VERSION <= (0, 7):  # the releases this was measured on
        assert _oracle(x, name)[4] == 0


@needs_mx_dtypes
def test_e8m0_rules_match_ml_dtypes_and_saturate_on_request():
    x = np.array([0.0, -0.0, -1.0, np.nan, np.inf, 2.0**127 * 1.5, 2.0**-140, 3.0, 0.75])
    r = round_to(x, "float8_e8m0fnu")
    assert _same(r, [np.nan] * 6 + [2.0**-127, 4.0, 1.0])  # ties go up; nothing below 2^-127
    s = round_to(x, "float8_e8m0fnu", saturate=True)
    assert list(s[4:6]) == [2.0**127] * 2 and np.isnan(s[:4]).all()
    if ML_DTYPES_E8M0_DIFFERS:
        pytest.skip(E8M0_SKIP)
    assert _same(r, _oracle(x, "float8_e8m0fnu"))  # no input here is near a float32 tie


@needs_mx_dtypes
@pytest.mark.parametrize("mode", ["toward_zero", "up", "down", "nearest_away"])
@pytest.mark.parametrize("name", MX_FORMAT_NAMES)
def test_mx_directed_modes_pick_the_neighbour_from_the_sorted_values(name, mode):
    v = np.unique(_values(name))
    x = _hard_inputs(name, np.float64)
    x = x[np.isfinite(x) & (np.abs(x) <= v[-1]) & (np.abs(x) >= v[v > 0][0])]
    x = x[x > 0] if not FORMATS[name].signed else x
    lo = v[np.searchsorted(v, x, side="right") - 1]  # the largest value <= x
    hi = v[np.searchsorted(v, x, side="left")]  # the smallest value >= x
    want = {"toward_zero": np.where(x >= 0, lo, hi), "up": hi, "down": lo,
            "nearest_away": np.where(hi - x < x - lo, hi, np.where(hi - x > x - lo, lo,
                                                                    np.where(x >= 0, hi, lo)))}
    got = round_to(x, name, mode)
    assert np.array_equal(np.abs(got), np.abs(want[mode]))  # -0 vs 0 aside
    assert np.array_equal(np.signbit(got[got != 0]), np.signbit(x[got != 0]))


@needs_mx_dtypes
@settings(max_examples=300, deadline=None)
@given(x=st.floats(width=32, allow_nan=False), name=st.sampled_from(MX_FORMAT_NAMES))
def test_mx_round_to_matches_ml_dtypes_property(x, name):
    if not FORMATS[name].signed and not ML_DTYPES_ROUNDS_ONCE and _e8m0_quirk(np.array(x)):
        x = 2.0**-126  # ml_dtypes < 0.7's subnormal quirk (tested above) is not the format's rule
    a = np.array([x] * 5, np.float32)  # five copies: the NumPy tier as well as the Python one
    if not FORMATS[name].signed and ML_DTYPES_E8M0_DIFFERS:  # no oracle there: see E8M0_SKIP
        want = _nearest(a.astype(np.float64), name)
        assert _same(round_to(a, name), want) and _same([round_to(x, name)], want[:1])
        return
    assert _same(round_to(a, name), _oracle(a, name))
    assert _same([round_to(x, name)], _oracle(np.array([x]), name))


def test_mx_neighbours_and_bit_fields():
    assert next_up(4.0, "float4_e2m1fn") == 6.0 and np.isnan(next_up(6.0, "float4_e2m1fn"))
    assert next_down(-4.0, "float4_e2m1fn") == -6.0
    assert next_up(2.0**-127, "float8_e8m0fnu") == 2.0**-126
    assert np.isnan(next_up(2.0**127, "float8_e8m0fnu"))
    assert decompose(0.3, "float6_e3m2fn").bits == "0 001 01"  # 1.25 * 2^-2 = 0.3125
    e8 = decompose(0.25, "float8_e8m0fnu")
    assert (e8.bits, e8.value) == ("01111101", 0.25)  # 125 - 127 = -2


def _decoded_values(name: str) -> np.ndarray:
    """Every non-NaN value of an 8- or 16-bit format, decoded by ml_dtypes/NumPy (infinities kept)."""
    dt = np.dtype(ML[name])
    bits = {1: np.uint8, 2: np.uint16}[dt.itemsize]
    with np.errstate(invalid="ignore"):  # the NaN patterns
        v = np.arange(2 ** (8 * dt.itemsize), dtype=np.uint32).astype(bits).view(dt).astype(np.float64)
    return v[~np.isnan(v)]


def _all_in(v: np.ndarray, wide: str) -> bool:
    """Whether every entry of v is a value of wide: it survives a cast into wide and back."""
    if wide == "tf32":  # a float32 value whose 13 low fraction bits are zero
        f = v.astype(np.float32)
        return bool(((f.astype(np.float64) == v) & ((f.view(np.uint32) & np.uint32(0x1FFF)) == 0)).all())
    with np.errstate(invalid="ignore", over="ignore"):
        return bool((v.astype(ML[wide]).astype(np.float64) == v).all())


@pytest.mark.parametrize("narrow", [n for n in ML if n not in ("float32", "float64")])
def test_contains_agrees_with_casting_every_value_through_ml_dtypes(narrow):
    v = _decoded_values(narrow)
    for wide in [w for w in FORMATS if w in ML or w == "tf32"]:
        assert contains(wide, narrow) == _all_in(v, wide), (wide, narrow)


def test_contains_orders_the_training_formats_and_takes_aliases_and_dtypes():
    assert contains("float64", "float32") and contains("float32", "tf32")
    assert not contains("tf32", "float32") and not contains("float16", "tf32")
    assert contains("fp32", torch.bfloat16) and contains(torch.float32, "half")
    assert not contains("float16", "bfloat16") and not contains("bfloat16", "float16")
    assert all(contains(name, name) for name in FORMATS)
