"""Which operation made the first inf or NaN, and which of the book's mechanisms fits (`watch`).

Forward: the module whose output is first not finite is re-run once on (clones of) the
inputs it got, under a `torch.overrides.TorchFunctionMode` that stops at the first torch
function whose output is not finite; the function is named as triage names operations
("path: name#k"), and `forward_mechanism` matches its inputs and output against the
mechanisms of `watch_report.MECHANISMS`. The re-run writes to clones of the module's buffers
(`scratch_buffers`) and gives the random number generators back their states (the default ones
forked, a generator= of the model's own through `KeepGenerators`), so the training run's
numbers do not change.
Backward: a gradient that is first not finite is matched by `backward_mechanism`.
"""

from __future__ import annotations

import contextlib
import math

import torch
from torch.overrides import TorchFunctionMode

from .batch import tensors
from .watch_report import TensorRange

__all__ = ["FirstOp", "KeepGenerators", "backward_mechanism", "detached_copy",
           "forward_mechanism", "replay", "scratch_buffers", "tensor_range"]

_NORMS = frozenset({"batch_norm", "instance_norm"})  # (input, running_mean, running_var,
#   weight, bias, training, ...)
_SOFTMAX = frozenset({"softmax", "log_softmax", "_softmax", "_log_softmax"})
_ATTENTION = frozenset({"scaled_dot_product_attention", "multi_head_attention_forward"})
_LOGS = frozenset({"log", "log2", "log10", "log_"})
_DIV_BY_SECOND = frozenset({"div", "__truediv__", "true_divide", "divide", "div_", "__itruediv__",
                            "floor_divide", "__floordiv__", "remainder", "fmod"})
_DIV_BY_FIRST = frozenset({"__rtruediv__", "__rdiv__", "reciprocal", "rsqrt", "reciprocal_",
                           "rsqrt_"})
_MASKING = frozenset({"masked_fill", "masked_fill_", "where", "full", "full_like", "fill_",
                      "new_full", "__setitem__", "triu", "tril", "masked_scatter", "zeros_like",
                      "fill", "index_fill", "index_fill_"})
_INERT = frozenset({"size", "dim", "shape", "dtype", "device", "numel", "is_floating_point",
                    "stride", "ndim", "__len__", "requires_grad", "is_contiguous", "__get__"})


def tensor_range(t: torch.Tensor, name: str) -> TensorRange:
    """The range of a tensor: min, max and amax of its finite entries, NaN and inf counts.

    Parameters
    ----------
    t : torch.Tensor
        Any floating-point tensor.
    name : str
        What the range is called ("input 0", "output", "weight").

    Returns
    -------
    TensorRange
        The range (min, max, amax NaN for a tensor with no finite entry).

    Examples
    --------
    >>> import torch
    >>> from precisionlab.diagnose.watch_cause import tensor_range
    >>> r = tensor_range(torch.tensor([1.0, float("inf"), -2.0]), "x")
    >>> r.min, r.max, r.amax, r.inf
    (-2.0, 1.0, 2.0, 1)
    """
    x = t.detach().reshape(-1)
    if getattr(x, "to_local", None) is not None:  # a DTensor: this rank's shard
        x = x.to_local().reshape(-1)
    nan = int(torch.isnan(x).sum()) if x.is_floating_point() else 0
    inf = int(torch.isinf(x).sum()) if x.is_floating_point() else 0
    fin = x[torch.isfinite(x)] if (nan or inf) else x
    if fin.numel():
        lo, hi = (float(v) for v in torch.aminmax(fin.double()))
    else:
        lo = hi = math.nan
    return TensorRange(name, tuple(t.shape), str(t.dtype).removeprefix("torch."), lo, hi,
                       max(-lo, hi) if fin.numel() else math.nan, nan, inf)


def _finite(t: torch.Tensor) -> bool:
    return bool(torch.isfinite(t).all())


def _arg(args, kwargs, i: int, name: str, default=None):
    if name in kwargs:
        return kwargs[name]
    return args[i] if len(args) > i else default


def _masked_rows(mask, dim: int = -1, keep_true: bool = False) -> int:
    """Rows of an attention mask in which every position is masked: a float mask all -inf, a
    bool mask all False (keep_true: True means attend, as in scaled_dot_product_attention) or
    all True (True means masked, as in nn.MultiheadAttention)."""
    if not isinstance(mask, torch.Tensor) or mask.numel() == 0:
        return 0
    if mask.dtype == torch.bool:
        full = (~mask).all(dim) if keep_true else mask.all(dim)
    else:
        full = (mask == -math.inf).all(dim)
    return int(full.sum())


