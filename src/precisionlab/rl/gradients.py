"""Gradients of the GRPO loss: the four-pass decomposition and the report of how the precision gap bends them."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .engine import Rollout, sequence_logprobs
from .grpo import group_advantages, log_ratio_split, surrogate_loss
from .policy import Policy
from .runs import RunConfig
from .stats import fcos, fexp, fnorm, fsum

__all__ = ["GradientDecomposition", "flat_grad", "four_pass_gradients", "gradient_report",
           "policy_gradient"]


def flat_grad(loss: torch.Tensor, policy: Policy) -> torch.Tensor:
    """dL/dW of every trainable parameter, flattened into one float64 vector (0 where unused)."""
    grads = torch.autograd.grad(loss, list(policy.parameters()), allow_unused=True)
    return torch.cat([(torch.zeros_like(p) if g is None else g).reshape(-1).double()
                      for g, p in zip(grads, policy.parameters(), strict=True)])


def policy_gradient(policy: Policy, rollout: Rollout, coeff: torch.Tensor,
                    precision: str) -> torch.Tensor:
    """g = -(1/N) sum_t m_t c_t s_t with s_t = d log pi(a_t)/dW from a forward and backward in `precision`."""
    logp = sequence_logprobs(policy, rollout, precision)
    m = rollout.mask.to(logp.dtype)
    loss = -fsum(coeff.detach() * logp * m) / m.sum().clamp(min=1)
    return flat_grad(loss, policy)


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
    with torch.no_grad():
        clean = a * fexp(alpha)
        actual = a * fexp(alpha + beta)
    return GradientDecomposition(
        clean_low=policy_gradient(policy, rollout, clean, low),
        clean_full=policy_gradient(policy, rollout, clean, full),
        actual_low=policy_gradient(policy, rollout, actual, low),
        actual_full=policy_gradient(policy, rollout, actual, full),
    )


def gradient_report(policy: Policy, rollout: Rollout, run: RunConfig) -> dict[str, float]:
    """Sizes and angles of the gradient errors that the precision gap causes, on one batch."""
    # Four passes without clipping: |d_ratio|/|g_clean|, |d_score|/|g_clean|, cos(d_ratio,
    # d_score), cos(g_clean, g_actual). With clipping: cos between the loss gradient the trainer
    # uses and the same loss computed in the engine's precision (beta = 0), and between it and
    # the clean REINFORCE gradient -(1/N) sum A_t s_t in the engine's precision (ratio 1, no
    # clipping: the source's reference). Cross-entropy
    # (pretraining) for comparison: cos between the fp32 and low-precision gradients of the mean
    # -log pi(a_t), where beta only shifts the loss. Where every advantage is 0 the policy-gradient
    # entries are nan (the clean gradient is exactly 0).
    adv = group_advantages(rollout.rewards, rollout.group_size)
    with torch.no_grad():
        shadow = sequence_logprobs(policy, rollout, run.engine)
        train_lp = sequence_logprobs(policy, rollout, run.trainer)
    alpha, beta = log_ratio_split(train_lp, shadow, rollout.old_logp)
    dec = four_pass_gradients(policy, rollout, adv, alpha, beta, low=run.engine, full=run.trainer)
    clean_norm = fnorm(dec.clean_low)

    def loss_grad(precision: str) -> torch.Tensor:
        logp = sequence_logprobs(policy, rollout, precision)
        return flat_grad(surrogate_loss(logp, rollout.old_logp, adv, rollout.mask, run.eps_low,
                                        run.eps_high, run.ratio_mode, run.weight_mode, shadow),
                         policy)

    ones = torch.ones_like(alpha)
    a_tok = adv[:, None].expand_as(alpha)
    used = loss_grad(run.trainer)
    # With every advantage 0 (a batch whose completions all earn the same reward) the clean
    # gradient is exactly 0 and every size and angle below is undefined: nan.
    rel = (lambda g: fnorm(g) / clean_norm) if clean_norm > 0 else (lambda g: float("nan"))
    return {
        "ratio_error": rel(dec.d_ratio),
        "score_error": rel(dec.d_score),
        "cos_ratio_score": fcos(dec.d_ratio, dec.d_score),
        "cos_clean_actual": fcos(dec.clean_low, dec.actual_full),
        "cos_clipped": fcos(loss_grad(run.engine), used),
        "cos_reinforce": fcos(policy_gradient(policy, rollout, a_tok, run.engine), used),
        "cos_cross_entropy": fcos(policy_gradient(policy, rollout, ones, run.engine),
                                  policy_gradient(policy, rollout, ones, run.trainer)),
    }
