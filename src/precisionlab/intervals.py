"""Interval bounds that tell round-off from a bug when two implementations disagree.

When a kernel's output fails `allclose` against a reference, the question is whether the
difference is round-off the kernel is allowed to make (Type-I) or a bug (Type-II). This module
answers it the way Zhan et al. (RENDER) do, and tightens their bounds where the kernel's
structure is known:

* `Interval`: lower and upper float64 bounds per element. Every bound is rounded *outward*
  (one ulp of float64 after each round-to-nearest step, or directed rounding into a format
  with `precisionlab.rounding.round_to`), so a bound is rigorous, not merely close.
* Per-operation rules that take arrays *or* intervals: on arrays they execute the operation
  (the simulated kernel), on intervals they bound every result it could give. Correctly
  rounded operations (+, -, *, /, sqrt, casts to a narrower format) round the exact interval
  outward into the format; operations with an error budget of more than half an ulp (fast
  division 2 ulps, exp 1 ulp, softmax 1 ulp, ...) widen it by that many ulps first.
  reshape, transpose and gathers are exact; relu and max are monotone.
* `Kernel`: how a sum or a matmul is executed, in the GPU simulator's own terms (order, block,
  splits, threads, accumulator format per stage, operand format, tensor-core model). `sum`
  and `matmul` run it with `precisionlab.gpu` and bound it two ways:

  - ``rule="oblivious"`` - the order-oblivious rule: every summand passes through n - 1
    accumulations, |error| <= ((1 + u)^(n-1) - 1) sum |x_i| (about (n - 1) u sum |x_i|),
    whatever the order; this is RENDER's rule, here rounded outward;
  - ``rule="structure"`` - the structure-aware rule: each summand's factor uses the number of
    roundings on *its* path through the kernel's summation tree (within its tile, its
    partial's rounding, the adds that combine the tiles), stage by stage, so a blocked sum
    costs about (block + n / block) u instead of n u.

* `Layer`, `propagate`, `classify`: a program is a list of layers; each layer is bounded
  starting from the union (hull) of the target's and the reference's previous outputs, from
  a chosen start layer to a chosen end layer; the verdict is Type-II when some layer's
  reference output cannot be explained by the target's round-off.
* `high_precision_verdict`: the baseline that re-executes the target in float64 and asks
  `allclose` again.
* `CORPUS` and `build_case`: a labelled set of mismatches (round-off and bugs, kernels and
  small networks) built with the simulator, on which the three methods are compared.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import numpy as np

from .checks import check_choice
from .formats import FloatFormat, get_format
from .rounding import MODES, round_to

__all__ = [
    "ASSERT_CLOSE_TOLERANCES",
    "BUG_KERNELS",
    "CORPUS",
    "KERNEL_ORDERS",
    "RULES",
    "SOURCE_ULP_TABLE",
    "ULP_BUDGETS",
    "BugCheck",
    "CaseResult",
    "DotStep",
    "Interval",
    "Kernel",
    "Layer",
    "LayerCheck",
    "MismatchCase",
    "Verdict",
    "add",
    "allclose",
    "amax",
    "build_case",
    "cast",
    "classify",
    "concrete",
    "cross_entropy",
    "div",
    "dot_by_hand",
    "evaluate_case",
    "exp",
    "high_precision_verdict",
    "hull",
    "injected_bug",
    "leaf_depths",
    "matmul",
    "maximum",
    "mul",
    "point",
    "promote",
    "propagate",
    "relu",
    "run_layers",
    "softmax",
    "sqrt",
    "sub",
    "sum_",
    "where",
]

RULES: tuple[str, ...] = ("structure", "oblivious")

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
# torch.testing.assert_close's default (rtol, atol) per dtype; tf32 results are float32 tensors.
ASSERT_CLOSE_TOLERANCES: dict[str, tuple[float, float]] = {
    "float16": (1e-3, 1e-5), "bfloat16": (1.6e-2, 1e-5), "float32": (1.3e-6, 1e-5),
    "tf32": (1.3e-6, 1e-5), "float64": (1e-7, 1e-7),
}

_F64 = np.float64
_TINY = 5e-324  # the smallest positive float64 (subnormal)


# =========================================================================== outward float64


def _f64(x) -> np.ndarray:
    if hasattr(x, "detach"):
        x = x.detach().cpu().double().numpy()
    return np.asarray(x, dtype=_F64)


def _dn(x) -> np.ndarray:
    """The next float64 below x (x itself when infinite or NaN): a lower bound after one RN step."""
    x = np.asarray(x, dtype=_F64)
    return np.where(np.isfinite(x), np.nextafter(x, -np.inf), x)


def _up(x) -> np.ndarray:
    """The next float64 above x (x itself when infinite or NaN): an upper bound after one RN step."""
    x = np.asarray(x, dtype=_F64)
    return np.where(np.isfinite(x), np.nextafter(x, np.inf), x)


def _tree(x: np.ndarray) -> np.ndarray:
    """Sum over the last axis by a fixed pairwise tree of float64 adds (the same bits on every CPU)."""
    x = np.asarray(x, dtype=_F64)
    if x.shape[-1] == 0:
        return np.zeros(x.shape[:-1])
    while x.shape[-1] > 1:
        m = x.shape[-1]
        if m % 2:
            x = np.concatenate([x, np.zeros((*x.shape[:-1], 1))], axis=-1)
            m += 1
        x = x[..., : m // 2] + x[..., m // 2:]
    return x[..., 0]


def _tree_slack(t: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(s, e): s = _tree(t) and |s - sum t| <= e, e an upper bound (gamma_depth sum |t|, generous)."""
    n = t.shape[-1]
    s = _tree(t)
    if n <= 1:
        return s, np.zeros_like(s)
    depth = math.ceil(math.log2(n))
    with np.errstate(invalid="ignore"):
        a = _tree(np.abs(t))
    # |s - sum t| <= gamma_depth sum|t| and sum|t| <= a / (1 - gamma_depth): (depth + 2) 2^-52 a
    # covers both, and the rounding of this product; _TINY covers its underflow.
    return s, a * ((depth + 2) * 2.0**-52) + _TINY


def _sum_dn(t: np.ndarray) -> np.ndarray:
    """A float64 lower bound of the exact sum of t over the last axis."""
    s, e = _tree_slack(t)
    with np.errstate(invalid="ignore"):
        return _dn(s - e)


def _sum_up(t: np.ndarray) -> np.ndarray:
    """A float64 upper bound of the exact sum of t over the last axis."""
    s, e = _tree_slack(t)
    with np.errstate(invalid="ignore"):
        return _up(s + e)


def _mul_bounds(alo, ahi, blo, bhi) -> tuple[np.ndarray, np.ndarray]:
    """[min, max] of the four corner products, rounded outward in float64."""
    with np.errstate(invalid="ignore", over="ignore"):
        c = (alo * blo, alo * bhi, ahi * blo, ahi * bhi)
        lo = np.minimum(np.minimum(c[0], c[1]), np.minimum(c[2], c[3]))
        hi = np.maximum(np.maximum(c[0], c[1]), np.maximum(c[2], c[3]))
        # 0 * inf: an unbounded factor times zero; the product can be anything in between.
        lo = np.where(np.isnan(lo), -np.inf, lo)
        hi = np.where(np.isnan(hi), np.inf, hi)
    return _dn(lo), _up(hi)


def _growth(u: float, d) -> np.ndarray:
    """An upper bound of (1 + u)^d - 1 for integer d >= 0 (binary powering, each step rounded up)."""
    d = np.asarray(d, dtype=np.int64)
    base = np.full(d.shape, float(_up(1.0 + u)) if (1.0 + u) - 1.0 != u else 1.0 + u)
    result = np.ones(d.shape)
    e = d.copy()
    with np.errstate(over="ignore"):
        while np.any(e > 0):
            odd = (e & 1) == 1
            result = np.where(odd, _up(result * base), result)
            base = _up(base * base)
            e = e >> 1
    return _up(result - 1.0)


# =========================================================================== the interval


class Interval:
    """Elementwise bounds lo <= x <= hi in float64, with the target's executed value and the rule in force."""

    __slots__ = ("hi", "lo", "rule", "value")

    def __init__(self, lo, hi, value=None, rule: str = "structure"):
        lo, hi = np.broadcast_arrays(_f64(lo), _f64(hi))
        bad = lo > hi
        if np.any(bad):
            raise ValueError(f"lower bounds must not exceed upper bounds; got lo={lo[bad][:3]}, "
                             f"hi={hi[bad][:3]}")
        self.lo = np.array(lo)
        self.hi = np.array(hi)
        self.value = None if value is None else np.broadcast_to(_f64(value), self.lo.shape).copy()
        self.rule = check_choice(rule, "rule", RULES)

    # ------------------------------------------------------------------ shape (exact operations)
    @property
    def shape(self) -> tuple[int, ...]:
        """The shape of the bounded tensor."""
        return self.lo.shape

    @property
    def ndim(self) -> int:
        """Number of axes."""
        return self.lo.ndim

    def _new(self, lo, hi, value):
        return Interval(lo, hi, value, self.rule)

    def __getitem__(self, index) -> Interval:
        """Gather: the same elements' bounds (no rounding)."""
        v = None if self.value is None else self.value[index]
        return self._new(self.lo[index], self.hi[index], v)

    def reshape(self, *shape) -> Interval:
        """Reshape: bounds move with their elements (no rounding)."""
        v = None if self.value is None else self.value.reshape(*shape)
        return self._new(self.lo.reshape(*shape), self.hi.reshape(*shape), v)

    def transpose(self, *axes) -> Interval:
        """Transpose: bounds move with their elements (no rounding)."""
        axes = axes or None
        v = None if self.value is None else self.value.transpose(axes)
        return self._new(self.lo.transpose(axes), self.hi.transpose(axes), v)

    @property
    def T(self) -> Interval:
        """The transpose of a matrix of bounds."""
        return self.transpose()

    def with_rule(self, rule: str) -> Interval:
        """The same bounds, with sums and matmuls downstream bounded by `rule`."""
        return Interval(self.lo, self.hi, self.value, rule)

    # ------------------------------------------------------------------ queries
    @property
    def width(self) -> np.ndarray:
        """hi - lo, rounded up."""
        with np.errstate(invalid="ignore"):
            return _up(self.hi - self.lo)

    @property
    def mid(self) -> np.ndarray:
        """(lo + hi) / 2 (not rounded outward: for display)."""
        return self.lo / 2 + self.hi / 2

    def contains(self, y) -> np.ndarray:
        """lo <= y <= hi elementwise (NaN is never inside)."""
        y = _f64(y)
        return (self.lo <= y) & (y <= self.hi)

    def __repr__(self) -> str:
        return f"Interval(shape={self.shape}, rule={self.rule!r}, max width={np.max(self.width):.3g})"


