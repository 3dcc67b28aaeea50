"""Elementwise rules: on arrays they execute the operation, on intervals they bound every result.

Correctly rounded operations (+, -, *, /, sqrt, casts) round the exact range outward into the
format; operations with a larger error budget (fast division 2 ulps, exp 1 ulp) widen it by
that many ulps first. Non-finite values follow the convention of `interval`: a result that
can overflow reaches +-inf, and inf - inf, 0 * inf, 0 / 0, inf / inf and sqrt of a negative
set the may-be-NaN flag (the range is empty where nothing else is possible).
"""

from __future__ import annotations

import math

import numpy as np

from ..checks import check_choice
from ..formats import FloatFormat, get_format
from ..rounding import MODES, round_to
from ._outward import (
    _F64,
    _INF,
    _dn,
    _dn_from_finite,
    _empty,
    _exp64,
    _exp_dn,
    _exp_up,
    _f64,
    _mul_box,
    _up,
    _up_from_finite,
)
from .interval import Interval, _any_iv, _parts, _rule_of, _value2

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


# =========================================================================== rounding into formats


def _unit(fmt: FloatFormat, mode: str) -> float:
    """The relative error bound of one rounding into fmt: u = eps/2 to nearest, eps for directed/stochastic."""
    return fmt.eps / 2 if mode in ("nearest_even", "nearest_away") else fmt.eps


def _round_out(lo, hi, fmt) -> tuple[np.ndarray, np.ndarray]:
    """[RD_fmt(lo), RU_fmt(hi)]: the tightest sound bounds on a rounding of any value in [lo, hi] (RU past the top is +inf)."""
    f = get_format(fmt)
    if f.name == "float64":
        return np.array(lo, dtype=_F64), np.array(hi, dtype=_F64)
    shape = np.shape(lo)  # (ascontiguousarray makes 0-d arrays 1-d: restore the shape)
    lo = np.ascontiguousarray(lo, dtype=_F64)
    hi = np.ascontiguousarray(hi, dtype=_F64)
    with np.errstate(over="ignore", invalid="ignore"):
        return (np.asarray(round_to(lo, f, "down"), dtype=_F64).reshape(shape),
                np.asarray(round_to(hi, f, "up"), dtype=_F64).reshape(shape))


def _widen(lo, hi, fmt, ulps: float) -> tuple[np.ndarray, np.ndarray]:
    """Bounds on a result within `ulps` ulps of an exact value in [lo, hi], in fmt.

    ulps <= 1/2 (correct rounding): directed rounding into fmt. Otherwise
    lo - ulps max(eps |lo|, q) and hi + ulps max(eps |hi|, q), q the smallest subnormal:
    ulp(x) <= max(eps |x|, q) everywhere, and x - ulps max(eps|x|, q) increases with x.
    Infinite ends stay; past the largest finite value the result may be infinite.
    """
    f = get_format(fmt)
    if ulps <= 0.5:
        return _round_out(lo, hi, f)
    lo, hi = _f64(lo), _f64(hi)
    with np.errstate(invalid="ignore", over="ignore"):
        dlo = _up(ulps * np.maximum(_up(f.eps * np.abs(lo)), f.min_subnormal))
        dhi = _up(ulps * np.maximum(_up(f.eps * np.abs(hi)), f.min_subnormal))
        lo2, hi2 = _dn(lo - dlo), _up(hi + dhi)
    lo2 = np.where(np.isinf(lo), lo, lo2)
    hi2 = np.where(np.isinf(hi), hi, hi2)
    if f.name != "float64":
        lo2 = np.where(lo2 < -f.max_finite, -_INF, lo2)
        hi2 = np.where(hi2 > f.max_finite, _INF, hi2)
        lo2 = np.where(np.isfinite(lo2) & (lo2 > f.max_finite), f.max_finite, lo2)
        hi2 = np.where(np.isfinite(hi2) & (hi2 < -f.max_finite), -f.max_finite, hi2)
    return lo2, hi2


