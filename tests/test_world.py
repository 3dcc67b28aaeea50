"""Tests for precisionlab.world: the bouncing ball, its stopping rules and its gradients.

Beyond the branches and micro-demo 2: thresholds met exactly (a flip only the exact sum sees,
a cap that binds at max_iter), a damping below 1, a first contact at step 0, non-default
summation orders, field types, defaults, the logged summary, and the parameter names in error
messages. Oracles: finite differences inside the executed branch (float64), hand-written
float64 steps, torch's own low-precision arithmetic for micro-demo 2, math.fsum,
gpu.reduce_sum called directly, the documented seed stream, torch's softplus and
fake_quantize, and the same bits under other dispatch levels and thread counts.
"""

from __future__ import annotations

import itertools
import math
import textwrap

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from precisionlab import emulate, gpu, world
from precisionlab.formats import get_format
from precisionlab.rounding import next_up, round_to, seed_generator, ulp
from precisionlab.world import World
from precisionlab.world.solver import exact_decision

LOW = ("bfloat16", "float16")
MITIGATIONS = ("float32", "per_instance", "hysteresis")


# --------------------------------------------------------------------------- gradients in the branch


@pytest.mark.parametrize("k", [0.55, 0.8, 1.1, 1.4])
def test_projection_gradient_matches_finite_differences_in_the_same_branch(k):
    w = World(fmt="float64", policy="float32")
    run = world.rollout(w, 1.0, k, 150, loss="height")
    fd, same = world.finite_difference(w, 1.0, k, 150, dk=1e-6, loss="height")
    assert same  # k +- dk ran the same iterations: one smooth piece of the program
    assert run.total_iterations[0] > 0
    assert fd == pytest.approx(run.grad[0], rel=1e-6)


@pytest.mark.parametrize("integrator", world.INTEGRATORS)
@pytest.mark.parametrize("smooth", [0.0, 1e-2])
def test_penalty_gradient_matches_finite_differences(integrator, smooth):
    w = World(fmt="float64", contact="penalty", integrator=integrator, smooth=smooth, damping=5.0)
    k = 1500.0
    runs = world.rollout(w, 1.0, [k - 1e-3, k, k + 1e-3], 120, loss="height")
    # the branch: contact steps (p > 0) are the same in the three runs
    touch = runs.penetration[:, :, 0] > 0
    assert (touch[:, 0] == touch[:, 1]).all() and (touch[:, 2] == touch[:, 1]).all()
    fd = (runs.loss[2] - runs.loss[0]) / 2e-3
    assert fd == pytest.approx(runs.grad[1], rel=1e-5)


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(k=st.floats(0.3, 1.7), y0=st.floats(0.5, 1.5))
def test_gradient_property_inside_any_branch(k, y0):
    w = World(fmt="float64", policy="low_precision")
    run = world.rollout(w, y0, k, 90, loss="height")
    fd, same = world.finite_difference(w, y0, k, 90, dk=1e-7, loss="height")
    assume(same)
    assert fd == pytest.approx(run.grad[0], rel=1e-4, abs=1e-9)


def test_gradient_jumps_where_the_iteration_count_changes():
    w = World(fmt="float64", policy="float32")
    ks = np.linspace(0.9, 1.1, 81)
    run = world.rollout(w, 1.0, ks, 150, loss="height")
    change = np.flatnonzero(np.diff(run.total_iterations))
    assert change.size >= 1
    j = change[0]
    smooth = np.abs(np.diff(run.grad))[np.arange(ks.size - 1) != j].max()
    assert abs(run.grad[j + 1] - run.grad[j]) > 5 * smooth
    # a finite difference across the boundary is not the derivative of either piece
    fd = (run.loss[j + 1] - run.loss[j]) / (ks[j + 1] - ks[j])
    assert abs(fd) > 5 * max(abs(run.grad[j]), abs(run.grad[j + 1]))


# --------------------------------------------------------------------------- micro-demo 2


