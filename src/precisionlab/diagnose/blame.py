"""Who to blame when a triage check fails, and where the two programs' operations differ.

Three kinds of evidence, each read from the two traces (`triage.trace`), none of it needed for
the verdict itself:

- `chain`: the unchecked operations the blamed one depends on, back to the last checked values
  (every path through the data flow, however long: the cause of a failed check lies among them
  or in the blamed operation itself).
- `argument_differences`: what differs between an operation's call and its counterpart's in the
  reference (the reference's operation of the same module, name and occurrence): a constant (a
  scale, an eps, a softmax axis), a mask or index, a weight or other leaf tensor, each with both
  values ("mul's scalar: reference 0.35355339, target 0.35631557").
- `count_differences`: modules where the two programs run a different number of operations,
  with the operation missing or extra and where ("module 'h.0': the target runs no `add` after
  module 'h.0.attn' (the reference's #37 h.0: add#0); the target ran 47 operations there, the
  reference 48"). Counted per module first; sequences are aligned only where counts differ.

`explain` ranks the suspects: operations whose call differs from their counterpart first (in
trace order), then the rest of the chain in trace order; and names the likely culprit when the
evidence points to one: a suspect or the blamed operation whose call differs from a counterpart
of the same structure (its float inputs made by operations of the same keys: an operation whose
counterpart is one only by its place in a rewritten module is not compared), else one or two
operations missing or extra between the last check before the chain and the blamed operation.
"""

from __future__ import annotations

import difflib
import math
from collections import Counter
from dataclasses import dataclass

import numpy as np
import torch

from .pairing import leaves_agree

__all__ = ["Blame", "CountDifference", "argument_differences", "chain", "count_differences",
           "explain"]

_BINARY = ("input", "other")
# parameter names by position, for the operations whose constants commonly differ
_PARAMS = {
    **{n: _BINARY for n in ("mul", "div", "add", "sub", "true_divide", "multiply", "divide",
                            "subtract", "rsub", "__mul__", "__rmul__", "__truediv__",
                            "__rtruediv__", "__add__", "__radd__", "__sub__", "__rsub__",
                            "__imul__", "__iadd__", "__isub__", "__itruediv__", "mul_", "add_",
                            "sub_", "div_", "maximum", "minimum", "fmod", "remainder")},
    **{n: ("input", "exponent") for n in ("pow", "__pow__", "__rpow__", "float_power")},
    **{n: ("input", "dim", "_stacklevel", "dtype") for n in ("softmax", "log_softmax")},
    "layer_norm": ("input", "normalized_shape", "weight", "bias", "eps"),
    **{n: ("input", "hx", "params", "has_biases", "num_layers", "dropout", "train",
           "bidirectional", "batch_first") for n in ("lstm", "gru", "rnn_tanh", "rnn_relu")},
    "group_norm": ("input", "num_groups", "weight", "bias", "eps"),
    "rms_norm": ("input", "normalized_shape", "weight", "eps"),
    "batch_norm": ("input", "running_mean", "running_var", "weight", "bias", "training",
                   "momentum", "eps"),
    "scaled_dot_product_attention": ("query", "key", "value", "attn_mask", "dropout_p",
                                     "is_causal", "scale", "enable_gqa"),
    "linear": ("input", "weight", "bias"),
    "addmm": ("input", "mat1", "mat2"),
    "conv1d": ("input", "weight", "bias", "stride", "padding", "dilation", "groups"),
    "conv2d": ("input", "weight", "bias", "stride", "padding", "dilation", "groups"),
    "embedding": ("input", "weight", "padding_idx", "max_norm", "norm_type",
                  "scale_grad_by_freq", "sparse"),
    "dropout": ("input", "p", "training", "inplace"),
    "clamp": ("input", "min", "max"), "clip": ("input", "min", "max"),
    "masked_fill": ("input", "mask", "value"), "where": ("condition", "input", "other"),
    "leaky_relu": ("input", "negative_slope"), "elu": ("input", "alpha"),
    "gelu": ("input", "approximate"), "hardtanh": ("input", "min_val", "max_val"),
    "transpose": ("input", "dim0", "dim1"), "sum": ("input", "dim", "keepdim"),
    "mean": ("input", "dim", "keepdim"),
}
_IGNORED = (torch.dtype, torch.device, torch.layout, torch.memory_format)
_MISSING = object()
_SHOWN = 8  # modules with a count difference described one by one


