"""The check at each paired operation of `triage`: the reference's values against the target's
bound, the worst element, its margin and the bound's width; and the bounds consumers read
(the hull of both programs' values at a paired output, the union over formats)."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import numpy as np
import torch

from .. import intervals as iv
from ..intervals import torch_ops as bd
from .floors import detection_floor

__all__ = ["OpCheck", "check", "check_any", "check_hull", "check_inside", "check_values", "empty",
           "hull", "union", "values"]


@dataclass(frozen=True)
class OpCheck:
    """One paired operation: the reference's value against the target's bound.

    Attributes
    ----------
    index : int
        The operation's position in the target's trace.
    op : str
        "module.path: name#occurrence" ("0: linear#0"; "add#0" outside any module).
    verdict : str
        "Type-I" or "Type-II".
    outside : int
        Reference entries outside the bound.
    numel : int
        Entries checked.
    element : tuple of int
        The worst entry: an index into the tensor `of` names, of shape `shape`.
    margin : float
        Distance from the reference to the nearer edge of the bound there (negative:
        outside).
    width : float
        The bound's width there.
    lo : float
        The bound's lower end there.
    hi : float
        Its upper end there.
    reference : float
        The reference's value there.
    target : float
        The target's value there.
    self_outside : int
        Target entries outside their own bound (0 when the kernel model holds).
    exact : bool
        Whether this is a shape operation, whose bound is the hull it started from.
    shape : tuple of int
        The shape of the tensor `element` indexes.
    of : str
        "" when element indexes the operation's own output; else the tensor the user's
        code holds that the value is at ("the output of module 'mha' (MultiheadAttention)"),
        or a note that it is internal.
    floor : float
        The detection floor, at a module's or the program's output: the smallest d such
        that that output scaled by 1 + d or 1 - d (a bug in the module) would have put a
        reference value outside the scaled bound (`floors` defines it); 0 for a Type-II
        check, inf where no entry can show a scaling. NaN elsewhere: a bug inside a module
        changes what its later operations are paired with, so it is checked only at the
        module's output, not where it happens.
    """

    index: int  # the operation's position in the target's trace
    op: str  # "module.path: name#occurrence"
    verdict: str
    outside: int  # reference entries outside the bound
    numel: int
    element: tuple  # the worst entry: an index into the tensor `of` names, of shape `shape`
    margin: float  # distance from the reference to the nearer edge (negative: outside)
    width: float  # the bound's width there
    lo: float
    hi: float
    reference: float
    target: float
    self_outside: int  # target entries outside their own bound (0 when the rules hold)
    exact: bool = False  # a shape operation: its bound is the hull it started from
    shape: tuple = ()  # the shape of the tensor `element` indexes
    # the tensor `element` indexes: "" for the operation's own output; else, where the user's
    # code never sees that output (inside a torch module), the tensor it holds that the value
    # is at, "the output of module 'mha' (MultiheadAttention)", or else that it is internal
    of: str = ""
    floor: float = math.nan  # the smallest relative scaling of the output the check would see

    @property
    def score(self) -> float:
        """margin / half the width: 1 at the centre, 0 on an edge, negative outside."""
        if self.width > 0:
            return self.margin / (self.width / 2)
        return math.inf if self.margin >= 0 else -math.inf

    @property
    def widths_outside(self) -> float:
        """How many bound widths the reference lies outside (0 inside)."""
        if self.margin >= 0:
            return 0.0
        return math.inf if self.width == 0 else -self.margin / self.width


def union(per: list) -> list:
    """Per output, the union of its bounds in each format (one format: its bounds)."""
    if len(per) == 1:
        return per[0]
    return [bd.mk(np.minimum.reduce([p[j].lo for p in per]),
                  np.maximum.reduce([p[j].hi for p in per])) for j in range(len(per[0]))]


def hull(a: np.ndarray, b: np.ndarray) -> iv.Interval:
    """[min(a, b), max(a, b)]; the whole line where either is NaN."""
    return bd.mk(np.minimum(a, b), np.maximum(a, b))


def values(ref: torch.Tensor, tgt: torch.Tensor) -> tuple[np.ndarray, np.ndarray]:
    """Two programs' values at an operation as NumPy arrays of one type: float64 when either is
    float64, else float32 (exact for float16 and bfloat16)."""
    dt = torch.float64 if torch.float64 in (ref.dtype, tgt.dtype) else torch.float32
    return bd.as_numpy(ref, dt), bd.as_numpy(tgt, dt)


def check_values(index, op, bound: iv.Interval, ref: torch.Tensor, tgt: torch.Tensor,
                 exact: bool, keep: bool, fmt: str | None = None
                 ) -> tuple[OpCheck, iv.Interval | None]:
    """`check` of the two programs' tensors, and (keep) their `hull`, in one compiled pass;
    fmt: the coarsest format bounded in, for the check's detection floor (None: not computed)."""
    r, t = values(ref, tgt)
    lo, hi = bound.lo, bound.hi
    if not (lo.size and lo.shape == hi.shape == r.shape == t.shape):
        r, t = r.astype(np.float64), t.astype(np.float64)
        return _floored(check(index, op, bound, r, t, exact), bound.lo, bound.hi, r, fmt), (
            hull(t, r) if keep else None)
    h_lo, h_hi = (np.empty(r.shape), np.empty(r.shape)) if keep else (_NONE, _NONE)
    flo, fhi, fr = bd.flat(lo), bd.flat(hi), _flat(r)
    flat, m, w = bd.inside_worst(flo, fhi, fr, _flat(t), keep, h_lo.reshape(-1),
                                 h_hi.reshape(-1))
    if flat >= 0:  # every value inside, none NaN: the hull needs no check
        floor = math.nan if fmt is None else detection_floor(flo, fhi, fr, fmt)
        return _inside(index, op, lo, hi, r, t, exact, flat, m, w, floor), (
            bd.bare(h_lo, h_hi) if keep else None)
    return _floored(check_any(index, op, lo, hi, r, t, exact), lo, hi, r, fmt), (
        bd.mk(h_lo, h_hi) if keep else None)