@pytest.mark.parametrize("low", LOW)
def test_flip_reproduces_and_deletes_the_gradient(low):
    ref = world.boundary_rollout("float32", "low_precision", low=low)
    flip = world.boundary_rollout(low, "low_precision", low=low)
    assert ref.it_hist() == [1, 0, 0, 0]
    assert flip.it_hist() == [0, 0, 0, 0]
    assert ref.loss_requires_grad and ref.grad[0] < 0
    assert not flip.loss_requires_grad and flip.grad[0] == 0.0
    assert np.abs(ref.penetration - flip.penetration).max() > 0
    y0, _ = world.boundary_batch(low)
    # the deciding margin: one ulp of L below tol in the low format, exactly 0 in float32
    assert flip.first_margin[0, 0] == -float(ulp(-y0[0, 0], low))
    assert ref.first_margin[0, 0] == 0.0
    assert flip.flips[:, 0].tolist() == [1, 1, 1, 1]  # the exact sum would continue every time
    assert ref.flips.sum() == 0


@pytest.mark.parametrize("low", LOW)
def test_float32_policy_repairs_the_flip(low):
    ref = world.boundary_rollout("float32", "low_precision", low=low)
    fixed = world.boundary_rollout(low, "float32", low=low)
    assert fixed.it_hist() == ref.it_hist()
    assert fixed.loss_requires_grad
    assert fixed.grad[0] == pytest.approx(ref.grad[0], rel=1e-2)


@pytest.mark.parametrize("low", LOW)
@pytest.mark.parametrize("policy", ("per_instance", "hysteresis"))
def test_per_instance_and_hysteresis_remove_the_flip(low, policy):
    runs = {fmt: world.boundary_rollout(fmt, policy, low=low) for fmt in ("float32", low)}
    assert runs["float32"].it_hist() == runs[low].it_hist()
    assert runs[low].it_hist()[0] > 0 and runs[low].loss_requires_grad
    assert runs[low].flips.sum() == 0
    # they cost more passes than the float32-promoted sum (one pass)
    assert runs[low].total_iterations[0] > 1


def test_per_instance_pass_count_is_the_geometric_count():
    y0, tol = world.boundary_batch("bfloat16")
    run = world.boundary_rollout("float32", "per_instance")
    share = tol / y0.shape[1]
    big = -y0[0, 0]
    expected = math.ceil(math.log(share / big) / math.log(1 - 0.5 * 0.5))
    assert run.it_hist()[0] == expected


