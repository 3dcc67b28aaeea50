"""Round-off or bug? Trace two callables' torch operations as they run, bound the target's
round-off operation by operation with `precisionlab.intervals`, and say Type-I or Type-II with
the operation to blame (the method of chapter 7, RENDER's, on a real model).

Tracing: a `torch.overrides.TorchFunctionMode` records every torch-level call (F.linear,
F.layer_norm, F.scaled_dot_product_attention, Tensor.__add__, ...) eagerly, as the program
runs, whatever its Python control flow; `torch.fx` would fail on data-dependent forwards,
and ATen-level dispatch would split attention and normalisation into pieces with looser
bounds. Forward hooks name the module each call runs in.

Analysis (RENDER's layer-by-layer reduction, at the granularity of operations): the target's
operations are paired with the reference's by (module, operation, occurrence) and equal output
shapes, and by module outputs and final outputs. Each target operation is bounded from its
inputs' bounds, where an input that is a paired output restarts from the union (hull) of the
target's and the reference's values; each leaf (parameter, input, constant) is the set of
reals that round to it, so weights and inputs cast to a narrower format count as round-off.
The bound is the union over the target's and the reference's output formats, so both
programs' values lie in it when the target is correct. Type-II: some paired reference value
lies outside. Operations with no pair are propagated, not checked, and are named as suspects
when the next check fails. See `rules` for the kernel model.
"""

from __future__ import annotations

import math
import textwrap
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import torch
from torch.overrides import TorchFunctionMode

from .. import intervals as iv
from ..tables import Table
from . import rules as R
from .report import Report, as_inputs, new_axes, rows_fit, short

__all__ = ["OpCheck", "TriageReport", "UnsupportedOperation", "trace", "triage"]

UnsupportedOperation = R.UnsupportedOperation
_MATMULS = ("linear", "matmul", "mm", "bmm")
_CREATE = frozenset({"zeros", "ones", "full", "arange", "tensor", "as_tensor", "zeros_like",
                     "ones_like", "full_like", "new_zeros", "new_ones", "new_full", "new_tensor",
                     "empty", "empty_like", "new_empty", "eye", "linspace", "scalar_tensor"})
_RANDOM = frozenset({"rand", "randn", "randint", "rand_like", "randn_like", "bernoulli",
                     "normal", "multinomial", "uniform_", "normal_", "dropout_", "randperm"})


def _name(func) -> str:
    n = getattr(func, "__name__", None) or str(func)
    if n == "__get__":  # a property such as Tensor.T
        n = getattr(getattr(func, "__self__", None), "__name__", n)
    return n


def _tensors(obj) -> list:
    if isinstance(obj, torch.Tensor):
        return [obj]
    if isinstance(obj, (list, tuple)):
        return [t for o in obj for t in _tensors(o)]
    return []


@dataclass
class _Rec:
    index: int
    name: str
    func: object
    args: tuple
    kwargs: dict
    path: str
    key: tuple
    outs: list  # snapshots (detached clones) of the float outputs
    src: dict  # id(input tensor) -> (record index, output position) or None (a leaf)
    ids: list  # id() of each output object
    flat_key: tuple  # ("", name, occurrence in the whole run): pairing without module paths


class _Trace:
    """Every float-valued torch call of one run, with module paths and module outputs."""

    def __init__(self):
        self.records: list[_Rec] = []
        self.producer: dict = {}
        self.keep: list = []
        self.counts: dict = {}
        self.stack: list[str] = []
        self.module_out: dict = {}  # path -> (record index, position)
        self.outputs: list = []

    def add(self, func, name, args, kwargs, outs):
        path = self.stack[-1] if self.stack else ""
        k = (path, name)
        self.counts[k] = self.counts.get(k, -1) + 1
        self.counts[name] = self.counts.get(name, -1) + 1
        src = {id(t): self.producer.get(id(t)) for t in _tensors(args) + _tensors(list(kwargs.values()))}
        i = len(self.records)
        rec = _Rec(i, name, func, args, kwargs, path, (path, name, self.counts[k]),
                   [o.detach().clone() for o in outs], src, [id(o) for o in outs],
                   ("", name, self.counts[name]))
        self.records.append(rec)
        for j, o in enumerate(outs):
            self.producer[id(o)] = (i, j)
            self.keep.append(o)


