"""precisionlab.world's shortcuts are the plain computations, bit for bit.

Oracles: gpu.reduce_sum for the solver's sequential stopping sum; round_to for the float32
rounding of the state; one rollout per row for the stiffness map and one rollout per horizon
for horizon_sensitivity and for several horizons with a gain transform, smoothed contact and
every loss (the replicas of rollouts).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from precisionlab import emulate, gpu, world
from precisionlab.rounding import round_to
from precisionlab.world import World
from precisionlab.world.dynamics import rounder
from precisionlab.world.solver import sequential_sum

ACCUMULATORS = ("float64", "float32", "bfloat16", "float16", "float8_e5m2", "float8_e4m3fn",
                "tf32")


def _same_bits(a, b) -> bool:
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    return a.shape == b.shape and a.tobytes() == b.tobytes()


def _values(rng, kind: int, shape) -> np.ndarray:
    """Penetration-like arrays and harder ones: float32 values, float64 values, ties near the
    formats' grids, float32 subnormals, overflow in the narrow formats, mixed signs."""
    if kind == 0:
        return (rng.random(shape) * 1e-3).astype(np.float32).astype(np.float64)
    if kind == 1:
        return rng.standard_normal(shape) * 10.0 ** rng.integers(-6, 6, shape)
    if kind == 2:
        return np.ldexp(rng.integers(-16, 17, shape).astype(np.float64), rng.integers(-30, 5, shape))
    if kind == 3:
        return np.ldexp(1 + rng.integers(0, 8, shape) / 8, rng.integers(-149, -120, shape))
    return rng.standard_normal(shape) * 6e4


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), kind=st.integers(0, 4), lanes=st.integers(1, 9),
       n=st.integers(1, 20))
def test_sequential_sum_is_reduce_sum_bit_for_bit(seed, kind, lanes, n):
    p = _values(np.random.default_rng(seed), kind, (lanes, n))
    for acc in ACCUMULATORS:
        got = sequential_sum(p, acc)
        if got is None:  # only where no exact cast applies or a sum is NaN
            continue
        with np.errstate(all="ignore"):
            want = np.atleast_1d(gpu.reduce_sum(p, "sequential", acc=acc))
        assert _same_bits(got, want), acc


def test_sequential_sum_leaves_what_it_cannot_do_to_reduce_sum():
    p = np.array([[1e-3, 2e-3]])
    assert sequential_sum(p, "tf32") is None  # no exact library cast into tf32
    assert sequential_sum(np.array([[np.inf, 1.0]]), "float32") is None
    assert sequential_sum(np.array([[7e4, -7e4]]), "float16") is None  # inf + -inf: NaN
    assert sequential_sum(np.array([[0.25, 0.5]]), "bfloat16").tolist() == [0.75]


def test_the_float32_rounding_is_round_to_bit_for_bit():
    rng = np.random.default_rng(7)
    bits = rng.integers(0, 2**63, 200_000, dtype=np.uint64)
    exps = rng.integers(1023 - 160, 1023 + 130, bits.size).astype(np.uint64)
    x = ((bits & ~np.uint64(0x7FF << 52)) | (exps << np.uint64(52))).view(np.float64)
    x[::7] = x[::7] - np.fmod(x[::7], np.ldexp(1.0, -30))  # many exact float32 midpoints
    specials = [0.0, -0.0, np.inf, -np.inf, np.nan, -np.nan, 3.4028235677973366e38,
                7.006492321624085e-46, -7.006492321624087e-46, 1e-320]
    t = torch.from_numpy(np.concatenate([x, specials]).reshape(-1, 10))
    with np.errstate(all="ignore"):
        want = round_to(t, "float32")
        got = rounder("float32")(t)  # (its NaNs take round_to's path)
    assert got.dtype == torch.float64 and _same_bits(got.numpy(), want.numpy())


@pytest.mark.parametrize("kw", [{}, {"fmt": "float32", "damping": 5.0, "duration": 0.7}])
@pytest.mark.parametrize("integrator", world.INTEGRATORS)
def test_stiffness_map_rows_are_rollouts_bit_for_bit(integrator, kw):
    kw = {"duration": 1.0, **kw}
    hs = np.array([0.02, 0.003, 0.011, 0.02])  # unsorted, a repeat
    ks = np.array([100.0, 3e3, 1e5, 2e6])
    sm = world.stiffness_map(hs, ks, integrator, **kw)
    for i, h in enumerate(hs):
        w = World(h=float(h), contact="penalty", integrator=integrator,
                  fmt=kw.get("fmt", "float64"), damping=kw.get("damping", 20.0))
        T = max(1, round(kw["duration"] / h))
        with np.errstate(over="ignore", invalid="ignore"):
            run = world.rollout(w, np.full((1, 1), 1.0), ks, T, loss="mean_height")
            assert sm.steps[i] == T
            assert _same_bits(sm.forward[i], np.abs(run.heights).max(axis=(0, 2)))
            assert _same_bits(sm.backward[i], np.abs(ks * run.grad))


def test_horizon_sensitivity_is_a_rollout_per_horizon():
    w = World(h=0.005, contact="penalty", fmt="float32", damping=20.0, integrator="explicit")
    horizons = [90, 12, 45, 90]
    got = world.horizon_sensitivity(w, 0.8, 2e3, horizons, v0=-0.5)
    want = [world.rollout(w, 0.8, 2e3, T, v0=-0.5, loss="mean_height").grad[0]
            for T in horizons]
    assert _same_bits(got, want)
    assert world.horizon_sensitivity(w, 0.8, 2e3, []).size == 0


def _quantize(k):
    return emulate.fake_quantize(k, 2**-4, zero_point=0, quant_min=0, quant_max=255)


@pytest.mark.parametrize("loss", world.LOSSES)
@pytest.mark.parametrize("kw", [{"smooth": 3e-4, "policy": "float32", "fmt": "float64"},
                                {"clamp": True, "reduce_fmt": "bfloat16"},
                                {"contact": "penalty", "integrator": "explicit", "smooth": 1e-2,
                                 "damping": 5.0, "fmt": "float64"},
                                {"contact": "penalty", "smooth": 1e-2, "fmt": "float64"}])
def test_replicated_horizons_are_each_rollout_bit_for_bit(loss, kw):
    w = World(**kw)
    y0 = np.random.default_rng(5).uniform(0.05, 1.0, (2, 3))
    k = [1500.0, 2200.0] if kw.get("contact") else [0.9, 1.2]
    transform = None if kw.get("contact") else _quantize
    horizons = [50, 3, 28, 50]
    runs = world.rollouts(w, y0, k, horizons, loss=loss, k_transform=transform)
    for T, got in zip(horizons, runs, strict=True):
        want = world.rollout(w, y0, k, T, loss=loss, k_transform=transform)
        for name in want.__dataclass_fields__:
            a, b = getattr(want, name), getattr(got, name)
            if isinstance(a, np.ndarray) and a.dtype != object:
                assert a.shape == b.shape and a.tobytes() == b.tobytes(), name
            elif isinstance(a, np.ndarray):
                assert (a == b).all(), name
            elif name != "world":
                assert a == b, name
