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

from precisionlab import emulate, rl
from precisionlab.rl.stats import fexp
from precisionlab.rounding import round_to

SMALL = rl.PolicyConfig(vocab=32, n_prompts=2, max_len=6, width=16, hidden=32, depth=3,
                        eos_logit=2.0)  # groups whose lengths differ: advantages non-zero


# The emulated arithmetic does not depend on the thread count (a test below checks that);
# one thread keeps the native-kernel comparisons in one order.
pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _policy(cfg=SMALL, seed=0):
    return rl.Policy(cfg, seed)


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


_BITS = {"fp32": (24, -126), "bf16": (8, -126), "fp16": (11, -14)}  # significant bits, emin


def _rne(v, precision):
    """v (float64) rounded to nearest, ties to even, with the format's significant bits: scale by 2^-q, rint, scale back."""
    p, emin = _BITS[precision]
    v = np.asarray(v, dtype=np.float64)
    out = np.zeros_like(v)
    nz = v != 0
    _, e = np.frexp(v[nz])
    q = np.maximum(e - 1, emin) - (p - 1)
    out[nz] = np.ldexp(np.rint(np.ldexp(v[nz], -q)), q)
    return out


def _oracle_logprobs(policy, prompt, prev, pos, precision):
    """log pi(. | rows) written out from the Policy docstring in NumPy, independently of rl and emulate.

    Weights and activations rounded with _rne; matrix products accumulate float32 products in
    float32, k = 0, 1, ... (numpy's elementwise float32 ops, no fused multiply-add); RMSNorm
    and the log-softmax in float64 with exact sums (math.fsum) and numpy's exp and log, then
    one rounding (to fp32 for the log-probabilities).
    """
    f32 = np.float32

    def fl(v):
        return _rne(v, precision)

    w = {n: fl(t.detach().double().numpy()) for n, t in policy.named_parameters()}
    prompt, prev, pos = (np.asarray(i) for i in (prompt, prev, pos))

    def rms(x):
        ss = np.array([math.fsum(r) for r in x * x])
        return fl(x * (1.0 / np.sqrt(ss / x.shape[1] + 1e-6))[:, None])

    def linear(a, wt, b=None):
        a32, w32 = a.astype(f32), wt.astype(f32)
        acc = np.zeros((a.shape[0], wt.shape[0]), f32)
        for k in range(a.shape[1]):
            acc = acc + a32[:, k:k + 1] * w32[None, :, k]
        if b is not None:
            acc = acc + b.astype(f32)
        return fl(acc.astype(np.float64))

    emb = (w["tok"][prev].astype(f32) + w["pos"][pos].astype(f32)) + w["prompt"][prompt].astype(f32)
    x = fl(emb.astype(np.float64))
    for layer in range(policy.cfg.depth):
        h = np.maximum(linear(rms(x), w["w_in"][layer]), 0.0)
        y = linear(h, w["w_out"][layer])
        x = fl((x.astype(f32) + y.astype(f32)).astype(np.float64))
    z = linear(rms(x), w["head"], fl(policy.bias.double().numpy()))
    z = z - z.max(1, keepdims=True)
    lse = np.log(np.array([math.fsum(r) for r in np.exp(z)]))
    return (z - lse[:, None]).astype(np.float32)


def _oracle_sequence(policy, ro, precision):
    prompt, prev, pos = (x[ro.mask] for x in ro.inputs(policy.bos))
    lp = _oracle_logprobs(policy, prompt, prev, pos, precision)
    return lp[np.arange(lp.shape[0]), ro.tokens[ro.mask].numpy()]


def test_forward_matches_an_independent_numpy_oracle():
    # Both implementations (emulate ops with autograd, the fused kernel without) against the
    # oracle; a float64 last bit (fsum vs pairwise sums, numpy's exp/log vs emulate's) may move
    # an fp32 log-probability by one ulp, so allow that and require most to be equal.
    policy = _policy()
    ro = _rollout(policy, "bf16", group_size=6)
    for precision in rl.PRECISIONS:
        want = _oracle_sequence(policy, ro, precision)
        train = rl.sequence_logprobs(policy, ro, precision)[ro.mask].detach().numpy()
        with torch.no_grad():
            fused = rl.sequence_logprobs(policy, ro, precision)[ro.mask].numpy()
        for got in (train, fused):
            np.testing.assert_allclose(got, want, rtol=0, atol=2e-6)
            assert np.mean(got == want) > 0.9


