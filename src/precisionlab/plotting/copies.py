"""Figure copies: within one block, figures of the same make are unpickled, not built again.

A view drawn many times over (a static explorer's frames) starts every frame from the same
empty figure: its Axes, and sometimes ticks and labels that depend only on the data's shape.
Building those from rcParams takes most of a frame's time; unpickling a copy a third of it or
less, and the copy is drawn on as on a new one (shared axes stay shared). Inside
`figure_copies()`, `copied_figure(key, build)` builds once per key and returns copies after,
while rcParams equal those the first was built under; outside the block it just builds. The
state lives in a context variable set for the block alone: no call outside a block depends on
an earlier one.
"""

from __future__ import annotations

import contextlib
import pickle
from collections.abc import Callable, Hashable
from contextvars import ContextVar

import matplotlib as mpl
from matplotlib.figure import Figure

__all__ = ["copied_figure", "figure_copies", "rc_snapshot"]

# While figure_copies() is active: {key: (rcParams snapshot, pickled figure)}.
_MADE: ContextVar[dict | None] = ContextVar("precisionlab_figure_copies", default=None)


def rc_snapshot() -> dict:
    """The rcParams a new Figure reads, to tell whether a figure made earlier may be copied.

    'backend' is left out (reading it may select one); the values are read as stored, without
    rcParams' per-key lookup (a seventh of the time, and the same values), lists as tuples, so
    that a list changed in place later (rcParams["font.family"].insert(0, "serif")) no longer
    compares equal.
    """
    return {k: tuple(v) if isinstance(v, list) else v
            for k, v in dict.items(mpl.rcParams) if k != "backend"}


@contextlib.contextmanager
def figure_copies():
    """Within the block, copied_figure returns copies of the figure it built first per key."""
    token = _MADE.set({})
    try:
        yield
    finally:
        _MADE.reset(token)


def copied_figure(key: Hashable, build: Callable[[], Figure]) -> Figure:
    """build(), or inside figure_copies() a copy of the figure build() gave for this key.

    key must name everything build() depends on besides rcParams (sizes, a tensor list).
    """
    made = _MADE.get()
    if made is None:
        return build()
    rc, kept = rc_snapshot(), made.get(key)
    if kept is not None and kept[0] == rc:
        return pickle.loads(kept[1])
    fig = build()
    made[key] = (rc, pickle.dumps(fig))
    return fig
