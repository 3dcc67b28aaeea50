"""Tests for precisionlab.rl against independent computations.

Oracles: NumPy and plain-Python arithmetic written from the formulas (group advantages, the
PPO case analysis, closed-form gradients of the surrogate with respect to log-probabilities),
per-token score vectors from one autograd call per token (the four passes must equal the
coefficient-weighted sums of them), ml_dtypes casts (the engine's weights and the count of
changed weights), torch's own fp16 matmul, and sampling frequencies.
"""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from precisionlab import rl

SMALL = rl.PolicyConfig(vocab=32, n_prompts=2, max_len=6, width=16, hidden=32, depth=3)


@pytest.fixture(autouse=True)
def _one_thread():
    # One thread keeps fp32 reductions in one order, so bitwise comparisons are meaningful.
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)


def _policy(cfg=SMALL, seed=0):
    return rl.Policy(cfg, torch.Generator().manual_seed(seed))


def _rollout(policy, precision="bf16", group_size=4, seed=1):
    return rl.Engine(policy, precision).generate(group_size, torch.Generator().manual_seed(seed))


# --------------------------------------------------------------------------- advantages


@settings(max_examples=50, deadline=None)
@given(st.lists(st.integers(-20, -1), min_size=12, max_size=12), st.sampled_from([2, 3, 4, 6]))
def test_group_advantages_match_numpy(rewards, g):
    r = np.array(rewards, dtype=np.float64).reshape(-1, g)
    expect = (r - r.mean(1, keepdims=True)) / (r.std(1, ddof=1, keepdims=True) + 1e-4)
    got = rl.group_advantages(torch.tensor(rewards, dtype=torch.float64), g)
    np.testing.assert_allclose(got.numpy(), expect.reshape(-1), rtol=1e-12, atol=1e-12)


def test_group_advantages_reject_ragged_groups():
    with pytest.raises(ValueError, match="group_size=3"):
        rl.group_advantages(torch.zeros(8), 3)


# --------------------------------------------------------------------------- alpha / beta

finite = st.floats(-30, 0, allow_nan=False, width=64)


@settings(max_examples=200, deadline=None)
@given(finite, finite, finite)
def test_alpha_plus_beta_is_the_log_ratio(train, shadow, old):
    alpha, beta = rl.log_ratio_split(torch.tensor(train, dtype=torch.float64),
                                     torch.tensor(shadow, dtype=torch.float64),
                                     torch.tensor(old, dtype=torch.float64))
    # Exact in rationals; in float64 each subtraction rounds once, so allow a few ulps of 30.
    assert math.isclose(float(alpha + beta), train - old, rel_tol=0, abs_tol=1e-13)
    assert float(beta) == train - shadow and float(alpha) == shadow - old


def test_matched_precision_gives_beta_exactly_zero_and_on_policy_alpha_zero():
    policy = _policy()
    for precision in ("bf16", "fp16", "fp32"):
        ro = _rollout(policy, precision)
        with torch.no_grad():
            train = rl.sequence_logprobs(policy, ro, precision)
            shadow = rl.sequence_logprobs(policy, ro, precision)
        alpha, beta = rl.log_ratio_split(train, shadow, ro.old_logp)
        assert torch.equal(beta, torch.zeros_like(beta))
        if precision != "fp32":  # low-precision GEMMs here give the same rows at any batch size
            assert torch.equal(alpha[ro.mask], torch.zeros(int(ro.mask.sum())))


def test_mismatched_precision_gives_nonzero_beta():
    policy = _policy(rl.PolicyConfig())
    ro = _rollout(policy, "bf16", group_size=8)
    table = rl.beta_table(policy, ro, ("fp32", "bf16", "fp16"), reference="bf16")
    assert table["bf16"]["nonzero"] == 0.0 and table["bf16"]["max_abs"] == 0.0
    assert table["fp32"]["nonzero"] > 0.9 and table["fp32"]["mean_abs"] > 0.05
    assert table["fp16"]["nonzero"] > 0.9


# --------------------------------------------------------------------------- clipping


def _clipped_oracle(r, a, lo, hi):
    """The case analysis of min(rA, clip(r)A): the constant branch wins where clip(r)A < rA."""
    c = min(max(r, 1 - lo), 1 + hi)
    return (a > 0 and c < r) or (a < 0 and c > r)


