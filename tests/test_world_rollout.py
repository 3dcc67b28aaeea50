"""precisionlab.world against a rollout written here from the module's documented rules, in bfloat16.

The oracle (`_oracle`) steps the balls with exact rationals: every operation the world
documents as "evaluated in float64 and rounded once into the state format" is the exact value
rounded once (`rnd` of test_emulate_values, with a guard that the value is far from a tie
whenever float64 itself would round first); the stopping sums are sequential with a rounding
per add in the accumulator; the gradient dL/dk is carried forward exactly through the branch
taken, each rounding passed straight through. Fixtures sit on the thresholds on purpose:
p_i == tol/N, S == tol_exit, gains alpha k of exactly 1 and above 1, a ball rising inside
the floor, a drop that lands exactly on y = 0.
"""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest
from test_emulate_values import rnd

from precisionlab import world
from precisionlab.world import World

F = Fraction


def fl(q, fmt: str) -> Fraction:
    """fl_F(q) for one operation: exact when float64 holds q, else guarded against ties."""
    q = F(q)
    if fmt == "float64":
        return F(float(q))
    return F(rnd(q, fmt, guard=F(float(q)) != q))


def _seqsum(p, acc: str) -> Fraction:
    s = p[0]
    for x in p[1:]:
        s = fl(s + x, acc)
    return s


def _oracle(y0, v0, ks, T, *, fmt="bfloat16", h=0.01, g=9.81, contact="projection",
            integrator="semi_implicit", policy="low_precision", tol=1e-3, tol_exit=None,
            max_iter=25, alpha=0.5, e=0.8, damping=0.0, target=0.0):
    """Per lane: heights and velocities after each step, solver passes, first contact, loss, dL/dk."""
    n = len(y0)
    h, g, tol, alpha, e, cd = F(h), F(g), F(tol), F(alpha), F(e), F(damping)
    exit_tol = tol / 2 if tol_exit is None else F(tol_exit)  # the documented default
    acc = "float32" if policy == "float32" else fmt
    hg = fl(h * g, fmt)
    out = []
    for k in ks:
        k = F(k)
        c = fl(alpha * k, fmt)
        y = [fl(v, fmt) for v in y0]
        v = [fl(v0, fmt)] * n
        dy, dv = [F(0)] * n, [F(0)] * n  # d/dk, straight through every rounding
        hs, vs, its, first, engaged = [list(y)], [list(v)], [], -1, True
        for t in range(T):
            if contact == "penalty":
                if integrator == "explicit":
                    p = [max(F(0), -yi) for yi in y]
                    dp = [-d if yi < 0 else F(0) for yi, d in zip(y, dy, strict=True)]
                    y1 = [fl(yi + fl(h * vi, fmt), fmt) for yi, vi in zip(y, v, strict=True)]
                    dy1 = [a + h * b for a, b in zip(dy, dv, strict=True)]
                    v1 = [fl(vi - hg, fmt) for vi in v]
                    vel, dvel = v, dv  # damping uses the old velocity
                else:
                    v1 = [fl(vi - hg, fmt) for vi in v]
                    y1 = [fl(yi + fl(h * vi, fmt), fmt) for yi, vi in zip(y, v1, strict=True)]
                    dy1 = [a + h * b for a, b in zip(dy, dv, strict=True)]
                    p = [max(F(0), -yi) for yi in y1]
                    dp = [-d if yi < 0 else F(0) for yi, d in zip(y1, dy1, strict=True)]
                    vel, dvel = v1, dv
                nv, ndv = [], []
                for i in range(n):
                    f, df = fl(k * p[i], fmt), p[i] + k * dp[i]
                    if cd and p[i] > 0:
                        f, df = fl(f - fl(cd * vel[i], fmt), fmt), df - cd * dvel[i]
                    nv.append(fl(v1[i] + fl(h * f, fmt), fmt))
                    ndv.append(dv[i] + h * df)
                touching = any(yi < 0 for yi in y1)
                y, dy, v, dv = y1, dy1, nv, ndv
                its.append(0)
            else:
                v1 = [fl(vi - hg, fmt) for vi in v]
                y = [fl(yi + fl(h * vi, fmt), fmt) for yi, vi in zip(y, v1, strict=True)]
                dy = [a + h * b for a, b in zip(dy, dv, strict=True)]
                below = [yi < 0 for yi in y]  # decided before the solve
                touching = any(below)
                passes = 0
                for it in range(max_iter + 1):
                    p = [max(F(0), -yi) for yi in y]
                    if policy == "per_instance":
                        go_ball = [pi >= tol / n for pi in p]
                        go = any(go_ball)
                    else:
                        thr = (exit_tol if engaged else tol) if policy == "hysteresis" else tol
                        go = _seqsum(p, acc) >= thr
                        go_ball = [go] * n
                        engaged = go
                    if not go or it == max_iter:
                        break
                    for i in range(n):
                        if go_ball[i]:
                            dpi = -dy[i] if y[i] < 0 else F(0)
                            dy[i] = dy[i] + alpha * p[i] + c * dpi
                            y[i] = fl(y[i] + fl(c * p[i], fmt), fmt)
                    passes += 1
                its.append(passes)
                v = [-fl(e * min(a, F(0)), fmt) if b else a for a, b in zip(v1, below, strict=True)]
                dv = [-e * d if (b and a < 0) else (F(0) if b else d)
                      for a, b, d in zip(v1, below, dv, strict=True)]
            if first < 0 and touching:
                first = t
            hs.append(list(y))
            vs.append(list(v))
        loss = sum((yi - F(target)) ** 2 for yi in y) / n
        grad = sum(2 * (yi - F(target)) * d for yi, d in zip(y, dy, strict=True)) / n
        out.append({"heights": np.array(hs, dtype=float), "velocities": np.array(vs, dtype=float),
                    "iterations": its, "first": first, "loss": float(loss), "grad": float(grad)})
    return out