def test_beta_against_the_oracle_and_exactly_zero_when_matched():
    policy = _policy()
    ro = _rollout(policy, "bf16", group_size=6)
    ref = _oracle_sequence(policy, ro, "bf16")
    with torch.no_grad():
        shadow = rl.sequence_logprobs(policy, ro, "bf16")
    for precision in ("fp32", "fp16"):
        # beta = f_P - f_bf16: the package's trainer forward against the oracle's bf16 forward.
        train = rl.sequence_logprobs(policy, ro, precision)
        _, beta = rl.log_ratio_split(train.detach(), shadow, ro.old_logp)
        want = _oracle_sequence(policy, ro, precision).astype(np.float64) - ref
        np.testing.assert_allclose(beta[ro.mask].numpy(), want, rtol=0, atol=4e-6)
        assert np.abs(want).mean() > 0.05  # logits near 64: bf16 spacing 0.5, beta ~ ulp/4
    # Matched: the trainer's forward (emulate ops, autograd) and the shadow (fused kernel)
    # are two implementations of the oracle's arithmetic and agree bit for bit, so beta = 0.
    train = rl.sequence_logprobs(policy, ro, "bf16")
    alpha, beta = rl.log_ratio_split(train.detach(), shadow, ro.old_logp)
    assert torch.equal(beta, torch.zeros_like(beta))
    # On-policy, against the log-probabilities the engine recorded while sampling (its own
    # rounded copy of the weights, the kernel on growing batches): alpha = 0 bit for bit.
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


@pytest.mark.parametrize("precision", rl.PRECISIONS)
def test_fused_kernel_equals_emulate_ops_at_odd_sizes(precision):
    # Odd widths, hidden sizes and vocabularies: the pairwise sums' spare slot, every stage's
    # row length different from the others; a repeated state is computed once and copied.
    cfg = rl.PolicyConfig(vocab=37, n_prompts=2, max_len=4, width=15, hidden=33, depth=3)
    policy = _policy(cfg, 3)
    g = torch.Generator().manual_seed(7)
    rows = [torch.randint(0, k, (30,), generator=g) for k in (2, 38, 4)]
    rows = [torch.cat([r, r[:5]]) for r in rows]
    autograd_path = rl.policy_logprobs(policy, *rows, precision)
    with torch.no_grad():
        fused = rl.policy_logprobs(policy, *rows, precision)
    assert torch.equal(fused, autograd_path.detach())


@pytest.mark.parametrize("checkpoint", ["fp32", "bf16"])
def test_with_logit_offset_is_the_policy_built_with_that_offset(checkpoint):
    import dataclasses

    cfg = dataclasses.replace(SMALL, checkpoint=checkpoint)
    base = rl.Policy(cfg, 4)
    for offset in (0.0, 64.0, -3.5):
        got = base.with_logit_offset(offset)
        want = rl.Policy(dataclasses.replace(cfg, logit_offset=offset), 4)
        assert got.cfg == want.cfg and got is not base
        a, b = got.state_dict(), want.state_dict()
        assert list(a) == list(b) and all(torch.equal(a[k], b[k]) for k in a)
        assert all(p.requires_grad for p in got.parameters())
    assert float(base.bias[1]) == SMALL.logit_offset  # the original is unchanged


def test_logit_rounding_beta_is_the_emulated_log_softmax_at_the_token():
    policy = _policy()
    ro = _rollout(policy)
    with torch.no_grad():
        z = policy(*ro.token_inputs(policy.bos), "fp32")
        tok = ro.tokens[ro.mask][:, None]
        fp32 = rl.policy.emulated_precision("fp32")
        exact = emulate.log_softmax(z, fp32).gather(1, tok)
        rounded = emulate.log_softmax(round_to(z, "bfloat16"), fp32).gather(1, tok)
    got = rl.logit_rounding_beta(policy, ro, "bfloat16")
    assert torch.equal(got, (exact - rounded).squeeze(1)) and bool((got != 0).any())


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


