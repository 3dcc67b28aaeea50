"""tables.show and tables.Table: text no wider than its width, column groups that repeat the
key, every cell present, HTML escaped and complete (read back with the standard library's
HTMLParser), formats per column, and errors that name the bad argument."""

from __future__ import annotations

import math
import re
from html.parser import HTMLParser

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from precisionlab import tables
from precisionlab.tables import Table, format_table, show


class _Cells(HTMLParser):
    """Text of every th/td (with <br> as a newline), caption and rows, as a browser reads them."""

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.rows, self.caption, self._cell, self._in_caption = [], "", None, False

    def handle_starttag(self, tag, attrs):
        if tag == "tr":
            self.rows.append([])
        elif tag in ("td", "th"):
            self._cell = ""
        elif tag == "br" and self._cell is not None:
            self._cell += "\n"
        elif tag == "caption":
            self._in_caption = True

    def handle_endtag(self, tag):
        if tag in ("td", "th"):
            self.rows[-1].append(self._cell)
            self._cell = None
        elif tag == "caption":
            self._in_caption = False

    def handle_data(self, data):
        if self._cell is not None:
            self._cell += data
        elif self._in_caption:
            self.caption += data


def read_html(table: Table) -> _Cells:
    parser = _Cells()
    parser.feed(table._repr_html_())
    parser.close()
    return parser


def split_cells(line: str) -> list[str]:
    """The cells of one text line: separated by two or more spaces."""
    return [c for c in re.split(r" {2,}", line.strip()) if c]


def blocks(text: str) -> list[list[str]]:
    """The column groups of a text table (separated by one blank line)."""
    return [b.splitlines() for b in text.split("\n\n")]


def parts(group: list[str]) -> tuple[list[str], list[str]]:
    """A group's header lines (above the rule of dashes) and its body lines."""
    rule = next(i for i, line in enumerate(group) if set(line) <= {"-", " "})
    return group[:rule], group[rule + 1:]


def test_a_small_table_is_one_block_with_the_exact_layout():
    t = show([("a", 1, 0.5), ("bb", 22, 0.25)], ["name", "n", ("x", ".3f")])
    assert t.to_text() == ("name   n      x\n"
                           "----  --  -----\n"
                           "a      1  0.500\n"
                           "bb    22  0.250")
    assert repr(t) == t.to_text() and t.align == "lrr"


def test_formats_per_column_spec_callable_and_default():
    rows = [(np.float64(0.1), 2.0**-11, None, np.int64(3), True),
            (1e-5, 2.0**-24, 7, 4, False)]
    t = show(rows, [("a", ".2e"), ("b", tables.format_value), ("c", "d"), "d", "e"])
    assert [list(r) for r in t.rows] == [["1.00e-01", "2^-11", "", "3", "True"],
                                         ["1.00e-05", "2^-24", "7", "4", "False"]]
    assert t.align == "rrrrl"  # booleans are not numbers; None does not count against
    # mappings keyed by header give the same table
    as_dicts = show([dict(zip("abcde", r, strict=True)) for r in rows],
                    {"a": ".2e", "b": tables.format_value, "c": "d", "d": None, "e": None})
    assert as_dicts == t


def test_wide_tables_split_into_groups_that_repeat_the_key():
    headers = ["case"] + [f"column {j}" for j in range(12)]
    rows = [[f"case {i}"] + [f"{i}.{j}" for j in range(12)] for i in range(5)]
    t = show(rows, headers)
    text = t.to_text()
    assert max(len(line) for line in text.splitlines()) <= 80
    groups = blocks(text)
    assert len(groups) >= 2
    seen = {i: [] for i in range(5)}
    for g in groups:
        head, body = parts(g)
        assert split_cells(head[-1])[0] == "case"
        assert len(body) == 5
        for i, line in enumerate(body):
            cells = split_cells(line)
            assert cells[0] == f"case {i}"  # the key, repeated in every group
            seen[i] += cells[1:]
    # every cell once, in column order
    assert seen == {i: [f"{i}.{j}" for j in range(12)] for i in range(5)}


