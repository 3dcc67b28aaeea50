"""Chapter 10's world-size explorer: one global batch summed by W data-parallel ranks."""

from __future__ import annotations

from functools import lru_cache

import numpy as np
from matplotlib.collections import PolyCollection
from matplotlib.figure import Figure

from ..checks import check_choice
from ..formats import get_format
from ..gpu import exact_sum
from ..gpu.collectives import COLLECTIVE_ORDERS, data_parallel_sum
from ..plotting import PALETTE
from ..rounding import round_to, ulp
from .frames import interactive
from .view import TextPanel, view_figure

__all__ = ["COLLECTIVE_GRID", "collective_data", "collective_explorer", "collective_view",
           "ulp_shifts"]

EXAMPLES = 96  # the explorer's batch: 96 has 12 divisors, so 12 world sizes split it evenly
COLLECTIVE_GRID: dict[str, tuple] = {
    "world_size": (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 96),
    "order": COLLECTIVE_ORDERS,
    "fmt": ("float32", "bfloat16"),
}
SHIFT_CLAMP = 6  # the histogram's outer bins hold everything at or beyond +-6 ulps


def collective_data(examples: int = 64, entries: int = 512, seed: int = 0) -> np.ndarray:
    """(examples, entries) float32 per-example gradients over 24 binades, mixed signs."""
    rng = np.random.default_rng(seed)
    mag = np.ldexp(1.0, rng.integers(-20, 4, (examples, entries)))
    x = rng.choice([-1.0, 1.0], (examples, entries)) * rng.uniform(1, 2, (examples, entries)) * mag
    return np.asarray(round_to(x, "float32"), dtype=np.float64)


def ulp_shifts(a, b, fmt) -> np.ndarray:
    """(a - b) / ulp(b) in fmt, entry by entry: how many grid steps a lies from b."""
    b = np.asarray(b, dtype=np.float64)
    return (np.asarray(a, dtype=np.float64) - b) / np.asarray(ulp(b, fmt), dtype=np.float64)


@lru_cache(maxsize=1)
def _batch() -> tuple[np.ndarray, np.ndarray]:
    """The explorer's batch and each entry's exact sum (read-only): made once, not per view."""
    x = collective_data(examples=EXAMPLES)
    exact = exact_sum(x.T)
    for a in (x, exact):
        a.setflags(write=False)
    return x, exact


@lru_cache(maxsize=128)
def _sums(world_size: int, order: str, fmt: str) -> np.ndarray:
    s = data_parallel_sum(_batch()[0], world_size, order, fmt)
    s.setflags(write=False)
    return s


def _bars(ax, x, heights, width: float, color) -> None:
    """ax.bar(x, heights, width, color=color) drawn as one PolyCollection of the same rectangles.

    One collection instead of a Rectangle per bar: a tenth of the time per view (the explorer
    draws 120), and the same picture and figure spec as ax.bar's (the edges are not drawn).
    """
    half = width / 2
    rects = [[(c - half, 0.0), (c + half, 0.0), (c + half, h), (c - half, h)]
             for c, h in zip(x, heights, strict=True)]
    ax.add_collection(PolyCollection(rects, closed=False, facecolors=color, edgecolors="none",
                                     linewidths=0))


def collective_view(world_size: int = 4, order: str = "ring",
                    fmt: str = "float32") -> tuple[TextPanel, Figure]:
    """A 96-example batch's gradient at W ranks (order, fmt) against W = 1: shifts in ulps."""
    if world_size not in COLLECTIVE_GRID["world_size"] or isinstance(world_size, bool):
        raise ValueError(f"world_size must be one of {COLLECTIVE_GRID['world_size']}; "
                         f"got world_size={world_size!r}")
    check_choice(order, "order", COLLECTIVE_ORDERS)
    f = get_format(fmt)
    check_choice(f.name, "fmt", COLLECTIVE_GRID["fmt"])
    one, got = _sums(1, order, f.name), _sums(world_size, order, f.name)
    exact = _batch()[1]
    shift = ulp_shifts(got, one, f)
    err_w, err_1 = (np.abs(ulp_shifts(s, exact, f)).mean() for s in (got, one))
    lines = [
        f"{EXAMPLES} examples x 512 entries, {f.name} reduction, {order!r} all-reduce",
        f"W = {world_size}: each rank sums {EXAMPLES // world_size} "
        f"example{'s' if EXAMPLES > world_size else ''} in float32, "
        f"then the all-reduce in {f.name}",
        f"entries that differ from W = 1: {int((shift != 0).sum())} of 512, "
        f"up to {np.abs(shift).max():.0f} ulps",
        f"mean |error| against the exact sum: {err_w:.2f} ulps (W = 1: {err_1:.2f})",
    ]
    edges = np.arange(-SHIFT_CLAMP, SHIFT_CLAMP + 1)
    counts = [int((np.clip(np.round(shift), -SHIFT_CLAMP, SHIFT_CLAMP) == k).sum())
              for k in edges]
    fig, ax = view_figure(3.4)
    _bars(ax, edges, counts, 0.8, PALETTE["blue"])
    ax.set_xlabel(f"S(W) - S(1), in {f.name} ulps (outer bars: {SHIFT_CLAMP} or more)")
    ax.set_ylabel("entries")
    ax.set_title(f"W = {world_size}, {order}, {f.name}")
    ax.set_ylim(0, 512)
    fig.set_layout_engine("tight")
    alt = (f"Bar chart of 512 gradient entries by their shift from W = 1 in ulps, "
           f"{counts[SHIFT_CLAMP]} at zero")
    return TextPanel("\n".join(lines), alt=alt), fig


def collective_explorer(world_size: int = 4, order: str = "ring", fmt: str = "float32"):
    """interactive(collective_view, COLLECTIVE_GRID, ...): world size x all-reduce order x format."""
    return interactive(collective_view, COLLECTIVE_GRID, world_size=world_size, order=order,
                       fmt=get_format(fmt).name)
