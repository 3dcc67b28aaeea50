"""Tables for the chapters: `show(rows, columns)` gives an HTML table that wraps and an
aligned text table no wider than 80 characters; and the format table, every column computed
from the `formats` registry."""

from __future__ import annotations

import html
import math
import numbers
import textwrap
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from .formats import FORMAT_NAMES, FloatFormat, get_format

__all__ = ["FORMAT_COLUMNS", "Table", "format_rows", "format_table", "format_value", "show",
           "wrap"]

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
_NUMERIC_FORMAT_COLUMNS = {"bits", "bias", "precision", "decimal_digits"}


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
    """Which special values the format has (inf, NaN, zero, sign), and where overflow goes."""
    if fmt.has_inf:
        return "±inf, NaN (overflow: inf)"
    if not fmt.signed:  # float8_e8m0fnu: 2^(E - 127), the all-ones pattern is NaN
        return "NaN only; no zero, no sign (0, negatives, overflow: NaN)"
    if fmt.has_nan:
        return "NaN only (overflow: NaN or saturate)"
    return "none: no inf, no NaN (overflow: saturate)"


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


# A column's format: a format spec ("+.2f", ".1%"), a callable value -> text, or None (str).
Fmt = str | Callable[[Any], str] | None
_SEP = "  "  # between text columns


@dataclass(frozen=True)
class Table:
    """Rows of text cells under headers: an HTML table that wraps, and text of at most `width` columns.

    `align` has one letter per column, "l" or "r" ("" = all left). With `width` set, the text
    form wraps long headers, then splits into column groups that each repeat the first `key`
    columns, then wraps cells, so that no line is wider than `width`; None keeps one line per
    row. `caption` is printed above and `note` below.
    """

    headers: Sequence[str]
    rows: Sequence[Sequence[str]]
    caption: str = ""
    align: str = ""
    width: int | None = None
    key: int = 1
    note: str = ""

    def __post_init__(self) -> None:
        n = len(self.headers)
        for i, row in enumerate(self.rows):
            if len(row) != n:
                raise ValueError(f"rows[{i}] has {len(row)} cells; the table has {n} headers")
        if self.align and (len(self.align) != n or set(self.align) - {"l", "r"}):
            raise ValueError(f"align must be one letter 'l' or 'r' per column ({n}); "
                             f"got align={self.align!r}")
        if self.width is not None and (not isinstance(self.width, int) or self.width < 20):
            raise ValueError(f"width must be an int >= 20 or None; got width={self.width!r}")
        if not isinstance(self.key, int) or not 0 <= self.key <= n:
            raise ValueError(f"key must be an int in [0, {n}]; got key={self.key!r}")

    def _aligns(self) -> str:
        return self.align or "l" * len(self.headers)

    def to_text(self) -> str:
        """Aligned plain-text columns, split into column groups to fit `width` if it is set."""
        heads = [str(h).split("\n") for h in self.headers]
        cells = [[str(c).split("\n") for c in row] for row in self.rows]
        widths, groups = _fit(heads, cells, min(self.key, len(heads) - 1), self.width)
        aligns, limit = self._aligns(), self.width
        blocks = [_block(heads, cells, widths, aligns, g) for g in groups]
        out = [_fill(self.caption, limit)] if self.caption else []
        out.append("\n\n".join(blocks))
        if self.note:
            out.append(_fill(self.note, limit))
        return "\n".join(out)

    def to_markdown(self) -> str:
        """A GitHub/MyST pipe table."""
        out = ["| " + " | ".join(self.headers) + " |", "|" + "---|" * len(self.headers)]
        out += ["| " + " | ".join(str(c) for c in r) + " |" for r in self.rows]
        return "\n".join(out)

    def _repr_html_(self) -> str:
        aligns = self._aligns()
        span = _span(_widths([str(h).split("\n") for h in self.headers],
                             [[str(c).split("\n") for c in r] for r in self.rows]))
        # the wider the table's one-line text, the smaller its font and padding, so that
        # its narrowest wrapping still fits a 1280-pixel page's column
        font, pad = ("0.9em", 8) if span <= 80 else ("0.8em", 6) if span <= 120 else ("0.7em", 4)
        cell = f"padding:1px {pad}px;border:none"
        style = {a: f"{cell};text-align:{side}" for a, side in (("l", "left"), ("r", "right"))}
        head = "".join(f'<th scope="col" style="{style[aligns[j]]};vertical-align:bottom;'
                       f'border-bottom:1px solid #888">{_html_text(h)}</th>'
                       for j, h in enumerate(self.headers))
        body = "".join("<tr>" + "".join(f'<td style="{style[aligns[j]]}">{_html_text(c)}</td>'
                                        for j, c in enumerate(r)) + "</tr>"
                       for r in self.rows)
        cap = (f'<caption style="caption-side:top;text-align:left">'
               f"{_html_text(self.caption)}</caption>") if self.caption else ""
        foot = (f'<tfoot><tr><td colspan="{len(self.headers)}" style="{style["l"]}">'
                f"{_html_text(self.note)}</td></tr></tfoot>") if self.note else ""
        return (f'<table class="precisionlab-table" style="border-collapse:collapse;'
                f"table-layout:auto;width:auto;max-width:100%;margin:0.4em 0;"
                f"white-space:normal;font-variant-numeric:tabular-nums;"
                f'font-size:{font}">{cap}<thead><tr>{head}</tr></thead>'
                f'<tbody style="vertical-align:top">{body}</tbody>{foot}</table>')

    def __repr__(self) -> str:
        return self.to_text()


