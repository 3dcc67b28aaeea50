"""Tests for precisionlab.rl against independent computations.

Oracles: NumPy and plain-Python arithmetic written from the formulas (group advantages, the
PPO case analysis, closed-form gradients of the surrogate with respect to log-probabilities),
per-token score vectors from one autograd call per token (the four passes must equal the
coefficient-weighted sums of them), ml_dtypes casts (the engine's weights and the count of
changed weights), `round_to` (the fused kernel's rounding), the autograd path built from
`precisionlab.emulate` ops (the fused kernel must give the same bits), math.fsum (the
portable statistics), torch's own kernels (the native back end, loosely) and sampling
frequencies.
"""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from precisionlab import rl
from precisionlab.rounding import round_to

SMALL = rl.PolicyConfig(vocab=32, n_prompts=2, max_len=6, width=16, hidden=32, depth=3,
                        eos_logit=2.0)  # groups whose lengths differ: advantages non-zero


@pytest.fixture(autouse=True)
def _one_thread():
    # The emulated arithmetic does not depend on the thread count (a test below checks that);
    # one thread keeps the native-kernel comparisons in one order.
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
    # Two implementations: the trainer's forward runs the emulate ops with autograd, the
    # shadow forward and the engine the fused numba kernel; matched, they agree bit for bit.
    policy = _policy()
    for precision in ("bf16", "fp16", "fp32"):
        ro = _rollout(policy, precision)
        train = rl.sequence_logprobs(policy, ro, precision)
        assert train.requires_grad
        with torch.no_grad():
            shadow = rl.sequence_logprobs(policy, ro, precision)
        alpha, beta = rl.log_ratio_split(train.detach(), shadow, ro.old_logp)
        assert torch.equal(beta, torch.zeros_like(beta))
        # Every row is computed on its own, so batching does not change a bit either.
        assert torch.equal(alpha[ro.mask], torch.zeros(int(ro.mask.sum())))


@pytest.mark.parametrize("precision", rl.PRECISIONS)
@pytest.mark.parametrize("seed", [0, 1])
def test_fused_kernel_equals_emulate_ops(precision, seed):
    cfg = rl.PolicyConfig(vocab=40, n_prompts=3, max_len=5, width=24, hidden=40, depth=2,
                          logit_offset=10.0 * seed)
    policy = _policy(cfg, seed)
    g = torch.Generator().manual_seed(seed + 10)
    n = 50
    rows = (torch.randint(0, 3, (n,), generator=g), torch.randint(0, 41, (n,), generator=g),
            torch.randint(0, 5, (n,), generator=g))
    autograd_path = rl.policy_logprobs(policy, *rows, precision)  # grad enabled: emulate ops
    with torch.no_grad():
        fused = rl.policy_logprobs(policy, *rows, precision)
    assert torch.equal(fused, autograd_path.detach())


def test_native_backend_runs_torch_kernels_close_to_emulated():
    policy = _policy()
    ro = _rollout(policy, "bf16")
    for precision in rl.PRECISIONS:
        with torch.no_grad():
            emu = rl.sequence_logprobs(policy, ro, precision)[ro.mask]
            nat = rl.sequence_logprobs(policy, ro, precision, backend="native")[ro.mask]
        assert torch.isfinite(nat).all()
        # Another accumulation order, the same arithmetic up to rounding: close, not equal.
        assert float((emu - nat).abs().mean()) < 0.1


@pytest.mark.filterwarnings("ignore:overflow encountered in cast")
@settings(max_examples=300, deadline=None)
@given(st.floats(allow_nan=False, width=64), st.sampled_from(["fp32", "bf16", "fp16"]))
def test_kernel_rounding_matches_round_to(x, precision):
    p, emin, vmax = rl._FMT_CODE[precision]
    fmt = rl._FMT[precision]
    ties = [1 + 2.0**-p, 1 + 3 * 2.0**-p, -(1 + 2.0**-p), np.nextafter(1 + 2.0**-p, 2.0)]
    for v in (x, x * 2.0**-140, x * 2.0**-20, x * 2.0**100, *ties):
        buf = np.array([v, 0.0])
        rl._rnd_vec(buf, 1, p, emin, vmax)
        expect = round_to(np.array([v]), fmt)[0]
        assert buf[0] == expect or (np.isnan(buf[0]) and np.isnan(expect)), (v, precision)


def test_kernel_exp_and_log_match_emulate():
    x = torch.cat([torch.linspace(-750, 720, 4001, dtype=torch.float64),
                   torch.tensor([0.0, -0.0, 1e-300, -1e-300, float("inf"), -float("inf")],
                                dtype=torch.float64)])
    got = np.array([rl._exp64(float(v), rl._EXP_C) for v in x])
    np.testing.assert_array_equal(got, rl.E.exp64(x).numpy())
    y = torch.logspace(-300, 300, 3001, dtype=torch.float64)
    got = np.array([rl._log64(float(v), rl._LOG_C) for v in y])
    np.testing.assert_array_equal(got, rl.E.log64(y).numpy())


