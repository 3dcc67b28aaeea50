"""round_to, ulp and neighbours against independent oracles: library casts, value tables, rationals.

The value table is also checked on inputs of a handful of values (round_to's Python-int tier)
placed at every boundary the kernel compares: ties, one container ulp either side, half the
smallest subnormal, the subnormal/normal seam, the last binade before overflow and past it.
Stochastic rounding is tested in test_rounding_stochastic.py, decompose and rounding_trace in
test_rounding_display.py.
"""

import math

import ml_dtypes
import numpy as np
import pytest
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from oracles import (
    ML_DTYPES,
    all_patterns,
    finite_values,
    fraction_round,
    identical_values,
    overflow_neighbour,
    table_round,
)

from precisionlab.formats import FORMATS, get_format
from precisionlab.rounding import (
    MODES,
    next_down,
    next_up,
    round_to,
    seed_generator,
    ulp,
)
from precisionlab.rounding_kernel import PARALLEL_MIN_SIZE

# The inputs deliberately include overflow and NaN, which NumPy's casts warn about.
pytestmark = pytest.mark.filterwarnings("ignore:.*encountered in:RuntimeWarning")

SMALL = ["float16", "bfloat16", "float8_e4m3fn", "float8_e5m2"]
NARROW = ["tf32", *SMALL]
DETERMINISTIC = [m for m in MODES if m != "stochastic"]
BACKENDS = ["auto", "emulated"]
N_RANDOM = 1_000_000


def random_inputs(name: str, n: int = N_RANDOM, seed: int = 0) -> np.ndarray:
    """float32 test inputs: raw bit patterns, the format's range, exact ties, near-ties, specials."""
    fmt = get_format(name)
    rng = np.random.default_rng(seed)
    table = finite_values(fmt)
    big = overflow_neighbour(fmt)
    ext = np.concatenate([[-big], table, [big]])
    k = n // 10
    raw = rng.integers(0, 2**32, size=4 * k, dtype=np.uint64).astype(np.uint32).view(np.float32)
    scale = rng.standard_normal(2 * k) * np.exp2(
        rng.integers(fmt.emin - fmt.mantissa_bits - 3, fmt.emax + 3, size=2 * k))
    i = rng.integers(0, len(ext) - 1, size=2 * k)
    ties = (ext[i] + ext[i + 1]) / 2  # exact midpoints of neighbours, representable in float32
    j = rng.integers(0, len(ext), size=k)
    near = np.nextafter(ext[j].astype(np.float32), rng.choice([-np.inf, np.inf], size=k).astype(np.float32))
    specials = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, fmt.max_finite, -fmt.max_finite, big, -big,
                         fmt.min_subnormal, -fmt.min_subnormal, fmt.min_subnormal / 2, fmt.min_normal,
                         fmt.min_normal * (1 - 2.0**-20), 3 * fmt.min_subnormal / 4])
    rest = n - (4 * k + 2 * k + 2 * k + k)
    tail = np.resize(specials, rest)
    x = np.concatenate([raw, scale, ties, near, tail]).astype(np.float32)
    assert np.array_equal(ties.astype(np.float32).astype(np.float64), ties)  # ties really exact
    return x


@pytest.fixture(scope="module", params=NARROW)
def inputs(request):
    return request.param, random_inputs(request.param)


# ------------------------------------------------------------------ every pattern round-trips


@pytest.mark.parametrize("name", SMALL)
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_every_bit_pattern_round_trips(name, mode, dtype):
    values = all_patterns(name).astype(dtype)
    for backend in BACKENDS:
        got = round_to(values, name, mode, generator=np.random.default_rng(1), backend=backend)
        assert got.dtype == dtype
        assert identical_values(got, values).all(), (name, mode, backend)


def test_every_tf32_value_round_trips():
    values = finite_values("tf32").astype(np.float32)
    for mode in MODES:
        assert identical_values(round_to(values, "tf32", mode, generator=np.random.default_rng(2)), values).all()