@pytest.mark.parametrize("low", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("policy", ["low_precision", "float32"])
def test_torch_kernels_take_the_same_branches(low, policy):
    fmt = "bfloat16" if low == torch.bfloat16 else "float16"
    em = world.boundary_rollout(fmt, policy, low=fmt)
    nat = world.torch_boundary_rollout(low, promoted=policy == "float32")
    assert nat["it_hist"] == em.it_hist()
    assert nat["loss_requires_grad"] == em.loss_requires_grad
    np.testing.assert_array_equal(nat["p_hist"], em.penetration[:, 0, :])


def test_torch_float32_run_matches_emulated_float32():
    em = world.boundary_rollout("float32", "low_precision")
    nat = world.torch_boundary_rollout(torch.float32, low=torch.bfloat16)
    assert nat["it_hist"] == em.it_hist()
    np.testing.assert_array_equal(nat["p_hist"], em.penetration[:, 0, :])
    assert nat["grad"] == pytest.approx(em.grad[0], rel=1e-6)


def test_torch_rollouts_with_no_pass_keep_the_first_penetration():
    y0, _ = world.boundary_batch("bfloat16")
    res = world.torch_boundary_rollout(torch.bfloat16, max_iter=0, T=1)
    p = -y0[0]
    assert res["it_hist"] == [0] and res["loss"] == pytest.approx(float(np.mean(p * p)), rel=1e-2)
    assert isinstance(res["loss"], float) and not res["loss_requires_grad"]
    a = world.torch_autocast_rollout(True, max_iter=0, T=1)
    assert a["it_hist"] == [0] and a["first_s"] == [] and math.isfinite(a["loss"])


def test_torch_rollout_gain_is_k_cast_to_the_dtype():
    # k = 0.3 is not a bfloat16 value and fl(0.75 fl(k)) != fl(0.75 k); promoted: S = tol_F, so the
    # solve runs
    k = 0.3
    kb = float(torch.tensor(k).to(torch.bfloat16))
    a = world.torch_boundary_rollout(torch.bfloat16, promoted=True, k=k, alpha=0.75)
    b = world.torch_boundary_rollout(torch.bfloat16, promoted=True, k=kb, alpha=0.75)
    assert sum(a["it_hist"]) > 0
    assert a["it_hist"] == b["it_hist"] and np.array_equal(a["p_hist"], b["p_hist"])


def test_defaults_are_the_documented_ones():
    # without autocast the float32 test S >= tol holds, so the solve runs and k matters
    da, db = world.torch_autocast_rollout(False), world.torch_autocast_rollout(False, k=0.5)
    assert sum(da["it_hist"]) > 0 and da["it_hist"] == db["it_hist"]
    assert da["first_s"] == db["first_s"] and da["loss"] == db["loss"] and da["grad"] == db["grad"]
    r0, r1 = world.boundary_rollout(), world.boundary_rollout("bfloat16", "low_precision", "bfloat16")
    assert r0.world == r1.world and np.array_equal(r0.heights, r1.heights)


# --------------------------------------------------------------------------- the discrete maps


def test_semi_implicit_and_explicit_are_different_maps():
    h, g, y, v = 0.01, 9.81, 1.0, -2.0
    semi = world.rollout(World(fmt="float64", h=h, g=g), y, 1.0, 1, v0=v)
    expl = world.rollout(World(fmt="float64", h=h, g=g, integrator="explicit"), y, 1.0, 1, v0=v)
    v1 = v - h * g
    assert semi.heights[1, 0, 0] == y + h * v1 and semi.velocities[1, 0, 0] == v1
    assert expl.heights[1, 0, 0] == y + h * v and expl.velocities[1, 0, 0] == v1
    assert semi.heights[1, 0, 0] != expl.heights[1, 0, 0]


@pytest.mark.parametrize("integrator", world.INTEGRATORS)
def test_penalty_step_against_hand_written_float64(integrator):
    h, g, k, y, v = 0.01, 9.81, 2000.0, 0.01, -3.0
    w = World(fmt="float64", h=h, g=g, contact="penalty", integrator=integrator)
    run = world.rollout(w, y, k, 2, v0=v)
    for t in range(2):
        if integrator == "semi_implicit":
            v1 = v - h * g
            y1 = y + h * v1
            v = v1 + h * (k * max(0.0, -y1))
            y = y1
        else:
            p = max(0.0, -y)
            y, v = y + h * v, (v - h * g) + h * (k * p)
        assert run.heights[t + 1, 0, 0] == y and run.velocities[t + 1, 0, 0] == v


def test_projection_step_against_hand_written_float64():
    h, g, k, alpha, e, tol = 0.01, 9.81, 1.2, 0.5, 0.8, 1e-3
    ys = [0.02, -0.01, 0.005]
    v0 = -3.0
    w = World(fmt="float64", h=h, g=g, tol=tol, alpha=alpha, restitution=e)
    run = world.rollout(w, ys, k, 1, v0=v0)
    v1 = v0 - h * g
    y = [yi + h * v1 for yi in ys]
    below = [yi < 0 for yi in y]
    passes = 0
    while passes < w.max_iter:
        p = [max(0.0, -yi) for yi in y]
        s = 0.0
        for pi in p:  # the float64 accumulator, sequential
            s = s + pi
        if s < tol:
            break
        c = alpha * k
        y = [yi + c * pi for yi, pi in zip(y, p, strict=True)]
        passes += 1
    np.testing.assert_array_equal(run.heights[1, 0], y)
    assert run.iterations[0, 0] == passes > 0
    np.testing.assert_array_equal(run.velocities[1, 0], [-e * min(v1, 0) if b else v1 for b in below])


@pytest.mark.parametrize("fmt", ["bfloat16", "float16", "float32"])
def test_states_are_values_of_the_format(fmt):
    run = world.rollout(World(fmt=fmt), [0.7, 1.3, 0.45], 1.0, 80, loss="height")
    for arr in (run.heights, run.velocities, run.penetration):
        np.testing.assert_array_equal(arr, np.asarray(round_to(arr, fmt)))


def test_max_iter_stop_is_logged_and_keeps_hysteresis_engaged():
    y0, tol = world.boundary_batch("bfloat16")
    w = World(g=0.0, fmt="float32", policy="hysteresis", tol=tol, max_iter=2)
    run = world.rollout(w, y0, 0.5, 3)
    # engaged from the start: 3 passes would be needed to get below tol / 2; the cap stops at 2
    assert run.it_hist() == [2, 1, 0]
    assert run.stop[:, 0].tolist() == ["max_iter", "tol", "tol"]
    assert run.margin[0, 0] >= 0 and run.margin[1, 0] < 0


def test_hysteresis_thresholds():
    # one pass per step (max_iter=1): an engaged solver keeps going until S < tol_exit, a plain
    # one stops below tol; 1.6e-3 * 0.75^n falls below 1e-3 after 2 passes and below 0.5e-3 after 5
    y0 = -np.array([[1.6e-3]])
    w = World(g=0.0, policy="hysteresis", tol=1e-3, tol_exit=0.5e-3, max_iter=1)
    hyst = world.rollout(w, y0, 0.5, 6)
    plain = world.rollout(w.with_(policy="low_precision"), y0, 0.5, 6)
    assert hyst.it_hist() == [1, 1, 1, 1, 1, 0]
    assert plain.it_hist() == [1, 1, 0, 0, 0, 0]
    assert hyst.stop[:, 0].tolist() == ["max_iter"] * 4 + ["tol", "tol"]
    assert hyst.first_margin[0, 0] == pytest.approx(1.6e-3 - 0.5e-3)  # engaged: exit threshold
    assert hyst.first_margin[5, 0] < 0  # disengaged: S against tol
    assert hyst.first_margin[5, 0] == pytest.approx(hyst.penetration[4, 0, 0] - 1e-3, rel=1e-6)


def test_first_contact_and_ranges_are_logged():
    w = World(fmt="float32", policy="float32")
    run = world.rollout(w, [[1.0], [0.5]], 1.0, 100)
    steps = world.first_contact_steps(w, [1.0, 0.5], 100)
    np.testing.assert_array_equal(run.first_contact, steps)
    assert run.y_range[1] == 1.0 and run.y_range[0] < 0
    assert run.v_range[0] < 0 < run.v_range[1]
    text = run.summary(0)
    assert f"first contact step: {steps[0]}" in text and "dL/dk" in text


@settings(max_examples=25, deadline=None)
@given(a=st.floats(0.2, 2.0), b=st.floats(0.2, 2.0))
def test_first_contact_is_monotone_in_the_height(a, b):
    a, b = sorted((a, b))
    sa, sb = world.first_contact_steps(World(fmt="float32"), [a, b], 200)
    assert sa <= sb


def test_contact_boundary_gives_one_ulp_pair():
    w = World(fmt="float32")
    a, b, sa, sb = world.contact_boundary(w, 1.0, 1.2, 200)
    assert b == float(next_up(a, "float32"))
    assert sb == sa + 1
    np.testing.assert_array_equal(world.first_contact_steps(w, [a, b], 200), [sa, sb])
    run = world.rollout(w.with_(policy="float32"), [[a], [b]], 1.0, 200, loss="height")
    np.testing.assert_array_equal(run.first_contact, [sa, sb])
    np.testing.assert_array_equal(run.heights[: sa + 1, 0, 0] - run.heights[: sa + 1, 1, 0] <= 0, True)
    assert np.abs(run.heights[-1, 0, 0] - run.heights[-1, 1, 0]) > 1e-4


def test_contact_boundary_rejects_an_interval_without_a_change():
    with pytest.raises(ValueError, match="same step"):
        world.contact_boundary(World(), 1.0, 1.0000001, 200)


def test_damping_below_one_acts_in_contact_as_the_hand_written_step():
    # one semi-implicit penalty step in float64: v1 = v - h g, y1 = y + h v1, v = v1 + h (k p - c v1)
    h, g, k, c, y0, v0 = 0.01, 9.81, 50.0, 0.5, -0.25, -1.0
    w = World(h=h, g=g, contact="penalty", fmt="float64", damping=c)
    run = world.rollout(w, y0, k, 1, v0=v0)
    v1 = v0 - h * g
    y1 = y0 + h * v1
    want = v1 + h * (k * -y1 - c * v1)
    assert run.velocities[1, 0, 0] == want and run.heights[1, 0, 0] == y1


def test_first_contact_at_step_zero_stays_zero():
    w = World(contact="penalty", fmt="float64")
    run = world.rollout(w, 1e-3, 1.0, 4, v0=-1.0)
    assert run.touching[:, 0].all() and run.first_contact.tolist() == [0]


# --------------------------------------------------------------------------- reductions and logging


def test_low_precision_sum_is_the_gpu_simulators_sum():
    y0, tol = world.boundary_batch("float16")
    run = world.boundary_rollout("float16", "low_precision", low="float16")
    s = float(gpu.reduce_sum(-y0[0], "sequential", acc="float16"))
    assert run.first_margin[0, 0] == s - tol
    pair = world.boundary_rollout("float16", "low_precision", low="float16", order="pairwise")
    s2 = float(gpu.reduce_sum(-y0[0], "pairwise", acc="float16"))
    assert pair.first_margin[0, 0] == s2 - tol


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), tol_exp=st.floats(-5, -1))
def test_exact_decisions_agree_with_fsum(seed, tol_exp):
    rng = np.random.default_rng(seed)
    p = np.asarray(round_to(rng.uniform(0, 2e-3, (6, 12)), "bfloat16"), dtype=np.float64)
    w = World(reduce_fmt="bfloat16", tol=10**tol_exp)
    s = gpu.reduce_sum(p, "sequential", acc="bfloat16")
    thr = np.full(6, w.tol)
    fast = exact_decision(w, p, s, thr, s >= thr)
    slow = np.array([math.fsum(row) >= w.tol for row in p])
    np.testing.assert_array_equal(fast, slow)