def _rn(x, fmt, mode: str = "nearest_even") -> np.ndarray:
    """fl_fmt(x): x rounded once into fmt (float64 result)."""
    f = get_format(fmt)
    x = _f64(x)
    if f.name == "float64":
        return x
    with np.errstate(over="ignore", invalid="ignore"):
        return np.asarray(round_to(np.ascontiguousarray(x), f, mode), dtype=_F64).reshape(x.shape)


def _check_ulps(ulps, op: str) -> float:
    if ulps is None:
        return ULP_BUDGETS[op]
    try:
        u = float(ulps)
    except (TypeError, ValueError):
        u = math.nan
    if not (math.isfinite(u) and u >= 0):
        raise ValueError(f"ulps must be a finite number >= 0; got ulps={ulps!r}")
    return u


def _result(lo, hi, nan, value, rule) -> Interval:
    """An Interval whose empty elements (lo > hi, or flagged) are put in canonical form."""
    empty = _empty(lo, hi)
    if empty.any():
        lo, hi, nan = np.where(empty, _INF, lo), np.where(empty, -_INF, hi), np.asarray(nan) | empty
    return Interval(lo, hi, value, rule, nan)


# =========================================================================== elementwise rules


def cast(x, fmt, mode: str = "nearest_even", src=None):
    """fl_fmt(x); on intervals [RD_fmt(lo), RU_fmt(hi)], and exactly x when src's values all lie in fmt (a cast up)."""
    f = get_format(fmt)
    check_choice(mode, "rounding mode", MODES)
    if not isinstance(x, Interval):
        return _rn(x, f, mode)
    if src is not None:
        s = get_format(src)
        if s.mantissa_bits <= f.mantissa_bits and s.emax <= f.emax and s.min_subnormal >= f.min_subnormal:
            return x  # every value of src is a value of fmt: the cast is exact
    lo, hi = _round_out(x.lo, x.hi, f)
    v = None if x.value is None else _rn(x.value, f, mode)
    return _result(lo, hi, x.nan, v, x.rule)


def _sum_ends(alo, blo, sign: int):
    """An outward bound of alo + blo; inf + -inf (one operand surely infinite) leaves the other sign's infinity."""
    with np.errstate(invalid="ignore", over="ignore"):
        raw = alo + blo
    fin = np.isfinite(alo) & np.isfinite(blo)
    if sign < 0:
        return np.where(np.isnan(raw), _INF, _dn_from_finite(raw, fin))
    return np.where(np.isnan(raw), -_INF, _up_from_finite(raw, fin))


def add(a, b, fmt="float32", ulps=None):
    """fl(a + b) in fmt; on intervals [a_lo + b_lo, a_hi + b_hi] rounded outward by the add budget, NaN where +inf meets -inf."""
    u = _check_ulps(ulps, "add")
    if not _any_iv(a, b):
        from ..gpu import rounded_add

        with np.errstate(invalid="ignore", over="ignore"):  # inf - inf is NaN, as IEEE says
            return np.asarray(rounded_add(_f64(a), _f64(b), get_format(fmt)), dtype=_F64)
    alo, ahi, anan, _, _ = _parts(a)
    blo, bhi, bnan, _, _ = _parts(b)
    value, rule = _value2(lambda p, q: add(p, q, fmt), a, b), _rule_of(a, b)
    if all(np.isfinite(v).all() for v in (alo, ahi, blo, bhi)):  # finite ranges: no inf - inf
        with np.errstate(over="ignore"):
            lo, hi = _widen(_dn_from_finite(alo + blo, True), _up_from_finite(ahi + bhi, True), fmt, u)
        return _result(lo, hi, anan | bnan, value, rule)
    lo, hi = _widen(_sum_ends(alo, blo, -1), _sum_ends(ahi, bhi, +1), fmt, u)
    nan = anan | bnan | ((ahi == _INF) & (blo == -_INF)) | ((alo == -_INF) & (bhi == _INF))
    empty = _empty(alo, ahi) | _empty(blo, bhi)
    return _result(np.where(empty, _INF, lo), np.where(empty, -_INF, hi), nan, value, rule)


