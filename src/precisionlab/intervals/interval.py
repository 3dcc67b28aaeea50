"""The Interval: elementwise bounds in float64, with infinities and a "may be NaN" flag.

Convention for non-finite values (every rule of this package follows it):

* An element stands for the set [lo, hi] U N of values the operation can give, where [lo, hi]
  is a closed range of the *extended* reals (lo = -inf means -inf itself is possible, hi = +inf
  means +inf is) and N = {NaN} where the flag `nan` is set.
* The range may be empty, encoded as lo = +inf, hi = -inf: the element can only be NaN
  (sqrt of a negative, inf - inf, a softmax row holding +inf).
* `contains(y)`: lo <= y <= hi, or y is NaN and `nan` is set. So an executed +inf lies in a
  bound only where hi = +inf, and an executed NaN only where the bound says it may be NaN.
"""

from __future__ import annotations

import numpy as np

from ..checks import check_choice
from ..gpu import as_float64
from .outward import INF, empty_range, up

RULES: tuple[str, ...] = ("structure", "oblivious")


class Interval:
    """Elementwise bounds lo <= x <= hi (extended reals) and a may-be-NaN flag, with the target's executed value and the rule in force.

    The package's operations (add, mul, cast, softmax, sum_, matmul, ...) take Intervals
    or arrays: on arrays they execute, on Intervals they bound every result the operation
    could give, rounding outward. Build the inputs with `point` (an exact input) or `hull`
    (two programs' values).

    Parameters
    ----------
    lo, hi : float or array_like
        Lower and upper bounds (float64, broadcast to one shape); lo <= hi elementwise,
        except lo = +inf, hi = -inf, the empty range (NaN only). A NaN bound makes that
        side unbounded and sets the NaN flag.
    value : float or array_like or None, default None
        The target's executed value, carried through the operations (None: no value).
    rule : {"structure", "oblivious"}, default "structure"
        How sums and matmuls downstream are bounded: with the kernel's summation tree, or
        for any order (`RULES`).
    nan : bool or array_like or None, default None
        Where the result may be NaN (None: nowhere, except where lo or hi is NaN).

    Raises
    ------
    ValueError
        If some lo exceeds its hi (other than the empty range), or rule is unknown.

    Examples
    --------
    >>> from precisionlab.intervals import Interval
    >>> x = Interval([0.0, 1.0], [0.5, 2.0])
    >>> x
    Interval(shape=(2,), rule='structure', max width=1)
    >>> x.mid.tolist(), x.contains([0.25, 3.0]).tolist()
    ([0.25, 1.5], [True, False])
    >>> x.width.tolist()  # hi - lo rounded up: a width is a bound too
    [0.5000000000000001, 1.0000000000000002]
    """

    __slots__ = ("hi", "lo", "nan", "rule", "value")

    def __init__(self, lo, hi, value=None, rule: str = "structure", nan=None):
        lo, hi = np.broadcast_arrays(as_float64(lo), as_float64(hi))
        lo, hi = np.array(lo), np.array(hi)
        flag = np.zeros(lo.shape, dtype=bool) if nan is None else np.broadcast_to(
            np.asarray(nan, dtype=bool), lo.shape).copy()
        nlo, nhi = np.isnan(lo), np.isnan(hi)
        if nlo.any() or nhi.any():
            both = nlo & nhi  # nothing but NaN: the empty range
            flag |= nlo | nhi  # one side not known: unbounded on that side, may be NaN
            lo = np.where(both, INF, np.where(nlo, -INF, lo))
            hi = np.where(both, -INF, np.where(nhi, INF, hi))
        empty = lo > hi
        if empty.any():
            bad = empty & ~((lo == INF) & (hi == -INF))
            if np.any(bad):
                raise ValueError(f"lower bounds must not exceed upper bounds; got lo={lo[bad][:3]}, "
                                 f"hi={hi[bad][:3]} (an empty range, NaN only, is lo=+inf, hi=-inf)")
            flag |= empty
        self.lo = lo
        self.hi = hi
        self.nan = flag
        self.value = None if value is None else np.broadcast_to(as_float64(value), self.lo.shape).copy()
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

    def _new(self, lo, hi, value, nan):
        return Interval(lo, hi, value, self.rule, nan)

    def __getitem__(self, index) -> Interval:
        """Gather: the same elements' bounds (no rounding)."""
        v = None if self.value is None else self.value[index]
        return self._new(self.lo[index], self.hi[index], v, self.nan[index])

    def reshape(self, *shape) -> Interval:
        """Reshape: bounds move with their elements (no rounding)."""
        v = None if self.value is None else self.value.reshape(*shape)
        return self._new(self.lo.reshape(*shape), self.hi.reshape(*shape), v, self.nan.reshape(*shape))

    def transpose(self, *axes) -> Interval:
        """Transpose: bounds move with their elements (no rounding)."""
        axes = axes or None
        v = None if self.value is None else self.value.transpose(axes)
        return self._new(self.lo.transpose(axes), self.hi.transpose(axes), v, self.nan.transpose(axes))

    @property
    def T(self) -> Interval:
        """The transpose of a matrix of bounds."""
        return self.transpose()

    def with_rule(self, rule: str) -> Interval:
        """The same bounds, with sums and matmuls downstream bounded by `rule`.

        Parameters
        ----------
        rule : {"structure", "oblivious"}
            The rule to carry on.

        Returns
        -------
        Interval
            A copy with that rule.
        """
        return Interval(self.lo, self.hi, self.value, rule, self.nan)

    # ------------------------------------------------------------------ queries
    @property
    def empty(self) -> np.ndarray:
        """Elements that can only be NaN (no real value)."""
        return self.lo > self.hi

    @property
    def finite(self) -> np.ndarray:
        """Elements whose every possible value is finite (no +-inf, no NaN)."""
        return np.isfinite(self.lo) & np.isfinite(self.hi) & ~self.nan

    @property
    def width(self) -> np.ndarray:
        """hi - lo, rounded up (0 for a single infinity and for NaN only)."""
        with np.errstate(invalid="ignore"):
            w = up(self.hi - self.lo)
        return np.where(np.isnan(w) | self.empty, 0.0, w)

    @property
    def mid(self) -> np.ndarray:
        """(lo + hi) / 2 (not rounded outward: for display)."""
        with np.errstate(invalid="ignore"):
            return self.lo / 2 + self.hi / 2

    def contains(self, y) -> np.ndarray:
        """lo <= y <= hi elementwise, or y is NaN where the bound may be NaN.

        Parameters
        ----------
        y : float or array_like
            Values broadcastable to the interval's shape.

        Returns
        -------
        numpy.ndarray
            A bool array: where y lies in the bound.
        """
        y = as_float64(y)
        return ((self.lo <= y) & (y <= self.hi)) | (np.isnan(y) & self.nan)

    def __repr__(self) -> str:
        extra = f", may be NaN at {int(self.nan.sum())}" if self.nan.any() else ""
        w = float(np.max(self.width)) if self.width.size else 0.0
        return f"Interval(shape={self.shape}, rule={self.rule!r}, max width={w:.3g}{extra})"


