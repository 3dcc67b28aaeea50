#!/usr/bin/env python3
"""Turn nbval marker comments into cell tags, in place.

Usage:
    python3 scripts/nbval_tags.py notebooks/04-*.ipynb notebooks/05-*.ipynb
    python3 scripts/nbval_tags.py --check notebooks/*.ipynb   # exit 1 if any marker comment is left

A code cell whose first lines are ``# NBVAL_CHECK_OUTPUT`` or ``# NBVAL_IGNORE_OUTPUT`` (or
any other nbval marker: ``# NBVAL_SKIP``, ``# NBVAL_RAISES_EXCEPTION``) loses those lines
and gains the matching tag (``nbval-check-output``, ``nbval-ignore-output``, ...), which
nbval reads the same way (``find_metadata_tags`` in nbval's plugin). Everything else is
kept: cell ids, other metadata and tags, outputs and execution counts, so the notebook
still counts as stored executed. Readers of the HTML book then see the lesson's code, not
the test scaffolding. A marker comment further down a cell is reported, not moved: it is
not at the top, so someone put it there on purpose and should look.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

import nbformat

MARKERS = {
    "NBVAL_CHECK_OUTPUT": "nbval-check-output",
    "NBVAL_IGNORE_OUTPUT": "nbval-ignore-output",
    "NBVAL_SKIP": "nbval-skip",
    "NBVAL_RAISES_EXCEPTION": "nbval-raises-exception",
}
MARKER_LINE = re.compile(r"^\s*#\s*(" + "|".join(MARKERS) + r")\s*$")
OPPOSITE = {"nbval-check-output": "nbval-ignore-output", "nbval-ignore-output": "nbval-check-output"}


def convert_source(source: str) -> tuple[str, list[str], list[int]]:
    """(source without its leading marker lines, tags they stand for, line numbers of markers
    left further down)."""
    lines = source.split("\n")
    tags: list[str] = []
    while lines and MARKER_LINE.match(lines[0]):
        tags.append(MARKERS[MARKER_LINE.match(lines[0]).group(1)])
        lines.pop(0)
    stray = [i + 1 + len(tags) for i, line in enumerate(lines) if MARKER_LINE.match(line)]
    return "\n".join(lines), tags, stray


def convert_notebook(path: Path, write: bool = True) -> tuple[int, list[str]]:
    """Convert one notebook: (cells changed, problems). Writes only when something changed."""
    nb = nbformat.read(path, as_version=nbformat.NO_CONVERT)
    changed, problems = 0, []
    for index, cell in enumerate(nb.cells):
        if cell.cell_type != "code":
            continue
        source, tags, stray = convert_source(cell.source)
        for line in stray:
            problems.append(f"{path.name}: cell {index}, line {line}: marker comment not at the top")
        if not tags:
            continue
        current = list(cell.metadata.get("tags", []))
        for tag in tags:
            if OPPOSITE.get(tag) in current:
                problems.append(f"{path.name}: cell {index}: comment says {tag} but the cell is "
                                f"tagged {OPPOSITE[tag]}")
            elif tag not in current:
                current.append(tag)
        cell.metadata["tags"] = current
        cell.source = source
        changed += 1
    if changed and write:
        nbformat.write(nb, path)
    return changed, problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("notebooks", nargs="+", type=Path, help="notebooks to convert in place")
    parser.add_argument("--check", action="store_true",
                        help="write nothing; exit 1 if a notebook still has marker comments")
    args = parser.parse_args(argv)
    status = 0
    for path in args.notebooks:
        if not path.is_file():
            print(f"not found: {path}", file=sys.stderr)
            status = 1
            continue
        changed, problems = convert_notebook(path, write=not args.check)
        for problem in problems:
            print(problem, file=sys.stderr)
        if problems or (args.check and changed):
            status = 1
        verb = "would convert" if args.check else "converted"
        print(f"{path.name}: {verb} {changed} cell(s)")
    return status


if __name__ == "__main__":
    sys.exit(main())
