"""The source study's figures (typed once, with their sections), one rule for "reproduces", and the comparison table."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from ..checks import check_choice
from ..tables import Table

__all__ = ["COMPARISON_HEADERS", "SOURCE", "SourceFigure", "comparison_table", "reproduces"]


@dataclass(frozen=True)
class SourceFigure:
    """A figure the source reports (seed 001, the TRL precision-mismatch study): what, the value as printed, its section."""

    finding: str
    value: str
    section: str


# Typed once, from the source's text; citations, not results of this package.
SOURCE: dict[str, SourceFigure] = {
    "beta_std": SourceFigure("std of beta, fp32 trainer", "0.149", "6.2"),
    "beta_beyond": SourceFigure("P(|beta| > 0.2), fp32 trainer", "18% (Gaussian)", "10.3"),
    "clip_step3": SourceFigure("clipped at step 3, fp32 / bf16 trainer", "13.5% / 1.0%", "10.3"),
    "phantom_step5": SourceFigure("phantom / legitimate at step 5", "17.2% / 0.4%", "10.3"),
    "cos_ratio_score": SourceFigure("cos(dg_ratio, dg_score)", "-0.58", "7.5"),
    "first_sync": SourceFigure("bf16 weights changed, first sync", "0.96%", "6.6"),
    "sync_mean": SourceFigure("bf16 weights changed per sync, mean", "0.24-0.29%", "6.6"),
    "cos_reinforce": SourceFigure("cos(update, clean REINFORCE grad.)", "0.55-0.73", "8.4, 8.5"),
    "beta_growth": SourceFigure("std of beta, start -> later", "0.043 -> 0.244", "8.1"),
    "snr": SourceFigure("SNR mean|alpha| / mean|beta|", "2.82", "6.4"),
    "corr": SourceFigure("corr(beta, A)", "+0.002 -> +0.069", "8.1"),
    "deployed": SourceFigure("deployed improvement, bf16 / fp32", "+0.00128 / +0.00023", "6.5"),
    "converge_low": SourceFigure("low lr converges: bf16 / fp32 trainer", "yes / no", "1"),
    "converge_high": SourceFigure("10x lr converges: fp32 trainer", "yes", "1"),
    "bf16_weights": SourceFigure("bf16 weights converge: low / 10x lr", "no / yes", "1"),
    "fixes": SourceFigure("converge: eps = 10 / ratio from shadow", "yes / yes", "9.2, 10.1"),
    "rare": SourceFigure("median |beta|: rare / common tokens", "0.5-1.0 / 0.02", "8.2"),
    "alpha_early": SourceFigure("mean |alpha| early, bf16 / fp32 trainer", "0.035 / 0.035", "6.3"),
    "efficiency": SourceFigure("deployed / moved, bf16 / fp32 trainer", "8.2% / 1.3%", "7.7"),
    "cos_no_clip": SourceFigure("cos(clean, actual grad.), no clipping", "> 0.95", "7.5"),
    "beta_zero": SourceFigure("beta with matched precisions", "0 exactly", "6.2"),
    "mu_w": SourceFigure("mean token weight mu_W, bf16 / fp32", "-0.258 / -0.238", "10.2"),
}


def reproduces(book: float, source, direction: bool = False) -> str:
    """'yes' if book has the sign of `source` (a value or a (lo, hi) range) and lies within [min/2, 2 max] of its magnitudes; else 'partly' if `direction` (the source's direction holds); else 'no'."""
    lo, hi = source if isinstance(source, tuple) else (source, source)
    if lo * hi <= 0:
        raise ValueError(f"source must be a non-zero value or a range of one sign; got {source!r}")
    mags = sorted((abs(lo), abs(hi)))
    same_sign = math.isfinite(book) and book * lo > 0
    if same_sign and mags[0] / 2 <= abs(book) <= 2 * mags[1]:
        return "yes"
    return "partly" if direction else "no"


COMPARISON_HEADERS: tuple[str, ...] = ("finding", "source", "§", "this chapter", "reproduces",
                                       "source regime", "reproduces")


def comparison_table(rows: Mapping[str, Sequence[str]]):
    """A tables.Table: per SOURCE key in `rows`, the finding, the source's value and section, then the row's own cells."""
    out = []
    for key, cells in rows.items():
        check_choice(key, "source finding", SOURCE)
        if len(cells) != len(COMPARISON_HEADERS) - 3:
            raise ValueError(f"row {key!r} needs {len(COMPARISON_HEADERS) - 3} cells "
                             f"({', '.join(COMPARISON_HEADERS[3:])}); got {len(cells)}")
        fig = SOURCE[key]
        out.append([fig.finding, fig.value, fig.section, *map(str, cells)])
    return Table(COMPARISON_HEADERS, out)
