"""Chapter 1's bit explorer: fl(value) in a format and rounding mode, its fields, ulp and neighbours."""

from __future__ import annotations

from matplotlib.figure import Figure

from ..checks import check_real
from ..formats import get_format
from ..plotting import plot_number_line
from ..rounding import check_mode, decompose, next_down, next_up, ulp
from ..tables import format_value
from .frames import interactive
from .view import TextPanel, view_figure

__all__ = ["BIT_GRID", "bit_explorer", "bit_view"]

BIT_GRID: dict[str, tuple] = {
    "value": (1e-05, 0.001, 0.01, 0.1, 0.2, 0.3, 0.5, 1.0, 3.0, 10.0, 100.0, 1000.0),
    "fmt": ("float32", "tf32", "float16", "bfloat16", "float8_e4m3fn", "float8_e5m2"),
    "mode": ("nearest_even", "toward_zero"),
}


def bit_view(value: float = 0.1, fmt="bfloat16", mode: str = "nearest_even") -> tuple[TextPanel, Figure]:
    """The explorer's view of fl(value): fields, ulp, neighbours, and a number line around it."""
    v = check_real(value)
    f = get_format(fmt)  # raises ValueError naming the valid choices
    check_mode(mode)
    if abs(v) > f.max_finite:
        raise ValueError(
            f"value={v!r} is outside {f.name}'s finite range [-{f.max_finite!r}, {f.max_finite!r}]"
        )
    fields = decompose(v, f, mode)
    fx = fields.value
    err = fx - v
    rel = f"{err / v:+.3e}" if v != 0 else "n/a"
    gap = float(ulp(fx, f))
    below, above = float(next_down(fx, f)), float(next_up(fx, f))
    lines = [
        f"x          = {v!r}  rounded into {f.name} ({mode})",
        f"fl(x)      = {fx!r}   (error {err:+.3e}, relative {rel})",
        f"bits       = {fields.bits}   (sign | exponent | mantissa)",
        f"kind       = {fields.kind}: {fields.meaning.split(' = ')[0]}",
        f"ulp(fl(x)) = {format_value(gap)} = {gap!r}",
        f"next_down  = {below!r}",
        f"next_up    = {above!r}",
    ]
    panel = TextPanel("\n".join(lines))
    lo, hi = fx - 3.5 * (fx - below), fx + 3.5 * (above - fx)
    fig, ax = view_figure(3.2)
    plot_number_line(f, lo, hi, x=v, mode=mode, ax=ax)
    return panel, fig


def bit_explorer(value: float = 0.1, fmt="bfloat16", mode: str = "nearest_even"):
    """interactive(bit_view, BIT_GRID, ...): fl(value) in fmt with mode, over BIT_GRID."""
    return interactive(bit_view, BIT_GRID, value=value, fmt=get_format(fmt).name, mode=mode)
