"""Precision mismatch in RL fine-tuning: a toy policy trained with GRPO against a low-precision
rollout engine, the alpha/beta split of the PPO log-ratio, phantom clipping and its fixes.

The pieces, bottom up:

* `Policy` — a small autoregressive model over a vocabulary with an end-of-sequence token.
  Its one forward function runs in fp32, bf16 or fp16 with *explicit casts*: every weight is
  cast to the compute dtype where it is used and activations stay in that dtype, so the
  arithmetic is torch's own low-precision arithmetic. The same function serves the rollout
  engine (weights stored in the low format), the trainer (fp32 master weights; gradients flow
  back through the casts, as under autocast) and the shadow forward, so matched precisions
  give bit-identical log-probabilities by construction.
* `Engine` — a synced low-precision copy of the weights that samples every completion of
  every group together, token by token.
* the GRPO pieces — group-normalised advantages, the clipped surrogate with separate lower and
  upper epsilon, the alpha/beta decomposition, phantom-versus-legitimate clipping, the
  four-pass gradient decomposition — and the interventions: ratio forced to 1, ratio from the
  shadow forward, wide epsilon, detached weights, detached and centred weights.
* `train` / `train_many` — the closed loop (generate, sync, score, update) with a per-step log.

No global state: every random draw takes an explicit `torch.Generator`.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

import numpy as np
import torch
import torch.nn.functional as F

from .checks import check_choice as _check_choice
from .checks import check_positive as _check_positive
from .formats import get_format
from .rounding import round_to

__all__ = [
    "CLIP_CLASSES",
    "EOS",
    "MASTER_PRECISIONS",
    "PRECISIONS",
    "RATIO_MODES",
    "WEIGHT_MODES",
    "Engine",
    "GradientDecomposition",
    "Policy",
    "PolicyConfig",
    "Rollout",
    "RunConfig",
    "RunLog",
    "beta_by_offset",
    "beta_table",
    "classify_clipping",
    "clipped",
    "four_pass_gradients",
    "gradient_report",
    "group_advantages",
    "log_ratio_split",
    "logit_rounding_beta",
    "policy_gradient",
    "sample_tokens",
    "sequence_logprobs",
    "surrogate_loss",
    "token_weights",
    "train",
    "train_many",
    "vocabulary_logprobs",
    "with_changes",
]

PRECISIONS: tuple[str, ...] = ("fp32", "bf16", "fp16")
MASTER_PRECISIONS: tuple[str, ...] = ("fp32", "bf16")
_DTYPE = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
RATIO_MODES: tuple[str, ...] = ("actual", "one", "shadow")
WEIGHT_MODES: tuple[str, ...] = ("ppo", "detached", "detached_centered")
CLIP_CLASSES: tuple[str, ...] = ("unclipped", "phantom", "legitimate", "released")
EOS = 0  # token id of end-of-sequence


# --------------------------------------------------------------------------- the policy


@dataclass(frozen=True)
class PolicyConfig:
    """Shape of the toy policy and where its logits sit on the floating-point grid."""

    vocab: int = 256  # token 0 is EOS
    n_prompts: int = 8
    max_len: int = 16  # completions are cut here (reward -max_len)
    width: int = 64  # residual stream
    hidden: int = 128  # MLP hidden layer
    depth: int = 8  # residual MLP blocks
    logit_offset: float = 64.0  # common level of every logit: sets the bf16 spacing there
    logit_spread: float = 2.0  # std of the token-dependent part of the logits at init
    eos_logit: float = 4.0  # extra logit of EOS at init: sets how rarely the policy stops

    def __post_init__(self):
        for name in ("vocab", "n_prompts", "max_len", "width", "hidden", "depth"):
            v, low = getattr(self, name), 2 if name == "vocab" else 1
            if isinstance(v, bool) or not isinstance(v, int) or v < low:
                raise ValueError(f"{name} must be an integer >= {low}; got {name}={v!r}")
        _check_positive(self.logit_spread, "logit_spread")
        for name in ("logit_offset", "eos_logit"):
            if not np.isfinite(getattr(self, name)):
                raise ValueError(f"{name} must be finite; got {name}={getattr(self, name)!r}")


class Policy(torch.nn.Module):
    """pi(a | prompt p, previous token, position t) = softmax(z), z = W_head RMSNorm(x_L) + b.

    x_0 = E_tok[prev] + E_pos[t] + E_prompt[p]; x_{l+1} = x_l + W_out,l gelu(W_in,l RMSNorm(x_l)).
    The bias b is a fixed buffer, `logit_offset` for every token plus `eos_logit` for EOS. A
    common offset leaves the exact softmax unchanged but decides how coarse the bf16 grid is
    where the logits live.
    """

    def __init__(self, cfg: PolicyConfig, generator: torch.Generator):
        super().__init__()
        self.cfg = cfg
        d, m, n = cfg.width, cfg.hidden, cfg.depth

        def randn(*shape, std):
            return torch.nn.Parameter(torch.randn(*shape, generator=generator) * std)

        self.tok = randn(cfg.vocab + 1, d, std=1.0)  # row `vocab` is the begin-of-sequence token
        self.pos = randn(cfg.max_len, d, std=1.0)
        self.prompt = randn(cfg.n_prompts, d, std=1.0)
        self.w_in = randn(n, m, d, std=d**-0.5)
        # Each block adds O(1/depth) variance, so the stream stays O(1) at any depth.
        self.w_out = randn(n, d, m, std=(m * n) ** -0.5)
        self.head = randn(cfg.vocab, d, std=cfg.logit_spread * d**-0.5)
        bias = torch.full((cfg.vocab,), float(cfg.logit_offset))
        bias[EOS] += cfg.eos_logit
        self.register_buffer("bias", bias)

    @property
    def bos(self) -> int:
        """Token id of begin-of-sequence, the `previous token` at position 0 (= vocab)."""
        return self.cfg.vocab

    def forward(self, prompt, prev, pos, precision: str = "fp32") -> torch.Tensor:
        """Logits z (float32) for rows (prompt, prev, pos), computed in `precision` with explicit casts."""
        dt = _DTYPE[_check_choice(precision, "precision", PRECISIONS)]
        d = self.cfg.width
        # Index first, then cast: the same values as casting the tables, for less work.
        x = self.tok[prev].to(dt) + self.pos[pos].to(dt) + self.prompt[prompt].to(dt)
        w_in, w_out = self.w_in.to(dt), self.w_out.to(dt)
        for layer in range(self.cfg.depth):
            h = F.gelu(_linear(F.rms_norm(x, (d,)), w_in[layer]))
            x = x + _linear(h, w_out[layer])
        z = _linear(F.rms_norm(x, (d,)), self.head.to(dt), self.bias.to(dt))
        # The log-softmax runs in fp32, as inference engines and trainers do: the low
        # precision reaches the log-probabilities through the logits alone.
        return z.float()


def _linear(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None = None) -> torch.Tensor:
    """x w^T + b in x's dtype: exact products, fp32 accumulation, one rounding of the output."""
    if x.dtype == torch.float16:
        # That is the contract of an fp16 GEMM on a GPU. On CPUs without fp16 arithmetic,
        # torch's own fp16 matmul (same contract, another summation order) is an order of
        # magnitude slower (benchmarks/bench_rl.py), so the fp32 accumulation is spelled
        # out; bf16 and fp32 use torch's kernels directly.
        return F.linear(x.float(), w.float(), None if b is None else b.float()).to(x.dtype)
    return F.linear(x, w, b)