def forward_mechanism(name: str, args: tuple, kwargs: dict, out: torch.Tensor,
                      params: frozenset = frozenset()) -> tuple[str, str]:
    """(mechanism, detail) of a torch function `name` whose output `out` is not finite.

    Rules, in order: softmax/log_softmax over a row that is all -inf, or attention whose mask
    masks every key of a row -> "softmax_masked_row"; a log whose input holds 0 -> "log_zero";
    a division (div, reciprocal, rsqrt, ...) whose denominator holds 0 or a subnormal ->
    "div_underflowed_norm"; an input already not finite -> "nonfinite_weight" (a parameter,
    by id in params) or "nonfinite_input"; inf out of finite inputs -> "overflow" (past the
    output dtype's largest finite value); otherwise -> "invalid".

    Parameters
    ----------
    name : str
        The torch function's name ("linear", "softmax", "__truediv__", ...).
    args, kwargs : tuple, dict
        Its arguments.
    out : torch.Tensor
        Its output that is not finite.
    params : frozenset of int
        id() of the model's parameters.

    Returns
    -------
    tuple of str
        The mechanism key of `watch_report.MECHANISMS` and a line with the numbers.

    Examples
    --------
    >>> import torch
    >>> from precisionlab.diagnose.watch_cause import forward_mechanism
    >>> x = torch.tensor([[0.0, -float("inf")], [-float("inf"), -float("inf")]])
    >>> forward_mechanism("softmax", (x, -1), {}, torch.softmax(x, -1))[0]
    'softmax_masked_row'
    >>> a = torch.tensor([300.0], dtype=torch.float16)
    >>> forward_mechanism("mul", (a, a), {}, a * a)
    ('overflow', 'float16 result inf: |value| above 65504, from inputs up to 300')
    """
    ins = [t for t in tensors(list(args)) + tensors(list(kwargs.values()))
           if t.is_floating_point()]
    if name in _NORMS and _arg(args, kwargs, 5, "training", False) is True:
        # in training the running statistics are written, not read (and a re-run after the
        # forward sees them already updated with this batch): not the output's cause
        stats = {id(_arg(args, kwargs, k, n)) for k, n in ((1, "running_mean"),
                                                            (2, "running_var"))}
        ins = [t for t in ins if id(t) not in stats]
    nan, inf = int(torch.isnan(out).sum()), int(torch.isinf(out).sum())
    if name in _SOFTMAX:
        x, dim = _arg(args, kwargs, 0, "input"), _arg(args, kwargs, 1, "dim", -1)
        rows = _masked_rows(x, dim if isinstance(dim, int) else -1) if isinstance(
            x, torch.Tensor) else 0
        if rows:
            return "softmax_masked_row", (f"{rows} rows of {name}'s input are all -inf: "
                                          f"{nan} NaN out")
    if name in _ATTENTION:
        if name == "scaled_dot_product_attention":
            rows = _masked_rows(_arg(args, kwargs, 3, "attn_mask"), keep_true=True)
        else:
            rows = (_masked_rows(kwargs.get("key_padding_mask"))
                    + _masked_rows(kwargs.get("attn_mask")))
        if rows:
            return "softmax_masked_row", f"{rows} rows of the attention mask mask every key"
    if name in _LOGS:
        x = _arg(args, kwargs, 0, "input")
        zeros = int((x == 0).sum()) if isinstance(x, torch.Tensor) else 0
        if zeros:
            return "log_zero", f"{zeros} entries of {name}'s input are 0: -inf out"
    den = None
    if name in _DIV_BY_SECOND:
        den = _arg(args, kwargs, 1, "other")
    elif name in _DIV_BY_FIRST:
        den = _arg(args, kwargs, 0, "input")
    if den is not None:
        if isinstance(den, torch.Tensor) and den.is_floating_point():
            tiny = torch.finfo(den.dtype).tiny
            zero, small = int((den == 0).sum()), int(((den != 0) & (den.abs() < tiny)).sum())
        else:
            zero, small = int(den == 0), 0
        if zero or small:
            return "div_underflowed_norm", (f"the denominator of {name} holds {zero} zeros "
                                            f"and {small} subnormals: {nan} NaN, {inf} inf out")
    bad = [t for t in ins if not _finite(t)]
    if bad:
        kind = "nonfinite_weight" if any(id(t) in params for t in bad) else "nonfinite_input"
        r = tensor_range(bad[0], "input")
        return kind, f"{name}'s input {list(r.shape)} holds {r.nan} NaN and {r.inf} inf"
    top = torch.finfo(out.dtype).max
    wide = [t for t in ins if t.dtype.itemsize > out.dtype.itemsize]
    amax = max((tensor_range(t, "").amax for t in wide), default=0.0)
    if amax > top:  # autocast casts the input down to out's dtype: there it overflows
        return "overflow", (f"an input up to {amax:.3g} is past "
                            f"{str(out.dtype).removeprefix('torch.')}'s largest finite value "
                            f"{top:.6g}: {nan} NaN and {inf} inf out")
    if inf and not nan:
        amax = max((tensor_range(t, "").amax for t in ins), default=math.nan)
        return "overflow", (f"{str(out.dtype).removeprefix('torch.')} result inf: |value| above "
                            f"{top:.6g}, from inputs up to {amax:.3g}")
    return "invalid", f"{name} gave {nan} NaN and {inf} inf from finite inputs"


