"""precisionlab.world, the parts chapter 3's corrections rely on, against independent oracles.

Oracles: free fall written out step by step in float64 (v = -g t, no contact force); exact
rationals for the autocast batch's two sums; torch's own float32 autograd for a clamped and an
unclamped one-ball solve; the fixed point of the projection (y* = 0 for any gain); central
finite differences inside one branch.
"""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest
import torch

from precisionlab import world
from precisionlab.rounding import round_to
from precisionlab.world import World

# --------------------------------------------------------------------------- damping in free flight


@pytest.mark.parametrize("integrator", world.INTEGRATORS)
@pytest.mark.parametrize("smooth", [0.0, 1e-2])
def test_damping_leaves_free_flight_alone(integrator, smooth):
    # 0.3 s of free fall from 5 m never reaches the floor: v must be -g t exactly as without
    # contact (the smoothed force itself is below 1e-150 there), whatever the damping.
    w = World(fmt="float64", contact="penalty", integrator=integrator, smooth=smooth,
              damping=20.0)
    run = world.rollout(w, 5.0, 1000.0, 30, loss="mean_height")
    v = 0.0
    for _ in range(30):
        v = v - 0.01 * 9.81
    assert run.velocities[-1, 0, 0] == pytest.approx(v, abs=1e-12)
    assert v == pytest.approx(-2.943, abs=1e-12)
    assert run.free_velocities[-1, 0, 0] == pytest.approx(v, abs=1e-12)


def test_smoothed_damping_acts_inside_the_floor_like_the_hard_one():
    # Deep in the floor softplus(-y/eps) eps = -y and sigmoid(-y/eps) = 1 to double precision:
    # one step of the smoothed model equals the hard-contact step.
    kw = {"fmt": "float64", "contact": "penalty", "damping": 20.0, "g": 0.0}
    hard = world.rollout(World(**kw), -0.5, 1000.0, 1, v0=-1.0, loss="mean_height")
    soft = world.rollout(World(smooth=1e-3, **kw), -0.5, 1000.0, 1, v0=-1.0, loss="mean_height")
    assert soft.velocities[-1, 0, 0] == pytest.approx(hard.velocities[-1, 0, 0], rel=1e-12)
    # by hand: v1 = -1, y1 = -0.51, v = v1 + h (k p - c v1)
    assert hard.velocities[-1, 0, 0] == pytest.approx(-1 + 0.01 * (1000 * 0.51 + 20), rel=1e-12)


def test_smoothed_damped_gradient_matches_finite_differences():
    w = World(fmt="float64", contact="penalty", smooth=1e-2, damping=20.0)
    k = 1500.0
    run = world.rollout(w, 1.0, k, 120, loss="height")
    fd, same = world.finite_difference(w, 1.0, k, 120, dk=1e-4, loss="height")
    assert same and fd == pytest.approx(run.grad[0], rel=1e-5)


# --------------------------------------------------------------------------- clamp and truncation


def _torch_solve(clamp: bool, k: float = 1.0, y0: float = -0.01, tol: float = 1e-3):
    """One ball inside the floor, one projection solve in plain torch float64, L = y^2."""
    kk = torch.tensor(k, dtype=torch.float64, requires_grad=True)
    y = torch.tensor(y0, dtype=torch.float64)
    while True:
        p = torch.relu(-y)
        if p.item() < tol:
            break
        y = y + 0.5 * kk * p
    if clamp:
        y = torch.relu(y)
    loss = y * y
    (g,) = torch.autograd.grad(loss, kk, allow_unused=True)
    return float(loss.detach()), 0.0 if g is None else float(g)


@pytest.mark.parametrize("clamp", [False, True])
def test_clamp_matches_a_plain_torch_solve(clamp):
    w = World(fmt="float64", g=0.0, clamp=clamp, policy="float32")
    run = world.rollout(w, -0.01, 1.0, 1, loss="height")
    loss, grad = _torch_solve(clamp)
    assert run.loss[0] == pytest.approx(loss, rel=1e-12, abs=0)
    assert run.grad[0] == pytest.approx(grad, rel=1e-12, abs=0)
    assert (grad == 0) == clamp


