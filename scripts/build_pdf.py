"""Print the built HTML book into one PDF handout, with Debian's Chromium and no download.

    python3 scripts/build_pdf.py                      # _build/html -> _build/handout.pdf
    python3 scripts/build_pdf.py --html DIR --out FILE

Run it after the book build (`python3 -m jupyter book build .`). Each page of the book is
opened in headless Chromium (the system's `chromium`, driven by the `playwright` package
through its executable_path: no browser is downloaded) with every request that is not a
file: URL blocked, in reading order (the "next" links from the root page). Once its
scripts have run (MathJax typeset, each interactive control showing its default view),
the page's article is taken out, with its figures; hidden code-cell sources are dropped
(their outputs stay) and every exercise solution is moved, unfolded, to a "Solutions"
part at the end, where the exercise refers to it. Pages for the screen only (the API
reference, some 40 A4 pages of signatures) are followed for their "next" link but left out
of the handout (SCREEN_ONLY). The articles are joined into one HTML
document (`handout.html` beside the PDF), which Chromium prints on A4 with page numbers
and PDF bookmarks. A copy goes into the HTML book as `handout.pdf` (unless
--no-site-copy), so a published book offers it. The script prints the page count and
the file size.
"""

from __future__ import annotations

import argparse
import html
import logging
import re
import shutil
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run",
                 "--disable-dev-shm-usage"]
REFRESH = re.compile(r"""http-equiv=["']?refresh["']?\s+content=["'][^"']*url=([^"'>\s]+)""", re.I)
PDF_PAGE = re.compile(rb"/Type\s*/Page(?![A-Za-z])")

# Runs in each book page after load: returns its article, ready to be printed elsewhere.
PREPARE_PAGE = r"""
async (root) => {
  if (window.MathJax && MathJax.startup && MathJax.startup.promise) {
    await MathJax.startup.promise;
  }
  await Promise.all(Array.from(document.images).map((img) => img.complete ? null :
    new Promise((done) => { img.onload = img.onerror = done; })));
  await new Promise((done) => requestAnimationFrame(() => requestAnimationFrame(done)));
  const prefix = (url) => url.slice(root.length).replace(/[?#].*$/, '')
    .replace(/\.html$/, '').replace(/[^A-Za-z0-9]+/g, '-') + '--';
  const here = prefix(location.href);
  const art = document.querySelector('article.bd-article') ||
    document.querySelector('main') || document.body;
  // canvases keep their pixels only as images
  art.querySelectorAll('canvas').forEach((c) => {
    try {
      const img = document.createElement('img');
      img.src = c.toDataURL('image/png');
      img.alt = c.getAttribute('aria-label') || '';
      img.style.width = c.clientWidth + 'px';
      c.replaceWith(img);
    } catch (e) { /* a tainted canvas stays as it is */ }
  });
  // hidden code-cell sources are not printed; their outputs are
  art.querySelectorAll('details.hide').forEach((d) => {
    if (d.querySelector('.cell_input')) d.remove();
  });
  art.querySelectorAll('details').forEach((d) => { d.open = true; });
  art.querySelectorAll('.toggle-button, .headerlink, script, button.copybtn')
    .forEach((e) => e.remove());
  art.querySelectorAll('.toggle-hidden').forEach((e) => e.classList.remove('toggle-hidden'));
  // one document: ids get the page's prefix, links to book pages point inside it
  art.querySelectorAll('[id]').forEach((e) => { e.id = here + e.id; });
  art.querySelectorAll('[src]').forEach((e) => {
    if (e.src) e.setAttribute('src', e.src);
  });
  art.querySelectorAll('a[href]').forEach((a) => {
    const url = a.href;
    if (url.startsWith(root) && /\.html(#|$)/.test(url)) {
      const hash = url.includes('#') ? url.split('#')[1] : '';
      a.setAttribute('href', '#' + prefix(url) + (hash || 'top'));
    } else if (url.startsWith('file:')) {
      a.removeAttribute('href');
    } else {
      a.setAttribute('href', url);
    }
  });
  // solutions go to the end; the exercise keeps a pointer to them
  const solutions = [];
  art.querySelectorAll('div.solution').forEach((s) => {
    s.classList.remove('dropdown');
    const title = s.querySelector('.admonition-title');
    const ref = document.createElement('p');
    ref.className = 'handout-solution-ref';
    const link = document.createElement('a');
    link.href = '#' + s.id;
    link.textContent = (title ? title.textContent.trim() : 'Solution') +
      ': in the Solutions at the end of the handout.';
    ref.appendChild(link);
    solutions.push(s.outerHTML);
    s.replaceWith(ref);
  });
  const styles = [];
  document.querySelectorAll('style').forEach((st) => {
    if (art.contains(st)) return;
    let text = '';
    try { text = Array.from(st.sheet.cssRules).map((r) => r.cssText).join('\n'); }
    catch (e) { text = st.textContent; }
    styles.push(text.replace(/url\((["']?)(?!data:|[a-z]+:)([^"')]+)\1\)/g,
      (m, q, u) => 'url("' + new URL(u, location.href).href + '")'));
  });
  const h1 = art.querySelector('h1');
  const next = document.querySelector('a.right-next');
  return {
    url: location.href, id: here, html: art.innerHTML, solutions: solutions,
    title: h1 ? h1.textContent.replace(/#$/, '').trim() : document.title,
    sheets: Array.from(document.querySelectorAll('link[rel="stylesheet"]'))
      .map((l) => l.href),
    styles: styles, next: next ? next.href : null,
    book: (document.querySelector('.navbar-brand') || {}).textContent || document.title,
  };
}
"""

