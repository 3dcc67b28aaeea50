"""Chapter 9's block explorer: what a block scale keeps of activations with outlier channels."""

from __future__ import annotations

from functools import lru_cache

from matplotlib.figure import Figure

from ..chapters.quantize_runs import (
    OUTLIER_CHANNELS,
    block_sqnr,
    ordinary_sqnr,
    outlier_activations,
    share_beside_outliers,
)
from ..checks import check_real
from ..formats import short_name
from ..plotting import PALETTE, plot_block_sqnr
from ..quantize import SCALE_FORMATS, quantize_blocks
from ..quantize.choices import check_format
from .frames import interactive
from .view import TextPanel, view_figure

__all__ = ["BLOCK_ELEMENTS", "BLOCK_GRID", "block_explorer", "block_view"]

BLOCK_GRID: dict[str, tuple] = {
    "outlier": (1, 2, 5, 10, 20, 30, 50, 100, 200, 300, 500, 1000),
    "block": (16, 32, 128),
    "scale_format": ("float8_e8m0fnu", "float8_e4m3fn", "float32"),
}
BLOCK_ELEMENTS: tuple[str, ...] = ("float4_e2m1fn", "float8_e4m3fn")  # drawn together
_STYLES = {"float4_e2m1fn": {"color": PALETTE["vermillion"], "lw": 1.4},
           "float8_e4m3fn": {"color": PALETTE["blue"], "lw": 1.4, "ls": "--"}}


@lru_cache(maxsize=16)
def _activations(outlier: float, tokens: int, channels: int, seed: int):
    """outlier_activations for one setting, computed once per outlier size."""
    return outlier_activations(tokens, channels, outlier, OUTLIER_CHANNELS, seed=seed)


def block_view(outlier: float = 100.0, block: int = 16, scale_format="float8_e8m0fnu",
               tokens: int = 64, channels: int = 256, seed: int = 0) -> tuple[TextPanel, Figure]:
    """quantize_blocks of 64 x 256 activations (4 outlier channels) in E2M1 and E4M3: shares, SQNR per block."""
    size = check_real(outlier, "outlier")
    if size <= 0:
        raise ValueError(f"outlier must be > 0; got outlier={outlier!r}")
    scale_format = check_format(scale_format, "scale_format", SCALE_FORMATS).name
    share = share_beside_outliers(channels, OUTLIER_CHANNELS, block)  # checks block
    x = _activations(size, int(tokens), int(channels), int(seed))
    head = (f"{tokens} tokens x {channels} channels; channels "
            f"{', '.join(map(str, OUTLIER_CHANNELS))} are {size:g}x the others")
    lines = [head, f"one {short_name(scale_format)} scale per {block} channels of a token; "
             f"ordinary values sharing a block", f"with an outlier: {share:.1%}", "",
             f"{'element':<14}{'saturated':>10}{'underflowed':>13}{'SQNR ordinary':>15}"]
    curves = {}
    for elem in BLOCK_ELEMENTS:
        qx = quantize_blocks(x, elem, block, -1, scale_format)  # once: the row and the curve
        xhat = qx.dequantize()
        db = ordinary_sqnr(x, xhat, OUTLIER_CHANNELS)  # outlier_report's sqnr_ordinary
        lines.append(f"{short_name(elem):<14}{qx.saturated:>10.1%}{qx.underflowed:>13.1%}"
                     f"{db:>12.1f} dB")
        curves[short_name(elem)] = block_sqnr(x, xhat, block, OUTLIER_CHANNELS)
    fig, ax = view_figure(3.8)
    plot_block_sqnr(curves, block, OUTLIER_CHANNELS, ax=ax,
                      styles={short_name(e): _STYLES[e] for e in BLOCK_ELEMENTS})
    fig.set_layout_engine("tight")
    return TextPanel("\n".join(lines)), fig


def block_explorer(outlier: float = 100.0, block: int = 16, scale_format="float8_e8m0fnu"):
    """interactive(block_view, BLOCK_GRID, ...): outlier size x block size x scale format."""
    return interactive(block_view, BLOCK_GRID, outlier=outlier, block=block,
                       scale_format=scale_format)
