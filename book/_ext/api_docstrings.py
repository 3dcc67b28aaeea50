"""precisionlab's docstrings as reStructuredText, for the API reference page (book/api.md).

The package's docstrings are written to be read with help() and in an editor: |x| is an
absolute value, model(*batch) a call, sum_ a function's name and `name` a piece of code.
reStructuredText reads the first as a substitution, the second as the start of emphasis, the
third as a link and the last as a title. Before napoleon turns the numpydoc sections
(Parameters, Returns, Raises, Examples) into fields, each prose line is rewritten so that it
shows what help() shows: |, * and a word's trailing _ escaped, `code` set as a literal, and
so is a quoted value without spaces ("float16", "sgd"), which Sphinx would otherwise print
with typographic quotes that do not paste into Python. Doctest blocks (from a >>> line to the next blank line) and ``literals`` are left as they
are, and so are the type specifications napoleon reads ("name : type" lines).

napoleon reads the first line of an attribute's or a property's docstring as "type:
description" wherever it has a colon ("Exponent of the smallest normal number: ..."), so
for those, where the docstring has no numpydoc section, the escaped lines are put back
after napoleon has run.
"""

from __future__ import annotations

import re

# ``literal``, `code` (either possibly with a role in front, :class:`x`), a quoted value
# without spaces ("float16"), else one character
_SPAN = re.compile(r"(?P<role>:[\w.:+-]+:)?``.+?``|(?P<role2>:[\w.:+-]+:)?`[^`]+`"
                   r'|(?P<quoted>"[^"\s]+")|.', re.S)
_OPENERS = "'\"([{<-/:"  # may stand before inline markup (docutils' rule, ASCII part)
_CLOSERS = "'\")]}>-/:.,;!?\\"  # may stand after it
_TRAILING_UNDERSCORE = re.compile(r"(?<=\w)_(?=\W|$)")
_PARAMETER_LINE = re.compile(r"^\s*\*{0,2}\w+(\s*,\s*\*{0,2}\w+)*\s+:\s")  # "name : type"


def _escape_prose(text: str) -> str:
    """One run of prose between literals: |, * and trailing _ escaped."""
    text = text.replace("\\", "\\\\").replace("|", "\\|").replace("*", "\\*")
    return _TRAILING_UNDERSCORE.sub(r"\\_", text)


def rst_line(line: str) -> str:
    """A prose line of a plain docstring as reStructuredText that renders the same text."""
    out, prose = [], []
    for m in _SPAN.finditer(line):
        span = m.group(0)
        if len(span) == 1:
            prose.append(span)
            continue
        before = "".join(prose)
        out.append(_escape_prose(before))
        prose = []
        if m.group("role") or m.group("role2") or span.startswith("``"):
            out.append(span)  # already reStructuredText
            continue
        code = span if m.group("quoted") else span[1:-1]
        # inline markup needs a space or some punctuation on either side: an escaped
        # space (which renders as nothing) where the text has neither
        prev, nxt = line[max(m.start() - 1, 0):m.start()], line[m.end():m.end() + 1]
        pre = "\\ " if prev and not prev.isspace() and prev not in _OPENERS else ""
        post = "\\ " if nxt and not nxt.isspace() and nxt not in _CLOSERS else ""
        out.append(f"{pre}``{code}``{post}" if code.strip() == code else span)
    out.append(_escape_prose("".join(prose)))
    return "".join(out)


def rst_lines(lines: list[str]) -> list[str]:
    """Every prose line rewritten by rst_line; doctest blocks and "name : type" lines kept."""
    out, in_doctest = [], False
    for line in lines:
        stripped = line.strip()
        if stripped.startswith(">>>"):
            in_doctest = True
        elif not stripped:
            in_doctest = False
        if in_doctest or not stripped or _PARAMETER_LINE.match(line):
            out.append(line)
        else:
            out.append(rst_line(line))
    return out


_SECTION_RULE = re.compile(r"^\s*-{3,}\s*$")  # the line under a numpydoc section's title
_KEPT: dict[int, list[str]] = {}  # id(lines) -> escaped lines, from before napoleon to after


def _escape(app, what, name, obj, options, lines) -> None:
    if not name.startswith("precisionlab."):
        return
    lines[:] = rst_lines(lines)
    if what in ("attribute", "property", "data") and not any(map(_SECTION_RULE.match, lines)):
        _KEPT[id(lines)] = list(lines)


def _restore(app, what, name, obj, options, lines) -> None:
    kept = _KEPT.pop(id(lines), None)
    if kept is not None:
        lines[:] = kept


def setup(app):
    # before napoleon (priority 500), which reads the numpydoc sections of the escaped text
    app.connect("autodoc-process-docstring", _escape, priority=400)
    app.connect("autodoc-process-docstring", _restore, priority=600)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