def point(x, rule: str = "structure") -> Interval:
    """[x, x]: the exact input, also the executed value (NaN entries: NaN only).

    Parameters
    ----------
    x : float or array_like
        The input values.
    rule : {"structure", "oblivious"}, default "structure"
        The rule sums and matmuls downstream are bounded with.

    Returns
    -------
    Interval
        Zero width, with x as its executed value.

    Examples
    --------
    >>> from precisionlab.intervals import add, point
    >>> a = point([0.1, 0.2])
    >>> s = add(a, a, "float16")  # every float16 rounding of a + a
    >>> s.lo.tolist(), s.hi.tolist()
    ([0.199951171875, 0.39990234375], [0.2000732421875, 0.400146484375])
    >>> s.value.tolist()  # what float16 addition gives
    [0.199951171875, 0.39990234375]
    """
    x = as_float64(x)
    return Interval(x, x, x, rule)


def hull(a, b, value=None, rule: str = "structure") -> Interval:
    """[min(a, b), max(a, b)] elementwise, NaN where either is NaN: the union of two programs' values; `value` defaults to a.

    Parameters
    ----------
    a, b : float or array_like
        The two programs' values (the target's first), broadcast to one shape.
    value : float or array_like or None, default None
        The executed value carried on; None takes a.
    rule : {"structure", "oblivious"}, default "structure"
        The rule sums and matmuls downstream are bounded with.

    Returns
    -------
    Interval
        The hull, with the may-be-NaN flag where a or b is NaN.

    Examples
    --------
    >>> from precisionlab.intervals import hull
    >>> h = hull([1.0, 2.0], [1.5, 1.0])
    >>> h.lo.tolist(), h.hi.tolist(), h.value.tolist()
    ([1.0, 1.0], [1.5, 2.0], [1.0, 2.0])
    """
    a, b = as_float64(a), as_float64(b)
    nan = np.isnan(a) | np.isnan(b)
    return Interval(np.fmin(a, b), np.fmax(a, b), a if value is None else value, rule, nan)


