"""Consistency checks on the repository itself: configuration, notebooks, README and CI.

These guard the conventions that the book relies on but that no build step enforces:
one repository URL, notebooks stored executed and listed in the table of contents, a
hidden set-up cell without sys.path tricks, CI running the README's command, and torch
pinned only where it should be.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import nbformat
import pytest
import yaml

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    tomllib = pytest.importorskip("tomli")

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
SKIP_DIRS = {
    ".git",
    "_build",
    "notebooks",
    ".pytest_cache",
    ".hypothesis",
    "__pycache__",
    ".ipynb_checkpoints",
    ".ruff_cache",
}
TEXT_SUFFIXES = {".py", ".md", ".toml", ".txt", ".yml", ".yaml", ".cfg", ".bib", ".ini", ""}

# `git+<URL>` inside the pip install line, optionally followed by @ref or #fragment.
GIT_URL = re.compile(r"git\+(?P<url>https?://[^\s\"'@#]+?)(?:\.git)?(?=[\s\"'@#]|$)")


def _config() -> dict:
    return yaml.safe_load((ROOT / "_config.yml").read_text(encoding="utf-8"))


def _repo_url() -> str:
    return _config()["repository"]["url"].rstrip("/")


def _toc_files(node) -> list[str]:
    """All `file:` entries of a jb-book _toc.yml, in order (root first)."""
    found = []
    if isinstance(node, dict):
        for key in ("root", "file"):
            if key in node:
                found.append(str(node[key]))
        for value in node.values():
            if isinstance(value, (list, dict)):
                found.extend(_toc_files(value))
    elif isinstance(node, list):
        for item in node:
            found.extend(_toc_files(item))
    return found


def _readme_commands() -> tuple[str, str]:
    """The two commands between the README's commands:start/end markers."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    section = text.split("<!-- commands:start -->", 1)[1].split("<!-- commands:end -->", 1)[0]
    blocks = [b.strip() for b in re.findall(r"^```bash\n(.*?)^```", section, re.S | re.M)]
    assert len(blocks) == 2, f"expected exactly two commands in the README, found {blocks}"
    return blocks[0], blocks[1]


def _first_cell(path: Path):
    nb = nbformat.read(path, as_version=4)
    assert nb.cells, f"{path.name} has no cells"
    return nb.cells[0]


# --- (i) one repository URL ------------------------------------------------------------


def test_repository_url_appears_once_in_config():
    url = _repo_url()
    assert url.startswith("https://"), url
    text = (ROOT / "_config.yml").read_text(encoding="utf-8")
    assert text.count(url) == 1, f"{url} must appear exactly once in _config.yml"


def test_repository_url_not_duplicated_elsewhere():
    """Outside _config.yml (and the notebooks' set-up cells) nothing hard-codes the URL."""
    slug = _repo_url().split("://", 1)[1].split("/", 1)[1]  # owner/name
    offenders = []
    for dirpath, dirnames, filenames in os.walk(ROOT):
        dirnames[:] = [d for d in dirnames if d not in SKIP_DIRS and not d.endswith(".egg-info")]
        for name in filenames:
            path = Path(dirpath) / name
            if path == ROOT / "_config.yml" or path.suffix not in TEXT_SUFFIXES:
                continue
            try:
                if slug in path.read_text(encoding="utf-8"):
                    offenders.append(str(path.relative_to(ROOT)))
            except (UnicodeDecodeError, OSError):
                continue
    assert not offenders, f"repository URL hard-coded outside _config.yml: {offenders}"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_installs_from_configured_url(path):
    source = _first_cell(path).source
    assert "%pip install" in source, f"{path.name}: first cell has no %pip install line"
    urls = [m.group("url") for m in GIT_URL.finditer(source)]
    assert urls, f"{path.name}: first cell has no git+<URL> install"
    assert set(urls) == {_repo_url()}, (
        f"{path.name}: installs from {urls}, but _config.yml says {_repo_url()}"
    )


# --- (ii) the hidden set-up cell ---------------------------------------------------------


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_first_cell_is_hidden_setup(path):
    cell = _first_cell(path)
    assert cell.cell_type == "code", f"{path.name}: first cell must be the code set-up cell"
    tags = cell.get("metadata", {}).get("tags", [])
    assert "remove-cell" in tags, f"{path.name}: first cell must be tagged remove-cell"
    assert "import precisionlab" in cell.source


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_has_no_sys_path_manipulation(path):
    nb = nbformat.read(path, as_version=4)
    for index, cell in enumerate(nb.cells):
        if cell.cell_type == "code":
            assert "sys.path" not in cell.source, f"{path.name}: cell {index} touches sys.path"


# --- (iii) table of contents and notebooks agree ---------------------------------------


def test_toc_entries_exist():
    entries = _toc_files(yaml.safe_load((ROOT / "_toc.yml").read_text(encoding="utf-8")))
    assert entries and entries[0] == "book/intro"
    missing = []
    for entry in entries:
        if entry.startswith("notebooks/") and not NOTEBOOKS:
            continue  # no chapter written yet; test_toc_lists_every_notebook covers it later
        if not any((ROOT / f"{entry}{ext}").is_file() for ext in ("", ".md", ".ipynb")):
            missing.append(entry)
    assert not missing, f"_toc.yml lists files that do not exist: {missing}"


def test_toc_lists_every_notebook():
    if not NOTEBOOKS:
        pytest.skip("notebooks/ has no notebooks yet")
    entries = _toc_files(yaml.safe_load((ROOT / "_toc.yml").read_text(encoding="utf-8")))
    listed = {e.removesuffix(".ipynb") for e in entries if e.startswith("notebooks/")}
    present = {f"notebooks/{p.stem}" for p in NOTEBOOKS}
    assert present - listed == set(), f"notebooks missing from _toc.yml: {present - listed}"
    assert listed - present == set(), f"_toc.yml lists absent notebooks: {listed - present}"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_name_follows_convention(path):
    assert re.fullmatch(r"\d{2}-[a-z0-9]+(-[a-z0-9]+)*\.ipynb", path.name), path.name


