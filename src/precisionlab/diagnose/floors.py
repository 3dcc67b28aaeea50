"""What a triage verdict could not see: per check at a module's output, the detection floor, the
smallest relative bug in that output that would have put the reference outside the bound.

Definition. A check has the target's bound [lo_i, hi_i] and the reference's values r_i (i over
the output's entries), bounded in formats whose coarsest has unit roundoff u. A bug of relative
size d at that operation is its output scaled by k = 1 + d or k = 1 - d (an attention scale, a
normalisation's gain, a forgotten factor; 0 < d < 1). The bound the scaled output gets is at
most [k lo_i, k hi_i] with each end moved outward by one rounding, 2u of its magnitude (a
correctly rounded product's bound: the neighbours of the exact product). The floor of the check
is the smallest d such that, for either sign, some r_i lies outside that scaled bound:

    floor = max(d_up, d_down),  d_up = min_i up_i,  d_down = min_i down_i,

where, with m_i = |r_i|, near_i the bound's end nearer zero on r_i's side and far_i the other
(for r_i > 0: near = lo, far = hi; for r_i < 0: near = -hi, far = -lo):

    up_i = m_i / (near_i (1 - 2u)) - 1      (scaled up, the near end passes r_i; near_i > 0),
    down_i = 1 - m_i / (far_i (1 + 2u))     (scaled down, the far end passes r_i).

Entries where r_i is 0, NaN or infinite (a scaling leaves them as they are) are left out, and
so are the terms where m_i or near_i is below the format's smallest normal (relative rounding
does not hold there: inf). A check with no entry left has no floor (NaN: no scaling changes
it); a Type-II check's floor is 0 (a reference value already lies outside).

Where. Triage computes floors at the checks of a module's output and of the program's outputs
(the values the two programs must agree on), where such a bug is checked: the scaled output is
then the module's output, compared with the reference module's, and the operation that scales
reads at most the check's bound (the hull of both programs' values where the operation before
it is paired, else its bound), so its bound lies in the scaled bound above, and a scaling by
more than the floor makes the reference fall outside there (Type-II). Inside a module a bug
changes what the operations after it are paired with, and is checked only at the module's
output, so no floor is claimed there. A bug smaller than the floor may pass; other kinds of bug
(one element, a shift) have floors of their own that this one does not bound.
"""

from __future__ import annotations

import functools
import math

import numpy as np

from ..formats import get_format

__all__ = ["detection_floor", "format_floor", "widest", "worst_floor"]


# Up to this many entries a floor is computed by NumPy (`_floor_numpy`, the loop's own
# operations on whole arrays: a chapter that checks a small model then needs no numba);
# above, by the compiled loop (numba imported and the loop compiled on first use).
FLOOR_NUMPY_MAX = 1 << 15


def _floor(lo, hi, ref, w, tiny):  # pragma: no cover - compiled (`_floor_kernel`)
    """`detection_floor` over C-contiguous 1-D arrays (w = 2u, tiny = smallest normal)."""
    up = np.inf
    down = np.inf
    seen = False  # an entry a scaling changes: nonzero and finite
    for i in range(lo.size):
        r = np.float64(ref[i])
        a, b = lo[i], hi[i]
        if r != r or r - r != 0:  # NaN or infinite: no evidence
            continue
        if r < a or r > b:
            return 0.0
        if r > 0:
            m, near, far = r, a, b
        elif r < 0:
            m, near, far = -r, -b, -a
        else:
            continue
        seen = True
        if m < tiny:
            continue
        if far - far == 0:  # finite
            d = 1.0 - m / (far * (1.0 + w))
            if d < down:
                down = d
        if near >= tiny and near - near == 0:
            d = m / (near * (1.0 - w)) - 1.0
            if d < up:
                up = d
    if not seen:
        return np.nan
    f = up if up > down else down
    return f if f > 0 else 0.0


@functools.cache
def _floor_kernel():
    """_floor compiled by numba (or loaded from its cache), numba imported, on first use."""
    import numba  # only outputs of more than FLOOR_NUMPY_MAX entries need it (0.7 s to import)

    return numba.njit(cache=True, error_model="numpy")(_floor)