def _box_muller(generator: torch.Generator, n: int) -> list[float]:
    """n N(0, 1) draws written from the formula: sqrt(-2 ln(1 - u1)) cos(2 pi u2), math.log and math.cos,
    from the next 2n float64 uniforms of `generator` (u1 the first n, u2 the next n)."""
    u = torch.rand(2, n, generator=generator, dtype=torch.float64).tolist()
    return [math.sqrt(-2.0 * math.log(1.0 - a)) * math.cos(2.0 * math.pi * b)
            for a, b in zip(u[0], u[1], strict=True)]


def test_initial_weights_are_box_muller_draws_from_the_seed():
    # Every parameter, in the order they are made, takes the next Box-Muller draws of one
    # stream seeded by `seed`, times its init std, rounded to float32. math.log/math.cos vs
    # the package's log64/cos2pi64 may differ in a float64 last bit: allow one float32 ulp.
    cfg = SMALL
    d, m, n = cfg.width, cfg.hidden, cfg.depth
    stds = {"tok": 1.0, "pos": 1.0, "prompt": 1.0, "w_in": (2 / d) ** 0.5,
            "w_out": (m * n) ** -0.5, "head": cfg.logit_spread * d**-0.5}
    for seed in (0, 5):
        policy = _policy(cfg, seed)
        g = torch.Generator().manual_seed(seed)
        for name, p in policy.named_parameters():
            want = np.float32(np.array(_box_muller(g, p.numel())) * stds[name])
            assert p.dtype == torch.float32
            np.testing.assert_allclose(p.detach().numpy().reshape(-1), want, rtol=2**-23, atol=0)
    assert torch.equal(_policy().tok, _policy().tok) and not torch.equal(_policy().tok,
                                                                         _policy(seed=1).tok)


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