PRINT_CSS = """
@page { size: A4; margin: 16mm 15mm 18mm 15mm; }
html, body { background: #fff !important; }
body { margin: 0; }
.handout-cover { text-align: center; padding-top: 30%; }
.handout-cover h1 { font-size: 2.4em; }
.handout-contents ul { line-height: 1.8; list-style: none; padding-left: 0; }
hr.handout-break { break-after: page; border: 0; margin: 0; height: 0; }
.handout-solutions > h1 { margin-bottom: 1em; }
.handout-solutions h2 { break-after: avoid; margin-top: 1.4em; }
pre { white-space: pre-wrap !important; overflow-wrap: anywhere; }
div.highlight, .output, .cell_output, .pl-interactive, .table-wrapper { overflow: visible !important; }
img { max-width: 100% !important; height: auto !important; break-inside: avoid; }
figure, .admonition, .exercise, .solution, table, tr { break-inside: avoid; }
h1, h2, h3, .admonition-title { break-after: avoid; }
a { text-decoration: none; }
.admonition, .solution, .exercise { box-sizing: border-box; max-width: 100%; margin-right: 0 !important; }
.handout-solution-ref { font-style: italic; }
"""


def find_chromium(explicit: str | None = None) -> str | None:
    """The system Chromium executable (argument, then `chromium`, `chromium-browser` on PATH)."""
    if explicit:
        return explicit if Path(explicit).is_file() else shutil.which(explicit)
    return shutil.which("chromium") or shutil.which("chromium-browser")


def start_page(html_dir: Path) -> Path:
    """The book's first page: index.html, or the page its meta refresh names."""
    index = html_dir / "index.html"
    if not index.is_file():
        raise FileNotFoundError(f"html_dir={html_dir} has no index.html: build the book first")
    found = REFRESH.search(index.read_text(encoding="utf-8", errors="replace"))
    return (html_dir / found.group(1)).resolve() if found else index.resolve()


def count_pages(pdf: Path) -> int:
    """Pages in a PDF that Chromium wrote (page objects are not compressed there)."""
    return len(PDF_PAGE.findall(pdf.read_bytes()))


def _doubled(title: str, heading: str) -> bool:
    """Whether title is heading with each of its text pieces written twice."""
    return len(title) == 2 * len(heading) and sorted(title) == sorted(heading * 2)


