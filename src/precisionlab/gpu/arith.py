"""Exactly rounded addition on arrays: fl(a + b) with one rounding from the real sum.

Every simulated accumulator step in this package goes through `RoundedAdder.add`, which
computes the machine sum in a wider *container* float and hands it to
`precisionlab.rounding.round_to`. Two facts make that single rounding exact:

* **Innocuous double rounding** (Figueroa 1995): when both operands are p-bit
  floats and the container keeps at least 2p + 2 bits, rounding the sum to nearest in the
  container and then to nearest-even in p bits equals rounding the real sum once. float32
  (24 bits) covers p <= 11 (float16, bfloat16, tf32, fp8); float64 (53 bits) covers p <= 25.
  A float32 accumulator needs no second step: float32 addition is itself IEEE-rounded.
* **Round to odd** (Boldo and Melquiond 2008): for the other modes, or operands wider than the
  accumulator, the float64 sum is corrected by its exact error (TwoSum) to the neighbour
  whose last bit is odd. That value sits on the same side of every p-bit rounding boundary
  as the real sum whenever p + 2 <= 53, so round_to of it is the correctly rounded sum in
  every mode.
"""

from __future__ import annotations

import numpy as np
from tqdm.auto import tqdm

from ..exact import as_float64, two_sum
from ..formats import FloatFormat, get_format
from ..rounding import check_mode, round_to, seed_generator

__all__ = ["RoundedAdder", "progress", "round_float64", "round_to_odd", "rounded_add"]

# About this many simulated adds take a few seconds on two cores: beyond it, show a bar.
PROGRESS_WORK = 200_000_000

# Loading an input into the format is one rounding of each value: on rounding's NumPy tier
# (about 15 ns a value) that is cheaper than compiling its numba loop from a cold cache (a
# second or more) up to this many values, so `convert` and `round_float64` round with
# round_to(..., compiled=False) there. The same bits either way.
CONVERT_NUMPY_MAX = 1 << 23


def _round_once(a: np.ndarray, fmt: FloatFormat, mode: str, generator=None) -> np.ndarray:
    """round_to(a, fmt, mode) of a float64 array, once: on the NumPy tier up to
    CONVERT_NUMPY_MAX values, compiled beyond."""
    return np.asarray(round_to(a, fmt, mode, generator=generator,
                               compiled=a.size > CONVERT_NUMPY_MAX))


def progress(steps: range, work: int, desc: str):
    """`steps` itself, or wrapped in a tqdm bar when `work` (simulated adds) may take over ~2 s."""
    if work < PROGRESS_WORK:
        return steps
    return tqdm(steps, desc=desc, leave=False)


def round_to_odd(s: np.ndarray, e: np.ndarray) -> np.ndarray:
    """RO(s + e) in float64: s if e = 0 (or s is inf/NaN), else whichever of s and its neighbour toward e is odd."""
    odd = (s.view(np.int64) & 1) == 1
    with np.errstate(invalid="ignore"):  # e is NaN next to an infinite s
        toward = np.nextafter(s, np.where(e > 0, np.inf, -np.inf))
        keep = (e == 0) | odd | ~np.isfinite(s)
    return np.where(keep, s, toward)


def round_float64(x, fmt: str | FloatFormat, mode: str = "nearest_even") -> np.ndarray:
    """fl_fmt(x) once, as a float64 array of x's shape (overflow gives inf, silently)."""
    f = get_format(fmt)
    x = as_float64(x)
    if f.name == "float64":
        return x
    with np.errstate(over="ignore", invalid="ignore"):
        return np.asarray(_round_once(np.ascontiguousarray(x), f, mode),
                          dtype=np.float64).reshape(x.shape)