def _round_params(policy: Policy, precision: str):
    """fl(W) for every trainable parameter, in `precision`'s dtype (round to nearest even)."""
    fmt, dt = get_format(precision), _DTYPE[precision]
    return [round_to(p.detach().float(), fmt).to(dt) for p in policy.parameters()]


# --------------------------------------------------------------------------- rollouts


@dataclass
class Rollout:
    """A batch of completions: B = prompts x group size rows, T = max_len columns."""

    prompt: torch.Tensor  # (B,) prompt id
    tokens: torch.Tensor  # (B, T) sampled tokens (EOS-padded after the end)
    mask: torch.Tensor  # (B, T) True on completion tokens (the final EOS included)
    old_logp: torch.Tensor  # (B, T) the engine's log-probabilities of the sampled tokens
    group_size: int

    @property
    def lengths(self) -> torch.Tensor:
        """Completion lengths (B,): the number of masked tokens per row, EOS included."""
        return self.mask.sum(1)

    @property
    def rewards(self) -> torch.Tensor:
        """Reward = -(number of completion tokens, EOS included)."""
        return -self.lengths.to(torch.float32)

    def inputs(self, bos: int):
        """(prompt, prev, pos) index tensors of shape (B, T) for teacher-forced scoring."""
        b, t = self.tokens.shape
        prev = torch.cat([torch.full((b, 1), bos), self.tokens[:, :-1]], dim=1)
        pos = torch.arange(t).expand(b, t)
        return self.prompt[:, None].expand(b, t), prev, pos