# ------------------------------------------------------------------ nearest-even = the libraries


def tf32_by_bit_masks(x: np.ndarray, mode: str) -> np.ndarray:
    """Independent tf32 oracle on float32 words: add the mode's increment, clear the 13 low bits.

    Sign-magnitude words are ordered like magnitudes, so a carry out of the fraction steps
    into the next binade, and out of the largest one into the infinity pattern (0x7f800000).
    """
    w = np.asarray(x, np.float32).view(np.uint32).astype(np.int64)
    sign, mag = w & 0x80000000, w & 0x7FFFFFFF
    low = mag & 0x1FFF
    neg = sign != 0
    if mode == "nearest_even":
        inc = 0xFFF + ((mag >> 13) & 1)
    elif mode == "nearest_away":
        inc = np.full_like(mag, 0x1000)
    elif mode == "toward_zero":
        inc = np.zeros_like(mag)
    else:  # up / down: away from zero on one side, toward it on the other
        away = neg if mode == "down" else ~neg
        inc = np.where(away & (low != 0), 0x1FFF, 0)
    special = mag >= 0x7F800000  # inf and NaN words pass through (NaN stays NaN)
    out = np.where(special, mag, (mag + inc) & ~0x1FFF)
    # A directed mode that rounds toward zero stops at the largest finite value, not inf.
    to_zero = (mode == "toward_zero") | ((mode == "up") & neg) | ((mode == "down") & ~neg)
    out = np.where(~special & (out >= 0x7F800000) & to_zero, 0x7F7FE000, out)
    return ((out | sign).astype(np.uint32)).view(np.float32)


@pytest.mark.parametrize("backend", [*BACKENDS, "native"])
def test_nearest_even_matches_ml_dtypes_on_a_million_values(inputs, backend):
    """ml_dtypes (and NumPy's float16) share no code with torch, which the native backend calls."""
    name, x = inputs
    if name == "tf32":
        want = tf32_by_bit_masks(x, "nearest_even")  # no library has a tf32 dtype
        if backend == "native":
            with pytest.raises(ValueError, match="tf32"):
                round_to(x, name, backend=backend)
            return
    elif name == "float8_e4m3fn" and backend == "native":
        # torch >= 2.13 saturates e4m3fn; ml_dtypes gives NaN. Compare with the value table.
        if torch.__version__ < (2, 13):
            pytest.skip(f"torch {torch.__version__} casts e4m3fn overflow to NaN (2.3 to 2.12 "
                        "measured): the native backend has no saturating cast to compare")
        want = table_round(x, name, "nearest_even", saturate=True)
    else:
        want = x.astype(ML_DTYPES[name]).astype(np.float32)  # ml_dtypes: e4m3fn overflow -> NaN
    sat = name == "float8_e4m3fn" and backend == "native"
    got = round_to(x, name, saturate=sat, backend=backend)
    assert identical_values(got, want).all()


@pytest.mark.parametrize("mode", DETERMINISTIC)
def test_tf32_bit_mask_oracle_agrees_with_exact_rationals(mode):
    """The bit-mask oracle itself, checked against the textbook definition on float32 inputs."""
    x = random_inputs("tf32", 3000, seed=21)
    x = x[np.isfinite(x)]
    want = np.array([fraction_round(float(v), "tf32", mode) for v in x])
    assert identical_values(tf32_by_bit_masks(x, mode), want).all()


@pytest.mark.parametrize("mode", DETERMINISTIC)
def test_tf32_matches_bit_masks_on_a_million_values(mode):
    x = random_inputs("tf32")
    assert identical_values(round_to(x, "tf32", mode), tf32_by_bit_masks(x, mode)).all()


