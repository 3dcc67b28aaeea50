"""Tests for precisionlab.updates against independent oracles.

Oracles: brute-force stepping in exact rationals (tests/oracles.fraction_round, every mode)
and in float32 through ml_dtypes casts, both sharing no code with the package; torch's own
bf16/fp16 addition; exact rational arithmetic (fractions.Fraction); values derived by hand
from the format rules; the training written out per policy with Python loops for its sums.
The float64 simulation through round_to is a consistency check.
"""

from __future__ import annotations

import math
from fractions import Fraction

import ml_dtypes
import numpy as np
import pytest
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from oracles import finite_values, fraction_round

from precisionlab.formats import get_format
from precisionlab.rounding import round_to, ulp
from precisionlab.updates import (
    DETERMINISTIC_MODES,
    POLICIES,
    boundary_distance,
    crossing_trajectory,
    repeated_update,
    simulate_crossing,
    steps_to_cross,
    steps_to_cross_estimate,
    swallowed,
    train_master_vs_lowprec,
)

NARROW = ("tf32", "float16", "bfloat16", "float8_e4m3fn", "float8_e5m2")
ML_DTYPES = {
    "bfloat16": ml_dtypes.bfloat16,
    "float16": np.float16,
    "float8_e4m3fn": ml_dtypes.float8_e4m3fn,
    "float8_e5m2": ml_dtypes.float8_e5m2,
}


def _cases(fmt_name: str, rng: np.random.Generator, n: int = 160):
    """(w, lr) pairs whose running sums w + k*lr are exact in float64 for the steps we take.

    w: values of fmt (powers of two, binade tops, subnormals, zero, random) plus offsets of a
    few 1/16 ulps (master weights between grid points); lr: ulp(w)·j/2^t, which includes
    exact ties (lr = ulp/2, ulp/4, ...), both signs.
    """
    fmt = get_format(fmt_name)
    special = [1.0, 2.0, 0.5, 2.0**fmt.emin, fmt.min_subnormal, 3 * fmt.min_subnormal,
               fmt.min_normal - fmt.min_subnormal, 0.0, fmt.max_finite,
               2.0 - fmt.eps, 1.0 + fmt.eps]
    rand = rng.uniform(-4, 4, n - len(special)) * 2.0 ** rng.integers(fmt.emin, min(fmt.emax, 12),
                                                                        n - len(special))
    w = np.asarray(round_to(np.concatenate([special, rand]), fmt), dtype=np.float64)
    w = np.where(rng.random(w.size) < 0.5, -w, w)
    u = np.asarray(ulp(w, fmt))
    offset = rng.integers(-3, 4, w.size) / 16 * u * (rng.random(w.size) < 0.3)
    w = w + offset
    j = rng.integers(1, 9, w.size)
    t = rng.integers(0, 5, w.size)
    lr = u * j / 2.0**t
    lr = np.where(rng.random(w.size) < 0.5, -lr, lr)
    # Keep the starting value inside the finite range in every direction we will move.
    keep = np.abs(w) + 40 * np.abs(lr) < 2 * fmt.max_finite
    return w[keep], lr[keep]


@pytest.mark.parametrize("fmt", NARROW)
@pytest.mark.parametrize("mode", DETERMINISTIC_MODES)
def test_steps_to_cross_matches_float64_simulation(fmt, mode):
    rng = np.random.default_rng([7, NARROW.index(fmt), DETERMINISTIC_MODES.index(mode)])
    w, lr = _cases(fmt, rng)
    f = get_format(fmt)
    start = np.asarray(round_to(w, f, mode))
    # Directed modes never leave max_finite when rounding toward zero: those raise instead.
    never = ((mode == "toward_zero") & (np.abs(start) == f.max_finite)
             & (np.sign(start) == np.sign(lr)))
    never |= (mode == "down") & (start == f.max_finite) & (lr > 0)
    never |= (mode == "up") & (start == -f.max_finite) & (lr < 0)
    w, lr = w[~never], lr[~never]
    exact = steps_to_cross(w, lr, fmt, mode)
    assert exact.min() >= 1 and exact.max() <= 8 * 16 + 1
    sim = simulate_crossing(w, lr, 200, fmt, mode, master="float64")
    np.testing.assert_array_equal(exact, sim)


