"""Tests for the stall experiment: the compiled gathered log-softmax, the serving engine, the stall verdict, the stored runs.

Oracles: emulate.log_softmax followed by `gather` under autograd (the compiled path must give
the same bits, forward and backward), the unpermuted engine (a serving kernel summing in the
forward order with fp32 log-probabilities is the shadow forward, bit for bit), ml_dtypes
casts (the bf16 log-probabilities), fractions.Fraction (the target reward, the progress and
the slowdown), hand-made logs whose verdicts are known, and the stored runs re-run from their
script's configuration (the longer runs also against the first steps of the shorter ones).
"""

from __future__ import annotations

import importlib.util
import json
import math
from fractions import Fraction
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
import torch

from precisionlab import emulate as E
from precisionlab import rl

SMALL = rl.PolicyConfig(vocab=64, n_prompts=2, max_len=8, width=16, hidden=32, depth=2,
                        logit_spread=8.0, logit_offset=0.0, eos_logit=2.0)
DATA = Path(__file__).resolve().parents[1] / "data" / "rl_stall.json"
LONG = DATA.with_name("rl_stall_long.json")  # the eps 0.05 runs, 1200 steps
SEED2 = DATA.with_name("rl_stall_seed2.json")  # seed 2's mismatched eps 0.05 run, longer
NARROW = ("matched_narrow", "mismatched_narrow", "shadow_ratio_narrow")


pytestmark = pytest.mark.usefixtures("one_torch_thread")


# --------------------------------------------------------------------------- gathered


def _logits(n=40, v=300, seed=0):
    g = torch.Generator().manual_seed(seed)
    z = (E.randn(n, v, generator=g, dtype=torch.float64) * 8).float()
    z[:3] *= 30  # rows with entries far below the maximum: exp64 underflows there
    return z, torch.randint(0, v, (n,), generator=g)


def test_gathered_log_softmax_gives_the_bits_of_log_softmax_and_gather():
    z, idx = _logits()
    w = torch.linspace(-2, 2, z.shape[0])
    w[5], w[6] = 0.0, -0.0  # zero upstream gradients of both signs
    za, zb = z.clone().requires_grad_(), z.clone().requires_grad_()
    ya = E.log_softmax(za, E.Precision("float32")).gather(1, idx[:, None]).squeeze(1)
    yb = rl.gathered_log_softmax(zb, idx)
    (ya * w).sum().backward()
    (yb * w).sum().backward()
    assert torch.equal(ya, yb) and ya.dtype == yb.dtype == torch.float32
    assert torch.equal(za.grad, zb.grad)
    assert torch.equal(torch.signbit(za.grad), torch.signbit(zb.grad))


def test_gathered_log_softmax_is_what_the_trainer_uses():
    # sequence_logprobs under autograd goes through the compiled path: the same values and
    # gradients as the emulate ops of policy_logprobs followed by a gather.
    policy = rl.Policy(SMALL, 0)
    batch = rl.Engine(policy, "bf16").generate(4, torch.Generator().manual_seed(1))
    rows, tok = batch.token_inputs(policy.bos), batch.tokens[batch.mask]
    for precision in ("fp32", "bf16"):
        got = rl.sequence_logprobs(policy, batch, precision)[batch.mask]
        ga = torch.autograd.grad(got.sum(), policy.head)[0]
        ref = rl.policy_logprobs(policy, *rows, precision).gather(1, tok[:, None]).squeeze(1)
        gb = torch.autograd.grad(ref.sum(), policy.head)[0]
        assert torch.equal(got, ref) and torch.equal(ga, gb)


@pytest.mark.parametrize("z, idx, match", [
    (torch.zeros(3, 4, dtype=torch.float64), torch.zeros(3, dtype=torch.long), "float32"),
    (torch.zeros(3, 4), torch.zeros(2, dtype=torch.long), "index must be an integer"),
    (torch.zeros(3, 4), torch.full((3,), 4), r"index must lie in \[0, 3\]"),
])
def test_gathered_log_softmax_rejects_bad_input(z, idx, match):
    with pytest.raises(ValueError, match=match):
        rl.gathered_log_softmax(z, idx)