@pytest.mark.parametrize("name", SMALL)
def test_native_backend_against_exact_rationals(name):
    """The native backend calls torch's cast: check it against the rational definition instead."""
    x = random_inputs(name, 5000, seed=22)
    x = x[np.isfinite(x)]
    sat = name == "float8_e4m3fn"  # torch >= 2.13 saturates; older torch has no native e4m3fn
    try:
        got = round_to(x, name, saturate=sat, backend="native")
    except ValueError:
        pytest.skip(f"this torch has no exact native cast to {name}")
    want = np.array([fraction_round(float(v), name, "nearest_even") for v in x])
    if sat:
        big = np.isnan(want) | np.isinf(want)
        want = np.where(big, np.copysign(get_format(name).max_finite, x), want)
    assert identical_values(got, want).all()


def test_emulated_backend_matches_torch_casts_on_a_million_values(inputs):
    """torch is an oracle only for the emulated kernel: the other backends may call torch itself."""
    name, x = inputs
    if name == "tf32":
        x32 = torch.from_numpy(x)  # tf32 has no torch dtype: torch's bit ops do the masking
        words = x32.view(torch.int32)
        tz = (words & ~0x1FFF).view(torch.float32).numpy()
        fin = np.isfinite(x)
        assert identical_values(round_to(x[fin], "tf32", "toward_zero", backend="emulated"), tz[fin]).all()
        return
    dtype = FORMATS[name].torch_dtype
    with np.errstate(over="ignore"):
        want = torch.from_numpy(x).to(dtype).to(torch.float32).numpy()
    # torch 2.13 saturates float8_e4m3fn; round_to does so only when asked.
    got = round_to(x, name, saturate=(name == "float8_e4m3fn"), backend="emulated")
    assert identical_values(got, want).all()


def test_e4m3fn_overflow_options_differ_exactly_where_documented():
    x = np.array([448.0, 463.9, 464.0, 464.1, 1e6, np.inf, -np.inf, -500.0], np.float32)
    assert identical_values(round_to(x, "float8_e4m3fn"),
                     [448, 448, 448, np.nan, np.nan, np.nan, np.nan, np.nan]).all()
    assert identical_values(round_to(x, "float8_e4m3fn", saturate=True),
                     [448, 448, 448, 448, 448, 448, -448, -448]).all()


def test_float64_to_float32_has_an_exact_native_cast():
    x = np.random.default_rng(1).standard_normal(50) * 1e3
    want = x.astype(np.float32)
    assert identical_values(round_to(x, "float32", backend="native"), want).all()
    assert identical_values(round_to(x, "float32", backend="emulated"), want).all()
    with pytest.raises(ValueError, match=r"no exact native cast for float64 -> float32 with mode='nearest_even', saturate=True"):
        round_to(x, "float32", saturate=True, backend="native")


# ------------------------------------------------------------------ every mode = the value table


@pytest.mark.parametrize("mode", DETERMINISTIC)
@pytest.mark.parametrize("saturate", [False, True])
def test_every_deterministic_mode_matches_the_value_table(inputs, mode, saturate):
    name, x = inputs
    want = table_round(x, name, mode, saturate=saturate)
    got = round_to(x, name, mode, saturate=saturate)
    bad = ~identical_values(got, want)
    assert not bad.any(), (x[bad][:5], got[bad][:5], want[bad][:5])


@pytest.mark.parametrize("name", NARROW)
@pytest.mark.parametrize("mode", DETERMINISTIC)
def test_float64_inputs_round_once_against_the_value_table(name, mode):
    rng = np.random.default_rng(3)
    x32 = random_inputs(name, 100_000, seed=4).astype(np.float64)
    # Perturb below float32 resolution so that float64 -> float32 -> fmt would round twice.
    x = x32 * (1 + rng.choice([-1, 1], size=x32.size) * 2.0**-40)
    got = round_to(x, name, mode)
    assert got.dtype == np.float64
    assert identical_values(got, table_round(x, name, mode)).all()


