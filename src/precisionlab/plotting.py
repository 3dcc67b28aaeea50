"""House style and reusable figures. Every figure function takes `ax=None`, returns the Axes
it drew on, and never calls `plt.show()`."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence

import matplotlib as mpl
import numpy as np
from matplotlib.axes import Axes
from matplotlib.colors import LogNorm

from .formats import FloatFormat, get_format
from .rounding import round_to, ulp
from .updates import TrainingRun, crossing_trajectory, steps_to_cross

__all__ = [
    "FORMAT_COLORS",
    "FORMAT_LINESTYLES",
    "PALETTE",
    "POLICY_STYLES",
    "format_grid",
    "format_style",
    "legend_outside",
    "plot_changed_fraction",
    "plot_crossing_heatmap",
    "plot_crossing_trajectory",
    "plot_number_line",
    "plot_training_curves",
    "plot_ulp_vs_magnitude",
    "use_house_style",
]

# Okabe & Ito's colour-blind-safe palette (yellow left out: too faint on white).
PALETTE: dict[str, str] = {
    "black": "#000000",
    "orange": "#E69F00",
    "sky": "#56B4E9",
    "green": "#009E73",
    "blue": "#0072B2",
    "vermillion": "#D55E00",
    "purple": "#CC79A7",
}

# One colour per format in every figure of the book (the only format -> colour mapping:
# plotting functions and widgets look colours up here or through format_style). float16 and
# bfloat16, the pair most often drawn together, get two hues far apart (orange, green).
FORMAT_COLORS: dict[str, str] = {
    "float64": PALETTE["black"],
    "float32": PALETTE["blue"],
    "tf32": PALETTE["sky"],
    "float16": PALETTE["orange"],
    "bfloat16": PALETTE["green"],
    "float8_e4m3fn": PALETTE["purple"],
    "float8_e5m2": PALETTE["vermillion"],
}

# A line style per format as well, so that curves that coincide stay visible (the narrower
# format is drawn dashed on top of the wider one) and figures read in grey.
FORMAT_LINESTYLES: dict[str, str] = {
    "float64": "-", "float32": "-", "tf32": (0, (5, 1.5)), "float16": (0, (4, 2.2)),
    "bfloat16": (0, (7, 2, 1.5, 2)), "float8_e4m3fn": (0, (1.2, 1.6)),
    "float8_e5m2": (0, (3, 1.5, 1, 1.5, 1, 1.5)),
}


def format_style(fmt) -> dict:
    """Colour and line style of a format (a registry name, an alias such as bf16, or a FloatFormat)."""
    name = get_format(fmt).name
    return {"color": FORMAT_COLORS[name], "linestyle": FORMAT_LINESTYLES[name]}


def legend_outside(ax: Axes, **kwargs):
    """A legend to the right of the axes, where it can cover no data."""
    kwargs.setdefault("fontsize", 8.5)
    return ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0, **kwargs)


POLICY_STYLES: dict[str, dict] = {
    "fp32": {"color": FORMAT_COLORS["float32"], "label": "fp32 weights", "linestyle": "-"},
    "bf16": {"color": FORMAT_COLORS["bfloat16"], "label": "bf16-stored weights", "linestyle": "-"},
    "master": {"color": PALETTE["black"], "label": "fp32 master + bf16 copy", "linestyle": "--"},
    "bf16_stochastic": {"color": FORMAT_COLORS["bfloat16"], "label": "bf16-stored, stochastic rounding",
                        "linestyle": ":", "marker": "o", "markevery": 15, "ms": 4},
}

_HOUSE_STYLE = {
    "figure.figsize": (7.0, 4.2),
    "figure.dpi": 110,
    "savefig.dpi": 110,
    "figure.autolayout": True,
    "font.size": 11,
    "axes.titlesize": 12,
    "axes.titleweight": "bold",
    "axes.labelsize": 11,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "axes.grid": True,
    "grid.color": "#dddddd",
    "grid.linewidth": 0.7,
    "axes.prop_cycle": mpl.cycler(color=list(PALETTE.values())),
    "legend.frameon": False,
    "legend.fontsize": 9.5,
    "lines.linewidth": 1.8,
    "image.cmap": "viridis",
}


def use_house_style() -> None:
    """Apply the book's matplotlib rcParams (clean axes, light grid, colour-blind-safe cycle)."""
    mpl.rcParams.update(_HOUSE_STYLE)


def _axes(ax: Axes | None) -> Axes:
    if ax is None:
        import matplotlib.pyplot as plt

        _, ax = plt.subplots()
    return ax


# --------------------------------------------------------------------------- formats


