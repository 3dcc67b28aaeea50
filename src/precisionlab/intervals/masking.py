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
    """s where mask, else fill: -inf replaces the score, a finite fill is added, fl_fmt(s + fill).

    Parameters
    ----------
    s : array_like or Interval
        Attention scores, keys on the last axis.
    mask : array_like of bool
        True where the query may attend to the key; broadcast to the scores' shape.
    fill : float, default -inf
        -inf replaces the masked scores (a causal decoder); a finite number is added to them
        (an additive bias, such as BERT's -1e4).
    fmt : str or FloatFormat, default "float32"
        The format the bias is added in (unused for fill=-inf: the replacement is exact).

    Returns
    -------
    numpy.ndarray or Interval
        The masked scores in float64 for an array; for an Interval, their bound.

    Raises
    ------
    ValueError
        If mask is not boolean or does not broadcast to the scores' shape, fill is NaN,
        +inf or not a number, or fmt is unknown.

    Examples
    --------
    >>> import numpy as np
    >>> from precisionlab.intervals import masked_scores
    >>> s, mask = np.array([[0.0, 1.0, 2.0]]), np.array([True, True, False])
    >>> masked_scores(s, mask).tolist()
    [[0.0, 1.0, -inf]]
    >>> masked_scores(s, mask, fill=-1e4, fmt="float16").tolist()  # fl16(2 - 1e4)
    [[0.0, 1.0, -10000.0]]
    """
    m = _mask_for(s, mask)
    if isinstance(fill, bool) or not isinstance(fill, (int, float, np.floating, np.integer)) \
            or math.isnan(fill) or fill == math.inf:
        raise ValueError(f"fill must be -inf (replace the masked scores) or a finite number "
                         f"(added to them, e.g. BERT's -1e4); got fill={fill!r}")
    if math.isinf(fill):
        return where(m, s, np.full(m.shape, float(fill)))
    return add(s, np.where(m, 0.0, float(fill)), fmt)


def masked_softmax(s, mask, fill: float = -math.inf, fmt="float32"):
    """softmax_j over the last axis of masked_scores(s, mask, fill): e^(z_j - max z) / sum e^(z - max z).

    Parameters
    ----------
    s : array_like or Interval
        Attention scores, keys on the last axis.
    mask : array_like of bool
        True where the query may attend to the key; broadcast to the scores' shape.
    fill : float, default -inf
        -inf replaces the masked scores; a finite number is added to them (see
        `masked_scores`).
    fmt : str or FloatFormat, default "float32"
        The format of the bias addition and of the softmax's result.

    Returns
    -------
    numpy.ndarray or Interval
        The probabilities in float64 for an array (exactly 0 at keys masked by -inf); for
        an Interval, their bound.

    Raises
    ------
    ValueError
        If mask is not boolean or does not broadcast to the scores' shape, fill is NaN,
        +inf or not a number, or fmt is unknown.

    Examples
    --------
    >>> import numpy as np
    >>> from precisionlab.intervals import Interval, masked_softmax
    >>> s, mask = np.array([[0.0, 1.0, 2.0]]), np.array([True, True, False])
    >>> masked_softmax(s, mask).round(4).tolist()
    [[0.2689, 0.7311, 0.0]]
    >>> bound = masked_softmax(Interval(s - 0.01, s + 0.01), mask)
    >>> bound.lo.round(4).tolist(), bound.hi.round(4).tolist()
    ([[0.265, 0.7271, 0.0]], [[0.2729, 0.735, 0.0]])
    """
    return softmax(masked_scores(s, mask, fill, fmt), fmt)


def mask_after_softmax(s, mask, fmt="float32"):
    """The bug: softmax(s) over every key, then the masked probabilities set to 0 (rows sum below 1).

    Parameters
    ----------
    s : array_like or Interval
        Attention scores, keys on the last axis.
    mask : array_like of bool
        True where the query may attend to the key; broadcast to the scores' shape.
    fmt : str or FloatFormat, default "float32"
        The softmax's format.

    Returns
    -------
    numpy.ndarray or Interval
        The probabilities in float64 for an array, 0 at the masked keys; for an Interval,
        their bound.

    Raises
    ------
    ValueError
        If mask is not boolean or does not broadcast to the scores' shape, or fmt is
        unknown.

    Examples
    --------
    >>> import numpy as np
    >>> from precisionlab.intervals import mask_after_softmax
    >>> s, mask = np.array([[0.0, 1.0, 2.0]]), np.array([True, True, False])
    >>> p = mask_after_softmax(s, mask)
    >>> p.round(4).tolist(), round(float(p.sum()), 4)  # masked_softmax's rows sum to 1
    ([[0.09, 0.2447, 0.0]], 0.3348)
    """
    m = _mask_for(s, mask)
    return where(m, softmax(s, fmt), np.zeros(m.shape))
