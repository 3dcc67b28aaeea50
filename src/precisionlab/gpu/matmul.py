"""Matrix products under a device profile, idealised: every accumulation rounded once.

C[i, j] = fl_out(s) where, for each of `splits` consecutive k-chunks, the chunk's products
a_ik * b_kj (exact: the operands have at most 24 significant bits) are added one by one into
the profile's accumulator, acc = fl_acc(acc + a_ik b_kj) as a fused multiply-add does; with
`promote_every`, the accumulator is added into a float32 sum and cleared every that many
products; the chunk partials are then added in order. All (i, j) entries advance together:
a loop over k, not over entries. For the bit-level tensor-core arithmetic (truncation, no
normalisation inside a block) see `precisionlab.gpu.tensorcore`.
"""

from __future__ import annotations

import numpy as np

from ..checks import check_positive_int
from ..exact import as_float64
from ..rounding import round_to, seed_generator
from .arith import CONVERT_NUMPY_MAX, RoundedAdder, progress
from .profiles import DeviceProfile, get_profile

__all__ = ["matmul", "round_operands"]


def _as_matrix(x, name: str) -> np.ndarray:
    a = as_float64(x)
    if a.ndim != 2:
        raise ValueError(f"{name} must be a 2-D matrix; got shape {a.shape}")
    return a


def round_operands(a, profile: str | DeviceProfile) -> np.ndarray:
    """fl_in(a) (after fl_stored(a) when the profile stores operands first): what the tensor cores see (float64)."""
    p = get_profile(profile)
    a = np.ascontiguousarray(np.asarray(a, dtype=np.float64))
    # A load rounds each value once: on rounding's NumPy tier up to CONVERT_NUMPY_MAX values,
    # as RoundedAdder.convert does (cheaper than a cold compile there; the same bits).
    compiled = a.size > CONVERT_NUMPY_MAX
    if p.stored_as is not None:  # e.g. a float32 tensor: its words are what the hardware reads
        a = np.asarray(round_to(a, p.stored_as, compiled=compiled), dtype=np.float64)
    return np.asarray(round_to(a, p.inputs, p.input_mode, saturate=p.saturate, compiled=compiled),
                      dtype=np.float64)


def matmul(a, b, profile: str | DeviceProfile = "fp32", *, splits: int = 1,
           seed: int | None = None) -> np.ndarray:
    """C = A·B under `profile`: fl_in operands, exact products, acc = fl_acc(acc + a_ik b_kj), fl_out(C).

    a: (m, k), b: (k, n) arrays or tensors. splits: split-K, the number of consecutive
    k-chunks accumulated independently and then added in order. seed: only for profiles that
    round stochastically (np.random.default_rng(seed) feeds every rounding in turn).
    Returns a float64 (m, n) array of output-format values.
    """
    p = get_profile(profile)
    A = _as_matrix(a, "a")
    B = _as_matrix(b, "b")
    if A.shape[1] != B.shape[0]:
        raise ValueError(f"inner dimensions differ: a is {A.shape}, b is {B.shape}")
    splits = check_positive_int(splits, "splits")
    if p.acc_mode == "stochastic" and seed is None:
        raise ValueError(f"profile {p.name!r} rounds stochastically: pass seed=<int>; got seed=None")
    m, k = A.shape
    n = B.shape[1]
    A = round_operands(A, p)
    B = round_operands(B, p)
    chunk = -(-k // splits)
    pad = splits * chunk - k  # zero products add nothing
    A3 = np.pad(A, ((0, 0), (0, pad))).reshape(m, splits, chunk)
    B3 = np.pad(B, ((0, pad), (0, 0))).reshape(splits, chunk, n)

    gen = None if seed is None else seed_generator(seed)
    work = splits * m * n * chunk  # values the accumulators round, about
    inner = RoundedAdder(p.accumulator_format, p.acc_mode, gen, work=work)
    outer = RoundedAdder(p.promote_to, "nearest_even", work=work) if p.promote_every else inner
    acc = np.zeros((splits, m, n), dtype=inner.dtype)
    total = np.zeros((splits, m, n), dtype=outer.dtype) if p.promote_every else None
    for t in progress(range(chunk), splits * m * n * chunk, "simulated matmul"):
        prod = A3[:, :, t].T[:, :, None] * B3[:, t, None, :]  # (splits, m, n), exact
        acc = inner.add_any(acc, prod)
        if p.promote_every and ((t + 1) % p.promote_every == 0 or t == chunk - 1):
            total = outer.add(total, outer.convert(acc))  # acc's values fit promote_to exactly
            acc = np.zeros_like(acc)
    parts = total if p.promote_every else acc
    c = parts[0]
    for s in range(1, splits):
        c = outer.add(c, parts[s])
    return np.asarray(round_to(np.ascontiguousarray(c, dtype=np.float64), p.output,
                               compiled=c.size > CONVERT_NUMPY_MAX), dtype=np.float64)