def plot_ulp_vs_magnitude(formats: Iterable[str | FloatFormat] = ("float32", "tf32", "float16",
                                                                  "bfloat16", "float8_e4m3fn",
                                                                  "float8_e5m2"),
                          ax: Axes | None = None) -> Axes:
    """ulp(x) against |x| on log-log axes, from each format's smallest subnormal to its largest value."""
    ax = _axes(ax)
    for f in formats:
        fmt = get_format(f)
        # ulp is constant on each binade [2^e, 2^(e+1)) and equal to the smallest subnormal
        # below 2·min_normal: one step per binade edge draws it exactly.
        edges = np.ldexp(1.0, np.arange(fmt.emin + 1, fmt.emax + 1))
        xs = np.concatenate([[fmt.min_subnormal], edges, [fmt.max_finite]])
        us = np.asarray(ulp(xs, fmt))
        color = FORMAT_COLORS.get(fmt.name)
        ax.step(xs, us, where="post", label=fmt.name, **format_style(fmt))
        ax.plot([fmt.min_normal], [ulp(fmt.min_normal, fmt)], "o", color=color, ms=5)
        ax.plot([fmt.max_finite], [ulp(fmt.max_finite, fmt)], "^", color=color, ms=6)
    ax.set_xscale("log", base=10)
    ax.set_yscale("log", base=10)
    ax.set_xlabel("magnitude |x|")
    ax.set_ylabel("ulp(x): gap to the next value")
    ax.set_title("Spacing of representable values")
    handles, labels = ax.get_legend_handles_labels()
    marker_handles = [
        mpl.lines.Line2D([], [], color="grey", marker="o", linestyle="none", label="min normal"),
        mpl.lines.Line2D([], [], color="grey", marker="^", linestyle="none", label="max finite"),
    ]
    legend_outside(ax, handles=[*handles, *marker_handles],
                   labels=[*labels, "min normal", "max finite"])
    return ax


def format_grid(fmt, lo: float, hi: float, max_values: int = 2000) -> np.ndarray:
    """All finite values of fmt in [lo, hi], ascending; raises if there are more than max_values."""
    fmt = get_format(fmt)
    if not (np.isfinite(lo) and np.isfinite(hi) and lo < hi):
        raise ValueError(f"need finite lo < hi; got lo={lo!r}, hi={hi!r}")

    def nonneg(a: float, b: float) -> list[np.ndarray]:
        # Binade e >= emin + 1 holds k·2^(e-m) on [2^e, 2^(e+1)); below 2^(emin+1) the step is
        # the smallest subnormal all the way down to 0. Loop over binades, not values.
        b = min(b, fmt.max_finite)
        if b < a:
            return []
        e_a, e_b = (int(np.clip(np.floor(np.log2(t)), fmt.emin, fmt.emax)) if t > 0 else fmt.emin
                    for t in (a, b))
        out, count = [], 0
        for e in range(e_a, e_b + 1):
            step = 2.0 ** (e - fmt.mantissa_bits)
            seg_lo = 0.0 if e == fmt.emin else 2.0**e
            first = np.ceil(max(a, seg_lo) / step)
            last = min(np.floor(b / step), 2.0 ** (e + 1) / step - 1)
            count += max(0, int(last - first) + 1)
            if count > max_values:
                raise ValueError(
                    f"[{lo!r}, {hi!r}] holds more than {max_values} {fmt.name} values; "
                    "narrow the window"
                )
            out.append(step * np.arange(first, last + 1))
        return out

    parts = nonneg(max(lo, 0.0), hi) if hi >= 0 else []
    if lo < 0:
        parts += [-p for p in nonneg(max(-hi, 0.0), -lo)]
    grid = np.unique(np.concatenate(parts)) + 0.0 if parts else np.array([])  # + 0.0: no -0
    return grid[(grid >= lo) & (grid <= hi)]


def plot_number_line(fmt, lo: float, hi: float, x: float | None = None,
                     mode: str = "nearest_even", ax: Axes | None = None) -> Axes:
    """fmt's representable values in [lo, hi] as ticks, with rounding midpoints, x, its neighbours and fl(x)."""
    fmt = get_format(fmt)
    ax = _axes(ax)
    grid = format_grid(fmt, lo, hi)
    ax.axhline(0, color="#888888", lw=1, zorder=1)
    ax.vlines(grid, -0.35, 0.35, color=FORMAT_COLORS.get(fmt.name, "k"), lw=1.6,
              label=f"{fmt.name} values", zorder=2)
    if len(grid) > 1:
        mids = (grid[1:] + grid[:-1]) / 2
        ax.vlines(mids, -0.15, 0.15, color="#999999", lw=1, linestyles=":",
                  label="rounding midpoints", zorder=2)
    if x is not None:
        x = float(x)
        below = float(round_to(x, fmt, "down"))
        above = float(round_to(x, fmt, "up"))
        fx = float(round_to(x, fmt, mode, rng=np.random.default_rng(0)))
        for nb in {below, above}:
            ax.annotate(f"{nb:.8g}", (nb, 0.4), xytext=(0, 4), textcoords="offset points",
                        ha="center", va="bottom", fontsize=8.5)
        ax.vlines([below, above], -0.5, 0.5, color="#444444", lw=2.4,
                  label="neighbours of x", zorder=3)
        ax.plot([x], [0], marker="v", ms=11, color=PALETTE["black"], linestyle="none",
                label=f"x = {x:.10g}", zorder=4)
        ax.plot([fx], [0], marker="o", ms=10, mfc="none", mew=2, color=PALETTE["black"],
                linestyle="none", label=f"fl(x) = {fx:.8g} ({mode})", zorder=4)
    ax.set_ylim(-1.0, 1.3)
    ax.set_yticks([])
    ax.grid(False)
    ax.spines["left"].set_visible(False)
    ax.set_xlim(lo, hi)
    ax.set_xlabel("value")
    ax.set_title(f"{fmt.name} near {x:.6g}" if x is not None else f"{fmt.name} values")
    ax.legend(loc="upper center", ncol=3, bbox_to_anchor=(0.5, -0.32), fontsize=8.5)
    return ax


