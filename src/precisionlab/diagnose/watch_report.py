"""What `watch` found over a training run, as plain data: per-layer statistics of the recorded
steps (`LayerStats`), each first inf/NaN of a step (`NonFinite`, with its `TensorRange`s and the
mechanism that fits, from `MECHANISMS`), each step a GradScaler skipped (`SkippedStep`), and the
`WatchReport` over them: a summary, a table per layer and kind, `.plot()` of the headroom over
the steps, and the JSON-lines records the watch writes.
"""

from __future__ import annotations

import math
import textwrap
from dataclasses import dataclass, field

import numpy as np

from ..formats import get_format, short_name
from ..tables import Table
from .report import Report, fmt_num, fmt_share, new_axes, rows_fit, short

__all__ = ["KINDS", "MECHANISMS", "LayerStats", "NonFinite", "SkippedStep", "TensorRange",
           "WatchReport", "headroom"]

# kinds of tensor a leaf module's statistics are taken of
KINDS: tuple[str, ...] = ("activation", "output grad", "param grad")

# mechanism -> (chapter, what happened, what to do)
MECHANISMS: dict[str, tuple[int, str, str]] = {
    "overflow": (1, "overflow past the format's largest finite value",
                 "a result above the largest finite value (float16: 65504) rounds to inf from "
                 "finite inputs; run this operation in float32 or bfloat16, or scale its "
                 "inputs down"),
    "softmax_masked_row": (7, "softmax over a row that is all -inf",
                           "every entry of a row is masked to -inf, so softmax divides 0 by 0; "
                           "fill masks with a finite minimum or drop fully masked rows"),
    "log_zero": (4, "log of 0",
                 "a value (a probability) underflowed to 0 and its log is -inf; use "
                 "log_softmax, or clamp before the log"),
    "div_underflowed_norm": (4, "division by an underflowed norm",
                             "the denominator (a norm, a variance, a count) is 0 or subnormal; "
                             "add an eps inside it, or compute it in float32"),
    "scaled_grad_overflow": (5, "gradient overflow under loss scaling",
                             "loss scale x gradient overflowed in the backward; GradScaler "
                             "skips this step and halves the scale (expected now and then; "
                             "every step means the model overflows float16 anyway)"),
    "grad_overflow": (5, "gradient overflow without loss scaling",
                      "a gradient overflowed in the backward and nothing skips the step; use a "
                      "GradScaler, bfloat16, or clip the loss"),
    "nonfinite_weight": (5, "a weight already holds inf or NaN",
                         "an earlier optimizer step applied a non-finite gradient; a GradScaler "
                         "skips such steps"),
    "nonfinite_input": (1, "an input already holds inf or NaN",
                        "the batch (or a tensor from outside the model) is not finite"),
    "invalid": (1, "an invalid operation (0/0, inf - inf, 0 x inf, sqrt of a negative)",
                "NaN from finite inputs; torch.autograd.detect_anomaly names a backward "
                "function"),
}


def _fill(line: str, width: int = 80) -> str:
    """line wrapped at width, continuation lines indented 2 more than its own indent."""
    pad = " " * (len(line) - len(line.lstrip()))
    return textwrap.fill(line, width, initial_indent="", subsequent_indent=pad + "  ",
                         break_long_words=False, break_on_hyphens=False)


def headroom(amax: float, fmt) -> float:
    """log2(max_finite / amax) in binades: inf for amax = 0, -inf for inf, NaN for NaN.

    Parameters
    ----------
    amax : float
        The largest magnitude of a tensor.
    fmt : str or FloatFormat
        The format whose largest finite value is the top.

    Returns
    -------
    float
        The headroom; negative means the amax overflows the format.

    Examples
    --------
    >>> from precisionlab.diagnose.watch_report import headroom
    >>> headroom(65504 / 8, "float16")
    3.0
    """
    if math.isnan(amax):
        return math.nan
    if amax == 0:
        return math.inf
    if math.isinf(amax):
        return -math.inf
    return math.log2(get_format(fmt).max_finite / amax)


def _num(x):
    """x for JSON: None for inf/NaN."""
    return x if isinstance(x, (int, str)) or (x is not None and math.isfinite(x)) else None