def test_round_to_rounds_float64_once_whatever_the_library_casts_do():
    v = 1.0 + 2.0**-8 + 2.0**-30  # above the bf16 midpoint, but float32 rounds it onto the midpoint
    once = round_to(v, "bfloat16")
    twice = round_to(round_to(v, "float32"), "bfloat16")  # through float32: the tie goes to even
    assert once == 1.0 + 2.0**-7 == fraction_round(v, "bfloat16", "nearest_even")
    assert twice == 1.0 == fraction_round(fraction_round(v, "float32", "nearest_even"), "bfloat16",
                                          "nearest_even")
    # The libraries' casts are facts about their versions: each gives one of the two answers.
    by_torch = torch.tensor(v, dtype=torch.float64).to(torch.bfloat16).item()
    by_ml_dtypes = float(np.float64(v).astype(ml_dtypes.bfloat16))
    assert by_torch in (once, twice) and by_ml_dtypes in (once, twice)
    ml_version = tuple(int(p) for p in ml_dtypes.__version__.split(".")[:2])
    if ml_version < (0, 8):  # measured: 0.4 to 0.6 round twice, 0.7.0 rounds once
        assert by_ml_dtypes == (once if ml_version >= (0, 7) else twice)
    if (2, 3) <= torch.__version__ < (2, 16):  # measured: torch 2.3 to 2.15 cast through float32
        assert by_torch == twice


@pytest.mark.parametrize("mode", DETERMINISTIC)
def test_float64_to_float32_against_exact_rationals(mode):
    rng = np.random.default_rng(5)
    x = rng.standard_normal(3000) * np.exp2(rng.integers(-160, 130, size=3000))
    x[:200] = (np.float32(1.5) + np.arange(200, dtype=np.float32) * np.float32(2.0**-22)).astype(np.float64) \
        + 2.0**-24  # exact float32 ties
    got = round_to(x, "float32", mode)
    want = np.array([fraction_round(float(v), "float32", mode) for v in x])
    assert identical_values(got, want).all()


@pytest.mark.parametrize("name", NARROW)
@pytest.mark.parametrize("mode", DETERMINISTIC)
def test_random_values_against_exact_rationals(name, mode):
    x = random_inputs(name, 2000, seed=6)
    x = x[np.isfinite(x)]
    want = np.array([fraction_round(float(v), name, mode) for v in x])
    assert identical_values(round_to(x, name, mode), want).all()
    assert identical_values(round_to(x.astype(np.float64), name, mode), want).all()


# ------------------------------------------------------------------ a handful of values: the Python-int tier

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
@pytest.mark.parametrize("fmt", NARROW)
def test_a_handful_of_values_rounds_like_the_table_in_every_mode(fmt, dtype):
    x = boundary_values(fmt, dtype)
    for saturate in (False, True) if fmt in ("float16", "float8_e4m3fn") else (False,):
        for mode in DETERMINISTIC:
            got = in_handfuls(x, fmt, mode, saturate=saturate, backend="emulated")
            want = table_round(x, fmt, mode, saturate=saturate)
            bad = ~identical_values(got, want)
            assert not bad.any(), (fmt, mode, saturate, x[bad][:4], got[bad][:4], want[bad][:4])


# ------------------------------------------------------------------ properties


finite32 = st.floats(width=32, allow_nan=False, allow_infinity=False)


@st.composite
def in_range(draw, name: str):
    """A float32 inside fmt's finite range (so every example checks something), sometimes beyond."""
    top = float(np.float32(FORMATS[name].max_finite))
    if draw(st.integers(0, 9)) == 0:
        return draw(finite32)
    return draw(st.floats(-top, top, width=32))


@settings(max_examples=300, deadline=None)
@given(data=st.data(), name=st.sampled_from(NARROW), mode=st.sampled_from(DETERMINISTIC))
def test_rounding_is_monotone_and_brackets_x(data, name, mode):
    x, y = sorted([data.draw(in_range(name)), data.draw(in_range(name))])
    a = np.array([x, y], np.float32)
    fx, fy = round_to(a, name, mode, saturate=True)
    assert fx <= fy
    down, up = round_to(a[:1], name, "down", saturate=True)[0], round_to(a[:1], name, "up", saturate=True)[0]
    assert fx in (down, up)
    if abs(x) <= FORMATS[name].max_finite:
        assert down <= x <= up
        assert float(up) - float(down) in (0.0, ulp(float(down if x >= 0 else up), name))
        # ... and against the rational definition, independently of round_to
        assert float(down) == fraction_round(x, name, "down")
        assert float(up) == fraction_round(x, name, "up")