def point(x, rule: str = "structure") -> Interval:
    """[x, x]: the exact input, also the executed value."""
    x = _f64(x)
    return Interval(x, x, x, rule)


def hull(a, b, value=None, rule: str = "structure") -> Interval:
    """[min(a, b), max(a, b)] elementwise: the union of two programs' values; `value` defaults to a."""
    a, b = _f64(a), _f64(b)
    return Interval(np.minimum(a, b), np.maximum(a, b), a if value is None else value, rule)


def concrete(x) -> np.ndarray:
    """The executed value: x itself for arrays, the target's value carried by an Interval."""
    if isinstance(x, Interval):
        if x.value is None:
            raise ValueError("this Interval carries no executed value; build it with point() or hull()")
        return x.value
    return _f64(x)


# =========================================================================== rounding into formats


def _unit(fmt: FloatFormat, mode: str) -> float:
    """The relative error bound of one rounding into fmt: u = eps/2 to nearest, eps for directed/stochastic."""
    return fmt.eps / 2 if mode in ("nearest_even", "nearest_away") else fmt.eps


def _round_out(lo, hi, fmt) -> tuple[np.ndarray, np.ndarray]:
    """[RD_fmt(lo), RU_fmt(hi)]: the tightest sound bounds on a rounding of any value in [lo, hi]."""
    f = get_format(fmt)
    if f.name == "float64":
        return np.array(lo, dtype=_F64), np.array(hi, dtype=_F64)
    shape = np.shape(lo)  # (ascontiguousarray makes 0-d arrays 1-d: restore the shape)
    lo = np.ascontiguousarray(lo, dtype=_F64)
    hi = np.ascontiguousarray(hi, dtype=_F64)
    return (np.asarray(round_to(lo, f, "down"), dtype=_F64).reshape(shape),
            np.asarray(round_to(hi, f, "up"), dtype=_F64).reshape(shape))


def _widen(lo, hi, fmt, ulps: float) -> tuple[np.ndarray, np.ndarray]:
    """Bounds on a result within `ulps` ulps of an exact value in [lo, hi], in fmt.

    ulps <= 1/2 (correct rounding): directed rounding into fmt. Otherwise
    lo - ulps max(eps |lo|, q) and hi + ulps max(eps |hi|, q), q the smallest subnormal:
    ulp(x) <= max(eps |x|, q) everywhere, and x - ulps max(eps|x|, q) increases with x.
    """
    f = get_format(fmt)
    if ulps <= 0.5:
        return _round_out(lo, hi, f)
    with np.errstate(invalid="ignore", over="ignore"):
        dlo = _up(ulps * np.maximum(_up(f.eps * np.abs(lo)), f.min_subnormal))
        dhi = _up(ulps * np.maximum(_up(f.eps * np.abs(hi)), f.min_subnormal))
        lo2, hi2 = _dn(lo - dlo), _up(hi + dhi)
    if f.name != "float64":  # past the largest finite value the result may be infinite
        lo2 = np.where(lo2 < -f.max_finite, -np.inf, lo2)
        hi2 = np.where(hi2 > f.max_finite, np.inf, hi2)
    return lo2, hi2


def _rn(x, fmt, mode: str = "nearest_even") -> np.ndarray:
    """fl_fmt(x): x rounded once into fmt (float64 result)."""
    f = get_format(fmt)
    x = _f64(x)
    if f.name == "float64":
        return x
    return np.asarray(round_to(np.ascontiguousarray(x), f, mode), dtype=_F64).reshape(x.shape)


def _check_ulps(ulps, op: str) -> float:
    if ulps is None:
        return ULP_BUDGETS[op]
    u = float(ulps)
    if not (math.isfinite(u) and u >= 0):
        raise ValueError(f"ulps must be a finite number >= 0; got ulps={ulps!r}")
    return u


def _parts(x):
    """(lo, hi, value, rule) of an Interval or an array (a point)."""
    if isinstance(x, Interval):
        return x.lo, x.hi, x.value, x.rule
    a = _f64(x)
    return a, a, a, None


def _rule_of(*xs) -> str:
    rules = {x.rule for x in xs if isinstance(x, Interval)}
    if len(rules) > 1:
        raise ValueError(f"operands carry different rules {sorted(rules)}; use Interval.with_rule")
    return rules.pop()


def _any_iv(*xs) -> bool:
    return any(isinstance(x, Interval) for x in xs)


def _value2(op, a, b):
    va, vb = _parts(a)[2], _parts(b)[2]
    return None if va is None or vb is None else op(va, vb)


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
    return Interval(lo, hi, v, x.rule)


def add(a, b, fmt="float32", ulps=None):
    """fl(a + b) in fmt; on intervals [a_lo + b_lo, a_hi + b_hi] rounded outward by the add budget."""
    u = _check_ulps(ulps, "add")
    if not _any_iv(a, b):
        from .gpu import rounded_add

        return np.asarray(rounded_add(_f64(a), _f64(b), get_format(fmt)), dtype=_F64)
    alo, ahi, _, _ = _parts(a)
    blo, bhi, _, _ = _parts(b)
    with np.errstate(invalid="ignore"):
        lo, hi = _widen(_dn(alo + blo), _up(ahi + bhi), fmt, u)
    return Interval(lo, hi, _value2(lambda p, q: add(p, q, fmt), a, b), _rule_of(a, b))


def sub(a, b, fmt="float32", ulps=None):
    """fl(a - b) in fmt; on intervals [a_lo - b_hi, a_hi - b_lo] rounded outward by the sub budget."""
    if not _any_iv(a, b):
        return add(a, -_f64(b), fmt)
    blo, bhi, bv, _ = _parts(b)
    nb = Interval(-bhi, -blo, None if bv is None else -bv, _rule_of(a, b))
    return add(a, nb, fmt, ulps=_check_ulps(ulps, "sub"))


def mul(a, b, fmt="float32", ulps=None):
    """fl(a b) in fmt; on intervals the corner products [min, max] rounded outward by the mul budget."""
    u = _check_ulps(ulps, "mul")
    if not _any_iv(a, b):
        return _rn(_f64(a) * _f64(b), fmt)  # exact for operands of up to 26 bits, then one rounding
    alo, ahi, _, _ = _parts(a)
    blo, bhi, _, _ = _parts(b)
    lo, hi = _widen(*_mul_bounds(alo, ahi, blo, bhi), fmt, u)
    return Interval(lo, hi, _value2(lambda p, q: mul(p, q, fmt), a, b), _rule_of(a, b))


def div(a, b, fmt="float32", fast: bool = False, ulps=None):
    """fl(a / b) in fmt (fast: within 2 ulps); on intervals the corner quotients rounded outward, [-inf, inf] if b may be 0."""
    u = _check_ulps(ulps, "fast_div" if fast else "div")
    if not _any_iv(a, b):
        q = _f64(a) / _f64(b)
        return _rn(q, fmt)
    alo, ahi, _, _ = _parts(a)
    blo, bhi, _, _ = _parts(b)
    straddles = (blo <= 0) & (bhi >= 0)
    with np.errstate(divide="ignore", invalid="ignore"):
        rlo = np.where(straddles, 1.0, 1.0 / np.where(straddles, 1.0, bhi))
        rhi = np.where(straddles, 1.0, 1.0 / np.where(straddles, 1.0, blo))
    lo, hi = _mul_bounds(alo, ahi, _dn(rlo), _up(rhi))
    lo = np.where(straddles, -np.inf, lo)
    hi = np.where(straddles, np.inf, hi)
    lo, hi = _widen(lo, hi, fmt, u)
    return Interval(lo, hi, _value2(lambda p, q: div(p, q, fmt), a, b), _rule_of(a, b))


def sqrt(x, fmt="float32", ulps=None):
    """fl(sqrt x) in fmt; on intervals [sqrt lo, sqrt hi] (lo clipped at 0) rounded outward."""
    u = _check_ulps(ulps, "sqrt")
    if not isinstance(x, Interval):
        return _rn(np.sqrt(_f64(x)), fmt)
    lo, hi = _widen(_dn(np.sqrt(np.maximum(x.lo, 0.0))), _up(np.sqrt(np.maximum(x.hi, 0.0))), fmt, u)
    v = None if x.value is None else sqrt(x.value, fmt)
    return Interval(np.maximum(lo, 0.0), hi, v, x.rule)


# exp64/log64 (precisionlab.emulate) are accurate to a few float64 ulps (tests/test_intervals.py
# checks them against mpmath); the bounds below allow 2^-44 relative, about 256 ulps.
_REL64 = 2.0**-44


def _exp64(x: np.ndarray) -> np.ndarray:
    import torch

    from .emulate import exp64

    return exp64(torch.from_numpy(np.ascontiguousarray(x, dtype=_F64))).numpy()


def _log64(x: np.ndarray) -> np.ndarray:
    import torch

    from .emulate import log64

    return log64(torch.from_numpy(np.ascontiguousarray(x, dtype=_F64))).numpy()


def _exp_dn(x) -> np.ndarray:
    """A lower bound of e^x (float64)."""
    y = _exp64(_f64(x))
    with np.errstate(invalid="ignore", over="ignore"):
        lo = _dn(y * (1 - _REL64) - 2 * _TINY)
    lo = np.where(np.isinf(y), np.finfo(_F64).max, lo)
    return np.maximum(lo, 0.0)


def _exp_up(x) -> np.ndarray:
    """An upper bound of e^x (float64)."""
    y = _exp64(_f64(x))
    with np.errstate(over="ignore"):
        return _up(y * (1 + _REL64) + 2 * _TINY)


def _log_dn(x) -> np.ndarray:
    """A lower bound of ln x for x > 0."""
    y = _log64(_f64(x))
    return _dn(y - np.abs(y) * _REL64 - 2.0**-1000)


def _log_up(x) -> np.ndarray:
    """An upper bound of ln x for x > 0."""
    y = _log64(_f64(x))
    return _up(y + np.abs(y) * _REL64 + 2.0**-1000)