# --------------------------------------------------------------------------- updates


def plot_crossing_heatmap(magnitudes: Sequence[float], lrs: Sequence[float], fmt="bfloat16",
                          ax: Axes | None = None) -> Axes:
    """Exact steps to the first change of fl(w), w = fl(magnitude), over magnitude x learning rate."""
    ax = _axes(ax)
    fmt = get_format(fmt)
    mags = np.asarray(magnitudes, dtype=np.float64)
    rates = np.asarray(lrs, dtype=np.float64)
    w = np.asarray(round_to(mags, fmt), dtype=np.float64)
    k = steps_to_cross(w[:, None], rates[None, :], fmt)
    im = ax.imshow(k, norm=LogNorm(vmin=1, vmax=max(k.max(), 10)), cmap="viridis",
                   aspect="auto")
    for i in range(k.shape[0]):
        for j in range(k.shape[1]):
            light = k[i, j] < np.sqrt(max(k.max(), 10))
            ax.text(j, i, f"{k[i, j]:,}", ha="center", va="center", fontsize=9,
                    color="white" if light else "black")
    ax.set_xticks(range(len(rates)), [f"{r:g}" for r in rates])
    ax.set_yticks(range(len(mags)), [f"{m:g}" for m in mags])
    ax.set_xlabel("learning rate (update per step)")
    ax.set_ylabel("weight magnitude |W|")
    ax.set_title(f"Steps until the {fmt.name} copy changes")
    ax.grid(False)
    ax.figure.colorbar(im, ax=ax, label="steps (log scale)")
    return ax


def plot_crossing_trajectory(w: float, lr: float, steps: int, fmt="bfloat16",
                             master: str = "float32", ax: Axes | None = None) -> Axes:
    """The master weight w + k·lr rising steadily while its fmt copy moves in jumps at the midpoints."""
    ax = _axes(ax)
    fmt = get_format(fmt)
    k, wm, copy = crossing_trajectory(w, lr, steps, fmt, master=master)
    ax.plot(k, wm, color=format_style(master)["color"], label=f"{master} master weight")
    ax.step(k, copy, where="post", color=FORMAT_COLORS.get(fmt.name, "k"),
            label=f"{fmt.name} copy")
    lo, hi = min(wm.min(), copy.min()), max(wm.max(), copy.max())
    grid = format_grid(fmt, lo - abs(lo) * 1e-9, hi + abs(hi) * 1e-9)
    mids = (grid[1:] + grid[:-1]) / 2
    for j, m in enumerate(mids):
        ax.axhline(m, color="#999999", lw=1, ls=":", label="rounding midpoint" if j == 0 else None)
    ax.set_xlabel("optimizer step k")
    ax.set_ylabel("weight value")
    ax.set_title(f"w = {w:g}, lr = {lr:g}: master vs {fmt.name} copy")
    ax.ticklabel_format(axis="y", useOffset=False)
    legend_outside(ax)
    return ax


def plot_training_curves(runs: Mapping[str, TrainingRun], ax: Axes | None = None) -> Axes:
    """Loss against optimizer step (log scale) for each storage policy."""
    ax = _axes(ax)
    for name, run in runs.items():
        style = POLICY_STYLES.get(name, {"label": name})
        ax.plot(np.arange(len(run.loss)), run.loss, **style)
    ax.set_yscale("log")
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("training loss")
    ax.set_title("Loss under different weight-storage policies")
    legend_outside(ax)
    return ax


def plot_changed_fraction(runs: Mapping[str, TrainingRun], ax: Axes | None = None,
                          window: int = 5) -> Axes:
    """Fraction of the forward-pass weights that changed at each step (moving average over `window`)."""
    ax = _axes(ax)
    kernel = np.ones(window) / window
    for name, run in runs.items():
        style = POLICY_STYLES.get(name, {"label": name})
        frac = np.convolve(run.changed, kernel, mode="valid") if window > 1 else run.changed
        ax.plot(np.arange(len(frac)) + window, frac, **style)
    ax.set_ylim(-0.03, 1.05)
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("fraction of weights that changed")
    ax.set_title("Which weights actually move")
    legend_outside(ax)
    return ax