class Engine:
    """The rollout engine: a copy of the policy rounded into `precision` at every sync."""

    def __init__(self, policy: Policy, precision: str = "bf16"):
        self.precision = _check_choice(precision, "engine precision", PRECISIONS)
        self.model = copy.deepcopy(policy).requires_grad_(False)
        # The fixed logit bias is not trained: rounded once, here.
        self.model.bias.data = round_to(policy.bias.float(), get_format(precision)).to(
            _DTYPE[precision])
        self._load(_round_params(policy, precision))

    def _load(self, values) -> None:
        for p, v in zip(self.model.parameters(), values, strict=True):
            p.data = v

    def sync(self, policy: Policy) -> float:
        """Load fl(W) into the engine; return the fraction of weights whose stored value changed."""
        new = _round_params(policy, self.precision)
        old = list(self.model.parameters())
        changed = sum(int((a != b.data).sum()) for a, b in zip(new, old, strict=True))
        total = sum(a.numel() for a in new)
        self._load(new)
        return changed / total

    @torch.no_grad()
    def generate(self, group_size: int, generator: torch.Generator) -> Rollout:
        """Sample `group_size` completions per prompt; all unfinished rows advance together, token by token."""
        if isinstance(group_size, bool) or not isinstance(group_size, int) or group_size < 2:
            raise ValueError(f"group_size must be an integer >= 2; got group_size={group_size!r}")
        cfg = self.model.cfg
        prompt = torch.arange(cfg.n_prompts).repeat_interleave(group_size)
        b, t_max = prompt.numel(), cfg.max_len
        tokens = torch.full((b, t_max), EOS, dtype=torch.long)
        old_logp = torch.zeros(b, t_max)
        mask = torch.zeros(b, t_max, dtype=torch.bool)
        prev = torch.full((b,), self.model.bos, dtype=torch.long)
        rows = torch.arange(b)  # the unfinished completions
        for t in range(t_max):
            pos = torch.full((rows.numel(),), t)
            logp = F.log_softmax(self.model(prompt[rows], prev[rows], pos, self.precision), -1)
            tok = sample_tokens(logp, generator)
            tokens[rows, t] = tok
            old_logp[rows, t] = logp.gather(1, tok[:, None]).squeeze(1)
            mask[rows, t] = True
            prev[rows] = tok
            rows = rows[tok != EOS]
            if rows.numel() == 0:
                break
        return Rollout(prompt, tokens, mask, old_logp, group_size)