def exp(x, fmt="float32", ulps=None):
    """fl(e^x) in fmt (e^x from float64, rounded once); on intervals [e^lo, e^hi] widened by the exp budget."""
    u = _check_ulps(ulps, "exp")
    if not isinstance(x, Interval):
        return _rn(_exp64(_f64(x)), fmt)
    lo, hi = _widen(_exp_dn(x.lo), _exp_up(x.hi), fmt, u)
    v = None if x.value is None else exp(x.value, fmt)
    return Interval(np.maximum(lo, 0.0), hi, v, x.rule)


def relu(x):
    """max(x, 0): exact; on intervals [max(lo, 0), max(hi, 0)], the executed branch wherever the bound does not straddle 0."""
    if not isinstance(x, Interval):
        return np.maximum(_f64(x), 0.0)
    v = None if x.value is None else np.maximum(x.value, 0.0)
    return Interval(np.maximum(x.lo, 0.0), np.maximum(x.hi, 0.0), v, x.rule)


def maximum(a, b):
    """max(a, b): exact; on intervals [max(a_lo, b_lo), max(a_hi, b_hi)] (both branches where the bounds overlap)."""
    if not _any_iv(a, b):
        return np.maximum(_f64(a), _f64(b))
    alo, ahi, _, _ = _parts(a)
    blo, bhi, _, _ = _parts(b)
    return Interval(np.maximum(alo, blo), np.maximum(ahi, bhi), _value2(np.maximum, a, b), _rule_of(a, b))


def amax(x, axis: int = -1):
    """max over an axis: exact; on intervals [max lo, max hi]."""
    if not isinstance(x, Interval):
        return np.max(_f64(x), axis=axis)
    v = None if x.value is None else np.max(x.value, axis=axis)
    return Interval(np.max(x.lo, axis=axis), np.max(x.hi, axis=axis), v, x.rule)


def where(cond, a, b):
    """cond ? a : b with cond taken from the target's executed values; on intervals the chosen branch's bounds."""
    c = np.asarray(cond, dtype=bool)
    if not _any_iv(a, b):
        return np.where(c, _f64(a), _f64(b))
    alo, ahi, _, _ = _parts(a)
    blo, bhi, _, _ = _parts(b)
    return Interval(np.where(c, alo, blo), np.where(c, ahi, bhi),
                    _value2(lambda p, q: np.where(c, p, q), a, b), _rule_of(a, b))


# =========================================================================== softmax and cross entropy


def _softmax64(x: np.ndarray) -> np.ndarray:
    """softmax over the last axis in float64: e^(x - max) / sum, exp64 and a fixed tree sum."""
    z = x - np.max(x, axis=-1, keepdims=True)
    e = _exp64(z)
    return e / _tree(e)[..., None]


def _softmax_range(lo: np.ndarray, hi: np.ndarray):
    """Bounds of the exact softmax over the box [lo, hi], and of D_i = sum_(j != i) e^(x_j - x_i).

    softmax_i = 1 / (1 + D_i) increases with x_i and decreases with every other x_j, so its
    smallest value takes x_i = lo_i and x_j = hi_j, its largest the opposite.
    """
    n = lo.shape[-1]
    off = ~np.eye(n, dtype=bool)
    with np.errstate(invalid="ignore"):
        up_arg = _up(hi[..., None, :] - lo[..., :, None])  # [.., i, j] = hi_j - lo_i
        dn_arg = _dn(lo[..., None, :] - hi[..., :, None])
    d_up = _sum_up(np.where(off, _exp_up(up_arg), 0.0))
    d_dn = _sum_dn(np.where(off, _exp_dn(dn_arg), 0.0))
    d_dn = np.maximum(d_dn, 0.0)
    s_lo = _dn(1.0 / _up(1.0 + d_up))
    s_hi = np.minimum(_up(1.0 / _dn(1.0 + d_dn)), 1.0)
    return np.maximum(s_lo, 0.0), s_hi, d_dn, d_up


def softmax(x, fmt="float32", ulps=None):
    """softmax over the last axis, computed in float64 and rounded once to fmt; on intervals the
    monotone bound [1/(1 + sum_(j!=i) e^(hi_j - lo_i)), 1/(1 + sum_(j!=i) e^(lo_j - hi_i))] widened by the budget."""
    u = _check_ulps(ulps, "softmax")
    if not isinstance(x, Interval):
        return _rn(_softmax64(_f64(x)), fmt)
    s_lo, s_hi, _, _ = _softmax_range(x.lo, x.hi)
    lo, hi = _widen(s_lo, s_hi, fmt, u)
    v = None if x.value is None else softmax(x.value, fmt)
    return Interval(np.maximum(lo, 0.0), np.minimum(hi, 1.0), v, x.rule)


def _cross_entropy64(logits: np.ndarray, labels: np.ndarray) -> np.ndarray:
    z = logits - np.max(logits, axis=-1, keepdims=True)
    lse = _log64(_tree(_exp64(z)))
    return lse - np.take_along_axis(z, labels[..., None], axis=-1)[..., 0]


def cross_entropy(logits, labels, fmt="float32", ulps=None):
    """-ln softmax(logits)[label] per row, float64 then rounded once to fmt; on intervals
    [ln(1 + D_lo), ln(1 + D_hi)] with D = sum_(j != label) e^(x_j - x_label) over the box, widened by the budget."""
    u = _check_ulps(ulps, "cross_entropy")
    lab = np.asarray(labels, dtype=np.int64)
    if not isinstance(logits, Interval):
        return _rn(_cross_entropy64(_f64(logits), lab), fmt)
    _, _, d_dn, d_up = _softmax_range(logits.lo, logits.hi)
    d_lo = np.take_along_axis(d_dn, lab[..., None], axis=-1)[..., 0]
    d_hi = np.take_along_axis(d_up, lab[..., None], axis=-1)[..., 0]
    lo = np.maximum(_log_dn(_dn(1.0 + d_lo)), 0.0)
    hi = _log_up(_up(1.0 + d_hi))
    # The float64 evaluation of lse - z_label loses up to a few ulps of the logits' size
    # (cancellation when the loss is small): allow 2^-46 of the largest |logit| on top.
    big = np.max(np.maximum(np.abs(logits.lo), np.abs(logits.hi)), axis=-1)
    slack = _up(big * 2.0**-46 + 2.0**-1000)
    lo, hi = _widen(_dn(lo - slack), _up(hi + slack), fmt, u)
    v = None if logits.value is None else cross_entropy(logits.value, lab, fmt)
    return Interval(np.maximum(lo, 0.0), hi, v, logits.rule)


# =========================================================================== kernels: sums and matmuls

KERNEL_ORDERS: tuple[str, ...] = ("sequential", "pairwise", "blocked", "warp", "split_k", "atomic",
                                  "tensor_core")
_ACC_FORMATS = ("float16", "bfloat16", "tf32", "float32", "float64")


def _pos(value, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f"{name} must be a positive integer; got {name}={value!r}")
    return int(value)


@dataclass(frozen=True)
class Kernel:
    """A sum or matmul as the GPU simulator runs it: order, tile sizes and the format of every stage.

    order: one of KERNEL_ORDERS (reduce_sum's orders; "tensor_core" is the bit-level block FMA
    of gpu.tensorcore, matmul only). acc: the accumulator; out: the result's format (default
    acc). inputs/input_mode: matmul operands are rounded to this format first (None: used as
    given). mode: rounding of every accumulation. block (blocked, atomic), splits (split_k),
    threads (warp) shape the order. partial: tile results are rounded to this format (split_k,
    atomic; the workspace, or C's dtype when tiles land in C by atomic adds); combine: the
    format tiles are added in (atomic, split_k, blocked; default acc). fused: run the matmul
    with gpu.matmul (fused multiply-adds of exact products; sequential or split_k only).
    model: the gpu.tensorcore model for order="tensor_core". stored_as: operands are first
    stored in this format (nearest), then rounded to inputs (a profile's float32 words fed raw).
    """

    order: str = "sequential"
    acc: str = "float32"
    out: str | None = None
    inputs: str | None = None
    input_mode: str = "nearest_even"
    mode: str = "nearest_even"
    block: int = 32
    splits: int = 4
    threads: int = 256
    partial: str | None = None
    combine: str | None = None
    fused: bool = False
    model: str = "A100"
    stored_as: str | None = None

    def __post_init__(self):
        check_choice(self.order, "order", KERNEL_ORDERS)
        for name in ("acc", "out", "inputs", "partial", "combine", "stored_as"):
            v = getattr(self, name)
            if v is not None:
                object.__setattr__(self, name, get_format(v).name)
        check_choice(self.acc, "accumulator", _ACC_FORMATS)
        check_choice(self.mode, "rounding mode", tuple(m for m in MODES if m != "stochastic"))
        check_choice(self.input_mode, "input rounding mode", MODES)
        for name in ("block", "splits", "threads"):
            _pos(getattr(self, name), name)
        if self.threads % 32:
            raise ValueError(f"threads must be a multiple of 32; got threads={self.threads}")
        if self.acc == "float64" and self.mode != "nearest_even":
            raise ValueError(f"a float64 accumulator rounds to nearest only; got mode={self.mode!r}")
        if self.combine is not None and self.order not in ("blocked", "split_k", "atomic"):
            raise ValueError(f"combine applies to orders blocked, split_k, atomic; got order={self.order!r}")
        if self.partial is not None and self.order not in ("split_k", "atomic"):
            raise ValueError(f"partial applies to orders split_k, atomic; got order={self.order!r}")
        if self.fused and (self.order not in ("sequential", "split_k") or self.partial or self.combine
                           or self.inputs is None):
            raise ValueError("fused=True runs gpu.matmul: order 'sequential' or 'split_k', operands "
                             "rounded to inputs=, no partial or combine; got "
                             f"order={self.order!r}, inputs={self.inputs!r}, partial={self.partial!r}, "
                             f"combine={self.combine!r}")
        if self.order == "tensor_core":
            from .gpu import get_tensor_core_model

            takes = getattr(get_tensor_core_model(self.model), "inputs", ("float16", "bfloat16", "tf32"))
            if self.inputs not in takes:
                raise ValueError(f"a {self.model} tensor_core kernel needs inputs= one of "
                                 f"{', '.join(takes)}; got inputs={self.inputs!r}")
            if (self.out or "float32") not in ("float32", "float16") or self.acc != "float32":
                raise ValueError("a tensor_core kernel accumulates in float32 and returns float32 or "
                                 f"float16; got acc={self.acc!r}, out={self.out!r}")

    @property
    def out_format(self) -> FloatFormat:
        """The format of the result."""
        return get_format(self.out or self.acc)

    @property
    def combine_format(self) -> FloatFormat:
        """The format tiles are combined in."""
        return get_format(self.combine or self.acc)

    def describe(self) -> str:
        """One line: what the kernel does."""
        parts = [self.order]
        if self.order in ("blocked", "atomic"):
            parts.append(f"block={self.block}")
        if self.order == "split_k":
            parts.append(f"splits={self.splits}")
        if self.order == "warp":
            parts.append(f"threads={self.threads}")
        if self.order == "tensor_core":
            parts.append(f"model={self.model}")
        if self.inputs:
            parts.append(f"operands {self.inputs}")
        parts.append(f"acc {self.acc}")
        if self.partial:
            parts.append(f"partials {self.partial}")
        if self.combine:
            parts.append(f"combine in {self.combine}")
        parts.append(f"out {self.out_format.name}")
        if self.fused:
            parts.append("fused")
        return ", ".join(parts)

    @classmethod
    def from_profile(cls, profile, splits: int = 1) -> Kernel:
        """The kernel gpu.matmul runs for a device profile with `splits` k-chunks (fused, no promotion)."""
        from .gpu import get_profile

        p = get_profile(profile)
        if p.promote_every is not None or p.saturate:
            raise ValueError(f"profile {p.name!r} promotes or saturates; bounds cover profiles without "
                             "either (fp32, tf32, bf16, fp16, fp16-acc16)")
        splits = _pos(splits, "splits")
        return cls(order="split_k" if splits > 1 else "sequential", acc=p.accumulator_format.name,
                   out=p.output, inputs=p.inputs, input_mode=p.input_mode, mode=p.acc_mode,
                   splits=splits, fused=True, stored_as=getattr(p, "stored_as", None))