# --------------------------------------------------------------------------- reductions (chapter 2)

__all__ += ["plot_flip_probability", "plot_residual_histories", "plot_sum_outcomes"]

_DECISION_COLORS = {"stop": PALETTE["blue"], "continue": PALETTE["vermillion"]}


def plot_sum_outcomes(sums, exact: float, tol: float, acc="float32",
                      marks: Mapping[str, float] | None = None, title: str | None = None,
                      ax: Axes | None = None) -> Axes:
    """Counts of each rounded sum S_i, placed at (S_i - S)/ulp_acc(S), coloured by the test S_i < tol."""
    ax = _axes(ax)
    fmt = get_format(acc)
    unit = float(ulp(exact, fmt))
    values, counts = np.unique(np.asarray(sums, dtype=np.float64), return_counts=True)
    pos = (values - exact) / unit
    width = 0.8 * (np.min(np.diff(pos)) if pos.size > 1 else 1.0)
    frac = counts / counts.sum()
    stop = values < tol
    for key, sel in (("stop", stop), ("continue", ~stop)):
        if sel.any():
            ax.bar(pos[sel], frac[sel], width=width, color=_DECISION_COLORS[key],
                   label=f"{'S < tol' if key == 'stop' else 'S ≥ tol'}: {key} ({frac[sel].sum():.1%})")
    ax.axvline((tol - exact) / unit, color=PALETTE["black"], ls="--", lw=1.4, label="tol")
    ax.axvline(0.0, color="#777777", ls=":", lw=1.4, label="exact sum")
    if marks:
        top = frac.max() * 1.08
        for j, (name, v) in enumerate(marks.items()):
            x = (float(v) - exact) / unit
            ax.plot([x], [top], marker="v", ms=8, color=PALETTE["green"], linestyle="none")
            ax.annotate(name, (x, top), xytext=(0, 6 + 11 * (j % 3)), textcoords="offset points",
                        ha="center", fontsize=8.5, color=PALETTE["green"])
        ax.set_ylim(0, frac.max() * 1.45)
    ax.set_xlabel(f"rounded sum - exact sum, in {fmt.name} ulps of the exact sum")
    ax.set_ylabel("fraction of runs")
    ax.set_title(title or f"Rounded sums in a {fmt.name} accumulator")
    legend_outside(ax)
    return ax


def plot_flip_probability(margins, curves: Mapping[str, Sequence[float]],
                          below: Mapping[str, Sequence[float]] | None = None,
                          ax: Axes | None = None) -> Axes:
    """P(the rounded test S < tol disagrees with the exact one) against |tol - S|/S, per accumulator.

    curves: tol above the exact sum (the exact test says stop); below (dashed, optional): tol
    the same distance below it (the exact test says continue).
    """
    ax = _axes(ax)
    m = np.asarray(margins, dtype=np.float64)
    for name, probs in curves.items():
        try:
            color = FORMAT_COLORS.get(get_format(name).name)
        except ValueError:  # a label that is not a format name: use the colour cycle
            color = None
        line, = ax.plot(m, np.asarray(probs), marker="o", ms=3.5, color=color,
                        label=f"{name}: tol above S")
        if below and name in below:
            ax.plot(m, np.asarray(below[name]), ls="--", marker="s", ms=3, mfc="none",
                    color=line.get_color(), label=f"{name}: tol below S")
    ax.set_xscale("log")
    ax.set_ylim(-0.02, 1.02)
    ax.set_xlabel("relative margin |tol - S| / S (S: the exact sum)")
    ax.set_ylabel("fraction of orders that flip the test")
    ax.set_title("How close to tol can a reduction get?")
    legend_outside(ax)
    return ax


def plot_residual_histories(histories: Mapping[str, Sequence[float]],
                            tol: float | Sequence[float] | None = None,
                            ax: Axes | None = None) -> Axes:
    """Relative residual ||b - A x_k|| / ||b|| against iteration k (log scale), one line per device profile."""
    ax = _axes(ax)
    for name, res in histories.items():
        r = np.asarray(res, dtype=np.float64)
        try:
            color = format_style(name)["color"]  # profile names are format aliases (bf16, ...)
        except ValueError:
            color = None
        ax.plot(np.arange(r.size), r, marker=".", color=color, label=f"{name} matmuls")
    tols = [] if tol is None else np.atleast_1d(np.asarray(tol, dtype=np.float64))
    for j, t in enumerate(tols):
        ax.axhline(t, color=PALETTE["black"], ls="--", lw=1, label="tolerances" if j == 0 else None)
    ax.set_yscale("log")
    ax.set_xlabel("iteration k")
    ax.set_ylabel("relative residual")
    ax.set_title("Jacobi iteration: the residual each profile can reach")
    legend_outside(ax)
    return ax


