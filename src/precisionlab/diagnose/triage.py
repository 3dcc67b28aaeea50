"""Round-off or bug? Trace two callables' torch operations as they run, bound the target's
round-off operation by operation with `precisionlab.intervals`, and say Type-I or Type-II with
the operation to blame (the method of chapter 7, RENDER's, on a real model). The result, its
summary, table and plot are `TriageReport`'s, in `triage_report`.

Tracing: a `torch.overrides.TorchFunctionMode` records every torch-level call (F.linear,
F.layer_norm, F.scaled_dot_product_attention, Tensor.__add__, ...) eagerly, as the program
runs, whatever its Python control flow; `torch.fx` would fail on data-dependent forwards,
and ATen-level dispatch would split attention and normalisation into pieces with looser
bounds. Forward hooks name the module each call runs in.

Analysis (RENDER's layer-by-layer reduction, at the granularity of operations). Pairing: a
module's output is paired with the reference module's of the same path and a final output with
the reference's (the programs' contract); any other operation only when it computes the same
expression as the reference's operation of the same (module, name, occurrence): equal shapes,
equal non-tensor arguments, masks and indices, and float inputs that are paired with each other
or leaves that round to each other. A correct rewrite may order, name or split its operations
differently, and pairing by name alone would then compare different quantities. Bounds: each
target operation is bounded from its inputs' bounds, where an input that is a paired output
restarts from the union (hull) of the target's and the reference's values; a leaf is the set of
reals that round to it (joined with the paired reference leaf, or widened to a coarser
reference format), so weights and inputs cast to a narrower format count as round-off; matrix
products read a leaf as t +- (rho |t| + tau), which holds over that set, and need no bounds
array of the weight's size. Each bound is the union over the target's and the reference's
output formats (an unpaired operation: the coarsest format the reference uses). A mask or index computed from float values (x > 0,
argmax) may differ in the reference: an unpaired operation using one takes either choice.
Type-II: some paired reference value lies outside. Unpaired operations are propagated, not
checked; a failed check's suspects, culprit and differing operation counts are `blame`'s, the
detection floors at module outputs `floors`', the logic pass of a low-precision module `logic`'s.
What an operation's consumers read is held only until its last consumer has been bounded.
A check's worst element indexes a tensor the user's code holds (`shown`): an operation inside a
torch module (F.multi_head_attention_forward on the (L, N, E) transposes of a batch-first
nn.MultiheadAttention's inputs) reports it in the module's output, else says which tensor.

What a verdict means. Type-I says each paired reference value is one the target's operation
could have computed, by the kernel model in `rules`, from inputs between the two programs'
values: a local statement. It bounds nothing end to end (round-off that each operation is
allowed can compound), and a bug smaller than one operation's bound is not caught even when
later operations amplify it, since they restart from the hull that already contains it.
Type-II says the two programs' values at that operation cannot both come from the same
operation within the model: the bug may be in either program, or the kernel model may not fit
the target's kernel (its self-check then counts the target's own values outside). Python
branches on tensor values are not traced (the report counts them), and a value taken out of
torch (item, tolist, float) raises UnsupportedOperation.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass

import torch
from torch.overrides import TorchFunctionMode

from .. import intervals as iv
from ..intervals import torch_ops as bd
from .batch import as_inputs, call, for_program, named_modules_of, output_tensors, tensors
from .blame import Blame, count_differences, explain
from .floors import widest
from .logic import with_logic_pass
from .opcheck import OpCheck, check_hull, check_values, union
from .pairing import (
    coarser,
    coarsest,
    leaf_of,
    leaf_wide,
    same_call,
    same_choice,
    unknown_choice,
)
from .shown import Shown, torch_forward
from .triage_report import TriageReport

__all__ = ["OpCheck", "TriageReport", "UnsupportedOperation", "trace", "triage"]

UnsupportedOperation = bd.UnsupportedOperation
_MATMULS = ("linear", "matmul", "mm", "bmm")
_SMALL = 4096  # paired vectors up to this size get their boxes in one batch
_CREATE = frozenset({"zeros", "ones", "full", "arange", "tensor", "as_tensor", "zeros_like",
                     "ones_like", "full_like", "new_zeros", "new_ones", "new_full", "new_tensor",
                     "empty", "empty_like", "new_empty", "eye", "linspace", "scalar_tensor"})
_RANDOM = frozenset({"rand", "randn", "randint", "rand_like", "randn_like", "bernoulli",
                     "normal", "multinomial", "uniform_", "normal_", "dropout_", "randperm"})
# a float (or float-derived) tensor's value leaving torch: arithmetic on it is not traced
_ESCAPES = frozenset({"item", "tolist", "__float__", "numpy", "__complex__"})
# a Python branch (or an index) taken on a float-derived value
_BRANCHES = frozenset({"__bool__", "__int__", "__index__"})
# queries of a tensor's metadata (no tensor value comes out): passed through unrecorded
_INERT = frozenset({"is_floating_point", "is_complex", "dim", "ndimension", "numel", "nelement",
                    "size", "shape", "dtype", "device", "ndim", "layout", "is_contiguous",
                    "stride", "storage_offset", "data_ptr", "untyped_storage", "element_size",
                    "requires_grad", "is_cuda", "get_device", "__len__"})


def _name(func) -> str:
    n = getattr(func, "__name__", None) or str(func)
    if n == "__get__":  # a property such as Tensor.T
        n = getattr(getattr(func, "__self__", None), "__name__", n)
    return n


def _tensors(obj) -> list:
    if isinstance(obj, torch.Tensor):
        return [obj]
    out = []
    if isinstance(obj, (list, tuple)):
        for o in obj:
            if isinstance(o, torch.Tensor):
                out.append(o)
            elif isinstance(o, (list, tuple)):
                out += _tensors(o)
    return out


@dataclass(slots=True)
class _Rec:
    index: int
    name: str
    func: object
    args: tuple
    kwargs: dict
    path: str
    key: tuple
    outs: list  # the float outputs' values at the call (detached; cloned before a later write)
    src: dict  # id(input tensor) -> (record index, output position) or None (a leaf)
    flat_key: tuple  # ("", name, occurrence in the whole run): pairing without module paths
    ins: list  # the tensors among the arguments (positional, then keyword)


class _Trace:
    """Every float-valued torch call of one run, with module paths and module outputs."""

    def __init__(self, eager: bool = False):
        self.eager = eager  # clone every output at once (else only before an in-place write)
        self.versions: list = []  # (record, position, tensor, its version counter at the call)
        self.cloned: set = set()  # (record, position) whose value was cloned before a write
        self.records: list[_Rec] = []
        self.producer: dict = {}
        self.keep: list = []
        self.counts: dict = {}
        self.stack: list[str] = []
        self.module_out: dict = {}  # path -> (record index, position)
        self.returned: dict = {}  # (record index, position) -> (path, k, n): a module's output
        self.internal: dict = {}  # path -> class name, for modules whose forward is torch's
        self.module_class: dict = {}  # path -> class name
        self.inputs: tuple = ()
        self.outputs: list = []
        self.dd: set = set()  # id() of integer/bool tensors computed from float values
        self.branches: list = []  # Python branches taken on tensor values (bool(x > 0), ...)
        self.storage: dict = {}  # storage address -> id() of the traced tensors on it
        self.shared: list = []  # traced tensors (leaves, outputs), mapped into `storage` lazily
        self.mapped = 0  # how many of `shared` are in `storage`

    def add(self, func, name, args, kwargs, outs, ins):
        path = self.stack[-1] if self.stack else ""
        k = (path, name)
        counts, producer = self.counts, self.producer
        ck = counts[k] = counts.get(k, -1) + 1
        cn = counts[name] = counts.get(name, -1) + 1
        src = {}
        for t in ins:
            p = src[id(t)] = producer.get(id(t))
            if p is None and t.is_floating_point():  # a leaf: weights, inputs
                self.shared.append(t)
                self.keep.append(t)  # alive, so its id and address are not reused
        i = len(self.records)
        vals = []
        for j, o in enumerate(outs):
            vals.append(self._value(i, j, o))
            producer[id(o)] = (i, j)
        self.records.append(_Rec(i, name, func, args, kwargs, path, (path, name, ck), vals, src,
                                 ("", name, cn), ins))
        self.keep += outs
        self.shared += outs

    def _value(self, i: int, j: int, o: torch.Tensor) -> torch.Tensor:
        """Output j of record i as recorded: o itself (detached) while nothing writes into it,
        its version counter noted; a clone when eager or o has no counter (inference mode)."""
        if not self.eager:
            try:
                self.versions.append((i, j, o, o._version))
                return o.detach()
            except RuntimeError:  # an inference tensor: no version counter
                pass
        self.cloned.add((i, j))
        return o.detach().clone()

    def before_write(self, t: torch.Tensor) -> None:
        """An in-place operation is about to write into t: clone the value its producer recorded
        (a write into memory another traced tensor shares is refused by `check_alias`)."""
        p = self.producer.get(id(t))
        if p is not None and p not in self.cloned:
            self.cloned.add(p)
            outs = self.records[p[0]].outs
            outs[p[1]] = outs[p[1]].clone()

    def written(self) -> bool:
        """Whether some output not cloned changed after its call (a write the mode did not see,
        such as out=): the recorded values are then not the call's."""
        return any(o._version != v for i, j, o, v in self.versions if (i, j) not in self.cloned)

    def check_alias(self, t: torch.Tensor, name: str) -> None:
        """An in-place operation on memory another traced tensor (a view) shares: refuse it.
        The storage of the tensors traced so far is looked up here, at the first in-place
        operation after them (storage moves only by an in-place operation, which comes here)."""
        for s in self.shared[self.mapped:]:
            p = s.untyped_storage().data_ptr() if s.numel() else 0
            if p:
                self.storage.setdefault(p, set()).add(id(s))
        self.mapped = len(self.shared)
        ptr = t.untyped_storage().data_ptr() if t.numel() else 0
        if ptr and self.storage.get(ptr, set()) - {id(t)}:
            raise UnsupportedOperation(
                f"triage cannot follow the in-place {name} on a tensor whose memory another "
                "tensor of the program shares (a view of it, or the tensor it views): use the "
                "out-of-place operation")


