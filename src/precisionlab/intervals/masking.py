"""Attention masks: scores masked before the softmax (by -inf or an additive bias), and the bug
that masks after it.

mask[..., j] is True where a query may attend to key j. A causal decoder replaces the masked
scores by -inf, so their probabilities are exactly 0; BERT-style encoders add a large
negative bias such as -1e4, whose exponential underflows to 0 (or, within the softmax's ulp,
the format's smallest subnormal). Each function takes arrays (it executes) or intervals (it
bounds), like the rules in `ops` and `softmax`.
"""

from __future__ import annotations

import math

import numpy as np

from ..gpu import as_float64
from .interval import Interval
from .ops import add, where
from .softmax import softmax


def _mask_for(s, mask) -> np.ndarray:
    """mask as a boolean array of the scores' shape, else ValueError naming it."""
    m = np.asarray(mask)
    shape = s.shape if isinstance(s, Interval) else np.shape(as_float64(s))
    if m.dtype != bool:
        raise ValueError(f"mask must be a boolean array (True: the key may be attended to); "
                         f"got dtype {m.dtype}")
    try:
        return np.broadcast_to(m, shape)
    except ValueError:
        raise ValueError(f"mask must broadcast to the scores' shape {shape}; "
                         f"got shape {m.shape}") from None


def masked_scores(s, mask, fill: float = -math.inf, fmt="float32"):
    """s where mask, else fill: -inf replaces the score, a finite fill is added, fl_fmt(s + fill)."""
    m = _mask_for(s, mask)
    if isinstance(fill, bool) or not isinstance(fill, (int, float, np.floating, np.integer)) \
            or math.isnan(fill) or fill == math.inf:
        raise ValueError(f"fill must be -inf (replace the masked scores) or a finite number "
                         f"(added to them, e.g. BERT's -1e4); got fill={fill!r}")
    if math.isinf(fill):
        return where(m, s, np.full(m.shape, float(fill)))
    return add(s, np.where(m, 0.0, float(fill)), fmt)


def masked_softmax(s, mask, fill: float = -math.inf, fmt="float32"):
    """softmax_j over the last axis of masked_scores(s, mask, fill): e^(z_j - max z) / sum e^(z - max z)."""
    return softmax(masked_scores(s, mask, fill, fmt), fmt)


def mask_after_softmax(s, mask, fmt="float32"):
    """The bug: softmax(s) over every key, then the masked probabilities set to 0 (rows sum below 1)."""
    m = _mask_for(s, mask)
    return where(m, softmax(s, fmt), np.zeros(m.shape))
