"""The shared base of every diagnosis result: plain data that prints as a table and plots on an Axes.

Also the input checks the four diagnoses share (a Module with parameters, a batch, a scalar
loss), each naming the argument that is wrong.
"""

from __future__ import annotations

import html
import math
from collections.abc import Sequence

import matplotlib.pyplot as plt
import torch

from ..tables import Table

__all__ = [
    "Report",
    "check_module",
    "check_scalar_loss",
    "fmt_num",
    "fmt_share",
    "pow2_label",
]


class Report:
    """A diagnosis result: `table()` (a `tables.Table`), text/HTML display, `plot(ax=None)`.

    Every report of the four diagnoses (GradientReport, MismatchReport, TriageReport,
    DeterminismReport) is a frozen dataclass of plain data with these methods:
    print(report) gives the summary and the table as text, a notebook shows them as HTML,
    and report.plot() draws the result on a matplotlib Axes.

    Examples
    --------
    >>> import torch
    >>> from torch import nn
    >>> from precisionlab.diagnose import Report, gradients
    >>> _ = torch.manual_seed(0)
    >>> x = torch.full((2, 4), 1e-8)
    >>> report = gradients(nn.Linear(4, 2), lambda out: out.sum(), x)
    >>> isinstance(report, Report), report.title
    (True, 'gradients in reduced precision')
    >>> text = str(report)  # the same as report.to_text()
    >>> text == report.summary() + "\\n" + report.table().to_text()
    True
    """

    title: str = ""

    def table(self) -> Table:  # pragma: no cover - every subclass defines it
        """The result as rows of text cells.

        Returns
        -------
        Table
            Headers and rows of strings; print it, or show it in a notebook as HTML.
        """
        raise NotImplementedError

    def summary(self) -> str:
        """One or two lines: the verdict of the diagnosis.

        Returns
        -------
        str
            The lines ("" where a report has none).
        """
        return ""

    def to_text(self) -> str:
        """Summary lines, then the table as aligned text.

        Returns
        -------
        str
            What print(report) prints.
        """
        head = self.summary()
        return (head + "\n" if head else "") + self.table().to_text()

    def __str__(self) -> str:
        return self.to_text()

    def _repr_html_(self) -> str:
        head = self.summary()
        pre = (f'<pre style="font-size: 0.9em; line-height: 1.35">{html.escape(head)}</pre>'
               if head else "")
        return pre + self.table()._repr_html_()

    def _repr_pretty_(self, p, cycle) -> None:
        p.text(self.to_text())

    def plot(self, ax=None):  # pragma: no cover - every subclass defines it
        """Draw the result on ax (a new figure when None) and return ax.

        Parameters
        ----------
        ax : matplotlib.axes.Axes or None, default None
            The Axes to draw on; None draws on a new figure.

        Returns
        -------
        matplotlib.axes.Axes
            The Axes drawn on.
        """
        raise NotImplementedError


def new_axes(ax, width: float = 7.0, height: float = 3.2):
    """ax itself, or the Axes of a new figure of the given size (inches)."""
    if ax is not None:
        return ax
    _, ax = plt.subplots(figsize=(width, height))
    return ax


def check_module(model, name: str = "model", parameters: bool = True) -> torch.nn.Module:
    """model if it is a torch.nn.Module (with at least one parameter), else ValueError naming it."""
    if not isinstance(model, torch.nn.Module):
        raise ValueError(f"{name} must be a torch.nn.Module; got {name}={type(model).__name__}")
    if parameters and next(iter(model.parameters()), None) is None:
        raise ValueError(f"{name} has no parameters; the diagnosis needs a model with weights "
                         f"(got {type(model).__name__})")
    return model


def check_scalar_loss(loss, name: str = "loss_fn") -> torch.Tensor:
    """loss if it is a real scalar tensor that requires grad, else ValueError naming loss_fn."""
    if not isinstance(loss, torch.Tensor) or loss.numel() != 1 or not loss.is_floating_point():
        shape = tuple(loss.shape) if isinstance(loss, torch.Tensor) else type(loss).__name__
        raise ValueError(f"{name} must return a scalar floating-point loss; got {shape}")
    if not loss.requires_grad:
        raise ValueError(f"{name}'s loss does not depend on the model's parameters "
                         "(requires_grad is False)")
    return loss.reshape(())


def fmt_share(x: float) -> str:
    """A share as a percentage with enough digits for small shares: '0', '<0.001%', '12.3%'."""
    if x == 0:
        return "0"
    if not math.isfinite(x):
        return str(x)
    pct = 100 * x
    if pct < 0.001:
        return "<0.001%"
    if pct < 1:
        return f"{pct:.3f}%"
    return f"{pct:.1f}%"


def fmt_num(x: float) -> str:
    """A number in 3 significant digits."""
    return f"{x:.3g}"


def pow2_label(e: int | None) -> str:
    """'2^e' for an exponent, '-' for None."""
    return "-" if e is None else f"2^{e}"


def short(name: str, width: int = 28) -> str:
    """name cut to width characters from the left, marked with '…'."""
    return name if len(name) <= width else "…" + name[-(width - 1):]


def rows_fit(rows: Sequence[Sequence[str]], limit: int) -> list:
    """The first limit rows, plus a row saying how many were left out."""
    rows = list(rows)
    if len(rows) <= limit:
        return rows
    ncol = len(rows[0])
    return [*rows[:limit], [f"(+{len(rows) - limit} more)"] + [""] * (ncol - 1)]