def test_coalesce_sums_duplicates_in_the_listed_order():
    terms = gpu.boundary_terms(2.0**-10, "float16", 4)
    idx = np.array([0, 1, 0, 0, 0, 0])
    val = np.concatenate([[terms[0], 0.25], terms[1:]])
    keys, sums = world.coalesce(idx, val, acc="float16")
    assert keys.tolist() == [0, 1] and sums[1] == 0.25
    assert sums[0] == terms[0]  # large first: the small terms vanish
    _, rev = world.coalesce(idx[::-1], val[::-1], acc="float16")
    assert rev[0] == 2.0**-10
    acc = torch.zeros((), dtype=torch.float16)  # oracle: torch's float16 adds in the same order
    for v in torch.tensor(terms, dtype=torch.float16):
        acc = acc + v
    assert float(acc) == sums[0]


def test_atomic_coalesce_draws_its_orders_from_the_seed():
    terms = gpu.boundary_terms(2.0**-10, "float16", 4)  # sums depend on where the large term lands
    idx = np.array([0, 0, 0, 0, 0, 1, 1])
    val = np.concatenate([terms, [0.5, 0.25]])
    runs = [world.coalesce(idx, val, "atomic", "float16", seed=s)[1] for s in range(40)]
    assert np.array_equal(runs[3], world.coalesce(idx, val, "atomic", "float16", seed=3)[1])

    def f16_sum(order):  # oracle: torch's float16 adds in that order
        acc = torch.zeros((), dtype=torch.float16)
        for v in torch.tensor(terms[list(order)], dtype=torch.float16):
            acc = acc + v
        return float(acc)

    possible = {f16_sum(o) for o in itertools.permutations(range(5))}
    assert {r[0] for r in runs} <= possible and len({r[0] for r in runs}) > 1
    assert all(r[1] == 0.75 for r in runs)
    with pytest.raises(ValueError, match="seed"):
        world.coalesce(idx, val, "atomic", "float16")