def fraction_steps(w: float, lr: float, fmt: str, mode: str, max_steps: int = 200) -> int:
    """Brute force in exact rationals: the first k with fl(w + k·lr) != fl(w) (textbook rounding)."""
    start = fraction_round(w, fmt, mode)
    for k in range(1, max_steps + 1):
        x = Fraction(w) + k * Fraction(lr)
        assert Fraction(float(x)) == x  # the case generator keeps these sums exact in float64
        now = fraction_round(float(x), fmt, mode)
        if now != start and not (math.isnan(now) and math.isnan(start)):
            return k
    return -1


@pytest.mark.parametrize("fmt", NARROW)
@pytest.mark.parametrize("mode", DETERMINISTIC_MODES)
def test_steps_to_cross_against_exact_rational_stepping(fmt, mode):
    """Every mode, directed ones included, against an oracle that shares no code with the package."""
    rng = np.random.default_rng([13, NARROW.index(fmt), DETERMINISTIC_MODES.index(mode)])
    w, lr = _cases(fmt, rng, 70)
    f = get_format(fmt)
    start = np.array([fraction_round(float(v), fmt, mode) for v in w])
    never = ((mode == "toward_zero") & (np.abs(start) == f.max_finite)
             & (np.sign(start) == np.sign(lr)))
    never |= (mode == "down") & (start == f.max_finite) & (lr > 0)
    never |= (mode == "up") & (start == -f.max_finite) & (lr < 0)
    w, lr = w[~never], lr[~never]
    want = [fraction_steps(float(a), float(b), fmt, mode) for a, b in zip(w, lr, strict=True)]
    np.testing.assert_array_equal(steps_to_cross(w, lr, fmt, mode), want)


@pytest.mark.parametrize("fmt", sorted(ML_DTYPES))
def test_steps_to_cross_matches_independent_ml_dtypes_stepping(fmt):
    """Brute force with float32 masters and ml_dtypes' round-to-nearest-even casts."""
    rng = np.random.default_rng([11, sorted(ML_DTYPES).index(fmt)])
    f = get_format(fmt)
    w, lr = _cases(fmt, rng, 300)
    w32, lr32 = w.astype(np.float32), lr.astype(np.float32)
    ok = (w32 == w) & (lr32 == lr)  # every value here is a float32: the sums are exact too
    w32, lr32 = w32[ok], lr32[ok]
    dt = ML_DTYPES[fmt]
    start = w32.astype(dt).astype(np.float32)
    first = np.full(w32.size, -1)
    cur = w32.copy()
    for k in range(1, 200):
        with np.errstate(over="ignore", invalid="ignore"):
            cur = cur + lr32
            now = cur.astype(dt).astype(np.float32)
        changed = (first < 0) & ~((now == start) | (np.isnan(now) & np.isnan(start)))
        first[changed] = k
    assert (first > 0).all()
    np.testing.assert_array_equal(steps_to_cross(w32, lr32, f), first)


