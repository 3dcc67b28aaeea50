"""The workshop handout: scripts/build_pdf.py prints a built HTML book into one PDF.

A two-page book written here in the shape Jupyter Book 1 gives its pages (index.html that
redirects to the root page, `article.bd-article`, "next" links, a folded sphinx-exercise
solution, a hidden code-cell source, a figure) is printed with the system's Chromium; the
PDF is read back with pypdf: pages, the text in reading order, the solution moved to the
end, the hidden source left out, the figure embedded. Skipped where Chromium, playwright
or pypdf is missing. With `pytest -m browser` and a built book in _build/html (or
$PRECISIONLAB_BOOK_HTML), the whole book is printed too.
"""

from __future__ import annotations

import importlib.util
import os
import zlib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SOLUTION = "The bound is three units in the last place"
EXERCISE = "Which bound holds for the sum"
HIDDEN = "secret_setup_code"

pytestmark = pytest.mark.browser


def _script():
    spec = importlib.util.spec_from_file_location("_build_pdf", ROOT / "scripts" / "build_pdf.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _png(width: int = 40, height: int = 20) -> bytes:
    """A small grey PNG, written by hand (8-bit greyscale, one filter byte per row)."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        body = kind + data
        return len(data).to_bytes(4, "big") + body + zlib.crc32(body).to_bytes(4, "big")

    rows = b"".join(b"\x00" + bytes((x * 6) % 256 for x in range(width)) for _ in range(height))
    header = width.to_bytes(4, "big") + height.to_bytes(4, "big") + b"\x08\x00\x00\x00\x00"
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(rows))
            + chunk(b"IEND", b""))


PAGE = """<!DOCTYPE html><html><head><meta charset="utf-8"><title>{title}</title>
<link rel="stylesheet" href="{up}_static/book.css"></head><body>
<nav class="bd-sidebar">Navigation that is not printed</nav>
<main><article class="bd-article"><section id="top-section"><h1>{title}</h1>{body}
</section></article>{next}</main></body></html>"""

CHAPTER = f"""<p>{EXERCISE.split()[0]} chapter text.</p>
<div class="cell tag_hide-input"><details class="hide above-input"><summary>Show</summary>
<div class="cell_input"><pre>{HIDDEN} = 1</pre></div></details>
<div class="cell_output"><pre>an output that stays</pre></div></div>
<img src="../_images/figure.png" alt="a grey ramp">
<div class="exercise admonition" id="ex-1"><p class="admonition-title">Exercise 1.1</p>
<section><p>{EXERCISE}?</p></section></div>
<div class="solution dropdown admonition toggle-hidden" id="sol-1">
<p class="admonition-title">Solution to <a href="#ex-1">Exercise 1.1</a></p>
<section><p>{SOLUTION}.</p></section></div>
<p>Text after the exercise.</p>"""


@pytest.fixture(scope="module")
def tiny_book(tmp_path_factory) -> Path:
    """A two-page HTML book in the layout of a Jupyter Book 1 build, with a screen-only API
    page between the two that the handout leaves out."""
    html = tmp_path_factory.mktemp("tiny-book") / "html"
    (html / "_static").mkdir(parents=True)
    (html / "_images").mkdir()
    (html / "chapters").mkdir()
    (html / "book").mkdir()
    (html / "_static" / "book.css").write_text(".bd-sidebar { color: #333; }")
    (html / "_images" / "figure.png").write_bytes(_png())
    (html / "index.html").write_text(
        '<meta http-equiv="Refresh" content="0; url=intro.html" />', encoding="utf-8")
    (html / "intro.html").write_text(PAGE.format(
        title="Welcome page", up="", body="<p>Read the chapters in order.</p>",
        next='<a class="right-next" href="book/api.html">next</a>'), encoding="utf-8")
    (html / "book" / "api.html").write_text(PAGE.format(
        title="API reference", up="../", body="<p>round_to(x, fmt) signatures</p>",
        next='<a class="right-next" href="../chapters/one.html">next</a>'), encoding="utf-8")
    (html / "chapters" / "one.html").write_text(PAGE.format(
        title="1. First chapter", up="../", body=CHAPTER, next=""), encoding="utf-8")
    return html


@pytest.fixture(scope="module")
def script():
    module = _script()
    if module.find_chromium() is None:
        pytest.skip("no Chromium on PATH (Debian: apt-get install chromium)")
    pytest.importorskip("playwright.sync_api", reason="playwright drives Chromium")
    return module


def _texts(pdf: Path) -> list[str]:
    pypdf = pytest.importorskip("pypdf", reason="pypdf reads the PDF back")
    return [page.extract_text() for page in pypdf.PdfReader(pdf).pages]


def test_handout_from_a_tiny_book(tiny_book, script, tmp_path):
    pypdf = pytest.importorskip("pypdf", reason="pypdf reads the PDF back")
    out = tmp_path / "handout.pdf"
    done = script.build_pdf(tiny_book, out, version="9.8.7")
    texts = _texts(out)
    assert done["pages"] == len(texts) > 0
    assert done["chapters"] == ["Welcome page", "1. First chapter"]
    assert done["solutions"] == 1
    joined = "\n".join(texts)
    assert "version 9.8.7" in texts[0]
    assert HIDDEN not in joined and "Navigation that is not printed" not in joined
    assert "signatures" not in joined  # the API page is for the screen (SCREEN_ONLY)
    assert "an output that stays" in joined
    exercise_page = next(i for i, t in enumerate(texts) if EXERCISE in t)
    solution_page = next(i for i, t in enumerate(texts) if SOLUTION in t)
    assert solution_page > exercise_page, "the solution belongs in the Solutions at the end"
    assert "Solutions" in texts[solution_page]
    assert "Solutions at the end" in texts[exercise_page]
    images = [img for page in pypdf.PdfReader(out).pages for img in page.images]
    assert images, "the chapter's figure is missing from the PDF"
    assert "First chapter" in "".join(str(item.get("/Title", ""))
                                      for item in pypdf.PdfReader(out).outline
                                      if isinstance(item, dict))


def test_missing_build_is_named(script, tmp_path):
    with pytest.raises(FileNotFoundError, match=r"html_dir=.*index\.html"):
        script.build_pdf(tmp_path / "nothing", tmp_path / "out.pdf")


def test_whole_book(script, tmp_path, pytestconfig):
    """The built book, every page: asked for with -m browser, and only when a build exists."""
    if "browser" not in (pytestconfig.option.markexpr or ""):
        pytest.skip("prints the whole book (minutes): run with `pytest -m browser`")
    pytest.importorskip("pypdf", reason="pypdf reads the PDF back")
    html = Path(os.environ.get("PRECISIONLAB_BOOK_HTML", ROOT / "_build" / "html"))
    if not (html / "index.html").is_file():
        pytest.skip(f"no built book in {html}: build it first")
    out = tmp_path / "handout.pdf"
    done = script.build_pdf(html, out)
    texts = _texts(out)
    assert done["pages"] == len(texts) > len(done["chapters"])
    chapters = sorted((ROOT / "notebooks").glob("*.ipynb"))
    assert sum(title[:1].isdigit() for title in done["chapters"]) == len(chapters)
    assert done["solutions"] > 0
    assert any(text.lstrip().startswith("Solutions") for text in texts[len(done["chapters"]):])
    print(f"{done['pages']} pages, {done['bytes'] / 1e6:.1f} MB, {done['seconds']:.0f} s")