@settings(max_examples=300, deadline=None)
@given(data=st.data(), name=st.sampled_from(NARROW))
def test_nearest_is_no_farther_than_the_other_neighbour(data, name):
    x = data.draw(in_range(name))
    assume(abs(x) <= FORMATS[name].max_finite)  # rare: in_range draws beyond it 1 time in 10
    r = float(round_to(np.float32(x).reshape(1), name)[0])
    down = fraction_round(x, name, "down")
    up = fraction_round(x, name, "up")
    assert down <= x <= up
    assert abs(r - x) <= min(abs(down - x), abs(up - x))
    assert r in (down, up)


# ------------------------------------------------------------------ ulp and neighbours


@pytest.mark.parametrize("name", NARROW)
def test_next_up_and_down_walk_the_value_table(name):
    table = finite_values(name)
    rng = np.random.default_rng(10)
    x = np.concatenate([table[rng.integers(0, len(table), 20_000)], rng.standard_normal(5000)])
    x = x[np.abs(x) < FORMATS[name].max_finite]
    up = table[np.searchsorted(table, x, side="right")]
    down = table[np.searchsorted(table, x, side="left") - 1]
    assert np.array_equal(next_up(x, name), up)
    assert np.array_equal(next_down(x, name), down)


@pytest.mark.parametrize("name", ["float32", "float16", "bfloat16"])
def test_ulp_matches_numpy_spacing(name):
    dtype = {"float32": np.float32, "float16": np.float16, "bfloat16": ml_dtypes.bfloat16}[name]
    x = np.concatenate([all_patterns("float16"), np.random.default_rng(11).standard_normal(1000)])
    # np.spacing(max_finite) is inf (the step to overflow); ulp keeps the top binade's spacing.
    x = x[np.isfinite(x) & (np.abs(x) < FORMATS[name].max_finite)].astype(dtype)
    want = np.spacing(np.abs(x)).astype(np.float64)
    assert np.array_equal(ulp(x.astype(np.float64), name), want)


def test_ulp_edges_and_the_bf16_rule_of_thumb():
    bf16 = FORMATS["bfloat16"]
    assert ulp(0.0, "bfloat16") == bf16.min_subnormal
    assert ulp(1.0, "bfloat16") == 2.0**-7
    assert np.isinf(ulp(np.inf, "float16")) and np.isnan(ulp(np.nan, "float16"))
    assert next_up(448.0, "float8_e4m3fn") != next_up(448.0, "float8_e4m3fn")  # NaN: no inf in e4m3fn
    assert next_up(65504.0, "float16") == np.inf
    assert math.copysign(1, next_up(-2.0**-24, "float16")) == -1.0  # -0.0


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


# ------------------------------------------------------------------ kinds, dtypes, errors


def test_result_kind_follows_the_input():
    t = torch.tensor([1.0, 1.0 + 2**-8], dtype=torch.bfloat16)
    r = round_to(t, "float8_e4m3fn")
    assert isinstance(r, torch.Tensor) and r.dtype == torch.float32
    t64 = torch.tensor([0.1], dtype=torch.float64)
    assert round_to(t64, "tf32", "nearest_away").dtype == torch.float64
    assert isinstance(round_to(0.1, "bfloat16"), float)
    z = round_to(np.array(0.1), "bfloat16")
    assert isinstance(z, np.ndarray) and z.shape == ()
    strided = np.arange(20, dtype=np.float32)[::3] / 7
    assert identical_values(round_to(strided, "bfloat16"), strided.astype(ml_dtypes.bfloat16)).all()
    assert round_to(np.array([3], dtype=np.int64), "float8_e4m3fn").dtype == np.float64
    bf = np.array([1.5], dtype=ml_dtypes.bfloat16)
    assert round_to(bf, "float8_e5m2").dtype == np.float32