def test_hand_derived_counts():
    # bf16 at 1.0: ulp 2^-7, midpoint 1 + 2^-8; 1.0 has an even significand, so the tie at
    # the midpoint rounds back and k·2^-10 must exceed 2^-8: k = 5.
    assert steps_to_cross(1.0, 2.0**-10) == 5
    # From 1 + 2^-7 (odd significand) the tie already rounds up: k·2^-10 >= 2^-8, k = 4.
    assert steps_to_cross(1.0 + 2.0**-7, 2.0**-10) == 4
    # Downward from 1.0 the gap halves (2^-8), the midpoint is 2^-9 away: k = 2^-9/2^-11 + 1.
    assert steps_to_cross(1.0, -(2.0**-11)) == 5
    # nearest_away: ties go to the larger magnitude, so upward from 1.0 the tie crosses.
    assert steps_to_cross(1.0, 2.0**-10, mode="nearest_away") == 4
    # Directed rounding down: fl stays 1.0 until the sum reaches 1 + 2^-7.
    assert steps_to_cross(1.0, 2.0**-10, mode="down") == 8
    # ... and rounding up leaves 1.0 as soon as the sum exceeds it.
    assert steps_to_cross(1.0, 2.0**-10, mode="up") == 1
    # e4m3fn tops out at 448 = 1.110b·2^8 (even); 1.111b·2^8 would be 480, the NaN pattern.
    # The midpoint 464 ties back to 448, so it takes 465: 17 unit steps.
    assert steps_to_cross(448.0, 1.0, "float8_e4m3fn") == 17
    # float16's 65504 is odd (1.1111111111b·2^15): the overflow threshold 65520 is reached
    # after 16 unit steps and gives inf.
    assert steps_to_cross(65504.0, 1.0, "float16") == 16
    # Subnormal scale: bf16's smallest subnormal q = 2^-133; from 0 the midpoint q/2 ties
    # back to the even 0, so steps of q/4 need 3.
    assert steps_to_cross(0.0, 2.0**-135) == 3


def test_rounding_toward_zero_at_the_top_never_crosses():
    with pytest.raises(ValueError, match="never changes"):
        steps_to_cross(448.0, 1.0, "float8_e4m3fn", "toward_zero")
    with pytest.raises(ValueError, match="never changes"):
        steps_to_cross(1.0, 0.0)
    # ... while swallowed reports such updates as lost.
    assert swallowed(448.0, 100.0, "float8_e4m3fn", "toward_zero")
    assert swallowed(1.0, 0.0)


def test_fraction_oracle_for_decimal_learning_rates():
    """lr = 1e-6 is not dyadic: check both sides of the answer in exact rational arithmetic."""
    lr = 1e-6
    for w in (1.0, 0.10009765625, 0.010009765625, -3.0, 2.0**-126):
        k = steps_to_cross(w, lr)
        fw = Fraction(float(round_to(w, "bfloat16")))
        gap = Fraction(float(ulp(w, "bfloat16")))
        mid = fw + gap / 2
        # w is on the grid with an even or odd significand; the tie rule decides strictness.
        odd = (fw / gap) % 2 == 1
        x_k, x_k1 = Fraction(w) + k * Fraction(lr), Fraction(w) + (k - 1) * Fraction(lr)
        assert (x_k >= mid) if odd else (x_k > mid)
        assert k == 1 or not ((x_k1 >= mid) if odd else (x_k1 > mid))


def test_quotients_that_round_to_an_integer():
    """lr = D/n·(1 + i·2^-52): D/lr rounds to exactly n in float64 while the truth is n ± tiny."""
    n = np.arange(2, 3000)
    for w in (1.0, 1.0 + 2.0**-7):  # even significand (strict tie) and odd (inclusive tie)
        d = Fraction(2.0**-8)  # from a grid value up to the midpoint: half of ulp(1) = 2^-7
        for i in range(-3, 4):
            lr = 2.0**-8 / n * (1 + i * 2.0**-52)
            k = steps_to_cross(w, lr)
            odd = w != 1.0
            for kk, lri in zip(k[::37], lr[::37], strict=True):
                x_k = int(kk) * Fraction(lri)
                x_k1 = (int(kk) - 1) * Fraction(lri)
                assert (x_k >= d) if odd else (x_k > d)
                assert not ((x_k1 >= d) if odd else (x_k1 > d))


