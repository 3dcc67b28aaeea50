"""Elementwise rules: on arrays they execute the operation, on intervals they bound every result.

Correctly rounded operations (+, -, *, /, sqrt, casts) round the exact range outward into the
format; operations with a larger error budget (fast division 2 ulps, exp 1 ulp) widen it by
that many ulps first. Non-finite values follow the convention of `interval`: a result that
can overflow reaches +-inf, and inf - inf, 0 * inf, 0 / 0, inf / inf and sqrt of a negative
set the may-be-NaN flag (the range is empty where nothing else is possible).
"""

from __future__ import annotations

import numpy as np

from ..checks import check_nonnegative
from ..formats import contains, get_format
from ..gpu import as_float64, round_float64, rounded_add
from ..rounding import check_mode
from .interval import Interval, any_interval, canonical, paired_value, parts_of, rule_of
from .outward import (
    INF,
    down,
    down_from_finite,
    empty_range,
    exp_array,
    exp_down,
    exp_up,
    mul_box,
    round_out,
    up,
    up_from_finite,
    widen,
)

# Error budgets, in ulps of the result's format, of the operations as this package executes
# them: IEEE operations are correctly rounded (half an ulp); exp and softmax are evaluated in
# float64 and rounded once (within one ulp); fast division is CUDA's __fdividef-style 2 ulps.
ULP_BUDGETS: dict[str, float] = {
    "add": 0.5, "sub": 0.5, "mul": 0.5, "div": 0.5, "sqrt": 0.5,
    "fast_div": 2.0, "exp": 1.0, "softmax": 1.0, "cross_entropy": 1.0,
}
# The same budgets as the source lists them (its Table II), for comparison: it charges a full
# ulp even for correctly rounded operations.
SOURCE_ULP_TABLE: dict[str, float] = {
    "add/sub": 1.0, "mul": 1.0, "fast division": 2.0, "sqrt": 1.0, "exp": 1.0,
}


def check_ulps(ulps, op: str) -> float:
    """ULP_BUDGETS[op] when ulps is None, else ulps as a finite number >= 0 (ValueError otherwise)."""
    return ULP_BUDGETS[op] if ulps is None else check_nonnegative(ulps, "ulps")


# =========================================================================== elementwise rules


def cast(x, fmt, mode: str = "nearest_even", src=None):
    """fl_fmt(x); on intervals [RD_fmt(lo), RU_fmt(hi)], and exactly x when src's values all lie in fmt (a cast up).

    Parameters
    ----------
    x : float or array_like or Interval
        The values to cast, or their bound.
    fmt : str or FloatFormat
        The target format, as `formats.get_format` accepts it.
    mode : {"nearest_even", "nearest_away", "toward_zero", "up", "down", "stochastic"}, default "nearest_even"
        The rounding mode of the executed cast (the bound holds for every mode).
    src : str or FloatFormat or None, default None
        The format x's values are in; when every value of src is a value of fmt, an
        Interval comes back unchanged.

    Returns
    -------
    numpy.ndarray or Interval
        fl(x) in float64 for an array; for an Interval, its bound after the cast.

    Raises
    ------
    ValueError
        If fmt, src or mode is unknown.

    Examples
    --------
    >>> from precisionlab.intervals import cast, point
    >>> float(cast(0.1, "bfloat16"))
    0.10009765625
    >>> b = cast(point(0.1), "bfloat16")
    >>> float(b.lo), float(b.hi), float(b.value)
    (0.099609375, 0.10009765625, 0.10009765625)
    """
    f = get_format(fmt)
    check_mode(mode, stochastic=True)
    if not isinstance(x, Interval):
        return round_float64(x, f, mode)
    if src is not None and contains(f, src):
        return x  # every value of src is a value of fmt: the cast is exact
    lo, hi = round_out(x.lo, x.hi, f)
    v = None if x.value is None else round_float64(x.value, f, mode)
    return canonical(lo, hi, x.nan, v, x.rule)


def _sum_ends(alo, blo, sign: int):
    """An outward bound of alo + blo; inf + -inf (one operand surely infinite) leaves the other sign's infinity."""
    with np.errstate(invalid="ignore", over="ignore"):
        raw = alo + blo
    fin = np.isfinite(alo) & np.isfinite(blo)
    if sign < 0:
        return np.where(np.isnan(raw), INF, down_from_finite(raw, fin))
    return np.where(np.isnan(raw), -INF, up_from_finite(raw, fin))