# --------------------------------------------------------------------------- serving engine


def test_serving_kernel_in_forward_order_with_fp32_logprobs_is_the_shadow_forward():
    policy = rl.Policy(SMALL, 0)
    plain = rl.Engine(policy, "bf16")
    same = rl.ServingEngine(policy, "bf16", order="forward", logprobs="fp32")
    a = plain.generate(4, torch.Generator().manual_seed(1))
    b = same.generate(4, torch.Generator().manual_seed(1))
    assert torch.equal(a.tokens, b.tokens) and torch.equal(a.old_logp, b.old_logp)


def test_serving_kernel_differs_from_the_shadow_by_rounding_only():
    policy = rl.Policy(SMALL, 0)
    serve = rl.ServingEngine(policy, "bf16")
    batch = serve.generate(4, torch.Generator().manual_seed(1))
    rows = batch.token_inputs(policy.bos)
    lp_serve = serve.sampling_logprobs(*rows)
    lp_shadow = serve.logprobs(*rows)  # the trainer-side bf16 forward on the same weights
    # returned in bf16: every value is a bf16 number (ml_dtypes cast is the identity)
    assert np.array_equal(lp_serve.numpy().astype(ml_dtypes.bfloat16).astype(np.float32),
                          lp_serve.numpy())
    diff = (lp_serve - lp_shadow).abs()
    assert diff.max() > 0  # the serving kernel is another function of the bits ...
    # ... of the same weights: the gap stays within a few bf16 spacings of the log-prob
    spacing = torch.from_numpy(np.spacing(lp_shadow.abs().numpy().astype(ml_dtypes.bfloat16))
                               .astype(np.float32))
    assert (diff <= 8 * spacing + 0.05).all()



def test_reversed_summation_order_changes_a_few_bits_of_a_wider_policy():
    # Summed in reverse, an fp32 dot product of 64 terms rounds differently now and then; after
    # the bf16 rounding of each product only a few entries change, by little.
    wide = rl.PolicyConfig(vocab=512, n_prompts=2, max_len=8, width=64, hidden=128, depth=4,
                           logit_spread=12.0, logit_offset=0.0)
    policy = rl.Policy(wide, 0)
    g = torch.Generator().manual_seed(3)
    rows = (torch.randint(0, 2, (256,), generator=g), torch.randint(0, 513, (256,), generator=g),
            torch.randint(0, 8, (256,), generator=g))
    forward = rl.ServingEngine(policy, "bf16", order="forward", logprobs="fp32")
    reversed_ = rl.ServingEngine(policy, "bf16", order="reversed", logprobs="fp32")
    a, b = forward.sampling_logprobs(*rows), reversed_.sampling_logprobs(*rows)
    assert torch.equal(a, forward.logprobs(*rows))  # forward order: the shadow forward
    changed = rl.fmean(a != b)
    assert 0 < changed < 0.05 and float((a - b).abs().max()) < 0.5


def test_serving_engine_resyncs_its_permuted_weights():
    policy = rl.Policy(SMALL, 0)
    serve = rl.ServingEngine(policy, "bf16")
    w0 = serve.serving_weights()
    assert serve.serving_weights() is w0  # cached between syncs
    with torch.no_grad():
        policy.head.mul_(1.5)
    serve.sync(policy)
    w1 = serve.serving_weights()
    assert w1 is not w0 and not np.array_equal(w1[5], w0[5])


def test_run_config_kernel_choices():
    assert rl.RunConfig().kernel == "shadow"
    assert "serving kernel" in rl.RunConfig(kernel="serving").label
    with pytest.raises(ValueError, match="kernel"):
        rl.RunConfig(kernel="vllm")
    with pytest.raises(ValueError, match="backend='emulated'"):
        rl.RunConfig(kernel="serving", backend="native")
    with pytest.raises(ValueError, match="order"):
        rl.ServingEngine(rl.Policy(SMALL, 0), "bf16", order="random")
    assert isinstance(rl.make_engine(rl.Policy(SMALL, 0), "bf16", "serving"), rl.ServingEngine)


