"""A serving kernel: an engine that samples with other arithmetic than the trainer's shadow forward.

A real inference server does not run the trainer's code: its matrix products sum in another
order and its softmax is fused, so even on identical weights its log-probabilities differ
from the trainer's low-precision (shadow) forward, and alpha = shadow - engine carries that
inference-kernel term. `ServingEngine` models it portably. Its products run through the same
emulated kernel with the residual and hidden coordinates permuted (the same function of the
weights, each dot product summed in a different fixed order: reversed), and the
log-probabilities it samples with and records are returned rounded to `logprobs` (by default
the engine's own format, bf16 for a bf16 engine, as a fused kernel with a bf16 output gives
them). `logprobs()` stays the shadow
forward (the trainer-side arithmetic on the engine's weights), as in `Engine`.
"""

from __future__ import annotations

import numpy as np
import torch

from ..checks import check_choice
from ..rounding import round_to
from .engine import Engine
from .forward import fused_logprobs
from .policy import PRECISIONS, Policy

__all__ = ["KERNELS", "ORDERS", "ServingEngine", "make_engine", "permuted_weights"]

KERNELS: tuple[str, ...] = ("shadow", "serving")  # engine arithmetic: the shadow forward's, or not
ORDERS: tuple[str, ...] = ("reversed", "forward")  # summation order of the serving products


def permuted_weights(weights: tuple, order: str = "reversed") -> tuple:
    """forward_kernel's weights with the residual (d) and hidden (m) coordinates in `order`: same function, sums over d and m reordered."""
    check_choice(order, "order", ORDERS)
    tok, pos, prompt, w_in_t, w_out_t, head_t, bias = weights
    d, m = w_in_t.shape[1], w_in_t.shape[2]
    pd = np.arange(d)[::-1] if order == "reversed" else np.arange(d)
    pm = np.arange(m)[::-1] if order == "reversed" else np.arange(m)

    def c(a):
        return np.ascontiguousarray(a)

    return (c(tok[:, pd]), c(pos[:, pd]), c(prompt[:, pd]), c(w_in_t[:, pd][:, :, pm]),
            c(w_out_t[:, pm][:, :, pd]), c(head_t[pd]), bias)


class ServingEngine(Engine):
    """Samples with log pi_serve = fl_out(log softmax z_perm): products summed in `order`, log-probs rounded to `logprobs`."""

    def __init__(self, policy: Policy, precision: str = "bf16", order: str = "reversed",
                 logprobs: str | None = None):
        super().__init__(policy, precision)
        self.order = check_choice(order, "order", ORDERS)
        self.logprob_precision = check_choice(logprobs or precision, "logprobs precision",
                                              PRECISIONS)
        self._source = self._serving = None

    def serving_weights(self) -> tuple:
        """The engine's weights permuted for the serving kernel (rebuilt after every sync)."""
        w = self.kernel_weights()
        if self._source is not w:
            self._source, self._serving = w, permuted_weights(w, self.order)
        return self._serving

    def sampling_logprobs(self, prompt, prev, pos) -> torch.Tensor:
        """log pi_serve(. | rows) (N, V): the serving kernel's forward, log-probs rounded to `logprobs`."""
        lp = fused_logprobs(self.model, prompt, prev, pos, self.precision, self.serving_weights())
        return torch.from_numpy(round_to(lp.numpy(), self.logprob_precision))


def make_engine(policy: Policy, precision: str, kernel: str = "shadow") -> Engine:
    """The rollout engine of a run: `Engine` (kernel "shadow") or `ServingEngine` (kernel "serving")."""
    check_choice(kernel, "kernel", KERNELS)
    return ServingEngine(policy, precision) if kernel == "serving" else Engine(policy, precision)