class _Recorder(TorchFunctionMode):
    def __init__(self, tr: _Trace):
        super().__init__()
        self.tr = tr

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        name = _name(func)
        inplace = name == "__setitem__" or (name.endswith("_") and not name.endswith("__")) \
            or (name.startswith("__i") and name.endswith("__") and name not in ("__index__",
                                                                                 "__int__"))
        cands = args[:1] if inplace else _tensors(out)
        outs = [t for t in cands if isinstance(t, torch.Tensor) and t.is_floating_point()]
        if outs:
            if name in _RANDOM:
                raise UnsupportedOperation(f"triage cannot bound {name} (random numbers inside "
                                           "the program); draw them outside and pass them in")
            self.tr.add(func, name, args, kwargs, outs)
        return out


def trace(fn, inputs) -> _Trace:
    """Run fn(*inputs) once under no_grad, recording its float-valued torch calls."""
    ins = as_inputs(inputs, "inputs")
    tr = _Trace()
    hooks = []
    if isinstance(fn, torch.nn.Module):
        for path, mod in fn.named_modules():
            def pre(_m, _i, p=path):
                tr.stack.append(p)

            def post(_m, _i, out, p=path):
                tr.stack.pop()
                ts = [t for t in _tensors(out) if t.is_floating_point()]
                if ts and id(ts[0]) in tr.producer:
                    tr.module_out[p] = tr.producer[id(ts[0])]
            hooks.append(mod.register_forward_pre_hook(pre))
            hooks.append(mod.register_forward_hook(post))
    try:
        with torch.no_grad(), _Recorder(tr):
            out = fn(*ins)
    finally:
        for h in hooks:
            h.remove()
    outs = _tensors(out)
    if not outs:
        raise ValueError(f"the program must return a tensor or a tuple of tensors; got "
                         f"{type(out).__name__}")
    tr.outputs = [o.detach().clone() for o in outs]
    tr.final = [tr.producer.get(id(o)) for o in outs]
    return tr


@dataclass(frozen=True)
class OpCheck:
    """One paired operation: the reference's value against the target's bound."""

    index: int  # the operation's position in the target's trace
    op: str  # "module.path: name#occurrence"
    verdict: str
    outside: int  # reference entries outside the bound
    numel: int
    element: tuple  # the worst entry
    margin: float  # distance from the reference to the nearer edge (negative: outside)
    width: float  # the bound's width there
    lo: float
    hi: float
    reference: float
    target: float
    self_outside: int  # target entries outside their own bound (0 when the rules hold)
    exact: bool = False  # a shape operation: its bound is the hull it started from

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