def test_softplus_matches_torch_and_its_derivative():
    x = torch.linspace(-40, 40, 401, dtype=torch.float64, requires_grad=True)
    y = world.softplus(x)
    ref = [max(v, 0.0) + math.log1p(math.exp(-abs(v))) for v in x.tolist()]
    np.testing.assert_allclose(y.detach().numpy(), ref, rtol=2e-15, atol=0)  # a few ulps
    (g,) = torch.autograd.grad(y.sum(), x)
    np.testing.assert_allclose(g.numpy(), torch.sigmoid(x).detach().numpy(), rtol=1e-13)
    z = torch.zeros(1, dtype=torch.float64, requires_grad=True)
    (g0,) = torch.autograd.grad(world.softplus(z).sum(), z)
    assert g0.item() == 0.5


def test_fake_quantize_matches_torch_and_moves_an_iteration_count():
    x = torch.linspace(-2, 2, 129, dtype=torch.float32, requires_grad=True)
    xr = x.detach().clone().requires_grad_(True)
    y = emulate.fake_quantize(x, 2**-4, 3, -16, 15)
    ref = torch.fake_quantize_per_tensor_affine(xr, 2**-4, 3, -16, 15)
    torch.testing.assert_close(y, ref, rtol=0, atol=0)
    y.sum().backward()
    ref.sum().backward()
    torch.testing.assert_close(x.grad, xr.grad, rtol=0, atol=0)
    w = World(fmt="float64", policy="float32")
    plain = world.rollout(w, 1.0, 0.97, 150, loss="height")
    fq = world.rollout(w, 1.0, [0.96, 0.97, 0.98], 150, loss="height",
                       k_transform=lambda k: emulate.fake_quantize(k, 2**-3, 0, 0, 255))
    assert plain.total_iterations[0] != fq.total_iterations[1]
    assert fq.loss[0] == fq.loss[2]  # the quantized program is flat in k ...
    assert fq.grad[1] != 0  # ... yet the straight-through gradient is not


