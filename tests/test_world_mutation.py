"""precisionlab.world: the cases a mutation run found unchecked (scripts/mutation_run.py).

Thresholds met exactly (a flip only the exact sum sees, a cap that binds), a damping below 1,
a first contact at step 0, non-default summation orders, field types, defaults, the logged
summary, and the parameter names in error messages. Oracles: float64 steps written out by
hand, math.fsum, gpu.reduce_sum called directly, and the documented seed stream.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from precisionlab import world as wd
from precisionlab.formats import get_format
from precisionlab.gpu import reduce_sum
from precisionlab.rounding import round_to, seed_generator


def test_damping_below_one_acts_in_contact_as_the_hand_written_step():
    # one semi-implicit penalty step in float64: v1 = v - h g, y1 = y + h v1, v = v1 + h (k p - c v1)
    h, g, k, c, y0, v0 = 0.01, 9.81, 50.0, 0.5, -0.25, -1.0
    w = wd.World(h=h, g=g, contact="penalty", fmt="float64", damping=c)
    run = wd.rollout(w, y0, k, 1, v0=v0)
    v1 = v0 - h * g
    y1 = y0 + h * v1
    want = v1 + h * (k * -y1 - c * v1)
    assert run.velocities[1, 0, 0] == want and run.heights[1, 0, 0] == y1


def test_first_contact_at_step_zero_stays_zero():
    w = wd.World(contact="penalty", fmt="float64")
    run = wd.rollout(w, 1e-3, 1.0, 4, v0=-1.0)
    assert run.touching[:, 0].all() and run.first_contact.tolist() == [0]


def test_a_flip_only_the_exact_sum_sees_is_counted():
    # one big term 3 ulps below tol_F and 12 terms of ulp/4: a bfloat16 sequential sum keeps the
    # big term (S = tol_F - 3 ulp, outside a one-term error bound but inside the 13-term one),
    # the exact sum is tol_F, so the exact decision (go) reverses the rounded one (stop)
    f = get_format("bfloat16")
    tol = float(round_to(1e-3, f))
    ulp = 2.0 ** (math.frexp(tol)[1] - 1 - f.mantissa_bits)
    p = [tol - 3 * ulp] + [ulp / 4] * 12
    assert math.fsum(p) == tol
    w = wd.World(g=0.0, fmt="bfloat16", tol=tol, max_iter=1)
    run = wd.rollout(w, -np.array([p]), 0.0, 1)
    s = float(reduce_sum(np.array(p), "sequential", acc="bfloat16"))
    assert s == tol - 3 * ulp
    assert run.first_margin[0, 0] == s - tol and run.flips[0, 0] == 1


@pytest.mark.parametrize("order", ["pairwise", "blocked", "kahan"])
def test_the_stopping_sum_uses_the_worlds_order(order):
    y0, tol = wd.boundary_batch("bfloat16")
    run = wd.boundary_rollout("bfloat16", T=1, order=order, max_iter=1)
    s = float(reduce_sum(-y0, order, acc="bfloat16")[0])
    assert run.first_margin[0, 0] == s - tol


def test_the_iteration_cap_binds_at_max_iter_exactly():
    # gain 0: nothing moves, S = tol_F >= tol every time, so every step runs the cap
    res = wd.torch_boundary_rollout(torch.bfloat16, promoted=True, k=0.0)
    assert res["it_hist"] == [25] * 4
    run = wd.boundary_rollout("bfloat16", policy="float32", k=0.0, max_iter=3, T=2)
    assert run.it_hist() == [3, 3] and (run.stop == "max_iter").all()
    assert "stops on tol: 0, on max_iter: 2" in run.summary()


def test_torch_rollouts_with_no_pass_keep_the_first_penetration():
    y0, _ = wd.boundary_batch("bfloat16")
    res = wd.torch_boundary_rollout(torch.bfloat16, max_iter=0, T=1)
    p = -y0[0]
    assert res["it_hist"] == [0] and res["loss"] == pytest.approx(float(np.mean(p * p)), rel=1e-2)
    assert isinstance(res["loss"], float) and not res["loss_requires_grad"]
    a = wd.torch_autocast_rollout(True, max_iter=0, T=1)
    assert a["it_hist"] == [0] and a["first_s"] == [] and math.isfinite(a["loss"])


def test_torch_rollout_gain_is_k_cast_to_the_dtype():
    # k = 0.3 is not a bfloat16 value and fl(0.75 fl(k)) != fl(0.75 k); promoted: S = tol_F, so the
    # solve runs
    k = 0.3
    kb = float(torch.tensor(k).to(torch.bfloat16))
    a = wd.torch_boundary_rollout(torch.bfloat16, promoted=True, k=k, alpha=0.75)
    b = wd.torch_boundary_rollout(torch.bfloat16, promoted=True, k=kb, alpha=0.75)
    assert sum(a["it_hist"]) > 0
    assert a["it_hist"] == b["it_hist"] and np.array_equal(a["p_hist"], b["p_hist"])


def test_defaults_are_the_documented_ones():
    # without autocast the float32 test S >= tol holds, so the solve runs and k matters
    da, db = wd.torch_autocast_rollout(False), wd.torch_autocast_rollout(False, k=0.5)
    assert sum(da["it_hist"]) > 0 and da["it_hist"] == db["it_hist"]
    assert da["first_s"] == db["first_s"] and da["loss"] == db["loss"] and da["grad"] == db["grad"]
    r0, r1 = wd.boundary_rollout(), wd.boundary_rollout("bfloat16", "low_precision", "bfloat16")
    assert r0.world == r1.world and np.array_equal(r0.heights, r1.heights)


def test_coalesce_seeds_each_group_from_the_documented_stream():
    rng = np.random.default_rng(3)
    idx = np.repeat([2, 0, 1], 40)
    val = rng.standard_normal(idx.size) * np.exp2(rng.integers(-6, 6, idx.size))
    keys, sums = wd.coalesce(idx, val, "atomic", "float16", seed=6)
    seeds = seed_generator(6).integers(0, 2**63, 3)
    want = [float(reduce_sum(val[idx == key], "atomic", acc="float16", seed=s, block=1))
            for key, s in zip(keys, seeds, strict=True)]
    assert keys.tolist() == [0, 1, 2] and sums.tolist() == want


def test_field_types_are_python_floats_and_integer_inputs_work():
    w = wd.World(tol=np.float32(0.001), alpha=1, restitution=1, smooth=np.float32(0), damping=0)
    for name in ("tol", "alpha", "restitution", "smooth", "damping"):
        assert type(getattr(w, name)) is float, name
    run = wd.rollout(wd.World(fmt="float64"), [[1, 2]], [3], 2)
    assert run.k.dtype == np.float64 and run.iterations.dtype == np.int64
    assert wd.first_contact_steps(wd.World(), [0, 1], 5).tolist() == \
        wd.first_contact_steps(wd.World(), [0.0, 1.0], 5).tolist()


def test_summary_names_the_stopping_rule_and_skips_margins_for_penalty():
    run = wd.boundary_rollout(T=1)
    assert "stopping rule low_precision (bfloat16 accumulator)" in run.summary().splitlines()[0]
    pen = wd.rollout(wd.World(contact="penalty"), 0.01, 10.0, 3)
    assert "closest deciding margin" not in pen.summary()


def test_side_by_side_header():
    run = wd.boundary_rollout(T=1)
    head = wd.side_by_side({"a": run, "b": run}).splitlines()[0]
    assert head.split()[:4] == ["run", "contact", "iterations", "per"] and "loss" in head.split()


def test_stiffness_map_keeps_k_and_backward_is_the_mean_height_sensitivity():
    hs, ks = [0.01], [50.0, 400.0]
    sm = wd.stiffness_map(hs, ks, duration=0.6)  # the drop from 1 m lands at about 0.45 s
    assert sm.k.tolist() == ks
    w = wd.World(h=0.01, contact="penalty", fmt="float64", damping=20.0)
    for j, k in enumerate(ks):
        dy = wd.horizon_sensitivity(w, 1.0, k, [60])[0]
        assert dy != 0 and sm.backward[0, j] == abs(k * dy)


def test_horizon_sensitivity_uses_v0():
    w = wd.World(contact="penalty", fmt="float64")
    got = wd.horizon_sensitivity(w, 0.05, 100.0, [5], v0=-2.0)[0]
    assert got == wd.rollout(w, 0.05, 100.0, 5, v0=-2.0, loss="mean_height").grad[0] != \
        wd.horizon_sensitivity(w, 0.05, 100.0, [5])[0]


def test_errors_name_the_parameter():
    cases = [(lambda: wd.autocast_batch(-1.0), "tol="), (lambda: wd.torch_autocast_rollout(True, T=0), "T="),
             (lambda: wd.first_contact_steps(wd.World(), [1.0], 0), "T="),
             (lambda: wd.contact_boundary(wd.World(), 0.1, math.nan, 5), "hi="),
             (lambda: wd.World(tol_exit=-1.0), "tol_exit="), (lambda: wd.World(damping=-1.0), "damping=")]
    for fn, name in cases:
        with pytest.raises(ValueError, match=name):
            fn()