@dataclass(frozen=True)
class TriageReport(Report):
    """triage()'s result: the verdict, every check in trace order, the operation to blame."""

    verdict: str
    checks: tuple
    suspects: tuple  # unpaired target operations just before the first Type-II check
    operations: int  # target operations traced
    paired: int
    kernels: tuple  # (operation, kernel description) declared
    title: str = "round-off or bug"

    @property
    def blamed(self) -> OpCheck | None:
        """The first Type-II check, or None."""
        return next((c for c in self.checks if c.verdict == "Type-II"), None)

    @property
    def deciding(self) -> OpCheck | None:
        """The blamed check, else the check whose reference lies closest to an edge."""
        if self.blamed is not None:
            return self.blamed
        scored = [c for c in self.checks if c.width > 0 and not c.exact]
        return min(scored, key=lambda c: c.score, default=None)

    @property
    def unsound(self) -> tuple:
        """Checks where the target's own value left its bound (the kernel model was violated)."""
        return tuple(c for c in self.checks if c.self_outside)

    def summary(self) -> str:
        """The verdict, where, and by how much."""
        lines = [f"{self.verdict}: {self.operations} target operations traced, {self.paired} "
                 f"checked against the reference"]
        b = self.blamed
        if b is not None:
            lines.append(f"blamed: #{b.index} {b.op} ({b.outside} of {b.numel} reference "
                         "values outside)")
            lines.append(f"  worst at {b.element}: reference {b.reference:.6g} outside "
                         f"[{b.lo:.6g}, {b.hi:.6g}]")
            lines.append(f"  by {b.widths_outside:.3g} bound widths")
            if self.suspects:
                lines += textwrap.wrap("unchecked operations before it: " +
                                       ", ".join(self.suspects), 80, subsequent_indent="  ")
        elif self.deciding is not None:
            d = self.deciding
            lines.append(f"closest to an edge: #{d.index} {d.op}, margin {d.margin:.3g} of "
                         f"width {d.width:.3g}")
        if self.unsound:
            lines.append(f"warning: {len(self.unsound)} operations exceeded the assumed kernel "
                         "model (declare their Kernel); the verdict is not rigorous")
        return "\n".join(lines)

    def table(self, limit: int = 16) -> Table:
        """One row per check (Type-II first, then the tightest): op, verdict, outside, margin/width."""
        bad = [c for c in self.checks if c.verdict == "Type-II"]
        good = sorted((c for c in self.checks if c.verdict != "Type-II"),
                      key=lambda c: (c.exact, c.score))
        rows = [[f"#{c.index}", short(c.op, 34), c.verdict, f"{c.outside}/{c.numel}",
                 f"{c.margin:.2e}", f"{c.width:.2e}"] for c in bad + good]
        return Table(["op", "where", "verdict", "outside", "margin", "width"],
                     rows_fit(rows, limit))

    def plot(self, ax=None):
        """Per checked operation: the reference's margin in half-widths of the bound (below 0: outside)."""
        ax = new_axes(ax)
        x = np.array([c.index for c in self.checks])
        s = np.array([c.margin / (c.width / 2) if c.width > 0 else (1.0 if c.margin >= 0 else -1e9)
                      for c in self.checks])
        bad = s < 0
        ax.axhline(0, color="#000000", lw=0.8)
        ax.scatter(x[~bad], s[~bad], s=12, color="#0072B2", label="inside the bound (Type-I)")
        if bad.any():
            ax.scatter(x[bad], s[bad], s=24, marker="x", color="#D55E00",
                       label="outside (Type-II)")
        ax.set_yscale("symlog", linthresh=1.0)
        ax.set_xlabel("operation in the target's trace")
        ax.set_ylabel("margin / half-width")
        ax.legend(fontsize=7, loc="lower left")
        return ax


def _hull(a: np.ndarray, b: np.ndarray) -> iv.Interval:
    with np.errstate(invalid="ignore"):
        lo, hi = np.minimum(a, b), np.maximum(a, b)
    bad = np.isnan(lo) | np.isnan(hi)
    return iv.Interval(np.where(bad, -np.inf, lo), np.where(bad, np.inf, hi), None, "oblivious")


def _check(index, op, bound: iv.Interval, ref: np.ndarray, tgt: np.ndarray,
           exact: bool = False) -> OpCheck:
    lo, hi = bound.lo, bound.hi
    both_nan = np.isnan(ref) & np.isnan(tgt)
    with np.errstate(invalid="ignore"):
        inside = ((lo <= ref) & (ref <= hi)) | both_nan
        self_in = ((lo <= tgt) & (tgt <= hi)) | both_nan
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
                   float(hi[el]), float(ref[el]), float(tgt[el]), int((~self_in).sum()), exact)


_RANK = {"float64": 3, "float32": 2, "bfloat16": 1, "float16": 1}


def _coarser(a: str, b: str) -> list:
    """The formats to bound an operation in so that both programs' results are covered: the
    coarser alone when one format's values contain the other's (every rule widens and rounds
    outward, so its bound in the coarser format contains its bound in the finer), else both."""
    if _RANK[a] == _RANK[b]:
        return [a, b]
    return [a if _RANK[a] < _RANK[b] else b]