def add(a, b, fmt="float32", ulps=None):
    """fl(a + b) in fmt; on intervals [a_lo + b_lo, a_hi + b_hi] rounded outward by the add budget, NaN where +inf meets -inf.

    Parameters
    ----------
    a, b : float or array_like or Interval
        The operands (arrays execute, an Interval is bounded); broadcast to one shape.
    fmt : str or FloatFormat, default "float32"
        The result's format.
    ulps : float or None, default None
        The error budget in ulps of fmt; None takes ULP_BUDGETS["add"], 0.5 (correctly
        rounded).

    Returns
    -------
    numpy.ndarray or Interval
        fl(a + b) in float64 when neither operand is an Interval, else the bound (with the
        executed value when both operands carry one).

    Raises
    ------
    ValueError
        If fmt is unknown, ulps is not a finite number >= 0, or the operands carry
        different rules.

    Examples
    --------
    >>> from precisionlab.intervals import Interval, add
    >>> float(add(0.1, 0.2, "float16"))
    0.300048828125
    >>> s = add(Interval(1.0, 2.0), 0.5, "float16")
    >>> float(s.lo), float(s.hi)  # [1.5, 2.5], widened by the budget
    (1.4990234375, 2.501953125)
    """
    u = check_ulps(ulps, "add")
    if not any_interval(a, b):
        with np.errstate(invalid="ignore", over="ignore"):  # inf - inf is NaN, as IEEE says
            return np.asarray(rounded_add(as_float64(a), as_float64(b), get_format(fmt)), dtype=np.float64)
    alo, ahi, anan, _, _ = parts_of(a)
    blo, bhi, bnan, _, _ = parts_of(b)
    value, rule = paired_value(lambda p, q: add(p, q, fmt), a, b), rule_of(a, b)
    if all(np.isfinite(v).all() for v in (alo, ahi, blo, bhi)):  # finite ranges: no inf - inf
        with np.errstate(over="ignore"):
            lo, hi = widen(down_from_finite(alo + blo, True), up_from_finite(ahi + bhi, True), fmt, u)
        return canonical(lo, hi, anan | bnan, value, rule)
    lo, hi = widen(_sum_ends(alo, blo, -1), _sum_ends(ahi, bhi, +1), fmt, u)
    nan = anan | bnan | ((ahi == INF) & (blo == -INF)) | ((alo == -INF) & (bhi == INF))
    empty = empty_range(alo, ahi) | empty_range(blo, bhi)
    return canonical(np.where(empty, INF, lo), np.where(empty, -INF, hi), nan, value, rule)


def sub(a, b, fmt="float32", ulps=None):
    """fl(a - b) in fmt; on intervals [a_lo - b_hi, a_hi - b_lo] rounded outward by the sub budget.

    Parameters
    ----------
    a, b : float or array_like or Interval
        The operands (arrays execute, an Interval is bounded); broadcast to one shape.
    fmt : str or FloatFormat, default "float32"
        The result's format.
    ulps : float or None, default None
        The error budget in ulps of fmt; None takes ULP_BUDGETS["sub"], 0.5 (correctly
        rounded).

    Returns
    -------
    numpy.ndarray or Interval
        fl(a - b) in float64 when neither operand is an Interval, else the bound (with the
        executed value when both operands carry one).

    Raises
    ------
    ValueError
        If fmt is unknown, ulps is not a finite number >= 0, or the operands carry
        different rules.

    Examples
    --------
    >>> from precisionlab.intervals import Interval, sub
    >>> float(sub(1.0, 0.1, "float16"))
    0.89990234375
    >>> d = sub(Interval(1.0, 2.0), 0.5, "float16")
    >>> float(d.lo), float(d.hi)  # [0.5, 1.5], widened by the budget
    (0.499755859375, 1.5009765625)
    """
    u = check_ulps(ulps, "sub")
    if not any_interval(a, b):
        return add(a, -as_float64(b), fmt)
    blo, bhi, bnan, bv, _ = parts_of(b)
    nb = Interval(-bhi, -blo, None if bv is None else -bv, rule_of(a, b), bnan)
    return add(a, nb, fmt, ulps=u)