def test_row_gradient_sums_repeated_rows():
    g = torch.Generator().manual_seed(4)
    table = torch.randn(7, 5, generator=g, requires_grad=True)
    idx = torch.tensor([3, 1, 3, 3, 0, 6, 1])
    up = torch.randn(7, 5, generator=g)
    (rl._rows(table, idx) * up).sum().backward()
    expect = np.zeros((7, 5))
    for i, r in enumerate(idx.tolist()):
        expect[r] += up[i].double().numpy()
    np.testing.assert_allclose(table.grad.numpy(), expect, rtol=1e-6, atol=1e-7)


def test_initial_weights_are_standard_normal_and_reproducible():
    z = rl._normal((40_000,), torch.Generator().manual_seed(0)).double()
    assert abs(float(z.mean())) < 0.02 and abs(float(z.std()) - 1) < 0.02
    # Normal quantiles: P(z < -1.96) = P(z > 1.96) = 0.025, each with a standard error 0.0008.
    assert abs(float((z < -1.96).double().mean()) - 0.025) < 0.004
    assert abs(float((z > 1.96).double().mean()) - 0.025) < 0.004
    again = rl._normal((40_000,), torch.Generator().manual_seed(0)).double()
    assert torch.equal(z, again)
    assert rl._normal((3, 5), torch.Generator().manual_seed(1), std=0.5).shape == (3, 5)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.floats(-1e6, 1e6, allow_nan=False), min_size=2, max_size=60))
def test_portable_statistics_match_fsum(values):
    x = torch.tensor(values, dtype=torch.float64)
    mean = math.fsum(values) / len(values)
    assert math.isclose(rl.fmean(x), mean, rel_tol=1e-12, abs_tol=1e-9)
    var = math.fsum((v - mean) ** 2 for v in values) / (len(values) - 1)
    assert math.isclose(rl.fstd(x), math.sqrt(var), rel_tol=1e-9, abs_tol=1e-6)


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


def test_clip_bounds_are_strict():
    # A ratio exactly on 1 + eps_high (A > 0) or 1 - eps_low (A < 0) keeps its gradient; the
    # next float beyond it is clipped. Both bounds as fp32 values, as the loss compares them.
    for lo, hi in [(0.2, 0.2), (0.1, 0.28)]:
        up = torch.tensor(1 + hi, dtype=torch.float64)
        down = torch.tensor(1 - lo, dtype=torch.float64)
        r = torch.stack([up, torch.nextafter(up, up + 1), down, torch.nextafter(down, down - 1)])
        a = torch.tensor([1.0, 1.0, -1.0, -1.0], dtype=torch.float64)
        assert rl.clipped(r, a, lo, hi).tolist() == [False, True, False, True]


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
    # The backward's precision changes the gradient, but only slightly; beta in the ratio
    # changes it by about the size of beta (std 0.15 here).
    clean = float(dec.clean_low.norm())
    assert 0 < float(dec.d_score.norm()) < 0.1 * clean
    assert 0.05 * clean < float(dec.d_ratio.norm()) < 0.5 * clean


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
        assert q.dtype == torch.float32  # bf16 values, stored in float32 (emulate's convention)
        np.testing.assert_array_equal(q.numpy(), _bf16_oracle(p))
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
    # The engine sampled with the fused kernel; rescoring with the emulate ops (autograd
    # enabled) must give the recorded log-probabilities bit for bit.
    assert torch.is_grad_enabled()
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
    for p in log.policy.parameters():
        np.testing.assert_array_equal(p.detach().numpy(), _bf16_oracle(p))
    native = rl.train(rl.PolicyConfig(n_prompts=2, max_len=6), rl.RunConfig(
        master="bf16", trainer="bf16", steps=2, backend="native"), progress=False)
    assert all(p.dtype == torch.bfloat16 for p in native.policy.parameters())


def test_training_is_the_same_at_any_thread_count():
    cfg = rl.PolicyConfig(n_prompts=3, max_len=8)
    run = rl.RunConfig(steps=4, lr=1e-3)
    logs = []
    for threads in (1, 2):
        torch.set_num_threads(threads)
        logs.append(rl.train(cfg, run, progress=False))
    for field in rl.STEP_FIELDS:
        np.testing.assert_array_equal(getattr(logs[0], field), getattr(logs[1], field))
    for p, q in zip(logs[0].policy.parameters(), logs[1].policy.parameters(), strict=True):
        assert torch.equal(p, q)


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
    ({"backend": "gpu"}, "valid choices: emulated, native"),
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