def backward_mechanism(g: torch.Tensor, scale: float | None) -> tuple[str, str]:
    """(mechanism, detail) of a gradient that is not finite: "scaled_grad_overflow" under a
    loss scale above 1, else "grad_overflow" (inf) or "invalid" (NaN only).

    Parameters
    ----------
    g : torch.Tensor
        The gradient.
    scale : float or None
        The loss scale in force (None without a GradScaler).

    Returns
    -------
    tuple of str
        The mechanism key and a line with the counts.

    Examples
    --------
    >>> import torch
    >>> from precisionlab.diagnose.watch_cause import backward_mechanism
    >>> backward_mechanism(torch.tensor([float("inf"), 1.0]), 65536.0)[0]
    'scaled_grad_overflow'
    """
    r = tensor_range(g, "gradient")
    counts = f"{r.inf} inf and {r.nan} NaN of {math.prod(r.shape)} gradient entries"
    if scale is not None and scale > 1:
        return "scaled_grad_overflow", f"{counts} at loss scale {scale:.6g}"
    if r.inf:
        return "grad_overflow", counts
    return "invalid", counts


class FirstOp:
    """The torch function of a re-run that made the first inf/NaN: its label ("path: name#k"),
    name, arguments, output and module path, and whether it is a deliberate mask (a
    masked_fill or full with -inf, which `watch` does not report); `replay` fills it."""

    def __init__(self):
        self.label = ""
        self.name = ""
        self.args: tuple = ()
        self.kwargs: dict = {}
        self.out = None
        self.path = ""
        self.mask = False


def _has(ts, what) -> bool:
    return any(bool(what(t).any()) for t in ts)


class _FirstNonFinite(TorchFunctionMode):
    """Finds the origin: the first call whose output holds NaN where no input does, or inf
    where every input is finite (masking calls aside); else the first non-finite output."""

    def __init__(self, stack: list):
        super().__init__()
        self.stack, self.counts = stack, {}
        self.origin = self.first = self.masking = None

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        name = getattr(func, "__name__", None) or str(func)
        if self.origin is not None or name in _INERT:
            return out
        path = self.stack[-1] if self.stack else ""
        k = self.counts[(path, name)] = self.counts.get((path, name), -1) + 1
        bad = [o for o in tensors(out) if o.is_floating_point() and not _finite(o)]
        if not bad:
            return out
        op = FirstOp()
        op.label, op.name, op.path, op.out = f"{path + ': ' if path else ''}{name}#{k}", \
            name, path, bad[0]
        op.args, op.kwargs = args, kwargs
        ins = [t for t in tensors(list(args)) + tensors(list(kwargs.values()))
               if t.is_floating_point()]
        nan_out = _has(bad, torch.isnan)
        if name in _MASKING and not nan_out:
            op.mask = True
            self.masking = self.masking or op
        elif (nan_out and not _has(ins, torch.isnan)) or all(_finite(t) for t in ins):
            self.origin = op
        elif self.first is None:
            self.first = op
        return out


def detached_copy(obj):
    """obj with every tensor in it (in lists, tuples, named tuples, dicts) detached and cloned."""
    if isinstance(obj, torch.Tensor):
        return obj.detach().clone()
    if isinstance(obj, (list, tuple)):
        return type(obj)(detached_copy(o) for o in obj) if not hasattr(obj, "_fields") else \
            type(obj)(*(detached_copy(o) for o in obj))
    if isinstance(obj, dict):
        return {k: detached_copy(v) for k, v in obj.items()}
    return obj


