"""`triage`'s result: the verdict, every check in trace order and the operation to blame, as a
summary (the blamed operation, its worst element, the unchecked operations before it), a table
(Type-II first, then the tightest checks) and a plot of each check's margin."""

from __future__ import annotations

import textwrap
from dataclasses import dataclass

import numpy as np

from ..tables import Table
from .opcheck import OpCheck
from .report import Report, new_axes, rows_fit, short

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
        Unpaired target operations just before the first Type-II check (propagated, not
        checked), with the argument that differs.
    operations : int
        Target operations traced.
    paired : int
        Operations checked against the reference.
    kernels : tuple
        (operation, kernel description) for each declared kernel used.
    branches : int
        Python branches the two programs took on tensor values (bool(x > 0), ...).

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
    suspects: tuple  # unpaired target operations just before the first Type-II check
    operations: int  # target operations traced
    paired: int
    kernels: tuple  # (operation, kernel description) declared
    title: str = "round-off or bug"
    branches: int = 0  # Python branches the two programs took on tensor values

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
        """The verdict, where, and by how much.

        Returns
        -------
        str
            The verdict and the counts; for Type-II the blamed operation, its worst element
            and how many bound widths outside it lies, and the unchecked operations before
            it; for Type-I the check closest to an edge; warnings when the kernel model was
            exceeded or the programs branched on tensor values.
        """
        lines = [f"{self.verdict}: {self.operations} target operations traced, {self.paired} "
                 f"checked against the reference"]
        b = self.blamed
        if b is not None:
            lines.append(f"blamed: #{b.index} {b.op} ({b.outside} of {b.numel} reference "
                         "values outside)")
            of = f" of {b.of}, shape {b.shape}" if b.of else ""  # not the op's own output
            worst = (f"  worst at {b.element}{of}: reference {b.reference:.6g} outside "
                     f"[{b.lo:.6g}, {b.hi:.6g}]")
            lines += textwrap.wrap(worst, 80, subsequent_indent="    ") if of else [worst]
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
        if self.branches:
            lines += textwrap.wrap(
                f"note: the programs branched {self.branches} times on tensor values (bool/int "
                "of a float-derived tensor); had they branched differently, the checks after it "
                "compare different computations", 80, subsequent_indent="  ")
        return "\n".join(lines)

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
            margin and width at the worst element.
        """
        bad = [c for c in self.checks if c.verdict == "Type-II"]
        good = sorted((c for c in self.checks if c.verdict != "Type-II"),
                      key=lambda c: (c.exact, c.score))
        rows = [[f"#{c.index}", short(c.op, 34), c.verdict, f"{c.outside}/{c.numel}",
                 f"{c.margin:.2e}", f"{c.width:.2e}"] for c in bad + good]
        return Table(["op", "where", "verdict", "outside", "margin", "width"],
                     rows_fit(rows, limit))

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