def _check(run, want, grad_rel=1e-9):
    for lane, w in enumerate(want):
        np.testing.assert_array_equal(run.heights[:, lane], w["heights"])
        np.testing.assert_array_equal(run.velocities[:, lane], w["velocities"])
        assert run.iterations[:, lane].tolist() == w["iterations"]
        assert run.first_contact[lane] == w["first"]
        assert run.loss[lane] == pytest.approx(w["loss"], rel=1e-13)
        assert run.grad[lane] == pytest.approx(w["grad"], rel=grad_rel, abs=1e-12)


# --------------------------------------------------------------------------- whole rollouts

Y0 = [0.3, 0.55, 0.8, 0.17]  # none of them a bfloat16 value
KS = [0.9, 2.0, 2.6]  # alpha k = 0.45 (not in bfloat16), exactly 1, and 1.3 > 1


@pytest.mark.parametrize("policy", world.POLICIES)
def test_projection_rollout_in_bfloat16_against_the_oracle(policy):
    kw = {"policy": policy, "tol": 2e-3}
    run = world.rollout(World(fmt="bfloat16", **kw), [Y0], KS, 45, v0=-1.3, loss="height")
    want = _oracle(Y0, -1.3, KS, 45, **kw)
    assert all(w["first"] >= 0 for w in want) and min(sum(w["iterations"]) for w in want) > 0
    _check(run, want)


@pytest.mark.parametrize("integrator", world.INTEGRATORS)
def test_damped_penalty_rollout_in_bfloat16_against_the_oracle(integrator):
    kw = {"contact": "penalty", "integrator": integrator, "damping": 20.0}
    run = world.rollout(World(fmt="bfloat16", **kw), [[0.05, 0.11]], [1500.0, 2500.0], 30, v0=-1.0,
                        loss="height")
    want = _oracle([0.05, 0.11], -1.0, [1500.0, 2500.0], 30, **kw)
    assert all(w["first"] >= 0 for w in want)
    _check(run, want, grad_rel=1e-7)


def test_fixed_values_of_a_short_bfloat16_rollout():
    """A few numbers of the oracle's rollout written out (lane k = 2: gain exactly 1)."""
    run = world.rollout(World(fmt="bfloat16", tol=2e-3), [Y0], KS, 45, v0=-1.3, loss="height")
    want = _oracle(Y0, -1.3, KS, 45, tol=2e-3)[1]
    passes = [0] * 45
    passes[9] = passes[14] = passes[22] = 1  # one pass per contact: the gain puts y on 0
    assert run.it_hist(1) == want["iterations"] == passes
    fixed = [0.1943359375, 0.369140625, 0.390625, 0.0086669921875]  # final heights, bfloat16
    assert run.heights[-1, 1].tolist() == want["heights"][-1].tolist() == fixed
    assert run.first_contact[1] == want["first"] == 9


# --------------------------------------------------------------------------- thresholds


def test_per_instance_continues_at_exactly_its_share_and_moves_only_its_balls():
    # tol/N = 2^-8 exactly; ball 0 sits on it, ball 1 below it, ball 2 in the air
    w = World(g=0.0, fmt="float32", policy="per_instance", tol=3 * 2.0**-8)
    run = world.rollout(w, [[-(2.0**-8), -(2.0**-10), 0.5]], 1.0, 2)
    assert run.it_hist() == [1, 0]  # p_0 >= tol/N: one pass halves it, then it is below
    assert run.heights[1, 0].tolist() == [-(2.0**-9), -(2.0**-10), 0.5]


def test_hysteresis_continues_at_exactly_the_exit_tolerance_and_its_default_is_half_tol():
    assert World(tol=1e-3).exit_tol == 5e-4
    # engaged: S = tol/2 exactly continues (one pass halves it); S = 3/8 tol stops at once
    w = World(g=0.0, fmt="float32", policy="hysteresis", tol=2.0**-6)
    at = world.rollout(w, [[-(2.0**-7)]], 1.0, 1)
    below = world.rollout(w, [[-3 * 2.0**-9]], 1.0, 1)
    assert at.it_hist() == [1] and at.first_margin[0, 0] == 0.0
    assert below.it_hist() == [0]


