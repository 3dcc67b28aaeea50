"""One release number everywhere, the licence files, citation metadata, the notebook download.

pyproject.toml's `[project] version` is the release number. The package, the book's footer
(_config.yml), CITATION.cff and the top entry of CHANGELOG.md must all say the same; a
release bump that misses one fails here. The workshop page pins a commit, and any tag it
names must exist.
"""

from __future__ import annotations

import datetime
import importlib.util
import re
import subprocess
from pathlib import Path

import pytest
import yaml

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    tomllib = pytest.importorskip("tomli")

ROOT = Path(__file__).resolve().parent.parent
SEMVER = re.compile(r"\d+\.\d+\.\d+")


def _text(name: str) -> str:
    return (ROOT / name).read_text(encoding="utf-8")


def _project() -> dict:
    return tomllib.loads(_text("pyproject.toml"))["project"]


def _version() -> str:
    version = _project()["version"]
    assert SEMVER.fullmatch(version), f"pyproject version {version!r} is not X.Y.Z"
    return version


def _citation() -> dict:
    return yaml.safe_load(_text("CITATION.cff"))


def test_package_version_is_the_release():
    spec = importlib.util.spec_from_file_location("_pl_init",
                                                  ROOT / "src" / "precisionlab" / "__init__.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.__version__ == _version()


def test_book_footer_names_the_release():
    footer = yaml.safe_load(_text("_config.yml"))["html"]["extra_footer"]
    assert re.findall(r"version (\S+?)\.?(?:\s|<|$)", footer) == [_version()], footer


def test_changelog_top_entry_is_the_release():
    entries = re.findall(r"^## \[([^\]]+)\] - (\d{4}-\d{2}-\d{2})", _text("CHANGELOG.md"), re.M)
    assert entries, "CHANGELOG.md has no '## [X.Y.Z] - YYYY-MM-DD' entry"
    assert entries[0][0] == _version()
    assert entries[0][1] == str(_citation()["date-released"])
    versions = [tuple(map(int, v.split("."))) for v, _ in entries]
    assert versions == sorted(versions, reverse=True) and len(set(versions)) == len(versions)


def test_workshop_page_pins_only_what_exists():
    """The pinning instructions name a commit placeholder, and any tag they name exists."""
    page = _text("book/workshop.md")
    assert "@<commit>" in page and "git checkout <commit>" in page
    named = set(re.findall(r"(?:@|--branch |/blob/|checkout )(v\d+\.\d+\.\d+)", page))
    if named:
        if not (ROOT / ".git").exists():
            pytest.skip("not a git checkout: cannot list the tags")
        tags = subprocess.run(["git", "tag", "--list"], cwd=ROOT, capture_output=True,
                              text=True, check=True).stdout.split()
        assert named <= set(tags), f"the workshop page pins tags that do not exist: {named}"


def test_citation_metadata():
    cff = _citation()
    assert cff["cff-version"] == "1.2.0"
    assert str(cff["version"]) == _version()
    authors = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["authors"]
    assert cff["authors"] == [{"name": authors[0]["name"]}]  # one name for the authors
    assert cff["title"] and cff["message"] and cff["type"] == "software"
    datetime.date.fromisoformat(str(cff["date-released"]))
    assert cff["license"] == ["CC-BY-4.0", "MIT"]
    config = yaml.safe_load(_text("_config.yml"))
    assert cff["repository-code"].rstrip("/") == config["repository"]["url"].rstrip("/")


def test_licence_files():
    mit = _text("LICENSE")
    assert mit.startswith("MIT License\n") and "The Numerics Under Pressure authors" in mit
    assert "WITHOUT WARRANTY OF ANY KIND" in mit
    text = _text("LICENSE-text")
    assert text.startswith("Attribution 4.0 International\n")
    sections = re.findall(r"^Section (\d) -- ", text, re.M)
    assert sections == [str(i) for i in range(1, 9)], sections
    assert text.rstrip().endswith("Creative Commons may be contacted at creativecommons.org.")
    assert _project()["license"] == "MIT" and "LICENSE" in _project()["license-files"]


def _notebook_download():
    path = ROOT / "book" / "_ext" / "notebook_download.py"
    spec = importlib.util.spec_from_file_location("_notebook_download", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# What sphinx-book-theme 1.x writes for a notebook page's download menu (abridged).
MENU = """<li><a href="../_sources/notebooks/01-float-formats-and-rounding.ipynb" target="_blank"
   class="btn btn-sm btn-download-source-button dropdown-item"
   title="Download source file"
   data-bs-placement="left" data-bs-toggle="tooltip"
>"""


def test_download_menu_saves_the_notebook():
    out = _notebook_download().add_download_attribute(MENU)
    assert ('<a href="../_sources/notebooks/01-float-formats-and-rounding.ipynb" '
            'download="01-float-formats-and-rounding.ipynb"') in out
    assert 'target="_blank"' not in out and "Download source file" not in out


def test_download_menu_leaves_other_links():
    page = MENU.replace(".ipynb", ".md") + '<a href="https://example.org" target="_blank">'
    assert _notebook_download().add_download_attribute(page) == page