def replay(module: torch.nn.Module, path: str, args: tuple, kwargs: dict) -> FirstOp | None:
    """Re-run module.forward on clones of (args, kwargs) and return the first torch function
    whose output is not finite (None if none is, or the re-run fails); the module's buffers
    and the random number generators are restored afterwards, its hooks are not called.

    Parameters
    ----------
    module : torch.nn.Module
        The module whose output was not finite.
    path : str
        Its path in the model ("" for the model itself).
    args, kwargs : tuple, dict
        The inputs it got.

    Returns
    -------
    FirstOp or None
        The operation, its arguments and output.

    Examples
    --------
    >>> import torch
    >>> from torch import nn
    >>> from precisionlab.diagnose.watch_cause import replay
    >>> op = replay(nn.Softmax(-1), "attn", (torch.full((1, 2), -float("inf")),), {})
    >>> op.label, op.mask
    ('attn: softmax#0', False)
    >>> replay(nn.Softmax(-1), "attn", (torch.zeros(1, 2),), {}) is None
    True
    """
    stack = [path]
    names = {id(m): ".".join(x for x in (path, n) if x) for n, m in module.named_modules()}

    def pre(m, _a):
        stack.append(names.get(id(m), stack[-1]))

    def post(m, _a, _o):
        stack.pop()
    hooks = []
    for n, m in module.named_modules():
        if n:
            hooks += [m.register_forward_pre_hook(pre), m.register_forward_hook(post)]
    devices = sorted({p.device.index or 0 for p in module.parameters() if p.device.type == "cuda"})
    try:
        a, kw = detached_copy(tuple(args)), detached_copy(dict(kwargs))
        with torch.random.fork_rng(devices=devices), torch.no_grad(), \
                scratch_buffers(module), KeepGenerators(), _FirstNonFinite(stack) as mode:
            module.forward(*a, **kw)
        found = mode.origin or mode.first or mode.masking
    except Exception:  # a re-run that fails: the module is named, not the function
        found = None
    finally:
        for h in hooks:
            h.remove()
    return found


@contextlib.contextmanager
def scratch_buffers(module: torch.nn.Module, values: dict | None = None):
    """Within: each buffer of module replaced by a clone (of values[name] where given, its
    dotted name in module), so that a forward run within writes to the clones; afterwards the
    module's own buffer tensors are back, untouched: their values and their version counters
    (a batch norm's running statistics, saved for the step's backward, stay valid for it).

    Examples
    --------
    >>> import torch
    >>> from torch import nn
    >>> from precisionlab.diagnose.watch_cause import scratch_buffers
    >>> bn = nn.BatchNorm1d(2)
    >>> mean, version = bn.running_mean, bn.running_mean._version
    >>> with scratch_buffers(bn):
    ...     _ = bn(torch.randn(4, 2) + 5)
    >>> bn.running_mean is mean, float(mean.abs().max()), mean._version == version
    (True, 0.0, True)
    """
    values = values or {}
    own, clones = [], {}
    for prefix, m in module.named_modules():
        for n, b in m.named_buffers(recurse=False):
            if b is None:
                continue
            full = f"{prefix}.{n}" if prefix else n
            if id(b) not in clones:  # a buffer shared by two modules stays shared
                src = values.get(full, b)
                clones[id(b)] = src.detach().clone()
            own.append((m, n, b))
            setattr(m, n, clones[id(b)])
    try:
        yield
    finally:
        for m, n, b in own:
            setattr(m, n, b)


class KeepGenerators(TorchFunctionMode):
    """Within: every torch.Generator passed to a torch function (generator=...) gets back, at
    the exit, the state it had when first used within, so that a re-run draws nothing from a
    generator of the model's own (the default generators are forked by the caller)."""

    def __init__(self):
        super().__init__()
        self.states: dict[int, tuple[torch.Generator, torch.Tensor]] = {}

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        for g in (*args, *kwargs.values()):
            if isinstance(g, torch.Generator) and id(g) not in self.states:
                self.states[id(g)] = (g, g.get_state())
        return func(*args, **kwargs)

    def __exit__(self, *exc):
        try:
            return super().__exit__(*exc)
        finally:
            for g, state in self.states.values():
                g.set_state(state)

