"""findings.source_findings and its helpers against hand-built logs and independent oracles.

Oracles: mpmath's normal CDF at 50 digits for the Gaussian tail; a Welch standard error written out with
numpy; token weights min(rA, clip(r)A) by numpy; every verdict rule exercised on RunLogs whose
arrays are set by hand so that the right answer is known.
"""

from __future__ import annotations

import dataclasses
import math

import mpmath
import numpy as np
import pytest
import torch

from precisionlab import rl
from precisionlab.chapters import rl_findings as findings

STEPS = 30


def _log(steps: int = STEPS, **arrays) -> rl.RunLog:
    """A RunLog with every per-step field 0 (beta_adv_corr nan) except those given."""
    base = {k: np.zeros(steps) for k in rl.STEP_FIELDS}
    base["beta_adv_corr"] = np.full(steps, np.nan)
    base["reward"] = np.full(steps, -10.0)
    for k, v in arrays.items():
        base[k] = np.broadcast_to(np.asarray(v, dtype=np.float64), (steps,)).copy()
    return rl.RunLog(config=rl.RunConfig(steps=steps), **base)


def _converging(at: int | None, steps: int = STEPS) -> np.ndarray:
    r = np.full(steps, -10.0)
    if at is not None:
        r[at - 4:] = -1.0  # the 5-step mean reaches -2 exactly at step `at`
    return r


def _evidence(**changes) -> findings.Evidence:
    seeds = (0, 1, 2)
    kw = {
        "matched": {s: _log(reward=_converging(10)) for s in seeds},
        "mismatched": {s: _log(reward=_converging(12), beta_std=0.1) for s in seeds},
        "converge": {"lr10": [5, 5, 5], "bf16_weights": [None] * 3,
                     "bf16_weights_lr10": [9, 9, 9], "fix_baseline": [None] * 3,
                     "eps10": [20, 20, 20], "shadow": [21, 22, 23]},
    }
    kw.update(changes)
    return findings.Evidence(**kw)


def test_normal_outside_is_the_gaussian_tail():
    for mean, std, lo, hi in [(-0.01, 0.15, -0.2, 0.2), (0.0, 1.0, -1.0, 2.0),
                              (-0.0006, 0.043, math.log(0.8), math.log(1.2))]:
        with mpmath.workdps(50):
            below = mpmath.ncdf(lo, mu=mean, sigma=std)
            above = 1 - mpmath.ncdf(hi, mu=mean, sigma=std)
            want = float(below + above)
        assert findings.normal_outside(mean, std, lo, hi) == pytest.approx(want, rel=1e-12)
    assert f"{findings.normal_outside(-0.01, 0.15, -0.2, 0.2):.0%}" == "18%"  # the source's estimate
    with pytest.raises(ValueError, match="std"):
        findings.normal_outside(0.0, 0.0, -1.0, 1.0)
    with pytest.raises(ValueError, match="lo"):
        findings.normal_outside(0.0, 1.0, 1.0, -1.0)


def test_grows_uses_two_welch_standard_errors():
    rng = np.random.default_rng(0)
    early, late = rng.normal(0.0, 0.01, 10), rng.normal(0.0, 0.01, 10)
    se = math.sqrt(np.var(early, ddof=1) / 10 + np.var(late, ddof=1) / 10)
    gap = late.mean() - early.mean()
    assert findings.grows(early, late) == (gap > 2 * se)
    assert findings.grows(early, late + 3 * se - gap) and not findings.grows(early, late + 1.5 * se - gap)
    assert not findings.grows([0.0321] * 5 + [0.0322] * 5, [0.0321] * 5 + [0.0325] * 5, z=1e9)
    with pytest.raises(ValueError, match="early and late"):
        findings.grows([1.0], [1.0, 2.0])


def test_weight_mean_is_the_mean_of_the_ppo_weights():
    rng = np.random.default_rng(1)
    snap = {"alpha": rng.normal(0, 0.05, 200), "beta": rng.normal(0, 0.2, 200),
            "adv": rng.choice([-1.5, 0.5, 2.0], 200)}
    r = np.exp(snap["alpha"] + snap["beta"])
    want = np.mean(np.minimum(r * snap["adv"], np.clip(r, 0.8, 1.2) * snap["adv"]))
    assert findings.weight_mean(snap) == pytest.approx(want, rel=1e-12)


def test_every_row_is_judged_and_tallied():
    rows = findings.source_findings(_evidence())
    assert list(rows) == list(rl.SOURCE)
    counts = findings.tally(rows)
    assert sum(counts.values()) == len(rl.SOURCE) and set(counts) == set(findings.VERDICTS)
    assert rows["beta_std"] == ("0.100, 0.100, 0.100", "yes")  # within a factor 2 of 0.149
    assert rows["beta_zero"][1] == "yes"  # matched beta is 0 everywhere
    assert rows["cos_reinforce"][1] == rows["mu_w"][1] == "untestable"
    assert rows["rare"] == ("no entries", "untestable")