def _exp_onto(target: float, dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """(x_on, x_out): fexp(x_on) is exactly the bound as the comparison sees it (the Python
    float target, or its float32 value for float32 ratios); x_out is the first x beyond x_on,
    away from 0, whose exp lies outside the bound."""
    bound = torch.tensor(target, dtype=dtype)
    x = torch.tensor(math.log(target), dtype=dtype)
    outward = 1.0 if target > 1 else -1.0
    for _ in range(200):
        y = fexp(x)
        if y == bound:
            break
        x = torch.nextafter(x, x + (1.0 if y < bound else -1.0))
    else:
        raise AssertionError(f"no x with exp(x) == {target} in {dtype}")
    x_out = x
    while fexp(x_out) == bound:
        x_out = torch.nextafter(x_out, x_out + outward)
    return x, x_out


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize(("lo", "hi"), [(0.2, 0.2), (0.1, 0.28)])
def test_ratio_exactly_on_the_clip_bound_is_not_clipped(dtype, lo, hi):
    # The source's case analysis: A > 0 keeps its gradient while r <= 1 + eps_high, A < 0
    # while r >= 1 - eps_low. A ratio exactly on the bound, built from alpha and beta, is
    # therefore inside; one step beyond is outside. So, e.g., beta that puts an unmoved token
    # exactly on the bound is no phantom clip, and one beyond it is.
    rows = []
    for target, a in ((1 + hi, 1.0), (1 - lo, -1.0)):
        on, out = _exp_onto(target, dtype)
        zero = torch.zeros((), dtype=dtype)
        rows += [
            (zero, on, a, "unclipped"), (zero, out, a, "phantom"),
            (on, zero, a, "unclipped"), (out, zero, a, "legitimate"),
            (out, on - out, a, "released"),  # x_out + (x_on - x_out) == x_on: exact (Sterbenz)
            (on, out - on, a, "phantom"),
        ]
    alpha = torch.stack([r[0] for r in rows])
    beta = torch.stack([r[1] for r in rows])
    adv = torch.tensor([r[2] for r in rows], dtype=dtype)
    assert torch.equal(alpha + beta, torch.stack([r[0] + r[1] for r in rows]))
    got = rl.classify_clipping(alpha, beta, adv, lo, hi)
    assert [rl.CLIP_CLASSES[i] for i in got.tolist()] == [r[3] for r in rows]
    # On the bound the surrogate's gradient flows in full: dL/dlogp = -A r / N.
    on_hi, _ = _exp_onto(1 + hi, dtype)
    on_lo, _ = _exp_onto(1 - lo, dtype)
    logp = torch.stack([on_hi, on_lo]).reshape(1, 2).requires_grad_(True)
    adv2 = torch.tensor([[1.0, -1.0]], dtype=dtype)
    rl.surrogate_loss(logp, torch.zeros_like(logp), adv2, torch.ones(1, 2, dtype=torch.bool),
                      lo, hi).backward()
    r = fexp(logp.detach())
    assert torch.equal(logp.grad, -(adv2 * r) / 2)


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


def _rel(got, want):
    return float((got - want).norm()) / float(want.norm())


def test_four_passes_in_bf16_against_per_token_scores():
    # The oracle: per-token score vectors (one backward per token) weighted and summed in
    # float64. In fp32 it equals the batched passes to float32 rounding. A bf16 backward rounds
    # every intermediate gradient to 8 bits, per token in the oracle and per batch in the
    # package, so there they agree to a few bf16 roundings: ~2^-8 of the gradient, which is
    # ~4% of d_ratio (about a tenth of the gradient here) and ~7% of d_score (about 5%).
    policy, ro, adv, alpha, beta = _decomposition_inputs()
    dec = rl.four_pass_gradients(policy, ro, adv, alpha, beta, low="bf16", full="fp32")
    m = ro.mask
    a = adv[:, None].expand_as(alpha)[m].double()
    n = int(m.sum())
    s_low, s_full = _per_token_scores(policy, ro, "bf16"), _per_token_scores(policy, ro, "fp32")
    clean_c = a * torch.exp(alpha[m].double())
    actual_c = a * torch.exp((alpha + beta)[m].double())
    want = {"clean_full": -clean_c @ s_full / n, "actual_full": -actual_c @ s_full / n,
            "clean_low": -clean_c @ s_low / n, "actual_low": -actual_c @ s_low / n}
    for name in ("clean_full", "actual_full"):
        assert _rel(getattr(dec, name), want[name]) < 1e-5
    for name in ("clean_low", "actual_low"):
        assert _rel(getattr(dec, name), want[name]) < 2.0**-7
    d_ratio = -(clean_c * torch.expm1(beta[m].double())) @ s_low / n
    d_score = want["clean_full"] - want["clean_low"]
    assert 0.05 < float(d_ratio.norm()) / float(want["clean_low"].norm()) < 0.5  # beta std 0.15
    assert _rel(dec.d_ratio, d_ratio) < 0.1
    assert _rel(dec.d_score, d_score) < 0.15
    assert 0 < float(d_score.norm()) < 0.1 * float(want["clean_low"].norm())


def test_gradient_report_against_an_oracle():
    # Every quantity of the report recomputed from the oracle's forward (alpha, beta) and
    # per-token scores: the clipped loss's gradient is sum_t -A_t r_t [not dead] s_t / N.
    policy = _policy()
    ro = _rollout(policy, "bf16", group_size=4)
    run = rl.RunConfig(trainer="fp32", engine="bf16")
    rep = rl.gradient_report(policy, ro, run)
    m = ro.mask
    n = int(m.sum())
    adv = rl.group_advantages(ro.rewards, ro.group_size)
    a = adv[:, None].expand_as(ro.old_logp)[m].double()
    low = torch.from_numpy(_oracle_sequence(policy, ro, "bf16")).double()
    full = torch.from_numpy(_oracle_sequence(policy, ro, "fp32")).double()
    alpha, beta = low - ro.old_logp[m].double(), full - low
    assert not alpha.any()  # on-policy
    s_low, s_full = _per_token_scores(policy, ro, "bf16"), _per_token_scores(policy, ro, "fp32")

    def cos(u, v):
        return float(u @ v) / float(u.norm() * v.norm())

    clean_c, actual_c = a * torch.exp(alpha), a * torch.exp(alpha + beta)
    g_clean = -clean_c @ s_low / n
    ratio_error = float(((clean_c * torch.expm1(beta)) @ s_low).norm()) / float(
        (clean_c @ s_low).norm())
    r = torch.exp(alpha + beta)
    live = ~(((a > 0) & (r > 1.2)) | ((a < 0) & (r < 0.8)))
    used = -(a * r * live) @ s_full / n
    reinforce = -a @ s_low / n
    assert (~live).any() and live.any()  # the batch has dead zones and live tokens
    assert rep["ratio_error"] == pytest.approx(ratio_error, rel=0.1)
    assert rep["cos_clean_actual"] == pytest.approx(cos(g_clean, -actual_c @ s_full / n), abs=1e-3)
    assert rep["cos_reinforce"] == pytest.approx(cos(reinforce, used), abs=5e-3)
    assert rep["cos_cross_entropy"] == pytest.approx(
        cos(s_low.sum(0), s_full.sum(0)), abs=1e-3)
    assert rep["cos_reinforce"] < 0.999  # the dead zones turn the update
    # Matched precisions: beta = 0 on every token (checked against the oracle above), so the
    # ratio and score terms vanish and the clipped loss's gradient is the engine's own.
    matched = rl.gradient_report(policy, ro, rl.RunConfig(trainer="bf16", engine="bf16"))
    assert matched["ratio_error"] == 0.0 and matched["score_error"] == 0.0
    assert matched["cos_clipped"] == pytest.approx(1.0, abs=1e-12)


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
    # The per-step statistics against NumPy on the recorded tokens of step 1.
    b, a = snap["beta"].astype(np.float64), snap["adv"].astype(np.float64)
    assert mm.beta_beyond[1] == np.mean(np.abs(b) > 0.2)
    assert mm.beta_adv_corr[1] == pytest.approx(np.corrcoef(b, a)[0, 1], abs=1e-12)
    assert mm.beta_std[1] == pytest.approx(np.std(b, ddof=1), rel=1e-12)
    assert np.isnan(m.beta_adv_corr).all()  # beta = 0: no correlation to speak of
    np.testing.assert_array_equal(m.snr(), np.full(3, np.inf))
    np.testing.assert_allclose(mm.snr(), mm.alpha_abs / mm.beta_abs, rtol=0)
    assert len(m.reward) == 3 and m.steps_to(0.0) is None


def test_bf16_master_keeps_bf16_weights():
    log = rl.train(rl.PolicyConfig(n_prompts=2, max_len=6), rl.RunConfig(
        master="bf16", trainer="bf16", steps=2), progress=False)
    for p in log.policy.parameters():
        np.testing.assert_array_equal(p.detach().numpy(), _bf16_oracle(p))
    native = rl.train(rl.PolicyConfig(n_prompts=2, max_len=6), rl.RunConfig(
        master="bf16", trainer="bf16", steps=2, backend="native"), progress=False)
    assert all(p.dtype == torch.bfloat16 for p in native.policy.parameters())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_native_adam_is_torch_optim_adam_bit_for_bit(dtype):
    # The native back end steps with torch's adam function instead of building the class (which
    # imports torch._dynamo): the same weights, moments and step counts, at every step, also
    # when a weight has no gradient at some step.
    from precisionlab.rl.native_adam import TorchAdam

    g = torch.Generator().manual_seed(5)
    start = [torch.randn(shape, generator=g).to(dtype) for shape in [(7, 3), (5,), (2, 2)]]
    ours = [torch.nn.Parameter(t.clone()) for t in start]
    theirs = [torch.nn.Parameter(t.clone()) for t in start]
    opt_ours, opt_theirs = TorchAdam(ours, lr=3e-3), torch.optim.Adam(theirs, lr=3e-3,
                                                                       foreach=False)
    for step in range(6):
        for k, (a, b) in enumerate(zip(ours, theirs, strict=True)):
            grad = None if (step, k) in {(0, 2), (3, 1)} else torch.randn(
                a.shape, generator=g).to(dtype)
            a.grad, b.grad = grad, None if grad is None else grad.clone()
        opt_ours.step()
        opt_theirs.step()
        for k, (a, b) in enumerate(zip(ours, theirs, strict=True)):
            assert a.dtype == dtype and torch.equal(a, b), (step, k)
            if b in opt_theirs.state:
                st = opt_theirs.state[b]
                assert torch.equal(opt_ours.exp_avgs[k], st["exp_avg"])
                assert torch.equal(opt_ours.exp_avg_sqs[k], st["exp_avg_sq"])
                assert torch.equal(opt_ours.steps[k], st["step"])
        opt_ours.zero_grad(set_to_none=True)
        assert all(p.grad is None for p in ours)
    with pytest.raises(ValueError, match="set_to_none"):
        opt_ours.zero_grad(set_to_none=False)


@pytest.mark.parametrize("dtype, lr", [(torch.float32, 1.0), (torch.bfloat16, 1.5e-4),
                                       (torch.float16, 0.1), (torch.float64, 3.0)])
def test_native_adam_is_torch_optim_adam_with_its_cpu_defaults(dtype, lr):
    # torch.optim.Adam(params, lr) as built (foreach=None: single-tensor on CPU), other rates
    # and dtypes, gradients over many binades (float16 steps overflow: NaN bits compared too).
    from precisionlab.rl.native_adam import TorchAdam

    def bits(t):
        return t.dtype, t.detach().contiguous().view(-1).view(torch.uint8).numpy().tobytes()

    g = torch.Generator().manual_seed(11)
    start = [torch.randn(shape, generator=g).to(dtype) for shape in [(4, 5), (), (7, 1)]]
    start[2] = start[2].t()  # a non-contiguous weight
    ours = [torch.nn.Parameter(t.clone()) for t in start]
    theirs = [torch.nn.Parameter(t.clone()) for t in start]
    opt_ours, opt_theirs = TorchAdam(ours, lr=lr), torch.optim.Adam(theirs, lr=lr)
    for step in range(8):
        for a, b in zip(ours, theirs, strict=True):
            scale = 10.0 ** int(torch.randint(-30, 4, (), generator=g))
            a.grad = (torch.randn(a.shape, generator=g) * scale).to(dtype)
            b.grad = a.grad.clone()
        opt_ours.step()
        opt_theirs.step()
        assert all(bits(a) == bits(b) for a, b in zip(ours, theirs, strict=True)), step


def test_native_adam_rejects_what_torch_optim_adam_would_and_options_it_lacks():
    from precisionlab.rl.native_adam import TorchAdam

    w = torch.nn.Parameter(torch.ones(2))
    for lr in (-1e-3, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="lr must be"):
            TorchAdam([w], lr=lr)
    with pytest.raises(TypeError, match="parameter groups"):
        TorchAdam([{"params": [w]}], lr=1e-3)
    with pytest.raises(ValueError, match="non-leaf"):
        TorchAdam([w * 2], lr=1e-3)
    for option in ("betas", "eps", "weight_decay", "amsgrad", "foreach", "maximize"):
        with pytest.raises(TypeError, match=option):
            TorchAdam([w], lr=1e-3, **{option: 0})


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


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.floats(-1e3, 1e3), st.floats(-1e3, 1e3)), min_size=2, max_size=40))
def test_portable_correlation_matches_fsum(pairs):
    x, y = (np.array(v, dtype=np.float64) for v in zip(*pairs, strict=True))
    mx, my = math.fsum(x) / len(x), math.fsum(y) / len(y)
    sxy = math.fsum((x - mx) * (y - my))
    sxx, syy = math.fsum((x - mx) ** 2), math.fsum((y - my) ** 2)
    got = rl.fcorr(torch.from_numpy(x), torch.from_numpy(y))
    if sxx * syy > 1e-12 * (1 + float(np.abs(x).max() * np.abs(y).max())) ** 2:
        assert got == pytest.approx(sxy / math.sqrt(sxx * syy), abs=1e-9)
    with pytest.raises(ValueError, match="same number"):
        rl.fcorr(x, y[:-1])