# --------------------------------------------------------------------------- the verdict


def _log(rewards, **fields):
    n = len(rewards)
    arrays = {k: np.full(n, 0.01) for k in rl.STEP_FIELDS}
    arrays["reward"] = np.asarray(rewards, dtype=np.float64)
    arrays.update(fields)
    return rl.RunLog(config=rl.RunConfig(steps=n), **arrays)


def _falls(start, end, n=40, at=None):
    """Rewards at `start` that jump to `end` at step `at` (None: never)."""
    r = np.full(n, float(start))
    if at is not None:
        r[at:] = end
    return r


def test_target_reward_is_the_fraction_of_the_way_to_the_optimum():
    log = _log([-60, -58, -62, -61, -59, -30, -20])
    r0 = Fraction(-60 - 58 - 62 - 61 - 59, 5)
    assert rl.target_reward(log, 0.5) == float(r0 + Fraction(1, 2) * (-1 - r0))
    with pytest.raises(ValueError, match="fraction"):
        rl.target_reward(log, 1.5)
    with pytest.raises(ValueError, match="start"):
        rl.target_reward(log, 0.5, start=8)


def test_stall_summary_verdicts_and_rescues():
    logs = {
        0: {"matched": _log(_falls(-60, -10, at=10)), "mismatched": _log(_falls(-60, -59)),
            "fix": _log(_falls(-60, -10, at=12))},
        1: {"matched": _log(_falls(-60, -10, at=10)), "mismatched": _log(_falls(-60, -10, at=20)),
            "fix": _log(_falls(-60, -10, at=15))},
        2: {"matched": _log(_falls(-60, -10, at=10)), "mismatched": _log(_falls(-60, -10, at=8)),
            "fix": _log(_falls(-60, -10, at=8))},
        3: {"matched": _log(_falls(-60, -59)), "mismatched": _log(_falls(-60, -59)),
            "fix": _log(_falls(-60, -59))},
    }
    s = rl.stall_summary(logs)
    assert [x.verdict for x in s.seeds] == ["stall", "lag", "level", "undecided"]
    assert s.verdict == "mixed"
    # steps to target: the 5-step average first reaches the target 2 steps after the jump
    # (target -30.5 from -60: two of five at -10 give -36, three give -26)
    assert [x.steps["matched"] for x in s.seeds] == [12, 12, 12, None]
    assert s.rescued() == {"fix": "rescues"}  # reaches target on the stalled seed 0
    lagging = rl.stall_summary({k: logs[k] for k in (1, 3)})  # no stall: only "faster"
    assert lagging.rescued() == {"fix": "faster"} and lagging.verdict == "mixed"
    level = rl.stall_summary({k: logs[k] for k in (1, 2)})  # seed 2: not earlier
    assert level.rescued() == {"fix": "no"}
    two = rl.stall_summary({k: logs[k] for k in (0, 1)})
    row = two.row()
    assert len(row) == len(rl.STALL_HEADERS) and row[2] == "stall (>3.33x), lag (1.83x)"
    assert row[-1] == "fix (rescues)"
    assert "12 / -" in row[1]
    table = rl.stall_table([two])
    assert len(table.rows) == 2 and table.rows[0][0].startswith("source")
    named = rl.stall_summary({k: logs[k] for k in (0, 1)}, fixes={"fix": "the fix"})
    assert named.row()[-1] == "the fix (rescues)" and named.fixes == ("fix",)


def _mean(xs):
    return Fraction(sum(map(Fraction, xs)), len(xs))