@settings(max_examples=200, deadline=None)
@given(
    fmt=st.sampled_from(NARROW),
    mode=st.sampled_from(DETERMINISTIC_MODES),
    x=st.floats(-1e4, 1e4, allow_nan=False, width=32),
    off=st.integers(-8, 8),
    j=st.integers(1, 2**16),
    t=st.integers(0, 16),
    neg=st.booleans(),
)
def test_property_first_change_is_at_k(fmt, mode, x, off, j, t, neg):
    """fl(w + k·lr) != fl(w) and fl(w + (k-1)·lr) == fl(w), all sums exact in float64."""
    f = get_format(fmt)
    g = float(round_to(x, f))
    assume(abs(g) < f.max_finite / 4)
    u = float(ulp(g, f))
    w = g + off * u / 32
    lr = (-1 if neg else 1) * j * u / 2.0 ** (t + 6)
    k = steps_to_cross(w, lr, f, mode)
    assume(k < 2**20)
    xk, xk1 = w + k * lr, w + (k - 1) * lr
    assert Fraction(xk) == Fraction(w) + k * Fraction(lr)  # the oracle sums are exact
    assert Fraction(xk1) == Fraction(w) + (k - 1) * Fraction(lr)
    start = fraction_round(w, fmt, mode)  # the rational definition, not the package's kernel
    assert fraction_round(xk, fmt, mode) != start
    if k > 1:
        assert fraction_round(xk1, fmt, mode) == start


@settings(max_examples=150, deadline=None)
@given(
    mode=st.sampled_from(DETERMINISTIC_MODES),
    x=st.floats(-100, 100, allow_nan=False, width=32),
    lr=st.floats(1e-9, 1e-2),
)
def test_property_mirror_symmetry(mode, x, lr):
    """Moving -w down behaves as moving w up with up/down exchanged."""
    w = float(np.float32(x))
    mirror = {"up": "down", "down": "up"}.get(mode, mode)
    assert steps_to_cross(w, lr, "bfloat16", mode) == steps_to_cross(-w, -lr, "bfloat16", mirror)


@settings(max_examples=150, deadline=None)
@given(e=st.integers(-120, 120), frac=st.integers(0, 127), r=st.floats(2e-3, 0.5))
def test_property_estimate_brackets_exact_count(e, frac, r):
    """For w on the bf16 grid, the exact count lies in (estimate/2, estimate], up to one step."""
    w = (1 + frac / 128) * 2.0**e
    lr = w * r / 256 / 40  # at least ~40 steps, so rounding k to an integer is a small effect
    est = steps_to_cross_estimate(w, lr)
    k = steps_to_cross(w, lr)
    assert est / 2 - 1 <= k <= est + 1


@settings(max_examples=300, deadline=None)
@given(
    fmt=st.sampled_from(["bfloat16", "float16"]),
    a=st.floats(-1e4, 1e4, allow_nan=False, width=32),
    b=st.floats(-1e4, 1e4, allow_nan=False, width=32),
    scale=st.integers(-30, 0),
)
def test_swallowed_matches_torch_addition(fmt, a, b, scale):
    dtype = getattr(torch, fmt)
    w = torch.tensor(a, dtype=dtype)
    dw = torch.tensor(b * 2.0**scale, dtype=dtype)  # torch rounds dw too: feed it fl(dw)
    assume(torch.isfinite(w + dw).item() and torch.isfinite(dw).item())
    expected = bool((w + dw) == w)
    assert swallowed(w.item(), dw.item(), fmt) == expected


def test_swallowed_vectorised_and_hand_checked():
    w = np.ones(6)
    dw = np.array([1e-3, 2.0**-8, 2.0**-8 + 2.0**-30, 4e-3, -(2.0**-9), -(2.0**-9) - 1e-12])
    got = swallowed(w, dw)
    assert got.shape == (6,)
    # 2^-8 is exactly half an ulp of 1.0: a tie that goes back to the even 1.0; just above it
    # moves. Below 1.0 the gap is 2^-8, so the tie sits at 2^-9.
    np.testing.assert_array_equal(got, [True, True, False, False, True, False])
    # Agrees with rounding the exact sum directly (w and dw here add exactly in float64).
    np.testing.assert_array_equal(got, np.asarray(round_to(w + dw, "bfloat16")) == w)


