"""The picture and the words of `GradientReport.scale_view`, from counts it has already made.

Per parameter tensor a bar: the share of its nonzero gradient entries below a format's normal
floor at loss scale 2^k (red when the tensor has an entry that overflows), and beside each
overflowing tensor a red stem as high as its overflow share, drawn at least `MIN_MARK` high so
that a single entry shows. `scale_alt` says the same in one sentence (the frame's alt text in
a widget), carried by the view's `ViewTable`; where bars tie for the highest, it names them all.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from matplotlib.figure import Figure

from ..plotting import copied_figure
from ..tables import Table
from .report import fmt_share, short

__all__ = ["MAX_TICKS", "MIN_MARK", "ViewTable", "scale_alt", "scale_figure"]

MAX_TICKS = 48  # every tensor is named up to this many (then every 2nd, 3rd, ...)
MIN_MARK = 0.05  # a nonzero overflow share is drawn at least this high


@dataclass(frozen=True, repr=False)  # keeps Table's text repr
class ViewTable(Table):
    """A Table shown beside a figure; alt is that figure in words (a widget frame's alt text)."""

    alt: str = ""


def scale_figure(names: Sequence[str], below: Sequence[float], ovf: Sequence[bool],
                 shares: Sequence[float | None], fmt: str, k: int) -> Figure:
    """Bars of the below-floor shares (red where ovf) and red stems max(share, MIN_MARK) high beside the overflowing tensors."""
    # Inside plotting.figure_copies (an explorer's frames) a copy of the list's empty figure.
    names = tuple(names)
    fig = copied_figure(("scale_figure", names), lambda: _empty_figure(names))
    ax = fig.axes[0]
    x = np.arange(len(names))
    ax.bar(x, below, color=["#D55E00" if o else "#0072B2" for o in ovf])
    _overflow_marks(ax, x, ovf, shares)
    ax.set_title(f"{fmt}, loss scale 2^{k}: bars below the normal floor "
                 f"(red: the tensor overflows)", fontsize=9)
    return fig


def _empty_figure(names: tuple[str, ...]) -> Figure:
    """A new figure whose one Axes has scale_figure's limits, ticks and labels for these tensors.

    The tensor names' tick labels take most of a figure's making and are the same in every
    view of one report, so an explorer copies this figure (a tenth of the time).
    """
    fig = Figure(figsize=(7, 3.2))
    ax = fig.add_subplot()
    x = np.arange(len(names))
    ax.set_ylim(0, 1)  # fixed limits: the bars drawn later do not move them
    ax.set_yticks(np.linspace(0, 1, 6))
    step = -(-len(names) // MAX_TICKS)  # every tensor named, up to MAX_TICKS labels
    ax.set_xticks(x[::step])
    ax.set_xticklabels([short(n, 22) for n in names[::step]], rotation=45, ha="right",
                       fontsize=6)
    ax.set_xlim(-0.7, len(names) - 0.3)
    ax.set_xlabel("parameter tensor, in model order")
    ax.set_ylabel("share of nonzero entries")
    fig.subplots_adjust(bottom=0.42, left=0.1, right=0.98, top=0.9)
    return fig


def _overflow_marks(ax, x, ovf, shares) -> None:
    """Red stems beside the overflowing tensors' bars: height the overflow share (None: unknown), drawn at least MIN_MARK."""
    idx = [i for i, o in enumerate(ovf) if o]
    if not idx:
        return
    shares = [shares[i] for i in idx]
    tops = [MIN_MARK if s is None else max(s, MIN_MARK) for s in shares]
    xs = x[idx] + 0.3
    ax.vlines(xs, 0, tops, color="#D55E00", lw=1.5)
    big = max((s for s in shares if s is not None), default=None)
    label = ("overflow share" + (f" (largest {fmt_share(big)})" if big is not None else "")
             + f"; drawn at least {MIN_MARK:.0%} high")
    ax.plot(xs, tops, ls="none", marker="v", ms=4, color="#D55E00", label=label)
    ax.legend(fontsize=7, loc="upper right", frameon=False)


def scale_alt(names: Sequence[str], below: Sequence[float], ovf: Sequence[bool],
              shares: Sequence[float | None], fmt: str, k: int) -> str:
    """scale_figure in words: how many tensors keep entries below the floor, how many overflow, the largest of each (all that tie)."""
    n = len(names)
    low = [i for i, b in enumerate(below) if b > 0]
    text = (f"Bars per parameter tensor, in model order: the share of nonzero gradient entries "
            f"below {fmt}'s normal floor at loss scale 2^{k}. {len(low)} of {n} tensors have "
            f"such entries")
    if low:
        top, tied = _largest(below, low, names)
        text += (f" (the highest bar: {fmt_share(top)}, {tied[0]})" if len(tied) == 1 else
                 f" (the {len(tied)} highest bars, {fmt_share(top)} each: {_listed(tied)})")
    text += f"; {sum(ovf)} of {n} have an entry that overflows" + (" (red, with a stem)"
                                                                  if any(ovf) else "")
    big = [i for i, s in enumerate(shares) if s is not None]
    if big:
        top, tied = _largest(shares, big, names)
        text += f", the largest overflow share {fmt_share(top)} ({_listed(tied)})"
    return text + "."


def _largest(values: Sequence, idx: Sequence[int], names: Sequence[str]):
    """(max of values over idx, the names of every tensor in idx that reaches it, in model order)."""
    top = max(values[j] for j in idx)
    return top, [names[j] for j in idx if values[j] == top]


def _listed(names: Sequence[str], most: int = 3) -> str:
    """'a', 'a and b', 'a, b and c', 'a, b, c and 2 more': up to `most` names."""
    shown = list(names[:most])
    rest = len(names) - len(shown)
    if rest:
        return ", ".join(shown) + f" and {rest} more"
    return shown[0] if len(shown) == 1 else ", ".join(shown[:-1]) + " and " + shown[-1]
