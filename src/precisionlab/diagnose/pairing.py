"""How triage pairs the target's operations with the reference's, and the bounds that pairing
decides: formats to bound in, leaves, calls that compute the same expression, choices (masks,
indices) computed from float values."""

from __future__ import annotations

import functools

import numpy as np
import torch

from .. import intervals as iv
from ..formats import contains, get_format
from ..intervals import torch_ops as bd
from ..intervals.torch_ops import Leaf

_IGNORED = (torch.dtype, torch.device, torch.layout, torch.memory_format)
_BITS = {2: torch.int16, 4: torch.int32, 8: torch.int64}


def coarser(a: str, b: str) -> list:
    """The formats to bound an operation in so that both programs' results are covered: the
    coarser alone when one format's values contain the other's (every rule widens and rounds
    outward, so its bound in the coarser format contains its bound in the finer), else both."""
    if a != b and contains(a, b):
        return [b]
    if a != b and contains(b, a):
        return [a]
    return [a, b]


def coarsest(fmts: set) -> list:
    """The coarsest formats of a set (both float16 and bfloat16 when both are there)."""
    return sorted(f for f in fmts if not any(g != f and contains(f, g) for g in fmts))


def _join(a: iv.Interval, b: iv.Interval) -> iv.Interval:
    return bd.mk(np.minimum(a.lo, b.lo), np.maximum(a.hi, b.hi))


def leaf_wide(t: torch.Tensor, ref_fmts: set) -> iv.Interval:
    """A target leaf (weight, input, constant) with no paired reference leaf: the reals that round
    to it, and, where the reference holds coarser copies (a float32 target beside a bfloat16
    reference), the reals within an ulp of its rounding into each such format."""
    box = bd.leaf(t)
    if not t.is_floating_point():
        return box
    own = bd.fmt_of(t.dtype)
    for f in ref_fmts:
        if f != own and not contains(f, own) and f != "float64":
            c = bd.round_into(box, f)
            c = bd.widen_rel(c, 1.0, f)  # double rounding through a third format
            box = _join(box, c)
    return box


@functools.cache  # a constant of the format
def _unit(fmt: str) -> tuple[float, float]:
    f = get_format(fmt)
    return f.unit_roundoff, f.min_subnormal


def leaf_of(t: torch.Tensor, other: torch.Tensor | None, ref_fmts: set) -> Leaf:
    """A target leaf as a `Leaf`: its box joined with the paired reference leaf `other`
    (`_join` of both `leaf`s), or, unpaired, `leaf_wide`; with |x - t| <= rho |t| + tau over
    that box. Own box: u_f |t| + q_f / 2. Paired, the finer value rounds to the coarser in
    format c, so |t - v| <= u_c |finer| + q_c / 2, and v's box adds u_r |v| + q_r / 2: within
    1.05 (u_c + u_r) |t| + q_c + q_r (equal formats: equal values). Widened to a coarser c:
    rounding the box outward into c and one more ulp of c add 4 u_c |t| + 3 q_c, for each coarser
    format in turn (the factors 1.05 and 2 cover the products of unit roundoffs, each <= 2^-8)."""
    own = bd.fmt_of(t.dtype)
    u_f, q_f = _unit(own)
    fmts = {own}
    if other is not None and other is not t:
        r = bd.fmt_of(other.dtype)
        fmts.add(r)
        c = r if contains(own, r) else own  # the coarser (own where neither contains the other)
        (u_c, q_c), (u_r, q_r) = _unit(c), _unit(r)
        rho, tau = (u_f, q_f / 2) if r == own else (1.05 * (u_c + u_r), q_f + q_c + q_r)

        def make(index):
            a, b = (t, other) if index is None else (t[index], other[index])
            return bd.leaf(a, b)
    else:
        wide = [f for f in ref_fmts if f != own and not contains(f, own) and f != "float64"]
        fmts.update(wide)
        rho, tau = u_f, q_f / 2
        for c in wide:  # each format widens the box already widened by the ones before
            u_c, q_c = _unit(c)
            rho, tau = rho + 4 * u_c, tau + 3 * q_c
        rho, tau = 1.05 * rho, 2 * tau

        def make(index):
            return leaf_wide(t if index is None else t[index], ref_fmts)
    return Leaf(t, rho, tau, frozenset(fmts), make)


def _literal(x) -> str:
    if isinstance(x, torch.Tensor):
        return f"its {str(x.dtype).removeprefix('torch.')} tensor of shape {tuple(x.shape)}"
    r = repr(x)
    return r if len(r) <= 24 else r[:21] + "..."


def _items(obj, out: list) -> list:
    """The arguments flattened: tensors and values, with list/dict structure markers."""
    if isinstance(obj, (list, tuple)):
        out.append(("seq", len(obj)))
        for o in obj:
            _items(o, out)
    elif isinstance(obj, dict):
        for k in sorted(obj):
            out.append(("kw", k))
            _items(obj[k], out)
    else:
        out.append(obj)
    return out


def _call_items(rec) -> list:
    """`_items` of a call's positional arguments (as a list), then of its keyword arguments."""
    out = [("seq", len(rec.args))]
    for o in rec.args:
        if isinstance(o, (list, tuple, dict)):
            _items(o, out)
        else:
            out.append(o)
    return _items(dict(rec.kwargs), out) if rec.kwargs else out