class RoundedAdder:
    """fl(a + b) into one format by one rounding mode, for arrays of that format's values.

    `convert(x)` rounds arbitrary inputs into the format (as a load into the accumulator
    register would) and returns them in the container dtype; `add(a, b)` then rounds each
    sum once. Operands of `add` must be values of the format (results of convert/add), since
    the fast nearest-even path relies on it. work: about how many values the adds will round
    in all (None: unknown, many); up to CONVERT_NUMPY_MAX they stay on rounding's NumPy tier,
    done sooner than a cold compile of its numba loop would be (the same bits).
    """

    def __init__(self, fmt: str | FloatFormat, mode: str = "nearest_even",
                 generator: np.random.Generator | None = None, work: int | None = None):
        self.fmt = get_format(fmt)
        self.compiled = work is None or work > CONVERT_NUMPY_MAX
        self.mode = check_mode(mode, stochastic=True)
        if mode == "stochastic" and not isinstance(generator, np.random.Generator):
            raise ValueError("stochastic rounding draws from a stream: pass "
                             f"generator=np.random.default_rng(seed); got generator={generator!r}")
        self.generator = generator
        p = self.fmt.precision
        fits_f32 = self.fmt.emax <= 127 and self.fmt.min_subnormal >= 2.0**-149
        if self.fmt.name == "float64":
            if mode != "nearest_even":
                raise ValueError(
                    f"a float64 accumulator supports mode='nearest_even' only (no wider container "
                    f"to emulate {mode!r}); got mode={mode!r}"
                )
            self.path = "native64"
            self.dtype = np.dtype(np.float64)
        elif mode == "nearest_even" and (2 * p + 2 <= 24 or self.fmt.name == "float32") and fits_f32:
            # float32 itself: the container's own IEEE addition is the one rounding.
            self.path = "double_round32"
            self.dtype = np.dtype(np.float32)
        elif mode == "nearest_even" and 2 * p + 2 <= 53:
            self.path = "double_round64"
            self.dtype = np.dtype(np.float64)
        else:
            self.path = "odd64"
            self.dtype = np.dtype(np.float64)

    def _round(self, v: np.ndarray) -> np.ndarray:
        return round_to(v, self.fmt, self.mode, generator=self.generator, compiled=self.compiled)

    def convert(self, x) -> np.ndarray:
        """fl(x) for every entry of x (any real inputs), as a C-contiguous container array."""
        a = np.ascontiguousarray(x, dtype=np.float64)
        r = a if self.fmt.name == "float64" else _round_once(a, self.fmt, self.mode,
                                                              self.generator)
        return np.ascontiguousarray(r, dtype=self.dtype)

    def add(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        """fl(a + b), elementwise, rounded once from the exact sum (a, b: values of the format)."""
        if self.path == "native64":
            return np.add(a, b)
        if self.path == "odd64":
            s, e = two_sum(a, b)
            return self._round(np.ascontiguousarray(round_to_odd(s, e)))
        s = np.ascontiguousarray(np.add(a, b, dtype=self.dtype))
        if s.ndim == 0:
            return np.asarray(self._round(s.reshape(1))).reshape(())
        if self.fmt.name == "float32":  # float32's own IEEE add was the one rounding: s is fl(a + b)
            return s
        return round_to(s, self.fmt, self.mode, generator=self.generator, out=s,
                        compiled=self.compiled)

    def add_any(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        """fl(a + b) for arbitrary float64 operands (e.g. exact products), via round to odd."""
        if self.path == "native64":
            return np.add(a, b)
        s, e = two_sum(np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64))
        return np.asarray(self._round(np.ascontiguousarray(round_to_odd(s, e))), dtype=self.dtype)

    def sub(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        """fl(a - b): negation is exact, so this is add(a, -b)."""
        return self.add(a, -b)


def rounded_add(a, b, fmt, mode: str = "nearest_even", *, seed: int | None = None):
    """fl(a + b) in fmt, rounded once from the exact real sum of the float64 values a and b.

    seed: for mode="stochastic", the seed of np.random.default_rng the rounding draws from.
    """
    fmt = get_format(fmt)
    check_mode(mode, stochastic=True)
    if mode == "stochastic" and seed is None:
        raise ValueError("stochastic rounding draws random bits: pass seed=<int>; got seed=None")
    gen = None if seed is None else seed_generator(seed)
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    if fmt.name == "float64":
        if mode != "nearest_even":
            raise ValueError(f"float64 sums support mode='nearest_even' only; got mode={mode!r}")
        return a + b
    a, b = np.broadcast_arrays(a, b)
    s, e = two_sum(a, b)
    out = _round_once(np.ascontiguousarray(round_to_odd(s, e)), fmt, mode, gen)  # one rounding each
    return np.asarray(out).reshape(a.shape)