def show(rows: Iterable[Sequence[Any] | Mapping[str, Any]],
         columns: Sequence[str | tuple[str, Fmt]] | Mapping[str, Fmt], *,
         title: str = "", note: str = "", key: int = 1, width: int | None = 80,
         align: str | None = None) -> Table:
    """A Table from rows of values and columns given as headers or (header, format) pairs.

    A format is a format spec applied with format(value, spec), a callable value -> text, or
    None for str(value); None values print as "". Rows are sequences in column order or
    mappings keyed by header. Columns whose values are all numbers (None allowed) align
    right unless `align` says otherwise. The text form fits `width` (see Table).
    """
    given = list(columns.items()) if isinstance(columns, Mapping) else list(columns)
    specs = [(c, None) if isinstance(c, str) else c for c in given]
    if not specs or not all(isinstance(c, tuple) and len(c) == 2 and isinstance(c[0], str)
                            for c in specs):
        raise ValueError("columns must be a non-empty list of headers or (header, format) "
                         f"pairs, or a dict header -> format; got columns={columns!r}")
    headers = [h for h, _ in specs]
    values = []
    for i, row in enumerate(rows):
        vals = [row.get(h) for h in headers] if isinstance(row, Mapping) else list(row)
        if len(vals) != len(headers):
            raise ValueError(f"rows[{i}] has {len(vals)} values; columns has "
                             f"{len(headers)} ({', '.join(headers)})")
        values.append(vals)
    if align is None:
        align = "".join("r" if values and all(_is_number(r[j]) for r in values) else "l"
                        for j in range(len(headers)))
    text = [[_cell(v, fmt) for v, (_, fmt) in zip(r, specs, strict=True)] for r in values]
    return Table(headers, text, caption=title, align=align, width=width, key=key, note=note)


def _is_number(v: Any) -> bool:
    return v is None or (isinstance(v, numbers.Number) and not isinstance(v, bool | np.bool_))


def _cell(value: Any, fmt: Fmt) -> str:
    """The text of one cell: value formatted by spec or callable, or str(value)."""
    if callable(fmt):
        return str(fmt(value))
    if value is None:
        return ""
    if isinstance(value, np.generic):
        value = value.item()
    return format(value, fmt) if fmt else str(value)


def _html_text(text: Any) -> str:
    return "<br>".join(html.escape(line) for line in str(text).split("\n"))


def _width_of(lines_per_cell: Iterable[list[str]]) -> int:
    return max((len(line) for lines in lines_per_cell for line in lines), default=0)


def _widths(heads: list[list[str]], cells: list[list[list[str]]]) -> list[int]:
    return [max(_width_of([h]), _width_of([r[j] for r in cells])) for j, h in enumerate(heads)]


def _span(widths: Sequence[int]) -> int:
    """Width of columns of these widths joined by the separator."""
    return sum(widths) + len(_SEP) * max(len(widths) - 1, 0)