def promote(kernel: Kernel) -> Kernel:
    """The same order in float64 everywhere: the kernel as high-precision re-execution runs it."""
    order = "sequential" if kernel.order == "tensor_core" else kernel.order
    return replace(kernel, order=order, acc="float64", out="float64", inputs=None, partial=None,
                   combine=None, mode="nearest_even", fused=False)


def _rng_for(kernel: Kernel, rng):
    if kernel.order == "atomic" and not isinstance(rng, np.random.Generator):
        raise ValueError(f"an atomic kernel draws its orders from rng=np.random.default_rng(seed); got rng={rng!r}")
    return rng


def _tile(kernel: Kernel, n: int) -> int:
    """Elements per tile of the first stage."""
    if kernel.order == "split_k":
        return -(-n // kernel.splits)
    return kernel.block


def _run_sum(x: np.ndarray, kernel: Kernel, rng) -> np.ndarray:
    """Execute the kernel's sum over the last axis with precisionlab.gpu.reduce_sum."""
    from .gpu import reduce_sum

    n = x.shape[-1]
    k = kernel
    if k.combine is None and not (k.order == "atomic" and k.partial is not None):
        order = "sequential" if k.order == "tensor_core" else k.order
        r = reduce_sum(x, order, k.acc, k.out_format, mode=k.mode, rng=rng, block=k.block,
                       splits=k.splits, threads=k.threads, partial=k.partial)
        return np.asarray(r, dtype=_F64)
    # Two stages: tiles summed in acc, rounded to `partial`, added in `combine` (in order, or
    # in a random order for atomics), as a split-K kernel whose tiles land in C by atomic adds.
    t = _tile(k, n)
    nb = -(-n // t)
    pad = np.zeros((*x.shape[:-1], nb * t - n))
    tiles = np.concatenate([x, pad], axis=-1).reshape(*x.shape[:-1], nb, t)
    parts = np.asarray(reduce_sum(tiles, "sequential", k.acc, mode=k.mode), dtype=_F64)
    if k.partial is not None:
        parts = _rn(parts, k.partial, k.mode)
    order = "atomic" if k.order == "atomic" else "sequential"
    r = reduce_sum(parts, order, k.combine_format, k.out_format, mode=k.mode, rng=rng, block=1)
    return np.asarray(r, dtype=_F64)


def _operands(a: np.ndarray, kernel: Kernel) -> np.ndarray:
    if kernel.stored_as is not None:
        a = _rn(a, kernel.stored_as)
    if kernel.inputs is None:
        return a
    return _rn(a, kernel.inputs, kernel.input_mode)


def _run_matmul(a: np.ndarray, b: np.ndarray, kernel: Kernel, rng) -> np.ndarray:
    """Execute C = A B under the kernel with the GPU simulator."""
    k = kernel
    if k.order == "tensor_core":
        from .gpu import tensor_core_matmul

        return np.asarray(tensor_core_matmul(a, b, model=k.model, inputs=k.inputs,
                                             out=k.out_format.name), dtype=_F64)
    if k.fused:
        from .gpu import DeviceProfile
        from .gpu import matmul as gpu_matmul

        extra = {"stored_as": k.stored_as} if k.stored_as is not None else {}
        profile = DeviceProfile("kernel", k.describe(), k.inputs, k.input_mode, k.acc, k.mode,
                                k.out_format.name, **extra)
        return np.asarray(gpu_matmul(a, b, profile, splits=k.splits if k.order == "split_k" else 1),
                          dtype=_F64)
    A, B = _operands(a, k), _operands(b, k)
    products = A[:, None, :] * B.T[None, :, :]  # (m, n, k): exact for operands of <= 26 bits
    return _run_sum(products, k, rng)


# --------------------------------------------------------------------------- leaf depths


def _seq_depths(length: np.ndarray, t: int) -> np.ndarray:
    """Adds on each position's path in sequential sums of groups of real length `length` (padded to t).

    acc = x_0; acc = fl(acc + x_p): x_0 and x_1 pass L - 1 adds, x_p (p >= 1) L - p; the
    padded zeros add nothing (x + 0 is exact).
    """
    p = np.arange(t)
    L = np.asarray(length)[..., None]
    d = L - np.maximum(p, 1)
    return np.where(p < L, np.maximum(d, 0), 0)


def _pairwise_depths(n: int) -> np.ndarray:
    """Adds on each leaf's path in reduce_sum's pairwise tree (neighbours paired, odd last moves up)."""
    pos = np.arange(n)
    d = np.zeros(n, dtype=np.int64)
    m = n
    while m > 1:
        h = m // 2
        paired = pos < 2 * h
        d += paired
        pos = np.where(paired, pos // 2, h)
        m = h + (m % 2)
    return d


def leaf_depths(n: int, kernel: Kernel) -> dict[str, np.ndarray]:
    """Roundings on each summand's path through the kernel's tree, per stage: {stage: depths (n,)}.

    The structure-aware bound charges summand i the factor (1 + u_stage)^depth per stage; the
    order-oblivious rule charges every summand n - 1. Stages: "tile" (within a tile, thread or
    the whole sum), "partial" (the rounding of the tile result), "combine" (adds between tiles),
    "warp" (the two 5-level shuffle trees of order="warp"), "block_fma" (tensor-core blocks).
    """
    n = _pos(n, "n")
    k = kernel
    idx = np.arange(n)
    if k.order in ("sequential",):
        return {"tile": _seq_depths(np.array(n), n)}
    if k.order == "pairwise":
        return {"tile": _pairwise_depths(n)}
    if k.order == "tensor_core":
        from .gpu import get_tensor_core_model

        B = get_tensor_core_model(k.model).block
        nblk = -(-n // B)
        return {"block_fma": nblk - idx // B}
    if k.order == "warp":
        T = k.threads
        rows = -(-n // T)
        thread, r = idx % T, idx // T
        per_thread = np.array([len(range(t, n, T)) for t in range(T)])
        tile = _seq_depths(per_thread, rows)[thread, r]
        return {"tile": tile, "warp": np.full(n, 10)}
    # blocked, split_k, atomic: tiles of t elements, then the tile results combined
    t = n if (k.order == "atomic" and k.block == 1) else _tile(k, n)
    if k.order == "atomic" and k.block == 1:
        return {"combine": np.full(n, n - 1)}
    nb = -(-n // t)
    lengths = np.minimum(t, n - np.arange(nb) * t)
    tile = _seq_depths(lengths, t)[idx // t, idx % t]
    if k.order == "atomic":
        comb = np.full(n, nb - 1)  # a random order: any tile may land first or last
    else:
        comb = _seq_depths(np.array(nb), nb)[idx // t]
    out = {"tile": tile, "combine": comb}
    if k.partial is not None:
        out["partial"] = np.ones(n, dtype=np.int64)
    return out


# --------------------------------------------------------------------------- the bounds


def _stage_sum(lo, hi, theta) -> tuple[np.ndarray, np.ndarray]:
    """Bounds on a tree sum over the last axis whose leaf i carries a factor in [1 - theta_i, 1 + theta_i].

    The computed sum is sum_i x_i (1 + d_i) with |d_i| <= theta_i; x - theta |x| increases
    with x, so the minimum over the box takes every x_i = lo_i (and the maximum hi_i).
    """
    with np.errstate(invalid="ignore", over="ignore"):
        tlo = _dn(lo - _up(theta * np.abs(lo)))
        thi = _up(hi + _up(theta * np.abs(hi)))
    return _sum_dn(tlo), _sum_up(thi)


def _overflow(lo, hi, fmt: FloatFormat, theta_max) -> tuple[np.ndarray, np.ndarray]:
    """Where a partial sum could pass fmt's largest value, the result may be +-inf (or NaN): unbounded."""
    if fmt.name == "float64":
        return lo, hi
    big = np.maximum(np.abs(lo), np.abs(hi))
    risky = _up(big * (1 + theta_max)) >= fmt.max_finite
    return np.where(risky, -np.inf, lo), np.where(risky, np.inf, hi)


def _tile_stage(lo, hi, t: int, depth_fn, u: float):
    """Pad the last axis to a multiple of t, group into tiles, bound each tile's sum."""
    n = lo.shape[-1]
    nb = -(-n // t)
    pad = np.zeros((*lo.shape[:-1], nb * t - n))
    L = np.concatenate([lo, pad], axis=-1).reshape(*lo.shape[:-1], nb, t)
    H = np.concatenate([hi, pad], axis=-1).reshape(*hi.shape[:-1], nb, t)
    lengths = np.minimum(t, n - np.arange(nb) * t)
    theta = _growth(u, depth_fn(lengths, t))
    slo, shi = _stage_sum(L, H, theta)
    return slo, shi, float(np.max(theta))


def _check_abs(fmt: FloatFormat) -> None:
    if not fmt.has_inf:
        raise ValueError(f"bounds support formats with infinities; got {fmt.name}")


def _bound_sum(lo, hi, kernel: Kernel, rule: str) -> tuple[np.ndarray, np.ndarray]:
    """Bounds on kernel's sum over the last axis of any x in [lo, hi], and on the exact sum."""
    k = kernel
    acc, comb, out = get_format(k.acc), k.combine_format, k.out_format
    for f in (acc, comb, out):
        _check_abs(f)
    n = lo.shape[-1]
    lo, hi = _round_out(lo, hi, acc)  # loading into the accumulator (exact for its own values)
    u_acc = _unit(acc, k.mode)
    if rule == "oblivious":
        fmts = [acc, comb] + ([get_format(k.partial)] if k.partial else [])
        u = max(_unit(f, k.mode) for f in fmts)
        casts = (k.partial is not None) + (k.combine is not None)
        steps = max(n - 1, 0) + casts
        theta = _growth(u, np.array(steps))
        slo, shi = _stage_sum(lo, hi, theta)
        if casts:  # a cast in the subnormal range errs by up to q absolutely, once per tile
            q = max(f.min_subnormal for f in fmts)
            tiles = -(-n // _tile(k, n)) if k.order in ("split_k", "atomic", "blocked") else 1
            extra = _up(2 * casts * tiles * q * (1 + float(theta)))
            slo, shi = _dn(slo - extra), _up(shi + extra)
        slo, shi = _overflow(slo, shi, comb if k.combine else acc, float(theta))
        return _round_out(slo, shi, out)
    if k.order in ("sequential", "pairwise"):
        d = leaf_depths(n, k)["tile"]
        theta = _growth(u_acc, d)
        slo, shi = _stage_sum(lo, hi, theta)
        slo, shi = _overflow(slo, shi, acc, float(np.max(theta, initial=0)))
        return _round_out(slo, shi, out)
    if k.order == "warp":
        T = k.threads
        rows = -(-n // T)
        pad = np.zeros((*lo.shape[:-1], rows * T - n))
        # thread t sums elements t, t + T, ...: regroup them as consecutive tiles of `rows`
        L = np.swapaxes(np.concatenate([lo, pad], -1).reshape(*lo.shape[:-1], rows, T), -1, -2)
        H = np.swapaxes(np.concatenate([hi, pad], -1).reshape(*hi.shape[:-1], rows, T), -1, -2)
        per_thread = np.array([len(range(t, n, T)) for t in range(T)])
        theta1 = _growth(u_acc, _seq_depths(per_thread, rows))
        tlo, thi = _stage_sum(L, H, theta1)  # (..., T)
        tlo, thi = _overflow(tlo, thi, acc, float(np.max(theta1)))
        theta2 = _growth(u_acc, np.full(T, 10))  # 5 shuffle levels in the warp, 5 across warps
        slo, shi = _stage_sum(tlo, thi, theta2)
        slo, shi = _overflow(slo, shi, acc, float(np.max(theta2)))
        return _round_out(slo, shi, out)
    # blocked, split_k, atomic
    if k.order == "atomic" and k.block == 1 and k.combine is None and k.partial is None:
        theta = _growth(u_acc, np.full(n, n - 1))
        slo, shi = _stage_sum(lo, hi, theta)
        slo, shi = _overflow(slo, shi, acc, float(np.max(theta)))
        return _round_out(slo, shi, out)
    t = _tile(k, n)
    plo, phi, th = _tile_stage(lo, hi, t, _seq_depths, u_acc)
    plo, phi = _overflow(plo, phi, acc, th)
    if k.partial is not None:
        plo, phi = _round_out(plo, phi, k.partial)
        plo, phi = _round_out(plo, phi, acc)
    plo, phi = _round_out(plo, phi, comb)
    nb = plo.shape[-1]
    u_c = _unit(comb, k.mode)
    if k.order == "atomic":
        theta = _growth(u_c, np.full(nb, nb - 1))
    else:
        theta = _growth(u_c, _seq_depths(np.array(nb), nb))
    slo, shi = _stage_sum(plo, phi, theta)
    slo, shi = _overflow(slo, shi, comb, float(np.max(theta)))
    return _round_out(slo, shi, out)


def _tc_step(kernel: Kernel) -> tuple[float, float]:
    """(relative, absolute) error one tensor-core block FMA may add, upper bounds.

    Terms are cut to multiples of 2^(e_max - 23 - g) (each error below that, and below
    2^(-23-g) |largest term|), summed exactly, then truncated to float32 (below 2^-23 of the
    sum, or 2^-149 below float32's normal range): |d - sum t| <= ((B + 1) 2^(-23-g) (1 + 2^-23)
    + 2^-23) sum |t| + 2^-149. With a float16 output every block's result is also rounded to
    float16 (gpu.tensorcore.block_fma), one more factor (1 + 2^-11) and 2^-25 absolute.
    """
    from .gpu import get_tensor_core_model

    m = get_tensor_core_model(kernel.model)
    rel = float(_up((m.block + 1) * 2.0 ** (-23 - m.align_bits) * (1 + 2.0**-23) + 2.0**-23))
    absolute = 2.0**-149
    if kernel.out_format.name == "float16":
        rel = float(_up(_up((1 + rel) * (1 + 2.0**-11)) - 1))
        absolute = float(_up(absolute * (1 + 2.0**-11) + 2.0**-25))
    return rel, absolute


def _bound_tensor_core(plo, phi, kernel: Kernel, rule: str):
    k = plo.shape[-1]
    nblk = len(range(0, k, _tc_block(kernel)))
    c, absolute = _tc_step(kernel)
    if rule == "oblivious":
        d = np.full(k, max(k - 1, 1))
    else:
        d = leaf_depths(k, kernel)["block_fma"]
    theta = _growth(c, d)
    slo, shi = _stage_sum(plo, phi, theta)
    extra = _up(nblk * absolute * (1 + float(np.max(theta))))  # each block's absolute error, grown
    slo, shi = _overflow(_dn(slo - extra), _up(shi + extra), kernel.out_format, float(np.max(theta)))
    slo, shi = _round_out(slo, shi, "float32")
    return _round_out(slo, shi, kernel.out_format)


def _tc_block(kernel: Kernel) -> int:
    from .gpu import get_tensor_core_model

    return get_tensor_core_model(kernel.model).block


def _check_kernel(kernel) -> Kernel:
    if not isinstance(kernel, Kernel):
        raise ValueError(f"kernel must be a precisionlab.intervals.Kernel; got kernel={kernel!r}")
    return kernel


def sum_(x, kernel: Kernel = Kernel(), rng: np.random.Generator | None = None):
    """sum over the last axis as `kernel` runs it; on intervals the kernel's bound under the interval's rule."""
    kernel = _check_kernel(kernel)
    if kernel.order == "tensor_core":
        raise ValueError("order='tensor_core' is a matmul kernel; use another order for sums")
    if not isinstance(x, Interval):
        return _run_sum(_f64(x), kernel, _rng_for(kernel, rng))
    if x.shape[-1] == 0:
        raise ValueError(f"x must have a non-empty last axis to sum over; got shape {x.shape}")
    lo, hi = _bound_sum(x.lo, x.hi, kernel, x.rule)
    v = None if x.value is None or (kernel.order == "atomic" and rng is None) else sum_(x.value, kernel, rng)
    return Interval(lo, hi, v, x.rule)


def matmul(a, b, kernel: Kernel = Kernel(), rng: np.random.Generator | None = None):
    """C = A B as `kernel` runs it; on intervals: operands rounded outward, corner products, the kernel's sum bound."""
    kernel = _check_kernel(kernel)
    alo, ahi, _, _ = _parts(a)
    blo, bhi, _, _ = _parts(b)
    if alo.ndim != 2 or blo.ndim != 2 or alo.shape[1] != blo.shape[0]:
        raise ValueError(f"matmul needs a (m, k) and b (k, n); got shapes {alo.shape} and {blo.shape}")
    if not _any_iv(a, b):
        return _run_matmul(alo, blo, kernel, _rng_for(kernel, rng))
    rule = _rule_of(a, b)
    for fmt in (kernel.stored_as, kernel.inputs):  # operand casts: rounded outward, any mode
        if fmt is not None:
            alo, ahi = _round_out(alo, ahi, fmt)
            blo, bhi = _round_out(blo, bhi, fmt)
    plo, phi = _mul_bounds(alo[:, None, :], ahi[:, None, :], blo.T[None, :, :], bhi.T[None, :, :])
    if kernel.order == "tensor_core":
        lo, hi = _bound_tensor_core(plo, phi, kernel, rule)
    else:
        lo, hi = _bound_sum(plo, phi, kernel, rule)
    v = None if (kernel.order == "atomic" and rng is None) else _value2(
        lambda p, q: matmul(p, q, kernel, rng), a, b)
    return Interval(lo, hi, v, rule)


# =========================================================================== by hand: a dot product


@dataclass(frozen=True)
class DotStep:
    """One step of a sequential dot product with naive interval arithmetic in fmt."""

    i: int
    product: float  # a_i b_i, exact
    value: float  # the accumulator after this step (round to nearest)
    lo: float  # naive interval: [RD(lo + p), RU(hi + p)]
    hi: float
    exact: float  # the exact partial sum (float64, exact for these sizes)


def dot_by_hand(a, b, fmt="float16") -> list[DotStep]:
    """Sequential a . b in fmt, step by step: the rounded value, naive directed-rounding interval, exact partial sum."""
    f = get_format(fmt)
    a, b = _f64(a).ravel(), _f64(b).ravel()
    if a.shape != b.shape or a.size == 0:
        raise ValueError(f"a and b must be non-empty vectors of one length; got {a.shape} and {b.shape}")
    if np.any(_rn(a, f) != a) or np.any(_rn(b, f) != b):
        raise ValueError(f"a and b must hold {f.name} values; round them first")
    steps, acc, lo, hi, exact = [], 0.0, 0.0, 0.0, 0.0
    for i, p in enumerate(a * b):
        acc = float(_rn(np.array([acc + p]), f)[0])  # acc + p is exact in float64 here
        lo = float(_round_out(np.array([lo + p]), np.array([lo + p]), f)[0][0])
        hi = float(_round_out(np.array([hi + p]), np.array([hi + p]), f)[1][0])
        exact = math.fsum([exact, float(p)])
        steps.append(DotStep(i, float(p), acc, lo, hi, exact))
    return steps


# =========================================================================== layers and verdicts


@dataclass(frozen=True)
class Layer:
    """One step of a program: `run` executes it on arrays; `bound` on intervals (default: run, written with this module's ops)."""

    name: str
    run: Callable
    bound: Callable | None = None

    def execute(self, x) -> np.ndarray:
        """The layer's output on an array (float64)."""
        return _f64(self.run(x))

    def interval(self, x: Interval) -> Interval:
        """The layer's bound on an interval input."""
        out = (self.bound or self.run)(x)
        if not isinstance(out, Interval):
            raise ValueError(f"layer {self.name!r} returned {type(out).__name__} for an Interval input; "
                             "write it with precisionlab.intervals ops or give bound=")
        return out


def _as_layers(program) -> list[Layer]:
    if isinstance(program, Layer) or callable(program):
        program = [program]
    layers = []
    for i, p in enumerate(program):
        if isinstance(p, Layer):
            layers.append(p)
        elif callable(p):
            layers.append(Layer(getattr(p, "__name__", f"layer {i}"), p))
        else:
            raise ValueError(f"a program is a Layer, a callable or a sequence of them; item {i} is {p!r}")
    if not layers:
        raise ValueError("a program needs at least one layer")
    return layers


def run_layers(program, x) -> list[np.ndarray]:
    """Every layer's output, in order, executing the program on x."""
    outs, h = [], x
    for layer in _as_layers(program):
        h = layer.execute(h)
        outs.append(h)
    return outs


def _span(n: int, start: int, end: int | None) -> tuple[int, int]:
    end = n if end is None else end
    if isinstance(start, bool) or not isinstance(start, (int, np.integer)) or not 0 <= start < n:
        raise ValueError(f"start must be a layer index in 0..{n - 1}; got start={start!r}")
    if isinstance(end, bool) or not isinstance(end, (int, np.integer)) or not start < end <= n:
        raise ValueError(f"end must be in {start + 1}..{n} (one past the last layer analysed); got end={end!r}")
    return int(start), int(end)


def propagate(target, x, reference_outputs: Sequence | None = None, rule: str = "structure",
              start: int = 0, end: int | None = None) -> list[Interval]:
    """Bounds of layers start..end-1 of target, each from hull(target's, reference's previous outputs)."""
    check_choice(rule, "rule", RULES)
    layers = _as_layers(target)
    start, end = _span(len(layers), start, end)
    t_outs = run_layers(layers[:end], x)
    r_outs = t_outs if reference_outputs is None else [_f64(r) for r in reference_outputs]
    bounds = []
    for i in range(start, end):
        bounds.append(layers[i].interval(_layer_input(i, x, t_outs, r_outs, rule)))
    return bounds


@dataclass(frozen=True)
class LayerCheck:
    """One layer's comparison: the reference against the target's bound."""

    name: str
    verdict: str
    rule: str
    index: tuple  # the worst element
    margin: float  # distance from the reference to the bound's nearer edge (negative: outside)
    score: float  # margin / half the width: 1 at the centre, 0 on an edge, negative outside
    width: float  # the bound's width at that element
    max_width: float  # the bound's largest width
    lo: float
    hi: float
    reference: float
    target: float

    def __str__(self) -> str:
        where = "inside" if self.margin >= 0 else "OUTSIDE"
        return (f"{self.name}: {self.verdict} ({self.rule} bound) at {self.index}: reference "
                f"{self.reference:.9g} {where} [{self.lo:.9g}, {self.hi:.9g}], margin {self.margin:.3g}, "
                f"width {self.width:.3g}")


@dataclass(frozen=True)
class Verdict:
    """Type-I (round-off) or Type-II (bug), the rule it used, and every analysed layer's check."""

    verdict: str
    rule: str
    layers: tuple[LayerCheck, ...]

    @property
    def deciding(self) -> LayerCheck:
        """The first Type-II layer, else the layer with the smallest relative margin."""
        bad = [c for c in self.layers if c.verdict == "Type-II"]
        if bad:
            return bad[0]
        return min(self.layers, key=lambda c: c.score)

    @property
    def margin(self) -> float:
        """The deciding layer's margin (negative when the reference lies outside)."""
        return self.deciding.margin

    @property
    def width(self) -> float:
        """The deciding layer's bound width at its worst element."""
        return self.deciding.width

    def __str__(self) -> str:
        return f"{self.verdict} by the {self.rule} bound; " + str(self.deciding)


def _check_layer(name, bound: Interval, ref, target, ref_bound: Interval | None, rule) -> LayerCheck:
    ref = np.broadcast_to(_f64(ref), bound.shape)
    target = np.broadcast_to(_f64(target), bound.shape)
    rlo, rhi = (ref, ref) if ref_bound is None else (ref_bound.lo, ref_bound.hi)
    with np.errstate(invalid="ignore"):
        margin = np.minimum(rhi - bound.lo, bound.hi - rlo)  # >= 0 iff the two overlap
        half = bound.width / 2
        score = np.where(half > 0, margin / np.where(half > 0, half, 1.0),
                         np.where(margin >= 0, 1.0, -np.inf))  # a zero-width bound hit exactly
        score = np.where(np.isnan(margin), -np.inf, score)
    flat = int(np.argmin(score)) if score.size else 0
    idx = np.unravel_index(flat, bound.shape) if bound.shape else ()
    m = float(margin[idx]) if not np.isnan(margin[idx]) else -np.inf
    verdict = "Type-II" if (m < 0 or np.any(np.isnan(margin))) else "Type-I"
    return LayerCheck(name, verdict, rule, tuple(int(i) for i in idx), m, float(score[idx]),
                      float(bound.width[idx]),
                      float(np.max(bound.width)) if bound.width.size else 0.0,
                      float(bound.lo[idx]), float(bound.hi[idx]), float(ref[idx]), float(target[idx]))


def classify(target, reference, x, rule: str = "structure", reference_rule: str | None = None,
             start: int = 0, end: int | None = None) -> Verdict:
    """Type-I if every analysed layer's reference output lies in (or, with reference_rule, its bound
    overlaps) the target's bound from hull(previous target and reference outputs); else Type-II.

    target: a Layer, callable or sequence of them. reference: the same kind (run on x), a list
    of every layer's reference output, or one array (the last layer's; the earlier layers are
    then taken to agree with the target's). reference_rule: None compares the reference as a
    point (the source's test); "structure"/"oblivious" bounds the reference program too (its
    layers must accept intervals) and asks only that the two bounds overlap, which stays sound
    when the reference has round-off of its own.
    """
    check_choice(rule, "rule", RULES)
    if reference_rule is not None:
        check_choice(reference_rule, "reference_rule", RULES)
    layers = _as_layers(target)
    start, end = _span(len(layers), start, end)
    t_outs = run_layers(layers[:end], x)
    ref_layers = None
    if isinstance(reference, Layer) or callable(reference) or (
            isinstance(reference, (list, tuple)) and reference and
            all(isinstance(r, Layer) or callable(r) for r in reference)):
        ref_layers = _as_layers(reference)
        if len(ref_layers) < end:
            raise ValueError(f"the reference has {len(ref_layers)} layers; the analysis needs {end}")
        r_outs = run_layers(ref_layers[:end], x)
    elif isinstance(reference, (list, tuple)):
        r_outs = [_f64(r) for r in reference]
        if len(r_outs) < end:
            raise ValueError(f"reference lists {len(r_outs)} layer outputs; the analysis needs {end}")
    else:
        if end != len(layers):
            raise ValueError("a single reference array is the last layer's output: analyse up to the last layer")
        r_outs = [*t_outs[:-1], _f64(reference)]
    if reference_rule is not None and ref_layers is None:
        raise ValueError("reference_rule needs the reference as layers (it bounds them)")
    return _analyse(layers, t_outs, ref_layers, r_outs, x, rule, reference_rule, start, end)


def _layer_input(i, x, t_outs, r_outs, rule):
    """Layer i's input interval: the point x for i = 0, else hull(target's, reference's outputs of layer i-1)."""
    if i == 0:
        return point(x, rule)
    return hull(t_outs[i - 1], r_outs[i - 1], value=t_outs[i - 1], rule=rule)


def _analyse(layers, t_outs, ref_layers, r_outs, x, rule, reference_rule, start, end) -> Verdict:
    """classify's loop, on outputs already computed."""
    checks = []
    for i in range(start, end):
        inp = _layer_input(i, x, t_outs, r_outs, rule)
        bound = layers[i].interval(inp)
        ref_bound = None
        if reference_rule is not None:
            rinp = Interval(inp.lo, inp.hi, r_outs[i - 1] if i else _f64(x), reference_rule)
            ref_bound = ref_layers[i].interval(rinp)
        checks.append(_check_layer(layers[i].name, bound, r_outs[i], t_outs[i], ref_bound, rule))
    verdict = "Type-II" if any(c.verdict == "Type-II" for c in checks) else "Type-I"
    return Verdict(verdict, rule, tuple(checks))


def allclose(a, b, rtol: float, atol: float) -> bool:
    """|a - b| <= atol + rtol |b| everywhere (torch.allclose's test; NaN is never close)."""
    a, b = _f64(a), _f64(b)
    with np.errstate(invalid="ignore"):
        return bool(np.all(np.abs(a - b) <= atol + rtol * np.abs(b)))


def high_precision_verdict(target_high, reference, x, rtol: float, atol: float) -> str:
    """The baseline: re-execute the target in high precision; Type-I if it now passes allclose with the reference."""
    if target_high is None:
        return "not supported"
    out = run_layers(target_high, x)[-1]
    ref = run_layers(reference, x)[-1] if not isinstance(reference, np.ndarray) else reference
    return "Type-I" if allclose(out, ref, rtol, atol) else "Type-II"


# =========================================================================== the labelled corpus


@dataclass(frozen=True)
class MismatchCase:
    """A target and a reference that fail allclose on an input, with the true cause."""

    name: str
    level: str  # "kernel" or "network"
    truth: str  # "Type-I" (round-off) or "Type-II" (bug)
    story: str
    x: np.ndarray
    target: tuple[Layer, ...]
    reference: tuple[Layer, ...]
    target_high: tuple[Layer, ...] | None
    rtol: float
    atol: float
    start: int = 0
    source: str = ""  # the issue in the source's evaluation it resembles, if any


@dataclass(frozen=True)
class CaseResult:
    """Verdicts of the three methods on one case, beside the truth."""

    case: MismatchCase
    max_diff: float
    passes_allclose: bool
    structure: Verdict
    oblivious: Verdict
    high_precision: str

    @property
    def correct(self) -> dict[str, bool]:
        """Per method: did it give the true verdict?"""
        t = self.case.truth
        return {"structure": self.structure.verdict == t, "oblivious": self.oblivious.verdict == t,
                "high_precision": self.high_precision == t}


def evaluate_case(case: MismatchCase) -> CaseResult:
    """Run target and reference, then the structure-aware interval (both programs bounded, overlap
    test), the order-oblivious rule (reference as a point) and high-precision re-execution."""
    n = len(case.target)
    t_outs = run_layers(case.target, case.x)
    r_outs = run_layers(case.reference, case.x)
    t, r = t_outs[-1], r_outs[-1]
    with np.errstate(invalid="ignore"):
        diff = float(np.max(np.abs(t - r)))
    tl, rl = _as_layers(case.target), _as_layers(case.reference)
    structure = _analyse(tl, t_outs, rl, r_outs, case.x, "structure", "structure", case.start, n)
    oblivious = _analyse(tl, t_outs, rl, r_outs, case.x, "oblivious", None, case.start, n)
    hp = high_precision_verdict(case.target_high, r, case.x, case.rtol, case.atol)
    return CaseResult(case, diff, allclose(t, r, case.rtol, case.atol), structure, oblivious, hp)


def _data(shape, seed: int, fmt="float32", scale: float = 1.0) -> np.ndarray:
    """Uniform(-scale, scale) values from default_rng(seed), rounded to fmt (portable: no normal sampler)."""
    rng = np.random.default_rng(seed)
    return _rn(rng.uniform(-scale, scale, size=shape), fmt)


def _mm_layer(name, w, kernel, rng_seed=None, transpose_x=False):
    """x -> x W under kernel (an atomic kernel redraws its orders from rng_seed on every call)."""

    def f(x):
        rng = None if rng_seed is None else np.random.default_rng(rng_seed)
        xx = x.T if transpose_x else x
        return matmul(xx, w, kernel, rng)

    return Layer(name, f)


def _case_matmul(name, truth, story, target_kernel, ref_kernel, m=8, k=4096, n=8, fmt="float32",
                 tol=None, seed=0, atomic_seed=None, source=""):
    a = _data((m, k), seed, fmt)
    w = _data((k, n), seed + 1, fmt)
    tgt = _mm_layer("matmul", w, target_kernel, atomic_seed)
    ref = _mm_layer("matmul", w, ref_kernel)
    high = _mm_layer("matmul", w, promote(target_kernel), atomic_seed)
    rtol, atol = tol if tol is not None else ASSERT_CLOSE_TOLERANCES[target_kernel.out_format.name]
    return MismatchCase(name, "kernel", truth, story, a, (tgt,), (ref,), (high,), rtol, atol,
                        source=source)


def _case_sum(name, truth, story, target_kernel, ref_kernel, n=32768, seed=0, atomic_seed=None,
              tol=None, source=""):
    rng = np.random.default_rng(seed)
    u = rng.uniform(-1, 1, size=(4, n))
    # centred rows: each exact sum is near zero, so every ordering's round-off shows in full
    x = _rn(u - np.array([math.fsum(r) / n for r in u])[:, None], "float32")

    def target(v, kernel=target_kernel):
        return sum_(v, kernel, None if atomic_seed is None else np.random.default_rng(atomic_seed))

    tgt = Layer("sum", target)
    ref = Layer("sum", lambda v: sum_(v, ref_kernel))
    hi = Layer("sum", lambda v: target(v, promote(target_kernel)))
    rtol, atol = tol if tol is not None else ASSERT_CLOSE_TOLERANCES["float32"]
    return MismatchCase(name, "kernel", truth, story, x, (tgt,), (ref,), (hi,), rtol, atol, source=source)


def _softmax_kernel(fmt, kernel, rng_seed=None):
    """softmax from its pieces in fmt: z = x - max (rounded), e = fl(e^z), s = kernel sum of e, e / s."""

    def f(x):
        rng = None if rng_seed is None else np.random.default_rng(rng_seed)
        z = sub(x, amax(x)[..., None] if not isinstance(x, Interval) else _keep(amax(x)), fmt)
        e = exp(z, fmt)
        s = sum_(e, kernel, rng)
        return div(e, s[..., None] if not isinstance(s, Interval) else _keep(s), fmt)

    return Layer("softmax kernel", f)


def _keep(iv: Interval) -> Interval:
    """Append a unit axis to an interval (broadcast over the last axis)."""
    return iv.reshape(*iv.shape, 1)


def _network(fmt, kernel, w1, b1, w2, b2, labels, groups=None, atomic_seed=None, bug=None,
             head="loss"):
    """x -> relu(x W1 + b1) -> h W2 + b2 -> per-row cross entropy -> loss; every op in fmt, matmuls by kernel.

    groups: micro-batches (lists of row indices). The correct loss is the mean over all rows;
    bug="normalise" averages each micro-batch's mean instead (the gradient-accumulation bug).
    """

    def lin(w, b, name):
        def f(h):
            rng = None if atomic_seed is None else np.random.default_rng(atomic_seed)
            y = matmul(h, w, kernel, rng)
            return add(y, b, fmt)

        return Layer(name, f)

    def loss(c):
        n = c.shape[0]
        flat = Kernel("pairwise", acc=fmt if fmt != "bfloat16" else "float32", out=fmt)
        if bug == "normalise":
            means = []
            for g in groups:
                s = sum_(c[np.asarray(g)], flat)
                means.append(div(s, float(len(g)), fmt))
            stacked = _stack(means)
            return div(sum_(stacked, flat), float(len(groups)), fmt)
        return div(sum_(c, flat), float(n), fmt)

    layers = (
        Layer("linear 1 + relu", lambda h: relu(lin(w1, b1, "l1").run(h))),
        lin(w2, b2, "linear 2"),
        Layer("cross entropy", lambda z: cross_entropy(z, labels, fmt)),
        Layer("loss normalisation", loss),
    )
    return layers if head == "loss" else layers[:2]


def _stack(items):
    if not any(isinstance(i, Interval) for i in items):
        return np.stack([_f64(i) for i in items])
    rule = _rule_of(*[i for i in items if isinstance(i, Interval)])
    lo = np.stack([_parts(i)[0] for i in items])
    hi = np.stack([_parts(i)[1] for i in items])
    vals = [_parts(i)[2] for i in items]
    v = None if any(v is None for v in vals) else np.stack(vals)
    return Interval(lo, hi, v, rule)


def _attention(fmt, kernel, wq, wk, wrong_axis=False):
    """x -> softmax(x Wq (x Wk)^T) over rows (the bug: over columns)."""

    def scores(x):
        q = matmul(x, wq, kernel)
        kk = matmul(x, wk, kernel)
        return matmul(q, kk.T, kernel)

    def attn(s):
        if wrong_axis:
            return softmax(s.T, fmt).T
        return softmax(s, fmt)

    return (Layer("scores q k^T", scores), Layer("softmax", attn))


def _case_network(name, truth, story, fmt_t, kernel_t, fmt_r, kernel_r, bug=None, start=0,
                  seed=0, atomic_seed=None, tol=None, source="", head="loss"):
    rows, d_in, d_h, classes = 24, 64, 32, 10
    x = _data((rows, d_in), seed, "float32")
    w1 = _data((d_in, d_h), seed + 1, "float32", 1 / math.sqrt(d_in))
    b1 = _data((d_h,), seed + 2, "float32", 0.1)
    w2 = _data((d_h, classes), seed + 3, "float32", 1 / math.sqrt(d_h))
    b2 = _data((classes,), seed + 4, "float32", 0.1)
    labels = np.random.default_rng(seed + 5).integers(0, classes, size=rows)
    groups = [list(range(0, 4)), list(range(4, 20)), list(range(20, 24))]  # 4, 16 and 4 tokens
    tgt = _network(fmt_t, kernel_t, w1, b1, w2, b2, labels, groups, atomic_seed, bug, head)
    ref = _network(fmt_r, kernel_r, w1, b1, w2, b2, labels, groups, head=head)
    high = _network("float64", promote(kernel_t), w1, b1, w2, b2, labels, groups, atomic_seed, bug,
                    head)
    rtol, atol = tol if tol is not None else ASSERT_CLOSE_TOLERANCES[fmt_t]
    return MismatchCase(name, "network", truth, story, x, tgt, ref, high, rtol, atol, start=start,
                        source=source)


def build_case(name: str) -> MismatchCase:
    """The corpus case of that name (see CORPUS), built from fixed seeds."""
    check_choice(name, "case", CORPUS)
    fp32_seq = Kernel("sequential", acc="float32")
    f64_seq = Kernel("sequential", acc="float64")
    if name == "split-K fp32":
        return _case_matmul(
            name, "Type-I", "fp32 matmul with 4-way split-K vs a one-pass fp32 reference",
            Kernel.from_profile("fp32", splits=4), fp32_seq, tol=(1e-5, 1e-8))
    if name == "atomic split-K, fp16 C":
        return _case_matmul(
            name, "Type-I", "fp16 matmul, fp32 tiles of 256 added into fp16 C by atomics in a random "
            "order, vs fp16 matmul with one fp32 pass", Kernel("atomic", acc="float32", inputs="float16",
                                                          block=256, partial="float16",
                                                          combine="float16", out="float16"),
            Kernel("sequential", acc="float32", inputs="float16", out="float16"), k=2048,
            fmt="float16", atomic_seed=7, source="#1808")
    if name == "tf32 tensor cores":
        return _case_matmul(
            name, "Type-I", "fp32 tensors on A100 tensor cores with TF32 vs an fp32 reference",
            Kernel("tensor_core", inputs="tf32", model="A100"), fp32_seq, k=1024, source="#4551")
    if name == "bf16 autocast":
        return _case_matmul(
            name, "Type-I", "bf16 autocast matmul (fp32 accumulation, bf16 result) checked with fp32 "
            "tolerances", Kernel.from_profile("bf16"), fp32_seq, k=1024,
            tol=ASSERT_CLOSE_TOLERANCES["float32"])
    if name == "fp16 accumulator":
        return _case_matmul(
            name, "Type-I", "fp16 operands summed in an fp16 accumulator vs fp32 accumulation",
            Kernel.from_profile("fp16-acc16"), Kernel("sequential", inputs="float16", out="float16"),
            k=512, fmt="float16")
    if name == "atomic sum":
        return _case_sum(
            name, "Type-I", "sum of 32768 values: fp32 tiles of 256 added by atomics in a random "
            "order, vs a pairwise fp32 sum", Kernel("atomic", acc="float32", block=256),
            Kernel("pairwise", acc="float32"), atomic_seed=3)
    if name == "fp16 softmax kernel":
        rng = np.random.default_rng(11)
        x = _rn(rng.uniform(-8, 8, size=(16, 256)), "float16")
        tgt = _softmax_kernel("float16", Kernel("warp", acc="float16", threads=128))
        ref = _softmax_kernel("float32", Kernel("pairwise", acc="float32"))
        high = _softmax_kernel("float64", Kernel("warp", acc="float64", threads=128))
        return MismatchCase(name, "kernel", "Type-I", "softmax in fp16 with a warp-shuffle fp16 sum "
                            "vs fp32, checked with fp32 tolerances", x, (tgt,), (ref,), (high,),
                            *ASSERT_CLOSE_TOLERANCES["float32"])
    if name == "transposed strides":
        m = 16
        a = _data((m, m), 21, "float32")
        w = _data((m, m), 22, "float32")
        tgt = _mm_layer("A^T B (swapped strides)", w, fp32_seq)  # reads A, not A^T
        ref = _mm_layer("A^T B", w, fp32_seq, transpose_x=True)
        high = _mm_layer("A^T B (swapped strides)", w, f64_seq)
        return MismatchCase(name, "kernel", "Type-II", "A^T B whose kernel swaps A's two strides, so it "
                            "computes A B", a, (tgt,), (ref,), (high,), 1.3e-6, 1e-5, source="#1666")
    if name == "fused bias dropped":
        return _fused_case(name)
    if name == "bf16 reference":
        return _case_matmul(
            name, "Type-I", "fp32 split-K kernel checked against the library's bf16 autocast matmul "
            "with fp32 tolerances", Kernel.from_profile("fp32", splits=8), Kernel.from_profile("bf16"),
            k=2048, tol=ASSERT_CLOSE_TOLERANCES["float32"], source="#1937")
    if name == "fp16 fast-path tail":
        return _tail_case(name)
    if name == "gradient accumulation":
        return _case_network(
            name, "Type-II", "loss = mean of micro-batch means (4, 16, 4 tokens) instead of the mean "
            "over all tokens", "float32", fp32_seq, "float32", fp32_seq, bug="normalise", start=3,
            source="transformers #34191")
    if name == "bf16 network":
        return _case_network(
            name, "Type-I", "the same network in bf16 (fp32 accumulation) vs fp32, checked with fp32 "
            "tolerances", "bfloat16", Kernel("sequential", acc="float32", inputs="bfloat16",
                                             out="bfloat16"), "float32", fp32_seq,
            tol=ASSERT_CLOSE_TOLERANCES["float32"])
    if name == "split-K network":
        return _case_network(
            name, "Type-I", "logits of the network with atomic split-K fp32 matmuls vs one-pass fp32, "
            "in a bitwise determinism test", "float32", Kernel("atomic", acc="float32", block=16),
            "float32", fp32_seq, atomic_seed=5, tol=(0.0, 0.0), head="logits")
    if name == "softmax over the wrong axis":
        rows, d = 16, 32
        x = _data((rows, d), 41, "float32")
        wq = _data((d, d), 42, "float32", 1 / math.sqrt(d))
        wk = _data((d, d), 43, "float32", 1 / math.sqrt(d))
        tgt = _attention("float32", fp32_seq, wq, wk, wrong_axis=True)
        ref = _attention("float32", fp32_seq, wq, wk)
        high = _attention("float64", f64_seq, wq, wk, wrong_axis=True)
        return MismatchCase(name, "network", "Type-II", "attention scores normalised over the key "
                            "axis of the transposed layout", x, tgt, ref, high, 1.3e-6, 1e-5)
    raise AssertionError(name)  # pragma: no cover - check_choice covers every name


def _fused_case(name):
    m, k, n = 8, 4096, 16
    bias = _data((n,), 32, "float32", 0.02)
    a = _data((m, k), 30, "float32")
    w = _data((k, n), 31, "float32")
    blocked = Kernel("blocked", acc="float32", block=32)
    keep = np.arange(n) < n - 4
    b_bug = np.where(keep, bias, 0.0)

    def target(x, kernel=blocked, fmt="float32"):
        return add(matmul(x, w, kernel), b_bug, fmt)

    def reference(x):
        return add(matmul(x, w, Kernel("sequential", acc="float64")), bias, "float64")

    return MismatchCase(
        name, "kernel", "Type-II", "fused matmul + bias (blocked fp32) whose epilogue forgets the "
        "bias in the last 4 columns, vs a float64 reference", a,
        (Layer("matmul + bias (fused)", target),), (Layer("matmul + bias", reference),),
        (Layer("matmul + bias (fused)", lambda x: target(x, promote(blocked), "float64")),),
        1.3e-6, 1e-5)


def _tail_case(name):
    m, k, n = 8, 1027, 8
    a = _data((m, k), 50, "float16")
    w = _data((k, n), 51, "float16")
    fast = Kernel("sequential", acc="float32", inputs="float16", out="float16")

    def fp16_path(x):  # vector loads of 8: the last k mod 8 = 3 products are never loaded
        keep = (k // 8) * 8
        xx = x[:, :keep]
        return matmul(xx, w[:keep], fast)

    def fp64_path(x):  # the float64 path is scalar code, and correct
        return matmul(x, w, promote(fast))

    ref = Kernel("sequential", acc="float32", inputs="float16", out="float16")
    return MismatchCase(
        name, "kernel", "Type-II", "the fp16 fast path drops the last k mod 8 products; the float64 "
        "path is separate scalar code", a, (Layer("matmul (fp16 path)", fp16_path),),
        (Layer("matmul", lambda x: matmul(x, w, ref)),), (Layer("matmul (fp64 path)", fp64_path),),
        *ASSERT_CLOSE_TOLERANCES["float16"], source="#2680")


CORPUS: tuple[str, ...] = (
    "split-K fp32",
    "atomic split-K, fp16 C",
    "tf32 tensor cores",
    "bf16 autocast",
    "fp16 accumulator",
    "atomic sum",
    "fp16 softmax kernel",
    "bf16 reference",
    "transposed strides",
    "fused bias dropped",
    "fp16 fast-path tail",
    "gradient accumulation",
    "bf16 network",
    "split-K network",
    "softmax over the wrong axis",
)



# =========================================================================== an injected bug (the widget's model)

# The kernel each format's matmul runs in injected_bug (and the chapter's widget).
BUG_KERNELS: dict[str, Kernel] = {
    "float32": Kernel("blocked", acc="float32", block=32),
    "tf32": Kernel("blocked", acc="float32", inputs="tf32", input_mode="nearest_away", block=32),
    "bfloat16": Kernel("blocked", acc="float32", inputs="bfloat16", out="bfloat16", block=32),
    "float16": Kernel("blocked", acc="float32", inputs="float16", out="float16", block=32),
}


@dataclass(frozen=True)
class BugCheck:
    """A matmul kernel with a bug of known size against a float64 reference, and what each method says."""

    k: int
    fmt: str
    bug: float  # the injected error, as a fraction of mean |C|
    kernel: Kernel
    index: tuple  # the output element the bug shifts
    target: np.ndarray
    reference: np.ndarray
    structure: Interval
    oblivious: Interval
    verdicts: dict  # method -> "Type-I" / "Type-II"
    passes_allclose: bool

    @property
    def error(self) -> float:
        """|target - reference| at the bugged element."""
        return float(abs(self.target[self.index] - self.reference[self.index]))


def injected_bug(k: int = 1024, fmt: str = "float32", bug: float = 0.0, m: int = 4, n: int = 4,
                 seed: int = 0) -> BugCheck:
    """C = A B by BUG_KERNELS[fmt] plus bug * mean|C| at C[0, 0], against a float64 reference:
    the interval (target bound vs reference point), the order-oblivious rule, high-precision re-execution."""
    fmt = check_choice(get_format(fmt).name, "format", tuple(BUG_KERNELS))
    k = _pos(k, "k")
    try:
        bug = float(bug)
    except (TypeError, ValueError):
        bug = math.nan
    if not (math.isfinite(bug) and bug >= 0):
        raise ValueError(f"bug must be a finite number >= 0 (a fraction of mean |C|); got bug={bug!r}")
    kernel = BUG_KERNELS[fmt]
    a = _data((m, k), seed, "float32")
    b = _data((k, n), seed + 1, "float32")
    exact = np.array([[math.fsum(a[i] * b[:, j]) for j in range(n)] for i in range(m)])
    delta = np.zeros((m, n))
    delta[0, 0] = bug * math.fsum(np.abs(exact).ravel()) / exact.size

    def target(x, kern=kernel, out=kernel.out_format.name):
        return add(matmul(x, b, kern), delta, out)

    reference = run_layers(Layer("float64", lambda x: matmul(x, b, Kernel("sequential", acc="float64"))), a)[-1]
    t = _f64(target(a))
    s = target(point(a, "structure"))
    o = target(point(a, "oblivious"))
    rtol, atol = ASSERT_CLOSE_TOLERANCES[fmt]
    high = target(a, promote(kernel), "float64")
    verdicts = {
        "structure": "Type-I" if s.contains(reference).all() else "Type-II",
        "oblivious": "Type-I" if o.contains(reference).all() else "Type-II",
        "high_precision": "Type-I" if allclose(high, reference, rtol, atol) else "Type-II",
    }
    return BugCheck(k, fmt, bug, kernel, (0, 0), t, reference, s, o, verdicts,
                    allclose(t, reference, rtol, atol))