def test_long_text_cells_wrap_and_keep_every_word():
    story = ("a fused matmul plus bias whose epilogue forgets the bias in the last four "
             "columns, compared with a float64 reference on every element")
    t = show([("fused bias dropped", story, 0.0165), ("ok", "short", 1.0)],
             ["case", "story", ("max diff", ".3g")])
    lines = t.to_text().splitlines()
    assert max(len(line) for line in lines) <= 80
    text = t.to_text()
    for g in blocks(text):
        head, body = parts(g)
        if "story" in head[-1]:
            start = head[-1].index("story")
            first = next(i for i, line in enumerate(body) if line.startswith("fused"))
            pieces = []
            for line in body[first:]:
                if pieces and not line.startswith(" "):
                    break  # the next row
                pieces.append(line[start:].split("  ")[0].strip())
            assert " ".join(pieces) == story
    assert "0.0165" in text


def test_headers_wrap_before_the_table_splits():
    t = show([(1, 2, 3, 4, 5, 6, 7, 8)],
             [f"long header {j}" for j in range(8)])
    text = t.to_text()
    assert max(len(line) for line in text.splitlines()) <= 80
    assert len(blocks(text)) == 1  # wrapped headers make it fit in one block
    head, _ = parts(blocks(text)[0])
    assert head == ["    long" + "      long" * 7,
                    "header 0" + "".join(f"  header {j}" for j in range(1, 8))]


def test_width_none_keeps_one_line_per_row():
    t = Table(["a", "b"], [["x" * 60, "y" * 60]])
    assert t.to_text().splitlines()[2] == "x" * 60 + "  " + "y" * 60


def test_caption_and_note_are_wrapped_to_the_width():
    t = show([(1,)], ["n"], title="word " * 30, note="note " * 30)
    lines = t.to_text().splitlines()
    assert max(len(line) for line in lines) <= 80
    assert lines[0].startswith("word") and lines[-1].startswith("note")


@settings(max_examples=60, deadline=None)
@example(20, 0, [["", "", ""]], ["A", " ", "AAAAAAAAAAAAAAA"])  # blank header, empty cells
@given(st.integers(20, 120), st.integers(0, 2),
       st.lists(st.lists(st.text("abc xyz-0123.", max_size=40), min_size=3, max_size=3),
                min_size=1, max_size=4),
       st.lists(st.text("ABC DEF", min_size=1, max_size=30), min_size=3, max_size=3))
def test_no_text_line_is_wider_than_the_width(width, key, rows, headers):
    t = show(rows, headers, width=width, key=key)
    assert max(len(line) for line in t.to_text().splitlines()) <= width


def test_html_is_a_table_with_every_cell_escaped():
    rows = [("<script>alert(1)</script>", "a & b", 1.5), ("x\ny", '"q"', None)]
    t = show(rows, ["<h>", "h & h", ("v", ".2f")], title="cap <i>", note="n & m")
    markup = t._repr_html_()
    assert markup.startswith("<table") and markup.endswith("</table>")
    assert "<script>" not in markup and "<h>" not in markup and "<i>" not in markup
    read = read_html(t)
    assert read.caption == "cap <i>"
    assert read.rows[0] == ["<h>", "h & h", "v"]
    assert read.rows[1:3] == [["<script>alert(1)</script>", "a & b", "1.50"],
                              ["x\ny", '"q"', ""]]
    assert read.rows[3] == ["n & m"]  # the note, one cell across the table
    assert markup.count("<td ") == 7 and markup.count("<th ") == 3


def test_html_wraps_and_aligns_numbers_right():
    t = show([("a", 1.0)], ["name", "v"])
    markup = t._repr_html_()
    assert "white-space:normal" in markup and "nowrap" not in markup
    assert "table-layout:auto" in markup and "max-width:100%" in markup
    assert markup.count("text-align:right") == 2  # the v header and its cell
    wide = show([tuple(range(12))], [f"column {j}" for j in range(12)])._repr_html_()
    wider = show([tuple(range(20))], [f"column {j}" for j in range(20)])._repr_html_()
    assert "font-size:0.9em" in markup and "padding:1px 8px" in markup
    assert "font-size:0.8em" in wide and "padding:1px 6px" in wide
    assert "font-size:0.7em" in wider and "padding:1px 4px" in wider