# --------------------------------------------------------------------------- RL (chapter 6)
# Figures for precisionlab.rl: phantom clipping, beta, training runs.

_CLIP_COLORS = {
    "unclipped": "#9a9a9a",
    "phantom": PALETTE["vermillion"],
    "legitimate": PALETTE["blue"],
    "released": PALETTE["purple"],
}


def plot_phantom_strip(alpha, beta, adv, eps_low: float = 0.2, eps_high: float = 0.2,
                       rng: np.random.Generator | None = None, ax: Axes | None = None) -> Axes:
    """Tokens placed by ratio exp(alpha + beta) and by the clean exp(alpha), coloured by clip class, dead zones shaded."""
    import torch

    from .rl import CLIP_CLASSES, classify_clipping

    ax = _axes(ax)
    rng = np.random.default_rng(0) if rng is None else rng
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
    ax = _axes(ax)
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
    ax = _axes(ax)
    logp, mag = np.asarray(logp, dtype=np.float64), np.abs(np.asarray(beta, dtype=np.float64))
    eos = np.zeros(logp.shape, bool) if eos is None else np.asarray(eos, bool)
    floor = max(mag[mag > 0].min() if (mag > 0).any() else 1e-6, 1e-6)
    shown = np.maximum(mag, floor)
    ax.scatter(logp[~eos], shown[~eos], s=3, alpha=0.25, lw=0, color=PALETTE["sky"],
               label="other tokens")
    if eos.any():
        ax.scatter(logp[eos], shown[eos], s=10, alpha=0.8, lw=0, color=PALETTE["orange"],
                   label="EOS", zorder=3)
    from itertools import pairwise

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
    ax = _axes(ax)
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


__all__ += ["plot_beta_by_offset", "plot_beta_vs_logprob", "plot_phantom_strip",
            "plot_run_metric"]


# --------------------------------------------------------------------------- underflow and loss scaling (chapters 4 and 5)

__all__ += ["plot_attenuation_model", "plot_layer_gradients", "plot_loss_curves",
            "plot_scale_history", "plot_zero_fraction"]

_FLOOR_STYLES = {"normal": ("--", "smallest normal"), "subnormal": ("-", "smallest subnormal q"),
                 "zero": (":", "q/2: rounds to 0")}


def _floor_lines(ax: Axes, fmt, floors=("normal", "subnormal", "zero")) -> None:
    from .underflow import floor_value

    f = get_format(fmt)
    for floor in floors:
        ls, label = _FLOOR_STYLES[floor]
        ax.axhline(floor_value(f, floor), color=FORMAT_COLORS.get(f.name, "k"), ls=ls, lw=1.2,
                   label=f"{f.name} {label}")


def plot_attenuation_model(attenuation: float, depth: int, fmt="float16", g0: float = 1.0,
                           ax: Axes | None = None) -> Axes:
    """g0·a^k against depth k (log scale) with fmt's floors and the first depth past each."""
    from .underflow import first_underflow_depth, gradient_by_depth

    ax = _axes(ax)
    f = get_format(fmt)
    g = gradient_by_depth(attenuation, depth, g0)
    ax.plot(np.arange(depth), g, color=PALETTE["black"], label=f"model g0·a^k, a = {attenuation:g}")
    _floor_lines(ax, f)
    for floor, marker in (("normal", "s"), ("zero", "o")):
        k = first_underflow_depth(attenuation, f, g0, floor)
        if k is not None and k < depth:
            ax.plot([k], [g[k]], marker=marker, ms=8, mfc="none", mew=2,
                    color=PALETTE["black"], linestyle="none",
                    label=f"first depth past {_FLOOR_STYLES[floor][1].split(':')[0]}: {k}")
    ax.set_yscale("log")
    ax.set_ylim(min(g.min(), f.min_subnormal / 4) / 3, max(g.max(), f.min_normal) * 3)
    ax.set_xlabel("depth k (layers below the loss)")
    ax.set_ylabel("typical gradient entry")
    ax.set_title(f"Attenuation model: a = {attenuation:g}, {depth} layers, {f.name}")
    legend_outside(ax)
    return ax


