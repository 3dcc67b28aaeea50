"""Per-layer health of an underflow probe: the status table and summary, and a diagnosis of a run."""

from __future__ import annotations

import math
import textwrap
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ..formats import FloatFormat, get_format
from ..tables import Table, show
from .network import STATUSES, LayerGradients

__all__ = ["Diagnosis", "diagnose", "health_summary", "health_table", "layer_status"]

def layer_status(grads: LayerGradients, which: str = "weight", fmt=None) -> np.ndarray:
    """Per layer: non-finite (inf/NaN), zero (all 0), underflowing (>= half 0), subnormal (median < min normal), healthy."""
    f: FloatFormat = get_format(fmt if fmt is not None else grads.fmt)
    st = grads.stats(which)
    status = np.full(grads.depth, "healthy", dtype=object)
    status[st.median_abs < f.min_normal] = "subnormal"
    status[st.zero_fraction >= 0.5] = "underflowing"
    status[st.zero_fraction == 1] = "zero"
    status[~st.finite] = "non-finite"
    return status


def health_table(grads: LayerGradients, depths: Sequence[int] | None = None, fmt=None) -> Table:
    """Per-layer table of the weight gradients (norm, median, max, % zeros, status) and % zero signal."""
    status = layer_status(grads, "weight", fmt)
    w, sig = grads.weight, grads.signal
    n = grads.depth
    rows = list(range(n) if depths is None else depths)
    for k in rows:
        if not 0 <= k < n:
            raise ValueError(f"depth {k!r} is outside 0..{n - 1}")
    return show([(k, n - 1 - k, w.norm[k], w.median_abs[k], w.max_abs[k], w.zero_fraction[k],
                  sig.zero_fraction[k], status[k]) for k in rows],
                [("depth", None), ("layer", None), ("|dL/dW|", ".3g"), ("median", ".3g"),
                 ("max", ".3g"), ("zeros", ".1%"), ("sig 0s", ".1%"), ("status", None)])


def health_summary(grads: LayerGradients, which: str = "weight", fmt=None) -> str:
    """Depth ranges by the worst status seen so far, from the loss downward, e.g. 'depth  0-26  healthy'.

    Underflow only gets worse with depth, but a layer near a threshold can flicker across it;
    carrying the worst status down keeps one line per stage. health_table shows every layer.
    """
    rank = {name: i for i, name in enumerate(STATUSES)}
    status = layer_status(grads, which, fmt)
    worst = np.maximum.accumulate([rank[x] for x in status])
    st = grads.stats(which)
    cuts = np.flatnonzero(worst[1:] != worst[:-1]) + 1
    starts = np.concatenate([[0], cuts])
    ends = np.concatenate([cuts, [grads.depth]]) - 1
    lines = []
    for s, e in zip(starts, ends, strict=True):
        zeros = st.zero_fraction[s:e + 1]
        lines.append(f"depth {s:>3}-{e:<3} {STATUSES[worst[s]]:<12} median "
                     f"{st.median_abs[s]:.2g} .. {st.median_abs[e]:.2g}, zeros "
                     f"{zeros.min():.0%} .. {zeros.max():.0%}")
    return "\n".join(lines)


@dataclass(frozen=True)
class Diagnosis:
    """What the numbers say: the likely cause, the evidence, what to check first, the cheapest fix."""

    cause: str  # "scale collapsing", "overflow", "underflow" or "none"
    evidence: str
    first_check: str
    first_fix: str

    def __str__(self) -> str:
        rows = [("likely cause", self.cause), ("evidence", self.evidence),
                ("first check", self.first_check), ("first fix", self.first_fix)]
        # Wrapped at 72 columns so that it reads in a notebook or a terminal without scrolling.
        return "\n".join(textwrap.fill(text, 72, initial_indent=f"{label:<13}: ",
                                        subsequent_indent=" " * 15) for label, text in rows)


