"""scripts/nbval_tags.py: marker comments become cell tags, and nothing else changes."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import nbformat
import pytest
from nbval.plugin import find_comment_markers, find_metadata_tags

ROOT = Path(__file__).resolve().parent.parent
spec = importlib.util.spec_from_file_location("nbval_tags", ROOT / "scripts" / "nbval_tags.py")
nbval_tags = importlib.util.module_from_spec(spec)
spec.loader.exec_module(nbval_tags)


def _notebook(path: Path) -> Path:
    nb = nbformat.v4.new_notebook()
    out = nbformat.v4.new_output("stream", name="stdout", text="42\n")
    nb.cells = [
        nbformat.v4.new_code_cell("# NBVAL_CHECK_OUTPUT\nprint(42)", outputs=[out],
                                  execution_count=1, metadata={"tags": ["hide-input"]}),
        nbformat.v4.new_code_cell("#NBVAL_IGNORE_OUTPUT\n# a comment that stays\nimport os",
                                  execution_count=2),
        nbformat.v4.new_markdown_cell("# NBVAL_CHECK_OUTPUT in prose is left alone"),
        nbformat.v4.new_code_cell("x = 1\n# NBVAL_SKIP", execution_count=3),
        nbformat.v4.new_code_cell("y = 2", execution_count=4),
    ]
    nbformat.write(nb, path)
    return path


def _nbval_view(nb) -> list[dict]:
    """What nbval decides per code cell, from tags and comments together."""
    return [{**dict(find_metadata_tags(c.metadata)), **dict(find_comment_markers(c.source))}
            for c in nb.cells if c.cell_type == "code"]


def test_comments_become_tags_and_nbval_reads_them_the_same(tmp_path):
    path = _notebook(tmp_path / "nb.ipynb")
    before = nbformat.read(path, as_version=4)
    changed, problems = nbval_tags.convert_notebook(path)
    after = nbformat.read(path, as_version=4)
    assert changed == 2
    assert problems == ["nb.ipynb: cell 3, line 2: marker comment not at the top"]
    first, second = after.cells[0], after.cells[1]
    assert first.source == "print(42)" and first.metadata.tags == ["hide-input", "nbval-check-output"]
    assert second.source == "# a comment that stays\nimport os"
    assert second.metadata.tags == ["nbval-ignore-output"]
    assert [c.id for c in after.cells] == [c.id for c in before.cells]
    assert first.outputs == before.cells[0].outputs and first.execution_count == 1
    assert after.cells[2].source == before.cells[2].source  # markdown untouched
    assert after.cells[3].source == before.cells[3].source  # a stray marker is reported only
    assert _nbval_view(after)[:2] == _nbval_view(before)[:2]  # nbval checks the same cells


def test_check_mode_writes_nothing_and_fails_while_comments_remain(tmp_path):
    path = _notebook(tmp_path / "nb.ipynb")
    text = path.read_text()
    assert nbval_tags.main(["--check", str(path)]) == 1
    assert path.read_text() == text
    nbval_tags.convert_notebook(path)
    nb = nbformat.read(path, as_version=4)
    nb.cells[3].source = "x = 1"
    nbformat.write(nb, path)
    assert nbval_tags.main(["--check", str(path)]) == 0


def test_a_comment_contradicting_a_tag_is_reported(tmp_path):
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell("# NBVAL_CHECK_OUTPUT\n1",
                                          metadata={"tags": ["nbval-ignore-output"]})]
    path = tmp_path / "c.ipynb"
    nbformat.write(nb, path)
    _, problems = nbval_tags.convert_notebook(path)
    assert problems and "tagged nbval-ignore-output" in problems[0]


@pytest.mark.parametrize("line", ["# NBVAL_CHECK_OUTPUT", "  #NBVAL_CHECK_OUTPUT  ", "#  NBVAL_SKIP"])
def test_marker_lines_are_recognised(line):
    assert nbval_tags.MARKER_LINE.match(line)