def _floored(c: OpCheck, lo, hi, ref, fmt: str | None) -> OpCheck:
    """c with its detection floor (0 for Type-II; NaN where fmt is None, or lo and hi do not
    broadcast to ref's shape)."""
    if fmt is None or not c.numel:
        return c
    if c.verdict == "Type-II":
        return dataclasses.replace(c, floor=0.0)
    try:
        lo, hi = (np.broadcast_to(z, np.shape(ref)) for z in (lo, hi))
    except ValueError:
        return c
    return dataclasses.replace(c, floor=detection_floor(lo, hi, ref, fmt))


_NONE = np.zeros(1)


def check_hull(index, op, ref: torch.Tensor, tgt: torch.Tensor, fmt: str | None = None
               ) -> tuple[OpCheck, iv.Interval]:
    """`check_values` where the bound is the hull of the two programs' values (an exact operation
    on paired inputs: the same gather of their hull), and that hull, in one compiled pass; fmt:
    as for `check_values`."""
    r, t = values(ref, tgt)
    h_lo, h_hi = np.empty(r.shape), np.empty(r.shape)
    if not h_lo.size:
        b = bd.bare(h_lo, h_hi)
        return check(index, op, b, r.astype(np.float64), t.astype(np.float64), True), b
    # the kernel writes the hull before it reads the bound
    fr = _flat(r)
    flat, m, w = bd.inside_worst(h_lo.reshape(-1), h_hi.reshape(-1), fr, _flat(t), True,
                                 h_lo.reshape(-1), h_hi.reshape(-1))
    if flat >= 0:
        floor = math.nan if fmt is None else detection_floor(h_lo, h_hi, fr, fmt)
        return _inside(index, op, h_lo, h_hi, r, t, True, flat, m, w, floor), bd.bare(h_lo,
                                                                                       h_hi)
    b = bd.mk(h_lo, h_hi)
    return _floored(check_any(index, op, b.lo, b.hi, r, t, True), b.lo, b.hi, r, fmt), b


def empty(index, op, shape, exact: bool = False) -> OpCheck:
    """The check of an operation whose output has no entries (a zero-size cache tensor): Type-I,
    numel 0, and no worst element (element (), margin inf, values NaN)."""
    nan = math.nan
    return OpCheck(index, op, "Type-I", 0, 0, (), math.inf, 0.0, nan, nan, nan, nan, 0, exact,
                   tuple(shape))


def _inside(index, op, lo, hi, ref, tgt, exact, flat, m, w, floor=math.nan) -> OpCheck:
    """The Type-I check from `bd.inside_worst`'s worst entry (flat index), margin and width."""
    el, rest = [], int(flat)  # np.unravel_index(flat, lo.shape), in C order
    for n in reversed(lo.shape):
        rest, i = divmod(rest, n)
        el.append(i)
    f = int(flat)  # ndarray.item(f): the entry at C-order position f, as a Python float
    return OpCheck(index, op, "Type-I", 0, int(lo.size), tuple(reversed(el)),
                   math.inf if math.isnan(m) else m, w, lo.item(f), hi.item(f), ref.item(f),
                   tgt.item(f), 0, exact, tuple(lo.shape), "", floor)