@dataclass(frozen=True)
class TensorRange:
    """One tensor's range: name, shape, dtype, min, max, amax, NaN and inf counts."""

    name: str
    shape: tuple
    dtype: str
    min: float
    max: float
    amax: float
    nan: int
    inf: int

    def __str__(self) -> str:
        bad = f"{self.nan} NaN, {self.inf} inf" if self.nan or self.inf else ""
        if self.min != self.min:  # no finite entry: say so, not [nan, nan]
            return f"{self.name} {list(self.shape)} {self.dtype}: no finite entry ({bad})"
        finite = "finite entries in " if bad else ""
        return (f"{self.name} {list(self.shape)} {self.dtype}: {finite}[{fmt_num(self.min)}, "
                f"{fmt_num(self.max)}]" + (f", {bad}" if bad else ""))

    def to_dict(self) -> dict:
        """The range as JSON-ready values."""
        return {"name": self.name, "shape": list(self.shape), "dtype": self.dtype,
                "min": _num(self.min), "max": _num(self.max), "amax": _num(self.amax),
                "nan": self.nan, "inf": self.inf}


@dataclass(frozen=True)
class NonFinite:
    """The first inf or NaN of one step, forward or backward, and the mechanism that fits.

    op is the operation as triage names it ("path: name#k", the torch function inside the
    module, found by re-running its forward on the saved inputs) or the module's forward;
    inputs and output are their ranges; rank is the process's rank under torch.distributed.
    """

    step: int
    phase: str
    module: str
    op: str
    mechanism: str
    detail: str
    inputs: tuple[TensorRange, ...] = ()
    output: TensorRange | None = None
    rank: int = 0
    dump: str = ""

    @property
    def chapter(self) -> int:
        """The chapter that explains the mechanism."""
        return MECHANISMS[self.mechanism][0]

    def headline(self) -> str:
        """One line (unwrapped): where, which mechanism, the chapter."""
        chapter, what, _ = MECHANISMS[self.mechanism]
        where = f"step {self.step}, {self.phase}, {self.op or self.module or '(model output)'}"
        rank = f" on rank {self.rank}" if self.rank else ""
        return f"first inf/NaN at {where}{rank}: {what} (chapter {chapter})"

    def describe(self) -> str:
        """Lines of at most 80 characters: where, which mechanism, the chapter, the ranges,
        the fix."""
        fix = MECHANISMS[self.mechanism][2]
        lines = [self.headline()]
        if self.detail:
            lines.append(f"  {self.detail}")
        lines += [f"  in  {r}" for r in self.inputs]
        if self.output is not None:
            lines.append(f"  out {self.output}")
        lines.append(f"  fix: {fix}")
        if self.dump:
            lines.append(f"  inputs saved to {self.dump}")
        return "\n".join(_fill(line) for line in lines)

    __str__ = describe

    def to_dict(self) -> dict:
        """The event as JSON-ready values."""
        return {"type": "nonfinite", "step": self.step, "phase": self.phase,
                "module": self.module, "op": self.op, "mechanism": self.mechanism,
                "chapter": self.chapter, "detail": self.detail, "rank": self.rank,
                "inputs": [r.to_dict() for r in self.inputs],
                "output": None if self.output is None else self.output.to_dict(),
                "dump": self.dump}


@dataclass(frozen=True)
class SkippedStep:
    """A step GradScaler skipped: the scale it ran at and the next, the first parameter whose
    gradient is not finite (and how many entries), and the step's first inf/NaN (forward or
    backward) that explains it."""

    step: int
    scale: float
    new_scale: float
    tensor: str
    nonfinite: int
    event: NonFinite | None = None

    def describe(self) -> str:
        """One line: which step, the scales, the tensor and the mechanism."""
        why = "" if self.event is None else (
            f"; first in the {self.event.phase}: "
            f"{self.event.op or self.event.module or 'the loss'} "
            f"({MECHANISMS[self.event.mechanism][1]}, chapter {self.event.chapter})")
        return (f"step {self.step} skipped: scale {fmt_num(self.scale)} -> "
                f"{fmt_num(self.new_scale)}; {self.tensor or 'no parameter'} has "
                f"{self.nonfinite} non-finite gradient entries{why}")

    def to_dict(self) -> dict:
        """The skip as JSON-ready values."""
        return {"type": "skip", "step": self.step, "scale": self.scale,
                "new_scale": self.new_scale, "tensor": self.tensor,
                "nonfinite": self.nonfinite,
                "mechanism": None if self.event is None else self.event.mechanism}