def _declared(kernels: Mapping | None, rec) -> iv.Kernel | None:
    if not kernels:
        return None
    key = f"{rec.path}:{rec.name}#{rec.key[2]}"
    for k in (key, rec.path, rec.name):
        if k in kernels:
            return kernels[k]
    return None


def _kernel_mm(rec, get, kernel: iv.Kernel, fmt: str) -> list:
    """A declared Kernel: intervals.matmul per matrix under the structure-aware rule."""
    if rec.name == "linear":
        x, w = get(rec.args[0]), get(R._arg(rec.args, rec.kwargs, 1, "weight"))
        b = R._arg(rec.args, rec.kwargs, 2, "bias")
        lead = x.shape[:-1]
        a = iv.Interval(x.lo.reshape(-1, x.shape[-1]), x.hi.reshape(-1, x.shape[-1]), None,
                        "structure")
        y = iv.matmul(a, iv.Interval(w.lo.T, w.hi.T, None, "structure"), kernel)
        if isinstance(b, torch.Tensor):
            y = iv.add(y, get(b).with_rule("structure"), kernel.out_format.name)
        y = R._round_into(R._mk(y.lo.reshape(*lead, -1), y.hi.reshape(*lead, -1)), fmt)
        return [y]
    A, B = get(rec.args[0]), get(R._arg(rec.args, rec.kwargs, 1, "other"))
    shape = np.broadcast_shapes(A.shape[:-2], B.shape[:-2])
    alo, ahi = (np.broadcast_to(z, (*shape, *A.shape[-2:])) for z in (A.lo, A.hi))
    blo, bhi = (np.broadcast_to(z, (*shape, *B.shape[-2:])) for z in (B.lo, B.hi))
    lo = np.empty((*shape, A.shape[-2], B.shape[-1]))
    hi = np.empty_like(lo)
    for idx in np.ndindex(*shape):
        y = iv.matmul(iv.Interval(alo[idx], ahi[idx], None, "structure"),
                      iv.Interval(blo[idx], bhi[idx], None, "structure"), kernel)
        lo[idx], hi[idx] = y.lo, y.hi
    return [R._round_into(R._mk(lo, hi), fmt)]


