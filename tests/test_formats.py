"""The format registry against independent sources: ml_dtypes.finfo, torch.finfo and the layout formula."""

import ml_dtypes
import numpy as np
import pytest
import torch

from precisionlab.formats import FORMAT_NAMES, FORMATS, FloatFormat, get_format

# The library dtype that has each format (tf32 has none: it is checked by formula and masking).
ML = {
    "float64": np.float64,
    "float32": np.float32,
    "float16": np.float16,
    "bfloat16": ml_dtypes.bfloat16,
    "float8_e4m3fn": ml_dtypes.float8_e4m3fn,
    "float8_e5m2": ml_dtypes.float8_e5m2,
}


def test_registry_has_the_seven_formats_in_order():
    assert FORMAT_NAMES == (
        "float64", "float32", "tf32", "float16", "bfloat16", "float8_e4m3fn", "float8_e5m2"
    )


@pytest.mark.parametrize("name", [n for n in FORMAT_NAMES if n in ML])
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


@pytest.mark.parametrize("name", [n for n in FORMAT_NAMES if n != "tf32"])
def test_constants_match_torch_finfo(name):
    f = FORMATS[name]
    fi = torch.finfo(f.torch_dtype)
    assert (f.max_finite, f.min_normal, f.eps) == (fi.max, fi.smallest_normal, fi.eps)
    assert f.torch_dtype.itemsize * 8 == f.total_bits


@pytest.mark.parametrize("f", FORMATS.values(), ids=FORMAT_NAMES)
def test_constants_follow_the_layout(f: FloatFormat):
    m = f.mantissa_bits
    assert f.bias == 2 ** (f.exponent_bits - 1) - 1
    assert f.min_normal == 2.0**f.emin
    assert f.min_subnormal == 2.0 ** (f.emin - m)
    # The top binade holds every fraction, except e4m3fn's all-ones pattern, which is NaN.
    top_fraction = 2**m - 1 if f.has_inf else 2**m - 2
    assert f.max_finite == (1 + top_fraction / 2**m) * 2.0**f.emax
    assert f.unit_roundoff == 2.0 ** -f.precision


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
    assert all(name in text for name in FORMAT_NAMES)