def test_the_format_table_fits_and_repeats_the_format_name():
    t = format_table()
    text = t.to_text()
    assert max(len(line) for line in text.splitlines()) <= 80
    for g in blocks(text):
        names = [split_cells(line)[0] for line in g if line.startswith(("float", "tf32", "bf"))]
        assert names == ["float64", "float32", "tf32", "float16", "bfloat16",
                         "float8_e4m3fn", "float8_e5m2"]
    assert len(read_html(t).rows) == 8


@pytest.mark.parametrize("kwargs, word", [
    ({"rows": [(1, 2)], "columns": ["a"]}, "rows[0]"),
    ({"rows": [(1,)], "columns": []}, "columns"),
    ({"rows": [(1,)], "columns": [("a", "d", "x")]}, "columns"),
    ({"rows": [(1,)], "columns": ["a"], "align": "c"}, "align"),
    ({"rows": [(1,)], "columns": ["a"], "width": 5}, "width"),
    ({"rows": [(1, 2)], "columns": ["a", "b"], "key": 3}, "key"),
])
def test_bad_arguments_raise_naming_the_argument(kwargs, word):
    with pytest.raises(ValueError, match=re.escape(word)):
        show(**kwargs)


def test_wrap_keeps_every_word_and_indents_continuations():
    text = ("fused bias dropped: Type-II by the structure bound; matmul + bias (fused): "
            "Type-II (structure bound) at (6, 13): reference -2.20448435 OUTSIDE "
            "[-2.2226634, -2.21934915], margin -0.0149, width 0.00331\nsecond line")
    out = tables.wrap(text, 60, indent="  ")
    lines = out.splitlines()
    assert max(len(line) for line in lines) <= 60
    assert lines[0].startswith("  fused") and all(line.startswith("    ")
                                                  for line in lines[1:-1])
    assert lines[-1] == "  second line"
    assert out.split() == text.split()  # no word lost, split or hyphen-broken


def _patterns(name: str) -> np.ndarray:
    """Every value of an ml_dtypes format, one per bit pattern (float64)."""
    import ml_dtypes

    dt = getattr(ml_dtypes, name)
    bits = 8 if name.startswith("float8") else 6 if name.startswith("float6") else 4
    return np.arange(2**bits, dtype=np.uint8).view(dt).astype(np.float64)


@pytest.mark.parametrize("name", ["float8_e4m3fn", "float8_e5m2", "float6_e3m2fn",
                                  "float6_e2m3fn", "float4_e2m1fn", "float8_e8m0fnu"])
def test_specials_say_what_every_bit_pattern_holds(name):
    """The specials column against ml_dtypes: inf, NaN, zero and sign as the patterns have them,
    and overflow as its cast does it (the OCP MX spec: FP6/FP4 saturate, E8M0's NaN is 0xFF)."""
    import ml_dtypes

    text = tables.format_rows([name])[0]["specials"]
    v = _patterns(name)
    has_inf, has_nan = bool(np.isinf(v).any()), bool(np.isnan(v).any())
    assert ("inf" in text.replace("no inf", "")) == has_inf, text
    assert ("NaN" in text.replace("no NaN", "").split("(")[0]) == has_nan, text
    assert ("no zero" in text) == (not (v == 0).any()), text
    assert ("no sign" in text) == (not (v < 0).any()), text
    big = np.array([2.0**127 * 1.75], np.float32).astype(getattr(ml_dtypes, name))
    over = float(big.astype(np.float64)[0])
    said = text.split("overflow")[-1]
    if math.isinf(over):
        assert "inf" in said
    elif math.isnan(over):
        assert "NaN" in said
    else:
        assert over == float(ml_dtypes.finfo(getattr(ml_dtypes, name)).max) and "saturate" in said
