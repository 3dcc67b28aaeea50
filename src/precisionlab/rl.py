"""Precision mismatch in RL fine-tuning: a toy policy trained with GRPO against a low-precision
rollout engine, the alpha/beta split of the PPO log-ratio, phantom clipping and its fixes.

The pieces, bottom up:

* `Policy` — a small autoregressive model over a vocabulary with an end-of-sequence token.
  Its forward runs in fp32, bf16 or fp16 through `precisionlab.emulate`: every weight is
  rounded to the format where it is used, activations are stored in it, matrix products
  accumulate in fp32 in a fixed order and round once, norms and the log-softmax are
  evaluated in float64 and rounded once. That arithmetic is the same on every CPU and thread
  count, which a chaotic closed loop (sampling, then training on the samples) needs: one
  differing bit anywhere changes the sampled tokens and the whole run. The same semantics
  serve the rollout engine (weights stored in the low format), the trainer (fp32 master
  weights; gradients flow back through straight-through casts, as under autocast) and the
  shadow forward, so matched precisions give bit-identical log-probabilities. Without
  gradients a fused numba kernel computes exactly the same bits, fast; `backend="native"`
  runs torch's own kernels instead (what this machine's hardware gives).
* `Engine` — a synced low-precision copy of the weights that samples every completion of
  every group together, token by token.
* the GRPO pieces — group-normalised advantages, the clipped surrogate with separate lower and
  upper epsilon, the alpha/beta decomposition, phantom-versus-legitimate clipping, the
  four-pass gradient decomposition — and the interventions: ratio forced to 1, ratio from the
  shadow forward, wide epsilon, detached weights, detached and centred weights.
* `train` / `train_many` — the closed loop (generate, sync, score, update) with a per-step log.
* `save_runs` / `load_runs` / `find_stored` — per-step logs of runs too long for a chapter,
  stored under data/ by a script and replayed exactly by the tests.
* `SOURCE`, `reproduces`, `comparison_table` — the source study's figures (typed once, with
  their sections), one rule for "reproduces", and the table that sets the book beside them.

Every statistic the book prints (means, standard deviations, cosines) is taken in float64
with fixed-order sums (`emulate.fixed_sum`). No global state: every random draw takes an
explicit `torch.Generator`.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

import numba
import numpy as np
import torch

from . import emulate as E
from .checks import check_choice as _check_choice
from .checks import check_positive as _check_positive
from .emulate import _gemm_kernel
from .formats import get_format
from .rounding import round_to

__all__ = [
    "BACKENDS",
    "CLIP_CLASSES",
    "COMPARISON_HEADERS",
    "EOS",
    "MASTER_PRECISIONS",
    "PRECISIONS",
    "RATIO_MODES",
    "SOURCE",
    "VERDICTS",
    "WEIGHT_MODES",
    "Engine",
    "Evidence",
    "GradientDecomposition",
    "Policy",
    "PolicyConfig",
    "Rollout",
    "RunConfig",
    "RunLog",
    "SourceFigure",
    "beta_by_band",
    "beta_by_offset",
    "beta_table",
    "classify_clipping",
    "clipped",
    "comparison_table",
    "fcorr",
    "find_stored",
    "fmean",
    "four_pass_gradients",
    "fstd",
    "gradient_report",
    "group_advantages",
    "grows",
    "load_runs",
    "log_ratio_split",
    "logit_rounding_beta",
    "normal_outside",
    "policy_gradient",
    "policy_logprobs",
    "reproduces",
    "sample_tokens",
    "save_runs",
    "sequence_logprobs",
    "source_findings",
    "surrogate_loss",
    "tally",
    "token_weights",
    "train",
    "train_many",
    "train_seeds",
    "vocabulary_logprobs",
    "weight_mean",
    "with_changes",
]

PRECISIONS: tuple[str, ...] = ("fp32", "bf16", "fp16")
MASTER_PRECISIONS: tuple[str, ...] = ("fp32", "bf16")
BACKENDS: tuple[str, ...] = E.BACKENDS  # "emulated" (portable, the default) or "native" (torch's kernels)
_FMT = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}
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
    depth: int = 4  # residual MLP blocks
    logit_offset: float = 64.0  # common level of every logit: sets the bf16 spacing there
    logit_spread: float = 2.0  # std of the token-dependent part of the logits at init
    eos_logit: float = 4.0  # extra logit of EOS at init: sets how rarely the policy stops
    # Format the initial weights are stored in: "bf16" puts them on the bf16 grid, like a
    # checkpoint released in bf16, so that beta starts from activation rounding alone.
    checkpoint: str = "fp32"

    def __post_init__(self):
        for name in ("vocab", "n_prompts", "max_len", "width", "hidden", "depth"):
            v, low = getattr(self, name), 2 if name == "vocab" else 1
            if isinstance(v, bool) or not isinstance(v, int) or v < low:
                raise ValueError(f"{name} must be an integer >= {low}; got {name}={v!r}")
        _check_positive(self.logit_spread, "logit_spread")
        _check_choice(self.checkpoint, "checkpoint precision", PRECISIONS)
        for name in ("logit_offset", "eos_logit"):
            if not np.isfinite(getattr(self, name)):
                raise ValueError(f"{name} must be finite; got {name}={getattr(self, name)!r}")


class Policy(torch.nn.Module):
    """pi(a | prompt p, previous token, position t) = softmax(z), z = W_head RMSNorm(x_L) + b.

    x_0 = E_tok[prev] + E_pos[t] + E_prompt[p]; x_{l+1} = x_l + W_out,l relu(W_in,l RMSNorm(x_l)).
    The bias b is a fixed buffer, `logit_offset` for every token plus `eos_logit` for EOS. A
    common offset leaves the exact softmax unchanged but decides how coarse the bf16 grid is
    where the logits live. ReLU is exact in every format (it only compares and selects), so
    the hidden layer needs no rounding of its own.
    """

    def __init__(self, cfg: PolicyConfig, generator: torch.Generator):
        super().__init__()
        self.cfg = cfg
        d, m, n = cfg.width, cfg.hidden, cfg.depth

        def randn(*shape, std):
            return torch.nn.Parameter(_normal(shape, generator, std))

        self.tok = randn(cfg.vocab + 1, d, std=1.0)  # row `vocab` is the begin-of-sequence token
        self.pos = randn(cfg.max_len, d, std=1.0)
        self.prompt = randn(cfg.n_prompts, d, std=1.0)
        self.w_in = randn(n, m, d, std=(2 / d) ** 0.5)  # ReLU halves the variance: He init
        # Each block adds O(1/depth) variance, so the stream stays O(1) at any depth.
        self.w_out = randn(n, d, m, std=(m * n) ** -0.5)
        self.head = randn(cfg.vocab, d, std=cfg.logit_spread * d**-0.5)
        if cfg.checkpoint != "fp32":  # a checkpoint stored in a lower precision
            fmt = get_format(_FMT[cfg.checkpoint])
            for p in self.parameters():
                p.data = round_to(p.data, fmt)
        bias = torch.full((cfg.vocab,), float(cfg.logit_offset))
        bias[EOS] += cfg.eos_logit
        self.register_buffer("bias", bias)

    @property
    def bos(self) -> int:
        """Token id of begin-of-sequence, the `previous token` at position 0 (= vocab)."""
        return self.cfg.vocab

    def forward(self, prompt, prev, pos, precision: str = "fp32",
                backend: str = "emulated") -> torch.Tensor:
        """Logits z (float32 tensor holding values of `precision`) for rows (prompt, prev, pos).

        Each weight is rounded to the format where it is used (straight-through gradient);
        x_0 = fl(fl(E_tok) + fl(E_pos) + fl(E_prompt)) with the two adds in fp32; every linear
        layer accumulates in fp32 in a fixed order and rounds once (`emulate.linear`); RMSNorm
        is evaluated in float64 and rounded once; the residual add is an fp32 add rounded once.
        backend="native": the same graph on torch's own kernels in the format's dtype.
        """
        prec = _precision(precision, backend)
        x = E.cast(E.cast(_rows(self.tok, prev), prec) + E.cast(_rows(self.pos, pos), prec)
                   + E.cast(_rows(self.prompt, prompt), prec), prec)
        for layer in range(self.cfg.depth):
            h = torch.relu(E.linear(E.rms_norm(x, prec), self.w_in[layer], None, prec))
            x = E.cast(x + E.linear(h, self.w_out[layer], None, prec), prec)
        return E.linear(E.rms_norm(x, prec), self.head, self.bias, prec)


def _normal(shape, generator: torch.Generator, std: float = 1.0) -> torch.Tensor:
    """N(0, std^2) samples in float32 by Marsaglia's polar method from float64 uniforms.

    torch.randn is not portable: its vectorised Box-Muller (AVX2/AVX-512 sin, cos, log)
    gives other last bits than the scalar one under ATEN_CPU_CAPABILITY=default. Here u, v
    ~ U(-1, 1) come from torch.rand (exact scalings of random bits) and, for
    s = u^2 + v^2 in (0, 1), z = u sqrt(-2 ln(s) / s) with emulate.log64: +, -, *, /, sqrt only.
    """
    n = math.prod(shape)
    out, have = [], 0
    while have < n:
        m = max(8, n - have)  # pairs per round; about 79% are accepted
        u = torch.rand(2 * m, generator=generator, dtype=torch.float64) * 2.0 - 1.0
        u, v = u[:m], u[m:]
        s = u * u + v * v
        ok = (s > 0) & (s < 1)
        f = torch.sqrt(-2.0 * E.log64(s[ok]) / s[ok])
        z = torch.stack([u[ok] * f, v[ok] * f], 1).reshape(-1)
        out.append(z)
        have += z.numel()
    return (torch.cat(out)[:n] * std).to(torch.float32).reshape(shape)


def _precision(precision: str, backend: str = "emulated") -> E.Precision:
    """The emulate.Precision of a policy precision name (fp32/bf16/fp16), fp32 accumulation."""
    p = _check_choice(precision, "precision", PRECISIONS)
    return E.Precision(_FMT[p], "float32", _check_choice(backend, "backend", BACKENDS))


_FP32 = E.Precision("float32")


@numba.njit(cache=True)
def _scatter_rows(idx, g, out):  # pragma: no cover - compiled
    """out[idx[i]] += g[i] for i = 0, 1, ..., in this order (float64)."""
    for i in range(idx.shape[0]):
        r = idx[i]
        for j in range(g.shape[1]):
            out[r, j] = out[r, j] + g[i, j]


class _Rows(torch.autograd.Function):
    """y = T[idx]; dT = sum of dy over repeated indices, added in index order in float64, rounded to T's dtype."""

    @staticmethod
    def forward(ctx, table, idx):
        ctx.save_for_backward(idx)
        ctx.shape, ctx.dtype = table.shape, table.dtype
        return table[idx]

    @staticmethod
    def backward(ctx, g):
        (idx,) = ctx.saved_tensors
        out = np.zeros(tuple(ctx.shape), dtype=np.float64)
        _scatter_rows(np.ascontiguousarray(idx.numpy(), dtype=np.int64),
                      np.ascontiguousarray(g.detach().to(torch.float64).numpy()), out)
        return torch.from_numpy(out).to(ctx.dtype), None