def _kind(func) -> tuple[str, bool, bool]:
    """(name, inert: a metadata query, inplace: writes into its first argument)."""
    name = _name(func)
    inplace = name == "__setitem__" or (name.endswith("_") and not name.endswith("__")) \
        or (name.startswith("__i") and name.endswith("__") and name not in ("__index__",
                                                                             "__int__"))
    return name, name in _INERT, inplace


class _Recorder(TorchFunctionMode):
    def __init__(self, tr: _Trace):
        super().__init__()
        self.tr = tr
        self.kinds: dict = {}  # func -> `_kind(func)`, for this trace

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        try:
            name, inert, inplace = self.kinds[func]
        except KeyError:
            name, inert, inplace = self.kinds[func] = _kind(func)
        except TypeError:  # not hashable
            name, inert, inplace = _kind(func)
        if inert:
            return func(*args, **kwargs)
        ins = _tensors(args) + _tensors(list(kwargs.values())) if kwargs else _tensors(args)
        floats = False
        for t in ins:
            if t.is_floating_point():
                floats = True
                break
        data = floats or any(id(t) in self.tr.dd for t in ins)
        if data and (name in _ESCAPES or (floats and name in ("__int__", "__index__"))):
            raise UnsupportedOperation(
                f"triage cannot follow a tensor's value into Python ({name}): the two programs "
                "may get different numbers there and nothing bounds what follows; keep the "
                "value a tensor, or compute it outside and pass it in")
        if data and name in _BRANCHES:
            self.tr.branches.append(name)
        if inplace and args and isinstance(args[0], torch.Tensor) and args[0].is_floating_point():
            self.tr.check_alias(args[0], name)
            self.tr.before_write(args[0])
        out = func(*args, **kwargs)
        outs = []
        for t in (args[:1] if inplace else _tensors(out)):
            if isinstance(t, torch.Tensor):
                if t.is_floating_point():
                    outs.append(t)
                elif data:  # integer/bool results computed from float values (x > 0, argmax)
                    self.tr.dd.add(id(t))
                    self.tr.keep.append(t)
        if outs:
            if name in _RANDOM:
                raise UnsupportedOperation(f"triage cannot bound {name} (random numbers inside "
                                           "the program); draw them outside and pass them in")
            self.tr.add(func, name, args, kwargs, outs, ins)
        return out