@dataclass(frozen=True)
class CountDifference:
    """A module where the two programs run a different number of operations.

    Attributes
    ----------
    path : str
        The module's path ("" for the top level of the program).
    target_ops : int
        Operations the target ran in the module and its submodules.
    reference_ops : int
        The same count in the reference.
    at : int
        The target trace index of the first extra operation, or of the one after the first
        missing one (where it would have run); -1 when the target does not run the module.
    text : str
        The difference in words.
    changed : int
        Operations missing or extra in the module's own sequence (0 when not aligned: a
        module only one program runs, or beyond the first few described).
    """

    path: str
    target_ops: int
    reference_ops: int
    at: int
    text: str
    changed: int = 0


@dataclass(frozen=True)
class Blame:
    """`explain`'s result: the ranked suspects, the culprit when the evidence points to one."""

    suspects: tuple  # str per unchecked operation of the chain, ranked
    culprit: str  # "" when no evidence singles one out


def chain(records, blamed: int, checked) -> list:
    """The trace indices of the unchecked operations that the operation `blamed` depends on:
    its inputs' producers, theirs, and so on, stopping at checked outputs and leaves; sorted.

    Parameters
    ----------
    records : sequence
        The target trace's records (each with `src`: id(input) -> (index, output) or None).
    blamed : int
        The blamed operation's trace index.
    checked : set or dict
        The (index, output) pairs whose values were checked against the reference.

    Returns
    -------
    list of int
        Trace indices, ascending.
    """
    seen: set = set()
    stack = [blamed]
    while stack:
        i = stack.pop()
        for src in records[i].src.values():
            if src is None or src in checked or src[0] in seen:
                continue
            seen.add(src[0])
            stack.append(src[0])
    return sorted(seen)


def _param(name: str, k: int) -> str:
    names = _PARAMS.get(name)
    return names[k] if names is not None and k < len(names) else f"argument {k + 1}"


def _named(rec) -> dict:
    """A call's arguments by parameter name (positional ones named by `_PARAMS`)."""
    out = {_param(rec.name, k): a for k, a in enumerate(rec.args)}
    out.update(rec.kwargs)
    return _spread(out)


def _spread(args: dict) -> dict:
    """Lists and tuples holding tensors (torch.lstm's hx and params) spread into one entry per
    element, "params[3]", so that each is compared as a tensor (a list compares by identity)."""
    out = {}
    for key, a in args.items():
        if isinstance(a, (list, tuple)) and any(isinstance(t, torch.Tensor) for t in a):
            out.update(_spread({f"{key}[{k}]": t for k, t in enumerate(a)}))
        else:
            out[key] = a
    return out


def _num(a, b) -> tuple[str, str]:
    """Two differing numbers, to as many digits as show the difference (8 at least)."""
    for digits in (8, 12, 17):
        x, y = f"{a:.{digits}g}", f"{b:.{digits}g}"
        if x != y:
            return x, y
    return repr(a), repr(b)


def _short(x) -> str:
    if isinstance(x, torch.Tensor):
        return f"a {str(x.dtype).removeprefix('torch.')} tensor of shape {tuple(x.shape)}"
    if x is _MISSING:
        return "(not passed)"
    r = repr(x)
    return r if len(r) <= 32 else r[:29] + "..."