def test_unrolled_gradient_vanishes_as_tol_goes_to_zero_and_the_fixed_point_ignores_k():
    # For 0 < alpha k <= 1 the projection approaches its fixed point y* = 0 from below, so
    # the converged loss does not depend on k; the unrolled gradient shrinks with tol.
    w = World(fmt="float64", policy="float32")
    grads = [world.rollout(w.with_(tol=t), 1.0, 1.0, 150, loss="height").grad[0]
             for t in (1e-3, 1e-6, 1e-9)]
    assert grads[0] > 100 * grads[1] > 1e4 * grads[2] > 0
    conv = world.rollout(w.with_(tol=1e-13, max_iter=300), 1.0, [0.3, 1.0, 2.0], 150,
                         loss="height")
    assert np.ptp(conv.loss) < 1e-13
    clamped = world.rollout(w.with_(clamp=True), 1.0, [0.3, 1.0, 2.0], 150, loss="height")
    assert np.all(clamped.grad == 0) and np.ptp(clamped.loss) == 0
    assert clamped.loss[0] == pytest.approx(conv.loss[0], abs=1e-12)
    assert clamped.heights.min() == 0.0


# --------------------------------------------------------------------------- hysteresis state


def test_hysteresis_entered_disengaged_flips_like_the_single_threshold():
    for low in ("bfloat16", "float16"):
        hot = [world.boundary_rollout(f, "hysteresis", low=low) for f in ("float32", low)]
        cold = [world.boundary_rollout(f, "hysteresis", low=low, start_engaged=False)
                for f in ("float32", low)]
        assert [r.it_hist() for r in hot] == [[3, 0, 0, 0]] * 2
        assert [r.it_hist() for r in cold] == [[3, 0, 0, 0], [0, 0, 0, 0]]
        assert cold[1].grad[0] == 0 and not cold[1].loss_requires_grad
        # a disengaged solver uses tol itself: the first margin is S - tol
        _, tol = world.boundary_batch(low)
        assert cold[0].first_margin[0, 0] == 0.0 and hot[0].first_margin[0, 0] == tol / 2


# --------------------------------------------------------------------------- adjoints in a format


def test_grad_fmt_rounds_the_adjoints():
    w = World(fmt="float64", policy="float32", g=0.0)
    ref = world.rollout(w, -0.01, 1.0, 1, loss="height")
    same = world.rollout(w.with_(grad_fmt="float64"), -0.01, 1.0, 1, loss="height")
    assert same.grad[0] == ref.grad[0] and same.loss[0] == ref.loss[0]
    # Every adjoint rounded to bfloat16: the last step into k (c = alpha k, alpha = 1/2)
    # leaves a bfloat16 value times 1/2, so the gradient is a bfloat16 value.
    bf = world.rollout(w.with_(grad_fmt="bfloat16"), -0.01, 1.0, 1, loss="height")
    assert bf.grad[0] != ref.grad[0]
    assert float(round_to(bf.grad[0], "bfloat16")) == bf.grad[0]
    assert bf.grad[0] == pytest.approx(ref.grad[0], rel=2**-6)
    assert bf.loss[0] == ref.loss[0]  # the forward pass is untouched


def test_a_float16_backward_pass_overflows_on_a_stiff_bounce():
    w = World(h=10**-1.65, contact="penalty", fmt="float64", damping=20.0)
    k, T = 10**3.75, 89  # the worst cell of chapter 3's stiffness map
    ref = world.rollout(w, 1.0, k, T, loss="mean_height").grad[0]
    assert abs(ref) > 1e3
    assert not np.isfinite(world.rollout(w.with_(grad_fmt="float16"), 1.0, k, T,
                                         loss="mean_height").grad[0])
    g32 = world.rollout(w.with_(grad_fmt="float32"), 1.0, k, T, loss="mean_height").grad[0]
    assert g32 == pytest.approx(ref, rel=1e-5)