def mul(a, b, fmt="float32", ulps=None):
    """fl(a b) in fmt; on intervals the corner products [min, max] rounded outward by the mul budget, NaN where 0 meets inf.

    Parameters
    ----------
    a, b : float or array_like or Interval
        The operands (arrays execute, an Interval is bounded); broadcast to one shape.
    fmt : str or FloatFormat, default "float32"
        The result's format.
    ulps : float or None, default None
        The error budget in ulps of fmt; None takes ULP_BUDGETS["mul"], 0.5.

    Returns
    -------
    numpy.ndarray or Interval
        fl(a b) in float64 when neither operand is an Interval, else the bound.

    Raises
    ------
    ValueError
        If fmt is unknown, ulps is not a finite number >= 0, or the operands carry
        different rules.

    Examples
    --------
    >>> from precisionlab.intervals import Interval, mul
    >>> p = mul(Interval(-1.0, 2.0), Interval(3.0, 4.0), "float16")
    >>> float(p.lo), float(p.hi)  # the corners -4 and 8, widened
    (-4.00390625, 8.0078125)
    """
    u = check_ulps(ulps, "mul")
    if not any_interval(a, b):
        with np.errstate(invalid="ignore", over="ignore"):
            return round_float64(as_float64(a) * as_float64(b), fmt)  # exact for operands of up to 26 bits, then one rounding
    alo, ahi, anan, _, _ = parts_of(a)
    blo, bhi, bnan, _, _ = parts_of(b)
    plo, phi, pnan = mul_box(alo, ahi, blo, bhi)
    empty = empty_range(plo, phi)
    lo, hi = widen(plo, phi, fmt, u)
    return canonical(np.where(empty, INF, lo), np.where(empty, -INF, hi), anan | bnan | pnan,
                   paired_value(lambda p, q: mul(p, q, fmt), a, b), rule_of(a, b))


def div(a, b, fmt="float32", fast: bool = False, ulps=None):
    """fl(a / b) in fmt (fast: within 2 ulps); on intervals the corner quotients rounded outward,
    [-inf, inf] where b may be 0, NaN where 0 / 0 or inf / inf can occur.

    Parameters
    ----------
    a, b : float or array_like or Interval
        The dividend and the divisor (arrays execute, an Interval is bounded); broadcast to
        one shape.
    fmt : str or FloatFormat, default "float32"
        The result's format.
    fast : bool, default False
        Bound an approximate (fast-math) division with ULP_BUDGETS["fast_div"], 2
        ulps, instead of the correctly rounded one's 0.5; the executed value is the correctly
        rounded quotient either way.
    ulps : float or None, default None
        The error budget in ulps of fmt; None takes the budget `fast` selects.

    Returns
    -------
    numpy.ndarray or Interval
        fl(a / b) in float64 when neither operand is an Interval (+-inf or NaN where IEEE
        division gives them), else the bound.

    Raises
    ------
    ValueError
        If fmt is unknown, ulps is not a finite number >= 0, or the operands carry
        different rules.

    Examples
    --------
    >>> from precisionlab.intervals import Interval, div
    >>> float(div(1.0, 3.0, "float16"))
    0.333251953125
    >>> q = div(1.0, Interval(2.0, 4.0), "float16")
    >>> float(q.lo), float(q.hi)  # [0.25, 0.5], widened
    (0.2498779296875, 0.50048828125)
    >>> q = div(1.0, Interval(-1.0, 1.0))  # the divisor may be 0
    >>> float(q.lo), float(q.hi)
    (-inf, inf)
    """
    u = check_ulps(ulps, "fast_div" if fast else "div")
    if not any_interval(a, b):
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            q = as_float64(a) / as_float64(b)
        return round_float64(q, fmt)
    alo, ahi, anan, _, _ = parts_of(a)
    blo, bhi, bnan, _, _ = parts_of(b)
    straddles = (blo <= 0) & (bhi >= 0)
    with np.errstate(divide="ignore", invalid="ignore"):
        rlo = np.where(straddles, 1.0, 1.0 / np.where(straddles, 1.0, bhi))
        rhi = np.where(straddles, 1.0, 1.0 / np.where(straddles, 1.0, blo))
    lo, hi, pnan = mul_box(alo, ahi, down(rlo), up(rhi))
    lo = np.where(straddles, -INF, lo)
    hi = np.where(straddles, INF, hi)
    zero_a = (alo <= 0) & (ahi >= 0)
    inf_a = (alo == -INF) | (ahi == INF)
    inf_b = (blo == -INF) | (bhi == INF)
    nan = anan | bnan | np.where(straddles, zero_a | (inf_a & inf_b), pnan)
    empty = empty_range(alo, ahi) | empty_range(blo, bhi)
    lo, hi = widen(lo, hi, fmt, u)
    return canonical(np.where(empty, INF, lo), np.where(empty, -INF, hi), nan,
                   paired_value(lambda p, q: div(p, q, fmt), a, b), rule_of(a, b))


