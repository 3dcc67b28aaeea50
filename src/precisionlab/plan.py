"""A computation's plan: a block that declares its work, so that a short one stays on NumPy.

The compiled tiers (numba's matmul loop, `round_to`'s rounding loops) cost a cold compile of
0.2-0.7 s per kernel, and half a second more for numba's own start, before they are faster.
A computation that knows its size says so (`planned_products`, also `emulate.planned_products`);
a short one then runs every emulated product (`emulate.matmul`, `emulate.linear`) and every
`round_to` on NumPy's tier, the same bits without the compile.
"""

from __future__ import annotations

import contextlib
import contextvars

__all__ = ["PRODUCTS_NUMPY_MAX", "numpy_planned", "planned_products"]

# A computation that declares its products and comes to at most this many multiply-adds runs
# them all on NumPy's tier, however large each one: at 2-5 ns a product there, 2^25 of them
# take about as long as the loop's cold compile (about 0.25 s a dtype, and half a second more
# for numba's own start on the first kernel of a process). Its roundings follow: each rounds
# an operand or a result of those products, at most a few times `work` values in all (in
# practice a product's k times fewer), at about 15 ns a value on NumPy's tier.
PRODUCTS_NUMPY_MAX = 1 << 25
_PLAN: contextvars.ContextVar[bool | None] = contextvars.ContextVar("planned_products",
                                                                      default=None)


@contextlib.contextmanager
def planned_products(work: int):
    """A block whose matrix products come to about `work` multiply-adds (m k n, summed).

    Up to PRODUCTS_NUMPY_MAX every emulated product inside, and every `round_to`, runs on
    NumPy's tier, so a computation too short to pay back a cold
    compile never starts one; beyond it each takes its tier by its own size, as outside any
    plan (`emulate.products.GEMM_COMPILED_MIN`, `rounding_kernel.NUMBA_MIN_SIZE`). The same bits
    either way (a NaN's sign aside: `emulate.products.sequential_gemm`), and on every machine the same
    tier for the same computation. Plans nest: the outermost, which knows the most of the
    work, decides (a training loop of many passes keeps the loops for each pass, which alone
    would not). The plan is the block's own (a context variable), never left behind for later
    calls; a backward pass run inside the block sees it (CPU autograd runs on the calling
    thread), one run after the block does not.
    """
    if _PLAN.get() is not None:
        yield
        return
    token = _PLAN.set(int(work) <= PRODUCTS_NUMPY_MAX)
    try:
        yield
    finally:
        _PLAN.reset(token)


def numpy_planned() -> bool:
    """True inside a `planned_products` block short enough for NumPy's tiers, else False."""
    return bool(_PLAN.get())