def _unwrapped(m: torch.nn.Module) -> torch.nn.Module:
    """A wrapper (one child, no parameters or buffers of its own) named as the model it wraps,
    so that Wrap(model) pairs with model module by module."""
    while (len(kids := list(m.children())) == 1 and next(m.parameters(False), None) is None
           and next(m.buffers(False), None) is None):
        m = kids[0]
    return m


def _roots(fn) -> list:
    """(path prefix, Module) pairs whose submodules name the calls (`batch.named_modules_of`):
    one Module (fn itself, or the one it is bound to or closes over; a wrapper: the model it
    wraps) names them without a prefix, several by their variable names."""
    found = named_modules_of(fn)
    if len(found) == 1:
        return [("", _unwrapped(found[0][1]))]
    return found


def _training_buffers(roots) -> list:
    """(buffer, its value) for the buffers of modules in training mode (batch norm's running
    statistics and num_batches_tracked), restored after the run: triage runs each program once
    or twice, and a reader's model must not come back with statistics updated by them."""
    out, seen = [], set()
    for _, root in roots:
        for mod in root.modules():
            if mod.training:
                for b in mod.buffers(recurse=False):
                    if id(b) not in seen:
                        seen.add(id(b))
                        out.append((b, b.detach().clone()))
    return out


def trace(fn, inputs, name: str = "the program", eager: bool = False,
          output: str | None = None) -> _Trace:
    """Run fn(*inputs) (fn(**inputs) for a dict) once under no_grad, recording its float-valued
    torch calls (eager: clone every output as it is made; otherwise only before a write, and run
    again eagerly when a write went unseen); output: the field of a dict output compared
    (`batch.output_tensors`)."""
    ins = as_inputs(inputs, "inputs")
    tr = _Trace(eager)
    tr.inputs = ins
    paths: dict = {}  # id(module) -> (module, its path: the first name it is found under)
    roots = _roots(fn)
    saved = _training_buffers(roots)
    for prefix, root in roots:
        for sub, mod in root.named_modules():
            if id(mod) not in paths:
                paths[id(mod)] = (mod, ".".join(x for x in (prefix, sub) if x))
    for mod, p in paths.values():
        tr.module_class[p] = type(mod).__name__
        if torch_forward(mod):
            tr.internal[p] = type(mod).__name__

    def pre(mod, _i, p=None):
        p = p if p is not None else paths.get(id(mod), (None, None))[1]
        if p is not None:
            tr.stack.append(p)

    def post(mod, _i, out, p=None, raw=False):
        p = p if p is not None else paths.get(id(mod), (None, None))[1]
        if p is None:
            return
        ts = [t for t in tensors(out) if t.is_floating_point()]
        for k, t in enumerate(ts):  # what the module returns (raw: before its own hooks)
            if id(t) in tr.producer:
                tr.returned.setdefault(tr.producer[id(t)], (p, k, len(ts)))
        if raw:
            return
        tr.stack.pop()
        if ts and id(ts[0]) in tr.producer:
            tr.module_out[p] = tr.producer[id(ts[0])]
    if any(m._forward_hooks or m._forward_pre_hooks for m, _ in paths.values()):
        # per-module hooks, registered after the module's own: the output recorded is the one
        # its own forward hooks return (global hooks run before those)
        hooks = [h for m, p in paths.values() for h in (
            m.register_forward_pre_hook(functools.partial(pre, p=p)),
            m.register_forward_hook(functools.partial(post, p=p, raw=True), prepend=True),
            m.register_forward_hook(functools.partial(post, p=p)))]
    else:  # two global hooks, whatever the number of modules; others pass through
        hooks = [torch.nn.modules.module.register_module_forward_pre_hook(pre),
                 torch.nn.modules.module.register_module_forward_hook(post)]
    try:
        with torch.no_grad(), _Recorder(tr):
            out = call(fn, ins, name)
    finally:
        for h in hooks:
            h.remove()
        with torch.no_grad():
            for b, v in saved:
                b.copy_(v)
    outs = output_tensors(out, output, name)
    if tr.written():
        return trace(fn, inputs, name, eager=True, output=output)
    tr.outputs = [o.detach().clone() for o in outs]
    tr.final = [tr.producer.get(id(o)) for o in outs]
    return tr