@pytest.mark.parametrize("fmt", ["bfloat16", "float16"])
def test_boundary_distance_is_half_the_gap_to_the_ml_dtypes_neighbour(fmt):
    # Oracle: the neighbour of w in dw's direction in the table of every value (bit patterns
    # decoded by ml_dtypes), and D = |neighbour - w| / 2 for nearest rounding.
    table = finite_values(fmt)
    rng = np.random.default_rng(4)
    w = rng.choice(table[(np.abs(table) > 1e-3) & (np.abs(table) < 1e3)], 400)
    w = np.concatenate([w, [1.0, -1.0, 0.5, -2.0**-3, 4.0]])  # powers of two, both ways
    for sign in (1.0, -1.0):
        dw = np.full(w.shape, sign * 1e-9)
        i = np.searchsorted(table, w)
        nb = np.where(dw > 0, table[i + 1], table[i - 1])
        want = np.abs(nb - w) / 2
        np.testing.assert_array_equal(boundary_distance(w, dw, fmt), want)
        # and it is the swallowing threshold: just below D is lost, just above moves
        np.testing.assert_array_equal(swallowed(w, np.sign(dw) * want * (1 - 2.0**-20), fmt), True)
        np.testing.assert_array_equal(swallowed(w, np.sign(dw) * want * (1 + 2.0**-20), fmt), False)


def test_boundary_distance_quarter_ulp_only_toward_zero_at_a_power_of_two():
    u = float(ulp(1.0, "bfloat16"))
    got = boundary_distance([1.0, 1.0, -1.0, -1.0, 1.5, 1.5], [1, -1, -1, 1, 1, -1])
    np.testing.assert_array_equal(got, [u / 2, u / 4, u / 2, u / 4, u / 2, u / 2])
    assert boundary_distance(1.0, 0.0) == math.inf


def test_simulate_crossing_float32_master_rounds_the_update():
    # A float32 master at 1.0 cannot hold 1 + 1e-6: each step adds round(1e-6 / 2^-23) = 8
    # float32 ulps (2^-20), so the bf16 midpoint 1 + 2^-8 is reached (a tie, back to 1.0)
    # after 4096 steps and passed after 4097, not after 3907 as in exact arithmetic.
    assert steps_to_cross(1.0, 1e-6) == 3907
    assert simulate_crossing(1.0, 1e-6, 5000, master="float32") == 4097
    assert simulate_crossing(1.0, 1e-6, 5000, master="float64") == 3907
    assert simulate_crossing(1.0, 1e-6, 100) == -1  # not within max_steps