def test_low_precision_continues_at_exactly_tol():
    w = World(g=0.0, fmt="bfloat16", tol=2.0**-6)
    run = world.rollout(w, [[-(2.0**-7), -(2.0**-7)]], 1.0, 1)
    assert run.it_hist() == [1] and run.first_margin[0, 0] == 0.0


@pytest.mark.parametrize("k", [2.0, 3.0])
def test_bounce_is_decided_from_the_height_before_the_solve(k):
    # gain alpha k = 1 puts the ball exactly on the floor, 1.5 above it: it still bounces
    w = World(h=0.25, g=2.0, fmt="float32", tol=1e-3)
    run = world.rollout(w, [[0.125]], k, 1, v0=-1.0)
    assert run.iterations[0, 0] == 1 and run.heights[1, 0, 0] >= 0
    assert run.velocities[1, 0, 0] == float(np.float32(0.8 * 1.5))  # -e min(v1, 0), v1 = -1.5


def test_a_ball_rising_inside_the_floor_is_stopped_not_reversed():
    w = World(g=0.0, fmt="float32", restitution=0.8, tol=1e-3)
    run = world.rollout(w, [[-0.5]], 1.0, 1, v0=1.0)
    assert run.velocities[1, 0, 0] == 0.0  # -e min(v', 0) = 0 for v' = 1 > 0


def test_a_drop_that_lands_exactly_on_the_floor_is_not_a_contact():
    # h g = 1: y = 1.5 - 0.5 - 1.0 = 0 exactly after two steps, below 0 after three
    w = World(h=0.5, g=2.0, fmt="float32", policy="float32")
    assert world.first_contact_steps(w, [1.5, 1.25], 5).tolist() == [2, 1]
    run = world.rollout(w, [[1.5], [1.25]], 1.0, 5)
    assert run.heights[2, 0, 0] == 0.0
    assert run.first_contact.tolist() == [2, 1]


def test_the_loss_is_the_mean_over_balls_not_lanes():
    run = world.rollout(World(fmt="float64", g=0.0), [[0.5, 1.0, 2.0]], [1.0, 1.5], 1, loss="height")
    assert run.loss.tolist() == [(0.25 + 1 + 4) / 3] * 2
    run = world.rollout(World(fmt="float64", g=0.0), [[0.5, 1.0, 2.0]], [1.0, 1.5], 1, loss="mean_height")
    assert run.loss.tolist() == [3.5 / 3] * 2


# --------------------------------------------------------------------------- several horizons


@pytest.mark.parametrize("policy", world.POLICIES)
def test_one_unroll_for_several_horizons_matches_the_oracle_at_each(policy):
    kw = {"policy": policy, "tol": 2e-3}
    horizons = [45, 9, 23, 9, 1]  # any order, a repeat, the first contact step itself
    runs = world.rollouts(World(fmt="bfloat16", **kw), [Y0], KS, horizons, v0=-1.3,
                          loss="height")
    assert [len(r.iterations) for r in runs] == horizons
    for T, run in zip(horizons, runs, strict=True):
        _check(run, _oracle(Y0, -1.3, KS, T, **kw))


@pytest.mark.parametrize("loss", ["penetration", "height", "mean_height"])
@pytest.mark.parametrize("kw", [{"policy": "hysteresis", "reduce_fmt": "bfloat16"},
                                {"policy": "per_instance"},
                                {"contact": "penalty", "damping": 20.0}])
def test_several_horizons_are_each_rollout_bit_for_bit(loss, kw):
    w = World(fmt="float32", tol=1e-3, **kw)
    y0 = np.random.default_rng(3).uniform(0.05, 1.2, (3, 5))
    k = [1500.0, 2500.0, 900.0] if kw.get("contact") else [0.8, 1.0, 1.3]
    horizons = [60, 7, 31]
    for T, got in zip(horizons, world.rollouts(w, y0, k, horizons, loss=loss), strict=True):
        want = world.rollout(w, y0, k, T, loss=loss)
        for name in want.__dataclass_fields__:
            a, b = getattr(want, name), getattr(got, name)
            if isinstance(a, np.ndarray):
                assert a.shape == b.shape and a.dtype == b.dtype, name
                assert (a == b).all() if a.dtype == object else a.tobytes() == b.tobytes(), name
            else:
                assert a == b, name


@pytest.mark.parametrize("horizons, match", [([], "at least one"), (5, "list of step counts"),
                                             ("12", "list of step counts"), ([10, 0], "T")])
def test_rollouts_rejects_bad_horizons(horizons, match):
    with pytest.raises(ValueError, match=match):
        world.rollouts(World(), [0.5], 1.0, horizons)