def plot_layer_gradients(probes: Mapping, which: str = "signal", model=None,
                         ax: Axes | None = None) -> Axes:
    """Median |gradient| per depth for each probe (format); zeros drawn on the bottom edge; model = (a, g0)."""
    ax = _axes(ax)
    from .underflow import floor_value

    positive = [p.stats(which).median_abs for p in probes.values()]
    lowest = min([m[m > 0].min() for m in positive if (m > 0).any()] + [floor_value("float16")])
    bottom = lowest / 20  # exact zeros are drawn just above this edge
    for j, (name, probe) in enumerate(probes.items()):
        med = probe.stats(which).median_abs
        k = np.arange(med.size)
        style = format_style(probe.fmt)
        color = style["color"]
        # Each format has its own dash pattern and later probes are drawn on top, narrower,
        # so a float16 curve that coincides with float32's shows through its gaps.
        ax.plot(k, np.where(med > 0, med, np.nan), lw=max(3.0 - 0.8 * j, 1.4), zorder=2 + j,
                label=f"{name}", **style)
        zero = med == 0
        if zero.any():
            ax.plot(k[zero], np.full(zero.sum(), bottom * 2), "v", ms=4, color=color,
                    label=f"{name}: median exactly 0")
    if model is not None:
        a, g0 = model
        depth = max(len(p.stats(which).median_abs) for p in probes.values())
        ax.plot(np.arange(depth), g0 * np.power(float(a), np.arange(depth)), color=PALETTE["black"],
                ls="--", lw=1.2, label=f"model g0·a^k (a = {a:g})")
    _floor_lines(ax, "float16", ("zero",))
    ax.set_yscale("log")
    ax.set_ylim(bottom, None)
    ax.set_xlabel("depth k (layers below the loss)")
    what = {"signal": "dL/dh (backward signal)", "weight": "dL/dW (weight gradient)"}[which]
    ax.set_ylabel(f"median |{what.split(' ')[0]}|")
    ax.set_title(f"Typical {what} by depth")
    legend_outside(ax)
    return ax


def plot_zero_fraction(probes: Mapping, which: str = "weight", ax: Axes | None = None) -> Axes:
    """Fraction of exactly-zero gradient entries per depth for each probe; which: weight, signal or both."""
    ax = _axes(ax)
    kinds = ("weight", "signal") if which == "both" else (which,)
    names = {"weight": "dL/dW", "signal": "dL/dh"}
    for name, probe in probes.items():
        for kind, ls in zip(kinds, ("-", "--"), strict=False):
            z = probe.stats(kind).zero_fraction
            label = name if len(kinds) == 1 else f"{name}, {names[kind]}"
            ax.plot(np.arange(z.size), z, color=FORMAT_COLORS.get(probe.fmt), ls=ls, label=label)
    ax.axhline(0.5, color="#888888", ls=":", lw=1, label="half the entries")
    ax.set_ylim(-0.03, 1.03)
    ax.set_xlabel("depth k (layers below the loss)")
    ax.set_ylabel("fraction exactly zero")
    shown = " and ".join(names[k] for k in kinds)
    ax.set_title(f"Exact zeros in {shown} by depth")
    legend_outside(ax)
    return ax


def plot_scale_history(histories: Mapping, ax: Axes | None = None,
                       styles: Mapping[str, dict] | None = None) -> Axes:
    """log2 of the loss scale per step for each ScaleHistory, skipped steps marked with crosses."""
    ax = _axes(ax)
    styles = styles or {}
    for j, (name, h) in enumerate(histories.items()):
        style = {"lw": 1.8, **styles.get(name, {})}
        line, = ax.step(np.arange(h.steps), np.log2(h.scale), where="post", label=name, **style)
        sk = h.skipped_steps
        if sk.size:
            ax.plot(sk, np.log2(h.scale[sk]), "x", ms=7, mew=2, color=line.get_color(),
                    label=f"{name}: skipped steps ({sk.size})", zorder=3 + j)
    ax.set_xlabel("step")
    ax.set_ylabel("log2(loss scale)")
    ax.set_title("Loss scale per step")
    legend_outside(ax)
    return ax


def plot_loss_curves(losses: Mapping[str, Sequence[float]], relative: bool = True,
                     ax: Axes | None = None, styles: Mapping[str, dict] | None = None) -> Axes:
    """Loss per step (divided by the first loss when relative), log scale, one line per run."""
    ax = _axes(ax)
    styles = styles or {}
    for name, loss in losses.items():
        y = np.asarray(loss, dtype=np.float64)
        if relative:
            y = y / y[0]
        ax.plot(np.arange(y.size), y, label=name, **styles.get(name, {}))
    ax.set_yscale("log")
    ax.set_xlabel("step")
    ax.set_ylabel("loss / initial loss" if relative else "loss")
    ax.set_title("Training loss")
    legend_outside(ax)
    return ax


# --------------------------------------------------------------------------- the bouncing ball (chapter 3)

__all__ += ["plot_height_gap", "plot_heights", "plot_parameter_sweep", "plot_solver_passes",
            "plot_stiffness_map"]