def triage(reference, target, inputs, kernels: Mapping | None = None) -> TriageReport:
    """Type-I if every paired reference value lies in the target's bound (each operation bounded
    from the hull of both programs' previous values, the union over both output formats), else
    Type-II, blaming the first operation whose bound misses.

    reference, target: callables (Modules or functions) run on the same inputs (a tensor or a
    tuple). kernels: {operation: intervals.Kernel} for matmuls whose kernel is known, keyed by
    "module.path:name#k", a module path or an operation name; the rest are order-oblivious
    with float32 accumulation. An operation without an interval rule raises
    UnsupportedOperation naming it.
    """
    for nm, f in (("reference", reference), ("target", target)):
        if not callable(f):
            raise ValueError(f"{nm} must be callable (a Module or a function); got "
                             f"{type(f).__name__}")
    if kernels is not None:
        if not isinstance(kernels, Mapping) or not all(isinstance(k, iv.Kernel)
                                                       for k in kernels.values()):
            raise ValueError("kernels must map operation keys to precisionlab.intervals.Kernel; "
                             f"got kernels={kernels!r}")
    ins = as_inputs(inputs, "inputs")
    rt, tt = trace(reference, ins), trace(target, ins)
    if len(rt.outputs) != len(tt.outputs) or any(a.shape != b.shape for a, b in
                                                 zip(rt.outputs, tt.outputs, strict=False)):
        raise ValueError("reference and target return outputs of different shapes: "
                         f"{[tuple(o.shape) for o in rt.outputs]} and "
                         f"{[tuple(o.shape) for o in tt.outputs]}")
    # pairs: (target record, position) -> reference value. Module paths key the pairing when
    # both programs have them; otherwise (a function beside a Module) the run-wide occurrence.
    paths = any(r.path for r in rt.records) and any(r.path for r in tt.records)
    keyf = (lambda r: r.key) if paths else (lambda r: r.flat_key)
    by_key = {keyf(r): r for r in rt.records}
    anchor: dict = {}
    for rec in tt.records:
        p = by_key.get(keyf(rec))
        if p is not None and len(p.outs) == len(rec.outs) and all(
                a.shape == b.shape for a, b in zip(p.outs, rec.outs, strict=True)):
            for j, o in enumerate(p.outs):
                anchor[(rec.index, j)] = o
    for path, (i, j) in tt.module_out.items():
        if paths and path in rt.module_out and (i, j) not in anchor:
            ri, rj = rt.module_out[path]
            o = rt.records[ri].outs[rj]
            if o.shape == tt.records[i].outs[j].shape:
                anchor[(i, j)] = o
    for pos, src in enumerate(tt.final):
        if src is not None and src not in anchor:
            anchor[src] = rt.outputs[pos]
    ref_fmt = {}
    for rec in tt.records:
        p = by_key.get(keyf(rec))
        if p is not None:
            ref_fmt[rec.index] = R.fmt_of(p.outs[0].dtype)

    bounds: dict = {}
    checks = []
    unchecked: list[str] = []
    suspects: tuple = ()
    declared = []
    for rec in tt.records:
        def get(t, rec=rec):
            src = rec.src.get(id(t))
            if src is None:
                return R.leaf(t)
            if src in anchor:
                tv = tt.records[src[0]].outs[src[1]]
                return _hull(R._np(tv), R._np(anchor[src]))
            return bounds[src]

        op = f"{rec.path + ': ' if rec.path else ''}{rec.name}#{rec.key[2]}"
        fmts = [R.fmt_of(rec.outs[0].dtype)]
        if rec.index in ref_fmt and ref_fmt[rec.index] not in fmts:
            fmts = _coarser(fmts[0], ref_fmt[rec.index])
        if rec.name in _CREATE:
            bs = [R.leaf(o) for o in rec.outs]
        else:
            kernel = _declared(kernels, rec) if rec.name in _MATMULS else None
            try:
                per = [(_kernel_mm(rec, get, kernel, f) if kernel is not None
                        else R.bound(rec, get, f)) for f in fmts]
            except UnsupportedOperation as e:
                detail = str(e)
                raise UnsupportedOperation(
                    f"triage cannot bound operation #{rec.index} {rec.name!r}"
                    f"{' in module ' + repr(rec.path) if rec.path else ''}"
                    + ("" if detail == rec.name else f": {detail}")
                    + "; supported: " + ", ".join(R.supported())) from None
            if kernel is not None:
                declared.append((op, kernel.describe()))
            bs = [R._mk(np.minimum.reduce([p[j].lo for p in per]),
                        np.maximum.reduce([p[j].hi for p in per])) for j in range(len(rec.outs))]
        for j, (b, o) in enumerate(zip(bs, rec.outs, strict=True)):
            if tuple(b.shape) != tuple(o.shape):
                raise RuntimeError(f"internal: the rule for {rec.name} gave shape {b.shape}, the "
                                   f"operation {tuple(o.shape)}")
            bounds[(rec.index, j)] = b
            if (rec.index, j) in anchor:
                label = op + (f"[{j}]" if len(rec.outs) > 1 else "")
                c = _check(rec.index, label, b, R._np(anchor[(rec.index, j)]), R._np(o),
                           rec.name in R.EXACT)
                checks.append(c)
                if c.verdict == "Type-II" and not suspects and not any(
                        x.verdict == "Type-II" for x in checks[:-1]):
                    suspects = tuple(unchecked)
                unchecked = []
        if not any((rec.index, j) in anchor for j in range(len(rec.outs))):
            unchecked.append(f"#{rec.index} {op}")
    verdict = "Type-II" if any(c.verdict == "Type-II" for c in checks) else "Type-I"
    return TriageReport(verdict, tuple(checks), suspects[-6:], len(tt.records), len(checks),
                        tuple(declared))