def sub(a, b, fmt="float32", ulps=None):
    """fl(a - b) in fmt; on intervals [a_lo - b_hi, a_hi - b_lo] rounded outward by the sub budget."""
    if not _any_iv(a, b):
        return add(a, -_f64(b), fmt)
    blo, bhi, bnan, bv, _ = _parts(b)
    nb = Interval(-bhi, -blo, None if bv is None else -bv, _rule_of(a, b), bnan)
    return add(a, nb, fmt, ulps=_check_ulps(ulps, "sub"))


def mul(a, b, fmt="float32", ulps=None):
    """fl(a b) in fmt; on intervals the corner products [min, max] rounded outward by the mul budget, NaN where 0 meets inf."""
    u = _check_ulps(ulps, "mul")
    if not _any_iv(a, b):
        with np.errstate(invalid="ignore", over="ignore"):
            return _rn(_f64(a) * _f64(b), fmt)  # exact for operands of up to 26 bits, then one rounding
    alo, ahi, anan, _, _ = _parts(a)
    blo, bhi, bnan, _, _ = _parts(b)
    plo, phi, pnan = _mul_box(alo, ahi, blo, bhi)
    empty = _empty(plo, phi)
    lo, hi = _widen(plo, phi, fmt, u)
    return _result(np.where(empty, _INF, lo), np.where(empty, -_INF, hi), anan | bnan | pnan,
                   _value2(lambda p, q: mul(p, q, fmt), a, b), _rule_of(a, b))


def div(a, b, fmt="float32", fast: bool = False, ulps=None):
    """fl(a / b) in fmt (fast: within 2 ulps); on intervals the corner quotients rounded outward,
    [-inf, inf] where b may be 0, NaN where 0 / 0 or inf / inf can occur."""
    u = _check_ulps(ulps, "fast_div" if fast else "div")
    if not _any_iv(a, b):
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            q = _f64(a) / _f64(b)
        return _rn(q, fmt)
    alo, ahi, anan, _, _ = _parts(a)
    blo, bhi, bnan, _, _ = _parts(b)
    straddles = (blo <= 0) & (bhi >= 0)
    with np.errstate(divide="ignore", invalid="ignore"):
        rlo = np.where(straddles, 1.0, 1.0 / np.where(straddles, 1.0, bhi))
        rhi = np.where(straddles, 1.0, 1.0 / np.where(straddles, 1.0, blo))
    lo, hi, pnan = _mul_box(alo, ahi, _dn(rlo), _up(rhi))
    lo = np.where(straddles, -_INF, lo)
    hi = np.where(straddles, _INF, hi)
    zero_a = (alo <= 0) & (ahi >= 0)
    inf_a = (alo == -_INF) | (ahi == _INF)
    inf_b = (blo == -_INF) | (bhi == _INF)
    nan = anan | bnan | np.where(straddles, zero_a | (inf_a & inf_b), pnan)
    empty = _empty(alo, ahi) | _empty(blo, bhi)
    lo, hi = _widen(lo, hi, fmt, u)
    return _result(np.where(empty, _INF, lo), np.where(empty, -_INF, hi), nan,
                   _value2(lambda p, q: div(p, q, fmt), a, b), _rule_of(a, b))


