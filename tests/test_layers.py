"""The package's layout, read from its source with `ast`: rooms import only downwards (no
cycle between top-level rooms), chapter code (`precisionlab.chapters`) is imported by
widgets and notebooks only, widgets by nobody in the package, no private name crosses a
module boundary, and each chapter module says which chapter it serves."""

from __future__ import annotations

import ast
import graphlib
import pathlib

import pytest

SRC = pathlib.Path(__file__).resolve().parents[1] / "src" / "precisionlab"
MODULES = sorted(p for p in SRC.rglob("*.py") if "__pycache__" not in p.parts)


def _name(path: pathlib.Path) -> str:
    parts = ("precisionlab", *path.relative_to(SRC).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: pathlib.Path) -> list[tuple[str, list[str]]]:
    """(absolute module imported, names taken from it) for each precisionlab import."""
    here = _name(path)
    package = here if path.name == "__init__.py" else here.rsplit(".", 1)[0]
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[:len(base) - node.level + 1]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            if mod.startswith("precisionlab"):
                out.append((mod, [a.name for a in node.names]))
        elif isinstance(node, ast.Import):
            out += [(a.name, []) for a in node.names if a.name.startswith("precisionlab")]
    return out


def _room(module: str) -> str:
    """The top-level room of a module: precisionlab.intervals.torch_ops.rules -> intervals."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


GRAPH = {_name(p): _imports(p) for p in MODULES}


def test_the_layout_is_read_from_every_module():
    assert len(GRAPH) > 100 and "precisionlab.chapters.quantize_runs" in GRAPH


def test_rooms_import_only_downwards():
    deps: dict[str, set[str]] = {}
    for mod, imports in GRAPH.items():
        room = _room(mod)
        if not room:
            continue
        for target, names in imports:
            # `from .. import emulate` names the room in the imported names
            rooms = {_room(target)} if _room(target) else {n for n in names}
            deps.setdefault(room, set()).update(r for r in rooms if r != room)
    order = list(graphlib.TopologicalSorter(deps).static_order())  # raises on a cycle
    assert order.index("formats") < order.index("intervals") < order.index("diagnose")


@pytest.mark.parametrize("module", sorted(GRAPH))
def test_chapter_code_is_imported_by_widgets_and_chapters_only(module):
    if _room(module) in ("chapters", "widgets"):
        return
    for target, names in GRAPH[module]:
        assert _room(target) != "chapters" and not (
            target == "precisionlab" and "chapters" in names), (module, target)


@pytest.mark.parametrize("module", sorted(GRAPH))
def test_no_module_in_the_package_imports_widgets(module):
    if _room(module) == "widgets":
        return
    for target, names in GRAPH[module]:
        assert _room(target) != "widgets" and "widgets" not in names, (module, target)


@pytest.mark.parametrize("module", sorted(GRAPH))
def test_no_private_name_crosses_a_module_boundary(module):
    for target, names in GRAPH[module]:
        private = [n for n in names if n.startswith("_") and not n.startswith("__")]
        assert target == module or not private, (module, target, private)


@pytest.mark.parametrize("path", [p for p in MODULES if p.parent.name == "chapters"],
                         ids=lambda p: p.stem)
def test_each_chapter_module_says_which_chapter_it_serves(path):
    doc = ast.get_docstring(ast.parse(path.read_text()))
    assert doc, path
    if path.name != "__init__.py":
        assert doc.startswith("Chapter"), doc.splitlines()[0]