# --- (iv) notebooks are stored executed --------------------------------------------------


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_is_stored_executed_in_order(path):
    nb = nbformat.read(path, as_version=4)
    counts = [c.execution_count for c in nb.cells if c.cell_type == "code" and c.source.strip()]
    assert counts, f"{path.name} has no code cells"
    assert None not in counts, f"{path.name}: some code cells were never executed"
    assert counts == list(range(1, len(counts) + 1)), (
        f"{path.name}: execution counts {counts} are not one clean top-to-bottom run; "
        "re-run scripts/execute_notebooks.py"
    )


# --- (v) CI runs the README's test command -----------------------------------------------


CI_STEPS = ("-m ruff check .", "scripts/nbval_tags.py --check", "-m pytest",
            "ATEN_CPU_CAPABILITY=default python3 -m pytest",
            "-m jupyter book build . -W -n --keep-going", "-m browser", '-m "colab or newest"')


def test_ci_runs_readme_test_command_verbatim():
    build_command, test_command = _readme_commands()
    assert build_command.endswith(" && make book") and test_command.endswith(" && make ci")
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    assert test_command in ci, ".ci/run must contain the README's test command verbatim"
    assert ci.startswith("#!/usr/bin/env bash\n")
    assert "set -euo pipefail" in ci
    # ... in a virtual environment of its own, first on PATH, so that nothing installed on
    # the machine by hand can stand in for a missing requirement
    venv = ci.index('python3 -m venv "$venv"')
    assert venv < ci.index('export PATH="$venv/bin:$PATH"') < ci.index(test_command)


def test_make_ci_runs_every_step():
    if shutil.which("make") is None:
        pytest.skip("GNU make is not installed")
    run = {"cwd": ROOT, "capture_output": True, "text": True, "check": True}
    steps = subprocess.run(["make", "-n", "ci"], **run).stdout
    missing = [step for step in CI_STEPS if step not in steps]
    assert not missing, f"`make ci` no longer runs {missing}:\n{steps}"
    assert re.search(r"^ATEN_CPU_CAPABILITY=default .*-m pytest.* notebooks$", steps, re.M)
    assert "-m jupyter book build ." in subprocess.run(["make", "-n", "book"], **run).stdout


def test_ci_script_is_executable():
    assert os.access(ROOT / ".ci" / "run", os.X_OK), "chmod +x .ci/run"


def test_readme_commands_install_then_run_one_line_each():
    build_command, test_command = _readme_commands()
    for command in (build_command, test_command):
        assert command.startswith("python3 -m pip install -r requirements.txt && ")
        assert "\n" not in command, "each README command must be a single line"


# --- (vi) torch pins ---------------------------------------------------------------------


def test_requirements_pin_torch_exactly():
    lines = [
        ln.split("#", 1)[0].strip()
        for ln in (ROOT / "requirements.txt").read_text(encoding="utf-8").splitlines()
    ]
    lines = [ln for ln in lines if ln]
    assert "torch==2.13.0" in lines
    assert "-e ." in lines, "requirements.txt must install the package (-e .)"


def test_pyproject_does_not_pin_torch():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    specs = list(project["dependencies"])
    for extra in project.get("optional-dependencies", {}).values():
        specs.extend(extra)
    torch_specs = [s for s in specs if re.match(r"torch\b(?![-_a-z])", s)]
    assert torch_specs, "pyproject.toml must depend on torch"
    for spec in specs:
        assert "==" not in spec, f"pyproject.toml must only lower-bound dependencies: {spec}"


# --- (vii) nbval markers are cell tags, not comments readers see ---------------------------

NBVAL_MARKER = re.compile(r"^\s*#\s*(NBVAL_[A-Z_]+|PYTEST_VALIDATE_IGNORE_OUTPUT)\s*$", re.M)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_code_has_no_nbval_marker_comments(path):
    """Markers live in cell metadata (tags nbval-check-output / nbval-ignore-output)."""
    nb = nbformat.read(path, as_version=4)
    found = [(index, m.group(1)) for index, cell in enumerate(nb.cells) if cell.cell_type == "code"
             for m in NBVAL_MARKER.finditer(cell.source)]
    assert not found, (
        f"{path.name}: nbval marker comments in code cells {found}; convert them with "
        f"`python3 scripts/nbval_tags.py notebooks/{path.name}`"
    )


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_checks_some_outputs_by_tag(path):
    """nbval --nbval-lax compares only tagged cells: a chapter with none checks no number."""
    nb = nbformat.read(path, as_version=4)
    tagged = [index for index, cell in enumerate(nb.cells) if cell.cell_type == "code"
              and "nbval-check-output" in cell.get("metadata", {}).get("tags", [])]
    assert tagged, f"{path.name}: no code cell is tagged nbval-check-output"


def test_sidebar_numbers_match_chapter_numbers():
    """The book numbers chapters by their place in _toc.yml; NN-... must be that place."""
    toc = yaml.safe_load((ROOT / "_toc.yml").read_text(encoding="utf-8"))
    numbered = [entry["file"] for part in toc.get("parts", []) if part.get("numbered")
                for entry in part.get("chapters", [])]
    names = [Path(f).name for f in numbered]
    assert [int(n[:2]) for n in names] == list(range(1, len(names) + 1)), (
        f"the sidebar numbers {names} as 1..{len(names)}: list every chapter, in order"
    )