@pytest.mark.parametrize("bad, match", [
    ({"scale": 0.0}, "scale"), ({"scale": 0.1, "zero_point": 1.5}, "zero_point"),
    ({"scale": 0.1, "zero_point": 300}, "quant_min"),
])
def test_fake_quantize_rejects_bad_input(bad, match):
    with pytest.raises(ValueError, match=match):
        emulate.fake_quantize(torch.zeros(2), **bad)


def test_a_flip_only_the_exact_sum_sees_is_counted():
    # one big term 3 ulps below tol_F and 12 terms of ulp/4: a bfloat16 sequential sum keeps the
    # big term (S = tol_F - 3 ulp, outside a one-term error bound but inside the 13-term one),
    # the exact sum is tol_F, so the exact decision (go) reverses the rounded one (stop)
    f = get_format("bfloat16")
    tol = float(round_to(1e-3, f))
    ulp = 2.0 ** (math.frexp(tol)[1] - 1 - f.mantissa_bits)
    p = [tol - 3 * ulp] + [ulp / 4] * 12
    assert math.fsum(p) == tol
    w = World(g=0.0, fmt="bfloat16", tol=tol, max_iter=1)
    run = world.rollout(w, -np.array([p]), 0.0, 1)
    s = float(gpu.reduce_sum(np.array(p), "sequential", acc="bfloat16"))
    assert s == tol - 3 * ulp
    assert run.first_margin[0, 0] == s - tol and run.flips[0, 0] == 1


@pytest.mark.parametrize("order", ["pairwise", "blocked", "kahan"])
def test_the_stopping_sum_uses_the_worlds_order(order):
    y0, tol = world.boundary_batch("bfloat16")
    run = world.boundary_rollout("bfloat16", T=1, order=order, max_iter=1)
    s = float(gpu.reduce_sum(-y0, order, acc="bfloat16")[0])
    assert run.first_margin[0, 0] == s - tol


def test_the_iteration_cap_binds_at_max_iter_exactly():
    # gain 0: nothing moves, S = tol_F >= tol every time, so every step runs the cap
    res = world.torch_boundary_rollout(torch.bfloat16, promoted=True, k=0.0)
    assert res["it_hist"] == [25] * 4
    run = world.boundary_rollout("bfloat16", policy="float32", k=0.0, max_iter=3, T=2)
    assert run.it_hist() == [3, 3] and (run.stop == "max_iter").all()
    assert "stops on tol: 0, on max_iter: 2" in run.summary()


def test_coalesce_seeds_each_group_from_the_documented_stream():
    rng = np.random.default_rng(3)
    idx = np.repeat([2, 0, 1], 40)
    val = rng.standard_normal(idx.size) * np.exp2(rng.integers(-6, 6, idx.size))
    keys, sums = world.coalesce(idx, val, "atomic", "float16", seed=6)
    seeds = seed_generator(6).integers(0, 2**63, 3)
    want = [float(gpu.reduce_sum(val[idx == key], "atomic", acc="float16", seed=s, block=1))
            for key, s in zip(keys, seeds, strict=True)]
    assert keys.tolist() == [0, 1, 2] and sums.tolist() == want


def test_field_types_are_python_floats_and_integer_inputs_work():
    w = World(tol=np.float32(0.001), alpha=1, restitution=1, smooth=np.float32(0), damping=0)
    for name in ("tol", "alpha", "restitution", "smooth", "damping"):
        assert type(getattr(w, name)) is float, name
    run = world.rollout(World(fmt="float64"), [[1, 2]], [3], 2)
    assert run.k.dtype == np.float64 and run.iterations.dtype == np.int64
    assert world.first_contact_steps(World(), [0, 1], 5).tolist() == \
        world.first_contact_steps(World(), [0.0, 1.0], 5).tolist()