def _scale_collapse(history) -> str | None:
    """Why a loss-scale record shows a collapsing scale, or None.

    Collapsing: the latest scale is below 1 (the scaler now shrinks gradients, so they overflow
    at their true size), or over the later half of the record after its first good step (all of
    it if none) the scale still fell by at least two factors of two, with skipped steps in it.
    A too-high start (skips until the first good step, then steady), however short the record,
    and the occasional probe above the ceiling are neither.
    """
    scale = np.asarray(history.scale, dtype=np.float64)
    skipped = np.asarray(history.skipped, dtype=bool)
    if scale.ndim != 1 or skipped.shape != scale.shape or scale.size == 0:
        raise ValueError("scale_history needs equal-length 1-D .scale and .skipped records")
    if not (np.isfinite(scale).all() and (scale > 0).all()):
        raise ValueError("scale_history.scale must hold finite scales > 0")
    last = scale[-1]
    if last < 1:
        return f"the loss scale has sunk to 2^{math.log2(last):g}, below 1"
    # Skips before the first good step are the scaler's initial search for a workable scale
    # (a too-high start); only what follows it counts. With no good step at all, everything does.
    good = np.flatnonzero(~skipped)
    first = int(good[0]) if good.size else 0
    half = first + (scale.size - first) // 2
    fell = math.log2(scale[half]) - math.log2(last)
    n_skip = int(skipped[half:].sum())
    if fell >= 2 and n_skip >= 2:
        return (f"the loss scale fell from 2^{math.log2(scale[half]):g} to 2^{math.log2(last):g}"
                f" over the last {scale.size - half} steps, {n_skip} of them skipped")
    return None


def diagnose(losses: Sequence[float], grads: LayerGradients, fmt=None,
             scale_history=None) -> Diagnosis:
    """Rules, in order: a collapsing loss scale (scale_history: .scale and .skipped per step) ->
    'scale collapsing'; inf/NaN in the loss or a gradient -> 'overflow'; layers whose weight
    gradients are mostly exact zeros -> 'underflow'; otherwise 'none'."""
    status = layer_status(grads, "weight", fmt)
    losses = np.asarray(losses, dtype=np.float64)
    bad_steps = int((~np.isfinite(losses)).sum())
    bad_layers = int((status == "non-finite").sum())
    nonfinite = (f"loss non-finite at {bad_steps} of {losses.size} steps; {bad_layers} of "
                 f"{grads.depth} layers have inf/NaN gradients")
    collapse = None if scale_history is None else _scale_collapse(scale_history)
    if collapse is not None:
        return Diagnosis(
            "scale collapsing",
            f"{collapse}; the loss was non-finite at {bad_steps} of {losses.size} steps",
            "where the first inf/NaN appears: forward activations past the format's largest "
            "finite value (the loss is then inf/NaN at any scale), an op such as log or a "
            "division, or a loss that was rising before it (divergence)",
            "keep the overflowing op in float32 or train in bfloat16; if the run diverged, lower "
            "the learning rate or clip gradients (a lower loss scale at best trades the overflow "
            "for underflow)",
        )
    if bad_steps or bad_layers:
        if scale_history is None and grads.loss_scale == 1:
            return Diagnosis(
                "overflow",
                f"{nonfinite}; no loss scaler (S = 1), so the values overflow at their true size",
                "whether the forward pass is already inf/NaN (then no scale helps); otherwise the "
                "first layer whose gradients pass the format's largest finite value",
                "bfloat16, or float32 for the layers that overflow; a dynamic scaler helps only if "
                "the backward pass alone overflows, by settling below S = 1",
            )
        record = (f"at loss scale S = {grads.loss_scale:g}" if scale_history is None
                  else "the loss scale is not collapsing")
        return Diagnosis(
            "overflow",
            f"{nonfinite}; {record}",
            "the scaler's record: how often it skips and whether its scale stays steady",
            "none while skips stay rare: the dynamic scaler skips the step and halves S (a "
            "too-high initial scale corrects itself within a few steps)",
        )
    dead = np.flatnonzero(np.isin(status, ("zero", "underflowing")))
    if dead.size:
        alive = f"depth 0 still has median |g| {grads.weight.median_abs[0]:.2g}" \
            if dead[0] > 0 else "every layer is affected"
        return Diagnosis(
            "underflow",
            f"{dead.size} of {grads.depth} layers (from depth {dead[0]}) have mostly exact-zero "
            f"weight gradients; {alive}",
            "per-layer gradient norms and fractions of exact zeros, next to the same step in "
            "float32; one step with the loss times 2^16 brings underflowed gradients back (a cut "
            "graph stays at zero)",
            "dynamic loss scaling (a GradScaler), or bfloat16",
        )
    return Diagnosis("none", "all gradients finite; no layer is mostly exact zeros",
                     "a short run against float32 if the final quality is off",
                     "keep float32 master weights")