def sqrt(x, fmt="float32", ulps=None):
    """fl(sqrt x) in fmt; on intervals [sqrt lo, sqrt hi] (lo clipped at 0) rounded outward, NaN where x may be negative.

    Parameters
    ----------
    x : float or array_like or Interval
        The radicand, or its bound.
    fmt : str or FloatFormat, default "float32"
        The result's format.
    ulps : float or None, default None
        The error budget in ulps of fmt; None takes ULP_BUDGETS["sqrt"], 0.5 (correctly
        rounded).

    Returns
    -------
    numpy.ndarray or Interval
        fl(sqrt x) in float64 for an array (NaN where x < 0); for an Interval, its bound,
        flagged may-be-NaN where the bound reaches below 0.

    Raises
    ------
    ValueError
        If fmt is unknown or ulps is not a finite number >= 0.

    Examples
    --------
    >>> from precisionlab.intervals import Interval, sqrt
    >>> float(sqrt(2.0, "float16"))
    1.4140625
    >>> r = sqrt(Interval(-1.0, 4.0), "float16")
    >>> float(r.lo), float(r.hi), bool(r.nan)
    (0.0, 2.001953125, True)
    """
    u = check_ulps(ulps, "sqrt")
    if not isinstance(x, Interval):
        with np.errstate(invalid="ignore"):
            return round_float64(np.sqrt(as_float64(x)), fmt)
    with np.errstate(invalid="ignore"):
        lo, hi = widen(down(np.sqrt(np.maximum(x.lo, 0.0))), up(np.sqrt(np.maximum(x.hi, 0.0))), fmt, u)
    v = None if x.value is None else sqrt(x.value, fmt)
    empty = x.empty | (x.hi < 0)
    lo = np.where(empty, INF, np.maximum(lo, 0.0))
    hi = np.where(empty, -INF, hi)
    return canonical(lo, hi, x.nan | (x.lo < 0), v, x.rule)


def exp(x, fmt="float32", ulps=None):
    """fl(e^x) in fmt (e^x from float64, rounded once); on intervals [e^lo, e^hi] widened by the exp budget.

    Parameters
    ----------
    x : float or array_like or Interval
        The exponent, or its bound.
    fmt : str or FloatFormat, default "float32"
        The result's format.
    ulps : float or None, default None
        The error budget in ulps of fmt; None takes ULP_BUDGETS["exp"], 1 (a fast exp is
        not correctly rounded).

    Returns
    -------
    numpy.ndarray or Interval
        fl(e^x) in float64 for an array, of x's shape; for an Interval, its bound, within
        [0, inf].

    Raises
    ------
    ValueError
        If fmt is unknown or ulps is not a finite number >= 0.

    Examples
    --------
    >>> from precisionlab.intervals import Interval, exp
    >>> float(exp(1.0, "float16"))
    2.71875
    >>> e = exp(Interval(0.0, 1.0), "float16")
    >>> round(float(e.lo), 4), round(float(e.hi), 4)  # [1, e], widened by 1 ulp
    (0.999, 2.7209)
    >>> bool(e.contains(exp(0.5, "float16")))
    True
    """
    u = check_ulps(ulps, "exp")
    if not isinstance(x, Interval):
        return round_float64(exp_array(as_float64(x)), fmt)
    empty = x.empty
    lo, hi = widen(exp_down(np.where(empty, 0.0, x.lo)), exp_up(np.where(empty, 0.0, x.hi)), fmt, u)
    v = None if x.value is None else exp(x.value, fmt)
    return canonical(np.where(empty, INF, np.maximum(lo, 0.0)), np.where(empty, -INF, hi), x.nan,
                   v, x.rule)


def relu(x):
    """max(x, 0): exact (NaN stays NaN); on intervals [max(lo, 0), max(hi, 0)], the executed branch wherever the bound does not straddle 0.

    Parameters
    ----------
    x : float or array_like or Interval
        The values, or their bound.

    Returns
    -------
    numpy.ndarray or Interval
        max(x, 0) in float64 for an array; for an Interval, its bound (no rounding: relu is
        exact in every format).

    Examples
    --------
    >>> import numpy as np
    >>> from precisionlab.intervals import Interval, relu
    >>> relu(np.array([-1.0, 2.0])).tolist()
    [0.0, 2.0]
    >>> r = relu(Interval([-1.0, -2.0], [1.0, -1.0]))
    >>> r.lo.tolist(), r.hi.tolist()
    ([0.0, 0.0], [1.0, 0.0])
    """
    if not isinstance(x, Interval):
        return np.maximum(as_float64(x), 0.0)
    v = None if x.value is None else np.maximum(x.value, 0.0)
    e = x.empty
    return canonical(np.where(e, INF, np.maximum(x.lo, 0.0)), np.where(e, -INF, np.maximum(x.hi, 0.0)),
                   x.nan, v, x.rule)


