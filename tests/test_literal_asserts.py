"""No assert that cannot fail: every comparison in an assert must involve a computed value.

An assert such as ``f"{8 * 2.0**-23:.3g}" == "9.54e-07"`` checks Python's own arithmetic on
numbers typed into the cell, not anything the chapter computed, so it passes whatever the
package does. This test parses every code cell of every notebook (the chapters' hidden claim checks) and
rejects asserts whose test is a literal, or a comparison all of whose operands are built from
literals only (constants, operators, f-strings, containers and calls of a few builtins).
"""

from __future__ import annotations

import ast
import pathlib

import nbformat
import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
BUILTINS = {"float", "int", "abs", "round", "str", "format", "pow", "len", "min", "max", "sum",
            "complex", "bool", "divmod", "repr", "tuple", "list", "set", "frozenset", "sorted"}


def literal_only(node: ast.AST) -> bool:
    """True when the expression uses no variable: constants, operators, f-strings, builtins."""
    for sub in ast.walk(node):
        if isinstance(sub, ast.Name) and sub.id not in BUILTINS:
            return False
        if isinstance(sub, (ast.Attribute, ast.Subscript, ast.Lambda, ast.NamedExpr,
                            ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp,
                            ast.Await, ast.Yield, ast.YieldFrom, ast.Starred)):
            return False
    return True


def _tests_of(assert_node: ast.Assert):
    """The assert's test and, through `and`/`not`, every conjunct in it."""
    todo = [assert_node.test]
    while todo:
        t = todo.pop()
        yield t
        if isinstance(t, ast.BoolOp) and isinstance(t.op, ast.And):
            todo.extend(t.values)
        elif isinstance(t, ast.UnaryOp) and isinstance(t.op, ast.Not):
            todo.append(t.operand)


def vacuous_asserts(source: str) -> list[str]:
    """The source text of every assert (or conjunct) that compares literals only."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Assert):
            continue
        for t in _tests_of(node):
            if isinstance(t, ast.Compare):
                if literal_only(t):
                    found.append(ast.get_source_segment(source, t) or ast.dump(t))
            elif not isinstance(t, (ast.BoolOp, ast.UnaryOp)) and literal_only(t):
                found.append(ast.get_source_segment(source, t) or ast.dump(t))
    return found


def _cell_source(text: str) -> str:
    """A code cell as Python: IPython magics and shell escapes dropped."""
    def magic(line: str) -> bool:  # a line that begins with != continues an expression
        s = line.lstrip()
        return s.startswith("%") or (s.startswith("!") and not s.startswith("!="))
    return "\n".join("" if magic(line) else line for line in text.splitlines())


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_asserts_check_computed_values(path):
    nb = nbformat.read(path, as_version=4)
    bad = [f"cell {i}: {text}" for i, cell in enumerate(nb.cells) if cell.cell_type == "code"
           for text in vacuous_asserts(_cell_source(cell.source))]
    assert not bad, "asserts that compare literals only (they cannot fail):\n" + "\n".join(bad)


@pytest.mark.parametrize(("source", "flagged"), [
    ('assert f"{8 * 2.0**-23:.3g}" == "9.54e-07"', True),
    ('assert f"{2.5e-3 / 2**-7:.2f}" == "0.32"', True),
    ("assert x == 1 and 2 < 3", True),
    ("assert True", True),
    ("assert not 1 == 2", True),
    ("assert float(2.0**-8) == 0.00390625", True),
    ('assert f"{step:.3g}" == "9.54e-07"', False),
    ("assert ulp(0.5) == 2.0**-8", False),
    ("assert a.b == 1", False),
    ("assert xs[0] == 1", False),
    ("assert all(v > 0 for v in (1, 2))", False),
])
def test_the_detector(source, flagged):
    assert bool(vacuous_asserts(source)) == flagged
