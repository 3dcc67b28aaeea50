"""The format table: every column computed from the `formats` registry, shown as HTML or text."""

from __future__ import annotations

import html
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from .formats import FORMAT_NAMES, FloatFormat, get_format

__all__ = ["FORMAT_COLUMNS", "Table", "format_rows", "format_table", "format_value"]

# (key, header) of every column, in display order.
FORMAT_COLUMNS: tuple[tuple[str, str], ...] = (
    ("format", "format"),
    ("bits", "bits"),
    ("layout", "exp/mant bits"),
    ("bias", "bias"),
    ("precision", "p"),
    ("min_subnormal", "min subnormal"),
    ("min_normal", "min normal"),
    ("max_finite", "max finite"),
    ("eps", "eps = 2^-m"),
    ("unit_roundoff", "u = 2^-p"),
    ("decimal_digits", "digits"),
    ("specials", "specials"),
)


def format_value(x: float) -> str:
    """Short exact-where-possible text: '2^-24' for powers of two, '65504' for integers, else 3 digits."""
    if x == 0 or not math.isfinite(x):
        return repr(x)
    m, e = math.frexp(abs(x))
    sign = "-" if x < 0 else ""
    if m == 0.5 and not (1 <= abs(x) < 1e6 and x == int(x)):
        return f"{sign}2^{e - 1}"
    if x == int(x) and abs(x) < 1e6:
        return f"{int(x)}"
    return f"{x:.3g}"


def _specials(fmt: FloatFormat) -> str:
    """What the all-ones exponent holds, and where overflow goes."""
    if fmt.has_inf:
        return "±inf, NaN (overflow: inf)"
    return "NaN only (overflow: NaN or saturate)"


def format_rows(formats: Iterable[str | FloatFormat] | None = None) -> list[dict]:
    """One dict per format with the numeric columns (floats/ints) and derived text."""
    rows = []
    for f in formats if formats is not None else FORMAT_NAMES:
        fmt = get_format(f)
        rows.append({
            "format": fmt.name,
            "bits": fmt.total_bits,
            "layout": f"{fmt.exponent_bits}/{fmt.mantissa_bits}",
            "bias": fmt.bias,
            "precision": fmt.precision,
            "emin": fmt.emin,
            "emax": fmt.emax,
            "min_subnormal": fmt.min_subnormal,
            "min_normal": fmt.min_normal,
            "max_finite": fmt.max_finite,
            "eps": fmt.eps,
            "unit_roundoff": fmt.unit_roundoff,
            # p bits carry p·log10(2) decimal digits.
            "decimal_digits": fmt.precision * math.log10(2),
            "specials": _specials(fmt),
        })
    return rows


@dataclass(frozen=True)
class Table:
    """Rows of text cells under headers; displays as HTML in Jupyter and as aligned text elsewhere."""

    headers: Sequence[str]
    rows: Sequence[Sequence[str]]
    caption: str = ""

    def to_text(self) -> str:
        """Aligned plain-text columns."""
        cols = [self.headers, *self.rows]
        widths = [max(len(str(r[i])) for r in cols) for i in range(len(self.headers))]
        lines = ["  ".join(str(c).ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in cols]
        lines.insert(1, "  ".join("-" * w for w in widths))
        return "\n".join(([self.caption] if self.caption else []) + lines)

    def to_markdown(self) -> str:
        """A GitHub/MyST pipe table."""
        out = ["| " + " | ".join(self.headers) + " |", "|" + "---|" * len(self.headers)]
        out += ["| " + " | ".join(str(c) for c in r) + " |" for r in self.rows]
        return "\n".join(out)

    def _repr_html_(self) -> str:
        cell = 'style="white-space: nowrap; padding: 2px 8px; text-align: left"'
        head = "".join(f"<th {cell}>{html.escape(str(h))}</th>" for h in self.headers)
        body = "".join(
            "<tr>" + "".join(f"<td {cell}>{html.escape(str(c))}</td>" for c in r) + "</tr>"
            for r in self.rows
        )
        cap = f"<caption>{html.escape(self.caption)}</caption>" if self.caption else ""
        return (f'<table class="precisionlab-table" style="font-size: 0.8em">{cap}'
                f"<thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>")

    def __repr__(self) -> str:
        return self.to_text()


def format_table(formats: Iterable[str | FloatFormat] | None = None) -> Table:
    """The format table (bits, bias, range, eps, u = 2^-p, p·log10 2 digits, specials) from the registry."""
    rows = format_rows(formats)
    text_rows = []
    for r in rows:
        cells = []
        for key, _ in FORMAT_COLUMNS:
            v = r[key]
            if key in ("min_subnormal", "min_normal", "max_finite", "eps", "unit_roundoff"):
                v = format_value(v)
                if "^" in v:  # add the decimal value next to the power of two
                    v += f" ≈ {r[key]:.3g}"
            elif key == "decimal_digits":
                v = f"{v:.1f}"
            cells.append(str(v))
        text_rows.append(cells)
    return Table([h for _, h in FORMAT_COLUMNS], text_rows)