def _rows(table: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    """table[idx] with a gradient that sums repeated rows in a fixed order (torch's may not)."""
    if not (torch.is_grad_enabled() and table.requires_grad):
        return table[idx]
    return _Rows.apply(table, idx)


# --------------------------------------------------------------------------- the fused forward
#
# Without gradients (rollouts, shadow forwards, scoring) one numba kernel computes what the
# emulate ops above compute, bit for bit: the same roundings, the same fp32 accumulation
# order in the matrix products, the same float64 formulas and pairwise sums in RMSNorm and
# the log-softmax. tests/test_rl.py holds the two paths equal on random policies.

_LN2_HI, _LN2_LO, _INV_LN2 = E._LN2_HI, E._LN2_LO, E._INV_LN2  # numba: compile-time constants
_SQRT_HALF = math.sqrt(0.5)
_EXP_C = np.array(E._EXP_COEF)
_LOG_C = np.array(E._LOG_COEF)
_POW2 = np.array([math.ldexp(1.0, k) for k in range(-600, 601)])  # 2^k, exact: emulate._pow2
_FMT_CODE = {"fp32": (24, -126, 3.4028234663852886e38), "bf16": (8, -126, 3.3895313892515355e38),
             "fp16": (11, -14, 65504.0)}


@numba.njit(cache=True)
def _rnd_slow(v, p, emin, vmax):  # pragma: no cover - compiled
    """v (float64) rounded to nearest even with p significant bits, normal exponents >= emin."""
    if v == 0.0 or not np.isfinite(v):
        return v
    _, e = math.frexp(v)
    q = max(e - 1, emin) - (p - 1)
    r = math.ldexp(np.rint(math.ldexp(v, -q)), q)
    if abs(r) > vmax:
        return math.copysign(np.inf, v)
    return r


@numba.njit(cache=True)
def _rnd_vec(buf, n, p, emin, vmax):  # pragma: no cover - compiled
    """buf[:n] = fl(buf[:n]) in place (float64), round to nearest even: the values round_to gives.

    Where the result is normal, add half an ulp minus one (plus the last kept bit, for ties
    to even) to the float64 bit pattern and clear the dropped bits; a carry moves into the
    exponent by itself. Subnormal results, zeros, inf and NaN take _rnd_slow.
    """
    bits = buf.view(np.int64)
    drop = 53 - p
    half = (np.int64(1) << (drop - 1)) - 1
    keep = ~((np.int64(1) << drop) - 1)
    for i in range(n):
        ex = ((bits[i] >> 52) & 0x7FF) - 1023
        if ex >= emin and ex < 1000:
            v = buf[i]
            bits[i] = (bits[i] + half + ((bits[i] >> drop) & 1)) & keep
            if abs(buf[i]) > vmax:
                buf[i] = math.copysign(np.inf, v)
        else:
            buf[i] = _rnd_slow(buf[i], p, emin, vmax)


@numba.njit(cache=True)
def _fsum(buf, n):  # pragma: no cover - compiled
    """emulate.fixed_sum of buf[:n] (overwrites buf): halves added pairwise, padded with 0 to even."""
    while n > 1:
        if n % 2:
            buf[n] = 0.0
            n += 1
        h = n // 2
        for i in range(h):
            buf[i] = buf[i] + buf[i + h]
        n = h
    return buf[0] if n == 1 else 0.0


@numba.njit(cache=True)
def _exp64(x, c):  # pragma: no cover - compiled
    """emulate.exp64, the same operations in the same order."""
    if np.isnan(x):
        return x
    if x > 709.8:
        return np.inf
    if x < -745.2:
        return 0.0
    n = min(max(np.rint(x * _INV_LN2), -1100.0), 1100.0)
    r = (x - n * _LN2_HI) - n * _LN2_LO
    p = c[c.shape[0] - 1]
    for k in range(c.shape[0] - 2, -1, -1):
        p = p * r + c[k]
    half = math.floor(n * 0.5)
    return p * _POW2[int(half) + 600] * _POW2[int(n - half) + 600]


@numba.njit(cache=True)
def _log64(x, c):  # pragma: no cover - compiled
    """emulate.log64 for finite x > 0, the same operations in the same order."""
    m, e = math.frexp(x)
    ef = np.float64(e)
    if m < _SQRT_HALF:
        m = m * 2.0
        ef = ef - 1.0
    s = (m - 1.0) / (m + 1.0)
    s2 = s * s
    p = c[c.shape[0] - 1]
    for k in range(c.shape[0] - 2, -1, -1):
        p = p * s2 + c[k]
    return ef * _LN2_HI + (ef * _LN2_LO + s * p)


@numba.njit(cache=True)
def _round_into(acc, out, buf, p, emin, vmax):  # pragma: no cover - compiled
    """out = fl(acc) elementwise (float32 arrays of one shape, buf a float64 scratch row)."""
    n, m = acc.shape
    for i in range(n):
        for j in range(m):
            buf[j] = np.float64(acc[i, j])
        _rnd_vec(buf, m, p, emin, vmax)
        for j in range(m):
            out[i, j] = np.float32(buf[j])


@numba.njit(cache=True)
def _rms_rows(x, out, buf, p, emin, vmax):  # pragma: no cover - compiled
    """out = fl(x / sqrt(fixed_sum(x^2) / d + 1e-6)) per row, float64 inside (emulate.rms_norm)."""
    n, d = x.shape
    for i in range(n):
        for k in range(d):
            buf[k] = np.float64(x[i, k]) * np.float64(x[i, k])
        r = 1.0 / math.sqrt(_fsum(buf, d) / d + 1e-6)
        for k in range(d):
            buf[k] = np.float64(x[i, k]) * r
        _rnd_vec(buf, d, p, emin, vmax)
        for k in range(d):
            out[i, k] = np.float32(buf[k])


@numba.njit(cache=True)
def _forward_kernel(prompt, prev, pos, tok, pos_t, prompt_t, w_in_t, w_out_t, head_t, bias,
                    p, emin, vmax, ec, lc, out):  # pragma: no cover - compiled
    """log_softmax(z) in fp32 for rows (prompt, prev, pos); weights already rounded to F, transposed (K, N).

    Matrix products use emulate's own kernel (fp32 products, sums over k in order), then one
    rounding to F; everything else repeats the emulate ops' float64 formulas and orders.
    """
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
    _round_into(y, x, buf, p, emin, vmax)
    for layer in range(depth):
        _rms_rows(x, xn, buf, p, emin, vmax)
        _gemm_kernel(xn, w_in_t[layer], h)
        _round_into(h, h, buf, p, emin, vmax)
        for i in range(n):
            for j in range(m):
                if h[i, j] < 0:  # relu (the sign of a zero changes no later sum)
                    h[i, j] = 0.0
        _gemm_kernel(h, w_out_t[layer], y)
        _round_into(y, y, buf, p, emin, vmax)
        for i in range(n):
            for k in range(d):
                y[i, k] = x[i, k] + y[i, k]
        _round_into(y, x, buf, p, emin, vmax)
    _rms_rows(x, xn, buf, p, emin, vmax)
    _gemm_kernel(xn, head_t, z)
    for i in range(n):
        for j in range(v):
            z[i, j] = z[i, j] + bias[j]
    _round_into(z, z, buf, p, emin, vmax)
    for i in range(n):
        zmax = -np.inf
        for j in range(v):
            zmax = max(zmax, np.float64(z[i, j]))
        for j in range(v):
            zz[j] = np.float64(z[i, j]) - zmax
            buf[j] = _exp64(zz[j], ec)
        lse = _log64(_fsum(buf, v), lc)
        for j in range(v):
            out[i, j] = np.float32(zz[j] - lse)


def _kernel_weights(policy: Policy, precision: str, rounded_already: bool = False) -> tuple:
    """The policy's weights rounded to `precision` (float32 arrays), matrices transposed to (K, N)."""
    fmt = _FMT[precision]

    def rounded(t, transpose=False):
        a = t.detach().float().numpy()
        a = a if rounded_already else round_to(a, fmt)
        return np.ascontiguousarray(a.swapaxes(-1, -2) if transpose else a)

    return (rounded(policy.tok), rounded(policy.pos), rounded(policy.prompt),
            rounded(policy.w_in, True), rounded(policy.w_out, True), rounded(policy.head, True),
            rounded(policy.bias))


def _fused_logprobs(policy: Policy, prompt, prev, pos, precision: str,
                    weights: tuple | None = None) -> torch.Tensor:
    """log pi(. | rows) (N, V) in float32 from the fused kernel: the emulated forward without autograd."""
    p, emin, vmax = _FMT_CODE[precision]
    out = np.empty((prompt.numel(), policy.cfg.vocab), np.float32)
    if prompt.numel():
        _forward_kernel(
            *(np.ascontiguousarray(i.numpy(), dtype=np.int64) for i in (prompt, prev, pos)),
            *(weights or _kernel_weights(policy, precision)), p, emin, vmax, _EXP_C, _LOG_C, out)
    return torch.from_numpy(out)


def policy_logprobs(policy: Policy, prompt, prev, pos, precision: str = "fp32",
                    backend: str = "emulated") -> torch.Tensor:
    """log pi(. | rows) (N, V): the forward in `precision`, then a log-softmax in fp32 (as engines do)."""
    _check_choice(precision, "precision", PRECISIONS)
    if backend == "native":
        return E.log_softmax(policy(prompt, prev, pos, precision, "native"),
                             E.Precision("float32", backend="native"))
    _check_choice(backend, "backend", BACKENDS)
    if not torch.is_grad_enabled():
        return _fused_logprobs(policy, prompt, prev, pos, precision)
    return E.log_softmax(policy(prompt, prev, pos, precision), _FP32)


def _round_params(policy: Policy, precision: str):
    """fl(W) for every trainable parameter (round to nearest even), stored in float32."""
    fmt = get_format(_FMT[precision])
    return [round_to(p.detach().float(), fmt) for p in policy.parameters()]


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

    def __init__(self, policy: Policy, precision: str = "bf16", backend: str = "emulated"):
        self.precision = _check_choice(precision, "engine precision", PRECISIONS)
        self.backend = _check_choice(backend, "backend", BACKENDS)
        self.model = copy.deepcopy(policy).requires_grad_(False)
        # The fixed logit bias is not trained: rounded once, here.
        self.model.bias.data = round_to(policy.bias.detach().float(), get_format(_FMT[precision]))
        self._load(_round_params(policy, precision))

    def _load(self, values) -> None:
        for p, v in zip(self.model.parameters(), values, strict=True):
            p.data = v
        self._weights = None  # the fused kernel's copy, made on first use

    def kernel_weights(self) -> tuple:
        """The fused kernel's copy of the engine's weights (already in the engine's format)."""
        if self._weights is None:
            self._weights = _kernel_weights(self.model, self.precision, rounded_already=True)
        return self._weights

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
            if self.backend == "native":
                logp = policy_logprobs(self.model, prompt[rows], prev[rows], pos, self.precision,
                                       "native")
            else:
                logp = _fused_logprobs(self.model, prompt[rows], prev[rows], pos, self.precision,
                                       self.kernel_weights())
            tok = sample_tokens(logp, generator)
            tokens[rows, t] = tok
            old_logp[rows, t] = logp.gather(1, tok[:, None]).squeeze(1)
            mask[rows, t] = True
            prev[rows] = tok
            rows = rows[tok != EOS]
            if rows.numel() == 0:
                break
        return Rollout(prompt, tokens, mask, old_logp, group_size)


@numba.njit(cache=True)
def _inverse_cdf(logp, u, ec, out):  # pragma: no cover - compiled
    """out[i] = first v with c_v > u_i c_last, c_v = p_0 + ... + p_v added left to right, p = exp64(logp)."""
    n, v = logp.shape
    cdf = np.empty(v, np.float64)
    for i in range(n):
        c = 0.0
        for j in range(v):
            c = c + _exp64(np.float64(logp[i, j]), ec)
            cdf[j] = c
        target = u[i] * cdf[v - 1]
        k = v - 1
        for j in range(v):
            if cdf[j] > target:
                k = j
                break
        out[i] = k


def sample_tokens(logp: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """One token per row by inverse CDF: the first v with sum_{u<=v} p_u > U * sum_u p_u, U ~ U[0, 1).

    p_u = exp64(logp_u) in float64, summed left to right, and U a float64 draw from
    `generator`: the same U picks the same token on every machine.
    """
    u = torch.rand(logp.shape[0], generator=generator, dtype=torch.float64)
    out = np.empty(logp.shape[0], np.int64)
    _inverse_cdf(np.ascontiguousarray(logp.detach().float().numpy()), u.numpy(), _EXP_C, out)
    return torch.from_numpy(out)


def sequence_logprobs(policy: Policy, rollout: Rollout, precision: str,
                      backend: str = "emulated") -> torch.Tensor:
    """log pi(a_t | s_t) of the rollout's tokens under `policy` in `precision`; (B, T), 0 off the mask."""
    # The policy is Markov in (prompt, previous token, position), so only completion tokens
    # need a forward: padding rows are never computed.
    prompt, prev, pos = (x[rollout.mask] for x in rollout.inputs(policy.bos))
    logp = policy_logprobs(policy, prompt, prev, pos, precision, backend)
    picked = logp.gather(-1, rollout.tokens[rollout.mask][:, None]).squeeze(-1)
    return torch.zeros(rollout.tokens.shape, dtype=picked.dtype).masked_scatter(rollout.mask,
                                                                                 picked)


@torch.no_grad()
def vocabulary_logprobs(policy: Policy, rollout: Rollout, precision: str,
                        backend: str = "emulated") -> torch.Tensor:
    """log pi(v | s_t) for every token v of the vocabulary at the rollout's states: (N tokens, V)."""
    prompt, prev, pos = (x[rollout.mask] for x in rollout.inputs(policy.bos))
    return policy_logprobs(policy, prompt, prev, pos, precision, backend)


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


# --------------------------------------------------------------------------- portable statistics


def fmean(x) -> float:
    """mean of every entry, in float64 with a fixed pairwise sum (the same digits on every machine)."""
    x = torch.as_tensor(x).detach().reshape(-1).to(torch.float64)
    return float(E.fixed_sum(x, 0)) / x.numel() if x.numel() else float("nan")


def fstd(x) -> float:
    """sample standard deviation sqrt(sum (x - mean)^2 / (n - 1)), float64 with fixed pairwise sums."""
    x = torch.as_tensor(x).detach().reshape(-1).to(torch.float64)
    if x.numel() < 2:
        return 0.0
    d = x - float(E.fixed_sum(x, 0)) / x.numel()
    return math.sqrt(float(E.fixed_sum(d * d, 0)) / (x.numel() - 1))


def fcorr(x, y) -> float:
    """Pearson r = sum dx dy / sqrt(sum dx^2 sum dy^2), d = deviation from the mean; float64, fixed sums (nan if either is constant)."""
    x = torch.as_tensor(x).detach().reshape(-1).to(torch.float64)
    y = torch.as_tensor(y).detach().reshape(-1).to(torch.float64)
    if x.numel() != y.numel() or x.numel() < 2:
        raise ValueError(f"x and y must hold the same number (>= 2) of values; got {x.numel()} "
                         f"and {y.numel()}")
    dx = x - float(E.fixed_sum(x, 0)) / x.numel()
    dy = y - float(E.fixed_sum(y, 0)) / y.numel()
    den = math.sqrt(float(E.fixed_sum(dx * dx, 0)) * float(E.fixed_sum(dy * dy, 0)))
    return float(E.fixed_sum(dx * dy, 0)) / den if den > 0 else float("nan")


def _prec_of(x: torch.Tensor) -> E.Precision:
    """float64 arithmetic for float64 tensors (the tests' oracles), fp32 otherwise."""
    return E.Precision("float64", "float64") if x.dtype == torch.float64 else _FP32


def _exp(x: torch.Tensor) -> torch.Tensor:
    """fl(e^x) in x's precision (fp32 or float64), e^x from emulate.exp64: portable, with autograd."""
    return E.exp(x, _prec_of(x))


def _sum(x: torch.Tensor) -> torch.Tensor:
    """sum of every entry by emulate.sum (fixed pairwise order), in x's precision, with autograd."""
    return E.sum(x, None, prec=_prec_of(x))


# --------------------------------------------------------------------------- GRPO algebra


def group_advantages(rewards: torch.Tensor, group_size: int, eps: float = 1e-4) -> torch.Tensor:
    """A_i = (R_i - mean_group R) / (std_group R + eps), sample std; rows grouped consecutively."""
    if rewards.ndim != 1 or group_size < 2 or rewards.numel() % group_size:
        raise ValueError(f"rewards must be 1-D with a multiple of group_size={group_size!r} (>= 2) "
                         f"entries; got shape {tuple(rewards.shape)}")
    # float64, fixed pairwise sums and IEEE sqrt: the same advantages on every machine.
    r = rewards.reshape(-1, group_size).to(torch.float64)
    d = r - E.fixed_sum(r, 1, keepdim=True) / group_size
    std = torch.sqrt(E.fixed_sum(d * d, 1, keepdim=True) / (group_size - 1))
    return (d / (std + eps)).reshape(-1).to(rewards.dtype)


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
    with torch.no_grad():
        actual = clipped(_exp(alpha + beta), adv, eps_low, eps_high)
        clean = clipped(_exp(alpha), adv, eps_low, eps_high)
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
    # exp and the sums go through emulate (exp64, fixed pairwise sums, one rounding), the
    # rest is elementwise IEEE arithmetic: the loss and its gradient are portable.
    m = mask.to(logp.dtype)
    n = m.sum().clamp(min=1)  # a count: exact in any order
    live = logp - logp.detach()  # zero in value; its gradient is the score function
    if ratio_mode == "actual":
        ratio = _exp(logp - old_logp)
    elif ratio_mode == "one":
        ratio = _exp(live)
    else:
        if shadow_logp is None:
            raise ValueError("ratio_mode='shadow' needs shadow_logp (the low-precision forward)")
        ratio = _exp(shadow_logp.detach() - old_logp + live)
    w = token_weights(ratio, adv, eps_low, eps_high)
    if weight_mode == "ppo":
        return -_sum(w * m) / n
    w = w.detach()
    if weight_mode == "detached_centered":
        w = w - _sum(w * m) / n
    return -_sum(w * logp * m) / n


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
    loss = -_sum(coeff.detach() * logp * m) / m.sum().clamp(min=1)
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
    with torch.no_grad():
        clean = a * _exp(alpha)
        actual = a * _exp(alpha + beta)
    return GradientDecomposition(
        clean_low=policy_gradient(policy, rollout, clean, low),
        clean_full=policy_gradient(policy, rollout, clean, full),
        actual_low=policy_gradient(policy, rollout, actual, low),
        actual_full=policy_gradient(policy, rollout, actual, full),
    )


def _dot(a: torch.Tensor, b: torch.Tensor) -> float:
    return float(E.fixed_sum(a.to(torch.float64) * b.to(torch.float64), 0))


def _norm(a: torch.Tensor) -> float:
    """|a| = sqrt(sum a_i^2), float64 with a fixed pairwise sum."""
    return math.sqrt(_dot(a, a))


def _cos(a: torch.Tensor, b: torch.Tensor) -> float:
    den = _norm(a) * _norm(b)
    return _dot(a, b) / den if den > 0 else float("nan")


def gradient_report(policy: Policy, rollout: Rollout, run: RunConfig) -> dict[str, float]:
    """Sizes and angles of the gradient errors that the precision gap causes, on one batch.

    Four passes without clipping: |d_ratio|/|g_clean|, |d_score|/|g_clean|, cos(d_ratio,
    d_score), cos(g_clean, g_actual). With clipping: cos between the loss gradient the trainer
    uses and the same loss computed in the engine's precision (beta = 0), and between it and
    the clean REINFORCE gradient -(1/N) sum A_t s_t in the engine's precision (ratio 1, no
    clipping: the source's reference). Cross-entropy
    (pretraining) for comparison: cos between the fp32 and low-precision gradients of the mean
    -log pi(a_t), where beta only shifts the loss. Where every advantage is 0 the policy-gradient
    entries are nan (the clean gradient is exactly 0).
    """
    adv = group_advantages(rollout.rewards, rollout.group_size)
    with torch.no_grad():
        shadow = sequence_logprobs(policy, rollout, run.engine)
        train_lp = sequence_logprobs(policy, rollout, run.trainer)
    alpha, beta = log_ratio_split(train_lp, shadow, rollout.old_logp)
    dec = four_pass_gradients(policy, rollout, adv, alpha, beta, low=run.engine, full=run.trainer)
    clean_norm = _norm(dec.clean_low)

    def loss_grad(precision: str) -> torch.Tensor:
        logp = sequence_logprobs(policy, rollout, precision)
        return _flat_grad(surrogate_loss(logp, rollout.old_logp, adv, rollout.mask, run.eps_low,
                                         run.eps_high, run.ratio_mode, run.weight_mode, shadow),
                          policy)

    ones = torch.ones_like(alpha)
    a_tok = adv[:, None].expand_as(alpha)
    used = loss_grad(run.trainer)
    # With every advantage 0 (a batch whose completions all earn the same reward) the clean
    # gradient is exactly 0 and every size and angle below is undefined: nan.
    rel = (lambda g: _norm(g) / clean_norm) if clean_norm > 0 else (lambda g: float("nan"))
    return {
        "ratio_error": rel(dec.d_ratio),
        "score_error": rel(dec.d_score),
        "cos_ratio_score": _cos(dec.d_ratio, dec.d_score),
        "cos_clean_actual": _cos(dec.clean_low, dec.actual_full),
        "cos_clipped": _cos(loss_grad(run.engine), used),
        "cos_reinforce": _cos(policy_gradient(policy, rollout, a_tok, run.engine), used),
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
                "mean_abs": fmean(beta.abs()),
                "mean": fmean(beta),
                "std": fstd(beta),
                "max_abs": float(beta.abs().max()),
                "beyond_0.2": fmean(beta.abs() > 0.2),
                "nonzero": fmean(beta != 0),
            }
    return out


@torch.no_grad()
def logit_rounding_beta(policy: Policy, rollout: Rollout, fmt="bfloat16") -> torch.Tensor:
    """beta from rounding only the logits: f(a; z) - f(a; fl(z)), z from the fp32 forward, per token (N,)."""
    prompt, prev, pos = (x[rollout.mask] for x in rollout.inputs(policy.bos))
    z = policy(prompt, prev, pos, "fp32")
    tok = rollout.tokens[rollout.mask][:, None]
    exact = E.log_softmax(z, _FP32).gather(1, tok)
    rounded = E.log_softmax(round_to(z, get_format(fmt)), _FP32).gather(1, tok)
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
        out["full"][i] = fmean(beta.abs())
        out["beyond"][i] = fmean(beta.abs() > 0.2)
        out["logits_only"][i] = fmean(logit_rounding_beta(policy, rollout, _FMT[engine]).abs())
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
    backend: str = "emulated"  # "native": torch's own kernels for the forwards and Adam

    def __post_init__(self):
        _check_choice(self.trainer, "trainer precision", PRECISIONS)
        _check_choice(self.engine, "engine precision", PRECISIONS)
        _check_choice(self.master, "master precision", MASTER_PRECISIONS)
        _check_choice(self.ratio_mode, "ratio_mode", RATIO_MODES)
        _check_choice(self.weight_mode, "weight_mode", WEIGHT_MODES)
        _check_choice(self.backend, "backend", BACKENDS)
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
        if self.backend != "emulated":
            parts.append(f"{self.backend} kernels")
        return ", ".join(parts)


STEP_FIELDS: tuple[str, ...] = (
    "reward", "clip", "phantom", "legitimate", "alpha_abs", "beta_abs", "beta_mean", "beta_std",
    "changed", "deployed", "moved", "kl", "beta_beyond", "beta_adv_corr",
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
    beta_beyond: np.ndarray  # fraction of tokens with |beta| > 0.2
    beta_adv_corr: np.ndarray  # Pearson correlation of beta_t and A_t over the tokens (nan if beta = 0)
    snapshots: dict = field(default_factory=dict)  # step -> per-token arrays (`record`)
    gradients: dict = field(default_factory=dict)  # step -> gradient_report (`gradients`)
    policy: Policy | None = None  # the trained policy

    def snr(self) -> np.ndarray:
        """Per step mean|alpha| / mean|beta| (the source's signal-to-noise ratio; inf where beta = 0)."""
        a, b = np.asarray(self.alpha_abs, np.float64), np.asarray(self.beta_abs, np.float64)
        out = np.full(a.shape, np.inf)
        np.divide(a, b, out=out, where=b > 0)
        return out

    def arrays(self) -> dict[str, np.ndarray]:
        """The per-step fields (STEP_FIELDS) as float64 arrays, e.g. to store a run."""
        return {k: np.asarray(getattr(self, k), dtype=np.float64) for k in STEP_FIELDS}

    def final_reward(self, last: int = 10) -> float:
        """Mean batch reward over the last `last` steps (float64, fixed-order sum)."""
        return fmean(self.reward[-last:])

    def steps_to(self, reward: float, window: int = 5) -> int | None:
        """First step at which the `window`-step moving average of the reward reaches `reward` (None: never)."""
        # Window sums by explicit adds in a fixed order (np.convolve may vectorise them).
        r = np.asarray(self.reward, dtype=np.float64)
        n = len(r) - window + 1
        if n < 1:
            return None
        total = np.zeros(n)
        for k in range(window):
            total = total + r[k:k + n]
        hit = np.nonzero(total >= reward * window)[0]
        return int(hit[0]) + window - 1 if hit.size else None


def _start(policy_cfg: PolicyConfig, run: RunConfig, seed: int):
    policy = Policy(policy_cfg, torch.Generator().manual_seed(seed))
    if run.backend == "native":
        if run.master != "fp32":
            # True low-precision weights: Adam's updates are computed and added in bf16.
            for p in policy.parameters():
                p.data = p.data.to(_DTYPE[run.master])
        # foreach=False keeps bf16 weights updated in bf16.
        opt = torch.optim.Adam(policy.parameters(), lr=run.lr, foreach=False)
        return policy, opt, Engine(policy, run.engine, "native")
    master = E.Precision(_FMT[run.master])
    with torch.no_grad():
        for p in policy.parameters():  # weights stored in the master format (float32 tensors)
            p.copy_(master.round(p))
    # Adam's step is about lr per weight whatever the gradient's size, so chapter 1's
    # boundary-crossing arithmetic applies. emulate.Adam: float64 inside, m, v and the
    # weights stored in the master format, the same bits on every machine.
    opt = E.Adam(policy.parameters(), lr=run.lr, prec=master)
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
        logp = sequence_logprobs(policy, rollout, run.trainer, run.backend)
        with torch.no_grad():
            if run.staleness and run.backend == "emulated":
                # The engine was just synced to fl(W_k): its weights are the shadow's.
                prompt, prev, pos = (x[rollout.mask] for x in rollout.inputs(policy.bos))
                lp = _fused_logprobs(policy, prompt, prev, pos, run.engine,
                                     engine.kernel_weights())
                picked = lp.gather(-1, rollout.tokens[rollout.mask][:, None]).squeeze(-1)
                shadow = torch.zeros(rollout.tokens.shape).masked_scatter(rollout.mask, picked)
            else:
                shadow = sequence_logprobs(policy, rollout, run.engine, run.backend)
        alpha, beta = log_ratio_split(logp.detach(), shadow, rollout.old_logp)
        loss = surrogate_loss(logp, rollout.old_logp, adv, rollout.mask, run.eps_low,
                              run.eps_high, run.ratio_mode, run.weight_mode, shadow)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if not run.staleness:
            log["changed"][step] = engine.sync(policy)
        with torch.no_grad():
            after = sequence_logprobs(policy, rollout, run.engine, run.backend)
        m = rollout.mask
        a_tok = adv[:, None].expand_as(m)
        used = {"actual": alpha + beta, "shadow": alpha, "one": torch.zeros_like(alpha)}
        dead = clipped(_exp(used[run.ratio_mode]), a_tok, run.eps_low, run.eps_high)
        if run.weight_mode != "ppo":
            dead = torch.zeros_like(dead)  # detached weights have no zero-gradient branch
        cls = classify_clipping(alpha, beta, a_tok, run.eps_low, run.eps_high)[m]
        delta = (after - shadow)[m]
        log["reward"][step] = fmean(rollout.rewards)
        log["clip"][step] = fmean(dead[m])
        log["phantom"][step] = fmean(cls == 1)
        log["legitimate"][step] = fmean(cls == 2)
        log["alpha_abs"][step] = fmean(alpha[m].abs())
        log["beta_abs"][step] = fmean(beta[m].abs())
        log["beta_mean"][step] = fmean(beta[m])
        log["beta_std"][step] = fstd(beta[m])
        log["deployed"][step] = fmean(delta * torch.sign(a_tok[m]))
        log["moved"][step] = fmean(delta.abs())
        a = alpha[m].to(torch.float64)
        log["kl"][step] = fmean(E.exp64(a) - 1 - a)
        log["beta_beyond"][step] = fmean(beta[m].abs() > 0.2)
        log["beta_adv_corr"][step] = fcorr(beta[m], a_tok[m])
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


def train_seeds(policy_cfg: PolicyConfig, runs: Mapping[str, RunConfig], seeds: Sequence[int],
                progress: bool = True, desc: str = "seeds", record: Sequence[int] = (),
                gradients: Sequence[int] = (),
                gradient_seeds: Sequence[int] | None = None) -> dict[int, dict[str, RunLog]]:
    """`train_many` for each seed (seed -> name -> RunLog), one progress bar: for results that are chaotic in the seed.

    record: as in `train`, for every seed (snapshots cost nothing); gradients: as in `train`,
    for the seeds in gradient_seeds only (default: the first seed; each report costs several
    backward passes).
    """
    from tqdm.auto import tqdm

    chosen = seeds[:1] if gradient_seeds is None else list(gradient_seeds)
    if not set(chosen) <= set(seeds):
        raise ValueError(f"gradient_seeds must be among seeds; got gradient_seeds={chosen!r}, "
                         f"valid choices: {list(seeds)!r}")

    out: dict[int, dict[str, RunLog]] = {}
    total = len(seeds) * sum(r.steps for r in runs.values())
    with tqdm(total=total, desc=desc, disable=not progress) as bar:
        for seed in seeds:
            out[seed] = {}
            for name, run in runs.items():
                bar.set_postfix_str(f"seed {seed}, {name}", refresh=False)
                out[seed][name] = _train(policy_cfg, run, seed, lambda _r: bar.update(),
                                         record, gradients if seed in chosen else ())
    return out


def with_changes(run: RunConfig, **changes) -> RunConfig:
    """A copy of `run` with the given fields changed (validated again)."""
    return replace(run, **changes)


# --------------------------------------------------------------------------- stored runs


def save_runs(path, logs: Mapping[int, Mapping[str, RunLog]], meta: Mapping) -> None:
    """Write runs to `path` (.json: meta, configs; beside it .npz: every STEP_FIELDS array, exact float64).

    logs: seed -> run name -> RunLog, every seed with the same run names and configs.
    """
    import json
    from dataclasses import asdict
    from pathlib import Path

    path = Path(path)
    seeds = sorted(logs)
    names = list(logs[seeds[0]])
    # One (fields, steps) float64 array per seed and run.
    arrays = {f"{seed}.{name}": np.stack(list(logs[seed][name].arrays().values()))
              for seed in seeds for name in names}
    np.savez_compressed(path.with_suffix(".npz"), **arrays)
    doc = {**meta, "seeds": seeds, "fields": list(STEP_FIELDS),
           "runs": {name: asdict(logs[seeds[0]][name].config) for name in names},
           "arrays": path.with_suffix(".npz").name}
    path.write_text(json.dumps(doc, indent=1, allow_nan=True) + "\n")


def load_runs(path) -> tuple[dict, dict[int, dict[str, RunLog]]]:
    """(meta, seed -> run name -> RunLog) from a file written by `save_runs` (no policies kept)."""
    import json
    from pathlib import Path

    path = Path(path)
    meta = json.loads(path.read_text())
    with np.load(path.parent / meta["arrays"]) as z:
        arrays = {k: z[k] for k in z.files}
    logs: dict[int, dict[str, RunLog]] = {}
    for seed in meta["seeds"]:
        logs[seed] = {}
        for name, cfg in meta["runs"].items():
            fields = dict(zip(meta["fields"], arrays[f"{seed}.{name}"], strict=True))
            logs[seed][name] = RunLog(config=RunConfig(**cfg), **fields)
    return meta, logs


def find_stored(name: str, start=None):
    """Path of data/<name> in the repository, looked for from `start` (default: the working directory) upwards.

    Where the repository is absent (e.g. on Colab, where only the package was installed from
    git), pip's record of the install (direct_url.json) says where it came from: a local
    clone's data/ is used as it is; from GitHub, the file and its .npz are downloaded at the
    recorded commit into a temporary directory.
    """
    import json
    import tempfile
    import urllib.parse
    from importlib import metadata
    from pathlib import Path

    here = Path(start or Path.cwd()).resolve()
    for d in (here, *here.parents):
        if (d / "data" / name).is_file():
            return d / "data" / name
    try:
        origin = json.loads(metadata.distribution("precisionlab").read_text("direct_url.json"))
    except (metadata.PackageNotFoundError, TypeError, ValueError):
        origin = {}
    url, commit = origin.get("url", ""), origin.get("vcs_info", {}).get("commit_id")
    if url.startswith("file://"):  # installed from a local clone: its data/ folder
        local = Path(urllib.parse.unquote(urllib.parse.urlparse(url).path)) / "data" / name
        if local.is_file():
            return local
    if not (url.startswith("https://github.com/") and commit):
        raise FileNotFoundError(f"data/{name} not found above {here}, and precisionlab was not "
                                f"installed from a GitHub repository; run the script that makes it "
                                f"(scripts/rl_source_regime.py for the chapter 6 runs)")
    import urllib.request

    raw = url.removesuffix(".git").replace("https://github.com/",
                                           "https://raw.githubusercontent.com/")
    out = Path(tempfile.gettempdir()) / "precisionlab-data" / commit
    out.mkdir(parents=True, exist_ok=True)
    for file in (name, str(Path(name).with_suffix(".npz"))):
        if not (out / file).is_file():
            urllib.request.urlretrieve(f"{raw}/{commit}/data/{file}", out / file)
    return out / name


# --------------------------------------------------------------------------- the source's figures


@dataclass(frozen=True)
class SourceFigure:
    """A figure the source reports (seed 001, the TRL precision-mismatch study): what, the value as printed, its section."""

    finding: str
    value: str
    section: str


# Typed once, from the source's text; citations, not results of this package.
SOURCE: dict[str, SourceFigure] = {
    "beta_std": SourceFigure("std of beta, fp32 trainer", "0.149", "6.2"),
    "beta_beyond": SourceFigure("P(|beta| > 0.2), fp32 trainer", "18% (Gaussian)", "10.3"),
    "clip_step3": SourceFigure("clipped at step 3, fp32 / bf16 trainer", "13.5% / 1.0%", "10.3"),
    "phantom_step5": SourceFigure("phantom / legitimate at step 5", "17.2% / 0.4%", "10.3"),
    "cos_ratio_score": SourceFigure("cos(dg_ratio, dg_score)", "-0.58", "7.5"),
    "first_sync": SourceFigure("bf16 weights changed, first sync", "0.96%", "6.6"),
    "sync_mean": SourceFigure("bf16 weights changed per sync, mean", "0.24-0.29%", "6.6"),
    "cos_reinforce": SourceFigure("cos(update, clean REINFORCE grad.)", "0.55-0.73", "8.4, 8.5"),
    "beta_growth": SourceFigure("std of beta, start -> later", "0.043 -> 0.244", "8.1"),
    "snr": SourceFigure("SNR mean|alpha| / mean|beta|", "2.82", "6.4"),
    "corr": SourceFigure("corr(beta, A)", "+0.002 -> +0.069", "8.1"),
    "deployed": SourceFigure("deployed improvement, bf16 / fp32", "+0.00128 / +0.00023", "6.5"),
    "converge_low": SourceFigure("low lr converges: bf16 / fp32 trainer", "yes / no", "1"),
    "converge_high": SourceFigure("10x lr converges: fp32 trainer", "yes", "1"),
    "bf16_weights": SourceFigure("bf16 weights converge: low / 10x lr", "no / yes", "1"),
    "fixes": SourceFigure("converge: eps = 10 / ratio from shadow", "yes / yes", "9.2, 10.1"),
    "rare": SourceFigure("median |beta|: rare / common tokens", "0.5-1.0 / 0.02", "8.2"),
    "alpha_early": SourceFigure("mean |alpha| early, bf16 / fp32 trainer", "0.035 / 0.035", "6.3"),
    "efficiency": SourceFigure("deployed / moved, bf16 / fp32 trainer", "8.2% / 1.3%", "7.7"),
    "cos_no_clip": SourceFigure("cos(clean, actual grad.), no clipping", "> 0.95", "7.5"),
    "beta_zero": SourceFigure("beta with matched precisions", "0 exactly", "6.2"),
    "mu_w": SourceFigure("mean token weight mu_W, bf16 / fp32", "-0.258 / -0.238", "10.2"),
}

def reproduces(book: float, source, direction: bool = False) -> str:
    """'yes' if book has the sign of `source` (a value or a (lo, hi) range) and lies within [min/2, 2 max] of its magnitudes; else 'partly' if `direction` (the source's direction holds); else 'no'."""
    lo, hi = source if isinstance(source, tuple) else (source, source)
    if lo * hi <= 0:
        raise ValueError(f"source must be a non-zero value or a range of one sign; got {source!r}")
    mags = sorted((abs(lo), abs(hi)))
    same_sign = math.isfinite(book) and book * lo > 0
    if same_sign and mags[0] / 2 <= abs(book) <= 2 * mags[1]:
        return "yes"
    return "partly" if direction else "no"


COMPARISON_HEADERS: tuple[str, ...] = ("finding", "source", "§", "this chapter", "reproduces",
                                       "source regime", "reproduces")


def comparison_table(rows: Mapping[str, Sequence[str]]):
    """A tables.Table: per SOURCE key in `rows`, the finding, the source's value and section, then the row's own cells."""
    from .tables import Table

    out = []
    for key, cells in rows.items():
        if key not in SOURCE:
            raise ValueError(f"unknown source finding {key!r}; valid choices: {', '.join(SOURCE)}")
        if len(cells) != len(COMPARISON_HEADERS) - 3:
            raise ValueError(f"row {key!r} needs {len(COMPARISON_HEADERS) - 3} cells "
                             f"({', '.join(COMPARISON_HEADERS[3:])}); got {len(cells)}")
        fig = SOURCE[key]
        out.append([fig.finding, fig.value, fig.section, *map(str, cells)])
    return Table(COMPARISON_HEADERS, out)


# --------------------------------------------------------------------------- judging the findings

VERDICTS: tuple[str, ...] = ("yes", "partly", "mixed", "no", "set", "untestable")


def normal_outside(mean: float, std: float, lo: float, hi: float) -> float:
    """P(X < lo) + P(X > hi) for X ~ N(mean, std^2) (math.erfc): a Gaussian estimate of a tail share."""
    _check_positive(std, "std")
    if not lo <= hi:
        raise ValueError(f"lo must not exceed hi; got lo={lo!r}, hi={hi!r}")
    z = math.sqrt(2.0) * std
    return 0.5 * math.erfc((mean - lo) / z) + 0.5 * math.erfc((hi - mean) / z)


def grows(early, late, z: float = 2.0) -> bool:
    """mean(late) - mean(early) > z sqrt(var(early)/n_e + var(late)/n_l): a rise beyond z standard errors."""
    e = np.asarray(early, dtype=np.float64).reshape(-1)
    lt = np.asarray(late, dtype=np.float64).reshape(-1)
    if e.size < 2 or lt.size < 2 or not (np.all(np.isfinite(e)) and np.all(np.isfinite(lt))):
        raise ValueError(f"early and late need >= 2 finite values each; got {e.size} and {lt.size}")
    se = math.sqrt(fstd(e) ** 2 / e.size + fstd(lt) ** 2 / lt.size)
    return fmean(lt) - fmean(e) > z * se


def weight_mean(snapshot: Mapping[str, np.ndarray], eps_low: float = 0.2,
                eps_high: float = 0.2) -> float:
    """mu_W = mean_t min(r_t A_t, clip(r_t) A_t), r_t = e^(alpha_t + beta_t), over a recorded step's tokens."""
    alpha, beta, adv = (torch.as_tensor(snapshot[k], dtype=torch.float64)
                        for k in ("alpha", "beta", "adv"))
    return fmean(token_weights(E.exp64(alpha + beta), adv, eps_low, eps_high))


@dataclass
class Evidence:
    """One configuration's measurements for `source_findings`, per seed (dicts keyed by seed).

    matched / mismatched: the bf16- and fp32-trainer RunLogs (bf16 engine). converge: steps to
    -2 per seed (lists in seed order) for "lr10", "bf16_weights", "bf16_weights_lr10",
    "fix_baseline" (the unfixed run the fixes are tried on), "eps10" and "shadow". window: the
    steps that match the source's 100-step runs; late: the steps standing for "later in
    training" (the source's step 50). gradients / matched_gradients: gradient_report dicts per
    seed and step (any seeds). rare: (rare, common) median |beta| on one seed's final policy,
    or None where the vocabulary has no rare entries; mu_w: per seed (matched, mismatched) mu_W,
    each a run's mean over its steps as the source reports it; calibrated: SOURCE keys whose
    value the configuration was chosen to give.
    """

    matched: Mapping[int, RunLog]
    mismatched: Mapping[int, RunLog]
    converge: Mapping[str, Sequence[int | None]]
    window: slice = field(default_factory=lambda: slice(None))
    late: slice = field(default_factory=lambda: slice(-10, None))
    gradients: Mapping[int, Mapping] = field(default_factory=dict)
    matched_gradients: Mapping[int, Mapping] = field(default_factory=dict)
    rare: tuple[float, float] | None = None
    mu_w: Mapping[int, tuple[float, float]] = field(default_factory=dict)
    calibrated: frozenset = frozenset()


def _both(verdicts: Sequence[str]) -> str:
    """Within one seed: yes if every part says yes; partly if every part says at least partly; else no."""
    if all(v == "yes" for v in verdicts):
        return "yes"
    return "partly" if all(v in ("yes", "partly") for v in verdicts) else "no"


def _across(verdicts: Sequence[str]) -> str:
    """Over seeds: yes if every seed says yes, partly if every seed at least partly, no if every seed no, else mixed."""
    if not verdicts:
        return "untestable"
    if all(v == "no" for v in verdicts):
        return "no"
    return _both(verdicts) if all(v in ("yes", "partly") for v in verdicts) else "mixed"


def _cap(verdict: str, measured: int, seeds: int) -> str:
    """A row measured on fewer seeds than the configuration has: yes becomes partly, no becomes mixed."""
    if measured >= seeds:
        return verdict
    return {"yes": "partly", "no": "mixed"}.get(verdict, verdict)


def _first(a: int | None, b: int | None) -> str:
    """One seed: yes if a reaches -2 and b never does (None); partly if b does, later than a; else no."""
    if a is None:
        return "no"
    if b is None:
        return "yes"
    return "partly" if b > a else "no"


def _show(xs: Sequence) -> str:
    return ",".join("-" if x is None else str(x) for x in xs)


def _ratio(a: float, b: float) -> float:
    return a / b if b else (math.inf if a > 0 else math.nan)


def _finite_mean(reports: Mapping, key: str, steps=None) -> float:
    """Mean of reports[step][key] over `steps` (default all) where it is finite; nan if none is."""
    vals = [r[key] for step, r in reports.items()
            if (steps is None or step in steps) and math.isfinite(r[key])]
    return fmean(vals) if vals else math.nan


def source_findings(ev: Evidence) -> dict[str, tuple[str, str]]:
    """(text, verdict) for every SOURCE finding, judged on every seed of one configuration.

    Each seed compares the book's value with the source's by `reproduces`; a row is yes if every
    seed reproduces it, partly if on every seed at least the source's direction holds, no if no
    seed shows even the direction, and mixed if the seeds disagree. A seed where the quantity
    is undefined (every advantage 0 once a run has converged) is left out; a row measured on
    fewer seeds than the configuration has (gradient reports, the rare-token bands) is at most
    partly and never no. Rows in ev.calibrated read "set", rows the configuration cannot
    measure "untestable". Contrasts compare the right baseline: the cosine with the matched
    run's, a fix with the unfixed run it is tried on; a correlation must rise beyond two
    standard errors.
    """
    seeds = sorted(ev.mismatched)
    M, Mt = [ev.mismatched[s] for s in seeds], [ev.matched[s] for s in seeds]
    w, late = ev.window, ev.late
    out: dict[str, tuple[str, str]] = {}

    def per_seed(key, vals, fmt, source, dirs=None):
        dirs = dirs if dirs is not None else [False] * len(vals)
        verdict = _across([reproduces(v, source, d) for v, d in zip(vals, dirs, strict=True)])
        out[key] = (", ".join(format(v, fmt) for v in vals), verdict)

    per_seed("beta_std", [fmean(m.beta_std[w]) for m in M], ".3f", 0.149)
    per_seed("beta_beyond", [fmean(m.beta_beyond[w]) for m in M], ".1%", 0.18)
    c3 = [(m.clip[3], t.clip[3]) for m, t in zip(M, Mt, strict=True)]
    out["clip_step3"] = ("; ".join(f"{a:.1%}/{b:.1%}" for a, b in c3), _across(
        [reproduces(_ratio(a, b), 13.5, direction=a > b) for a, b in c3]))
    p5 = [(m.phantom[5], m.legitimate[5]) for m in M]
    out["phantom_step5"] = ("; ".join(f"{a:.1%}/{b:.1%}" for a, b in p5), _across(
        [reproduces(_ratio(a, b), 17.2 / 0.4, direction=a > b) for a, b in p5]))
    per_seed("first_sync", [m.changed[1] for m in M], ".2%", 0.0096)
    per_seed("sync_mean", [fmean(m.changed[w][1:]) for m in M], ".2%", (0.0024, 0.0029))
    growth = [(m.beta_std[0], fmean(m.beta_std[late])) for m in M]
    out["beta_growth"] = ("; ".join(f"{a:.3f}>{b:.3f}" for a, b in growth), _across(
        [reproduces(_ratio(b, a), 0.244 / 0.043, direction=b > a) for a, b in growth]))
    per_seed("snr", [fmean(m.snr()[w][1:]) for m in M], ".2f", 2.82)
    # corr(beta, A) is undefined (nan) at a step whose advantages are all 0: a seed with
    # such a step in either window cannot say whether the correlation rises.
    corr = [(m.beta_adv_corr[slice(0, 10)], m.beta_adv_corr[late]) for m in M]
    defined = [bool(np.all(np.isfinite(a)) and np.all(np.isfinite(b))) for a, b in corr]
    cv = [reproduces(fmean(b), 0.069, direction=True) if grows(a, b) else "no"
          for (a, b), d in zip(corr, defined, strict=True) if d]
    out["corr"] = ("; ".join(f"{fmean(a):+.3f}>{fmean(b):+.3f}" if d else
                             f"{fmean(a):+.3f}>nan" for (a, b), d in zip(corr, defined, strict=True)),
                   _across(cv))
    dep = [_ratio(fmean(t.deployed[w]), fmean(m.deployed[w])) for m, t in zip(M, Mt, strict=True)]
    per_seed("deployed", dep, ".2f", 0.00128 / 0.00023, [d > 1 for d in dep])
    out["deployed"] = (", ".join(f"{d:.2f}x" for d in dep), out["deployed"][1])
    eff = [(_ratio(fmean(t.deployed[w]), fmean(t.moved[w])),
            _ratio(fmean(m.deployed[w]), fmean(m.moved[w]))) for m, t in zip(M, Mt, strict=True)]
    out["efficiency"] = ("; ".join(f"{a:.1%}/{b:.1%}" for a, b in eff), _across(
        [reproduces(_ratio(a, b), 8.2 / 1.3, direction=a > b) for a, b in eff]))
    early_alpha = slice(1, 6)
    al = [(fmean(t.alpha_abs[early_alpha]), fmean(m.alpha_abs[early_alpha]))
          for m, t in zip(M, Mt, strict=True)]
    out["alpha_early"] = ("; ".join(f"{a:.3f}/{b:.3f}" for a, b in al), _across(
        [_both([reproduces(a, 0.035), reproduces(b, 0.035)]) for a, b in al]))
    zero = [float(np.max(np.abs(t.beta_abs))) for t in Mt]
    out["beta_zero"] = (", ".join(f"{z:g}" for z in zero),
                        _across(["yes" if z == 0 else "no" for z in zero]))

    # gradient reports: per seed, the mean over its reported steps where the value is defined
    g = {s: ev.gradients[s] for s in seeds if s in ev.gradients}
    crs = {s: _finite_mean(g[s], "cos_ratio_score") for s in g}
    crs = {s: c for s, c in crs.items() if math.isfinite(c)}
    out["cos_ratio_score"] = (", ".join(f"{c:+.2f}" for c in crs.values()) or "-", _cap(_across(
        [reproduces(c, -0.58, direction=c < 0) for c in crs.values()]), len(g), len(seeds)))
    nc = {s: _finite_mean(g[s], "cos_clean_actual") for s in g}
    nc = {s: c for s, c in nc.items() if math.isfinite(c)}
    out["cos_no_clip"] = (", ".join(f"{c:.3f}" for c in nc.values()) or "-", _cap(_across(
        ["yes" if c > 0.95 else "no" for c in nc.values()]), len(g), len(seeds)))
    # The cosine with the clean REINFORCE gradient, matched against mismatched, over the steps
    # reported for both where both are defined. The size of the effect is the drop below the
    # matched run's cosine, against the source's 1 - cos (its matched run is its clean
    # reference); a drop under a tenth of the source's smallest is no evidence of the direction.
    pairs, reported = {}, [s for s in g if s in ev.matched_gradients]
    for s in reported:
        mg = ev.matched_gradients[s]
        both = [k for k in g[s] if k in mg and math.isfinite(g[s][k]["cos_reinforce"])
                and math.isfinite(mg[k]["cos_reinforce"])]
        if both:
            pairs[s] = (_finite_mean(mg, "cos_reinforce", both),
                        _finite_mean(g[s], "cos_reinforce", both))
    out["cos_reinforce"] = ("; ".join(f"{a:.3f}/{b:.3f}" for a, b in pairs.values()) or "-",
                            _cap(_across([reproduces(a - b, (0.27, 0.45), direction=a - b > 0.027)
                                          for a, b in pairs.values()]), len(reported), len(seeds)))
    # mu_W: the source's claim is that it is the same with and without beta (within 10%, its
    # own gap), near -0.24; the same but at another level is partly.
    mu = [ev.mu_w[s] for s in seeds if s in ev.mu_w]
    out["mu_w"] = ("; ".join(f"{a:+.3f}/{b:+.3f}" for a, b in mu) or "-", _cap(_across(
        [("yes" if _both([reproduces(a, -0.258), reproduces(b, -0.238)]) == "yes" else "partly")
         if abs(b - a) <= 0.1 * abs(a) else "no" for a, b in mu]), len(mu), len(seeds)))

    # convergence, per seed; a fix must rescue (or at least speed up) its unfixed run
    m = [t.steps_to(-2.0) for t in Mt]
    mm = [t.steps_to(-2.0) for t in M]
    c = ev.converge
    out["converge_low"] = (f"{_show(m)} / {_show(mm)}",
                           _across([_first(x, y) for x, y in zip(m, mm, strict=True)]))
    out["converge_high"] = (_show(c["lr10"]),
                            _across(["no" if x is None else "yes" for x in c["lr10"]]))
    bw, bw10 = c["bf16_weights"], c["bf16_weights_lr10"]
    out["bf16_weights"] = (f"{_show(bw)} / {_show(bw10)}",
                           _across([_first(x10, x) for x, x10 in zip(bw, bw10, strict=True)]))
    base = c["fix_baseline"]
    out["fixes"] = (f"{_show(c['eps10'])} / {_show(c['shadow'])} (unfixed {_show(base)})",
                    _across([_both([_first(e, b), _first(sh, b)])
                             for e, sh, b in zip(c["eps10"], c["shadow"], base, strict=True)]))
    # rare tokens: bands measured on one seed's final policy
    if ev.rare is None or not all(math.isfinite(x) for x in ev.rare):
        out["rare"] = ("no entries" if ev.rare is None else
                       " / ".join("-" if not math.isfinite(x) else f"{x:.3f}" for x in ev.rare),
                       "untestable")
    else:
        r, cm = ev.rare
        out["rare"] = (f"{r:.3f} / {cm:.3f}", _cap(
            reproduces(_ratio(r, cm), (25.0, 50.0), direction=r > cm), 1, len(seeds)))
    for key in ev.calibrated:
        if key not in SOURCE:
            raise ValueError(f"unknown source finding {key!r}; valid choices: {', '.join(SOURCE)}")
        out[key] = (out[key][0], "set")
    return {k: out[k] for k in SOURCE}


def tally(rows: Mapping[str, tuple[str, str]]) -> dict[str, int]:
    """How many rows got each verdict; 'set' and 'untestable' rows are counted apart, not as evidence."""
    return {v: sum(r[1] == v for r in rows.values()) for v in VERDICTS}