@dataclass(frozen=True)
class LayerStats:
    """One leaf module's tensors of one kind at one recorded step, reduced over every call of
    the step (and every rank): entries, amax, non-finite and zero counts, and per format the
    entries a cast would flush, leave subnormal or overflow. scale: the loss scale in force
    (output gradients are the scaled ones, parameter gradients the unscaled ones)."""

    step: int
    module: str
    kind: str
    numel: int
    amax: float
    nonfinite: int
    zeros: int
    counts: dict = field(default_factory=dict)  # format -> (flushed, subnormal, overflow)
    scale: float | None = None

    def share(self, what: str, fmt: str) -> float:
        """The share of entries flushed ("flushed"), subnormal ("subnormal") or overflowing
        ("overflow") in fmt."""
        k = ("flushed", "subnormal", "overflow").index(what)
        return self.counts[fmt][k] / self.numel if self.numel else 0.0

    def headroom(self, fmt: str) -> float:
        """log2(max_finite / amax) of fmt, in binades."""
        return headroom(self.amax, fmt)

    def to_dict(self) -> dict:
        """The statistics as JSON-ready values."""
        return {"type": "stats", "step": self.step, "module": self.module, "kind": self.kind,
                "numel": self.numel, "amax": _num(self.amax), "nonfinite": self.nonfinite,
                "zeros": self.zeros, "scale": _num(self.scale),
                "formats": {f: {"flushed": c[0], "subnormal": c[1], "overflow": c[2],
                                "headroom": _num(self.headroom(f))}
                            for f, c in self.counts.items()}}


def _hr(x: float) -> str:
    if math.isnan(x):
        return "nan"
    if math.isinf(x):
        return "inf" if x > 0 else "-inf"
    return f"{x:.1f}"