def test_summary_names_the_stopping_rule_and_skips_margins_for_penalty():
    run = world.boundary_rollout(T=1)
    assert "stopping rule low_precision (bfloat16 accumulator)" in run.summary().splitlines()[0]
    pen = world.rollout(World(contact="penalty"), 0.01, 10.0, 3)
    assert "closest deciding margin" not in pen.summary()


def test_side_by_side_header():
    run = world.boundary_rollout(T=1)
    head = world.side_by_side({"a": run, "b": run}).splitlines()[0]
    assert head.split()[:4] == ["run", "contact", "iterations", "per"] and "loss" in head.split()


# --------------------------------------------------------------------------- bad input


@pytest.mark.parametrize("fields, match", [
    ({"tol": -1e-3}, r"tol must be a finite number > 0; got tol=-0.001"),
    ({"tol": 0.0}, r"tol=0.0"),
    ({"tol": float("nan")}, r"tol"),
    ({"policy": "fp8"}, r"unknown policy 'fp8'; valid choices: low_precision, float32, per_instance, hysteresis"),
    ({"max_iter": 0}, r"max_iter must be an integer >= 1; got max_iter=0"),
    ({"max_iter": 2.5}, r"max_iter=2.5"),
    ({"max_iter": True}, r"max_iter=True"),
    ({"integrator": "rk4"}, r"valid choices: semi_implicit, explicit"),
    ({"contact": "soft"}, r"valid choices: projection, penalty"),
    ({"fmt": "bf17"}, r"valid choices: float64, float32"),
    ({"reduce_fmt": "int8"}, r"unknown float format 'int8'"),
    ({"order": "atomic"}, r"unknown order 'atomic'; valid choices: sequential"),
    ({"h": 0}, r"h must be a finite number > 0"),
    ({"g": -9.81}, r"g must be a finite number >= 0"),
    ({"restitution": 1.5}, r"restitution must lie in \[0, 1\]"),
    ({"tol_exit": 2e-3}, r"tol_exit must be below tol=0.001"),
    ({"smooth": -1.0}, r"smooth must be a finite number >= 0"),
    ({"alpha": "0.5"}, r"alpha"),
])
def test_bad_world_fields_name_the_value_and_the_choices(fields, match):
    with pytest.raises(ValueError, match=match):
        World(**fields)


@pytest.mark.parametrize("kwargs, match", [
    ({"T": 0}, r"T must be an integer >= 1; got T=0"),
    ({"loss": "energy"}, r"unknown loss 'energy'; valid choices: penetration, height, mean_height"),
    ({"k": [1.0, float("inf")]}, r"k must be finite"),
    ({"k": [1.0, 2.0], "y0": [[1.0], [2.0], [3.0]]}, r"must match or be 1"),
])
def test_bad_rollout_arguments(kwargs, match):
    args = {"y0": 1.0, "k": 1.0, "T": 5, **kwargs}
    with pytest.raises(ValueError, match=match):
        world.rollout(World(), **args)


def test_world_view_rejects_a_bad_horizon():
    from precisionlab import widgets

    with pytest.raises(ValueError, match="horizon"):
        widgets.world_view(horizon=0)
    with pytest.raises(ValueError, match="unknown policy"):
        widgets.world_view(policy="fp16", horizon=5)


def test_errors_name_the_parameter():
    cases = [(lambda: world.autocast_batch(-1.0), "tol="), (lambda: world.torch_autocast_rollout(True, T=0), "T="),
             (lambda: world.first_contact_steps(World(), [1.0], 0), "T="),
             (lambda: world.contact_boundary(World(), 0.1, math.nan, 5), "hi="),
             (lambda: World(tol_exit=-1.0), "tol_exit="), (lambda: World(damping=-1.0), "damping=")]
    for fn, name in cases:
        with pytest.raises(ValueError, match=name):
            fn()


# --------------------------------------------------------------------------- stiffness map