def _plain(args: tuple) -> bool:
    """Whether no argument is a list, tuple or dict (`_call_items` then adds no markers)."""
    for o in args:
        if isinstance(o, (list, tuple, dict)):
            return False
    return True


def leaves_agree(x: torch.Tensor, y: torch.Tensor) -> bool:
    """Whether two leaf tensors hold the same values up to one rounding into the coarser format
    (equal bit patterns there, or equal values with NaN in the same places)."""
    if x is y:
        return True
    if x.shape != y.shape:
        return False
    fx, fy = bd.fmt_of(x.dtype), bd.fmt_of(y.dtype)
    if not (contains(fx, fy) or contains(fy, fx)):
        return False  # float16 beside bfloat16: neither rounds into the other
    c = fy if contains(fx, fy) else fx
    dt = x.dtype if c == fx else y.dtype
    a, b = x.detach().to(dt).cpu(), y.detach().to(dt).cpu()
    bits = _BITS[a.element_size()]  # equal bit patterns: equal values, or NaN in both
    if a.view(bits).numpy().tobytes() == b.view(bits).numpy().tobytes():
        return True
    return bool(torch.equal(a, b) or (torch.equal(torch.nan_to_num(a), torch.nan_to_num(b))
                and torch.equal(a.isnan(), b.isnan())))


def same_call(rec, p, corr: dict):
    """(same, why, leaf pairs): whether the target's call rec computes the expression of the
    reference's call p; why names the first differing argument when the float inputs agree."""
    if not (rec.kwargs or p.kwargs) and _plain(rec.args) and _plain(p.args):
        a, b = rec.args, p.args  # `_call_items` less the ("seq", n) they would both begin with
    else:
        a, b = _call_items(rec), _call_items(p)
    if len(a) != len(b):
        return False, "", {}
    pairs, why = {}, ""
    for x, y in zip(a, b, strict=True):
        tx, ty = isinstance(x, torch.Tensor), isinstance(y, torch.Tensor)
        if tx != ty:
            return False, "", {}
        if tx:
            if x.shape != y.shape or x.is_floating_point() != y.is_floating_point():
                return False, "", {}
            if x.is_floating_point():
                sx, sy = rec.src.get(id(x)), p.src.get(id(y))
                if sx is None and sy is None:
                    if not leaves_agree(x, y):
                        why = why or f"{_literal(x)} differs"
                        continue
                    pairs[(rec.index, id(x))] = y
                elif sx is None or sy is None or corr.get(sx) != sy:
                    return False, "", {}
            elif x.dtype != y.dtype or not torch.equal(x.cpu(), y.cpu()):
                why = why or f"its {str(x.dtype).removeprefix('torch.')} argument of shape {tuple(x.shape)} differs"
        elif isinstance(x, _IGNORED) and isinstance(y, _IGNORED):
            continue
        else:
            try:
                same = (type(x) is type(y) and bool(x == y)) or (
                    isinstance(x, (int, float)) and isinstance(y, (int, float)) and x == y)
            except Exception:  # objects without a plain ==
                same = x is y
            if not same:
                why = why or f"{_literal(x)} vs {_literal(y)}"
    return (not why), why, (pairs if not why else {})


def same_choice(rec, p) -> bool:
    """Whether the reference's call p (rec's key) takes the very masks and indices rec takes: the
    same name and, in order, equal integer and bool tensors. A choice computed from float values
    (T5's relative-position buckets, from a log) is then known to be the reference's too, and rec
    is bounded by its rule rather than by `unknown_choice`, though a leaf (a scaled table) or a
    float input differs."""
    if p is None or p.name != rec.name:
        return False
    a = [t for t in rec.ins if not t.is_floating_point()]
    b = [t for t in p.ins if not t.is_floating_point()]
    return len(a) == len(b) and all(
        x.dtype == y.dtype and x.shape == y.shape and torch.equal(x.cpu(), y.cpu())
        for x, y in zip(a, b, strict=True))


def unknown_choice(rec, get, fmt: str) -> list:
    """Bounds of an operation whose mask or indices come from float values (x > 0, argmax):
    the reference may choose differently. where / masked_fill: either branch; others: unknown."""
    outs = list(rec.outs)
    name = rec.name
    if name == "where" and len(rec.args) >= 3 and not rec.args[0].is_floating_point():
        x, y = rec.args[1], rec.args[2]
    elif name in ("masked_fill", "masked_fill_"):
        x, y = rec.args[0], bd.arg(rec.args, rec.kwargs, 2, "value")
    elif name == "embedding":  # any row of the table
        w = get(bd.arg(rec.args, rec.kwargs, 1, "weight"))
        shape = tuple(outs[0].shape)
        return [bd.mk(np.broadcast_to(w.lo.min(0), shape), np.broadcast_to(w.hi.max(0), shape))]
    else:
        return [bd.mk(np.full(o.shape, -np.inf), np.full(o.shape, np.inf)) for o in outs]
    A = get(x) if isinstance(x, torch.Tensor) else bd.scalar(x, fmt)
    B = get(y) if isinstance(y, torch.Tensor) else bd.scalar(y, fmt)
    shape = tuple(outs[0].shape)
    lo = np.broadcast_to(np.minimum(np.broadcast_to(A.lo, shape), np.broadcast_to(B.lo, shape)), shape)
    hi = np.broadcast_to(np.maximum(np.broadcast_to(A.hi, shape), np.broadcast_to(B.hi, shape)), shape)
    return [bd.round_into(bd.mk(lo, hi), fmt)]
