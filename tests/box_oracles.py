"""Oracles for the soundness tests of triage's operation rules over boxes: a rule's bound for
given input boxes, points drawn inside those boxes on a dtype's grid (the boxes' ends included),
and the containment check (NaN only where the bound is the whole line)."""

from __future__ import annotations

import types

import numpy as np
import torch

from precisionlab.intervals.torch_ops import arith as B
from precisionlab.intervals.torch_ops import rules as R


def rule_bound(name, func, args, kwargs, fmt, boxes=None):
    """The rule's bounds for a call; boxes: {id(tensor): (lo, hi)} for inputs known only within
    a box (float64 arrays), every other float input a point (its own value)."""
    boxes = boxes or {}
    rec = types.SimpleNamespace(name=name, func=func, args=args, kwargs=kwargs)

    def get(t):
        if id(t) in boxes:
            lo, hi = boxes[id(t)]
            return B.mk(np.asarray(lo, dtype=np.float64), np.asarray(hi, dtype=np.float64))
        v = t.detach().double().numpy()
        return B.mk(v, v)
    return R.bound(rec, get, fmt)


def inside(b, y) -> np.ndarray:
    """y in the bound; NaN only where the bound is the whole line (no information)."""
    y = np.asarray(y.detach().double().numpy() if isinstance(y, torch.Tensor) else y,
                   dtype=np.float64)
    free = (b.lo == -np.inf) & (b.hi == np.inf)
    with np.errstate(invalid="ignore"):
        return ((b.lo <= y) & (y <= b.hi)) | (free & np.isnan(y))


def box_around(x: torch.Tensor, rel: float, gen: torch.Generator):
    """A box around x on x's grid: [x - r, x + r] with r up to rel |x| per entry, the ends
    rounded into x's dtype and ordered. Returns (lo, hi) as tensors of x's dtype."""
    r = torch.rand(x.shape, generator=gen, dtype=torch.float64) * rel * x.double().abs()
    lo = (x.double() - r).to(x.dtype)
    hi = (x.double() + r).to(x.dtype)
    return torch.minimum(lo, hi), torch.maximum(lo, hi)


def points_inside(lo: torch.Tensor, hi: torch.Tensor, n: int, gen: torch.Generator) -> list:
    """n tensors of lo's dtype with every entry in [lo, hi]: the two ends, then random points
    (a random mix of the ends rounded into the dtype and clamped back into the box)."""
    out = [lo.clone(), hi.clone()]
    for _ in range(max(n - 2, 0)):
        t = torch.rand(lo.shape, generator=gen, dtype=torch.float64)
        with np.errstate(invalid="ignore"):
            p = (lo.double() + t * (hi.double() - lo.double())).to(lo.dtype)
        p = torch.where(torch.isfinite(p), p, lo)
        out.append(torch.minimum(torch.maximum(p, lo), hi))
    return out


def strided(x: torch.Tensor) -> torch.Tensor:
    """x in a strided buffer: torch's elementwise kernels take their scalar path on it."""
    out = torch.empty(2 * x.numel(), dtype=x.dtype)[::2]
    out.copy_(x.reshape(-1))
    return out.reshape(x.shape)
