"""The GRPO loss: group advantages, the clipped surrogate and its variants, the alpha/beta split, clipping classes."""

from __future__ import annotations

import torch

from .. import emulate as E
from ..checks import check_choice
from .stats import fexp, fsum

__all__ = ["CLIP_CLASSES", "RATIO_MODES", "WEIGHT_MODES", "classify_clipping", "clipped",
           "group_advantages", "log_ratio_split", "surrogate_loss", "token_weights"]

RATIO_MODES: tuple[str, ...] = ("actual", "one", "shadow")
WEIGHT_MODES: tuple[str, ...] = ("ppo", "detached", "detached_centered")
CLIP_CLASSES: tuple[str, ...] = ("unclipped", "phantom", "legitimate", "released")


def group_advantages(rewards: torch.Tensor, group_size: int, eps: float = 1e-4) -> torch.Tensor:
    """A_i = (R_i - mean_group R) / (std_group R + eps), sample std; rows grouped consecutively."""
    if rewards.ndim != 1 or group_size < 2 or rewards.numel() % group_size:
        raise ValueError(f"rewards must be 1-D with a multiple of group_size={group_size!r} (>= 2) "
                         f"entries; got shape {tuple(rewards.shape)}")
    # float64, fixed pairwise sums and IEEE sqrt: the same advantages on every machine.
    r = rewards.reshape(-1, group_size).to(torch.float64)
    d = r - E.fixed_sum(r, 1, keepdim=True) / group_size
    std = E.sqrt64(E.fixed_sum(d * d, 1, keepdim=True) / (group_size - 1))
    return (d / (std + eps)).reshape(-1).to(rewards.dtype)


def log_ratio_split(train_logp, shadow_logp, old_logp):
    """(alpha, beta) with alpha = f_low(a; W_k) - f_engine(a; W_j), beta = f_train(a; W_k) - f_low(a; W_k)."""
    return shadow_logp - old_logp, train_logp - shadow_logp


def clipped(ratio, adv, eps_low: float = 0.2, eps_high: float = 0.2):
    """True where min(rA, clip(r, 1 - eps_low, 1 + eps_high) A) is the constant branch: A>0, r>1+eps_high or A<0, r<1-eps_low."""
    return ((adv > 0) & (ratio > 1 + eps_high)) | ((adv < 0) & (ratio < 1 - eps_low))


def classify_clipping(alpha, beta, adv, eps_low: float = 0.2, eps_high: float = 0.2):
    """Per token, an index into CLIP_CLASSES: clipped under exp(alpha + beta) and/or the clean exp(alpha)."""
    # 0 unclipped (neither), 1 phantom (actual only), 2 legitimate (both), 3 released (clean only:
    # beta pulled a token that really moved back inside the trust region).
    with torch.no_grad():
        actual = clipped(fexp(alpha + beta), adv, eps_low, eps_high)
        clean = clipped(fexp(alpha), adv, eps_low, eps_high)
    return actual.long() * (1 + clean.long()) + 3 * (clean & ~actual).long()


def token_weights(ratio, adv, eps_low: float = 0.2, eps_high: float = 0.2):
    """W_t = min(r_t A_t, clip(r_t, 1 - eps_low, 1 + eps_high) A_t): the PPO objective per token."""
    return torch.minimum(ratio * adv, torch.clamp(ratio, 1 - eps_low, 1 + eps_high) * adv)


def surrogate_loss(logp, old_logp, adv, mask, eps_low: float = 0.2, eps_high: float = 0.2,
                   ratio_mode: str = "actual", weight_mode: str = "ppo", shadow_logp=None):
    """L = -(1/N) sum_t m_t W_t over the N completion tokens, W_t = min(r A, clip(r) A)."""
    # ratio_mode: "actual" r = exp(logp - old_logp); "one" r = exp(logp - sg(logp)) (value 1,
    # the REINFORCE gradient); "shadow" r = exp(shadow - old_logp) exp(logp - sg(logp)) (value
    # from the low-precision shadow forward, gradient through the trainer's forward).
    # weight_mode: "ppo" as above; "detached" L = -(1/N) sum m_t sg(W_t) logp_t (no dead zones);
    # "detached_centered" the same with W_t minus its mean over the batch's tokens.
    # adv: one advantage per row (B,) or per token (B, T); sg = stop-gradient.
    check_choice(ratio_mode, "ratio_mode", RATIO_MODES)
    check_choice(weight_mode, "weight_mode", WEIGHT_MODES)
    adv = adv if adv.ndim == logp.ndim else adv[:, None]
    adv = adv.expand_as(logp)
    # exp and the sums go through emulate (exp64, fixed pairwise sums, one rounding), the
    # rest is elementwise IEEE arithmetic: the loss and its gradient are portable.
    m = mask.to(logp.dtype)
    n = m.sum().clamp(min=1)  # a count: exact in any order
    live = logp - logp.detach()  # zero in value; its gradient is the score function
    if ratio_mode == "actual":
        ratio = fexp(logp - old_logp)
    elif ratio_mode == "one":
        ratio = fexp(live)
    else:
        if shadow_logp is None:
            raise ValueError("ratio_mode='shadow' needs shadow_logp (the low-precision forward)")
        ratio = fexp(shadow_logp.detach() - old_logp + live)
    w = token_weights(ratio, adv, eps_low, eps_high)
    if weight_mode == "ppo":
        return -fsum(w * m) / n
    w = w.detach()
    if weight_mode == "detached_centered":
        w = w - fsum(w * m) / n
    return -fsum(w * logp * m) / n
