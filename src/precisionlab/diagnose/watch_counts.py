"""The counts `watch` takes of one tensor: its largest magnitude and, per format, the entries a
cast (round to nearest, ties to even) would flush to zero, leave subnormal or overflow.

A value x rounds to zero in a format iff |x| <= q/2 (q the smallest subnormal), to a subnormal
iff q/2 < |x| < n - q/2 (n the smallest normal), and past the largest finite value M iff
|x| > M + ulp(M)/2, or |x| = M + ulp(M)/2 where M's last significand bit is odd (float16,
bfloat16, float8_e5m2: the tie rounds up, to inf; float8_e4m3fn: to 448). Every threshold is a
bound "|x| <= b" with b in the comparison dtype (float32 for float32 and narrower tensors, which
holds them exactly, float64 for float64), so one `torch.bucketize` and one `torch.bincount`
count all formats at once: two vectorised passes, whatever the number of formats.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from ..formats import FORMATS, get_format

__all__ = [
    "WATCH_FORMATS",
    "CastBounds",
    "cast_bounds",
    "check_formats",
    "magnitude_range",
    "tensor_counts",
]

# the formats a watch can count casts into: signed formats with a zero (float8_e8m0fnu has
# neither) and narrower than the float32 data they are compared in
WATCH_FORMATS: tuple[str, ...] = tuple(n for n, f in FORMATS.items()
                                       if f.signed and n != "float64")


def check_formats(formats) -> tuple[str, ...]:
    """The registry names of formats, else ValueError naming `formats`, the bad value and the
    valid choices."""
    if isinstance(formats, str):
        formats = (formats,)
    try:
        names = tuple(formats)
    except TypeError:
        raise ValueError(f"formats must be a sequence of format names; got formats={formats!r}; "
                         f"valid choices: {', '.join(WATCH_FORMATS)}") from None
    if not names:
        raise ValueError(f"formats must name at least one format; got formats=(); valid "
                         f"choices: {', '.join(WATCH_FORMATS)}")
    out = []
    for f in names:
        try:
            name = get_format(f).name
        except ValueError:
            name = None
        if name not in WATCH_FORMATS:
            raise ValueError(f"formats: unknown format {f!r}; valid choices: "
                             f"{', '.join(WATCH_FORMATS)} (or their aliases: fp16, bf16, e4m3, "
                             "e5m2, ...)")
        if name not in out:
            out.append(name)
    return tuple(out)


def _below(x: float, dtype, strict: bool) -> float:
    """The largest value of dtype (numpy float32 or float64) <= x (< x when strict)."""
    with np.errstate(over="ignore"):
        v = dtype(x)
    while float(v) > x or (strict and float(v) >= x):
        v = np.nextafter(v, dtype(-np.inf))
    return float(v)


@dataclass(frozen=True)
class CastBounds:
    """The thresholds of a set of formats as sorted bounds "|x| <= b" in float32 and float64.

    Attributes
    ----------
    formats : tuple of str
        The registry names, in the order the counts come.
    exact : tuple of tuple of float
        Per format (q/2, n - q/2, M + ulp(M)/2, ties_overflow): the real thresholds.
    """

    formats: tuple[str, ...]
    exact: tuple[tuple[float, float, float, bool], ...]

    def bounds(self, dtype) -> tuple[list[float], list[tuple[int, int, int]]]:
        """Sorted distinct bounds b (|x| <= b) in numpy dtype, the first 0; per format the
        positions of its flush, subnormal and finite bounds among them."""
        per = []
        for z, s, o, up in self.exact:
            per.append((_below(z, dtype, False), _below(s, dtype, True), _below(o, dtype, up)))
        values = sorted({0.0, *(b for p in per for b in p)})
        pos = {b: i for i, b in enumerate(values)}
        return values, [tuple(pos[b] for b in p) for p in per]


def cast_bounds(formats: Sequence[str]) -> CastBounds:
    """The CastBounds of the named formats (from `formats.get_format`'s constants).

    Parameters
    ----------
    formats : sequence of str
        Format names `check_formats` accepts.

    Returns
    -------
    CastBounds
        Per format (q/2, n - q/2, M + ulp(M)/2, whether the tie at M + ulp(M)/2 overflows).

    Raises
    ------
    ValueError
        If a name is not one of `WATCH_FORMATS` (or an alias of one).

    Examples
    --------
    >>> from precisionlab.diagnose.watch_counts import cast_bounds
    >>> b = cast_bounds(["float16", "float8_e4m3fn"])
    >>> b.exact[0] == (2.0**-25, 2.0**-14 - 2.0**-25, 65520.0, True)
    True
    >>> b.exact[1][2:]  # 448 + 32/2; the tie rounds to even, 448
    (464.0, False)
    """
    names = check_formats(formats)
    exact = []
    for n in names:
        f = get_format(n)
        q, top = f.min_subnormal, 2.0 ** (f.emax - f.mantissa_bits)
        odd = int(f.max_finite / top) % 2 == 1
        exact.append((q / 2, f.min_normal - q / 2, f.max_finite + top / 2, odd))
    return CastBounds(names, tuple(exact))


def magnitude_range(t: torch.Tensor) -> tuple[float, float]:
    """(min, max) of a tensor in one pass (NaN when it holds a NaN), as Python floats.

    Parameters
    ----------
    t : torch.Tensor
        A floating-point tensor (any shape; an empty one gives (0.0, 0.0)).

    Returns
    -------
    tuple of float
        The smallest and the largest entry; max(-min, max) is the amax.

    Examples
    --------
    >>> import torch
    >>> from precisionlab.diagnose.watch_counts import magnitude_range
    >>> magnitude_range(torch.tensor([1.0, -3.0, 2.0]))
    (-3.0, 2.0)
    """
    if t.numel() == 0:
        return 0.0, 0.0
    lo, hi = torch.aminmax(t.detach().reshape(-1))
    lo, hi = torch.stack([lo, hi]).double().tolist()
    return lo, hi


def tensor_counts(t: torch.Tensor, bounds: CastBounds, amax: float | None = None
                  ) -> tuple[float, np.ndarray]:
    """(amax, counts) of t: counts = [entries, non-finite, zeros, then per format flushed,
    subnormal, overflow] (inf counts as overflow, NaN does not), from two vectorised passes.

    Parameters
    ----------
    t : torch.Tensor
        A floating-point tensor on any device (a DTensor's local shard, not the DTensor).
    bounds : CastBounds
        The formats' thresholds (`cast_bounds`).
    amax : float or None, default None
        max |t| when already known (NaN or inf included), else computed here.

    Returns
    -------
    amax : float
        The largest |x| (inf when t holds inf, NaN when it holds NaN).
    counts : numpy.ndarray of int64
        3 + 3 * len(bounds.formats) counts.

    Examples
    --------
    >>> import torch
    >>> from precisionlab.diagnose.watch_counts import cast_bounds, tensor_counts
    >>> x = torch.tensor([0.0, 1e-8, 1e-6, 1.0, 7e4])
    >>> amax, c = tensor_counts(x, cast_bounds(["float16"]))
    >>> amax, c.tolist()  # 1e-8 flushes, 1e-6 is subnormal, 7e4 overflows
    (70000.0, [5, 0, 1, 1, 1, 1])
    """
    x = t.detach().reshape(-1)
    n = x.numel()
    nf = len(bounds.formats)
    counts = np.zeros(3 + 3 * nf, dtype=np.int64)
    counts[0] = n
    if n == 0:
        return 0.0, counts
    if amax is None:
        lo, hi = magnitude_range(x)
        amax = max(-lo, hi) if not (math.isnan(lo) or math.isnan(hi)) else math.nan
    wide = x.dtype == torch.float64
    a = x.abs() if wide else x.abs().to(torch.float32)
    values, pos = bounds.bounds(np.float64 if wide else np.float32)
    nan = 0
    if math.isnan(amax):
        isnan = torch.isnan(a)
        nan = int(isnan.sum())
        a = a.masked_fill(isnan, 0.0)  # counted apart; zeros corrected below
    inf = 0
    if math.isinf(amax):
        inf = int(torch.isinf(a).sum())
    b = torch.tensor(values, dtype=a.dtype, device=a.device)
    h = torch.bincount(torch.bucketize(a, b), minlength=len(values) + 1)
    c = h.cumsum(0).tolist()  # c[k] = #(|x| <= values[k]), the NaN (set to 0) included
    counts[1] = nan + inf
    counts[2] = c[0] - nan
    for k, (iz, isub, ifin) in enumerate(pos):
        counts[3 + 3 * k] = c[iz] - c[0]
        counts[4 + 3 * k] = c[isub] - c[iz]
        counts[5 + 3 * k] = n - c[ifin]
    return float(amax), counts