def _on_hulls(rec, matched: set, anchor: dict, p) -> bool:
    """Whether rec is an exact operation (a gather, no fill) paired with the reference's p, whose
    float inputs are all paired outputs (consumers read the hull of both programs' values) and
    whose outputs are checked against p's: its bound, the same gather of the inputs' hull, is
    then the hull of both programs' outputs."""
    if rec.name not in bd.EXACT or rec.name in bd.FILLS or rec.index not in matched or p is None:
        return False
    if not all(anchor.get((rec.index, j)) is o for j, o in enumerate(p.outs)):
        return False
    return all(rec.src.get(id(t)) in anchor for t in rec.ins if t.is_floating_point())


def _op_label(rec) -> str:
    return f"{rec.path + ': ' if rec.path else ''}{rec.name}#{rec.key[2]}"


def _unsupported(rec, detail: str) -> str:
    """What UnsupportedOperation says: the operation, its module, why, and what to do."""
    where = (f"triage cannot bound operation #{rec.index} {rec.name!r}"
             f"{' in module ' + repr(rec.path) if rec.path else ''}")
    if detail != rec.name:  # the rule exists but refuses these arguments: its reason
        return f"{where}: {detail}"
    names = bd.supported()
    listed = (f" (those with one: {', '.join(names)})" if len(names) <= 12 else
              f" ({len(names)} operations have one: diagnose.supported() lists them)")
    return (f"{where}; no interval rule bounds {rec.name!r}{listed}. To triage the rest, "
            f"compute that part outside the two programs and pass its result in as an input "
            f"(inputs are taken as given), or file an issue asking for a rule for {rec.name!r}")