def _outline_items(node):
    """The outline items under node and its siblings, depth first (document order)."""
    while node is not None:
        item = node.get_object()
        yield item
        yield from _outline_items(item.get("/First"))
        node = item.get("/Next")


def repair_bookmarks(pdf: Path, headings: list[str]) -> int | None:
    """Reset doubled bookmark titles to their headings; the bookmark count (None: no pypdf)."""
    # Chromium 156 writes each text piece of a heading twice into its bookmark title when
    # the book theme's styles meet a forced page break: "1. 1. TitleTitle".
    try:  # optional: without pypdf the bookmarks stay as Chromium wrote them
        from pypdf import PdfReader, PdfWriter
        from pypdf.generic import NameObject, TextStringObject
    except ImportError:
        return None
    # Chromium's object count in the trailer is off by a few; pypdf copes, and says so
    logging.getLogger("pypdf").setLevel(logging.ERROR)
    writer = PdfWriter(clone_from=PdfReader(pdf))
    outlines = writer._root_object.get("/Outlines")
    items = list(_outline_items(outlines.get_object().get("/First"))) if outlines else []
    remaining = list(headings)
    for item in items:
        title = str(item.get("/Title", ""))
        for i, heading in enumerate(remaining):
            if title == heading or _doubled(title, heading):
                item[NameObject("/Title")] = TextStringObject(heading)
                del remaining[: i + 1]
                break
    writer.write(pdf)
    return len(items)


# pages of the HTML book that the printed handout leaves out, by path under the build folder
SCREEN_ONLY = ("book/api.html",)


def collect_pages(browser, html_dir: Path, timeout_s: float = 120) -> list[dict]:
    """Every page of the book in reading order, prepared by PREPARE_PAGE (SCREEN_ONLY pages
    left out)."""
    root = html_dir.resolve().as_uri() + "/"
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    context.route("**/*", lambda route: route.continue_() if route.request.url.startswith(
        "file:") else route.abort())
    page = context.new_page()
    url, seen, pages = start_page(html_dir).as_uri(), set(), []
    while url and url.split("#")[0] not in seen:
        seen.add(url.split("#")[0])
        page.goto(url, wait_until="load", timeout=timeout_s * 1000)
        got = page.evaluate(PREPARE_PAGE, root)
        if not url.split("#")[0].removeprefix(root).endswith(SCREEN_ONLY):
            pages.append(got)
        url = got["next"]
    context.close()
    return pages


def assemble(pages: list[dict], version: str = "") -> str:
    """One HTML document: cover, contents, every page's article, then the solutions."""
    sheets = list(dict.fromkeys(s for p in pages for s in p["sheets"]))
    styles = list(dict.fromkeys(s for p in pages for s in p["styles"]))
    book = (pages[0]["book"].strip() if pages else "") or "Book"
    subtitle = f"Workshop handout · version {version}" if version else "Workshop handout"
    contents = "".join(f'<li><a href="#{p["id"]}top">{html.escape(p["title"])}</a></li>'
                       for p in pages)
    parts = [f'<section class="handout-cover"><h1>{html.escape(book)}</h1>'
             f"<p>{html.escape(subtitle)}</p><p>{time.strftime('%Y-%m-%d')}</p></section>",
             f'<section class="handout-contents"><h1>Contents</h1><ul>{contents}'
             '<li><a href="#handout-solutions">Solutions</a></li></ul></section>']
    parts += [f'<div class="handout-page" id="{p["id"]}top">{p["html"]}</div>' for p in pages]
    # a forced break before a heading's box makes Chromium list that heading twice in the
    # PDF bookmarks, so the breaks are empty elements between the parts
    parts = [part + '<hr class="handout-break">' for part in parts]
    solved = [p for p in pages if p["solutions"]]
    if solved:
        parts.append('<section class="handout-solutions" id="handout-solutions">'
                     "<h1>Solutions</h1>" + "".join(
                         f'<h2>{html.escape(p["title"])}</h2>' + "".join(p["solutions"])
                         for p in solved) + "</section>")
    head = "".join(f'<link rel="stylesheet" href="{html.escape(s)}">' for s in sheets)
    head += "".join(f"<style>{s}</style>" for s in styles)
    return (f'<!DOCTYPE html><html lang="en" data-theme="light" data-mode="light"><head>'
            f'<meta charset="utf-8"><title>{html.escape(book)}</title>{head}'
            f"<style>{PRINT_CSS}</style></head><body><main class=\"bd-article\">"
            + "".join(parts) + "</main></body></html>")