@pytest.mark.parametrize(
    "kwargs, words",
    [({"fmt": "fp12"}, ["'fp12'", "bfloat16"]),
     ({"fmt": "bf16", "mode": "nearest"}, ["'nearest'", "nearest_even", "stochastic"]),
     ({"fmt": "bf16", "mode": "stochastic"}, ["generator=None", "default_rng"]),
     ({"fmt": "bf16", "backend": "gpu"}, ["'gpu'", "emulated"]),
     ({"fmt": "tf32", "backend": "native"}, ["tf32", "emulated"])],
)
def test_bad_input_names_the_bad_value_and_the_choices(kwargs, words):
    with pytest.raises(ValueError) as err:
        round_to(np.ones(2, np.float32), **kwargs)
    assert all(w in str(err.value) for w in words), str(err.value)


def test_integer_tensors_are_refused_by_name():
    with pytest.raises(TypeError, match="int64"):
        round_to(torch.arange(3), "bfloat16")


def test_python_scalars_integers_and_shapes():
    assert round_to(7, "float8_e4m3fn") == 7.0 and round_to(True, "bfloat16") == 1.0
    assert round_to(2**60 + 1, "float32") == float(2**60)
    for shape in [(), (2, 2), (3, 5)]:
        x = np.arange(1, 1 + math.prod(shape), dtype=np.float32).reshape(shape) * 1.01
        got = round_to(x, "bfloat16", "up", backend="emulated")
        assert got.shape == shape
        assert identical_values(got, table_round(x, "bfloat16", "up")).all()


def test_formats_that_hold_every_input_copy_it():
    x = np.array([1 / 3, -1e-40, 3e38, np.nan], dtype=np.float32)
    for fmt in ("float32", "float64"):
        got = round_to(x, fmt)
        assert got.dtype == np.float32 and identical_values(got, x).all()
    y = x.astype(np.float64) * (1 + 2.0**-40)
    assert identical_values(round_to(y, "float64"), y).all()


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


# ------------------------------------------------------------------ out, threads and tiers


def test_out_receives_the_result_and_is_checked():
    x = random_inputs("bfloat16", 10_000, seed=13)
    out = np.full_like(x, 7.0)
    for mode in DETERMINISTIC:
        r = round_to(x, "bfloat16", mode, out=out)
        assert r is out
        assert identical_values(out, table_round(x, "bfloat16", mode)).all()
    with pytest.raises(ValueError, match="float32"):
        round_to(x, "bfloat16", out=np.empty(x.shape, np.float64))
    with pytest.raises(ValueError, match="NumPy input"):
        round_to(torch.from_numpy(x), "bfloat16", out=out)


def test_a_wrong_out_array_is_described():
    x = np.ones(4, dtype=np.float32)
    with pytest.raises(ValueError, match=r"^out must be a C-contiguous NumPy array of shape \(4,\) and dtype "
                                         r"float32 for a NumPy input; got ndarray \(3,\) float64$"):
        round_to(x, "bfloat16", out=np.empty(3))
    with pytest.raises(ValueError, match=r"got list  $"):
        round_to(x, "bfloat16", out=[0.0] * 4)


def test_rounding_leaves_torch_thread_setting_alone():
    # numba's OpenMP layer shares OpenMP's thread count with torch; a notebook that pins
    # torch to one thread for reproducible sums must stay pinned after a large round_to.
    before = torch.get_num_threads()
    try:
        for threads in (1, 2):
            torch.set_num_threads(threads)
            n = PARALLEL_MIN_SIZE  # long enough for the parallel build
            round_to(np.ones(n, np.float32), "bfloat16", "up")
            round_to(np.ones(n, np.float32), "float16", "stochastic", generator=np.random.default_rng(0))
            assert torch.get_num_threads() == threads
    finally:
        torch.set_num_threads(before)


