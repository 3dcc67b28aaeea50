"""The policy's log-probabilities: the emulate ops under autograd, or one fused numba kernel without.

Without gradients (rollouts, shadow forwards, scoring) `forward_kernel` computes what the
emulate ops of Policy.forward and emulate.log_softmax compute, bit for bit: the same
roundings, the same fp32 accumulation order in the matrix products, the same float64
formulas and pairwise sums in RMSNorm and the log-softmax. It is built from emulate.kernels,
the compiled twins of emulate's arithmetic; tests/test_rl.py holds the two paths equal.
"""

from __future__ import annotations

import numba
import numpy as np
import torch

from .. import emulate as E
from ..checks import check_choice
from ..emulate import kernels as K
from ..rounding import round_to
from .policy import BACKENDS, PRECISIONS, Policy, emulated_precision

__all__ = ["forward_kernel", "fused_logprobs", "kernel_weights", "policy_logprobs",
           "rounded_params"]

_FP32 = E.Precision("float32")


@numba.njit(cache=True)
def forward_kernel(prompt, prev, pos, tok, pos_t, prompt_t, w_in_t, w_out_t, head_t, bias,
                   wp, out):  # pragma: no cover - compiled
    """out = log_softmax(z) in fp32 for rows (prompt, prev, pos); weights already in F, matrices transposed (K, N)."""
    depth, d, m = w_in_t.shape
    v = head_t.shape[1]
    n = prompt.shape[0]
    x = np.empty((n, d), np.float32)
    xn = np.empty((n, d), np.float32)
    h = np.empty((n, m), np.float32)
    y = np.empty((n, d), np.float32)
    z = np.empty((n, v), np.float32)
    buf = np.empty(max(m, d, v) + 2, np.float64)
    zz = np.empty(v, np.float64)
    for i in range(n):
        for k in range(d):
            s = np.float32(tok[prev[i], k] + pos_t[pos[i], k])
            y[i, k] = s + prompt_t[prompt[i], k]
    K.round_into(y, x, buf, wp)
    for layer in range(depth):
        K.rms_rows(x, xn, buf, wp)
        K.gemm(xn, w_in_t[layer], h)
        K.round_into(h, h, buf, wp)
        for i in range(n):
            for j in range(m):
                if h[i, j] < 0:  # relu (the sign of a zero changes no later sum)
                    h[i, j] = 0.0
        K.gemm(h, w_out_t[layer], y)
        K.round_into(y, y, buf, wp)
        for i in range(n):
            for k in range(d):
                y[i, k] = x[i, k] + y[i, k]
        K.round_into(y, x, buf, wp)
    K.rms_rows(x, xn, buf, wp)
    K.gemm(xn, head_t, z)
    for i in range(n):
        for j in range(v):
            z[i, j] = z[i, j] + bias[j]
    K.round_into(z, z, buf, wp)
    for i in range(n):
        zmax = -np.inf
        for j in range(v):
            zmax = max(zmax, np.float64(z[i, j]))
        for j in range(v):
            zz[j] = np.float64(z[i, j]) - zmax
            buf[j] = K.exp64(zz[j])
        lse = K.log64(K.pairwise_sum(buf, v))
        for j in range(v):
            out[i, j] = np.float32(zz[j] - lse)


def kernel_weights(policy: Policy, precision: str, rounded_already: bool = False) -> tuple:
    """The policy's weights rounded to `precision` (float32 arrays), matrices transposed to (K, N)."""

    def rounded(t, transpose=False):
        a = t.detach().float().numpy()
        a = a if rounded_already else round_to(a, precision)
        return np.ascontiguousarray(a.swapaxes(-1, -2) if transpose else a)

    return (rounded(policy.tok), rounded(policy.pos), rounded(policy.prompt),
            rounded(policy.w_in, True), rounded(policy.w_out, True), rounded(policy.head, True),
            rounded(policy.bias))


def fused_logprobs(policy: Policy, prompt, prev, pos, precision: str,
                   weights: tuple | None = None) -> torch.Tensor:
    """log pi(. | rows) (N, V) in float32 from forward_kernel: the emulated forward without autograd."""
    # The policy is Markov in (prompt, prev, pos), and each row's arithmetic is independent of
    # the others: repeated states (every completion of a prompt at position 0, every
    # immediate EOS) are computed once and copied, bit for bit the same.
    wp = K.format_params(precision)
    rows = [np.asarray(i.numpy(), dtype=np.int64) for i in (prompt, prev, pos)]
    cfg = policy.cfg
    key = (rows[0] * (cfg.vocab + 1) + rows[1]) * cfg.max_len + rows[2]  # one id per state
    _, first, inverse = np.unique(key, return_index=True, return_inverse=True)
    out = np.empty((first.size, cfg.vocab), np.float32)
    if first.size:
        forward_kernel(*(np.ascontiguousarray(r[first]) for r in rows),
                       *(weights or kernel_weights(policy, precision)), wp, out)
    return torch.from_numpy(out[inverse.reshape(-1)])


def policy_logprobs(policy: Policy, prompt, prev, pos, precision: str = "fp32",
                    backend: str = "emulated") -> torch.Tensor:
    """log pi(. | rows) (N, V): the forward in `precision`, then a log-softmax in fp32 (as engines do)."""
    check_choice(precision, "precision", PRECISIONS)
    if backend == "native":
        return E.log_softmax(policy(prompt, prev, pos, precision, "native"),
                             emulated_precision("fp32", "native"))
    check_choice(backend, "backend", BACKENDS)
    if not torch.is_grad_enabled():
        return fused_logprobs(policy, prompt, prev, pos, precision)
    return E.log_softmax(policy(prompt, prev, pos, precision), _FP32)


def rounded_params(policy: Policy, precision: str) -> list[torch.Tensor]:
    """fl(W) for every trainable parameter (round to nearest even), stored in float32."""
    return [round_to(p.detach().float(), precision) for p in policy.parameters()]
