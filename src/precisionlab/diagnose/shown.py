"""Which tensor a `triage` check's worst element indexes: one the user's code holds.

An operation torch runs inside one of its own modules works on tensors the user's code never
sees. nn.MultiheadAttention(batch_first=True) transposes its inputs to (L, N, E), calls
F.multi_head_attention_forward and transposes the result back: the element of the internal
call's output is not the element of the module's (N, L, E) output. So a check's element is
reported in a tensor the user holds: the operation's own output when their code (or any
module's forward, as returned) holds it; else, through the exact layout operations between
them (transpose, permute, view, reshape, ...), the module output it becomes or the tensor it
was made from; else it stays in the internal tensor, and the check says so (`OpCheck.of`)
with that tensor's shape.
"""

from __future__ import annotations

import dataclasses

import torch

from .opcheck import OpCheck

__all__ = ["LAYOUT", "Shown", "torch_forward"]

# operations whose output holds each entry of their first input exactly once, elsewhere
LAYOUT = frozenset({"transpose", "swapaxes", "swapdims", "permute", "movedim", "moveaxis", "t",
                    "T", "mT", "view", "reshape", "view_as", "reshape_as", "flatten",
                    "unflatten", "squeeze", "unsqueeze", "contiguous", "clone", "detach"})
_DEPTH = 6  # layout operations followed in a row


def torch_forward(mod: torch.nn.Module) -> bool:
    """Whether mod's forward is torch's own code (an nn layer, or a subclass that keeps it)."""
    fwd = getattr(type(mod), "forward", None)
    return (getattr(fwd, "__module__", None) or "").startswith("torch.")


def _sub(obj, t, idx):
    if obj is t:
        return idx
    if isinstance(obj, (list, tuple)):
        return type(obj)(_sub(o, t, idx) for o in obj)
    return obj


class Shown:
    """For each output (i, j) of the target's trace, the tensor its checks' elements index.

    tr: the target's trace, with `internal` (module path -> class name, for modules whose
    forward is torch's), `returned` ((i, j) -> (path, position, count) of a module's output),
    `final` and `inputs`; label(rec): the operation's name as triage prints it."""

    def __init__(self, tr, label):
        self.tr, self.label = tr, label
        self.readers: dict = {}  # (i, j) -> [(reader's index, the tensor it reads)]
        for rec in tr.records:
            for t in rec.ins:
                s = rec.src.get(id(t))
                if s is not None:
                    self.readers.setdefault(s, []).append((rec.index, t))
        self.final = {s: k for k, s in enumerate(tr.final) if s is not None}

    def apply(self, c: OpCheck, i: int, j: int) -> OpCheck:
        """c with its element (an index into output j of operation i) in the tensor shown."""
        if self.visible(i, j) or not c.numel:  # a zero-size tensor has no element to show
            return c
        el = tuple(c.element)
        for step in (self._forward, self._backward):
            found = step(i, j, el, _DEPTH)
            if found is not None:
                el2, shape, of = found
                return dataclasses.replace(c, element=el2, shape=shape, of=of)
        rec = self.tr.records[i]
        return dataclasses.replace(
            c, of=f"an internal tensor of module {rec.path!r} ({self.tr.internal[rec.path]}), "
                  "which your code does not see")

    def visible(self, i: int, j: int) -> bool:
        """Whether the user's code holds output j of operation i: it runs in their code, or a
        module returns it, or the program does."""
        return (self.tr.records[i].path not in self.tr.internal or (i, j) in self.tr.returned
                or (i, j) in self.final)

    def name(self, i: int, j: int) -> str:
        """The visible output j of operation i, in words."""
        r = self.tr.returned.get((i, j))
        if r is not None:
            path, k, n = r
            mod = self.tr.module_class.get(path, "")
            what = "the output" if n == 1 else f"output {k}"
            return (f"{what} of module {path!r} ({mod})" if path else f"{what} of the {mod}")
        k = self.final.get((i, j))
        if k is not None:
            return "the program's output" if len(self.tr.final) == 1 else f"output {k} of the program"
        rec = self.tr.records[i]
        return (f"the output of #{i} {self.label(rec)}"
                + (f"[{j}]" if len(rec.outs) > 1 else ""))

    def _forward(self, i, j, el, depth):
        """(element, shape, name) in the visible tensor a chain of layout operations makes of
        output j of operation i, or None."""
        if depth == 0:
            return None
        t_shape = tuple(self.tr.records[i].outs[j].shape)
        flat = _ravel(el, t_shape)
        for k, t in self.readers.get((i, j), ()):
            rec = self.tr.records[k]
            if rec.name not in LAYOUT or not rec.ins or rec.ins[0] is not t or len(rec.outs) != 1:
                continue
            idx = _index_of(rec, t)
            if idx is None:
                continue
            where = (idx == flat).nonzero()
            if len(where) != 1:
                continue
            el2 = tuple(int(v) for v in where[0])
            if self.visible(k, 0):
                return el2, tuple(rec.outs[0].shape), self.name(k, 0)
            found = self._forward(k, 0, el2, depth - 1)
            if found is not None:
                return found
        return None

    def _backward(self, i, j, el, depth):
        """(element, shape, name) in the visible tensor that a chain of layout operations ending
        in operation i was made from, or None."""
        rec = self.tr.records[i]
        if depth == 0 or rec.name not in LAYOUT or j != 0 or not rec.ins:
            return None
        t = rec.ins[0]
        if not t.is_floating_point():
            return None
        idx = _index_of(rec, t)
        if idx is None:
            return None
        el2 = tuple(int(v) for v in _unravel(int(idx[el]), tuple(t.shape)))
        s = rec.src.get(id(t))
        if s is None:  # a leaf: the program's input, or a tensor only torch's code holds
            k = next((k for k, x in enumerate(self.tr.inputs) if x is t), None)
            if k is None:
                return None
            what = "the program's input" if len(self.tr.inputs) == 1 else f"input {k} of the program"
            return el2, tuple(t.shape), what
        if self.visible(*s):
            return el2, tuple(t.shape), self.name(*s)
        return self._backward(*s, el2, depth - 1)


def _index_of(rec, t) -> torch.Tensor | None:
    """For a layout operation rec reading t: the C-order position in t of each of its output's
    entries (rec's call repeated on positions), or None where it cannot be repeated."""
    n = t.numel()
    idx = torch.arange(n, dtype=torch.int64).reshape(t.shape)
    args = tuple(_sub(a, t, idx) for a in rec.args)
    kwargs = {k: _sub(v, t, idx) for k, v in rec.kwargs.items()}
    try:
        out = rec.func(*args, **kwargs)
    except Exception:  # a call that does not take integers, or a property
        return None
    if not isinstance(out, torch.Tensor) or tuple(out.shape) != tuple(rec.outs[0].shape) \
            or out.numel() != n:
        return None
    return out


def _ravel(el: tuple, shape: tuple) -> int:
    f = 0
    for i, n in zip(el, shape, strict=True):
        f = f * n + int(i)
    return f


def _unravel(f: int, shape: tuple) -> tuple:
    el = []
    for n in reversed(shape):
        f, i = divmod(f, n)
        el.append(i)
    return tuple(reversed(el))