@settings(max_examples=300, deadline=None)
@given(st.floats(-1, 1), st.floats(-1, 1), st.sampled_from([-1.5, -0.3, 0.0, 0.7, 2.0]),
       st.sampled_from([0.1, 0.2, 0.28]), st.sampled_from([0.1, 0.2, 0.28]))
def test_classification_matches_case_analysis(alpha, beta, a, lo, hi):
    actual = _clipped_oracle(math.exp(alpha + beta), a, lo, hi)
    clean = _clipped_oracle(math.exp(alpha), a, lo, hi)
    expect = {(False, False): "unclipped", (True, False): "phantom", (True, True): "legitimate",
              (False, True): "released"}[(actual, clean)]
    t = lambda v: torch.tensor([v], dtype=torch.float64)  # noqa: E731
    got = rl.classify_clipping(t(alpha), t(beta), t(a), lo, hi)
    assert rl.CLIP_CLASSES[int(got)] == expect


def test_classification_on_constructed_tokens():
    # (alpha, beta, A): a token that has not moved, pushed out by beta (phantom), one that
    # moved for real (legitimate), one whose real move beta hides (released), the one-sided
    # rule (A < 0 never clips above; A > 0 never clips below) and A = 0.
    cases = [
        (0.0, 0.25, 1.0, "phantom"), (0.0, -0.30, -1.0, "phantom"),
        (0.3, 0.0, 1.0, "legitimate"), (-0.4, 0.05, -2.0, "legitimate"),
        (0.3, -0.2, 1.0, "released"), (0.0, 0.5, -1.0, "unclipped"),
        (0.0, -0.5, 1.0, "unclipped"), (0.0, 0.9, 0.0, "unclipped"), (0.05, 0.05, 1.0, "unclipped"),
    ]
    alpha, beta, adv, expect = zip(*cases, strict=True)
    got = rl.classify_clipping(torch.tensor(alpha), torch.tensor(beta), torch.tensor(adv))
    assert [rl.CLIP_CLASSES[i] for i in got.tolist()] == list(expect)


def test_asymmetric_epsilon_uses_the_right_bound():
    r = torch.tensor([1.25, 1.25, 0.85, 0.85])
    a = torch.tensor([1.0, 1.0, -1.0, -1.0])
    assert rl.clipped(r, a, eps_low=0.1, eps_high=0.28).tolist() == [False, False, True, True]
    assert rl.clipped(r, a, eps_low=0.2, eps_high=0.2).tolist() == [True, True, False, False]


# --------------------------------------------------------------------------- the loss


def _loss_inputs(seed=0, n_rows=3, n_cols=5):
    g = torch.Generator().manual_seed(seed)
    logp = (-torch.rand(n_rows, n_cols, generator=g, dtype=torch.float64) * 4)
    old = logp + torch.randn(n_rows, n_cols, generator=g, dtype=torch.float64) * 0.3
    shadow = logp + torch.randn(n_rows, n_cols, generator=g, dtype=torch.float64) * 0.2
    adv = torch.randn(n_rows, generator=g, dtype=torch.float64)
    mask = torch.rand(n_rows, n_cols, generator=g) < 0.7
    mask[:, 0] = True
    return logp, old, shadow, adv, mask


def _oracle_weights_and_grad(logp, old, shadow, adv, mask, lo, hi, ratio_mode, weight_mode):
    """W_t and dL/dlogp_t written out from the formulas, in NumPy."""
    lp, o, sh, m = logp.numpy(), old.numpy(), shadow.numpy(), mask.numpy().astype(float)
    a = np.broadcast_to(adv.numpy()[:, None], lp.shape)
    r = {"actual": np.exp(lp - o), "one": np.ones_like(lp), "shadow": np.exp(sh - o)}[ratio_mode]
    w = np.minimum(r * a, np.clip(r, 1 - lo, 1 + hi) * a)
    n = m.sum()
    dead = ((a > 0) & (r > 1 + hi)) | ((a < 0) & (r < 1 - lo))
    if weight_mode == "ppo":
        # d/dlogp of r A is r A in every ratio mode (the "live" factor carries the gradient).
        return w, -(m * a * r * ~dead) / n
    if weight_mode == "detached_centered":
        w = w - (w * m).sum() / n
    return w, -(m * w) / n