def test_stiffness_map_regions():
    hs = np.array([1e-3, 1e-2])
    ks = np.array([1e2, 1e5])
    semi = world.stiffness_map(hs, ks, "semi_implicit", duration=1.5)
    expl = world.stiffness_map(hs, ks, "explicit", duration=1.5)
    assert semi.forward[0, 0] == pytest.approx(1.0) and semi.regions()[0, 0] == 0
    assert expl.regions()[1, 1] == 2  # h sqrt(k) = 3.2: explicit Euler's contact blows up
    assert semi.steps.tolist() == [1500, 150]
    with pytest.raises(ValueError, match="duration"):
        world.stiffness_map(hs, ks, duration=-1)


def test_stiffness_map_keeps_k_and_backward_is_the_mean_height_sensitivity():
    hs, ks = [0.01], [50.0, 400.0]
    sm = world.stiffness_map(hs, ks, duration=0.6)  # the drop from 1 m lands at about 0.45 s
    assert sm.k.tolist() == ks
    w = World(h=0.01, contact="penalty", fmt="float64", damping=20.0)
    for j, k in enumerate(ks):
        dy = world.horizon_sensitivity(w, 1.0, k, [60])[0]
        assert dy != 0 and sm.backward[0, j] == abs(k * dy)


def test_horizon_sensitivity_uses_v0():
    w = World(contact="penalty", fmt="float64")
    got = world.horizon_sensitivity(w, 0.05, 100.0, [5], v0=-2.0)[0]
    assert got == world.rollout(w, 0.05, 100.0, 5, v0=-2.0, loss="mean_height").grad[0] != \
        world.horizon_sensitivity(w, 0.05, 100.0, [5])[0]


# --------------------------------------------------------------------------- same bits everywhere

_PROGRAM = textwrap.dedent("""
    import hashlib, numpy as np, warnings
    warnings.simplefilter("ignore")
    from precisionlab import world
    out = []
    for low in ("bfloat16", "float16"):
        for fmt in ("float32", low):
            for pol in world.POLICIES:
                r = world.boundary_rollout(fmt, pol, low=low)
                out += [r.penetration, r.grad, r.loss]
    w = world.World(fmt="bfloat16", reduce_fmt="bfloat16")
    r = world.rollout(w, np.linspace(0.3, 1.4, 24).reshape(3, 8), [0.8, 1.0, 1.2], 90, loss="height")
    out += [r.heights, r.velocities, r.grad, r.margin, r.flips.astype(float)]
    m = world.stiffness_map([2e-3, 1e-2], [1e3, 3e4], duration=0.5)
    out += [m.forward, m.backward]
    print(hashlib.sha256(b"".join(np.ascontiguousarray(a, dtype=np.float64).tobytes()
                                  for a in out)).hexdigest())
""")


def test_same_bits_under_every_dispatch_level_and_thread_count(same_bits):
    same_bits(_PROGRAM)


# --------------------------------------------------------------------------- figures and the explorer


def test_figures_and_explorer_view():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from precisionlab import plotting, widgets

    run = world.rollout(World(), [[1.0], [0.8]], [0.6, 1.2], 80, loss="height")
    fig, axes = plt.subplots(2, 3)
    assert plotting.plot_heights(0.01, {"a": run.heights[:, 0, 0], "b": run.heights[:, 1, 0]},
                                 contacts={"a": int(run.first_contact[0])}, ax=axes[0, 0]) is axes[0, 0]
    assert plotting.plot_height_gap(0.01, run.heights[:, 0, 0], run.heights[:, 1, 0], ax=axes[0, 1])
    assert plotting.plot_parameter_sweep(run.k, run.grad, run.total_iterations, ax=axes[0, 2])
    assert plotting.plot_solver_passes({"run": run.iterations}, flips=run.flips, ax=axes[1, 0])
    smap = world.stiffness_map([5e-3, 1e-2], [1e3, 1e5], duration=0.3)
    assert plotting.plot_stiffness_map(smap, ax=axes[1, 1]) is axes[1, 1]
    plt.close(fig)
    panel, vfig = widgets.world_view(tol=1e-3, policy="hysteresis", horizon=30, scenes=2, balls=4)
    assert "stopping rule hysteresis (bfloat16 sums), exit tolerance 0.0005" in panel.text
    assert vfig.axes
    size = math.prod(len(v) for v in widgets.WORLD_GRID.values())
    assert size <= widgets.MAX_FRAMES
