"""Delayed scaling (Transformer Engine): the scale for step t comes from the amax history of earlier steps."""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import torch

from ..checks import check_count
from .choices import ELEMENT_FORMATS, check_format, check_margin
from .grid import as_float32, block_amax, blocked
from .result import Quantized, encode
from .scales import float32_scale

__all__ = ["AMAX_COMPUTE_ALGOS", "DelayedScaling"]

AMAX_COMPUTE_ALGOS: tuple[str, ...] = ("max", "most_recent")


class DelayedScaling:
    """Per-tensor m_t = fl32(max_E / a_t) / 2^margin, a_t = max (or latest) of the last L amaxes before step t; m_0 = 1.

    Transformer Engine's DelayedScaling recipe for one tensor: quantize with the scale held
    now (values beyond max_E clip), then record this tensor's amax and recompute the scale
    for the next call. amax_compute_algo: "max" over the window, "most_recent", or a
    function of the history (newest first, zeros where no step has been recorded yet) that
    returns a number. A window whose amax is 0 keeps the previous scale, as Transformer
    Engine does; an inf/NaN amax (a non-finite x) raises ValueError, the documented
    convention here (Transformer Engine keeps the old scale and lets the NaN through).

    Parameters
    ----------
    elem : {"float8_e4m3fn", "float8_e5m2", "float6_e3m2fn", "float6_e2m3fn", "float4_e2m1fn"}, default "float8_e4m3fn"
        The element format.
    amax_history_len : int, default 1024
        L, the steps in the window (>= 1).
    amax_compute_algo : {"max", "most_recent"} or callable, default "max"
        How the window's amax is taken: its maximum, the latest amax, or a function of the
        history (a float64 array, newest first) returning a finite number >= 0.
    margin : int, default 0
        Headroom: the multiplier is divided by 2^margin.

    Raises
    ------
    ValueError
        If elem or amax_compute_algo is unknown, amax_history_len is not an integer >= 1,
        or margin is not an integer.

    Examples
    --------
    The scale a call uses comes from the steps before it: the jump to amax 100 clips that
    step, and the next one is scaled for it.

    >>> import torch
    >>> from precisionlab.quantize import DelayedScaling
    >>> scaling = DelayedScaling("float8_e4m3fn", amax_history_len=4)
    >>> scaling.scale
    1.0
    >>> for amax in (1.0, 2.0, 100.0):
    ...     q = scaling(torch.tensor([amax, -amax / 2]))
    ...     print(q.values.tolist(), q.saturated, scaling.history.tolist())
    [1.0, -0.5] 0.0 [1.0, 0.0, 0.0, 0.0]
    [448.0, -448.0] 0.5 [2.0, 1.0, 0.0, 0.0]
    [448.0, -448.0] 1.0 [100.0, 2.0, 1.0, 0.0]
    >>> scaling.scale == float(torch.tensor(448.0) / torch.tensor(100.0))
    True
    """

    def __init__(self, elem="float8_e4m3fn", amax_history_len: int = 1024,
                 amax_compute_algo: str | Callable = "max", margin: int = 0):
        self.elem = check_format(elem, "elem", ELEMENT_FORMATS)
        self.amax_history_len = check_count(amax_history_len, "amax_history_len",
                                            what=" (steps in the window)")
        if not callable(amax_compute_algo) and amax_compute_algo not in AMAX_COMPUTE_ALGOS:
            raise ValueError(f"unknown amax_compute_algo {amax_compute_algo!r}; valid choices: "
                             f"{', '.join(AMAX_COMPUTE_ALGOS)}, or a function of the history")
        self.amax_compute_algo = amax_compute_algo
        self.margin = check_margin(margin)
        self._history = np.zeros(self.amax_history_len)  # newest first
        self._scale = torch.ones((), dtype=torch.float32)  # m, the encode multiplier

    @property
    def scale(self) -> float:
        """m: the float32 multiplier the next call quantizes with (x * m lands in the format)."""
        return float(self._scale)

    @property
    def history(self) -> np.ndarray:
        """The last amax_history_len amaxes, newest first (a copy)."""
        return self._history.copy()

    def update(self, amax: float) -> float:
        """Record one amax (newest first, dropping the oldest) and recompute m from the window.

        Parameters
        ----------
        amax : float
            A finite amax >= 0 (a window whose amax is 0 keeps the previous scale).

        Returns
        -------
        float
            The new multiplier m.

        Raises
        ------
        ValueError
            If amax is inf, NaN or negative, or amax_compute_algo returns such a value.
        """
        a = float(amax)
        if not (math.isfinite(a) and a >= 0):
            raise ValueError(f"amax must be a finite number >= 0; got amax={amax!r} (an inf/NaN "
                             f"amax has no scale; skip the step instead)")
        self._history = np.roll(self._history, 1)
        self._history[0] = a
        algo = self.amax_compute_algo
        if callable(algo):
            window = float(algo(self._history.copy()))
        else:
            window = float(self._history.max() if algo == "max" else self._history[0])
        if not (math.isfinite(window) and window >= 0):
            raise ValueError(f"amax_compute_algo returned {window!r}; it must give a finite "
                             f"number >= 0")
        if window > 0:
            self._scale, _ = float32_scale(torch.tensor(window, dtype=torch.float64),
                                           self.elem, self.margin)
        return self.scale

    def __call__(self, x) -> Quantized:
        """Quantize x with the current scale, then update the history with x's amax.

        Parameters
        ----------
        x : torch.Tensor or numpy.ndarray or sequence
            Finite floating-point values (one scale for all of them).

        Returns
        -------
        Quantized
            With the scale held before this call; values beyond max_E clip.

        Raises
        ------
        ValueError
            If x has inf/NaN entries (the history is then left as it was).
        TypeError
            If x does not hold floating-point numbers.
        """
        x32 = as_float32(x)
        block = tuple(x32.shape)
        amax = block_amax(blocked(x32, block))
        m = self._scale.reshape([1] * (2 * x32.dim()))
        d = (1 / m).to(torch.float64)
        out = encode(x32, block, amax, m, d, self.elem, "float32")
        self.update(float(amax.max()) if amax.numel() else 0.0)
        return out
