"""Which outputs depend on how the machine adds? Re-run a function under several thread counts
(and deterministic-algorithm settings, and on CUDA cuDNN's flags) and compare every output and
gradient entry with the first run, in units in the last place of its own format.

The ulp distance of two values of one format is the difference of their positions in the
format's ordered list of values: the bit patterns read as sign-magnitude integers.
"""

from __future__ import annotations

import contextlib
import sys
import textwrap
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from ..checks import check_count
from ..tables import Table
from .batch import as_inputs, call, for_program
from .report import Report, check_scalar_loss, fmt_share, new_axes, rows_fit, short

__all__ = ["DeterminismReport", "determinism", "ulp_distance"]

_INT_OF = {torch.float64: torch.int64, torch.float32: torch.int32, torch.float16: torch.int16,
           torch.bfloat16: torch.int16}


def ulp_distance(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """|ord(a) - ord(b)| per entry, ord the bit pattern as a sign-magnitude integer (0 = -0 = 0); NaN vs anything but NaN: -1.

    For float64, float32, float16 and bfloat16 tensors this counts the values of the format
    between a and b; for any other dtype it is 1 where the entries differ, else 0.

    Parameters
    ----------
    a, b : torch.Tensor
        Tensors of one dtype and shape.

    Returns
    -------
    torch.Tensor
        int64 distances of that shape: 0 for equal values (and for NaN against NaN), -1
        where exactly one of the two is NaN.

    Raises
    ------
    ValueError
        If a and b differ in dtype or shape.

    Examples
    --------
    >>> import torch
    >>> from precisionlab.diagnose import ulp_distance
    >>> a = torch.tensor([1.0, -0.0, 0.0, float("nan")])
    >>> b = torch.tensor([1.0000001, 0.0, 1.4e-45, 1.0])  # 1 + 2^-23, 2^-149
    >>> ulp_distance(a, b).tolist()
    [1, 0, 1, -1]
    >>> ulp_distance(torch.tensor([-1.0], dtype=torch.bfloat16),
    ...              torch.tensor([1.0], dtype=torch.bfloat16)).tolist()
    [32512]
    """
    if a.dtype != b.dtype or a.shape != b.shape:
        raise ValueError(f"a and b must share dtype and shape; got {a.dtype} {tuple(a.shape)} and "
                         f"{b.dtype} {tuple(b.shape)}")
    if a.dtype not in _INT_OF:
        return (a != b).to(torch.int64)
    it = _INT_OF[a.dtype]
    bits = 8 * a.element_size()
    top = 1 << (bits - 1)

    def order(x):
        i = x.contiguous().view(it).to(torch.int64)
        if bits == 64:  # sign bit set: negative magnitudes
            return torch.where(i < 0, -(i & 0x7FFFFFFFFFFFFFFF), i)
        i = torch.where(i < 0, i + (1 << bits), i)  # the unsigned pattern
        return torch.where(i >= top, -(i - top), i)

    oa, ob = order(a), order(b)
    same = (oa >= 0) == (ob >= 0)  # no int64 overflow; across signs a float64 sum is enough
    d = torch.where(same, (oa - ob).abs(),
                    (oa.to(torch.float64).abs() + ob.to(torch.float64).abs())
                    .clamp(max=2.0**62).to(torch.int64))
    na, nb = torch.isnan(a), torch.isnan(b)
    d = torch.where(na & nb, torch.zeros_like(d), d)
    return torch.where(na ^ nb, torch.full_like(d, -1), d)


@dataclass(frozen=True)
class Change:
    """One tensor under one setting against the baseline: entries that changed and by how many ulps."""

    tensor: str
    setting: str
    numel: int
    changed: int
    max_ulps: int  # -1: a NaN appeared or vanished


@dataclass(frozen=True)
class DeterminismReport(Report):
    """determinism()'s result: the settings run, and per tensor and setting what changed.

    Attributes
    ----------
    baseline : str
        The first setting's label ("1 thread"), which every other run is compared with.
    settings : tuple of str
        Every setting's label, baseline first: "repeat 1", ..., "2 threads", ...,
        "deterministic".
    tensors : tuple of str
        The compared tensors' names: "output" (or "output[0]", "output['logits']", ...),
        then "grad <parameter>" with loss_fn.
    changes : tuple
        One record per tensor and non-baseline setting, with fields tensor, setting,
        numel, changed (entries that differ) and max_ulps (-1: a NaN appeared or vanished).
    """

    baseline: str
    settings: tuple  # setting labels, baseline first
    tensors: tuple  # tensor names, outputs then gradients
    changes: tuple  # Change per (tensor, non-baseline setting)
    title: str = "outputs that depend on the machine's order of additions"

    def changed(self, tensor: str | None = None) -> int:
        """Entries that differ from the baseline under some setting (one tensor or all).

        Parameters
        ----------
        tensor : str or None, default None
            One of `tensors`; None adds up all of them.

        Returns
        -------
        int
            Changed entries, summed over the non-baseline settings.
        """
        return sum(c.changed for c in self.changes if tensor is None or c.tensor == tensor)

    @property
    def sensitive(self) -> tuple:
        """Names of the tensors that changed under at least one setting."""
        return tuple(t for t in self.tensors if any(c.tensor == t and c.changed for c in self.changes))

    def summary(self) -> str:
        """Which tensors changed, against which baseline.

        Returns
        -------
        str
            The baseline and the settings compared; the tensors that changed, or "none".
        """
        s = self.sensitive
        what = ", ".join(s[:4]) + (f" (+{len(s) - 4})" if len(s) > 4 else "") if s else "none"
        head = f"baseline {self.baseline}; settings compared: {', '.join(self.settings[1:])}"
        return "\n".join([head, *textwrap.wrap(f"tensors that changed: {what}", 80,
                                                subsequent_indent="  ")])

    def table(self, limit: int = 24) -> Table:
        """Per tensor and setting: share of entries changed and the largest change in ulps.

        Parameters
        ----------
        limit : int, default 24
            The most tensors shown; a last row says how many were left out.

        Returns
        -------
        Table
            One row per tensor, one column per non-baseline setting: "same", or the share
            changed and the largest distance ("0.5%, 3 ulp"; "NaN" where a NaN appeared or
            vanished).
        """
        heads = ["tensor", "entries"] + [short(s, 14) for s in self.settings[1:]]
        rows = []
        for t in self.tensors:
            cs = [c for c in self.changes if c.tensor == t]
            cells = []
            for c in cs:
                if not c.changed:
                    cells.append("same")
                else:
                    u = "NaN" if c.max_ulps < 0 else f"{c.max_ulps} ulp"
                    cells.append(f"{fmt_share(c.changed / c.numel)}, {u}")
            rows.append([short(t, 26), str(cs[0].numel if cs else 0), *cells])
        return Table(heads, rows_fit(rows, limit))

    def plot(self, ax=None):
        """Share of entries changed per tensor (bars), one colour per setting.

        Parameters
        ----------
        ax : matplotlib.axes.Axes or None, default None
            The Axes to draw on; None draws on a new figure.

        Returns
        -------
        matplotlib.axes.Axes
            The Axes drawn on.
        """
        ax = new_axes(ax)
        settings = self.settings[1:]
        w = 0.8 / max(len(settings), 1)
        x = np.arange(len(self.tensors))
        for j, s in enumerate(settings):
            share = [next((c.changed / c.numel for c in self.changes
                           if c.tensor == t and c.setting == s and c.numel), 0.0)
                     for t in self.tensors]
            ax.bar(x + j * w, share, width=w, label=s)
        ax.set_xticks(x + w * (len(settings) - 1) / 2)
        ax.set_xticklabels([short(t, 18) for t in self.tensors], rotation=60, ha="right", fontsize=7)
        ax.set_ylabel("share of entries changed")
        ax.legend(fontsize=7)
        return ax


def _set_deterministic(mode: bool, warn_only: bool) -> None:
    """torch.use_deterministic_algorithms(mode, warn_only=warn_only), lazily.

    That call also sets the flag of torch's compiler (torch._inductor.config.deterministic),
    importing the compiler to do so (about a second, cold). Only a compiled program reads that
    flag, and nothing is compiled before torch.compile has imported torch._dynamo: until then
    torch.set_deterministic_debug_mode sets the same eager flags ("warn": on, warnings only;
    "error": on; "default": off) without the import.
    """
    if "torch._dynamo" in sys.modules:
        torch.use_deterministic_algorithms(mode, warn_only=warn_only)
    else:
        torch.set_deterministic_debug_mode(
            "default" if not mode else "warn" if warn_only else "error")


@contextlib.contextmanager
def _setting(threads: int | None, deterministic: bool):
    old_t = torch.get_num_threads()
    old_d = torch.are_deterministic_algorithms_enabled()
    old_w = torch.is_deterministic_algorithms_warn_only_enabled()
    old_c = (torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark)
    try:
        if threads is not None:
            torch.set_num_threads(threads)
        if deterministic:
            _set_deterministic(True, warn_only=True)
            torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = True, False
        yield
    finally:
        torch.set_num_threads(old_t)
        _set_deterministic(old_d, warn_only=old_w)
        torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = old_c


def _flatten(out, name="output") -> list[tuple[str, torch.Tensor]]:
    if isinstance(out, torch.Tensor):
        return [(name, out)]
    if isinstance(out, (tuple, list)):
        res = []
        for i, o in enumerate(out):
            res += _flatten(o, f"{name}[{i}]")
        return res
    if isinstance(out, dict):
        res = []
        for k, o in out.items():
            res += _flatten(o, f"{name}[{k!r}]")
        return res
    return []


def _run(fn, inputs, loss_fn, params):
    with torch.enable_grad() if loss_fn is not None else torch.no_grad():
        out = call(fn, inputs, "fn")
        named = [(n, t.detach().clone()) for n, t in _flatten(out)]
        if not named:
            raise ValueError(f"fn must return a tensor or a tuple/list/dict of tensors; got "
                             f"{type(out).__name__}")
        if loss_fn is not None:
            loss = check_scalar_loss(loss_fn(out))
            grads = torch.autograd.grad(loss, [p for _, p in params], allow_unused=True)
            named += [(f"grad {n}", torch.zeros_like(p) if g is None else g.detach())
                      for (n, p), g in zip(params, grads, strict=True)]
    return named


def determinism(fn, inputs, threads: Sequence[int] = (1, 2, 4), deterministic: bool = True,
                repeats: int = 1, loss_fn: Callable | None = None,
                cast_inputs: bool = False) -> DeterminismReport:
    """Run fn(*inputs) with each thread count (then, if deterministic, with
    torch.use_deterministic_algorithms and cuDNN's deterministic flags; repeats: extra runs of
    the first setting) and count, per output and gradient entry, |ord(x) - ord(x_baseline)| > 0.

    loss_fn(output) -> scalar adds the gradients of fn's parameters (fn a Module) to the comparison.
    Every run starts from the same random seed, so dropout and other random draws are the same.

    Parameters
    ----------
    fn : torch.nn.Module or callable
        fn(*inputs) returns a tensor, or a tuple, list or dict of tensors (nested; a
        Hugging Face ModelOutput is a dict).
    inputs : torch.Tensor, tuple or dict
        A tensor, a non-empty tuple or list of positional inputs, or a dict of keyword
        inputs (a tokenizer's input_ids and attention_mask), passed as fn(**inputs).
    threads : sequence of int
        Thread counts (torch.set_num_threads), each >= 1; the first is the baseline.
        Default: (1, 2, 4).
    deterministic : bool, default True
        Also run once with torch.use_deterministic_algorithms(True, warn_only=True) and
        cuDNN's deterministic flags (cudnn.benchmark off).
    repeats : int, default 1
        Extra runs of the baseline setting (>= 0): differences there are run-to-run
        nondeterminism, not the thread count.
    loss_fn : callable or None, default None
        loss_fn(output) -> a scalar loss; compares the gradients of fn's parameters too
        (fn must then be a Module with trainable parameters).
    cast_inputs : bool, default False
        Cast the inputs' floating tensors to the parameter dtype of fn's Module (a bfloat16
        image model given float32 images); integer ids and masks are never cast.

    Returns
    -------
    DeterminismReport
        Per output and gradient tensor and per setting, the entries that changed from the
        baseline and the largest change in ulps. Every setting changed is put back.

    Raises
    ------
    ValueError
        If fn or loss_fn is not callable, inputs is not a tensor, a tuple or a dict, threads is
        empty or holds a non-positive integer, repeats is negative, loss_fn is given for an
        fn that is not a Module with trainable parameters, fn returns no tensor, or loss_fn
        returns no scalar loss.

    Examples
    --------
    The deterministic run sets torch's eager flags without importing torch's compiler
    (torch.use_deterministic_algorithms would, about a second cold) unless the process has
    already imported it for torch.compile, when that call also sets the compiler's flag.

    >>> import torch
    >>> from torch import nn
    >>> from precisionlab.diagnose import determinism
    >>> _ = torch.manual_seed(0)
    >>> layer = nn.Linear(4, 2)
    >>> report = determinism(layer, torch.randn(3, 4), threads=(1, 2),
    ...                      loss_fn=lambda out: out.sum())
    >>> report.settings
    ('1 thread', 'repeat 1', '2 threads', 'deterministic')
    >>> report.tensors
    ('output', 'grad weight', 'grad bias')
    >>> [c.numel for c in report.changes if c.setting == "2 threads"]
    [6, 8, 2]

    `report.changed()` and `report.sensitive` then say what moved, and `print(report)`
    tabulates it; which entries move depends on the CPU and the kernels torch picks there,
    so their counts are not printed here.
    """
    if not callable(fn):
        raise ValueError(f"fn must be callable (a Module or a function); got {type(fn).__name__}")
    ins = for_program(fn, as_inputs(inputs, "inputs"), cast_inputs)
    ts = tuple(threads)
    if not ts or any(isinstance(t, bool) or not isinstance(t, int) or t < 1 for t in ts):
        raise ValueError(f"threads must be a non-empty list of positive integers; got {threads!r}")
    check_count(repeats, "repeats", 0)
    if loss_fn is not None and not callable(loss_fn):
        raise ValueError(f"loss_fn must be callable or None; got {loss_fn!r}")
    params = []
    if loss_fn is not None:
        if not isinstance(fn, torch.nn.Module):
            raise ValueError("loss_fn needs fn to be a torch.nn.Module (its parameters get gradients)")
        params = [(n, p) for n, p in fn.named_parameters() if p.requires_grad]
        if not params:
            raise ValueError("fn has no parameters with requires_grad=True for loss_fn's gradients")
    plan = [(f"{ts[0]} thread" + ("s" if ts[0] > 1 else ""), ts[0], False)]
    plan += [(f"repeat {i + 1}", ts[0], False) for i in range(repeats)]
    plan += [(f"{t} threads" if t > 1 else "1 thread", t, False) for t in ts[1:]]
    if deterministic:
        plan.append(("deterministic", ts[0], True))
    devices = [torch.cuda.current_device()] if torch.cuda.is_available() else []
    with torch.random.fork_rng(devices=[]):  # every run draws the same random numbers
        seed = int(torch.randint(0, 2**62, (1,)))
    base = None
    changes = []
    for label, t, d in plan:  # each run compared with the baseline as it ends, then dropped
        with _setting(t, d), torch.random.fork_rng(devices=devices):
            torch.manual_seed(seed)
            run = _run(fn, ins, loss_fn, params)
        if base is None:
            base = run
            continue
        for (name, b), (_, x) in zip(base, run, strict=True):
            if x.dtype == b.dtype and x.shape == b.shape and torch.equal(x, b):
                n_changed = mx = 0  # equal values (NaN never is): every distance is 0
            else:
                dist = ulp_distance(x, b)
                n_changed = int((dist != 0).sum())
                mx = -1 if bool((dist < 0).any()) else int(dist.max()) if dist.numel() else 0
            changes.append(Change(name, label, b.numel(), n_changed, mx))
        del run
    return DeterminismReport(plan[0][0], tuple(p[0] for p in plan), tuple(n for n, _ in base),
                             tuple(changes))