def test_progress_is_the_share_of_the_way_covered():
    # integer means (first five: -60; steps 6-10: -38), so the quotient is rounded once
    r = [-62, -58, -61, -59, -60, -30, -50, -45, -35, -40, -20]
    log = _log(r)
    want = (_mean(r[6:11]) - _mean(r[:5])) / (-1 - _mean(r[:5]))
    assert rl.progress(log, 10) == float(want) and want == Fraction(22, 59)
    assert rl.progress(log, 4) == 0.0  # the moving average over the first five steps
    assert rl.progress(log, 11) is None  # not logged
    r3 = [-62, -58, -61, -59, -60, -30, -50, -45]  # start from the first three: -61
    want3 = (_mean(r3[3:8]) - _mean(r3[:3])) / (-1 - _mean(r3[:3]))
    assert math.isclose(rl.progress(_log(r3), 7, start=3), float(want3), rel_tol=1e-15)
    for bad in (3, 4.0, True):
        with pytest.raises(ValueError, match="step must be an integer >= 4"):
            rl.progress(log, bad)
    with pytest.raises(ValueError, match="start"):
        rl.progress(log, 10, start=0)


def test_slowdown_progress_and_longer_logs():
    m = _log(_falls(-60, -10, at=10))  # reaches its target (-30.5) at step 12
    late = _falls(-60, -10, n=80, at=58)  # arrives at 60, after 40 steps
    late[10:15] = -45  # steps 8-12: two at -60, three at -45, a mean of -51
    logs = {0: {"matched": m, "mismatched": _log(late[:40]),
                "fix": _log(_falls(-60, -10, at=8))}}
    s = rl.stall_summary(logs).seeds[0]
    assert s.verdict == "stall" and s.steps["mismatched"] is None
    assert s.slowdown() == (40 / 12, True)  # at least 40 steps: a lower bound
    assert s.slowdown("fix") == (10 / 12, False) and s.logged["mismatched"] == 40
    assert s.slowdown_label("fix") == "0.83x"
    want = (Fraction(-45 * 3 - 60 * 2, 5) + 60) / 59  # 9/59 of the way, rounded once
    assert want == Fraction(9, 59)
    assert s.progress_at_matched == float(want) == s.covered["mismatched"]
    assert s.covered["fix"] == rl.progress(logs[0]["fix"], 12)
    # the same mismatched run logged twice as long: it arrives, a lag of 60 / 12 = 5
    longer = rl.stall_summary({0: {**logs[0], "mismatched": _log(late)}})
    x = longer.seeds[0]
    assert x.verdict == "lag" and x.steps["mismatched"] == 60 and x.slowdown() == (5.0, False)
    assert x.progress_at_matched == s.progress_at_matched  # horizon-free
    assert longer.row()[2] == "lag (5.00x)" and longer.row()[3] == f"{float(want):.1%}"
    # a mismatched log that ends before the matched run arrives decides nothing
    short = rl.stall_summary({0: {**logs[0], "mismatched": _log(late[:12])}}).seeds[0]
    assert short.verdict == "undecided" and short.slowdown() is None
    assert short.progress_at_matched is None and short.slowdown_label() == "?"
    assert rl.stall_summary({0: {**logs[0], "mismatched": _log(late[:12])}}).row()[3] == "?"
    # matched never arrives: no slowdown, no progress
    none = rl.stall_summary({0: {**logs[0], "matched": _log(_falls(-60, -59))}}).seeds[0]
    assert none.slowdown() is None and none.progress_at_matched is None and none.covered == {}


@pytest.mark.parametrize("n, m, want", [(40, 12, ">3.33x"), (1200, 677, ">1.77x"),
                                        (300, 150, ">=2.00x"), (14, 8, ">=1.75x")])
def test_a_lower_bound_is_shown_rounded_down(n, m, want):
    log = _log(_falls(-60, -10, n=max(n, m + 5), at=m - 2))  # reaches its target at step m
    assert log.steps_to(rl.target_reward(log)) == m
    seed = rl.stall_summary({0: {"matched": log, "mismatched": _log(_falls(-60, -59, n=n))}})
    assert seed.seeds[0].slowdown() == (n / m, True)
    assert seed.row()[2] == f"stall ({want})" and seed.seeds[0].slowdown_label() == want
    shown = Fraction(want.strip(">=x"))
    assert shown <= Fraction(n, m) and (shown < Fraction(n, m)) == (want[1] != "=")


