"""Chapter 7's demonstrations: a dot product by hand, every summation order, and a matmul
with a bug of known size."""

from __future__ import annotations

import functools
import itertools
import math
from dataclasses import dataclass

import numpy as np

from ..checks import check_choice, check_count, check_nonnegative, check_positive_int
from ..formats import get_format
from ..gpu import Kernel, as_float64, promote, round_float64
from ..intervals.bounds import matmul
from ..intervals.corpus import uniform_data
from ..intervals.interval import Interval, point
from ..intervals.ops import add
from ..intervals.outward import round_out
from ..intervals.verdicts import ASSERT_CLOSE_TOLERANCES, Layer, allclose, run_layers

_MAX_ORDER_TERMS = 8  # 8! = 40320 sequential dot products


@dataclass(frozen=True)
class DotStep:
    """One step of a sequential dot product with naive interval arithmetic in fmt."""

    i: int
    product: float  # a_i b_i, exact
    value: float  # the accumulator after this step (round to nearest)
    lo: float  # naive interval: [RD(lo + p), RU(hi + p)]
    hi: float
    exact: float  # the exact partial sum (float64, exact for these sizes)


def dot_by_hand(a, b, fmt="float16") -> list[DotStep]:
    """Sequential a . b in fmt, step by step: the rounded value, naive directed-rounding interval, exact partial sum."""
    f = get_format(fmt)
    a, b = as_float64(a).ravel(), as_float64(b).ravel()
    if a.shape != b.shape or a.size == 0:
        raise ValueError(f"a and b must be non-empty vectors of one length; got {a.shape} and {b.shape}")
    if np.any(round_float64(a, f) != a) or np.any(round_float64(b, f) != b):
        raise ValueError(f"a and b must hold {f.name} values; round them first")
    steps, acc, lo, hi, exact = [], 0.0, 0.0, 0.0, 0.0
    for i, p in enumerate(a * b):
        acc = float(round_float64(np.array([acc + p]), f)[0])  # acc + p is exact in float64 here
        lo = float(round_out(np.array([lo + p]), np.array([lo + p]), f)[0][0])
        hi = float(round_out(np.array([hi + p]), np.array([hi + p]), f)[1][0])
        exact = math.fsum([exact, float(p)])
        steps.append(DotStep(i, float(p), acc, lo, hi, exact))
    return steps


def every_order(a, b, fmt="float16") -> dict[tuple[int, ...], float]:
    """{order p: fl(... fl(fl(a_p0 b_p0) + a_p1 b_p1) ... )} for each of the n! orders (n <= 8)."""
    a, b = as_float64(a).ravel(), as_float64(b).ravel()
    if a.size != b.size:
        raise ValueError(f"a and b must have one length; got a of length {a.size} and b of "
                         f"length {b.size}")
    if a.size > _MAX_ORDER_TERMS:
        raise ValueError(f"every_order tries all n! orders: a and b must have at most "
                         f"{_MAX_ORDER_TERMS} entries; got {a.size}")
    return {p: dot_by_hand(a[list(p)], b[list(p)], fmt)[-1].value
            for p in itertools.permutations(range(a.size))}


def orders_outside(a, b, fmt="float16") -> dict[tuple[int, ...], float]:
    """The orders of every_order whose result lies outside dot_by_hand's naive interval [lo, hi]."""
    last = dot_by_hand(a, b, fmt)[-1]
    return {p: v for p, v in every_order(a, b, fmt).items() if not last.lo <= v <= last.hi}



# =========================================================================== an injected bug (the widget's model)

# The kernel each format's matmul runs in injected_bug (and the chapter's widget).
BUG_KERNELS: dict[str, Kernel] = {
    "float32": Kernel("blocked", acc="float32", block=32),
    "tf32": Kernel("blocked", acc="float32", inputs="tf32", input_mode="nearest_away", block=32),
    "bfloat16": Kernel("blocked", acc="float32", inputs="bfloat16", out="bfloat16", block=32),
    "float16": Kernel("blocked", acc="float32", inputs="float16", out="float16", block=32),
}