@pytest.mark.parametrize("fmt", ["bfloat16", "float16", "tf32", "float8_e4m3fn", "float8_e5m2"])
@pytest.mark.parametrize("mode", ["nearest_even", "nearest_away", "toward_zero", "up", "down", "stochastic"])
def test_python_numpy_and_numba_tiers_agree_bit_for_bit(monkeypatch, fmt, mode):
    """The three speeds of the same recipe: Python ints (tiny), NumPy words, the numba kernel."""
    import precisionlab.rounding as r
    import precisionlab.rounding_kernel as rk
    gen = np.random.default_rng(7)
    for dtype in (np.float32, np.float64):
        x = (gen.standard_normal(3000) * np.exp2(gen.integers(-30, 30, 3000))).astype(dtype)
        x[:6] = [0.0, -0.0, np.inf, -np.inf, np.nan, 1e30]
        results = []
        for numba_min, python_max in ((10**9, 0), (0, 0), (10**9, 10**6)):  # NumPy, numba, Python
            monkeypatch.setattr(rk, "NUMBA_MIN_SIZE", numba_min)
            monkeypatch.setattr(rk, "PYTHON_MAX_SIZE", python_max)
            rng = np.random.default_rng(11) if mode == "stochastic" else None
            results.append(r.round_to(x, fmt, mode, rng, backend="emulated").view(np.uint8))
        np.testing.assert_array_equal(results[0], results[1])
        np.testing.assert_array_equal(results[0], results[2])


def test_the_tier_depends_on_the_input_length_only(monkeypatch):
    """No call history: every call of one length takes the same tier, NumPy below 4096 values, numba from 4096."""
    import precisionlab.rounding_kernel as rk
    tiers = []
    numpy_words = rk.numpy_words  # the tiers, as emulate_into calls them
    monkeypatch.setattr(rk, "numpy_words", lambda *a: (tiers.append("numpy"), numpy_words(*a))[1])
    monkeypatch.setattr(rk, "numba_kernel", lambda *key: lambda *a: tiers.append("numba"))
    for n in [100] * 12_000 + [4095, 4096, 100]:  # 12,000 calls: more than the old ledger allowed
        round_to(np.ones(n, np.float32), "bfloat16", "up")
    assert tiers == ["numpy"] * 12_001 + ["numba", "numpy"]


@pytest.mark.parametrize("mode", ["nearest_even", "nearest_away", "toward_zero", "up", "down", "stochastic"])
@pytest.mark.parametrize("fmt", ["float16", "bfloat16", "float8_e4m3fn", "float4_e2m1fn", "float8_e8m0fnu"])
def test_compiled_false_stays_on_numpy_with_the_same_bits(monkeypatch, fmt, mode):
    """round_to(..., compiled=False) never builds a numba loop, at any length, and gives the
    bits of the compiled tier (stochastic: the same stream for the same seed)."""
    import precisionlab.rounding_kernel as rk
    gen = np.random.default_rng(3)
    for dtype in (np.float32, np.float64):
        x = (gen.standard_normal(9000) * np.exp2(gen.integers(-40, 40, 9000))).astype(dtype)
        x[:7] = [0.0, -0.0, np.inf, -np.inf, np.nan, 1e30, 1 + 2.0**-8]
        rng = (lambda: np.random.default_rng(5)) if mode == "stochastic" else (lambda: None)
        with np.errstate(over="ignore", invalid="ignore"):
            want = round_to(x, fmt, mode, rng(), backend="emulated")
            with monkeypatch.context() as m:
                m.setattr(rk, "numba_kernel", lambda *key: pytest.fail(f"compiled {key}"))
                got = round_to(x, fmt, mode, rng(), backend="emulated", compiled=False)
        np.testing.assert_array_equal(got.view(np.uint8), want.view(np.uint8))


def test_compiled_must_be_a_bool():
    with pytest.raises(ValueError, match=r"^compiled must be True or False; got compiled=1$"):
        round_to(np.ones(3), "bfloat16", compiled=1)