def test_yes_needs_every_seed_and_no_needs_every_seed():
    ev = _evidence()
    ev.mismatched[2].beta_std[:] = 0.01  # one seed far off, two reproduce: the seeds disagree
    assert findings.source_findings(ev)["beta_std"][1] == "mixed"
    for m in ev.mismatched.values():
        m.beta_std[:] = 0.01  # every seed far off
    assert findings.source_findings(ev)["beta_std"][1] == "no"
    # clip contrast: two seeds in the source's direction, one against it -> mixed, not no
    ev = _evidence()
    for s, (a, b) in zip((0, 1, 2), ((0.08, 0.04), (0.05, 0.04), (0.09, 0.10)), strict=True):
        ev.mismatched[s].clip[3], ev.matched[s].clip[3] = a, b
    assert findings.source_findings(ev)["clip_step3"][1] == "mixed"
    # deployed: matched ahead on every seed, by 5x on two and 1.5x on one -> partly
    ev = _evidence()
    for s, ratio in zip((0, 1, 2), (5.0, 5.0, 1.5), strict=True):
        ev.matched[s].deployed[:] = ratio * 1e-3
        ev.mismatched[s].deployed[:] = 1e-3
    assert findings.source_findings(ev)["deployed"][1] == "partly"


def test_fixes_must_rescue_the_run_they_are_applied_to():
    assert findings.source_findings(_evidence())["fixes"][1] == "yes"  # unfixed never arrives
    ev = _evidence(converge={**_evidence().converge, "fix_baseline": [27, 27, 8],
                             "eps10": [23, 23, 9]})
    assert findings.source_findings(ev)["fixes"][1] == "mixed"  # seed 2: later than the unfixed run
    ev = _evidence(converge={**_evidence().converge, "fix_baseline": [8, 8, 8],
                             "eps10": [23, 23, 9]})
    assert findings.source_findings(ev)["fixes"][1] == "no"  # later than the unfixed run everywhere
    ev = _evidence(converge={**_evidence().converge, "fix_baseline": [None, None, 10],
                             "eps10": [23, 23, 9], "shadow": [29, 27, 9]})
    assert findings.source_findings(ev)["fixes"][1] == "partly"  # earlier on every seed


def test_the_cosine_is_judged_against_the_matched_run():
    def rep(c):
        return {3: {"cos_reinforce": c, "cos_ratio_score": -0.5, "cos_clean_actual": 0.99}}

    ev = _evidence(gradients={0: rep(0.939)}, matched_gradients={0: rep(0.950)})
    rows = findings.source_findings(ev)
    assert rows["cos_reinforce"][1] == "mixed"  # a fall of 0.011 on one seed of three: not no
    three = {s: rep(0.939) for s in (0, 1, 2)}
    ev = _evidence(gradients=three, matched_gradients={s: rep(0.950) for s in (0, 1, 2)})
    assert findings.source_findings(ev)["cos_reinforce"][1] == "no"  # no evidence on any seed
    ev = _evidence(gradients={0: rep(0.60)}, matched_gradients={0: rep(0.95)})
    assert findings.source_findings(ev)["cos_reinforce"][1] == "partly"  # yes, capped: one seed
    three = {s: rep(0.60) for s in (0, 1, 2)}
    ev = _evidence(gradients=three, matched_gradients={s: rep(0.95) for s in (0, 1, 2)})
    rows = findings.source_findings(ev)
    assert rows["cos_reinforce"][1] == "yes" and rows["cos_no_clip"][1] == "yes"
    assert rows["cos_ratio_score"][1] == "yes"


def test_a_correlation_must_rise_beyond_its_noise():
    rng = np.random.default_rng(2)
    flat = _evidence()
    for m in flat.mismatched.values():
        m.beta_adv_corr[:] = 0.0321 + rng.normal(0, 0.01, STEPS)
    assert findings.source_findings(flat)["corr"][1] == "no"
    rising = _evidence()
    for m in rising.mismatched.values():
        m.beta_adv_corr[:] = np.linspace(0.0, 0.1, STEPS) + rng.normal(0, 0.002, STEPS)
    assert findings.source_findings(rising)["corr"][1] == "yes"


def test_calibrated_rows_read_set_and_unknown_keys_are_rejected():
    rows = findings.source_findings(_evidence(calibrated=frozenset({"beta_std", "first_sync"})))
    assert rows["beta_std"][1] == rows["first_sync"][1] == "set"
    assert findings.tally(rows)["set"] == 2
    with pytest.raises(ValueError, match="unknown source finding"):
        findings.source_findings(_evidence(calibrated=frozenset({"beta_mean"})))