@pytest.mark.parametrize("ratio_mode", rl.RATIO_MODES)
@pytest.mark.parametrize("weight_mode", rl.WEIGHT_MODES)
@pytest.mark.parametrize(("lo", "hi"), [(0.2, 0.2), (0.1, 0.28), (10.0, 10.0)])
def test_surrogate_gradient_matches_closed_form(ratio_mode, weight_mode, lo, hi):
    logp, old, shadow, adv, mask = _loss_inputs()
    leaf = logp.clone().requires_grad_(True)
    loss = rl.surrogate_loss(leaf, old, adv, mask, lo, hi, ratio_mode, weight_mode, shadow)
    loss.backward()
    w, grad = _oracle_weights_and_grad(logp, old, shadow, adv, mask, lo, hi, ratio_mode,
                                       weight_mode)
    np.testing.assert_allclose(leaf.grad.numpy(), grad, rtol=1e-12, atol=1e-15)
    m = mask.numpy()
    if weight_mode == "ppo":
        np.testing.assert_allclose(float(loss.detach()), -(w * m).sum() / m.sum(), rtol=1e-12)


def test_wide_epsilon_never_clips_and_ratio_one_equals_reinforce():
    logp, old, _, adv, mask = _loss_inputs(seed=3)
    a = adv[:, None].expand_as(logp)
    assert not rl.clipped(torch.exp(logp - old), a, 10.0, 10.0).any()
    leaf = logp.clone().requires_grad_(True)
    rl.surrogate_loss(leaf, old, adv, mask, ratio_mode="one").backward()
    m = mask.double()
    np.testing.assert_allclose(leaf.grad.numpy(), (-(a * m) / m.sum()).numpy(), rtol=1e-12)


def test_shadow_ratio_requires_shadow_logp():
    logp, old, _, adv, mask = _loss_inputs()
    with pytest.raises(ValueError, match="shadow_logp"):
        rl.surrogate_loss(logp, old, adv, mask, ratio_mode="shadow")
    with pytest.raises(ValueError, match="valid choices: actual, one, shadow"):
        rl.surrogate_loss(logp, old, adv, mask, ratio_mode="bf16")


# --------------------------------------------------------------------------- gradients


def _per_token_scores(policy, ro, precision):
    """s_t = d log pi(a_t)/dW, one autograd call per token (float64 rows)."""
    logp = rl.sequence_logprobs(policy, ro, precision)
    rows = []
    for b, t in ro.mask.nonzero().tolist():
        g = torch.autograd.grad(logp[b, t], list(policy.parameters()), retain_graph=True,
                                allow_unused=True)
        rows.append(torch.cat([(torch.zeros_like(p) if x is None else x).reshape(-1).double()
                               for x, p in zip(g, policy.parameters(), strict=True)]))
    return torch.stack(rows)


def _decomposition_inputs():
    policy = _policy()
    ro = _rollout(policy, "bf16", group_size=4)
    adv = rl.group_advantages(ro.rewards, ro.group_size)
    g = torch.Generator().manual_seed(7)
    alpha = torch.randn(ro.tokens.shape, generator=g) * 0.1
    beta = torch.randn(ro.tokens.shape, generator=g) * 0.15
    return policy, ro, adv, alpha, beta


def test_four_passes_equal_weighted_sums_of_per_token_scores():
    policy, ro, adv, alpha, beta = _decomposition_inputs()
    dec = rl.four_pass_gradients(policy, ro, adv, alpha, beta, low="fp32", full="fp32")
    s = _per_token_scores(policy, ro, "fp32")
    m = ro.mask
    a = adv[:, None].expand_as(alpha)[m].double()
    n = int(m.sum())
    clean = -(a * torch.exp(alpha[m].double())) @ s / n
    actual = -(a * torch.exp((alpha + beta)[m].double())) @ s / n
    ratio_term = -(a * torch.exp(alpha[m].double()) * torch.expm1(beta[m].double())) @ s / n
    scale = float(clean.norm())
    for got, want in [(dec.clean_low, clean), (dec.actual_full, actual), (dec.d_ratio, ratio_term)]:
        assert float((got - want).norm()) <= 1e-5 * scale