def sqrt(x, fmt="float32", ulps=None):
    """fl(sqrt x) in fmt; on intervals [sqrt lo, sqrt hi] (lo clipped at 0) rounded outward, NaN where x may be negative."""
    u = _check_ulps(ulps, "sqrt")
    if not isinstance(x, Interval):
        with np.errstate(invalid="ignore"):
            return _rn(np.sqrt(_f64(x)), fmt)
    with np.errstate(invalid="ignore"):
        lo, hi = _widen(_dn(np.sqrt(np.maximum(x.lo, 0.0))), _up(np.sqrt(np.maximum(x.hi, 0.0))), fmt, u)
    v = None if x.value is None else sqrt(x.value, fmt)
    empty = x.empty | (x.hi < 0)
    lo = np.where(empty, _INF, np.maximum(lo, 0.0))
    hi = np.where(empty, -_INF, hi)
    return _result(lo, hi, x.nan | (x.lo < 0), v, x.rule)


def exp(x, fmt="float32", ulps=None):
    """fl(e^x) in fmt (e^x from float64, rounded once); on intervals [e^lo, e^hi] widened by the exp budget."""
    u = _check_ulps(ulps, "exp")
    if not isinstance(x, Interval):
        return _rn(_exp64(_f64(x)), fmt)
    empty = x.empty
    lo, hi = _widen(_exp_dn(np.where(empty, 0.0, x.lo)), _exp_up(np.where(empty, 0.0, x.hi)), fmt, u)
    v = None if x.value is None else exp(x.value, fmt)
    return _result(np.where(empty, _INF, np.maximum(lo, 0.0)), np.where(empty, -_INF, hi), x.nan,
                   v, x.rule)


def relu(x):
    """max(x, 0): exact (NaN stays NaN); on intervals [max(lo, 0), max(hi, 0)], the executed branch wherever the bound does not straddle 0."""
    if not isinstance(x, Interval):
        return np.maximum(_f64(x), 0.0)
    v = None if x.value is None else np.maximum(x.value, 0.0)
    e = x.empty
    return _result(np.where(e, _INF, np.maximum(x.lo, 0.0)), np.where(e, -_INF, np.maximum(x.hi, 0.0)),
                   x.nan, v, x.rule)


def maximum(a, b):
    """max(a, b): exact (NaN if either is); on intervals [max(a_lo, b_lo), max(a_hi, b_hi)] (both branches where the bounds overlap)."""
    if not _any_iv(a, b):
        return np.maximum(_f64(a), _f64(b))
    alo, ahi, anan, _, _ = _parts(a)
    blo, bhi, bnan, _, _ = _parts(b)
    e = _empty(alo, ahi) | _empty(blo, bhi)
    return _result(np.where(e, _INF, np.maximum(alo, blo)), np.where(e, -_INF, np.maximum(ahi, bhi)),
                   anan | bnan, _value2(np.maximum, a, b), _rule_of(a, b))


def amax(x, axis: int = -1):
    """max over an axis: exact (NaN if any entry is); on intervals [max lo, max hi]."""
    if not isinstance(x, Interval):
        return np.max(_f64(x), axis=axis)
    v = None if x.value is None else np.max(x.value, axis=axis)
    e = np.any(x.empty, axis=axis)
    lo = np.max(np.where(x.empty, -_INF, x.lo), axis=axis)
    hi = np.max(np.where(x.empty, -_INF, x.hi), axis=axis)
    return _result(np.where(e, _INF, lo), np.where(e, -_INF, hi), np.any(x.nan, axis=axis), v, x.rule)


def where(cond, a, b):
    """cond ? a : b with cond taken from the target's executed values (or a fixed mask); on intervals the chosen branch's bounds."""
    c = np.asarray(cond, dtype=bool)
    if not _any_iv(a, b):
        return np.where(c, _f64(a), _f64(b))
    alo, ahi, anan, _, _ = _parts(a)
    blo, bhi, bnan, _, _ = _parts(b)
    return Interval(np.where(c, alo, blo), np.where(c, ahi, bhi),
                    _value2(lambda p, q: np.where(c, p, q), a, b), _rule_of(a, b), np.where(c, anan, bnan))
