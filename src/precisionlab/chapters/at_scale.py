"""Chapter 10: a training run whose gradient is all-reduced on 1, 2, 4 or 8 ranks.

`train_run` fits a linear regression y ~ x . w by gradient descent in float32, every
operation rounded once and computed portably (the same bits on every machine): per example
the residual r_i = fl32(x_i . w - y_i) (summed exactly by `math.fsum`, rounded to float64,
then to float32), its gradient g_ij = fl32(r_i x_ij); the global batch's gradient sum G by
`gpu.collectives.data_parallel_sum` on W ranks (or by any `sum_fn`); the step
w <- fl32(w - lr G), lr a power of two (so lr G is exact). The world size changes only the
order of G's additions, and so the run's bits from its first step on.

Chapter code (`precisionlab.chapters`): imports `gpu` and `rounding`.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import NamedTuple

import numpy as np

from ..checks import check_positive_int
from ..gpu.collectives import data_parallel_sum
from ..rounding import round_to

__all__ = ["TrainRun", "per_example_grads", "regression_data", "train_run"]


def _fl32(a) -> np.ndarray:
    return np.asarray(round_to(np.asarray(a, dtype=np.float64), "float32"), dtype=np.float64)


def regression_data(examples: int = 64, features: int = 16, seed: int = 0,
                    noise: float = 0.5) -> tuple[np.ndarray, np.ndarray]:
    """(x, y): x (examples, features) standard normal, y = x . w_true + noise, float32 values."""
    rng = np.random.default_rng(seed)
    x = _fl32(rng.standard_normal((check_positive_int(examples, "examples"),
                                   check_positive_int(features, "features"))))
    w_true = rng.standard_normal(features)
    y = _fl32(x @ w_true + noise * rng.standard_normal(examples))
    return x, y


def per_example_grads(w, x, y) -> np.ndarray:
    """(N, d): g_ij = fl32(r_i x_ij), r_i = fl32(fsum(x_i1 w_1, ..., -y_i)); float32 values."""
    prods = np.asarray(x, dtype=np.float64) * np.asarray(w, dtype=np.float64)  # exact
    terms = np.column_stack([prods, -np.asarray(y, dtype=np.float64)])  # each row: its r_i's terms
    r = _fl32(list(map(math.fsum, terms.tolist())))
    return _fl32(r[:, None] * x)  # a product of two float32 values is exact in float64


class TrainRun(NamedTuple):
    params: np.ndarray  # (steps + 1, d): w before the first step and after every step
    grads: np.ndarray  # (steps, d): the gradient sum G each step applied


def train_run(x, y, steps: int = 200, world_size: int = 1, order: str = "ring", *,
              lr: float = 2.0**-8, sum_fn: Callable[[np.ndarray], np.ndarray] | None = None
              ) -> TrainRun:
    """Full-batch gradient descent from w = 0: w <- fl32(w - lr * G) for `steps` steps.

    G = data_parallel_sum(g, world_size, order) of the per-example gradients g (float32
    reduction format), or sum_fn(g) if given. lr must be a power of two (lr * G exact;
    lr = 2**-8 on the sum of 64 examples is 0.25 on their mean).
    """
    steps = check_positive_int(steps, "steps")
    if not (lr > 0 and math.frexp(lr)[0] == 0.5):
        raise ValueError(f"lr must be a positive power of two; got lr={lr!r}")
    x = np.asarray(x, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64)
    if x.ndim != 2 or y.shape != (x.shape[0],):
        raise ValueError(f"x must be (N, d) and y (N,); got shapes {x.shape} and {y.shape}")
    if sum_fn is None:
        def sum_fn(g):
            return data_parallel_sum(g, world_size, order)
    params = np.zeros((steps + 1, x.shape[1]))
    grads = np.empty((steps, x.shape[1]))
    for t in range(steps):
        grads[t] = sum_fn(per_example_grads(params[t], x, y))
        params[t + 1] = _fl32(params[t] - lr * grads[t])
    return TrainRun(params, grads)