def _declared(kernels: Mapping | None, rec) -> iv.Kernel | None:
    if not kernels:
        return None
    key = f"{rec.path}:{rec.name}#{rec.key[2]}"
    for k in (key, rec.path, rec.name):
        if k in kernels:
            return kernels[k]
    return None


def triage(reference, target, inputs, kernels: Mapping | None = None,
           output: str | None = None, cast_inputs: bool = False,
           logic_pass: bool | None = None) -> TriageReport:
    """Type-I if every paired reference value lies in the target's bound (each operation bounded
    from the hull of both programs' values at paired inputs, the union over both output
    formats), else Type-II, blaming the first operation whose bound misses (see the module
    docstring for the pairing and for what the verdict does and does not say).

    reference, target: callables (Modules or functions) run on the same inputs (a tensor or a
    tuple). kernels: {operation: intervals.Kernel} for matmuls whose kernel is known, keyed by
    "module.path:name#k", a module path or an operation name; the rest are order-oblivious
    with float32 accumulation. An operation without an interval rule raises
    UnsupportedOperation naming it.

    Parameters
    ----------
    reference : torch.nn.Module or callable
        The program trusted to be right (a float32 or float64 model, the original code);
        reference(*inputs) (reference(**inputs) for a dict) returns a tensor, a tuple or
        list of tensors, or a dict or Hugging Face ModelOutput (see output).
    target : torch.nn.Module or callable
        The program under suspicion (a low-precision copy, a fused or rewritten kernel),
        returning outputs of the reference's shapes.
    inputs : torch.Tensor, tuple or dict
        The inputs both programs run on: a tensor, a non-empty tuple or list of positional
        inputs, or a dict of keyword inputs (a tokenizer's input_ids and attention_mask),
        passed as reference(**inputs). Integer tensors are token ids or masks, never cast.
    kernels : mapping or None, default None
        {key: precisionlab.intervals.Kernel} for matrix products whose kernel (summation
        order, accumulator, tensor core) is known, keyed by "module.path:name#k" (one
        call), a module path (every matmul in that module) or an operation name ("linear").
        None bounds every matmul for any order with float32 accumulation.
    output : str or None, default None
        The field compared when the programs return a dict or a ModelOutput: None takes
        "logits" when present, else every tensor in it; a name not among the fields raises
        ValueError listing them. Tensor and tuple outputs take output=None.
    cast_inputs : bool, default False
        Give each program the inputs' floating tensors cast to its own parameter dtype
        (`batch.param_dtype`): triage(model, model_bf16, images, cast_inputs=True). Without
        it a bfloat16 target that fails on float32 inputs raises a ValueError saying so.
    logic_pass : bool or None, default None
        The pass that separates logic from precision (`logic`; report.logic): the target's
        program at the reference's precision, for a target nn.Module whose parameters are
        all bfloat16 or all float16 beside a float32/float64 reference nn.Module. None: run
        where possible and the first pass is Type-I (a second triage's cost); True: run
        whatever the verdict, or say why not (report.logic_note); False: never.

    Returns
    -------
    TriageReport
        The verdict, every check in trace order (with detection floors), the blamed operation,
        its ranked suspects and likely culprit, differing operation counts, the logic pass.

    Raises
    ------
    ValueError
        If reference or target is not callable, kernels is not a mapping to Kernel,
        inputs is not a tensor, a tuple or a dict, output is not a field of the programs'
        dict output, logic_pass is not True, False or None, or the two programs return
        outputs of different shapes.
    UnsupportedOperation
        If the target runs an operation no interval rule bounds (`supported` lists those
        that have one), or takes a float value out of torch (item, tolist, float).

    Examples
    --------
    A bfloat16 copy of a float32 model differs from it by round-off (Type-I); adding 0.01
    to the output is a bug, blamed on the add:

    >>> import copy
    >>> import torch
    >>> from torch import nn
    >>> from precisionlab.diagnose import triage
    >>> _ = torch.manual_seed(0)
    >>> model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    >>> x = torch.randn(3, 8)
    >>> low = copy.deepcopy(model).to(torch.bfloat16)
    >>> report = triage(model, lambda z: low(z.to(torch.bfloat16)), x)
    >>> report.verdict, report.operations, report.paired
    ('Type-I', 4, 3)
    >>> report = triage(model, lambda z: model(z) + 0.01, x)
    >>> report.verdict, report.blamed.op, report.blamed.outside
    ('Type-II', 'add#0', 12)

    An operation without an interval rule stops the triage with its name:

    >>> from precisionlab.diagnose import UnsupportedOperation
    >>> try:
    ...     triage(model, lambda z: model(z).cumprod(0), x)
    ... except UnsupportedOperation as error:
    ...     print(str(error).split(";")[0])
    triage cannot bound operation #3 'cumprod'
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
    if output is not None and not isinstance(output, str):
        raise ValueError(f"output must be the name of an output field or None; got {output!r}")
    if not isinstance(logic_pass, (bool, type(None))):
        raise ValueError(f"logic_pass must be True, False or None (automatic); got "
                         f"logic_pass={logic_pass!r}")
    rt = trace(reference, for_program(reference, ins, cast_inputs), "reference", output=output)
    tt = trace(target, for_program(target, ins, cast_inputs), "target", output=output)
    if len(rt.outputs) != len(tt.outputs) or any(a.shape != b.shape for a, b in
                                                 zip(rt.outputs, tt.outputs, strict=False)):
        raise ValueError("reference and target return outputs of different shapes: "
                         f"{[tuple(o.shape) for o in rt.outputs]} and "
                         f"{[tuple(o.shape) for o in tt.outputs]}")
    # Pairing. Contract: a module's output is paired with the reference module of the same path,
    # a final output with the reference's. Structure: an operation is paired with the reference's
    # of the same key (module path, name, occurrence) only when it computes the same expression:
    # equal output shapes, equal non-tensor arguments and integer/bool tensors (masks, indices),
    # float inputs that are paired outputs of each other or leaves that round to each other.
    # Anything else is bounded from its inputs and left unchecked (a correct rewrite may order
    # or name its operations differently; pairing those would compare different quantities).
    paths = any(r.path for r in rt.records) and any(r.path for r in tt.records)
    keyf = (lambda r: r.key) if paths else (lambda r: r.flat_key)
    by_key = {keyf(r): r for r in rt.records}
    contract: dict = {}  # target (i, j) -> (reference (i, j) or None, reference value)
    if paths:
        for path, (i, j) in tt.module_out.items():
            if path in rt.module_out:
                ri, rj = rt.module_out[path]
                o = rt.records[ri].outs[rj]
                if o.shape == tt.records[i].outs[j].shape:
                    contract[(i, j)] = ((ri, rj), o)
    for pos, src in enumerate(tt.final):
        if src is not None:
            contract[src] = (rt.final[pos], rt.outputs[pos])
    corr: dict = {}  # target (i, j) -> reference (i, j)
    anchor: dict = {}  # target (i, j) -> reference value
    leafpair: dict = {}  # (target index, id(leaf)) -> the reference's leaf
    matched: set = set()
    differs: dict = {}  # target index -> how its call differs from the reference's
    ref_fmt: dict = {}
    for rec in tt.records:
        p = by_key.get(keyf(rec))
        ok = False
        if p is not None and len(p.outs) == len(rec.outs) and all(
                a.shape == b.shape for a, b in zip(p.outs, rec.outs, strict=True)):
            ok, why, pairs = same_call(rec, p, corr)
            if ok:
                matched.add(rec.index)
                leafpair.update(pairs)
            elif why:
                differs[rec.index] = why
        for j in range(len(rec.outs)):
            k = (rec.index, j)
            if k in contract:
                corr_k, anchor[k] = contract[k]
                if corr_k is not None:
                    corr[k] = corr_k
            elif ok:
                corr[k], anchor[k] = (p.index, j), p.outs[j]
            if k in corr and rec.index not in ref_fmt:
                ref_fmt[rec.index] = bd.fmt_of(rt.records[corr[k][0]].outs[corr[k][1]].dtype)
            elif k in anchor and rec.index not in ref_fmt:
                ref_fmt[rec.index] = bd.fmt_of(anchor[k].dtype)
    # formats the reference computes in and its leaves' formats: an unpaired operation is bounded
    # in the coarsest of them too, and leaves are widened to cover a coarser reference copy
    ref_fmts = {bd.fmt_of(o.dtype) for r in rt.records for o in r.outs}
    ref_leaf_fmts = {bd.fmt_of(t.dtype) for r in rt.records for t in r.ins
                     if t.is_floating_point() and r.src.get(id(t)) is None}
    ref_leaf_fmts |= {bd.fmt_of(t.dtype) for t in ins
                      if isinstance(t, torch.Tensor) and t.is_floating_point()}

    # streaming: what an operation's consumers read (the hull of both programs' values for a
    # paired output, else its bound) is held only until its last consumer has been bounded
    last = {src: rec.index for rec in tt.records for src in rec.src.values() if src is not None}
    held: dict = {}
    checks = []
    declared = []
    # the boxes of small paired vectors (biases, norm weights), all in a few compiled passes
    small = [((r.index, id(t)), t, leafpair[(r.index, id(t))]) for r in tt.records for t in r.ins
             if (r.index, id(t)) in leafpair and t.ndim <= 1 and t.numel() <= _SMALL]
    boxes = dict(zip([k for k, _, _ in small], bd.leaf_pairs([(t, o) for _, t, o in small]),
                     strict=True))
    shown = Shown(tt, _op_label)  # each check's element, in a tensor the user's code holds
    for rec in tt.records:
        def get(t, rec=rec):
            src = rec.src.get(id(t))
            if src is None:
                other = leafpair.get((rec.index, id(t)))
                if other is not None:
                    box = boxes.get((rec.index, id(t)))
                    return box if box is not None else bd.leaf(t, other)
                return leaf_wide(t, ref_leaf_fmts)
            return held[src]

        def lazy(t, rec=rec):
            if rec.src.get(id(t)) is None and t.is_floating_point():
                return leaf_of(t, leafpair.get((rec.index, id(t))), ref_leaf_fmts)
            return get(t)
        get.lazy = lazy
        op = _op_label(rec)
        fmts = [bd.fmt_of(rec.outs[0].dtype)]
        if rec.index in ref_fmt:
            if ref_fmt[rec.index] not in fmts:
                fmts = coarser(fmts[0], ref_fmt[rec.index])
        else:
            fmts = coarsest({fmts[0]} | ref_fmts)
        ffmt = fmts[0] if len(fmts) == 1 else widest(fmts)  # for the detection floors
        dd = rec.index not in matched and any(id(t) in tt.dd for t in rec.ins) and not \
            same_choice(rec, by_key.get(keyf(rec)))
        if _on_hulls(rec, matched, anchor, by_key.get(keyf(rec))):
            bs = None  # each output checked against the hull of both programs' outputs
        elif rec.name in _CREATE:  # a constant: like a leaf (the reference may hold it coarser)
            bs = [leaf_wide(o, ref_fmts) for o in rec.outs]
        elif dd:  # masks or indices computed from float values may differ in the reference
            bs = union([unknown_choice(rec, get, f) for f in fmts])
        else:
            kernel = _declared(kernels, rec) if rec.name in _MATMULS else None
            try:
                per = [(bd.declared_mm(rec, get, kernel, f) if kernel is not None
                        else bd.bound(rec, get, f)) for f in fmts]
            except UnsupportedOperation as e:
                raise UnsupportedOperation(_unsupported(rec, str(e))) from None
            if kernel is not None:
                declared.append((op, kernel.describe()))
            bs = union(per)
        if bs is not None and len(bs) != len(rec.outs):
            raise RuntimeError(f"internal: the rule for {rec.name} gave {len(bs)} bounds for "
                               f"{len(rec.outs)} outputs")
        for j, o in enumerate(rec.outs):
            b = None if bs is None else bs[j]
            if b is not None and tuple(b.shape) != tuple(o.shape):
                raise RuntimeError(f"internal: the rule for {rec.name} gave shape {b.shape}, the "
                                   f"operation {tuple(o.shape)}")
            if (rec.index, j) not in anchor:
                if (rec.index, j) in last:
                    held[(rec.index, j)] = b
            else:
                label = op + (f"[{j}]" if len(rec.outs) > 1 else "")
                if b is None:
                    c, h = check_hull(rec.index, label, anchor[(rec.index, j)], o,
                                      ffmt if (rec.index, j) in contract else None)
                    h = h if (rec.index, j) in last else None
                else:
                    c, h = check_values(rec.index, label, b, anchor[(rec.index, j)], o,
                                        rec.name in bd.EXACT, (rec.index, j) in last,
                                        ffmt if (rec.index, j) in contract else None)
                if h is not None:
                    held[(rec.index, j)] = h
                checks.append(shown.apply(c, rec.index, j))
        for src in set(rec.src.values()) - {None}:
            if last[src] == rec.index:
                del held[src]
    # the suspects of the first failed check, ranked, and differing operation counts (`blame`)
    counts = count_differences(rt.records, tt.records, paths)
    bad = next((c for c in checks if c.verdict == "Type-II"), None)
    found = Blame((), "") if bad is None else explain(
        tt.records, rt.records, bad.index, anchor, keyf, differs, _op_label, counts)
    report = TriageReport(
        "Type-I" if bad is None else "Type-II", tuple(checks), found.suspects, len(tt.records),
        len({c.index for c in checks}), tuple(declared), branches=len(rt.branches) +
        len(tt.branches), culprit=found.culprit, differences=tuple(c.text for c in counts))
    return with_logic_pass(report, logic_pass, reference, target, ins, lambda r, t, i: triage(
        r, t, i, kernels, output, cast_inputs, logic_pass=False))