def package_version() -> str:
    """The version in pyproject.toml, or '' when there is none to read."""
    found = re.search(r'(?m)^version\s*=\s*"([^"]+)"',
                      (ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    return found.group(1) if found else ""


def build_pdf(html_dir: Path, out: Path, chromium: str | None = None,
              version: str | None = None) -> dict:
    """Print html_dir's book into out (PDF); returns pages, bytes, chapters and seconds."""
    from playwright.sync_api import sync_playwright

    html_dir, out = Path(html_dir), Path(out)
    executable = find_chromium(chromium)
    if executable is None:
        raise FileNotFoundError(f"chromium={chromium!r}: no Chromium executable found; "
                                "install Debian's chromium (apt-get install chromium)")
    start = time.perf_counter()
    out.parent.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=executable, args=CHROMIUM_ARGS)
        try:
            pages = collect_pages(browser, html_dir)
            combined = out.with_suffix(".html")
            combined.write_text(assemble(pages, package_version() if version is None
                                         else version), encoding="utf-8")
            context = browser.new_context()
            context.route("**/*", lambda route: route.continue_() if route.request.url
                          .startswith("file:") else route.abort())
            page = context.new_page()
            page.goto(combined.as_uri(), wait_until="load", timeout=300_000)
            page.evaluate("document.fonts.ready.then(() => true)")
            headings = page.evaluate("Array.from(document.querySelectorAll("
                                     "'h1, h2, h3, h4, h5, h6')).map((h) => h.textContent"
                                     ".replace(/\\s+/g, ' ').trim())")
            page.pdf(path=str(out), format="A4", print_background=True, scale=0.8,
                     display_header_footer=True, header_template="<span></span>",
                     footer_template='<div style="font-size:8px;width:100%;'
                     'text-align:center;color:#555"><span class="pageNumber"></span>'
                     ' / <span class="totalPages"></span></div>',
                     margin={"top": "16mm", "bottom": "18mm", "left": "15mm",
                             "right": "15mm"},
                     outline=True, tagged=True)
            context.close()
        finally:
            browser.close()
    fixed = repair_bookmarks(out, headings)
    return {"pages": count_pages(out), "bytes": out.stat().st_size, "bookmarks": fixed,
            "chapters": [p["title"] for p in pages],
            "solutions": sum(len(p["solutions"]) for p in pages),
            "seconds": time.perf_counter() - start}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--html", type=Path, default=ROOT / "_build" / "html",
                        help="the built HTML book (default: _build/html)")
    parser.add_argument("--out", type=Path, default=ROOT / "_build" / "handout.pdf",
                        help="the PDF to write (default: _build/handout.pdf)")
    parser.add_argument("--chromium", default=None,
                        help="Chromium executable (default: chromium on PATH)")
    parser.add_argument("--no-site-copy", action="store_true",
                        help="do not copy the PDF into the HTML book as handout.pdf")
    args = parser.parse_args(argv)
    try:
        done = build_pdf(args.html, args.out, args.chromium)
    except FileNotFoundError as exc:
        print(f"build_pdf: {exc}", file=sys.stderr)
        return 1
    if not args.no_site_copy:  # a published book offers it beside its front page
        shutil.copy2(args.out, args.html / "handout.pdf")
    print(f"{args.out}: {done['pages']} pages, {done['bytes'] / 1e6:.1f} MB, "
          f"{len(done['chapters'])} book pages, {done['solutions']} solutions at the end, "
          f"{done['seconds']:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
