"""Rollouts: the low-precision engine that samples completions, and log-probabilities of a rollout."""

from __future__ import annotations

import copy
from dataclasses import dataclass

import numpy as np
import torch

from ..checks import check_choice, check_count
from ..rounding import round_to
from .forward import fused_logprobs, kernel_weights, policy_logprobs, rounded_params
from .gathered import gathered_log_softmax
from .policy import BACKENDS, EOS, PRECISIONS, Policy

__all__ = ["Engine", "Rollout", "sample_tokens", "sequence_logprobs", "vocabulary_logprobs"]


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

    def token_inputs(self, bos: int):
        """(prompt, prev, pos) of the completion tokens only (the masked entries), each (N,)."""
        return tuple(x[self.mask] for x in self.inputs(bos))

    def scatter(self, per_token: torch.Tensor) -> torch.Tensor:
        """A (B, T) tensor holding per_token (N,) on the mask and 0 elsewhere."""
        return torch.zeros(self.tokens.shape, dtype=per_token.dtype).masked_scatter(self.mask,
                                                                                     per_token)


def sample_tokens(logp: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """One token per row by inverse CDF: the first v with sum_{u<=v} p_u > U * sum_u p_u, U ~ U[0, 1)."""
    # p_u = exp64(logp_u) in float64, summed left to right, and U a float64 draw from
    # `generator` (continuing its stream): the same U picks the same token on every machine.
    from ..emulate.kernels import inverse_cdf  # numba: imported by the first draw (0.7 s)

    u = torch.rand(logp.shape[0], generator=generator, dtype=torch.float64)
    out = np.empty(logp.shape[0], np.int64)
    inverse_cdf(np.ascontiguousarray(logp.detach().float().numpy()), u.numpy(), out)
    return torch.from_numpy(out)


class Engine:
    """The rollout engine: a copy of the policy rounded into `precision` at every sync."""

    def __init__(self, policy: Policy, precision: str = "bf16", backend: str = "emulated"):
        self.precision = check_choice(precision, "engine precision", PRECISIONS)
        self.backend = check_choice(backend, "backend", BACKENDS)
        self.model = copy.deepcopy(policy).requires_grad_(False)
        # The fixed logit bias is not trained: rounded once, here.
        self.model.bias.data = round_to(policy.bias.detach().float(), precision)
        self._load(rounded_params(policy, precision))

    def _load(self, values) -> None:
        """Store the rounded weights; the fused kernel's copy is made again on first use."""
        for p, v in zip(self.model.parameters(), values, strict=True):
            p.data = v
        self._weights = None

    def kernel_weights(self) -> tuple:
        """The fused kernel's copy of the engine's weights (already in the engine's format)."""
        if self._weights is None:
            self._weights = kernel_weights(self.model, self.precision, rounded_already=True)
        return self._weights

    def logprobs(self, prompt, prev, pos) -> torch.Tensor:
        """log pi_engine(. | rows) (N, V) without gradients, in the engine's precision and back end."""
        if self.backend == "native":
            with torch.no_grad():
                return policy_logprobs(self.model, prompt, prev, pos, self.precision, "native")
        return fused_logprobs(self.model, prompt, prev, pos, self.precision,
                              self.kernel_weights())

    def sampling_logprobs(self, prompt, prev, pos) -> torch.Tensor:
        """log pi(. | rows) that `generate` samples with and records: `logprobs` (a serving kernel may differ)."""
        return self.logprobs(prompt, prev, pos)

    def sync(self, policy: Policy) -> float:
        """Load fl(W) into the engine; return the fraction of weights whose stored value changed."""
        new = rounded_params(policy, self.precision)
        old = list(self.model.parameters())
        changed = sum(int((a != b.data).sum()) for a, b in zip(new, old, strict=True))
        total = sum(a.numel() for a in new)
        self._load(new)
        return changed / total

    @torch.no_grad()
    def generate(self, group_size: int, generator: torch.Generator) -> Rollout:
        """Sample `group_size` completions per prompt, continuing `generator`'s stream; all unfinished rows advance together."""
        check_count(group_size, "group_size", 2)
        cfg = self.model.cfg
        prompt = torch.arange(cfg.n_prompts).repeat_interleave(group_size)
        b, t_max = prompt.numel(), cfg.max_len
        tokens = torch.full((b, t_max), EOS, dtype=torch.long)
        old_logp = torch.zeros(b, t_max)
        mask = torch.zeros(b, t_max, dtype=torch.bool)
        prev = torch.full((b,), self.model.bos, dtype=torch.long)
        rows = torch.arange(b)  # the unfinished completions
        for t in range(t_max):
            logp = self.sampling_logprobs(prompt[rows], prev[rows],
                                          torch.full((rows.numel(),), t))
            tok = sample_tokens(logp, generator)
            tokens[rows, t] = tok
            old_logp[rows, t] = logp.gather(1, tok[:, None]).squeeze(1)
            mask[rows, t] = True
            prev[rows] = tok
            rows = rows[tok != EOS]
            if rows.numel() == 0:
                break
        return Rollout(prompt, tokens, mask, old_logp, group_size)


def sequence_logprobs(policy: Policy, rollout: Rollout, precision: str,
                      backend: str = "emulated") -> torch.Tensor:
    """log pi(a_t | s_t) of the rollout's tokens under `policy` in `precision`; (B, T), 0 off the mask."""
    # The policy is Markov in (prompt, previous token, position), so only completion tokens
    # need a forward: padding rows are never computed.
    rows, tok = rollout.token_inputs(policy.bos), rollout.tokens[rollout.mask]
    if backend == "emulated" and torch.is_grad_enabled():  # the same bits, compiled
        return rollout.scatter(gathered_log_softmax(policy(*rows, precision), tok))
    logp = policy_logprobs(policy, *rows, precision, backend)
    return rollout.scatter(logp.gather(-1, tok[:, None]).squeeze(-1))


@torch.no_grad()
def vocabulary_logprobs(policy: Policy, rollout: Rollout, precision: str,
                        backend: str = "emulated") -> torch.Tensor:
    """log pi(v | s_t) for every token v of the vocabulary at the rollout's states: (N tokens, V)."""
    return policy_logprobs(policy, *rollout.token_inputs(policy.bos), precision, backend)
