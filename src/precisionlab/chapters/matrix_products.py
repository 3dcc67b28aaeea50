"""Chapter 9, the matrix product itself: FP8 accumulation and training with every product quantized.

* `fp8_operands` and `accumulation_errors`: random matrices quantized to E4M3 by a scale per
  tensor, multiplied by `gpu.tensorcore`'s Hopper FP8 model (14-bit accumulator, with and
  without promotion into float32 every N_c elements), against the exact product, for a range
  of inner dimensions K.

Every number is portable: normal samples by `emulate.randn`, roundings by `round_to`, the
block FMAs in exact float64 integer arithmetic, error norms by `math.fsum`.

Chapter code (`precisionlab.chapters`): imports `gpu`, `quantize` and `emulate`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from .. import emulate
from ..checks import check_count
from ..gpu.tensorcore import tensor_core_matmul
from ..quantize import RECIPES

__all__ = ["AccumulationErrors", "accumulation_errors", "exact_fp8_matmul", "fp8_operands"]


def fp8_operands(m: int, k: int, n: int, *, seed: int = 0, recipe: str = "fp8_tensor",
                 positive: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """(A, B): N(0, 1) matrices (m, k) and (k, n) (|N(0, 1)| if positive) quantized by `recipe`: the E4M3 elements q the tensor cores multiply (float64)."""
    for v, name in ((m, "m"), (k, "k"), (n, "n")):
        check_count(v, name)
    gen = torch.Generator().manual_seed(int(seed))
    a = emulate.randn(m, k, generator=gen, dtype=torch.float64).to(torch.float32)
    b = emulate.randn(k, n, generator=gen, dtype=torch.float64).to(torch.float32)
    if positive:
        a, b = a.abs(), b.abs()
    q = RECIPES[recipe]
    # A per-tensor scale multiplies the finished sum; the K reduction sees the elements alone.
    return (q(a).values.to(torch.float64).numpy(), q(b).values.to(torch.float64).numpy())


def exact_fp8_matmul(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """A·B exactly, for E4M3 element matrices of moderate size: float64, any summation order.

    Every E4M3 value is a multiple of 2^-9 (its smallest subnormal), so every product and
    every partial sum is an integer multiple of 2^-18; while the sums of |a_ik b_kj| stay
    below 2^35 those integers stay below 2^53, and float64 holds every partial sum exactly,
    whatever order (or BLAS kernel) adds them. Both conditions are checked.
    """
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    grain = 2.0**-18  # E4M3's smallest subnormal, 2^-9, squared
    if np.any(np.mod(a, 2.0**-9)) or np.any(np.mod(b, 2.0**-9)):
        raise ValueError("a and b must hold E4M3 values (multiples of 2^-9); quantize them "
                         "first, e.g. with fp8_operands")
    if float((np.abs(a) @ np.abs(b)).max(initial=0.0)) >= 2.0**53 * grain:
        raise ValueError("the sums of |a_ik b_kj| reach 2^35: float64 no longer holds them "
                         "exactly; use smaller matrices")
    return a @ b


@dataclass(frozen=True)
class AccumulationErrors:
    """Per K: ||C - C*||_F / ||C*||_F and max |C - C*| / |C*| for each accumulation (key: promote_every or None)."""

    ks: tuple[int, ...]
    normwise: dict[int | None, np.ndarray]
    entrywise: dict[int | None, np.ndarray]


def _frobenius(x: np.ndarray) -> float:
    """sqrt(sum x^2) with the sum exact (math.fsum): the same bits on every machine."""
    return math.sqrt(math.fsum((x * x).ravel().tolist()))


def accumulation_errors(ks: Sequence[int], m: int = 16, n: int = 16, *, seed: int = 0,
                        promote: Sequence[int | None] = (None, 128),
                        model: str = "H100-FP8", positive: bool = False) -> AccumulationErrors:
    """For each K: fp8_operands(m, K, n) multiplied by the tensor-core model with each promote_every, against the exact product."""
    ks = tuple(check_count(k, "K") for k in ks)
    normwise = {p: [] for p in promote}
    entrywise = {p: [] for p in promote}
    for k in ks:
        a, b = fp8_operands(m, k, n, seed=seed, positive=positive)
        exact = exact_fp8_matmul(a, b)
        for p in promote:
            c = tensor_core_matmul(a, b, model=model, inputs="float8_e4m3fn",
                                   operands="exact", promote_every=p)
            err = c - exact
            normwise[p].append(_frobenius(err) / _frobenius(exact))
            with np.errstate(divide="ignore", invalid="ignore"):
                rel = np.where(exact != 0, np.abs(err) / np.abs(exact), np.where(err != 0, np.inf, 0))
            entrywise[p].append(float(rel.max()))
    return AccumulationErrors(ks, {p: np.array(v) for p, v in normwise.items()},
                              {p: np.array(v) for p, v in entrywise.items()})