def _leaf_text(what: str, x: torch.Tensor, y: torch.Tensor) -> str:
    """How two leaf tensors of one shape differ: the largest relative difference, and where."""
    a = x.detach().to(torch.float64).cpu().numpy()
    b = y.detach().to(torch.float64).cpu().numpy()
    with np.errstate(invalid="ignore", divide="ignore"):
        rel = np.abs(a - b) / np.maximum(np.abs(b), np.finfo(np.float64).tiny)
    rel = np.where(np.isnan(rel), np.where(np.isnan(a) == np.isnan(b), 0.0, np.inf), rel)
    k = int(np.argmax(rel)) if rel.size else 0
    el = tuple(int(i) for i in np.unravel_index(k, rel.shape)) if rel.shape else ()
    n = int((rel > 0).sum())
    dt = str(x.dtype).removeprefix("torch.")
    ref, tgt = _num(float(b.reshape(-1)[k]), float(a.reshape(-1)[k])) if rel.size else ("", "")
    return (f"{what} ({dt}, shape {tuple(x.shape)}): {n} of {rel.size} entries differ, most "
            f"at {el}: reference {ref}, target {tgt} (relative {float(rel.reshape(-1)[k]):.2g})")


def argument_differences(rec, p) -> list:
    """What differs between the target's call rec and the reference's call p: constants, masks
    and indices, leaf tensors (weights, inputs, constants); not the values of tensors either
    program computed (those differences are propagated, and checked where paired).

    Parameters
    ----------
    rec, p : record
        The target's and the reference's calls (`triage.trace` records).

    Returns
    -------
    list of str
        One line per differing argument, "mul's other: reference 0.35355339, target 0.3563";
        empty when every compared argument agrees.
    """
    a, b = _named(rec), _named(p)
    op = rec.name.strip("_")
    out = []
    for key in list(a) + [k for k in b if k not in a]:
        x, y = a.get(key, _MISSING), b.get(key, _MISSING)
        what = f"{op}'s {'scalar' if key == 'other' and _number(x) else key}"
        tx, ty = isinstance(x, torch.Tensor), isinstance(y, torch.Tensor)
        if tx and ty:
            if x.is_floating_point() and y.is_floating_point():
                if rec.src.get(id(x)) is not None or p.src.get(id(y)) is not None:
                    continue  # computed: its difference is propagated
                if x.shape != y.shape:
                    out.append(f"{what}: reference {_short(y)}, target {_short(x)}")
                elif not leaves_agree(x, y):
                    out.append(_leaf_text(what, x, y))
            elif x.dtype != y.dtype or x.shape != y.shape:
                out.append(f"{what}: reference {_short(y)}, target {_short(x)}")
            elif not torch.equal(x.cpu(), y.cpu()):
                n = int((x.cpu() != y.cpu()).sum())
                out.append(f"{what} ({str(x.dtype).removeprefix('torch.')}, shape "
                           f"{tuple(x.shape)}): {n} of {x.numel()} entries differ")
        elif tx or ty:
            out.append(f"{what}: reference {_short(y)}, target {_short(x)}")
        elif isinstance(x, _IGNORED) and isinstance(y, _IGNORED):
            continue
        elif not _same(x, y):
            if _number(x) and _number(y):
                ref, tgt = _num(y, x)
            else:
                ref, tgt = _short(y), _short(x)
            out.append(f"{what}: reference {ref}, target {tgt}")
    return out