def _fit(heads: list[list[str]], cells: list[list[list[str]]], key: int,
         limit: int | None) -> tuple[list[int], list[list[int]]]:
    """Column widths and groups that fit `limit`, wrapping headers and cells in place.

    In turn: headers onto two lines; the key columns to half the width; fewer key columns
    while less than 8 characters would be left beside them; every other column to what is
    left; then groups of the key columns plus as many others as fit.
    """
    widths = _widths(heads, cells)
    if limit is None or _span(widths) <= limit:
        return widths, [list(range(len(heads)))]
    heads[:] = [_wrap_header(h, _width_of([r[j] for r in cells])) for j, h in enumerate(heads)]
    widths = _widths(heads, cells)
    if _span(widths) <= limit:
        return widths, [list(range(len(heads)))]
    keys = list(range(key))
    for j in keys:
        _wrap_column(heads, cells, j, max((limit // 2 - len(_SEP) * key) // max(key, 1), 8))
    widths = _widths(heads, cells)

    def room() -> int:  # what a group leaves beside its key columns
        return limit - _span([widths[j] for j in keys]) - len(_SEP) * bool(keys)

    while keys and room() < 8:
        keys.pop()
    for j in range(len(keys), len(heads)):
        if widths[j] > room():
            _wrap_column(heads, cells, j, room())
    widths = _widths(heads, cells)
    return widths, _groups(widths, keys, limit)


def _wrap_header(lines: list[str], cell_width: int) -> list[str]:
    """Each header line wrapped at spaces onto at most two lines, as narrow as the cells allow."""
    out = []
    for line in lines:
        w = max([1, cell_width, *(len(word) for word in line.split())])  # blank: 1
        while len(textwrap.wrap(line, w, break_on_hyphens=False)) > 2:
            w += 1
        out += textwrap.wrap(line, w, break_on_hyphens=False) or [""]
    return out


def _wrap_column(heads: list[list[str]], cells: list[list[list[str]]], j: int,
                 room: int) -> None:
    """Wrap header and cells of column j, in place, to at most `room` characters."""
    def wrap(lines: list[str]) -> list[str]:
        return [part for line in lines for part in
                (textwrap.wrap(line, room, break_on_hyphens=False) or [""])]

    heads[j] = wrap(heads[j])
    for row in cells:
        row[j] = wrap(row[j])


def _groups(widths: list[int], keys: list[int], limit: int) -> list[list[int]]:
    """Column groups, each the key columns plus as many following columns as fit `limit`."""
    groups: list[list[int]] = []
    current = list(keys)
    for j in range(len(keys), len(widths)):
        if len(current) > len(keys) and _span([widths[i] for i in [*current, j]]) > limit:
            groups.append(current)
            current = list(keys)
        current.append(j)
    groups.append(current)
    return groups


def _block(heads: list[list[str]], cells: list[list[list[str]]], widths: list[int],
           aligns: str, cols: list[int]) -> str:
    """One column group: header lines, a rule, then each row (as many lines as its tallest cell)."""
    def lines(parts: list[list[str]]) -> list[str]:
        height = max(len(p) for p in parts)
        out = []
        for k in range(height):
            row = []
            for p, j in zip(parts, cols, strict=True):
                text = p[k] if k < len(p) else ""
                row.append(text.rjust(widths[j]) if aligns[j] == "r" else text.ljust(widths[j]))
            out.append(_SEP.join(row).rstrip())
        return out

    top = max(len(heads[j]) for j in cols)  # headers sit on their last line
    out = lines([[""] * (top - len(heads[j])) + heads[j] for j in cols])
    out.append(_SEP.join("-" * widths[j] for j in cols))
    for row in cells:
        out += lines([row[j] for j in cols])
    return "\n".join(out)


def _fill(text: str, width: int | None) -> str:
    """Text wrapped to width (each of its lines), or as is when width is None."""
    if width is None:
        return text
    return "\n".join(textwrap.fill(line, width, break_on_hyphens=False) if line.strip() else line
                     for line in text.split("\n"))


def wrap(text: str, width: int = 80, indent: str = "") -> str:
    """Each line of text wrapped at spaces to `width` after `indent`; continuations indent 2 more."""
    return "\n".join(
        textwrap.fill(line, width, initial_indent=indent, subsequent_indent=indent + "  ",
                      break_on_hyphens=False) if line.strip() else line
        for line in str(text).split("\n"))


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
    align = "".join("r" if key in _NUMERIC_FORMAT_COLUMNS else "l" for key, _ in FORMAT_COLUMNS)
    return Table([h for _, h in FORMAT_COLUMNS], text_rows, align=align, width=80)
