"""The toy policy: a small autoregressive model over a vocabulary with an end-of-sequence token."""

from __future__ import annotations

import copy
from dataclasses import dataclass, replace

import numpy as np
import torch

from .. import emulate as E
from ..checks import check_choice, check_count, check_positive
from ..rounding import round_to

__all__ = ["BACKENDS", "EOS", "MASTER_PRECISIONS", "PRECISIONS", "Policy", "PolicyConfig",
           "emulated_precision"]

PRECISIONS: tuple[str, ...] = ("fp32", "bf16", "fp16")  # short names of precisionlab.formats
MASTER_PRECISIONS: tuple[str, ...] = ("fp32", "bf16")
BACKENDS: tuple[str, ...] = E.BACKENDS  # "emulated" (portable, the default) or "native" (torch's kernels)
EOS = 0  # token id of end-of-sequence


@dataclass(frozen=True)
class PolicyConfig:
    """Shape of the toy policy and where its logits sit on the floating-point grid."""

    vocab: int = 256  # token 0 is EOS
    n_prompts: int = 8
    max_len: int = 16  # completions are cut here (reward -max_len)
    width: int = 64  # residual stream
    hidden: int = 128  # MLP hidden layer
    depth: int = 4  # residual MLP blocks
    logit_offset: float = 64.0  # common level of every logit: sets the bf16 spacing there
    logit_spread: float = 2.0  # std of the token-dependent part of the logits at init
    eos_logit: float = 4.0  # extra logit of EOS at init: sets how rarely the policy stops
    # Format the initial weights are stored in: "bf16" puts them on the bf16 grid, like a
    # checkpoint released in bf16, so that beta starts from activation rounding alone.
    checkpoint: str = "fp32"

    def __post_init__(self):
        for name in ("vocab", "n_prompts", "max_len", "width", "hidden", "depth"):
            check_count(getattr(self, name), name, 2 if name == "vocab" else 1)
        check_positive(self.logit_spread, "logit_spread")
        check_choice(self.checkpoint, "checkpoint precision", PRECISIONS)
        for name in ("logit_offset", "eos_logit"):
            if not np.isfinite(getattr(self, name)):
                raise ValueError(f"{name} must be finite; got {name}={getattr(self, name)!r}")


def emulated_precision(precision: str, backend: str = "emulated") -> E.Precision:
    """The emulate.Precision of a policy precision (fp32, bf16 or fp16), accumulating in fp32."""
    check_choice(precision, "precision", PRECISIONS)
    return E.Precision(precision, "float32", check_choice(backend, "backend", BACKENDS))


class Policy(torch.nn.Module):
    """pi(a | prompt p, previous token, position t) = softmax(z), z = W_head RMSNorm(x_L) + b."""
    # x_0 = E_tok[prev] + E_pos[t] + E_prompt[p]; x_{l+1} = x_l + W_out,l relu(W_in,l RMSNorm(x_l)).
    # The bias b is a fixed buffer, `logit_offset` for every token plus `eos_logit` for EOS. A
    # common offset leaves the exact softmax unchanged but decides how coarse the bf16 grid is
    # where the logits live. ReLU is exact in every format (it only compares and selects), so
    # the hidden layer needs no rounding of its own. Initial weights: N(0, std^2) from
    # emulate.randn with a generator seeded by `seed`, rounded to float32.

    def __init__(self, cfg: PolicyConfig, seed: int = 0):
        super().__init__()
        self.cfg = cfg
        d, m, n = cfg.width, cfg.hidden, cfg.depth
        if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
            raise TypeError(f"seed must be an integer; got seed={seed!r}")
        generator = torch.Generator().manual_seed(int(seed))

        def normal(*shape, std):
            z = E.randn(*shape, generator=generator, dtype=torch.float64)
            return torch.nn.Parameter((z * std).to(torch.float32))

        self.tok = normal(cfg.vocab + 1, d, std=1.0)  # row `vocab` is the begin-of-sequence token
        self.pos = normal(cfg.max_len, d, std=1.0)
        self.prompt = normal(cfg.n_prompts, d, std=1.0)
        self.w_in = normal(n, m, d, std=(2 / d) ** 0.5)  # ReLU halves the variance: He init
        # Each block adds O(1/depth) variance, so the stream stays O(1) at any depth.
        self.w_out = normal(n, d, m, std=(m * n) ** -0.5)
        self.head = normal(cfg.vocab, d, std=cfg.logit_spread * d**-0.5)
        if cfg.checkpoint != "fp32":  # a checkpoint stored in a lower precision
            for p in self.parameters():
                p.data = round_to(p.data, cfg.checkpoint)
        self.register_buffer("bias", self._bias(cfg))

    @staticmethod
    def _bias(cfg: PolicyConfig) -> torch.Tensor:
        bias = torch.full((cfg.vocab,), float(cfg.logit_offset))
        bias[EOS] += cfg.eos_logit
        return bias

    def with_logit_offset(self, offset: float) -> Policy:
        """Policy(cfg with logit_offset=offset, seed): a copy, since no weight depends on the offset."""
        policy = copy.deepcopy(self)
        policy.cfg = replace(self.cfg, logit_offset=float(offset))
        policy.bias = self._bias(policy.cfg)
        return policy

    @property
    def bos(self) -> int:
        """Token id of begin-of-sequence, the `previous token` at position 0 (= vocab)."""
        return self.cfg.vocab

    def forward(self, prompt, prev, pos, precision: str = "fp32",
                backend: str = "emulated") -> torch.Tensor:
        """Logits z (float32 tensor holding values of `precision`) for rows (prompt, prev, pos)."""
        # Each weight is rounded to the format where it is used (straight-through gradient);
        # x_0 = fl(fl(E_tok) + fl(E_pos) + fl(E_prompt)) with the two adds in fp32; every linear
        # layer accumulates in fp32 in a fixed order and rounds once (`emulate.linear`); RMSNorm
        # is evaluated in float64 and rounded once; the residual add is an fp32 add rounded once.
        # backend="native": the same graph on torch's own kernels in the format's dtype.
        prec = emulated_precision(precision, backend)
        x = E.cast(E.cast(E.embedding(self.tok, prev), prec)
                   + E.cast(E.embedding(self.pos, pos), prec)
                   + E.cast(E.embedding(self.prompt, prompt), prec), prec)
        for layer in range(self.cfg.depth):
            h = torch.relu(E.linear(E.rms_norm(x, prec), self.w_in[layer], None, prec))
            x = E.cast(x + E.linear(h, self.w_out[layer], None, prec), prec)
        return E.linear(E.rms_norm(x, prec), self.head, self.bias, prec)
