"""Stochastic rounding (round_to's mode='stochastic') against independent oracles.

* The distribution: the mean and the share of ups of 400,000 draws, against the value table's
  two neighbours; reproducible from the generator, varying between draws.
* The draws themselves, against fixed values derived independently: SplitMix64 written out
  from its published definition (checked on its known first outputs), the documented draw
  per element (SplitMix64(seed + i), 63 bits) and the decision rule in exact rationals:
  up iff (draw mod N) + k >= N with N, k the neighbours' gap and the dropped part in
  container ulps; below the smallest subnormal q, up iff draw < (|x| / q) 2^63.
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest
from oracles import identical_values, table_round

from precisionlab.formats import get_format
from precisionlab.rounding import round_to

# The inputs deliberately include overflow and NaN, which NumPy's casts warn about.
pytestmark = pytest.mark.filterwarnings("ignore:.*encountered in:RuntimeWarning")


# ------------------------------------------------------------------ the distribution


@pytest.mark.parametrize(
    "name, x",
    [("bfloat16", 1 + 2.0**-9), ("bfloat16", -0.3), ("float16", 1e-7), ("float16", 2.0**-26),
     ("float8_e4m3fn", 0.7), ("tf32", 1 / 3), ("bfloat16", 2.0**-140)],
)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_stochastic_rounding_is_unbiased(name, x, dtype):
    n = 400_000
    xs = np.full(n, x, dtype=dtype)
    lo, hi = table_round(xs[:1], name, "down")[0], table_round(xs[:1], name, "up")[0]
    x_exact = float(xs[0])
    got = round_to(xs, name, "stochastic", generator=np.random.default_rng(7)).astype(np.float64)
    assert set(np.unique(got)) <= {lo, hi}
    p_up = (x_exact - lo) / (hi - lo)
    # Five standard errors of a mean of n two-point draws: fails by chance with p < 1e-6.
    bound = 5 * (hi - lo) * math.sqrt(p_up * (1 - p_up) / n)
    assert abs(got.mean() - x_exact) <= bound
    assert abs((got == hi).mean() - p_up) <= 5 * math.sqrt(p_up * (1 - p_up) / n)


def test_stochastic_rounding_is_reproducible_from_the_generator_and_varies_between_draws():
    x = np.full(1000, 1 + 2.0**-9, np.float32)
    a = round_to(x, "bfloat16", "stochastic", generator=np.random.default_rng(9))
    b = round_to(x, "bfloat16", "stochastic", generator=np.random.default_rng(9))
    rng = np.random.default_rng(9)
    c1 = round_to(x, "bfloat16", "stochastic", generator=rng)
    c2 = round_to(x, "bfloat16", "stochastic", generator=rng)
    assert np.array_equal(a, b) and np.array_equal(a, c1)
    assert not np.array_equal(c1, c2)


def test_stochastic_generator_may_be_passed_by_position_and_must_be_a_generator():
    x = np.full(1000, 1 + 2.0**-9, np.float32)
    by_name = round_to(x, "bfloat16", "stochastic", generator=np.random.default_rng(4))
    by_position = round_to(x, "bfloat16", "stochastic", np.random.default_rng(4))
    assert np.array_equal(by_name, by_position)
    assert len(set(by_name.tolist())) == 2  # both neighbours drawn: it really is random
    with pytest.raises(ValueError, match=r"generator=np\.random\.default_rng.*generator=4"):
        round_to(x, "bfloat16", "stochastic", 4)  # a seed is not a stream
    with pytest.raises(TypeError, match="rng"):
        round_to(x, "bfloat16", "stochastic", rng=np.random.default_rng(4))


# ------------------------------------------------------------------ the draws: SplitMix64 per element

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
        assert identical_values(got, want).all(), (fmt, n, s)


def test_stochastic_rounding_of_a_float64_handful_uses_the_float64_words():
    x = np.array([1 + 2.0**-30, -(1 + 3 * 2.0**-12), 2.0**-26, 3 * 2.0**-25])
    got = round_to(x, "float16", "stochastic", generator=np.random.default_rng(9))
    assert identical_values(got, stochastic_oracle(x, "float16", _seed_of(9))).all()


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
    assert identical_values(got, want).all()
    assert 0 < np.count_nonzero(want) < 20 and not want[3::4].any()