def test_windows_restrict_the_steps():
    ev = _evidence(window=slice(0, 10))
    for m in ev.mismatched.values():
        m.beta_std[:10] = 0.15
        m.beta_std[10:] = 10.0
    assert findings.source_findings(ev)["beta_std"] == ("0.150, 0.150, 0.150", "yes")
    ev = _evidence()
    for m in ev.mismatched.values():
        m.beta_std[:10] = 0.15
        m.beta_std[10:] = 10.0
    assert findings.source_findings(ev)["beta_std"][1] == "no"


def test_undefined_seeds_are_left_out_and_unmeasured_ones_cap():
    # corr(beta, A) is nan once every advantage is 0: that seed says nothing either way
    ev = _evidence()
    rng = np.random.default_rng(3)
    for m in ev.mismatched.values():
        m.beta_adv_corr[:] = np.linspace(0.0, 0.1, STEPS) + rng.normal(0, 0.002, STEPS)
    ev.mismatched[2].beta_adv_corr[-3:] = np.nan
    assert findings.source_findings(ev)["corr"][1] == "yes"  # the two defined seeds agree
    assert findings.source_findings(ev)["corr"][0].endswith(">nan")
    # gradient reports: a step whose cosines are nan is skipped, the seed's other steps count
    def rep(c):
        return {"cos_reinforce": c, "cos_ratio_score": -0.5, "cos_clean_actual": 0.99}

    nan_step = {3: rep(0.60), 20: rep(float("nan"))}
    ev = _evidence(gradients={s: nan_step for s in (0, 1, 2)},
                   matched_gradients={s: {3: rep(0.95), 20: rep(-0.1)} for s in (0, 1, 2)})
    rows = findings.source_findings(ev)
    assert rows["cos_reinforce"] == ("0.950/0.600; 0.950/0.600; 0.950/0.600", "yes")
    # the rare-token bands come from one seed: at most partly, never no
    assert findings.source_findings(_evidence(rare=(0.75, 0.02)))["rare"][1] == "partly"
    assert findings.source_findings(_evidence(rare=(0.02, 0.75)))["rare"][1] == "mixed"


def test_mu_w_is_judged_per_seed():
    same = {s: (-0.25, -0.24) for s in (0, 1, 2)}
    assert findings.source_findings(_evidence(mu_w=same))["mu_w"][1] == "yes"
    level = {s: (-0.80, -0.78) for s in (0, 1, 2)}  # equal across runs, another level
    assert findings.source_findings(_evidence(mu_w=level))["mu_w"][1] == "partly"
    one_off = {**same, 2: (-0.33, -0.28)}  # 15% apart on one seed
    assert findings.source_findings(_evidence(mu_w=one_off))["mu_w"][1] == "mixed"
    apart = {s: (-0.33, -0.28) for s in (0, 1, 2)}
    assert findings.source_findings(_evidence(mu_w=apart))["mu_w"][1] == "no"


def test_the_tally_counts_mixed_rows():
    ev = _evidence()
    ev.mismatched[2].beta_std[:] = 0.01
    counts = findings.tally(findings.source_findings(ev))
    assert counts["mixed"] >= 1 and sum(counts.values()) == len(rl.SOURCE)


SMALL = rl.PolicyConfig(n_prompts=2, max_len=5, vocab=16, width=8, hidden=8, depth=1)


def test_gradient_report_is_nan_where_every_advantage_is_zero():
    policy = rl.Policy(SMALL, seed=0)
    ro = rl.Engine(policy, "bf16").generate(4, torch.Generator().manual_seed(1))
    tokens = ro.tokens.clone()
    tokens[:, 0] = rl.EOS  # every completion stops at once: equal rewards, A = 0
    mask = torch.zeros_like(ro.mask)
    mask[:, 0] = True
    same = dataclasses.replace(ro, tokens=tokens, mask=mask)
    with torch.no_grad():
        old = rl.sequence_logprobs(policy, same, "bf16")
    same = dataclasses.replace(same, old_logp=old)
    assert not rl.group_advantages(same.rewards, same.group_size).any()
    rep = rl.gradient_report(policy, same, rl.RunConfig(trainer="fp32", engine="bf16"))
    for key in ("ratio_error", "score_error", "cos_ratio_score", "cos_clean_actual",
                "cos_clipped", "cos_reinforce"):
        assert math.isnan(rep[key]), key
    assert rep["cos_cross_entropy"] > 0.99  # cross-entropy has no advantage: still defined