def test_four_passes_recombine_exactly():
    policy, ro, adv, alpha, beta = _decomposition_inputs()
    dec = rl.four_pass_gradients(policy, ro, adv, alpha, beta, low="bf16", full="fp32")
    recombined = dec.clean_low + dec.d_ratio + dec.d_score + dec.interaction
    # Float64 additions of float32/bf16-valued vectors: exact up to float64 rounding.
    assert float((recombined - dec.actual_full).abs().max()) <= 1e-15 * float(
        dec.actual_full.abs().max())
    # With beta = 0 the ratio passes coincide bit for bit; with low == full the score passes do.
    same = rl.four_pass_gradients(policy, ro, adv, alpha, torch.zeros_like(beta), "bf16", "fp32")
    assert torch.equal(same.d_ratio, torch.zeros_like(same.d_ratio))
    matched = rl.four_pass_gradients(policy, ro, adv, alpha, beta, "bf16", "bf16")
    assert torch.equal(matched.d_score, torch.zeros_like(matched.d_score))
    assert float(dec.d_score.norm()) > 0


def test_gradient_report_is_trivial_when_matched():
    policy = _policy()
    ro = _rollout(policy, "bf16")
    rep = rl.gradient_report(policy, ro, rl.RunConfig(trainer="bf16", engine="bf16"))
    assert rep["ratio_error"] == 0.0 and rep["score_error"] == 0.0
    assert rep["cos_clipped"] == pytest.approx(1.0, abs=1e-12)
    mismatched = rl.gradient_report(policy, ro, rl.RunConfig(trainer="fp32", engine="bf16"))
    assert mismatched["ratio_error"] > 0 and mismatched["score_error"] > 0


# --------------------------------------------------------------------------- engine


def _bf16_oracle(t: torch.Tensor) -> np.ndarray:
    return t.detach().float().numpy().astype(ml_dtypes.bfloat16).astype(np.float32)


def test_engine_weights_are_rounded_copies_and_sync_counts_changes():
    policy = _policy()
    engine = rl.Engine(policy, "bf16")
    for p, q in zip([*policy.parameters(), policy.bias],
                    [*engine.model.parameters(), engine.model.bias], strict=True):
        assert q.dtype == torch.bfloat16
        np.testing.assert_array_equal(q.float().numpy(), _bf16_oracle(p))
    before = [_bf16_oracle(p) for p in policy.parameters()]
    g = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for p in policy.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 1e-3)
    after = [_bf16_oracle(p) for p in policy.parameters()]
    expect = sum(int((x != y).sum()) for x, y in zip(before, after, strict=True))
    total = sum(p.numel() for p in policy.parameters())
    assert engine.sync(policy) == expect / total
    assert 0 < expect < total
    assert engine.sync(policy) == 0.0


def test_generate_shapes_masks_rewards_and_logprobs():
    policy = _policy()
    ro = _rollout(policy, "bf16", group_size=5)
    b, t = ro.tokens.shape
    assert (b, t) == (SMALL.n_prompts * 5, SMALL.max_len)
    lengths = ro.mask.sum(1)
    assert torch.equal(ro.mask, torch.arange(t)[None, :] < lengths[:, None])  # a prefix
    last = ro.tokens.gather(1, (lengths - 1)[:, None]).squeeze(1)
    assert bool(((last == rl.EOS) | (lengths == t)).all())
    inside = ro.tokens.masked_fill(~ro.mask, -1)[:, :-1]
    assert not bool(((inside == rl.EOS) & ro.mask[:, 1:]).any())  # no EOS before the end
    assert torch.equal(ro.rewards, -lengths.float())
    with torch.no_grad():
        rescored = rl.sequence_logprobs(rl.Engine(policy, "bf16").model, ro, "bf16")
    assert torch.equal(rescored, ro.old_logp)


def test_sample_tokens_follows_the_distribution():
    p = torch.tensor([0.5, 0.25, 0.125, 0.0625, 0.0625])
    logp = torch.log(p).expand(40_000, -1)
    tok = rl.sample_tokens(logp, torch.Generator().manual_seed(0))
    freq = torch.bincount(tok, minlength=5).double() / tok.numel()
    se = torch.sqrt(p.double() * (1 - p.double()) / tok.numel())
    assert bool(((freq - p.double()).abs() < 5 * se).all())
    onehot = torch.log(torch.tensor([[0.0, 0.0, 1.0]])).expand(100, -1)
    assert bool((rl.sample_tokens(onehot, torch.Generator().manual_seed(1)) == 2).all())