def sample_tokens(logp: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """One token per row by inverse CDF: the first v with sum_{u<=v} p_u > U * sum_u p_u, U ~ U[0, 1)."""
    cdf = torch.cumsum(logp.exp(), dim=-1)
    u = torch.rand(logp.shape[0], 1, generator=generator) * cdf[:, -1:]
    return torch.searchsorted(cdf, u, right=True).clamp_(max=logp.shape[-1] - 1).squeeze(1)


def sequence_logprobs(policy: Policy, rollout: Rollout, precision: str) -> torch.Tensor:
    """log pi(a_t | s_t) of the rollout's tokens under `policy` in `precision`; (B, T), 0 off the mask."""
    # The policy is Markov in (prompt, previous token, position), so only completion tokens
    # need a forward: padding rows are never computed.
    prompt, prev, pos = (x[rollout.mask] for x in rollout.inputs(policy.bos))
    logp = F.log_softmax(policy(prompt, prev, pos, precision), -1)
    picked = logp.gather(-1, rollout.tokens[rollout.mask][:, None]).squeeze(-1)
    return torch.zeros(rollout.tokens.shape, dtype=picked.dtype).masked_scatter(rollout.mask,
                                                                                 picked)


@torch.no_grad()
def vocabulary_logprobs(policy: Policy, rollout: Rollout, precision: str) -> torch.Tensor:
    """log pi(v | s_t) for every token v of the vocabulary at the rollout's states: (N tokens, V)."""
    prompt, prev, pos = (x[rollout.mask] for x in rollout.inputs(policy.bos))
    return F.log_softmax(policy(prompt, prev, pos, precision), -1)


# --------------------------------------------------------------------------- GRPO algebra


def group_advantages(rewards: torch.Tensor, group_size: int, eps: float = 1e-4) -> torch.Tensor:
    """A_i = (R_i - mean_group R) / (std_group R + eps), sample std; rows grouped consecutively."""
    if rewards.ndim != 1 or group_size < 2 or rewards.numel() % group_size:
        raise ValueError(f"rewards must be 1-D with a multiple of group_size={group_size!r} (>= 2) "
                         f"entries; got shape {tuple(rewards.shape)}")
    r = rewards.reshape(-1, group_size)
    a = (r - r.mean(1, keepdim=True)) / (r.std(1, keepdim=True) + eps)
    return a.reshape(-1)


def log_ratio_split(train_logp, shadow_logp, old_logp):
    """(alpha, beta) with alpha = f_low(a; W_k) - f_engine(a; W_j), beta = f_train(a; W_k) - f_low(a; W_k)."""
    return shadow_logp - old_logp, train_logp - shadow_logp


def clipped(ratio, adv, eps_low: float = 0.2, eps_high: float = 0.2):
    """True where min(rA, clip(r, 1 - eps_low, 1 + eps_high) A) is the constant branch: A>0, r>1+eps_high or A<0, r<1-eps_low."""
    return ((adv > 0) & (ratio > 1 + eps_high)) | ((adv < 0) & (ratio < 1 - eps_low))


def classify_clipping(alpha, beta, adv, eps_low: float = 0.2, eps_high: float = 0.2):
    """Per token, an index into CLIP_CLASSES: clipped under exp(alpha + beta) and/or the clean exp(alpha).

    0 unclipped (neither), 1 phantom (actual only), 2 legitimate (both), 3 released (clean only:
    beta pulled a token that really moved back inside the trust region).
    """
    actual = clipped(torch.exp(alpha + beta), adv, eps_low, eps_high)
    clean = clipped(torch.exp(alpha), adv, eps_low, eps_high)
    return actual.long() * (1 + clean.long()) + 3 * (clean & ~actual).long()


def token_weights(ratio, adv, eps_low: float = 0.2, eps_high: float = 0.2):
    """W_t = min(r_t A_t, clip(r_t, 1 - eps_low, 1 + eps_high) A_t): the PPO objective per token."""
    return torch.minimum(ratio * adv, torch.clamp(ratio, 1 - eps_low, 1 + eps_high) * adv)


def surrogate_loss(logp, old_logp, adv, mask, eps_low: float = 0.2, eps_high: float = 0.2,
                   ratio_mode: str = "actual", weight_mode: str = "ppo", shadow_logp=None):
    """L = -(1/N) sum_t m_t W_t over the N completion tokens, W_t = min(r A, clip(r) A).

    ratio_mode: "actual" r = exp(logp - old_logp); "one" r = exp(logp - sg(logp)) (value 1,
    the REINFORCE gradient); "shadow" r = exp(shadow - old_logp) exp(logp - sg(logp)) (value
    from the low-precision shadow forward, gradient through the trainer's forward).
    weight_mode: "ppo" as above; "detached" L = -(1/N) sum m_t sg(W_t) logp_t (no dead zones);
    "detached_centered" the same with W_t minus its mean over the batch's tokens.
    adv: one advantage per row (B,) or per token (B, T); sg = stop-gradient.
    """
    _check_choice(ratio_mode, "ratio_mode", RATIO_MODES)
    _check_choice(weight_mode, "weight_mode", WEIGHT_MODES)
    adv = adv if adv.ndim == logp.ndim else adv[:, None]
    adv = adv.expand_as(logp)
    m = mask.to(logp.dtype)
    n = m.sum().clamp(min=1)
    live = logp - logp.detach()  # zero in value; its gradient is the score function
    if ratio_mode == "actual":
        ratio = torch.exp(logp - old_logp)
    elif ratio_mode == "one":
        ratio = torch.exp(live)
    else:
        if shadow_logp is None:
            raise ValueError("ratio_mode='shadow' needs shadow_logp (the low-precision forward)")
        ratio = torch.exp(shadow_logp.detach() - old_logp + live)
    w = token_weights(ratio, adv, eps_low, eps_high)
    if weight_mode == "ppo":
        return -(w * m).sum() / n
    w = w.detach()
    if weight_mode == "detached_centered":
        w = w - (w * m).sum() / n
    return -(w * logp * m).sum() / n


# --------------------------------------------------------------------------- gradients


def _flat_grad(loss: torch.Tensor, policy: Policy) -> torch.Tensor:
    grads = torch.autograd.grad(loss, list(policy.parameters()), allow_unused=True)
    return torch.cat([(torch.zeros_like(p) if g is None else g).reshape(-1).double()
                      for g, p in zip(grads, policy.parameters(), strict=True)])


def policy_gradient(policy: Policy, rollout: Rollout, coeff: torch.Tensor,
                    precision: str) -> torch.Tensor:
    """g = -(1/N) sum_t m_t c_t s_t with s_t = d log pi(a_t)/dW from a forward and backward in `precision`."""
    logp = sequence_logprobs(policy, rollout, precision)
    m = rollout.mask.to(logp.dtype)
    loss = -(coeff.detach() * logp * m).sum() / m.sum().clamp(min=1)
    return _flat_grad(loss, policy)


@dataclass
class GradientDecomposition:
    """The four passes (clean/actual ratio x low/full-precision backward), ratios detached, no clipping."""

    clean_low: torch.Tensor  # A: coefficients A e^alpha, low-precision backward = g_clean
    clean_full: torch.Tensor  # B: A e^alpha, trainer-precision backward
    actual_low: torch.Tensor  # C: A e^(alpha + beta), low-precision backward
    actual_full: torch.Tensor  # D: A e^(alpha + beta), trainer-precision backward = g_actual

    @property
    def d_score(self) -> torch.Tensor:
        """Delta g_score = B - A: the backward's precision."""
        return self.clean_full - self.clean_low

    @property
    def d_ratio(self) -> torch.Tensor:
        """Delta g_ratio = C - A: beta in the ratio."""
        return self.actual_low - self.clean_low

    @property
    def interaction(self) -> torch.Tensor:
        """D - C - B + A, so that D = A + d_ratio + d_score + interaction."""
        return self.actual_full - self.actual_low - self.clean_full + self.clean_low


def four_pass_gradients(policy: Policy, rollout: Rollout, adv: torch.Tensor, alpha: torch.Tensor,
                        beta: torch.Tensor, low: str = "bf16",
                        full: str = "fp32") -> GradientDecomposition:
    """Passes A-D: g = -(1/N) sum A e^alpha or A e^(alpha+beta) times s_t from a `low` or `full` backward."""
    a = adv[:, None].expand_as(alpha)
    clean = (a * torch.exp(alpha)).detach()
    actual = (a * torch.exp(alpha + beta)).detach()
    return GradientDecomposition(
        clean_low=policy_gradient(policy, rollout, clean, low),
        clean_full=policy_gradient(policy, rollout, clean, full),
        actual_low=policy_gradient(policy, rollout, actual, low),
        actual_full=policy_gradient(policy, rollout, actual, full),
    )


def _cos(a: torch.Tensor, b: torch.Tensor) -> float:
    den = float(a.norm() * b.norm())
    return float(a @ b) / den if den > 0 else float("nan")


def gradient_report(policy: Policy, rollout: Rollout, run: RunConfig) -> dict[str, float]:
    """Sizes and angles of the gradient errors that the precision gap causes, on one batch.

    Four passes without clipping: |d_ratio|/|g_clean|, |d_score|/|g_clean|, cos(d_ratio,
    d_score), cos(g_clean, g_actual). With clipping: cos between the loss gradient the trainer
    uses and the same loss computed in the engine's precision (beta = 0). Cross-entropy
    (pretraining) for comparison: cos between the fp32 and low-precision gradients of the mean
    -log pi(a_t), where beta only shifts the loss.
    """
    adv = group_advantages(rollout.rewards, rollout.group_size)
    with torch.no_grad():
        shadow = sequence_logprobs(policy, rollout, run.engine)
        train_lp = sequence_logprobs(policy, rollout, run.trainer)
    alpha, beta = log_ratio_split(train_lp, shadow, rollout.old_logp)
    dec = four_pass_gradients(policy, rollout, adv, alpha, beta, low=run.engine, full=run.trainer)
    clean_norm = float(dec.clean_low.norm())

    def loss_grad(precision: str) -> torch.Tensor:
        logp = sequence_logprobs(policy, rollout, precision)
        return _flat_grad(surrogate_loss(logp, rollout.old_logp, adv, rollout.mask, run.eps_low,
                                         run.eps_high, run.ratio_mode, run.weight_mode, shadow),
                          policy)

    ones = torch.ones_like(alpha)
    return {
        "ratio_error": float(dec.d_ratio.norm()) / clean_norm,
        "score_error": float(dec.d_score.norm()) / clean_norm,
        "cos_ratio_score": _cos(dec.d_ratio, dec.d_score),
        "cos_clean_actual": _cos(dec.clean_low, dec.actual_full),
        "cos_clipped": _cos(loss_grad(run.engine), loss_grad(run.trainer)),
        "cos_cross_entropy": _cos(policy_gradient(policy, rollout, ones, run.engine),
                                  policy_gradient(policy, rollout, ones, run.trainer)),
    }


def beta_table(policy: Policy, rollout: Rollout, precisions: Sequence[str] = PRECISIONS,
               reference: str = "bf16") -> dict[str, dict[str, float]]:
    """Statistics of beta = f_P(a_t) - f_reference(a_t) over the rollout's tokens, for each trainer precision P."""
    with torch.no_grad():
        ref = sequence_logprobs(policy, rollout, reference)[rollout.mask]
        out = {}
        for p in precisions:
            beta = sequence_logprobs(policy, rollout, p)[rollout.mask] - ref
            out[p] = {
                "mean_abs": float(beta.abs().mean()),
                "mean": float(beta.mean()),
                "std": float(beta.std()),
                "max_abs": float(beta.abs().max()),
                "beyond_0.2": float((beta.abs() > 0.2).float().mean()),
                "nonzero": float((beta != 0).float().mean()),
            }
    return out


@torch.no_grad()
def logit_rounding_beta(policy: Policy, rollout: Rollout, fmt="bfloat16") -> torch.Tensor:
    """beta from rounding only the logits: f(a; z) - f(a; fl(z)), z from the fp32 forward, per token (N,)."""
    prompt, prev, pos = (x[rollout.mask] for x in rollout.inputs(policy.bos))
    z = policy(prompt, prev, pos, "fp32")
    tok = rollout.tokens[rollout.mask][:, None]
    exact = F.log_softmax(z, -1).gather(1, tok)
    rounded = F.log_softmax(round_to(z, get_format(fmt)), -1).gather(1, tok)
    return (exact - rounded).squeeze(1)


def beta_by_offset(policy_cfg: PolicyConfig, offsets: Sequence[float], seed: int = 0,
                   group_size: int = 8, trainer: str = "fp32",
                   engine: str = "bf16") -> dict[str, np.ndarray]:
    """Mean |beta| and P(|beta| > 0.2) of sampled tokens as the common logit level moves.

    Same weights and sampling stream for every offset (only the fixed bias changes, which
    leaves the exact policy unchanged). "full": trainer forward against engine forward;
    "logits_only": an fp32 forward whose logits alone are rounded into the engine's format.
    """
    out = {k: np.zeros(len(offsets)) for k in ("full", "logits_only", "beyond")}
    for i, offset in enumerate(offsets):
        policy = Policy(replace(policy_cfg, logit_offset=float(offset)),
                        torch.Generator().manual_seed(seed))
        rollout = Engine(policy, engine).generate(group_size,
                                                  torch.Generator().manual_seed(seed + 1))
        with torch.no_grad():
            beta = (sequence_logprobs(policy, rollout, trainer)
                    - sequence_logprobs(policy, rollout, engine))[rollout.mask]
        out["full"][i] = float(beta.abs().mean())
        out["beyond"][i] = float((beta.abs() > 0.2).float().mean())
        out["logits_only"][i] = float(logit_rounding_beta(policy, rollout, engine).abs().mean())
    return out


# --------------------------------------------------------------------------- training


@dataclass(frozen=True)
class RunConfig:
    """One training run: precisions, learning rate, clip range and loss variant."""

    trainer: str = "fp32"  # forward/backward precision of the trainer
    engine: str = "bf16"  # precision of the rollout engine (and of the shadow forward)
    master: str = "fp32"  # storage of the trainable weights (optimizer updates land here)
    lr: float = 5e-5
    steps: int = 50
    group_size: int = 8
    eps_low: float = 0.2
    eps_high: float = 0.2
    ratio_mode: str = "actual"
    weight_mode: str = "ppo"
    staleness: int = 1  # optimizer steps between the engine's weights and the trainer's

    def __post_init__(self):
        _check_choice(self.trainer, "trainer precision", PRECISIONS)
        _check_choice(self.engine, "engine precision", PRECISIONS)
        _check_choice(self.master, "master precision", MASTER_PRECISIONS)
        _check_choice(self.ratio_mode, "ratio_mode", RATIO_MODES)
        _check_choice(self.weight_mode, "weight_mode", WEIGHT_MODES)
        _check_positive(self.lr, "lr")
        _check_positive(self.eps_low, "eps_low")
        _check_positive(self.eps_high, "eps_high")
        if isinstance(self.steps, bool) or not isinstance(self.steps, int) or self.steps < 1:
            raise ValueError(f"steps must be an integer >= 1; got steps={self.steps!r}")
        if self.staleness not in (0, 1) or isinstance(self.staleness, bool):
            raise ValueError(f"staleness must be 0 (on-policy) or 1 (the engine one step behind, "
                             f"as in asynchronous GRPO); got staleness={self.staleness!r}")

    @property
    def label(self) -> str:
        """Short description: master/trainer/engine precisions, lr and any intervention."""
        parts = [f"{self.master} master, {self.trainer} trainer, {self.engine} engine, "
                 f"lr {self.lr:g}"]
        if self.ratio_mode != "actual":
            parts.append(f"ratio {self.ratio_mode}")
        if self.weight_mode != "ppo":
            parts.append(self.weight_mode.replace("_", " "))
        if (self.eps_low, self.eps_high) != (0.2, 0.2):
            parts.append(f"eps {self.eps_low:g}/{self.eps_high:g}")
        return ", ".join(parts)


STEP_FIELDS: tuple[str, ...] = (
    "reward", "clip", "phantom", "legitimate", "alpha_abs", "beta_abs", "beta_mean", "beta_std",
    "changed", "deployed", "moved", "kl",
)


@dataclass
class RunLog:
    """Per-step measurements of one training run (numpy arrays of length `steps`)."""

    config: RunConfig
    reward: np.ndarray  # mean reward of the batch (= -mean completion length)
    clip: np.ndarray  # fraction of completion tokens in a dead zone of the loss actually used
    phantom: np.ndarray  # fraction clipped by exp(alpha + beta) but not by exp(alpha)
    legitimate: np.ndarray  # fraction clipped by both
    alpha_abs: np.ndarray  # mean |alpha|
    beta_abs: np.ndarray  # mean |beta|
    beta_mean: np.ndarray  # mean beta (signed)
    beta_std: np.ndarray
    changed: np.ndarray  # fraction of weights whose engine copy changed at the step's sync
    deployed: np.ndarray  # mean over tokens of sign(A) (f_low(W_k+1) - f_low(W_k))
    moved: np.ndarray  # mean over tokens of |f_low(W_k+1) - f_low(W_k)|
    kl: np.ndarray  # k3 estimate of KL(engine policy || deployed policy) on the batch
    snapshots: dict = field(default_factory=dict)  # step -> per-token arrays (`record`)
    gradients: dict = field(default_factory=dict)  # step -> gradient_report (`gradients`)
    policy: Policy | None = None  # the trained policy

    def final_reward(self, last: int = 10) -> float:
        """Mean batch reward over the last `last` steps."""
        return float(self.reward[-last:].mean())

    def steps_to(self, reward: float, window: int = 5) -> int | None:
        """First step at which the `window`-step moving average of the reward reaches `reward` (None: never)."""
        avg = np.convolve(self.reward, np.ones(window) / window, mode="valid")
        hit = np.nonzero(avg >= reward)[0]
        return int(hit[0]) + window - 1 if hit.size else None


def _start(policy_cfg: PolicyConfig, run: RunConfig, seed: int):
    policy = Policy(policy_cfg, torch.Generator().manual_seed(seed))
    if run.master != "fp32":
        # True low-precision weights: Adam's updates are computed and added in bf16.
        for p in policy.parameters():
            p.data = p.data.to(_DTYPE[run.master])
    # Adam's step is about lr per weight whatever the gradient's size, so chapter 1's
    # boundary-crossing arithmetic applies; foreach=False keeps bf16 weights updated in bf16.
    opt = torch.optim.Adam(policy.parameters(), lr=run.lr, foreach=False)
    return policy, opt, Engine(policy, run.engine)


def _train(policy_cfg: PolicyConfig, run: RunConfig, seed: int, tick, record=(),
           gradients=()) -> RunLog:
    policy, opt, engine = _start(policy_cfg, run, seed)
    g_sample = torch.Generator().manual_seed(seed + 1)
    log = {k: np.zeros(run.steps) for k in STEP_FIELDS}
    snapshots, reports = {}, {}
    for step in range(run.steps):
        rollout = engine.generate(run.group_size, g_sample)
        if run.staleness:  # the next batch comes from these weights: one step behind
            log["changed"][step] = engine.sync(policy)
        if step in gradients:
            reports[step] = gradient_report(policy, rollout, run)
        adv = group_advantages(rollout.rewards, run.group_size)
        logp = sequence_logprobs(policy, rollout, run.trainer)
        with torch.no_grad():
            shadow = sequence_logprobs(policy, rollout, run.engine)
        alpha, beta = log_ratio_split(logp.detach(), shadow, rollout.old_logp)
        loss = surrogate_loss(logp, rollout.old_logp, adv, rollout.mask, run.eps_low,
                              run.eps_high, run.ratio_mode, run.weight_mode, shadow)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if not run.staleness:
            log["changed"][step] = engine.sync(policy)
        with torch.no_grad():
            after = sequence_logprobs(policy, rollout, run.engine)
        m = rollout.mask
        a_tok = adv[:, None].expand_as(m)
        used = {"actual": alpha + beta, "shadow": alpha, "one": torch.zeros_like(alpha)}
        dead = clipped(torch.exp(used[run.ratio_mode]), a_tok, run.eps_low, run.eps_high)
        if run.weight_mode != "ppo":
            dead = torch.zeros_like(dead)  # detached weights have no zero-gradient branch
        cls = classify_clipping(alpha, beta, a_tok, run.eps_low, run.eps_high)[m]
        delta = (after - shadow)[m]
        log["reward"][step] = float(rollout.rewards.mean())
        log["clip"][step] = float(dead[m].float().mean())
        log["phantom"][step] = float((cls == 1).float().mean())
        log["legitimate"][step] = float((cls == 2).float().mean())
        log["alpha_abs"][step] = float(alpha[m].abs().mean())
        log["beta_abs"][step] = float(beta[m].abs().mean())
        log["beta_mean"][step] = float(beta[m].mean())
        log["beta_std"][step] = float(beta[m].std()) if m.sum() > 1 else 0.0
        log["deployed"][step] = float((delta * torch.sign(a_tok[m])).mean())
        log["moved"][step] = float(delta.abs().mean())
        a = alpha[m]
        log["kl"][step] = float((torch.exp(a) - 1 - a).mean())
        if step in record:
            snapshots[step] = {
                "alpha": alpha[m].numpy().copy(), "beta": beta[m].numpy().copy(),
                "adv": a_tok[m].numpy().copy(), "logp": shadow[m].numpy().copy(),
                "eos": (rollout.tokens[m] == EOS).numpy().copy(),
            }
        tick(log["reward"][step])
    return RunLog(config=run, snapshots=snapshots, gradients=reports, policy=policy, **log)


def train(policy_cfg: PolicyConfig, run: RunConfig, seed: int = 0, progress: bool = True,
          record: Sequence[int] = (), gradients: Sequence[int] = ()) -> RunLog:
    """GRPO on the immediate-EOS task (reward = -length), one optimizer step per generated batch.

    Per step: the engine samples group_size completions per prompt, syncs to fl(W) (before the
    update when run.staleness = 1, so the next batch is one step stale), the trainer scores the
    batch in run.trainer precision and the shadow forward in run.engine precision, and Adam
    takes one step on the clipped surrogate. `record`: steps whose per-token alpha, beta,
    advantage, log-prob and EOS flag are kept; `gradients`: steps with a `gradient_report`.
    """
    from tqdm.auto import tqdm

    with tqdm(total=run.steps, desc=run.label, disable=not progress) as bar:
        def tick(reward):
            bar.update()
            bar.set_postfix(reward=f"{reward:.2f}", refresh=False)

        return _train(policy_cfg, run, seed, tick, record, gradients)


def train_many(policy_cfg: PolicyConfig, runs: Mapping[str, RunConfig], seed: int = 0,
               progress: bool = True, desc: str = "training",
               record: Sequence[int] = (), gradients: Sequence[int] = ()) -> dict[str, RunLog]:
    """`train` for each named run, same seed (same initial policy and sampling stream), one progress bar."""
    from tqdm.auto import tqdm

    out = {}
    with tqdm(total=sum(r.steps for r in runs.values()), desc=desc, disable=not progress) as bar:
        for name, run in runs.items():
            bar.set_postfix_str(name, refresh=False)
            out[name] = _train(policy_cfg, run, seed, lambda _r: bar.update(), record, gradients)
    return out


def with_changes(run: RunConfig, **changes) -> RunConfig:
    """A copy of `run` with the given fields changed (validated again)."""
    return replace(run, **changes)
