"""The policy's log-probabilities: the emulate ops under autograd, or one fused numba kernel without.

Without gradients (rollouts, shadow forwards, scoring) `forward_kernel` computes what the
emulate ops of Policy.forward and emulate.log_softmax compute, bit for bit: the same
roundings, the same fp32 accumulation order in the matrix products, the same float64
formulas and pairwise sums in RMSNorm and the log-softmax. It is built from emulate.kernels,
the compiled twins of emulate's arithmetic; tests/test_rl.py holds the two paths equal.
It takes one row at a time through the forward's stages, one rounding site and one
matrix-product loop for all of them: a small function, which numba compiles in about half
the time of one calling a kernel per operation (the first rollout of a cold start waits
for it).
"""

from __future__ import annotations

import math

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
def forward_kernel(rows, tok, pos_t, prompt_t, w_in_t, w_out_t, head_t, bias, wp, out,
                   scratch, buf):  # pragma: no cover - compiled
    """out = log_softmax(z) in fp32 for rows = (prompt, prev, pos) (3, N); weights already in F, matrices transposed (K, N).

    scratch: float32 (3, W) and buf: float64 (W + 2), W = max(width, hidden, vocab). Each row
    runs through the forward's stages in order, every stage one rounding of a float64 row:
    0 the embedding sum; per block 1 RMSNorm, 2 the hidden layer (then ReLU), 3 the output
    layer, 4 the residual add; then RMSNorm and the head. One compiled rounding site and one
    matrix-product loop serve every stage (what keeps the compile short). The rows' operations
    are those of `emulate.kernels`' round_into, rms_rows and gemm, row by row.
    """
    depth, d = w_in_t.shape[:2]
    v = head_t.shape[1]
    x, a, acc = scratch[0], scratch[1], scratch[2]  # stream; input row of a product; output
    last = 4 * depth + 2
    for i in range(rows.shape[1]):
        for s in range(last + 1):
            kind = 0 if s == 0 else (5 if s == last else (s - 1) % 4 + 1)
            n = d
            if kind == 0:  # x_0 = fl(fl(E_tok) + fl(E_pos) + fl(E_prompt)), fp32 adds
                for k in range(d):
                    e = np.float32(tok[rows[1, i], k] + pos_t[rows[2, i], k])
                    buf[k] = np.float64(e + prompt_t[rows[0, i], k])
            elif kind == 1:  # RMSNorm of x in float64
                for k in range(d):
                    buf[k] = np.float64(x[k]) * np.float64(x[k])
                r = 1.0 / math.sqrt(K.pairwise_sum(buf, d) / d + 1e-6)
                for k in range(d):
                    buf[k] = np.float64(x[k]) * r
            elif kind == 4:  # x + y in fp32
                for k in range(d):
                    buf[k] = np.float64(np.float32(x[k] + acc[k]))
            else:  # a row times a matrix: fp32 sums over k in order, no FMA (K.gemm's)
                layer = (s - 1) // 4
                w = w_in_t[layer] if kind == 2 else (w_out_t[layer] if kind == 3 else head_t)
                n = w.shape[1]
                for j in range(n):
                    acc[j] = 0.0
                for p in range(w.shape[0]):
                    ap = a[p]
                    for j in range(n):
                        acc[j] = acc[j] + ap * w[p, j]
                if kind == 5:
                    for j in range(n):
                        acc[j] = acc[j] + bias[j]
                for j in range(n):
                    buf[j] = np.float64(acc[j])
            for j in range(n):  # the stage's one rounding
                buf[j] = K.round_scalar(buf[j], wp)
            dest = x if kind == 0 or kind == 4 else (a if kind <= 2 else acc)
            for j in range(n):
                dest[j] = np.float32(buf[j])
                if kind == 2 and dest[j] < 0:  # relu (the sign of a zero changes no later sum)
                    dest[j] = 0.0
        zmax = -np.inf  # log-softmax of z = acc[:v], float64 (emulate.log_softmax's)
        for j in range(v):
            zmax = max(zmax, np.float64(acc[j]))
        for j in range(v):
            buf[j] = K.exp64(np.float64(acc[j]) - zmax)
        lse = K.log64(K.pairwise_sum(buf, v))
        for j in range(v):
            out[i, j] = np.float32((np.float64(acc[j]) - zmax) - lse)


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
        w = max(cfg.width, cfg.hidden, cfg.vocab)
        forward_kernel(np.stack([r[first] for r in rows]),
                       *(weights or kernel_weights(policy, precision)), wp, out,
                       np.empty((3, w), np.float32), np.empty(w + 2))
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
