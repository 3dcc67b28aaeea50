"""`triage`'s result: the verdict, every check in trace order and the operation to blame, as a
summary (the blamed operation, its worst element, the unchecked operations before it), a table
(Type-II first, then the tightest checks) and a plot of each check's margin."""

from __future__ import annotations

import math
import textwrap
from dataclasses import dataclass

import numpy as np

from ..tables import Table
from .floors import format_floor, worst_floor
from .opcheck import OpCheck
from .report import Report, new_axes, short

__all__ = ["TriageReport"]


@dataclass(frozen=True)
class TriageReport(Report):
    """triage()'s result: the verdict, every check in trace order, the operation to blame.

    Attributes
    ----------
    verdict : str
        "Type-I" (every paired reference value is round-off the target may make) or
        "Type-II" (some value is not: a bug in either program, or a kernel the model does
        not fit).
    checks : tuple of OpCheck
        One per paired operation, in the target's trace order.
    suspects : tuple of str
        Every unchecked target operation the first Type-II check depends on, back to the
        last checked values (propagated, not checked): those whose call differs from the
        reference's counterpart first, with what differs, then the rest in trace order.
    operations : int
        Target operations traced.
    paired : int
        Target operations with at least one output checked against the reference (at most
        `operations`; an operation with several outputs has a check per output, so
        len(checks) may be larger).
    kernels : tuple
        (operation, kernel description) for each declared kernel used.
    branches : int
        Python branches the two programs took on tensor values (bool(x > 0), ...).
    culprit : str
        The likely cause of a Type-II verdict when the evidence points to one: the first of
        the blamed operation and its suspects whose call differs from the reference's
        (a constant, a mask, a weight), with both values; else an operation the target
        runs missing or extra just before the blamed one; else "".
    differences : tuple of str
        Modules where the two programs run a different number of operations, with the
        operation missing or extra and where (any verdict).
    logic : TriageReport or None
        The logic pass: the target's own program run at the reference's precision (a copy
        of a low-precision target module cast up) triaged against the reference with the
        parameters rounded as the target's were; None when it was not run.
    logic_note : str
        Why the logic pass was not run, when it was asked for; "" otherwise.

    Examples
    --------
    >>> import torch
    >>> from torch import nn
    >>> from precisionlab.diagnose import triage
    >>> _ = torch.manual_seed(0)
    >>> model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    >>> x = torch.randn(3, 8)
    >>> report = triage(model, lambda z: model(z) + 0.01, x)
    >>> for c in report.checks:
    ...     print(f"#{c.index} {c.op}: {c.verdict}, {c.outside} of {c.numel}")
    #0 0: linear#0: Type-I, 0 of 48
    #1 1: relu#0: Type-I, 0 of 48
    #2 2: linear#0: Type-I, 0 of 12
    #3 add#0: Type-II, 12 of 12
    >>> report.blamed is report.deciding, report.blamed.widths_outside > 1000
    (True, True)
    >>> print(report.summary().splitlines()[1])
    blamed: #3 add#0 (12 of 12 reference values outside)
    """

    verdict: str
    checks: tuple
    suspects: tuple  # unchecked target operations the first Type-II check depends on, ranked
    operations: int  # target operations traced
    paired: int  # target operations with a checked output
    kernels: tuple  # (operation, kernel description) declared
    title: str = "round-off or bug"
    branches: int = 0  # Python branches the two programs took on tensor values
    culprit: str = ""  # the likely cause, when the evidence points to one
    differences: tuple = ()  # modules running a different number of operations, in words
    logic: TriageReport | None = None  # the target's program at the reference's precision
    logic_note: str = ""  # why the logic pass asked for was not run

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
    def floor_at(self) -> OpCheck | None:
        """The check with the largest detection floor (`OpCheck.floor`), or None."""
        return worst_floor(self.checks)

    @property
    def floor(self) -> float:
        """The largest detection floor along the checked path: a bug that scales any checked
        operation's output by 1 + d or 1 - d with d above it would have been Type-II (NaN
        when no check has a floor)."""
        c = self.floor_at
        return c.floor if c is not None else float("nan")

    @property
    def unsound(self) -> tuple:
        """Checks where the target's own value left its bound (the kernel model was violated)."""
        return tuple(c for c in self.checks if c.self_outside)

    def summary(self) -> str:
        """The verdict, where, by how much, what to suspect and what the checks could not see.

        Returns
        -------
        str
            The verdict and the counts (operations traced, how many of them checked, and the
            outputs checked where an operation has several); for Type-II the blamed operation,
            its worst element and how many bound widths outside it lies, the likely cause
            when the evidence points to one, and every unchecked operation it depends on; for
            Type-I the check closest to an edge and the largest detection floor; modules that
            run a different number of operations; the logic pass's verdict; warnings when the
            kernel model was exceeded or the programs branched on tensor values.
        """
        n = len(self.checks)
        outs = f" ({n} outputs)" if n != self.paired else ""
        lines = _wrap(f"{self.verdict}: {self.operations} target operations traced, "
                      f"{self.paired} of them checked against the reference{outs}")
        lines += self._logic_lines()
        b = self.blamed
        if b is not None:
            lines += _wrap(f"blamed: #{b.index} {b.op} ({b.outside} of {b.numel} reference "
                           "values outside)")
            of = f" of {b.of}, shape {b.shape}" if b.of else ""  # not the op's own output
            worst = (f"  worst at {b.element}{of}: reference {b.reference:.6g} outside "
                     f"[{b.lo:.6g}, {b.hi:.6g}]")
            lines += textwrap.wrap(worst, 80, subsequent_indent="    ") if of else [worst]
            lines.append(f"  by {b.widths_outside:.3g} bound widths")
            if self.culprit:
                lines += _wrap("likely cause: " + self.culprit)
            if self.suspects:
                lines += _wrap(f"unchecked operations it depends on ({len(self.suspects)}): " +
                               ", ".join(self.suspects))
        elif self.deciding is not None:
            d = self.deciding
            lines += _wrap(f"closest to an edge: #{d.index} {d.op}, margin {d.margin:.3g} of "
                           f"width {d.width:.3g}")
        if b is None and self.floor_at is not None:
            f = self.floor_at
            lines += _wrap(
                f"detection floor: no bug scaling a module's output by 1 +- d with d larger "
                f"than {format_floor(f.floor)} would have passed; the largest floor is at "
                f"#{f.index} {f.op}")
        diffs = [d for d in self.differences if d != self.culprit]
        for k, d in enumerate(diffs):
            if k == 2:
                lines.append(f"  ... {len(diffs) - 2} more (report.differences)")
                break
            lines += _wrap(("operation counts differ: " if k == 0 else "  ") + d)
        if self.unsound:
            lines.append(f"warning: {len(self.unsound)} operations exceeded the assumed kernel "
                         "model (declare their Kernel); the verdict is not rigorous")
        if self.branches:
            lines += textwrap.wrap(
                f"note: the programs branched {self.branches} times on tensor values (bool/int "
                "of a float-derived tensor); had they branched differently, the checks after it "
                "compare different computations", 80, subsequent_indent="  ")
        return "\n".join(lines)

    def _logic_lines(self) -> list:
        """The summary's lines on the logic pass (none when it was not asked for or run)."""
        lg = self.logic
        if lg is None:
            return _wrap("logic pass not run: " + self.logic_note) if self.logic_note else []
        lines = _wrap(f"logic pass (the target's program at the reference's precision): "
                      f"{lg.verdict}" + (f", blamed #{lg.blamed.index} {lg.blamed.op}"
                                         if lg.blamed is not None else ""))
        if lg.culprit:
            lines += _wrap("  likely cause: " + lg.culprit)
        if lg.verdict == "Type-II" and self.verdict == "Type-I":
            lines += _wrap("  the program's logic differs from the reference's, and the "
                           "target's round-off hid it (report.logic has the details)")
        return lines

    def table(self, limit: int = 16) -> Table:
        """One row per check (Type-II first, then the tightest): op, verdict, outside, margin/width.

        Parameters
        ----------
        limit : int, default 16
            The most checks shown; a last row says how many were left out.

        Returns
        -------
        Table
            Columns op (the trace index), where, verdict, outside (entries outside / all),
            margin and width at the worst element, and floor (`OpCheck.floor`; "-" where
            it is not computed).
        """
        bad = [c for c in self.checks if c.verdict == "Type-II"]
        good = sorted((c for c in self.checks if c.verdict != "Type-II"),
                      key=lambda c: (c.exact, c.score))
        rows = [[f"#{c.index}", short(c.op, 26), c.verdict, f"{c.outside}/{c.numel}",
                 f"{c.margin:.1e}", f"{c.width:.1e}",
                 "-" if math.isnan(c.floor) else f"{c.floor:.1e}"] for c in bad + good]
        if len(rows) > limit:  # the note in the wide column, so that the first stays narrow
            rows = [*rows[:limit], ["", f"(+{len(rows) - limit} more)", *[""] * 5]]
        return Table(["op", "where", "verdict", "outside", "margin", "width", "floor"], rows)

    def plot(self, ax=None):
        """Per checked operation: the reference's margin in half-widths of the bound (below 0: outside).

        Parameters
        ----------
        ax : matplotlib.axes.Axes or None, default None
            The Axes to draw on; None draws on a new figure.

        Returns
        -------
        matplotlib.axes.Axes
            The Axes drawn on (a symlog y axis; Type-II checks marked with crosses).
        """
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


def _wrap(text: str) -> list:
    """text in lines of at most 80 characters, continued with an indent of two."""
    return textwrap.wrap(text, 80, subsequent_indent="  ", break_on_hyphens=False)