def check(index, op, bound: iv.Interval, ref: np.ndarray, tgt: np.ndarray,
          exact: bool = False) -> OpCheck:
    """The reference against the target's bound: outside count, worst element, margin, width."""
    lo, hi = bound.lo, bound.hi
    if not ref.size:
        return empty(index, op, ref.shape, exact)
    if lo.size and lo.shape == hi.shape == ref.shape == tgt.shape:
        flat, m, w = bd.inside_worst(bd.flat(lo), bd.flat(hi), _flat(ref), _flat(tgt),
                                     False, _NONE, _NONE)
        if flat >= 0:  # `check_inside`'s values, in one compiled pass
            return _inside(index, op, lo, hi, ref, tgt, exact, flat, m, w)
        return check_any(index, op, lo, hi, ref, tgt, exact)
    with np.errstate(invalid="ignore"):
        if ((np.minimum(ref, tgt) >= lo) & (np.maximum(ref, tgt) <= hi)).all():  # NaN: False
            return check_inside(index, op, lo, hi, ref, tgt, exact)
    return check_any(index, op, lo, hi, ref, tgt, exact)


def _flat(a: np.ndarray) -> np.ndarray:
    """a as a C-contiguous 1-D array of its own type (float32 or float64)."""
    if a.dtype == np.float32:
        return np.ascontiguousarray(a).reshape(-1)
    return bd.flat(a)


def check_any(index, op, lo, hi, ref, tgt, exact) -> OpCheck:
    """`check` for any values: NaN and values outside included."""
    if not np.size(ref):
        return empty(index, op, np.shape(ref), exact)
    # NaN is inside a bound only where the bound carries no information (a rule's way of saying
    # "may be NaN": 0 * inf, sqrt of a negative, a fully masked softmax row), or where both
    # programs give NaN
    free = (lo == -np.inf) & (hi == np.inf)
    both_nan = np.isnan(ref) & np.isnan(tgt)
    with np.errstate(invalid="ignore"):
        inside = ((lo <= ref) & (ref <= hi)) | both_nan | (free & np.isnan(ref))
        self_in = ((lo <= tgt) & (tgt <= hi)) | both_nan | (free & np.isnan(tgt))
        margin = np.minimum(ref - lo, hi - ref)
        width = hi - lo
    margin = np.where(np.isnan(margin), np.where(inside, np.inf, -np.inf), margin)
    with np.errstate(invalid="ignore", divide="ignore"):
        score = np.where(width > 0, margin / (width / 2), np.where(inside, np.inf, -np.inf))
    score = np.where(inside, np.maximum(score, 0.0), np.minimum(score, -1e-300))
    score = np.where(np.isnan(score), np.inf, score)
    flat = int(np.argmin(score)) if score.size else 0
    el = np.unravel_index(flat, score.shape) if score.shape else ()
    out = int((~inside).sum())
    return OpCheck(index, op, "Type-II" if out else "Type-I", out, int(score.size),
                   tuple(int(i) for i in el), float(margin[el]), float(width[el]), float(lo[el]),
                   float(hi[el]), float(ref[el]), float(tgt[el]), int((~self_in).sum()), exact,
                   tuple(score.shape))


def check_inside(index, op, lo, hi, ref, tgt, exact) -> OpCheck:
    """`check` where every reference and target value lies in [lo, hi] (none is NaN): the same
    worst element, margin and width, with fewer passes over the arrays."""
    if not np.size(ref):
        return empty(index, op, np.shape(ref), exact)
    with np.errstate(invalid="ignore", divide="ignore"):
        margin = np.minimum(ref - lo, hi - ref)  # NaN only for an infinite value at its end
        width = hi - lo
        score = np.fmin(margin / (width / 2), np.inf)  # NaN (0/0, inf/inf) counts as inf
    flat = int(np.argmin(score)) if score.size else 0
    el = np.unravel_index(flat, score.shape) if score.shape else ()
    m = float(margin[el])
    return OpCheck(index, op, "Type-I", 0, int(score.size), tuple(int(i) for i in el),
                   math.inf if math.isnan(m) else m, float(width[el]), float(lo[el]),
                   float(hi[el]), float(ref[el]), float(tgt[el]), 0, exact, tuple(score.shape))