def concrete(x) -> np.ndarray:
    """The executed value: x itself for arrays, the target's value carried by an Interval.

    Parameters
    ----------
    x : float or array_like or Interval
        A value, or a bound that carries its executed value (from `point`, `hull` or a rule
        applied to them).

    Returns
    -------
    numpy.ndarray
        x as a float64 array, or the Interval's `value`.

    Raises
    ------
    ValueError
        If x is an Interval without an executed value.

    Examples
    --------
    >>> from precisionlab.intervals import Interval, concrete, point
    >>> concrete([1.0, 2.0]).tolist(), concrete(point([0.5])).tolist()
    ([1.0, 2.0], [0.5])
    >>> concrete(Interval(0.0, 1.0))
    Traceback (most recent call last):
        ...
    ValueError: this Interval carries no executed value; build it with point() or hull()
    """
    if isinstance(x, Interval):
        if x.value is None:
            raise ValueError("this Interval carries no executed value; build it with point() or hull()")
        return x.value
    return as_float64(x)


def parts_of(x):
    """(lo, hi, nan, value, rule) of an Interval or of an array (a point)."""
    if isinstance(x, Interval):
        return x.lo, x.hi, x.nan, x.value, x.rule
    p = point(x)
    return p.lo, p.hi, p.nan, p.value, None


def rule_of(*xs) -> str:
    """The one rule the Interval operands carry (ValueError if they carry different ones)."""
    rules = {x.rule for x in xs if isinstance(x, Interval)}
    if len(rules) > 1:
        raise ValueError(f"operands carry different rules {sorted(rules)}; use Interval.with_rule")
    return rules.pop()


def any_interval(*xs) -> bool:
    """Whether any operand is an Interval (else the operation just executes)."""
    return any(isinstance(x, Interval) for x in xs)


def paired_value(op, a, b):
    """op(value of a, value of b): the target's executed result, None if either carries none."""
    va, vb = parts_of(a)[3], parts_of(b)[3]
    return None if va is None or vb is None else op(va, vb)


def canonical(lo, hi, nan, value, rule) -> Interval:
    """An Interval whose empty elements (lo > hi, or flagged) are put in canonical form."""
    empty = empty_range(lo, hi)
    if empty.any():
        lo, hi, nan = np.where(empty, INF, lo), np.where(empty, -INF, hi), np.asarray(nan) | empty
    return Interval(lo, hi, value, rule, nan)