def plot_heights(h: float, heights: Mapping[str, Sequence[float]],
                 contacts: Mapping[str, int] | None = None, ax: Axes | None = None) -> Axes:
    """Height y_t against time t h, one line per run; a dot at each run's first-contact step."""
    ax = _axes(ax)
    colors = (PALETTE["blue"], PALETTE["vermillion"], PALETTE["green"], PALETTE["purple"])
    for j, (name, y) in enumerate(heights.items()):
        y = np.asarray(y, dtype=np.float64)
        t = np.arange(y.size) * h
        style = {"color": colors[j % len(colors)], "lw": 1.6, "ls": "-" if j == 0 else "--"}
        ax.plot(t, y, label=name, **style)
        if contacts and name in contacts and contacts[name] >= 0:
            c = int(contacts[name]) + 1  # the state after the contact step
            ax.plot([t[c]], [y[c]], "o", ms=6, color=style["color"], mfc="none", mew=1.6)
    ax.axhline(0.0, color="#777777", lw=1)
    ax.set_xlabel("time (s)")
    ax.set_ylabel("height y (m)")
    ax.set_title("Two rollouts, first contacts circled")
    ax.legend(fontsize=8.5)
    return ax


def plot_height_gap(h: float, a: Sequence[float], b: Sequence[float], ax: Axes | None = None) -> Axes:
    """|y_a - y_b| against time on a log scale; steps where the runs agree exactly are left out."""
    ax = _axes(ax)
    gap = np.abs(np.asarray(a, dtype=np.float64) - np.asarray(b, dtype=np.float64))
    t = np.arange(gap.size) * h
    shown = gap > 0
    ax.plot(t[shown], gap[shown], ".", ms=3.5, color=PALETTE["black"])
    ax.set_yscale("log")
    ax.set_xlabel("time (s)")
    ax.set_ylabel("|difference| (m)")
    ax.set_title("Gap between the two rollouts")
    return ax


def plot_parameter_sweep(k, values, iterations=None, ylabel: str = "value", label: str | None = None,
                         ax: Axes | None = None, **style) -> Axes:
    """values(k) as dots; dashed verticals where the total solver iteration count changes."""
    ax = _axes(ax)
    k = np.asarray(k, dtype=np.float64)
    ax.plot(k, np.asarray(values, dtype=np.float64), ".", ms=3.5, label=label, **style)
    if iterations is not None:
        it = np.asarray(iterations)
        for j in np.flatnonzero(np.diff(it)):
            ax.axvline(0.5 * (k[j] + k[j + 1]), color="#999999", ls="--", lw=0.8)
    ax.set_xlabel("gain k")
    ax.set_ylabel(ylabel)
    if label:
        ax.legend(fontsize=8.5)
    return ax


def plot_stiffness_map(smap, forward_limit: float = 1.0, backward_limit: float = 100.0,
                       ax: Axes | None = None) -> Axes:
    """Regions of a world.StiffnessMap over (stiffness k, step size h): both fine, backward only, forward."""
    from matplotlib.colors import ListedColormap

    ax = _axes(ax)
    codes = smap.regions(forward_limit, backward_limit)
    cmap = ListedColormap(["#dce9f5", PALETTE["orange"], "#555555"])
    ax.pcolormesh(smap.k, smap.h, codes, cmap=cmap, vmin=-0.5, vmax=2.5, shading="nearest")
    kk = np.geomspace(smap.k.min(), smap.k.max(), 50)
    ax.plot(kk, 2 / np.sqrt(kk), color=PALETTE["black"], ls=":", lw=1.2, label="h √k = 2")
    ax.set_xscale("log")
    ax.set_yscale("log")
    if smap.k.min() < smap.k.max():
        ax.set_xlim(smap.k.min(), smap.k.max())
    if smap.h.min() < smap.h.max():
        ax.set_ylim(smap.h.min(), smap.h.max())
    ax.set_xlabel("stiffness k (1/s²)")
    ax.set_ylabel("step size h (s)")
    ax.set_title(f"{smap.integrator.replace('_', '-')} Euler")
    from matplotlib.patches import Patch

    handles = [Patch(facecolor=c, edgecolor="#888888", label=text) for c, text in (
        ("#dce9f5", "forward and backward fine"),
        (PALETTE["orange"], f"forward fine, |k dy/dk| > {backward_limit:g} y0"),
        ("#555555", f"forward grows (max |y| > {forward_limit:g} y0)"))]
    ax.legend(handles=handles + ax.get_legend_handles_labels()[0], fontsize=8, loc="lower left",
              frameon=True, framealpha=0.9)
    return ax


