"""Chapter 2's reduction explorer: one vector summed in each order and accumulator, S_i < tol tested."""

from __future__ import annotations

from functools import lru_cache

import numpy as np
from matplotlib.figure import Figure

from ..checks import check_choice, check_real
from ..formats import get_format
from ..gpu import ORDERS, exact_sum, flip_probability, reduce_sum
from ..plotting import plot_sum_outcomes
from ..rounding import round_to, ulp
from .frames import interactive
from .view import TextPanel, view_figure

__all__ = ["REDUCTION_GRID", "reduction_data", "reduction_explorer", "reduction_sums", "reduction_view"]

REDUCTION_BLOCKS = (1, 2, 4, 8, 16, 32, 64, 128)  # the block sizes the view accepts

REDUCTION_GRID: dict[str, tuple] = {
    "order": ("sequential", "pairwise", "blocked", "warp", "split_k", "atomic", "kahan"),
    "acc": ("float16", "bfloat16", "float32"),
    "margin": (-3e-3, -1e-3, -3e-4, -1e-4, -3e-5, -1e-5, 1e-5, 3e-5, 1e-4, 3e-4, 1e-3, 3e-3),
}


def reduction_data(n: int = 256, seed: int = 0):
    """The explorer's vector: n positive float16 values in [0.25, 1), drawn from default_rng(seed)."""
    rng = np.random.default_rng(seed)
    return np.asarray(round_to(rng.uniform(0.25, 1.0, n), "float16"), dtype=np.float64)


@lru_cache(maxsize=8)
def _exact(n: int, seed: int) -> float:
    """The exact sum of reduction_data(n, seed), computed once for every view of the grid."""
    return float(exact_sum(reduction_data(n, seed)))


@lru_cache(maxsize=64)
def reduction_sums(order: str, acc: str, block: int, n: int, runs: int, seed: int) -> np.ndarray:
    """The explorer's vector summed in `order` with an `acc` accumulator: runs sums for atomic, else one."""
    x = reduction_data(n, seed)
    lanes = runs if order == "atomic" else 1  # every other order gives one answer
    sums = np.atleast_1d(reduce_sum(np.broadcast_to(x, (lanes, n)), order, acc, block=block,
                                    seed=seed))
    sums.setflags(write=False)  # shared by every view with these arguments (the margin moves)
    return sums


def reduction_view(order: str = "atomic", acc="float16", block: int = 1, margin: float = 1e-3,
                   n: int = 256, runs: int = 2000, seed: int = 0) -> tuple[TextPanel, Figure]:
    """Sums of one vector in `order` with an `acc` accumulator, against tol = S (1 + margin)."""
    check_choice(order, "order", ORDERS)
    f = get_format(acc)
    if block not in REDUCTION_BLOCKS:
        raise ValueError(f"block must be one of {REDUCTION_BLOCKS}; got block={block!r}")
    m = check_real(margin, "margin")
    if m == 0 or abs(m) >= 1:
        raise ValueError(f"margin must be nonzero and below 1 in size; got margin={m!r}")
    exact = _exact(n, seed)
    tol = exact * (1 + m)
    sums = reduction_sums(order, f.name, block, int(n), int(runs), int(seed))
    lanes = sums.size
    flip = float(flip_probability(sums, exact, m))
    u = float(ulp(exact, f))
    lines = [
        f"{n} float16 values, order={order!r}, block={block}, {f.name} accumulator",
        f"exact sum S = {exact:.10g}",
        f"tol = S (1 {'+' if m > 0 else '-'} {abs(m):.1e}) = {tol:.10g}",
        f"exact decision: S < tol is {exact < tol} ({'stop' if exact < tol else 'continue'})",
        f"{lanes} run(s): {np.unique(sums).size} distinct sum(s), "
        f"{(sums.min() - exact) / u:+.1f} to {(sums.max() - exact) / u:+.1f} ulps from S",
        f"decision flipped in {flip:.1%} of runs",
    ]
    fig, ax = view_figure(3.8)
    plot_sum_outcomes(sums, exact, tol, f, title=f"{order} order, {f.name} accumulator", ax=ax)
    return TextPanel("\n".join(lines)), fig


def reduction_explorer(order: str = "atomic", acc="float16", block: int = 1, margin: float = 1e-3):
    """interactive(reduction_view, REDUCTION_GRID, ...): order x accumulator x margin, block fixed."""
    return interactive(reduction_view, REDUCTION_GRID, order=order, acc=get_format(acc).name,
                       block=block, margin=margin)
