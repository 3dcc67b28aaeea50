"""Where beta comes from: its statistics per trainer precision, by log-probability band, and by logit level."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from .. import emulate as E
from ..rounding import round_to
from .engine import Engine, Rollout, sequence_logprobs, vocabulary_logprobs
from .gathered import gathered_log_softmax
from .policy import EOS, PRECISIONS, Policy, PolicyConfig
from .stats import fmean, fstd

__all__ = ["beta_by_band", "beta_by_offset", "beta_table", "logit_rounding_beta"]


def beta_table(policy: Policy, rollout: Rollout, precisions: Sequence[str] = PRECISIONS,
               reference: str = "bf16") -> dict[str, dict[str, float]]:
    """Statistics of beta = f_P(a_t) - f_reference(a_t) over the rollout's tokens, for each trainer precision P."""
    with torch.no_grad():
        ref = sequence_logprobs(policy, rollout, reference)[rollout.mask]
        out = {}
        for p in precisions:
            beta = sequence_logprobs(policy, rollout, p)[rollout.mask] - ref
            out[p] = {
                "mean_abs": fmean(beta.abs()),
                "mean": fmean(beta),
                "std": fstd(beta),
                "max_abs": float(beta.abs().max()),
                "beyond_0.2": fmean(beta.abs() > 0.2),
                "nonzero": fmean(beta != 0),
            }
    return out


@torch.no_grad()
def beta_by_band(policy: Policy, rollout: Rollout, bands: Sequence[tuple[float, float]],
                 trainer: str = "fp32", reference: str = "bf16") -> list[tuple[int, float]]:
    """Per band (lo, hi]: (count, median |beta|) over every vocabulary entry v at the rollout's states with lo < log pi_ref(v) <= hi."""
    ref = vocabulary_logprobs(policy, rollout, reference)
    mag = (vocabulary_logprobs(policy, rollout, trainer) - ref).abs()
    out = []
    for lo, hi in bands:
        sel = (ref > lo) & (ref <= hi)
        n = int(sel.sum())
        out.append((n, float(mag[sel].median()) if n else float("nan")))
    return out


@torch.no_grad()
def band_report(policy: Policy, bands: Sequence[tuple[float, float]], seed: int) -> dict:
    """P(EOS) and [lo, hi, count, median |beta|] per log-prob band at the states of a fresh bf16 batch of 8 (stream seed + 2)."""
    fresh = Engine(policy, "bf16").generate(8, torch.Generator().manual_seed(seed + 2))
    lp = vocabulary_logprobs(policy, fresh, "bf16")
    return {"p_eos": fmean(E.exp64(lp[:, EOS].double())),
            "bands": [[lo, hi, n, med] for (lo, hi), (n, med)
                      in zip(bands, beta_by_band(policy, fresh, bands), strict=True)]}


@torch.no_grad()
def logit_rounding_beta(policy: Policy, rollout: Rollout, fmt="bfloat16") -> torch.Tensor:
    """beta from rounding only the logits: f(a; z) - f(a; fl(z)), z from the fp32 forward, per token (N,)."""
    # gathered_log_softmax: emulate.log_softmax's fp32 value at the token, compiled.
    z = policy(*rollout.token_inputs(policy.bos), "fp32")
    tok = rollout.tokens[rollout.mask]
    return gathered_log_softmax(z, tok) - gathered_log_softmax(round_to(z, fmt), tok)


def beta_by_offset(policy_cfg: PolicyConfig, offsets: Sequence[float], seed: int = 0,
                   group_size: int = 8, trainer: str = "fp32",
                   engine: str = "bf16") -> dict[str, np.ndarray]:
    """Mean |beta| and P(|beta| > 0.2) of sampled tokens as the common logit level moves."""
    # Same weights and sampling stream for every offset (only the fixed bias changes, which
    # leaves the exact policy unchanged). "full": trainer forward against engine forward;
    # "logits_only": an fp32 forward whose logits alone are rounded into the engine's format.
    out = {k: np.zeros(len(offsets)) for k in ("full", "logits_only", "beyond")}
    weights = Policy(policy_cfg, seed)  # the same weights at every offset: drawn once
    for i, offset in enumerate(offsets):
        policy = weights.with_logit_offset(offset)
        rollout = Engine(policy, engine).generate(group_size,
                                                  torch.Generator().manual_seed(seed + 1))
        with torch.no_grad():
            beta = (sequence_logprobs(policy, rollout, trainer)
                    - sequence_logprobs(policy, rollout, engine))[rollout.mask]
        out["full"][i] = fmean(beta.abs())
        out["beyond"][i] = fmean(beta.abs() > 0.2)
        out["logits_only"][i] = fmean(logit_rounding_beta(policy, rollout, engine).abs())
    return out