def plot_solver_passes(runs: Mapping[str, np.ndarray], flips=None, ax: Axes | None = None) -> Axes:
    """Solver passes per step summed over scenes, one step line per run; x where a decision flipped."""
    ax = _axes(ax)
    colors = (PALETTE["vermillion"], PALETTE["blue"], PALETTE["green"])
    for j, (name, it) in enumerate(runs.items()):
        total = np.asarray(it).reshape(np.asarray(it).shape[0], -1).sum(axis=1)
        ax.step(np.arange(total.size), total, where="mid", color=colors[j % 3], label=name,
                lw=1.6 if j == 0 else 1.2, ls="-" if j == 0 else "--")
    if flips is not None:
        f = np.asarray(flips).reshape(np.asarray(flips).shape[0], -1).sum(axis=1)
        first = next(iter(runs.values()))
        total = np.asarray(first).reshape(f.size, -1).sum(axis=1)
        steps = np.flatnonzero(f)
        if steps.size:
            ax.plot(steps, total[steps], "x", ms=8, mew=2, color=PALETTE["black"],
                    label=f"decision the exact sum reverses ({int(f.sum())})")
    ax.set_xlabel("step")
    ax.set_ylabel("solver passes (all scenes)")
    ax.set_title("Projection solver work per step")
    ax.legend(fontsize=8.5)
    return ax


# --------------------------------------------------------------------------- interval bounds (chapter 7)

__all__ += ["plot_bound_bands", "plot_bound_widths", "plot_leaf_depths"]


def plot_leaf_depths(depths: Mapping[str, np.ndarray], ax: Axes | None = None) -> Axes:
    """Roundings on each summand's path (its leaf depth) against its index, one step line per order."""
    ax = _axes(ax)
    colors = (PALETTE["black"], PALETTE["blue"], PALETTE["orange"], PALETTE["green"],
              PALETTE["purple"], PALETTE["vermillion"], PALETTE["sky"])
    for j, (name, d) in enumerate(depths.items()):
        d = np.asarray(d)
        ax.step(np.arange(d.size), d, where="mid", color=colors[j % len(colors)], label=name,
                lw=1.8 if j == 0 else 1.4, ls="-" if j % 2 == 0 else "--")
    ax.set_xlabel("summand index i")
    ax.set_ylabel("roundings on its path")
    ax.set_title("Who pays for the order: leaf depths")
    legend_outside(ax)
    return ax


def plot_bound_widths(ks: Sequence[int], widths: Mapping[str, Sequence[float]],
                      observed: Sequence[float] | None = None, ax: Axes | None = None) -> Axes:
    """Error bounds (half-widths) against the inner dimension k, log-log, beside the largest observed error."""
    ax = _axes(ax)
    styles = ({"color": PALETTE["vermillion"], "ls": "--", "marker": "s"},
              {"color": PALETTE["blue"], "ls": "-", "marker": "o"},
              {"color": PALETTE["green"], "ls": "-.", "marker": "^"})
    for j, (name, w) in enumerate(widths.items()):
        ax.loglog(ks, w, label=name, ms=5, **styles[j % len(styles)])
    if observed is not None:
        ax.loglog(ks, observed, color=PALETTE["black"], ls=":", marker="x", label="largest error observed")
    ax.set_xlabel("inner dimension k")
    ax.set_ylabel("|computed - exact|")
    ax.set_title("Bound against observed error")
    legend_outside(ax)
    return ax


def plot_bound_bands(offset, structure, oblivious=None, ax: Axes | None = None,
                     title: str = "Reference against the target's bounds") -> Axes:
    """Per output element: reference - target (dots) inside or outside the bounds' ranges [lo - target, hi - target]."""
    ax = _axes(ax)
    offset = np.ravel(np.asarray(offset, dtype=np.float64))
    x = np.arange(offset.size)
    if oblivious is not None:
        lo, hi = (np.ravel(np.asarray(v, dtype=np.float64)) for v in oblivious)
        ax.fill_between(x, lo, hi, step="mid", color=PALETTE["sky"], alpha=0.25, lw=0,
                        label="order-oblivious bound")
    lo, hi = (np.ravel(np.asarray(v, dtype=np.float64)) for v in structure)
    ax.fill_between(x, lo, hi, step="mid", color=PALETTE["blue"], alpha=0.45, lw=0,
                    label="structure-aware bound")
    inside = (lo <= offset) & (offset <= hi)
    ax.plot(x[inside], offset[inside], "o", ms=4, color=PALETTE["black"], label="reference (inside)")
    if (~inside).any():
        ax.plot(x[~inside], offset[~inside], "X", ms=7, color=PALETTE["vermillion"],
                label="reference (outside)")
    span = np.max(np.abs(np.concatenate([lo, hi, offset])[np.isfinite(np.concatenate([lo, hi, offset]))]),
                  initial=1e-300)
    thresh = max(span * 1e-4, 1e-300)
    ax.set_yscale("symlog", linthresh=thresh)
    top = math.ceil(math.log10(span)) if span > 0 else 0
    decades = list(range(top, math.floor(math.log10(thresh)), -2))[:3]  # every other decade
    ax.set_yticks(sorted([-(10.0**d) for d in decades] + [0.0] + [10.0**d for d in decades]))
    ax.axhline(0, color="#888888", lw=0.8)
    ax.set_xlabel("output element")
    ax.set_ylabel("value - target")
    ax.set_title(title)
    legend_outside(ax)
    return ax