def test_simulate_crossing_shapes_and_progress():
    w = np.array([[1.0, 0.5], [0.25, 2.0]])
    out = simulate_crossing(w, 2.0**-10, 50, progress=True)
    assert out.shape == (2, 2)
    np.testing.assert_array_equal(out, steps_to_cross(w, 2.0**-10))


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda: steps_to_cross(1.0, 1e-3, "float64"), "narrower than float64"),
        (lambda: steps_to_cross(1.0, 1e-3, "fp7"), "valid choices"),
        (lambda: steps_to_cross(1.0, 1e-3, mode="stochastic"), "valid choices"),
        (lambda: steps_to_cross(np.inf, 1e-3), "finite"),
        (lambda: steps_to_cross(1.0, np.nan), "finite"),
        (lambda: steps_to_cross(1e6, 1.0, "float16"), "finite range"),
        (lambda: steps_to_cross(1.0, 1e-300), "2\\^53"),
        (lambda: steps_to_cross_estimate(1.0, 0.0), "nonzero"),
        (lambda: simulate_crossing(1.0, 1e-3, 0), "positive integer"),
        (lambda: simulate_crossing(1.0, 1e-3, 10, master="float16"), "valid choices"),
        (lambda: swallowed(1.0, 1e-3, "bfloat16", "sideways"), "valid choices"),
        (lambda: train_master_vs_lowprec(policies=("fp8",)), "valid choices"),
        (lambda: train_master_vs_lowprec(optimizer="lbfgs"), "valid choices"),
    ],
)
def test_bad_input_names_the_problem(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def test_crossing_trajectory_is_master_then_copy():
    k, master, copy = crossing_trajectory(1.0, 2.0**-10, 10)
    np.testing.assert_array_equal(k, np.arange(11))
    np.testing.assert_array_equal(master, 1.0 + np.arange(11) * 2.0**-10)
    np.testing.assert_array_equal(copy, np.asarray(round_to(master, "bfloat16")))
    assert copy[4] == 1.0 and copy[5] == 1.0 + 2.0**-7  # the crossing at k = 5 from above


def test_repeated_update_nearest_stalls_and_stochastic_keeps_the_mean():
    w = np.ones(2000)
    near = repeated_update(w, 1e-4, 500, "bfloat16")
    assert (near == 1.0).all()  # 1e-4 is far below half an ulp (2^-8) of 1.0
    sr = repeated_update(w, 1e-4, 500, "bfloat16", "stochastic", seed=0)
    assert np.array_equal(sr, repeated_update(w, 1e-4, 500, "bfloat16", "stochastic", seed=0))
    with pytest.raises(ValueError, match="pass seed"):
        repeated_update(w, 1e-4, 5, "bfloat16", "stochastic")
    # Exact mean 1.05; each step's rounding noise has sd <= ulp/2 ~ 0.004, so the mean of
    # 2000 walks of 500 steps has sd below 0.004·sqrt(500/2000) = 0.002.
    assert abs(sr.mean() - 1.05) < 0.01
    assert sr.std() > 0.01


def test_training_comparison_claims():
    runs = train_master_vs_lowprec(seed=0, policies=POLICIES)
    fp32, bf16, master, sr = (runs[p] for p in POLICIES)
    for r in runs.values():
        assert r.loss.shape == (301,) and r.changed.shape == (300,)
        assert r.loss[-1] < r.loss[0]
    # bf16-stored weights stall: nothing changes over the last 100 steps and the loss sits
    # far above the fp32 run, while the master-weight run tracks fp32 closely.
    assert (bf16.changed[-100:] == 0).all()
    assert bf16.final_loss > 100 * fp32.final_loss
    assert master.final_loss < bf16.final_loss / 100
    assert sr.final_loss < bf16.final_loss / 100
    assert (fp32.changed > 0.95).all()
    # Deterministic given the seed, and another seed tells the same story.
    again = train_master_vs_lowprec(seed=0, policies=("bf16",))
    np.testing.assert_array_equal(again["bf16"].loss, bf16.loss)
    other = train_master_vs_lowprec(seed=3, policies=("fp32", "bf16"))
    assert other["bf16"].final_loss > 100 * other["fp32"].final_loss
    # (its speed is timed in benchmarks/bench_updates.py, not asserted here)


def _train_one_policy(policy, steps, lr, optimizer, n, d, seed):
    """One policy trained alone, every sum of X w and X^T r a Python loop in index order."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, d))
    w_true = rng.standard_normal(d)

    def seq_dot(row, vec):
        acc = float(row[0]) * float(vec[0])
        for a, b in zip(row[1:], vec[1:], strict=True):
            acc = acc + float(a) * float(b)
        return acc

    y = np.array([seq_dot(x[i], w_true) for i in range(n)]) + 1e-3 * rng.standard_normal(n)
    w = (w_true + 0.5 * rng.standard_normal(d)).astype(np.float32)
    gen = np.random.default_rng([seed, POLICIES.index(policy)])
    stored = policy in ("bf16", "bf16_stochastic")
    mode = "stochastic" if policy == "bf16_stochastic" else "nearest_even"
    w = round_to(w, "bfloat16") if stored else w
    m1, m2 = np.zeros(d, dtype=np.float32), np.zeros(d, dtype=np.float32)
    used = w if policy == "fp32" or stored else round_to(w, "bfloat16")
    losses, changed = [], []
    for k in range(steps + 1):
        r = np.array([seq_dot(x[i], used.astype(np.float64)) for i in range(n)]) - y
        losses.append(math.fsum(r * r) / (2 * n))
        g = (np.array([seq_dot(x[:, j], r) for j in range(d)]) / n).astype(np.float32)
        if k == steps:
            break
        if optimizer == "sgd":
            upd = -np.float32(lr) * g
        else:
            m1 = np.float32(0.9) * m1 + np.float32(0.1) * g
            m2 = np.float32(0.999) * m2 + np.float32(0.001) * g * g
            mh = m1 / np.float32(1 - 0.9 ** (k + 1))
            vh = m2 / np.float32(1 - 0.999 ** (k + 1))
            upd = -np.float32(lr) * mh / (np.sqrt(vh) + np.float32(1e-8))
        w_new = w + upd
        if stored:
            w_new = round_to(w_new, "bfloat16", mode, gen if mode == "stochastic" else None)
        new_used = w_new if policy == "fp32" or stored else round_to(w_new, "bfloat16")
        changed.append(np.mean(new_used != used))
        w, used = w_new, new_used
    return np.array(losses), np.array(changed), used.astype(np.float64), g


@pytest.mark.parametrize("optimizer, lr", [("sgd", 0.05), ("adam", 3e-3)])
def test_policies_trained_side_by_side_are_each_trained_alone_bit_for_bit(optimizer, lr):
    runs = train_master_vs_lowprec(steps=25, lr=lr, optimizer=optimizer, policies=POLICIES,
                                   n=9, d=5, seed=4)
    assert list(runs) == list(POLICIES)
    for policy, run in runs.items():
        loss, changed, weights, grad = _train_one_policy(policy, 25, lr, optimizer, 9, 5, 4)
        assert run.loss.tobytes() == loss.tobytes() and run.changed.tobytes() == changed.tobytes()
        assert run.weights.tobytes() == weights.tobytes() and run.grad.tobytes() == grad.tobytes()
        alone = train_master_vs_lowprec(steps=25, lr=lr, optimizer=optimizer,
                                        policies=(policy,), n=9, d=5, seed=4)[policy]
        assert alone.loss.tobytes() == run.loss.tobytes()


def test_training_with_adam_freezes_bf16_stored_weights():
    runs = train_master_vs_lowprec(optimizer="adam", lr=3e-3, seed=1)
    assert runs["bf16"].final_loss > 2 * runs["fp32"].final_loss
    assert runs["master"].final_loss < 1.1 * runs["fp32"].final_loss


@pytest.mark.parametrize("master", ["float32", "float64"])
@pytest.mark.parametrize("fmt", ["bfloat16", "float16", "float8_e4m3fn"])
def test_crossing_trajectory_is_the_step_by_step_loop_rounded_by_ml_dtypes(fmt, master):
    # Oracle: the master updated one addition at a time in its own dtype, and each copy
    # rounded by ml_dtypes' (NumPy's for float16) cast of the float64 value;
    # 9000 steps, rounded on round_to's NumPy tier (compiled=False), as the chapters' runs are.
    dt = np.dtype(master)
    w, lr = dt.type(1.0), dt.type(3e-6)
    loop = [w]
    for _ in range(9000):
        loop.append(loop[-1] + lr)
    loop = np.array(loop, dtype=dt)
    k, vals, copy = crossing_trajectory(1.0, 3e-6, 9000, fmt, master=master)
    assert np.array_equal(k, np.arange(9001))
    assert np.array_equal(vals, loop.astype(np.float64))
    cast = np.float16 if fmt == "float16" else getattr(ml_dtypes, fmt)
    want = loop.astype(np.float64).astype(cast).astype(np.float64)
    assert np.array_equal(copy, want)


@pytest.mark.parametrize("master", ["float32", "float64"])
def test_simulate_crossing_short_and_long_runs_agree_with_the_trajectory(master):
    # A short run (rounded on the NumPy tier) and one too long for that rule (compiled) give the first change that the step-by-step trajectory shows, weight by weight.
    w = np.array([1.0, 0.1, -0.3, 2.0**-5])
    lr = np.array([1e-6, 1e-5, 2e-5, -1e-7])
    first = []
    for wi, li in zip(w, lr, strict=True):
        _, _, copy = crossing_trajectory(wi, li, 5000, master=master)
        moved = np.nonzero(copy != copy[0])[0]
        first.append(int(moved[0]) if moved.size else -1)
    assert simulate_crossing(w, lr, 5000, master=master).tolist() == first
    wide = np.broadcast_to(w, (600, 4)).copy()  # 600 x 4 x 5000 values: past the rule
    assert (simulate_crossing(wide, lr, 5000, master=master) == first).all()