@dataclass(frozen=True)
class WatchReport(Report):
    """A watched run: statistics every `every` steps, the first inf/NaN of each step, the
    skipped steps and the loss scale; prints as a table (worst over the recorded steps per
    layer and kind) and `.plot()` draws per-layer headroom over the steps.

    Examples
    --------
    >>> import torch
    >>> from torch import nn
    >>> from precisionlab import diagnose
    >>> _ = torch.manual_seed(0)
    >>> model = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 1))
    >>> opt = torch.optim.SGD(model.parameters(), lr=0.1)
    >>> with diagnose.watch(model, every=2, formats=("float16",)) as w:
    ...     for _ in range(3):
    ...         opt.zero_grad()
    ...         loss = model(torch.randn(8, 4)).pow(2).mean()
    ...         loss.backward()
    ...         opt.step()
    ...         w.step(loss)
    >>> report = w.report
    >>> report.steps, sorted({r.step for r in report.records}), report.events
    (3, [0, 2], ())
    >>> print(report.summary().splitlines()[1])
    no inf or NaN in 3 steps
    """

    formats: tuple[str, ...]
    every: int
    steps: int
    records: tuple[LayerStats, ...] = ()
    events: tuple[NonFinite, ...] = ()
    skips: tuple[SkippedStep, ...] = ()
    scales: tuple[tuple[int, float], ...] = ()
    losses: tuple[tuple[int, float], ...] = ()
    world_size: int = 1
    title: str = "watch over a training run"

    @property
    def first_nonfinite(self) -> NonFinite | None:
        """The first inf/NaN of the run (None when every step was finite)."""
        return self.events[0] if self.events else None

    def layers(self) -> list[tuple[str, str]]:
        """(module, kind) pairs with statistics, in the order first recorded."""
        return list(dict.fromkeys((r.module, r.kind) for r in self.records))

    def series(self, module: str, kind: str = "activation", fmt: str | None = None):
        """(steps, headroom in binades) of one layer and kind, as numpy arrays."""
        fmt = fmt or self.formats[0]
        rs = [r for r in self.records if r.module == module and r.kind == kind]
        return (np.array([r.step for r in rs]), np.array([r.headroom(fmt) for r in rs]))

    def summary(self) -> str:
        """Steps watched, the first inf/NaN, the skipped steps, the least headroom per format."""
        recorded = len({r.step for r in self.records})
        world = f" on {self.world_size} ranks" if self.world_size > 1 else ""
        lines = [f"watched {self.steps} steps{world}; statistics every {self.every} "
                 f"({recorded} recorded)"]
        ev = self.first_nonfinite
        if ev is None:
            lines.append(f"no inf or NaN in {self.steps} steps")
        else:
            lines.append(ev.headline()
                         + (f" ({len(self.events)} steps with inf/NaN)"
                            if len(self.events) > 1 else ""))
        if self.skips:
            lines.append(f"{len(self.skips)} steps skipped by the GradScaler: "
                         + ", ".join(str(s.step) for s in self.skips[:8])
                         + (" ..." if len(self.skips) > 8 else ""))
        for f in self.formats:
            fin = [r for r in self.records if not math.isnan(r.headroom(f))]
            if fin:
                w = min(fin, key=lambda r: r.headroom(f))
                lines.append(f"{f}: least headroom {_hr(w.headroom(f))} binades ({w.module} "
                             f"{w.kind}, step {w.step})")
        return "\n".join(_fill(line) for line in lines)

    def table(self, limit: int = 40) -> Table:
        """Per layer and kind, worst over the recorded steps: amax, and per format the
        headroom (binades) and the shares flushed, subnormal and overflowing.

        Parameters
        ----------
        limit : int, default 40
            Rows shown; the rest are counted in a last row.

        Returns
        -------
        Table
            The rows as text cells.
        """
        heads = ["layer", "kind", "amax"]
        for f in self.formats:
            s = short_name(f)
            heads += [f"{s} hr", f"{s} 0", f"{s} sub", f"{s} ovf"]
        rows = []
        for mod, kind in self.layers():
            rs = [r for r in self.records if r.module == mod and r.kind == kind]
            row = [short(mod), kind, fmt_num(max(r.amax for r in rs))]
            for f in self.formats:
                row.append(_hr(min(r.headroom(f) for r in rs)))
                row += [fmt_share(max(r.share(w, f) for r in rs))
                        for w in ("flushed", "subnormal", "overflow")]
            rows.append(row)
        return Table(heads, rows_fit(rows, limit) if rows else [],
                     align="ll" + "r" * (len(heads) - 2), width=80, key=2,
                     note="hr: headroom log2(max finite / amax) in binades; 0, sub, ovf: the "
                          "largest share of a step's entries a cast would flush to zero, leave "
                          "subnormal or overflow")

    def events_table(self) -> Table:
        """One row per step with an inf/NaN: step, rank, phase, operation, mechanism, chapter.

        Returns
        -------
        Table
            The rows as text cells.
        """
        rows = [[str(e.step), str(e.rank), e.phase, short(e.op or e.module or "(loss)", 36),
                 e.mechanism, str(e.chapter)] for e in self.events]
        return Table(["step", "rank", "phase", "operation", "mechanism", "chapter"], rows)

    def to_records(self) -> list[dict]:
        """Everything as JSON-ready dicts (the lines of the watch's JSON-lines file)."""
        out = [r.to_dict() for r in self.records]
        out += [e.to_dict() for e in self.events] + [s.to_dict() for s in self.skips]
        out += [{"type": "scale", "step": s, "scale": v} for s, v in self.scales]
        out += [{"type": "loss", "step": s, "loss": _num(v)} for s, v in self.losses]
        return sorted(out, key=lambda d: d["step"])

    def plot(self, ax=None, fmt: str | None = None, kind: str = "activation"):
        """Draw each layer's headroom in fmt over the recorded steps, 0 marking overflow, the
        steps with inf/NaN and the skipped steps as vertical lines.

        Parameters
        ----------
        ax : matplotlib.axes.Axes or None, default None
            The Axes to draw on; None draws on a new figure.
        fmt : str or None, default None
            The format (None: the first watched).
        kind : {"activation", "output grad", "param grad"}, default "activation"
            Which tensors' headroom.

        Returns
        -------
        matplotlib.axes.Axes
            The Axes drawn on.
        """
        fmt = get_format(fmt).name if fmt is not None else self.formats[0]
        if fmt not in self.formats:
            raise ValueError(f"fmt {fmt!r} was not watched; valid choices: "
                             f"{', '.join(self.formats)}")
        if kind not in KINDS:
            raise ValueError(f"unknown kind {kind!r}; valid choices: {', '.join(KINDS)}")
        ax = new_axes(ax)
        layers = [m for m, k in self.layers() if k == kind]
        for m in layers:
            x, y = self.series(m, kind, fmt)
            y = np.where(np.isposinf(y), np.nan, y)
            ax.plot(x, y, marker="o", ms=3, lw=1.2, label=short(m, 20))
        ax.axhline(0.0, color="black", lw=0.8)
        for i, e in enumerate(self.events):
            ax.axvline(e.step, color="crimson", lw=0.8, ls="--",
                       label="inf/NaN" if i == 0 else None)
        for i, s in enumerate(self.skips):
            ax.axvline(s.step, color="orange", lw=0.8, ls=":",
                       label="skipped step" if i == 0 else None)
        ax.set_xlabel("step")
        ax.set_ylabel(f"headroom in {short_name(fmt)} (binades)")
        ax.set_title(f"{kind} headroom log2(max finite / amax)")
        if 0 < len(layers) <= 10 or self.events or self.skips:
            ax.legend(fontsize=7, ncol=2)
        return ax
