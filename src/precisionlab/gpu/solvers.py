"""A small iterative solver whose matrix-vector products run under a device profile.

Jacobi iteration for A x = b: x_{k+1} = x_k + D^{-1} (b - A x_k), D = diag(A). The product
A x_k goes through `precisionlab.gpu.matmul` with the chosen profile; every other vector
operation is float32, as in a float32 PyTorch program. The stopping test ||r_k|| < tol ||b||
is evaluated accurately (float64, math.fsum), so any change in the iteration count comes
from the matmul alone.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .matmul import matmul
from .profiles import DeviceProfile, get_profile

__all__ = ["SolveResult", "iterations_to_reach", "jacobi_solve"]


@dataclass(frozen=True)
class SolveResult:
    """Outcome of one solve: solution, iterations run, whether the test passed, residual history."""

    x: np.ndarray
    iterations: int
    converged: bool
    residuals: np.ndarray  # ||b - A x_k|| / ||b|| as the solver computed it, k = 0, 1, ...
    profile: str


def _norm(v: np.ndarray) -> float:
    return math.sqrt(math.fsum(float(t) * float(t) for t in v))


def jacobi_solve(a, b, profile: str | DeviceProfile = "fp32", *, tol: float = 1e-4,
                 max_iter: int = 100) -> SolveResult:
    """Jacobi iteration x += D^{-1}(b - fl_profile(A x)) until ||r|| < tol·||b|| or max_iter steps."""
    p = get_profile(profile)
    A = np.asarray(a, dtype=np.float32)
    rhs = np.asarray(b, dtype=np.float32)
    if A.ndim != 2 or A.shape[0] != A.shape[1] or rhs.shape != (A.shape[0],):
        raise ValueError(f"need a square (n, n) matrix and an (n,) vector; got {A.shape} and {rhs.shape}")
    if not tol > 0:
        raise ValueError(f"tol must be positive; got tol={tol!r}")
    if isinstance(max_iter, bool) or not isinstance(max_iter, (int, np.integer)) or max_iter < 0:
        raise ValueError(f"max_iter must be a non-negative integer; got max_iter={max_iter!r}")
    d = np.diag(A).copy()
    if np.any(d == 0):
        raise ValueError("Jacobi iteration needs a nonzero diagonal")
    x = np.zeros_like(rhs)
    b_norm = _norm(rhs)
    history = []
    for it in range(max_iter + 1):
        ax = matmul(A, x[:, None], p)[:, 0].astype(np.float32)
        r = rhs - ax
        history.append(_norm(r) / b_norm)
        if history[-1] < tol:
            return SolveResult(x, it, True, np.array(history), p.name)
        if it == max_iter:
            break
        x = x + r / d
    return SolveResult(x, max_iter, False, np.array(history), p.name)


def iterations_to_reach(residuals, tol: float) -> int | None:
    """The first k with residuals[k] < tol: the iteration count a solve with that tol stops at (None: never).

    The stopping test does not change the iterates before it fires, so one long run's history
    answers the question for every tolerance at once.
    """
    hits = np.flatnonzero(np.asarray(residuals) < tol)
    return int(hits[0]) if hits.size else None