def _floor_numpy(lo, hi, ref, w, tiny) -> float:
    """_floor with whole-array NumPy operations: each term the loop's float64 expression, the
    minimum over them (exact), NaN terms skipped as the loop's comparisons skip them."""
    with np.errstate(all="ignore"):  # inf - inf, x / 0: the loop's IEEE results, unwarned
        r = ref.astype(np.float64)
        finite = r - r == 0  # NaN and +-inf give no evidence
        if ((r < lo) | (r > hi))[finite].any():
            return 0.0
        pos, neg = finite & (r > 0), finite & (r < 0)
        if not (pos | neg).any():
            return math.nan
        m = np.where(pos, r, -r)
        near, far = np.where(pos, lo, -hi), np.where(pos, hi, -lo)
        big = (pos | neg) & (m >= tiny)
        d_down = (1.0 - m / (far * (1.0 + w)))[big & (far - far == 0)]
        d_up = (m / (near * (1.0 - w)) - 1.0)[big & (near >= tiny) & (near - near == 0)]
    down = float(np.min(d_down[~np.isnan(d_down)], initial=np.inf))
    up = float(np.min(d_up[~np.isnan(d_up)], initial=np.inf))
    f = up if up > down else down
    return f if f > 0 else 0.0


@functools.cache
def _constants(fmt: str) -> tuple[float, float]:
    f = get_format(fmt)
    return 2.0 * f.unit_roundoff, f.min_normal


def detection_floor(lo: np.ndarray, hi: np.ndarray, ref: np.ndarray, fmt: str) -> float:
    """The smallest d such that scaling the operation's output by 1 + d, or by 1 - d, puts a
    reference value outside the scaled bound (the module docstring's definition).

    Parameters
    ----------
    lo, hi : numpy.ndarray
        The check's bound, float64, of one shape.
    ref : numpy.ndarray
        The reference's values (float32 or float64), of the same shape.
    fmt : str
        The coarsest format the operation is bounded in ("float32", "bfloat16", ...): its
        unit roundoff u gives the rounding of the scaled bound (2u at each end).

    Returns
    -------
    float
        The floor: 0 when a reference value is already outside; NaN when every reference
        value is zero, NaN or infinite (no scaling changes them); inf when in one of the two
        directions no entry can show a scaling (each is below the format's smallest normal,
        or the end of its bound that would have to pass it is below it or infinite: lo = 0.5,
        hi = inf, r = 1 has no floor for a scaling down).

    Examples
    --------
    >>> import numpy as np
    >>> from precisionlab.diagnose.floors import detection_floor
    >>> lo, hi, r = np.array([0.99]), np.array([1.01]), np.array([1.0])
    >>> round(detection_floor(lo, hi, r, "float64"), 6)  # 1/0.99 - 1 up, 1 - 1/1.01 down
    0.010101
    """
    w, tiny = _constants(fmt)
    if not np.size(ref):
        return math.nan
    r = ref if ref.dtype in (np.float32, np.float64) else ref.astype(np.float64)
    floor = _floor_numpy if np.size(ref) <= FLOOR_NUMPY_MAX else _floor_kernel()
    return float(floor(_flat64(lo), _flat64(hi), np.ascontiguousarray(r).reshape(-1), w, tiny))


def _flat64(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a, dtype=np.float64).reshape(-1)


def worst_floor(checks) -> object | None:
    """The check with the largest floor (the weakest point along the path): None when no check
    has one (each is empty, or its floor is NaN)."""
    scored = [c for c in checks if c.numel and not math.isnan(c.floor)]
    return max(scored, key=lambda c: c.floor, default=None)


def format_floor(f: float) -> str:
    """A floor in words: "3.9e-03 (2^-8.0)", "any scaling" for inf, "0" for 0."""
    if math.isinf(f):
        return "any scaling"
    if f <= 0:
        return "0"
    return f"{f:.2g} (2^{math.log2(f):.1f})"


def widest(fmts) -> str:
    """The format among fmts with the largest unit roundoff (whose rounding `detection_floor`
    allows for)."""
    return max(fmts, key=lambda f: _constants(f)[0])