@dataclass(frozen=True)
class BugCheck:
    """A matmul kernel with a bug of known size against a float64 reference, and what each method says."""

    k: int
    fmt: str
    bug: float  # the injected error, as a fraction of mean |C|
    kernel: Kernel
    index: tuple  # the output element the bug shifts
    target: np.ndarray
    reference: np.ndarray
    structure: Interval
    oblivious: Interval
    verdicts: dict  # method -> "Type-I" / "Type-II"
    passes_allclose: bool

    @property
    def error(self) -> float:
        """|target - reference| at the bugged element."""
        return float(abs(self.target[self.index] - self.reference[self.index]))


@functools.lru_cache(maxsize=16)
def _bug_free(k: int, fmt: str, m: int, n: int, seed: int) -> tuple:
    """(a, b, exact, reference, then the kernel's run, both bounds and the promoted run of
    a b): everything in injected_bug that the bug's size leaves alone, computed once per
    setting and shared by every bug size (the explorer's slider, the chapter's checks)."""
    kernel = BUG_KERNELS[fmt]
    a = uniform_data((m, k), seed, "float32")
    b = uniform_data((k, n), seed + 1, "float32")
    exact = np.array([[math.fsum(a[i] * b[:, j]) for j in range(n)] for i in range(m)])
    reference = run_layers(Layer("float64", lambda x: matmul(x, b, Kernel("sequential", acc="float64"))), a)[-1]
    runs = (matmul(a, b, kernel), matmul(point(a, "structure"), b, kernel),
            matmul(point(a, "oblivious"), b, kernel), matmul(a, b, promote(kernel)))
    for v in (a, b, exact, reference, *runs):  # shared between calls: nobody may write to them
        for arr in ((v.lo, v.hi, v.nan, v.value) if isinstance(v, Interval) else (v,)):
            if isinstance(arr, np.ndarray):
                arr.setflags(write=False)
    return (a, b, exact, reference, *runs)


def injected_bug(k: int = 1024, fmt: str = "float32", bug: float = 0.0, m: int = 4, n: int = 4,
                 seed: int = 0) -> BugCheck:
    """C = A B by BUG_KERNELS[fmt] plus bug * mean|C| at C[0, 0], against a float64 reference:
    the interval (target bound vs reference point), the order-oblivious rule, high-precision re-execution.

    The products do not depend on the bug (it is added to C afterwards), so they are computed
    once per (k, fmt, m, n, seed) and only the add of the bug runs per call.
    """
    fmt = check_choice(get_format(fmt).name, "format", tuple(BUG_KERNELS))
    k = check_positive_int(k, "k")
    m = check_positive_int(m, "m")
    n = check_positive_int(n, "n")
    bug = check_nonnegative(bug, "bug", " (a fraction of mean |C|)")
    kernel = BUG_KERNELS[fmt]
    seed = check_count(seed, "seed", 0)
    _, _, exact, reference, run, run_s, run_o, run_high = _bug_free(k, fmt, m, n, seed)
    delta = np.zeros((m, n))
    delta[0, 0] = bug * math.fsum(np.abs(exact).ravel()) / exact.size
    out = kernel.out_format.name
    t = as_float64(add(run, delta, out))
    s = add(run_s, delta, out)
    o = add(run_o, delta, out)
    rtol, atol = ASSERT_CLOSE_TOLERANCES[fmt]
    high = add(run_high, delta, "float64")
    verdicts = {
        "structure": "Type-I" if s.contains(reference).all() else "Type-II",
        "oblivious": "Type-I" if o.contains(reference).all() else "Type-II",
        "high_precision": "Type-I" if allclose(high, reference, rtol, atol) else "Type-II",
    }
    return BugCheck(k, fmt, bug, kernel, (0, 0), t, reference, s, o, verdicts,
                    allclose(t, reference, rtol, atol))