def test_train_seeds_reports_gradients_on_the_chosen_seeds():
    runs = {"a": rl.RunConfig(steps=2)}
    logs = rl.train_seeds(SMALL, runs, [0, 1, 2], progress=False, gradients=(1,),
                          gradient_seeds=[1, 2])
    assert [bool(logs[s]["a"].gradients) for s in (0, 1, 2)] == [False, True, True]
    first = rl.train_seeds(SMALL, runs, [0, 1], progress=False, gradients=(1,))
    assert [bool(first[s]["a"].gradients) for s in (0, 1)] == [True, False]
    np.testing.assert_array_equal(first[1]["a"].reward, logs[1]["a"].reward)  # no side effect
    with pytest.raises(ValueError, match="gradient_seeds"):
        rl.train_seeds(SMALL, runs, [0, 1], progress=False, gradient_seeds=[5])


def test_ratio_one_trains_the_same_at_any_clip_range():
    # The chapter reuses its eps = 0.2 run for "ratio = 1" at eps = 0.05: the ratio is exactly
    # 1, inside every clip range, so the training must agree bit for bit (phantom and
    # legitimate only classify tokens against each run's own clip range).
    runs = {f"{mode} {eps}": rl.RunConfig(steps=3, ratio_mode=mode, eps_low=eps, eps_high=eps,
                                          lr=1e-2)
            for mode in ("one", "actual") for eps in (0.05, 0.2, 10.0)}
    logs = rl.train_many(SMALL, runs, progress=False)
    for eps in (0.05, 10.0):
        for k, v in logs["one 0.2"].arrays().items():
            if k in ("phantom", "legitimate"):
                continue
            np.testing.assert_array_equal(logs[f"one {eps}"].arrays()[k], v, err_msg=k)
    # the control: with the trainer's own ratio the clip range matters
    assert not np.array_equal(logs["actual 0.05"].clip, logs["actual 10.0"].clip)


def test_weight_means_lists_every_recorded_step_in_order():
    rng = np.random.default_rng(2)
    snaps = {k: {"alpha": rng.normal(0, 0.05, 50), "beta": rng.normal(0, 0.2, 50),
                 "adv": rng.choice([-1.0, 0.5, 2.0], 50)} for k in (7, 0, 3)}
    log = dataclasses.replace(_log(), snapshots=snaps)
    got = findings.weight_means(log, 0.1, 0.3)
    for k, value in zip((0, 3, 7), got, strict=True):  # step order, not insertion order
        s = snaps[k]
        r = np.exp(s["alpha"] + s["beta"])
        want = np.mean(np.minimum(r * s["adv"], np.clip(r, 0.9, 1.3) * s["adv"]))
        assert value == pytest.approx(want, rel=1e-12)
    assert findings.weight_means(_log()) == []


def test_steps_to_target_reads_every_seed_in_order():
    by_seed = {2: {"a": _log(reward=_converging(20))}, 0: {"a": _log(reward=_converging(8))},
               1: {"a": _log(reward=_converging(None))}}
    assert findings.steps_to_target(by_seed, "a") == [8, None, 20]
    assert findings.steps_to_target(by_seed, "a", target=-20.0) == [4, 4, 4]  # -10 >= -20 at once


def test_evidence_from_runs_is_the_hand_built_evidence():
    ev = _evidence()
    names = {"matched": "m", "mismatched": "mm", "lr10": "lr10", "bf16_weights": "bw",
             "bf16_weights_lr10": "bw10", "fix_baseline": "mm", "eps10": "e10",
             "shadow": "sh"}
    made = {"lr10": 5, "bw": None, "bw10": 9, "e10": 20}
    by_seed = {}
    for s in (0, 1, 2):
        runs = {"m": ev.matched[s], "mm": ev.mismatched[s],
                "sh": _log(reward=_converging(21 + s))}
        runs.update({k: _log(reward=_converging(at)) for k, at in made.items()})
        report = {"cos_ratio_score": -0.3, "cos_clean_actual": 0.99, "cos_reinforce": 0.5}
        runs["mm"] = dataclasses.replace(runs["mm"], gradients={3: report} if s else {})
        by_seed[s] = runs
    got = findings.evidence_from_runs(by_seed, names, rare=(0.5, 0.1))
    want_converge = dict(ev.converge, fix_baseline=[12, 12, 12])  # the mismatched run
    assert got.converge == want_converge
    assert got.matched == ev.matched and got.rare == (0.5, 0.1)
    assert list(got.gradients) == [1, 2] and got.matched_gradients == {}
    hand = dataclasses.replace(ev, converge=want_converge, rare=(0.5, 0.1),
                               mismatched={s: by_seed[s]["mm"] for s in (0, 1, 2)},
                               gradients={s: by_seed[s]["mm"].gradients for s in (1, 2)})
    assert findings.source_findings(got) == findings.source_findings(hand)
    given = findings.evidence_from_runs(by_seed, names, gradients={0: {}})
    assert given.gradients == {0: {}} and given.matched_gradients == {}
    with pytest.raises(ValueError, match="names must name a run for eps10, shadow"):
        findings.evidence_from_runs(by_seed, {k: v for k, v in names.items()
                                        if k not in ("eps10", "shadow")})