def test_correlation_of_a_constant_is_nan():
    assert math.isnan(rl.fcorr(torch.zeros(5), torch.arange(5.0)))


def test_checkpoint_puts_initial_weights_on_the_grid():
    fp32 = _policy(SMALL)
    bf16 = _policy(rl.PolicyConfig(**{**SMALL.__dict__, "checkpoint": "bf16"}))
    for p, q in zip(fp32.parameters(), bf16.parameters(), strict=True):
        np.testing.assert_array_equal(q.detach().numpy(), _bf16_oracle(p))  # same draws, rounded
    with pytest.raises(ValueError, match="valid choices: fp32, bf16, fp16"):
        rl.PolicyConfig(checkpoint="fp8")


def test_beta_by_band_against_the_oracle():
    policy = _policy()
    ro = _rollout(policy, "bf16")
    bands = [(-2.0, 0.0), (-4.0, -2.0), (-100.0, -4.0)]
    got = rl.beta_by_band(policy, ro, bands)
    prompt, prev, pos = (x[ro.mask] for x in ro.inputs(policy.bos))
    ref = _oracle_logprobs(policy, prompt, prev, pos, "bf16")
    mag = np.abs(_oracle_logprobs(policy, prompt, prev, pos, "fp32") - ref)
    for (lo, hi), (n, med) in zip(bands, got, strict=True):
        sel = np.sort(mag[(ref > lo) & (ref <= hi)])
        assert n == sel.size > 0
        assert med == pytest.approx(sel[(n - 1) // 2], abs=4e-6)  # the lower median, as torch's


def test_comparison_table_rows_and_errors():
    table = rl.comparison_table({"first_sync": ("43.1%", "no", "1.0%", "yes")})
    assert list(table.headers) == list(rl.COMPARISON_HEADERS)
    fig = rl.SOURCE["first_sync"]
    assert list(table.rows[0]) == [fig.finding, fig.value, fig.section, "43.1%", "no", "1.0%",
                                   "yes"]
    with pytest.raises(ValueError, match="unknown source finding 'beta_mean'"):
        rl.comparison_table({"beta_mean": ("a", "b", "c", "d")})
    with pytest.raises(ValueError, match="needs 4 cells"):
        rl.comparison_table({"first_sync": ("a", "b")})


@pytest.mark.parametrize(("book", "source", "direction", "expect"), [
    (0.15, 0.18, False, "yes"), (0.09, 0.18, False, "yes"), (0.36, 0.18, False, "yes"),
    (0.089, 0.18, False, "no"), (0.37, 0.18, True, "partly"), (-0.3, -0.58, False, "yes"),
    (0.3, -0.58, True, "partly"), (0.3, (0.27, 0.45), False, "yes"),
    (0.9, (0.27, 0.45), False, "yes"), (0.91, (0.27, 0.45), False, "no"),
    (float("inf"), 5.5, True, "partly"), (float("nan"), 5.5, False, "no"),
])
def test_reproduces_uses_a_factor_of_two(book, source, direction, expect):
    assert rl.reproduces(book, source, direction) == expect


def test_reproduces_rejects_a_zero_or_mixed_source():
    with pytest.raises(ValueError, match="source must be"):
        rl.reproduces(1.0, (-1.0, 1.0))


def test_steps_to_uses_a_moving_average():
    log = rl.RunLog(rl.RunConfig(), *([np.array([-9.0, -9, -1, -1, -1, -1, -1])]
                                      * len(rl.STEP_FIELDS)))
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
    with pytest.raises(TypeError, match="seed must be an integer"):
        rl.Policy(SMALL, torch.Generator())
    with pytest.raises(ValueError, match="group_size must be an integer >= 2"):
        rl.Engine(policy, "bf16").generate(1, torch.Generator())