def _number(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def _same(x, y) -> bool:
    if _number(x) and _number(y):
        return x == y or (isinstance(x, float) and isinstance(y, float) and math.isnan(x)
                          and math.isnan(y))
    try:
        return type(x) is type(y) and bool(x == y)
    except Exception:  # objects without a plain ==
        return x is y


def _tokens(records, path: str, paths: bool) -> list:
    """The sequence a module runs: ("op", name, index) for its own operations, ("mod", child,
    index of its first operation) for each run of a child module's operations."""
    out = []
    pre = path + "." if path else ""
    for r in records:
        p = r.path if paths else ""
        if p == path:
            out.append(("op", r.name, r.index))
        elif paths and (not path or p.startswith(pre)):
            child = pre + p[len(pre):].split(".")[0]
            if not out or out[-1][:2] != ("mod", child):
                out.append(("mod", child, r.index))
    return out


def _label(rec) -> str:
    return f"{rec.path + ': ' if rec.path else ''}{rec.name}#{rec.key[2]}"


def _after(seq: list, k: int) -> str:
    """Where position k of a token sequence is, by what runs just before it."""
    if k <= 0:
        return "at the start"
    kind, name, _ = seq[k - 1]
    return f"after module {name!r}" if kind == "mod" else f"after its `{name.strip('_')}`"


def _subtree_counts(records, paths: bool) -> Counter:
    c: Counter = Counter()
    for r in records:
        p = r.path if paths else ""
        c[""] += 1
        if p:
            parts = p.split(".")
            for n in range(1, len(parts) + 1):
                c[".".join(parts[:n])] += 1
    return c


def count_differences(ref_records, tgt_records, paths: bool) -> tuple:
    """The modules where the target runs a different number of operations of some name than the
    reference, each with what is missing or extra and where (`CountDifference`).

    Parameters
    ----------
    ref_records, tgt_records : sequence
        The two traces' records.
    paths : bool
        Whether both programs carry module paths (else the whole run is compared as one).

    Returns
    -------
    tuple of CountDifference
        In the target's trace order (modules only the reference runs last); empty when every
        module runs the same operations the same number of times (checked by counts, without
        aligning sequences).
    """
    def own(records):
        return Counter(((r.path if paths else ""), r.name) for r in records)
    a, b = own(tgt_records), own(ref_records)
    if a == b:
        return ()
    diff = {p for (p, _), n in (a - b).items() if n} | {p for (p, _), n in (b - a).items() if n}
    na, nb = _subtree_counts(tgt_records, paths), _subtree_counts(ref_records, paths)
    first = {}
    for r in tgt_records:
        first.setdefault(r.path if paths else "", r.index)
    order = sorted(diff, key=lambda p: (first.get(p, math.inf), p))
    out = []
    for p in order:
        t, r = na.get(p, 0), nb.get(p, 0)
        if any(p != q and p.startswith(q + ".") and 0 in (na.get(q, 0), nb.get(q, 0))
               for q in diff):
            continue  # inside a module only one program runs: said there
        where = f"module {p!r}" if p else "the top level"
        if not t or not r:
            who, n = ("the target", t) if t else ("the reference", r)
            out.append(CountDifference(p, t, r, first.get(p, -1), (
                f"{where} runs only in {who} ({n} operations): a rewrite, or a module "
                "renamed")))
        elif len(out) >= _SHOWN:
            out.append(CountDifference(p, t, r, first.get(p, -1), (
                f"{where}: the target ran {t} operations, the reference {r}")))
        else:
            out.append(_aligned(p, where, tgt_records, ref_records, paths, t, r))
    return tuple(out)


def _names(tokens: list) -> str:
    """Up to three operation names in backticks, and how many more."""
    names = [f"`{t[1].strip('_')}`" for t in tokens]
    return ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")


def _aligned(p, where, tgt_records, ref_records, paths, t, r) -> CountDifference:
    """The operations of module p missing or extra in the target, and where, by aligning what
    the module runs in each program (`_tokens`)."""
    ta, tb = _tokens(tgt_records, p, paths), _tokens(ref_records, p, paths)
    sm = difflib.SequenceMatcher(None, [x[:2] for x in ta], [x[:2] for x in tb], autojunk=False)
    said, at, changed = [], -1, 0
    end = max((x.index for x in tgt_records if (x.path if paths else "") == p), default=-1) + 1
    for tag, i1, i2, j1, j2 in sm.get_opcodes():
        if tag == "equal":
            continue
        gone = [x for x in tb[j1:j2] if x[0] == "op"]
        extra = [x for x in ta[i1:i2] if x[0] == "op"]
        changed += len(gone) + len(extra)
        nxt = ta[i1][2] if i1 < len(ta) else end
        if gone and not extra:
            said.append(f"the target runs no {_names(gone)} {_after(tb, j1)} (the reference's "
                        f"#{gone[0][2]} {_label(ref_records[gone[0][2]])})")
        elif extra and not gone:
            said.append(f"the target runs an extra {_names(extra)} {_after(ta, i1)} "
                        f"(#{extra[0][2]})")
            nxt = extra[0][2]
        elif extra and gone:
            said.append(f"the target runs {_names(extra)} where the reference runs "
                        f"{_names(gone)}, {_after(tb, j1)}")
            nxt = extra[0][2]
        else:
            continue
        if at < 0:
            at = nxt
    text = (f"{where}: " + "; ".join(said[:2]) + ("; ..." if len(said) > 2 else "") +
            f"; the target ran {t} operations there, the reference {r}")
    return CountDifference(p, t, r, at, text, changed)


def _corresponds(rec, p, tgt_records, ref_records, key) -> bool:
    """Whether the reference's call p is rec's counterpart by structure, not by its place alone:
    each float tensor argument a leaf in both, or made by operations of one key (module, name,
    occurrence) and output position in the two programs."""
    a, b = _named(rec), _named(p)
    for k in set(a) | set(b):
        x, y = a.get(k), b.get(k)
        fx = isinstance(x, torch.Tensor) and x.is_floating_point()
        fy = isinstance(y, torch.Tensor) and y.is_floating_point()
        if fx != fy:
            return False
        if fx:
            sx, sy = rec.src.get(id(x)), p.src.get(id(y))
            if (sx is None) != (sy is None):
                return False
            if sx is not None and (sx[1] != sy[1] or
                                   key(tgt_records[sx[0]]) != key(ref_records[sy[0]])):
                return False
    return True


def explain(tgt_records, ref_records, blamed: int, checked, key, differs: dict, label,
            counts: tuple = ()) -> Blame:
    """The suspects of a failed check, ranked, and the culprit when the evidence points to one.

    Parameters
    ----------
    tgt_records, ref_records : sequence
        The target's and the reference's trace records.
    blamed : int
        The blamed operation's trace index.
    checked : set or dict
        The (index, output) pairs checked against the reference.
    key : callable
        record -> its pairing key (module path, name, occurrence); the reference's record
        of rec's key is its counterpart.
    differs : dict
        Trace index -> how pairing found its call to differ ("-2 vs -1": target vs
        reference), for calls whose float inputs were paired.
    label : callable
        record -> "module.path: name#k".
    counts : tuple of CountDifference
        `count_differences` of the two traces.

    Returns
    -------
    Blame
        suspects: "#i label" per operation of `chain`, with "(differs from the reference:
        ...)" where its call differs from a counterpart of the same structure
        (`argument_differences`), those first; culprit: the first such call among the
        blamed operation and its suspects, with both values; else a difference of one or
        two operations in a module both programs run, located between the last check
        before the chain and the blamed operation; else "".
    """
    idx = chain(tgt_records, blamed, checked)
    by_key = {key(r): r for r in ref_records}
    found, rest, culprit = [], [], ""
    for i in [blamed, *idx]:
        rec = tgt_records[i]
        p = by_key.get(key(rec))
        named = argument_differences(rec, p) if p is not None and (
            i in differs or _corresponds(rec, p, tgt_records, ref_records, key)) else []
        why = differs.get(i) or "; ".join(named)
        if named and not culprit:
            culprit = f"#{i} {label(rec)}: " + "; ".join(named)
        if i == blamed:
            continue
        text = f"#{i} {label(rec)}" + (f" (differs from the reference: {why})" if why else "")
        (found if why else rest).append(text)
    if not culprit and counts:
        start = min([blamed, *idx])
        prev = max((i for i, _ in checked if i < start), default=-1)
        near = [c for c in counts if prev < c.at <= blamed and 0 < c.changed <= 2]
        if near:
            culprit = near[0].text
    return Blame(tuple(found + rest), culprit)