def maximum(a, b):
    """max(a, b): exact (NaN if either is); on intervals [max(a_lo, b_lo), max(a_hi, b_hi)] (both branches where the bounds overlap).

    Parameters
    ----------
    a, b : float or array_like or Interval
        The operands (arrays execute, an Interval is bounded); broadcast to one shape.

    Returns
    -------
    numpy.ndarray or Interval
        The elementwise maximum in float64 when neither operand is an Interval, else its
        bound (no rounding: max is exact).

    Raises
    ------
    ValueError
        If the operands carry different rules.

    Examples
    --------
    >>> from precisionlab.intervals import Interval, maximum
    >>> maximum([1.0, 5.0], 3.0).tolist()
    [3.0, 5.0]
    >>> m = maximum(Interval(1.0, 4.0), 2.0)
    >>> float(m.lo), float(m.hi)
    (2.0, 4.0)
    """
    if not any_interval(a, b):
        return np.maximum(as_float64(a), as_float64(b))
    alo, ahi, anan, _, _ = parts_of(a)
    blo, bhi, bnan, _, _ = parts_of(b)
    e = empty_range(alo, ahi) | empty_range(blo, bhi)
    return canonical(np.where(e, INF, np.maximum(alo, blo)), np.where(e, -INF, np.maximum(ahi, bhi)),
                   anan | bnan, paired_value(np.maximum, a, b), rule_of(a, b))


def amax(x, axis: int = -1):
    """max over an axis: exact (NaN if any entry is); on intervals [max lo, max hi].

    Parameters
    ----------
    x : array_like or Interval
        The values, or their bound.
    axis : int, default -1
        The axis reduced.

    Returns
    -------
    numpy.ndarray or Interval
        The maximum over `axis` in float64 (that axis removed) for an array; for an
        Interval, its bound, may-be-NaN where any entry may be NaN.

    Raises
    ------
    ValueError
        If axis is out of range for x (NumPy's AxisError, a ValueError).

    Examples
    --------
    >>> import numpy as np
    >>> from precisionlab.intervals import Interval, amax
    >>> amax(np.array([[1.0, 3.0, 2.0]])).tolist()
    [3.0]
    >>> a = amax(Interval([1.0, 2.0], [3.0, 2.5]), axis=0)
    >>> float(a.lo), float(a.hi)
    (2.0, 3.0)
    """
    if not isinstance(x, Interval):
        return np.max(as_float64(x), axis=axis)
    v = None if x.value is None else np.max(x.value, axis=axis)
    e = np.any(x.empty, axis=axis)
    lo = np.max(np.where(x.empty, -INF, x.lo), axis=axis)
    hi = np.max(np.where(x.empty, -INF, x.hi), axis=axis)
    return canonical(np.where(e, INF, lo), np.where(e, -INF, hi), np.any(x.nan, axis=axis), v, x.rule)


def where(cond, a, b):
    """cond ? a : b with cond taken from the target's executed values (or a fixed mask); on intervals the chosen branch's bounds.

    Parameters
    ----------
    cond : array_like of bool
        Where to take a (True) or b (False); the same choice for the bound as for the
        executed values.
    a, b : float or array_like or Interval
        The two branches (arrays execute, an Interval is bounded); broadcast with cond.

    Returns
    -------
    numpy.ndarray or Interval
        The chosen values in float64 when neither branch is an Interval, else the chosen
        branch's bound element by element.

    Raises
    ------
    ValueError
        If the branches carry different rules.

    Examples
    --------
    >>> from precisionlab.intervals import Interval, where
    >>> where([True, False], [1.0, 2.0], [10.0, 20.0]).tolist()
    [1.0, 20.0]
    >>> w = where([True, False], Interval([0.0, 1.0], [1.0, 2.0]), 5.0)
    >>> w.lo.tolist(), w.hi.tolist()
    ([0.0, 5.0], [1.0, 5.0])
    """
    c = np.asarray(cond, dtype=bool)
    if not any_interval(a, b):
        return np.where(c, as_float64(a), as_float64(b))
    alo, ahi, anan, _, _ = parts_of(a)
    blo, bhi, bnan, _, _ = parts_of(b)
    return Interval(np.where(c, alo, blo), np.where(c, ahi, bhi),
                    paired_value(lambda p, q: np.where(c, p, q), a, b), rule_of(a, b), np.where(c, anan, bnan))