def test_fp16_linear_matches_torch_within_one_ulp():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(300, 64, generator=g).half()
    w = (torch.randn(96, 64, generator=g) * 0.1).half()
    b = torch.randn(96, generator=g).half()
    ours = rl._linear(x, w, b).float()
    ref = F.linear(x, w, b).float()
    one_ulp = torch.from_numpy(np.spacing(np.abs(ref.numpy()).astype(np.float16)).astype(np.float32))
    assert bool(((ours - ref).abs() <= one_ulp).all())
    assert float((ours == ref).float().mean()) > 0.99


def test_vocabulary_logprobs_agree_with_sequence_logprobs():
    policy = _policy()
    ro = _rollout(policy, "bf16")
    full = rl.vocabulary_logprobs(policy, ro, "fp32")
    assert torch.allclose(full.exp().sum(-1), torch.ones(full.shape[0]), atol=1e-5)
    with torch.no_grad():
        seq = rl.sequence_logprobs(policy, ro, "fp32")[ro.mask]
    assert torch.equal(full.gather(1, ro.tokens[ro.mask][:, None]).squeeze(1), seq)


# --------------------------------------------------------------------------- training


def test_training_logs_beta_zero_when_matched_and_phantoms_when_not():
    run = rl.RunConfig(steps=3, lr=1e-4)
    cfg = rl.PolicyConfig(n_prompts=4, max_len=8)
    logs = rl.train_many(cfg, {"matched": rl.with_changes(run, trainer="bf16"),
                               "mismatch": run,
                               "wide": rl.with_changes(run, eps_low=10.0, eps_high=10.0),
                               "detached": rl.with_changes(run, weight_mode="detached")},
                         progress=False, record=(1,))
    m, mm = logs["matched"], logs["mismatch"]
    assert not m.beta_abs.any() and not m.phantom.any()
    assert (mm.beta_abs > 0).all() and mm.phantom.sum() > 0
    assert not logs["wide"].clip.any() and not logs["detached"].clip.any()
    np.testing.assert_allclose(mm.clip, mm.phantom + mm.legitimate, atol=1e-6)  # actual ratio
    assert m.changed[0] == 0.0  # step 0: the engine already holds fl(W_0)
    snap = mm.snapshots[1]
    assert snap["beta"].shape == snap["adv"].shape == snap["eos"].shape
    assert len(m.reward) == 3 and m.steps_to(0.0) is None


def test_bf16_master_keeps_bf16_weights():
    log = rl.train(rl.PolicyConfig(n_prompts=2, max_len=6), rl.RunConfig(
        master="bf16", trainer="bf16", steps=2), progress=False)
    assert all(p.dtype == torch.bfloat16 for p in log.policy.parameters())


def test_steps_to_uses_a_moving_average():
    log = rl.RunLog(rl.RunConfig(), *([np.array([-9.0, -9, -1, -1, -1, -1, -1])] * 12))
    assert log.steps_to(-2.0, window=3) == 4  # average of steps 2..4 is the first >= -2
    assert log.steps_to(-2.0, window=1) == 2


# --------------------------------------------------------------------------- validation


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"trainer": "fp8"}, "valid choices: fp32, bf16, fp16"),
    ({"master": "fp16"}, "valid choices: fp32, bf16"),
    ({"lr": 0.0}, "lr must be a finite number > 0"),
    ({"eps_high": -0.2}, "eps_high must be"),
    ({"steps": 0}, "steps must be an integer >= 1"),
    ({"staleness": 2}, "staleness must be 0"),
    ({"weight_mode": "centered"}, "valid choices: ppo, detached, detached_centered"),
])
def test_run_config_rejects_bad_values(kwargs, message):
    with pytest.raises(ValueError, match=message):
        rl.RunConfig(**kwargs)


def test_policy_config_and_forward_reject_bad_values():
    with pytest.raises(ValueError, match="depth must be an integer >= 1"):
        rl.PolicyConfig(depth=0)
    with pytest.raises(ValueError, match="logit_offset must be finite"):
        rl.PolicyConfig(logit_offset=float("inf"))
    policy = _policy()
    with pytest.raises(ValueError, match="valid choices: fp32, bf16, fp16"):
        policy(torch.tensor([0]), torch.tensor([0]), torch.tensor([0]), "float8")
    with pytest.raises(ValueError, match="group_size must be an integer >= 2"):
        rl.Engine(policy, "bf16").generate(1, torch.Generator())