def test_horizon_sensitivity_is_the_gradient_of_each_horizon_and_matches_differences():
    w = World(h=0.01, contact="penalty", fmt="float64", damping=20.0)
    hs = world.horizon_sensitivity(w, 1.0, 2000.0, [30, 60, 90])
    for T, g in zip((30, 60, 90), hs, strict=True):
        assert g == world.rollout(w, 1.0, 2000.0, T, loss="mean_height").grad[0]
        fd, _ = world.finite_difference(w, 1.0, 2000.0, T, dk=1e-3, loss="mean_height")
        assert fd == pytest.approx(g, rel=1e-5, abs=1e-12)
    assert hs[0] == 0.0  # no contact yet at 0.3 s
    with pytest.raises(ValueError, match="horizon"):
        world.horizon_sensitivity(w, 1.0, 2000.0, [0])


# --------------------------------------------------------------------------- autocast pathway


def test_autocast_batch_reaches_tol_in_float32_only():
    y0, tol = world.autocast_batch()
    p = [Fraction(float(v)) for v in -y0[0]]
    # float32 dot: each square rounded to float32, then summed (the sum is exact here)
    sq32 = [Fraction(float(round_to(float(q * q), "float32"))) for q in p]
    assert float(sum(sq32)) >= float(round_to(tol, "float32"))
    # autocast: inputs rounded to bfloat16 first, exact products, float32 sum, bfloat16 out
    b = [Fraction(float(round_to(float(q), "bfloat16"))) for q in p]
    s_bf = float(round_to(float(sum(x * x for x in b)), "bfloat16"))
    assert s_bf < float(round_to(tol, "bfloat16"))
    # each penetration is a float32 value that rounds down to bfloat16 by almost half an ulp
    assert all(float(round_to(float(q), "float32")) == float(q) for q in p)
    assert all(x < q for x, q in zip(b, p, strict=True))
    with pytest.raises(ValueError, match="tol"):
        world.autocast_batch(tol=1e-2)


def test_torch_autocast_rollout_deletes_the_gradient():
    off, on = (world.torch_autocast_rollout(flag) for flag in (False, True))
    assert off["it_hist"] == [1, 0, 0, 0] and off["loss_requires_grad"] and off["grad"] < 0
    assert on["it_hist"] == [0, 0, 0, 0] and not on["loss_requires_grad"] and on["grad"] == 0
    assert on["s_dtype"] == torch.bfloat16 and off["s_dtype"] == torch.float32


# --------------------------------------------------------------------------- logs and checks


def test_the_log_holds_the_impact_velocity_and_every_landing():
    run = world.rollout(World(fmt="float64", integrator="explicit"), 1.0, 1.0, 150,
                        loss="height")
    landings = np.flatnonzero(run.touching[:, 0]).tolist()
    assert landings[0] == run.first_contact[0] and len(landings) >= 2
    for t in landings:
        v_hit = run.free_velocities[t, 0, 0]
        assert v_hit < 0 and run.velocities[t + 1, 0, 0] == pytest.approx(-0.8 * v_hit, rel=1e-15)
        assert run.velocities[t, 0, 0] - 0.01 * 9.81 == pytest.approx(v_hit, rel=1e-15)


def test_side_by_side_shows_first_contact():
    runs = {"a": world.rollout(World(fmt="float64"), 1.0, 1.0, 60, loss="height"),
            "b": world.rollout(World(fmt="float64"), 2.0, 1.0, 60, loss="height")}
    lines = world.side_by_side(runs).splitlines()
    assert "contact" in lines[0]
    assert lines[1].split()[1] == "44" and lines[2].split()[1] == "-1"


def test_stiffness_regions_flag_any_rise_above_the_drop_height():
    smap = world.StiffnessMap(h=np.ones(1), k=np.ones(3), integrator="semi_implicit",
                              forward=np.array([[1.0, 1.0 + 1e-12, 1.0]]),
                              backward=np.array([[1.0, 1.0, 1e3]]), steps=np.ones(1, int))
    assert smap.regions().tolist() == [[0, 2, 1]]
    assert smap.regions(forward_limit=2.0).tolist() == [[0, 0, 1]]


@pytest.mark.parametrize(("kwargs", "match"), [
    ({"clamp": 1}, "clamp must be True or False"),
    ({"start_engaged": "yes"}, "start_engaged must be True or False"),
    ({"grad_fmt": "float7"}, "float7"),
])
def test_new_fields_reject_bad_values(kwargs, match):
    with pytest.raises(ValueError, match=match):
        World(**kwargs)
