"""Figures of RL under mixed precision: phantom clipping, beta = f_fp32 - f_bf16, runs per step."""

from __future__ import annotations

from collections.abc import Mapping
from itertools import pairwise

import numpy as np
import torch
from matplotlib.axes import Axes

from ..formats import get_format
from ..rounding import ulp
from .style import PALETTE, get_axes, legend_outside

__all__ = ["plot_beta_by_offset", "plot_beta_vs_logprob", "plot_phantom_strip", "plot_run_metric"]

_CLIP_COLORS = {
    "unclipped": "#9a9a9a",
    "phantom": PALETTE["vermillion"],
    "legitimate": PALETTE["blue"],
    "released": PALETTE["purple"],
}


def plot_phantom_strip(alpha, beta, adv, eps_low: float = 0.2, eps_high: float = 0.2,
                       *, seed: int = 0, ax: Axes | None = None) -> Axes:
    """Tokens placed by ratio exp(alpha + beta) and by the clean exp(alpha), coloured by clip class, dead zones shaded."""
    # rl is imported here, not with plotting: its engine compiles numba kernels (0.7 s to
    # import numba), which the chapters that only plot need not load.
    from ..rl import CLIP_CLASSES, classify_clipping

    ax = get_axes(ax)
    rng = np.random.default_rng(seed)  # the vertical jitter of the dots
    alpha, beta, adv = (np.asarray(v, dtype=np.float64) for v in (alpha, beta, adv))
    cls = classify_clipping(*(torch.from_numpy(v) for v in (alpha, beta, adv)), eps_low,
                            eps_high).numpy()
    rows = [("A > 0, actual ratio", adv > 0, alpha + beta), ("A > 0, beta removed", adv > 0, alpha),
            ("A < 0, actual ratio", adv < 0, alpha + beta), ("A < 0, beta removed", adv < 0, alpha)]
    x_all = np.exp(np.concatenate([alpha + beta, alpha]))
    lo = min(x_all.min(), 1 - eps_low) - 0.03
    hi = max(x_all.max(), 1 + eps_high) + 0.03
    for y, (_label, sel, logr) in enumerate(rows):
        dead = (1 + eps_high, hi) if y < 2 else (lo, 1 - eps_low)
        ax.axhspan(y - 0.42, y + 0.42, xmin=(dead[0] - lo) / (hi - lo),
                   xmax=(dead[1] - lo) / (hi - lo), color="#f3d9cc", lw=0, zorder=0)
        jitter = rng.uniform(-0.3, 0.3, int(sel.sum()))
        for k, name in enumerate(CLIP_CLASSES):
            pick = cls[sel] == k
            ax.scatter(np.exp(logr[sel][pick]), y + jitter[pick], s=7, alpha=0.75, lw=0,
                       color=_CLIP_COLORS[name], zorder=2 + (k > 0),
                       label=None if y else f"{name} ({(cls == k).mean():.1%})")
    for x in (1 - eps_low, 1.0, 1 + eps_high):
        ax.axvline(x, color="#555555" if x != 1.0 else "#bbbbbb", lw=1, ls="--", zorder=1)
    ax.set_yticks(range(len(rows)), [r[0] for r in rows])
    ax.set_ylim(len(rows) - 0.5, -0.5)
    ax.set_xlim(lo, hi)
    ax.grid(False)
    ax.set_xlabel("importance ratio r (shaded: zero-gradient dead zone)")
    ax.set_title("Phantom clipping: every token of one batch, with and without beta")
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=4, markerscale=2.5)
    return ax


def plot_run_metric(logs: Mapping, metric: str = "reward", ax: Axes | None = None,
                    styles: Mapping[str, dict] | None = None, ylabel: str | None = None) -> Axes:
    """One RunLog field (reward, clip, phantom, beta_abs, changed, ...) against the optimizer step, per run."""
    ax = get_axes(ax)
    styles = styles or {}
    for name, log in logs.items():
        values = getattr(log, metric)
        ax.plot(np.arange(len(values)), values, label=name, **styles.get(name, {}))
    ax.set_xlabel("optimizer step")
    ax.set_ylabel(ylabel or metric)
    ax.set_title({"reward": "Mean reward (= minus the completion length)"}.get(
        metric, f"{ylabel or metric} per step"))
    legend_outside(ax)
    return ax


def plot_beta_vs_logprob(logp, beta, eos=None, ax: Axes | None = None, bins: int = 12) -> Axes:
    """|beta| (log scale) against the token's log-probability, with the median per bin; EOS marked."""
    ax = get_axes(ax)
    logp, mag = np.asarray(logp, dtype=np.float64), np.abs(np.asarray(beta, dtype=np.float64))
    eos = np.zeros(logp.shape, bool) if eos is None else np.asarray(eos, bool)
    floor = max(mag[mag > 0].min() if (mag > 0).any() else 1e-6, 1e-6)
    shown = np.maximum(mag, floor)
    ax.scatter(logp[~eos], shown[~eos], s=3, alpha=0.25, lw=0, color=PALETTE["sky"],
               label="other tokens")
    if eos.any():
        ax.scatter(logp[eos], shown[eos], s=10, alpha=0.8, lw=0, color=PALETTE["orange"],
                   label="EOS", zorder=3)
    edges = np.quantile(logp, np.linspace(0, 1, bins + 1))
    centers, medians = [], []
    for a, b in pairwise(edges):
        sel = (logp >= a) & (logp <= b)
        if sel.any():
            centers.append(np.median(logp[sel]))
            medians.append(np.median(mag[sel]))
    ax.plot(centers, np.maximum(medians, floor), color=PALETTE["black"], marker="o", ms=4,
            label="median |beta| per bin", zorder=4)
    ax.set_yscale("log")
    ax.set_xlabel("log-probability of the token")
    ax.set_ylabel("|beta| = |f_fp32 - f_bf16|")
    ax.set_title("Precision gap by token probability")
    legend_outside(ax, markerscale=2)
    return ax


def plot_beta_by_offset(offsets, curves: Mapping[str, np.ndarray], fmt="bfloat16",
                        ax: Axes | None = None) -> Axes:
    """Mean |beta| against the common logit level, with the mean rounding error ulp/4 of fmt there."""
    ax = get_axes(ax)
    fmt = get_format(fmt)
    x = np.asarray(offsets, dtype=np.float64)
    labels = {"full": "fp32 vs bf16 forward", "logits_only": "only the logits rounded"}
    markers = {"full": "o", "logits_only": "s"}
    for key, y in curves.items():
        if key in labels:
            ax.plot(np.maximum(x, 0.5), y, marker=markers[key], label=labels[key])
    fine = np.geomspace(0.5, max(x.max(), 1.0), 400)
    ax.step(fine, np.asarray(ulp(fine, fmt)) / 4, where="post", color="#888888", ls=":",
            label=f"ulp/4 of {fmt.name} (mean |rounding error|)")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("common logit level (offset; 0 drawn at 0.5)")
    ax.set_ylabel("mean |beta| over sampled tokens")
    ax.set_title("beta follows the grid spacing where the logits live")
    legend_outside(ax)
    return ax
