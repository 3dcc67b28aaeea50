"""Kernels whose reduction strategy depends on the batch shape, and a greedy decoder they change.

A GPU matmul library picks its tiling by the problem's shape. When the batch is small the
output has few tiles, too few to keep every streaming multiprocessor busy, so the library
splits the k dimension as well (split-K) and adds the partial sums afterwards; at a large
batch it does not need to. The split changes the order of the additions, so the *same row*
of the output gets other bits at batch 1 than at batch 64, although no row ever looks at
another (He and Thinking Machines Lab 2025). `splits_for_batch` is such a heuristic, stated
exactly: output tiles of `tile` x `tile`, and the largest power of two up to `max_splits`
that keeps tiles x splits within `units` parallel units. A batch-invariant kernel uses one
strategy for every shape (`invariant_splits`), at the cost of fewer independent partial sums
at small batches (`partial_sums`).

A row-wise reduction has the same choice. `rms_norm` sums each row's squares with one
thread block per row; `row_splits_for_batch` splits every row's sum over more blocks when
the batch has fewer rows than the GPU has parallel units (`units`), so batch 1 adds the same
row's squares in another order than batch 64. `invariant=True` uses one split at every batch.

`decode` runs a tiny recurrent language model greedily, every matmul through such a kernel:
bfloat16 operands and results, float32 accumulation, one rounding per add (`Kernel`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..checks import check_positive_int
from ..rounding import round_to
from .arith import CONVERT_NUMPY_MAX
from .kernel import Kernel, run_matmul
from .reductions import reduce_sum

__all__ = [
    "TinyDecoder",
    "batch_kernel",
    "decode",
    "partial_sums",
    "rms_norm",
    "row_splits_for_batch",
    "score",
    "splits_for_batch",
]


def splits_for_batch(batch: int, n_out: int, *, tile: int = 16, units: int = 32,
                     max_splits: int = 8) -> int:
    """Split-K factor: the largest power of two s <= max_splits with tiles(batch, n_out) * s <= units."""
    b = check_positive_int(batch, "batch")
    n = check_positive_int(n_out, "n_out")
    tiles = -(-b // tile) * -(-n // tile)
    s = 1
    while s * 2 <= max_splits and tiles * s * 2 <= units:
        s *= 2
    return s


def row_splits_for_batch(batch: int, *, units: int = 64, max_splits: int = 8) -> int:
    """Blocks per row: the largest power of two s <= max_splits with batch * s <= units."""
    b = check_positive_int(batch, "batch")
    s = 1
    while s * 2 <= check_positive_int(max_splits, "max_splits") \
            and b * s * 2 <= check_positive_int(units, "units"):
        s *= 2
    return s


def _fl32(a) -> np.ndarray:
    return np.asarray(round_to(np.asarray(a, dtype=np.float64), "float32"), dtype=np.float64)


def rms_norm(x, *, eps: float = 1e-6, invariant: bool = False,
             splits: int | None = None) -> np.ndarray:
    """y = fl32(x * fl32(1 / fl32(sqrt(fl32(fl32(S / n) + eps))))) per row, in float32.

    x: (batch, n) array of float32 values. S, the row's sum of squares fl32(x_j^2), is added
    in float32 in `splits` consecutive chunks, each summed sequentially, then the chunk sums
    in order (reduce_sum's split_k; 1: sequential); splits = row_splits_for_batch(batch)
    unless invariant (1 at every batch) or given. Every operation is rounded once (float64
    then float32 is exact rounding for these), so the bits are the same on every machine.
    """
    a = np.asarray(x, dtype=np.float64)
    if a.ndim != 2 or a.size == 0:
        raise ValueError(f"x must be a non-empty (batch, n) array; got shape {a.shape}")
    a = _fl32(a)
    if splits is not None:
        s = check_positive_int(splits, "splits")
    else:
        s = 1 if invariant else row_splits_for_batch(a.shape[0])
    sq = _fl32(a * a)
    ssum = reduce_sum(sq, "sequential" if s == 1 else "split_k", "float32", splits=s)
    ms = _fl32(_fl32(np.asarray(ssum) / a.shape[1]) + float(_fl32(eps)))
    inv = _fl32(1.0 / _fl32(np.sqrt(ms)))
    return _fl32(a * inv[:, None])


def partial_sums(batch: int, n_out: int, splits: int) -> int:
    """Independent partial sums the kernel runs in parallel: batch x n_out x splits."""
    return batch * n_out * splits


def batch_kernel(splits: int, acc: str = "float32", inputs: str | None = None,
                 out: str = "bfloat16") -> Kernel:
    """The matmul kernel for a split: split_k with `splits` chunks, or sequential for 1."""
    if splits == 1:
        return Kernel(order="sequential", acc=acc, inputs=inputs, out=out)
    return Kernel(order="split_k", acc=acc, inputs=inputs, out=out, splits=splits)


@dataclass(frozen=True)
class TinyDecoder:
    """h_t = softsign(fl32(h_{t-1} W) + E[token]) in float32; logits = fl_bf16(h_t U); argmax next.

    The state's dynamics are chaotic (gain 6): a one-ulp difference in h grows until it
    changes a token, as rounding differences do in a deep model's many layers.
    """

    embed: np.ndarray  # (vocab, d)
    w: np.ndarray  # (d, d)
    u: np.ndarray  # (d, vocab)

    @classmethod
    def random(cls, vocab: int = 32, d: int = 64, seed: int = 0, gain: float = 6.0,
               embed_scale: float = 0.1) -> TinyDecoder:
        """Weights drawn from default_rng(seed), rounded to bfloat16; gain > 1 makes the state chaotic."""
        rng = np.random.default_rng(seed)

        def bf(a):  # each weight rounded once: NumPy's tier up to CONVERT_NUMPY_MAX, no compile
            return np.asarray(round_to(a, "bfloat16", compiled=a.size > CONVERT_NUMPY_MAX),
                              dtype=np.float64)

        return cls(bf(rng.standard_normal((vocab, d)) * embed_scale), bf(rng.standard_normal((d, d)) * gain / d**0.5),
                   bf(rng.standard_normal((d, vocab)) * 2.0 / d**0.5))


def _softsign(x: np.ndarray) -> np.ndarray:
    """x / (1 + |x|) rounded to float32 (IEEE division: the same bits on every CPU)."""
    return np.asarray(round_to(x / (1.0 + np.abs(x)), "float32"), dtype=np.float64)


def _tokens(model: TinyDecoder, tokens, name: str) -> np.ndarray:
    """tokens as an int64 array, every entry an integer token id 0 <= id < vocab."""
    t = np.asarray(tokens)
    vocab = model.embed.shape[0]
    if t.size and not np.issubdtype(t.dtype, np.integer):
        if not np.issubdtype(t.dtype, np.number) or np.any(t != np.round(t)):
            raise ValueError(f"{name} must hold integer token ids; got dtype {t.dtype}")
    t = t.astype(np.int64)
    if t.size and (t.min() < 0 or t.max() >= vocab):
        raise ValueError(f"{name} must hold token ids 0 <= id < vocab={vocab}; "
                         f"got ids from {t.min()} to {t.max()}")
    return t


def decode(model: TinyDecoder, prompts, steps: int = 32, *, invariant: bool = False,
           splits: int | None = None, out: str = "float32") -> np.ndarray:
    """Greedy completions (batch, steps) of the prompts (batch, length), served as one batch.

    Every matmul runs through batch_kernel(s): s = splits_for_batch(batch, n_out) unless
    invariant (s = 1 at every batch size) or `splits` is given.
    """
    p = _tokens(model, prompts, "prompts")
    if p.ndim != 2 or p.size == 0:
        raise ValueError(f"prompts must be a non-empty (batch, length) array; got shape {p.shape}")
    steps = check_positive_int(steps, "steps")
    if splits is not None:
        splits = check_positive_int(splits, "splits")
    b = p.shape[0]

    def mm(a, m, out):
        s = 1 if invariant else (splits if splits is not None else splits_for_batch(b, m.shape[1]))
        return run_matmul(a, m, batch_kernel(s, out=out))

    completions, _ = _run(model, p, steps, None, mm, out)
    return completions


def _run(model, p, steps, forced, mm, out):
    """The recurrence over prompt and completion: greedy tokens, or `forced` ones, and their logits."""
    b, d = p.shape[0], model.w.shape[0]
    h = np.zeros((b, d))
    tokens = np.empty((b, steps), dtype=np.int64)
    logits = np.empty((b, steps, model.u.shape[1]))
    tok = p[:, 0]
    for t in range(p.shape[1] + steps - 1):
        h = _softsign(mm(h, model.w, out) + model.embed[tok])
        if t + 1 < p.shape[1]:
            tok = p[:, t + 1]
            continue
        k = t + 1 - p.shape[1]
        logits[:, k] = mm(h, model.u, "bfloat16")
        tok = np.argmax(logits[:, k], axis=1) if forced is None else forced[:, k]
        tokens[:, k] = tok  # greedy ties: the lowest token id
    return tokens, logits


def score(model: TinyDecoder, prompts, completions, *, micro_batch: int | None = None,
          invariant: bool = False) -> np.ndarray:
    """log p(completion token) at every step, as a trainer recomputes it (teacher forcing).

    The sequences are scored in micro-batches of `micro_batch` rows (default: all at once),
    each with the kernels its own batch size picks (or one split for all, if invariant);
    log-softmax of the bfloat16 logits in float64. Returns (batch, steps).
    """
    p = _tokens(model, prompts, "prompts")
    c = _tokens(model, completions, "completions")
    if p.ndim != 2 or c.ndim != 2 or p.shape[0] != c.shape[0]:
        raise ValueError(f"prompts and completions must be (batch, length) arrays of one batch; "
                         f"got shapes {p.shape} and {c.shape}")
    mb = p.shape[0] if micro_batch is None else check_positive_int(micro_batch, "micro_batch")
    out = []
    for i in range(0, p.shape[0], mb):
        pi, ci = p[i:i + mb], c[i:i + mb]

        def mm(a, m, fmt, b=pi.shape[0]):
            s = 1 if invariant else splits_for_batch(b, m.shape[1])
            return run_matmul(a, m, batch_kernel(s, out=fmt))

        _, logits = _run(model, pi, ci.shape[1], ci, mm, "float32")
        top = logits.max(axis=2, keepdims=True)
        lse = top[..., 0] + np.log(np.exp(logits - top).sum(axis=2))
        out.append(np.take_along_axis(logits, ci[..., None], axis=2)[..., 0] - lse)
    return np.concatenate(out)
