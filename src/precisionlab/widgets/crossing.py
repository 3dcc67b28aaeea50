"""Chapter 1's crossing explorer: steps k until fl(w + k·lr) first differs from fl(w)."""

from __future__ import annotations

from matplotlib.figure import Figure

from ..checks import check_real
from ..formats import FORMAT_NAMES, get_format
from ..plotting import plot_crossing_trajectory
from ..rounding import round_to
from ..updates import simulate_crossing, steps_to_cross, steps_to_cross_estimate
from .frames import interactive
from .view import TextPanel, view_figure

__all__ = ["CROSSING_FORMATS", "CROSSING_GRID", "crossing_explorer", "crossing_view"]

MAX_TRAJECTORY_STEPS = 20_000  # the longest trajectory the explorer draws
# The formats the view takes: chapter 1's, narrower than float64 (the crossings are computed
# in float64). Not the MX formats: float4/float6 saturate at their max and float8_e8m0fnu has
# no sign and no zero, so fl(w + k lr) may never change, which the step count does not model.
CROSSING_FORMATS: tuple[str, ...] = tuple(n for n in FORMAT_NAMES if n != "float64")

CROSSING_GRID: dict[str, tuple] = {
    "w": (0.25, 1.0, 4.0),
    "lr": (1e-6, 2e-6, 5e-6, 1e-5, 2e-5, 5e-5, 1e-4, 2e-4, 5e-4, 1e-3, 2e-3, 5e-3),
    "fmt": ("bfloat16", "float16", "float8_e5m2"),
}


def crossing_view(w: float = 1.0, lr: float = 1e-5, fmt="bfloat16") -> tuple[TextPanel, Figure]:
    """Exact, estimated and simulated steps until fl(w + k·lr) changes, with the trajectory."""
    w0 = check_real(w, "w")
    lr0 = check_real(lr, "lr")
    f = _crossing_format(fmt)
    if lr0 == 0:
        raise ValueError("lr must be nonzero; got lr=0.0")
    start = float(round_to(w0, f))
    k = steps_to_cross(start, lr0, f)
    if k > MAX_TRAJECTORY_STEPS:
        raise ValueError(
            f"w={w0!r}, lr={lr0!r} needs {k} steps in {f.name}; the explorer draws at most "
            f"{MAX_TRAJECTORY_STEPS} (raise lr or lower |w|)"
        )
    est = steps_to_cross_estimate(start, lr0, f)
    sim = simulate_crossing(start, lr0, max(2 * k, 10), f)
    lines = [
        f"w = fl({w0!r}) = {start!r} in {f.name}, lr = {lr0!r}",
        f"exact steps to first change   : {k}",
        f"estimate |W|/(2^p·lr), p = {f.precision:<2}: {est:.1f}",
        f"float32-master simulation     : {sim}",
    ]
    n_steps = int(min(max(2.3 * k, 12), MAX_TRAJECTORY_STEPS))
    fig, ax = view_figure(3.6)
    plot_crossing_trajectory(start, lr0, n_steps, f, ax=ax)
    return TextPanel("\n".join(lines)), fig


def _crossing_format(fmt):
    """The format fmt names if crossing_view takes it (CROSSING_FORMATS), else ValueError listing them."""
    try:
        f = get_format(fmt)
    except ValueError:
        f = None
    if f is None or f.name not in CROSSING_FORMATS:
        raise ValueError(f"fmt must be a format narrower than float64 whose crossings the view "
                         f"models; valid choices: {', '.join(CROSSING_FORMATS)}; got fmt={fmt!r}")
    return f


def crossing_explorer(w: float = 1.0, lr: float = 1e-5, fmt="bfloat16"):
    """interactive(crossing_view, CROSSING_GRID, ...): steps until fl(w + k·lr) moves."""
    return interactive(crossing_view, CROSSING_GRID, w=w, lr=lr, fmt=get_format(fmt).name)