def test_source_row_states_the_most_the_source_run_covered():
    row = rl.source_stall_row()
    (lo, hi) = rl.SOURCE_REWARDS["mismatched"]
    most = Fraction(int(hi - lo), int(-1 - lo))  # stayed within [-101, -96]: 5 of 100
    assert most == Fraction(1, 20) and row[3].startswith(f"<= {float(most):.0%}")
    assert len(row) == len(rl.STALL_HEADERS)


def test_stall_summary_rejects_bad_input():
    logs = {0: {"matched": _log(_falls(-60, -10, at=10))}}
    with pytest.raises(ValueError, match="run name"):
        rl.stall_summary(logs)
    with pytest.raises(ValueError, match="window"):
        rl.stall_summary({0: {**logs[0], "mismatched": logs[0]["matched"]}}, window=0)


# --------------------------------------------------------------------------- stored runs


def _script():
    spec = importlib.util.spec_from_file_location("rl_stall", DATA.parents[1] / "scripts"
                                                  / "rl_stall.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.skipif(not DATA.is_file(), reason="data/rl_stall.json not made yet")
def test_stored_stall_runs_match_their_script_and_replay_exactly():
    meta, logs = rl.load_runs(DATA)
    script = _script()
    assert meta["command"].startswith("python3 scripts/rl_stall.py")
    assert meta["precisionlab_version"] and meta["torch_version"] and meta["numpy_version"]
    assert meta["python_version"] and len(meta["seeds"]) >= 3
    assert rl.PolicyConfig(**meta["policy"]) == script.POLICY
    seed = meta["seeds"][0]
    configs = script.runs(meta["steps"] if "steps" in meta else 300)
    for name, log in logs[seed].items():
        assert log.config == configs[name], name
    steps = 2
    for name in ("matched", "mismatched"):
        stored = logs[seed][name].arrays()
        log = rl.train(script.POLICY, rl.with_changes(logs[seed][name].config, steps=steps),
                       seed=seed, progress=False)
        for k, v in log.arrays().items():
            np.testing.assert_array_equal(v, stored[k][:steps], err_msg=f"{name}: {k}")
    # the source's conditions hold at the start: long completions, about 1% first sync
    lengths = [-rl.fmean(logs[s]["matched"].reward[:5]) for s in meta["seeds"]]
    assert rl.fmean(lengths) >= 48
    assert all(0.005 < logs[s]["mismatched"].changed[1] < 0.02 for s in meta["seeds"])
    assert not math.isnan(rl.stall_summary(DATA).seeds[0].snr)


def _replay(meta, stored, seed, names, steps=2):
    """Re-run the first `steps` of each named stored run of `seed`; compare every field exactly."""
    policy = rl.PolicyConfig(**meta["policy"])
    for name in names:
        want = stored[seed][name].arrays()
        log = rl.train(policy, rl.with_changes(stored[seed][name].config, steps=steps),
                       seed=seed, progress=False)
        for k, v in log.arrays().items():
            np.testing.assert_array_equal(v, want[k][:steps], err_msg=f"{name}: {k}")


@pytest.mark.skipif(not LONG.is_file(), reason="data/rl_stall_long.json not made yet")
def test_long_stall_runs_replay_and_continue_the_300_step_runs():
    meta, long = rl.load_runs(LONG)
    script = _script()
    assert meta["command"].startswith("python3 scripts/rl_stall.py")
    assert "--out data/rl_stall_long.json" in meta["command"]
    assert rl.PolicyConfig(**meta["policy"]) == script.POLICY and meta["steps"] == 1200
    configs = script.runs(meta["steps"])
    for seed in meta["seeds"]:
        assert list(long[seed]) == list(NARROW)
        for name, log in long[seed].items():
            assert log.config == configs[name] and len(log.reward) == 1200, (seed, name)
    _replay(meta, long, meta["seeds"][0], NARROW[:2])
    # the first 300 steps are data/rl_stall.json's eps 0.05 runs, bit for bit
    short_meta, short = rl.load_runs(DATA)
    assert short_meta["seeds"] == meta["seeds"] and short_meta["policy"] == meta["policy"]
    for seed in meta["seeds"]:
        for name in NARROW:
            a, b = short[seed][name], long[seed][name]
            assert a.config == rl.with_changes(b.config, steps=300)
            for k, v in a.arrays().items():
                np.testing.assert_array_equal(b.arrays()[k][:300], v, err_msg=f"{seed} {name} {k}")


@pytest.mark.skipif(not SEED2.is_file(), reason="data/rl_stall_seed2.json not made yet")
def test_seed2_extension_replays_and_continues_the_long_run():
    meta, ext = rl.load_runs(SEED2)
    assert meta["command"].startswith("python3 scripts/rl_stall.py")
    assert "--out data/rl_stall_seed2.json" in meta["command"]
    assert meta["seeds"] == [2] and list(ext[2]) == ["mismatched_narrow"]
    assert rl.PolicyConfig(**meta["policy"]) == _script().POLICY
    run = ext[2]["mismatched_narrow"]
    assert run.config == _script().runs(meta["steps"])["mismatched_narrow"]
    assert meta["steps"] == len(run.reward) > 1200
    _replay(meta, ext, 2, ["mismatched_narrow"])
    _, long = rl.load_runs(LONG)  # its first 1200 steps are the long file's run
    for k, v in long[2]["mismatched_narrow"].arrays().items():
        np.testing.assert_array_equal(run.arrays()[k][:1200], v, err_msg=k)


@pytest.mark.parametrize("name", ["rl_source_regime.json", "rl_stall.json"])
def test_band_report_replays_the_stored_initial_bands(name):
    """rl.band_report (the scripts' beta-by-band record) gives the stored bands_init bit for bit."""
    meta = json.loads((Path(__file__).resolve().parents[1] / "data" / name).read_text())
    seed = meta["seeds"][0]
    bands = [tuple(b) for b in meta["bands"]]
    policy = rl.Policy(rl.PolicyConfig(**meta["policy"]), seed)
    got = rl.band_report(policy, bands, seed)
    want = meta["extras"]["matched.bands_init"]
    assert got["p_eos"] == want["p_eos"]
    assert [list(b) for b in got["bands"]] == [list(b) for b in want["bands"]]


def _steps_exact(reward) -> int | None:
    """First step whose 5-step mean reaches R_0 + (-1 - R_0) / 2, R_0 the mean of the first 5, in Fractions."""
    q = [Fraction(float(v)) for v in reward]
    r0 = sum(q[:5]) / 5
    target = r0 + (-1 - r0) / 2
    return next((i for i in range(4, len(q)) if sum(q[i - 4:i + 1]) / 5 >= target), None)


@pytest.mark.skipif(not (LONG.is_file() and SEED2.is_file()), reason="long runs not made yet")
def test_stall_summary_of_the_longest_runs_against_a_fraction_oracle():
    _, long = rl.load_runs(LONG)
    _, ext = rl.load_runs(SEED2)
    longest = {s: {**long[s], **ext.get(s, {})} for s in long}
    summary = rl.stall_summary(longest, fixes=["shadow_ratio_narrow"], matched="matched_narrow",
                               mismatched="mismatched_narrow")
    for x in summary.seeds:
        runs = longest[x.seed]
        want = {"matched": _steps_exact(runs["matched_narrow"].reward),
                "mismatched": _steps_exact(runs["mismatched_narrow"].reward),
                "shadow_ratio_narrow": _steps_exact(runs["shadow_ratio_narrow"].reward)}
        assert x.steps == want and None not in want.values()
        m = want["matched"]
        assert x.slowdown() == (float(Fraction(want["mismatched"], m)), False)
        assert x.verdict == ("lag" if want["mismatched"] > m else "level")
        q = [Fraction(float(v)) for v in runs["mismatched_narrow"].reward]
        r0 = sum(q[:5]) / 5
        covered = (sum(q[m - 4:m + 1]) / 5 - r0) / (-1 - r0)
        assert math.isclose(x.progress_at_matched, float(covered), rel_tol=1e-12)
