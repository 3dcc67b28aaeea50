"""The built book in a real browser with the network cut off, as in a workshop room.

Every page of the HTML book is opened in headless Chromium (Debian's `chromium`, driven by
the `playwright` package through its executable_path: no browser download) from file://
URLs, with every request that is not a file: URL aborted and recorded. On every page:
no console errors or uncaught exceptions, nothing fetched from outside the build, every
formula typeset by the bundled MathJax (no raw `\\(`), every image loaded, internal links
and anchors resolve. On every chapter page: an "Open in Colab" link to the chapter's
notebook, and each `precisionlab.widgets.interactive` control moved: the shown view
changes, the address's fragment records the view and opening that address restores it,
and the controls stay within the page-weight budget. At a 1280-pixel window, also on every
chapter page: no block wider than the text column (folded solutions opened), every figure
with descriptive alt text, zero serious or critical axe-core violations (WCAG 2 A/AA), and
each explorer's main slider with at least 12 positions whose moves redraw its SVG. A screenshot of each chapter's
moved control is saved under _build/screenshots/, and page weights under
_build/browser-report.json.

Which build: $PRECISIONLAB_BOOK_HTML if set; `_build/html` when it is newer than every source of the book (CI runs this
file right after the README's build command, see .ci/run); otherwise, when asked for
(`pytest -m browser` or PRECISIONLAB_BROWSER_TEST=1), the test builds the book into a
temporary copy of the working tree (a few minutes: the build executes every chapter);
otherwise it is skipped, as it is when Chromium or playwright is missing.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pytest

ROOT = Path(__file__).resolve().parent.parent
BUILD = ROOT / "_build" / "html"
CHAPTER_BUDGET_BYTES = 2_000_000  # what a chapter's interactive controls may add to its page
SOURCES = ("_config.yml", "_toc.yml", "book", "notebooks", "src/precisionlab")
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run",
                 "--disable-dev-shm-usage"]

pytestmark = pytest.mark.browser


def _newest_source() -> float:
    newest = 0.0
    for name in SOURCES:
        path = ROOT / name
        files = [path] if path.is_file() else [p for p in path.rglob("*") if p.is_file()
                                               and "__pycache__" not in p.parts]
        newest = max([newest, *(p.stat().st_mtime for p in files)])
    return newest


def _fresh_build() -> Path | None:
    index = BUILD / "index.html"
    if index.is_file() and index.stat().st_mtime >= _newest_source():
        return BUILD
    return None


def _build_copy(dest: Path) -> Path:
    """Build the book from a copy of the working tree (tracked and unignored files)."""
    listed = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=ROOT,
                            capture_output=True, text=True)
    if listed.returncode != 0:
        pytest.skip(f"no fresh _build/html and {ROOT} is not a git checkout to copy")
    for name in filter(None, listed.stdout.split("\0")):
        if (ROOT / name).is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, dest / name)
    done = subprocess.run([sys.executable, "-m", "jupyter", "book", "build", str(dest)],
                          capture_output=True, text=True, timeout=1800)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    return dest / "_build" / "html"


@pytest.fixture(scope="module")
def site(tmp_path_factory, pytestconfig) -> Path:
    if shutil.which("chromium") is None:
        pytest.skip("Debian's chromium is not installed (.ci/run installs it with apt-get)")
    pytest.importorskip("playwright.sync_api", reason="pip install playwright")
    given = os.environ.get("PRECISIONLAB_BOOK_HTML")  # a build made elsewhere, e.g. in a copy
    if given:
        return Path(given)
    fresh = _fresh_build()
    if fresh is not None:
        return fresh
    asked = ("browser" in (pytestconfig.option.markexpr or "")
             or os.environ.get("PRECISIONLAB_BROWSER_TEST") == "1"
             or any("test_browser" in str(a) for a in pytestconfig.args))
    if not asked:
        pytest.skip("no fresh _build/html: build the book first, or run `pytest -m browser` "
                    "to build a copy (.ci/run runs this file after the README's build)")
    return _build_copy(tmp_path_factory.mktemp("book"))


@pytest.fixture(scope="module")
def browser():
    if shutil.which("chromium") is None:
        pytest.skip("Debian's chromium is not installed (.ci/run installs it with apt-get)")
    pytest.importorskip("playwright.sync_api", reason="pip install playwright")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=shutil.which("chromium"), args=CHROMIUM_ARGS,
                              headless=True)
        yield b
        b.close()


def _outputs(site: Path) -> Path:
    """Where screenshots and the report go: the _build folder holding a given build, else
    the repository's _build (also for a build made in a temporary copy)."""
    given = os.environ.get("PRECISIONLAB_BOOK_HTML")
    return Path(given).parent if given else ROOT / "_build"


def _pages(site: Path) -> list[Path]:
    return sorted(p for p in site.rglob("*.html")
                  if not {"_static", "_sources", "_images"} & set(p.relative_to(site).parts))


def _chapters(site: Path) -> list[Path]:
    return sorted((site / "notebooks").glob("*.html"))


class Visit:
    """One page opened with the network blocked; records what went wrong."""

    def __init__(self, browser, site: Path, page_path: Path, fragment: str = ""):
        self.site = site
        self.context = browser.new_context(viewport={"width": 1280, "height": 900})
        self.blocked, self.failed, self.errors = [], [], []
        self.context.route("**/*", self._route)
        self.page = self.context.new_page()
        self.page.on("console", lambda m: m.type == "error" and self.errors.append(m.text))
        self.page.on("pageerror", lambda e: self.errors.append(f"uncaught: {e}"))
        self.page.on("requestfailed", lambda r: r.url.startswith("file:")
                     and self.failed.append(r.url))
        # 90 s, not playwright's 30 s: on a loaded machine a chapter page with many precomputed
        # views can take longer than 30 s to settle (a 30 s timeout failed once under load)
        self.page.goto(page_path.as_uri() + fragment, wait_until="load", timeout=90_000)
        self.page.wait_for_load_state("networkidle", timeout=90_000)

    def _route(self, route):
        url = route.request.url
        if url.startswith(("file:", "data:", "blob:")):
            path = Path(unquote(urlsplit(url).path)) if url.startswith("file:") else None
            if path is not None and self.site.resolve() not in path.resolve().parents:
                self.blocked.append(url)  # a file outside the build is not in the handout
                return route.abort()
            return route.continue_()
        self.blocked.append(url)
        return route.abort()

    def wait_for_math(self) -> None:
        self.page.evaluate("""() => (window.MathJax && MathJax.startup && MathJax.startup.promise)
                                    ? MathJax.startup.promise.then(() => true) : true""")

    def close(self):
        self.context.close()


def test_every_page_offline(site, browser):
    problems = []
    for path in _pages(site):
        name = path.relative_to(site).as_posix()
        visit = Visit(browser, site, path)
        try:
            visit.wait_for_math()
            page = visit.page
            has_math = page.evaluate("() => document.querySelectorAll('.math').length")
            if has_math:
                typeset = page.evaluate("() => document.querySelectorAll('mjx-container').length")
                if typeset < has_math:
                    problems.append(f"{name}: {has_math} formulas, {typeset} typeset by MathJax")
            raw = page.evaluate(r"""() => Array.from(document.querySelectorAll('.math'))
                                       .filter(e => /\\\(|\\\[/.test(e.textContent)
                                                    && !e.querySelector('mjx-container'))
                                       .length""")
            if raw:
                problems.append(f"{name}: {raw} formulas left as raw LaTeX")
            page.evaluate("""async () => { for (const img of document.images) {
                                 img.scrollIntoView(); if (!img.complete) await img.decode().catch(() => 0);
                             } }""")
            broken = page.evaluate("""() => Array.from(document.images)
                .filter(i => i.style.display !== 'none' && (!i.complete || i.naturalWidth === 0))
                .map(i => i.getAttribute('src').slice(0, 80))""")
            problems += [f"{name}: image not loaded: {src}" for src in broken]
            problems += [f"{name}: fetched from outside the build: {u}" for u in visit.blocked]
            problems += [f"{name}: missing file: {u}" for u in visit.failed]
            problems += [f"{name}: console: {e}" for e in visit.errors]
            problems += _dead_links(site, path, page)
        finally:
            visit.close()
    assert not problems, "\n".join(problems)


def _ids(path: Path, cache: dict) -> set[str]:
    if path not in cache:
        cache[path] = set(re.findall(r'\sid="([^"]+)"', path.read_text(encoding="utf-8")))
    return cache[path]


def _dead_links(site: Path, path: Path, page, cache: dict = {}) -> list[str]:  # noqa: B006
    """Links to files in the build that do not exist, or to anchors that are not there."""
    hrefs = page.evaluate("() => Array.from(document.querySelectorAll('a[href]'), a => a.href)")
    dead = []
    for href in hrefs:
        if not href.startswith("file:"):
            continue
        parts = urlsplit(href)
        target = Path(unquote(parts.path))
        if not target.exists():
            dead.append(f"{path.relative_to(site)}: link to missing {target}")
        elif parts.fragment and target.suffix == ".html" and not parts.fragment.startswith("pl-") \
                and unquote(parts.fragment) not in _ids(target, cache):
            dead.append(f"{path.relative_to(site)}: link to missing anchor {href}")
    return dead


def test_chapters_colab_and_interactive_controls(site, browser):
    import yaml

    repo = yaml.safe_load((ROOT / "_config.yml").read_text(encoding="utf-8"))["repository"]["url"]
    slug = urlsplit(repo).path.strip("/")
    chapters = _chapters(site)
    assert chapters, f"no chapter pages under {site / 'notebooks'}"
    out = _outputs(site)
    shots = out / "screenshots"
    shots.mkdir(parents=True, exist_ok=True)
    report, problems = {}, []
    for path in chapters:
        name = path.stem
        visit = Visit(browser, site, path)
        page = visit.page
        try:
            colab = page.evaluate("""() => Array.from(document.querySelectorAll('a[href]'), a => a.href)
                                     .filter(h => h.includes('colab.research.google.com'))""")
            want = f"colab.research.google.com/github/{slug}/blob/"
            if not any(want in h and h.endswith(f"notebooks/{name}.ipynb") for h in colab):
                problems.append(f"{name}: no Open-in-Colab link to notebooks/{name}.ipynb: {colab}")
            controls = page.locator(".pl-interactive")
            count = controls.count()
            weight = page.evaluate("""() => Array.from(document.querySelectorAll('.pl-interactive'))
                                      .reduce((n, e) => n + new Blob([e.outerHTML]).size, 0)""")
            report[name] = {"page_bytes": path.stat().st_size, "interactive_bytes": weight,
                            "controls": count}
            if count == 0:
                problems.append(f"{name}: no interactive control (widgets.interactive) on the page")
                continue
            if weight > CHAPTER_BUDGET_BYTES:
                problems.append(f"{name}: controls weigh {weight} bytes > {CHAPTER_BUDGET_BYTES}")
            for k in range(count):
                problems += _move(page, controls.nth(k), f"{name} control {k}")
            first = controls.nth(0)
            first.scroll_into_view_if_needed()
            first.screenshot(path=str(shots / f"{name}.png"))
            shared = page.url  # records the last control moved
            moved = shared.split("#", 1)[1].split("--", 1)[0] if "#" in shared else ""
            frame = page.locator(f"#{moved}").get_attribute("data-pl-frame") if moved else None
            problems += [f"{name}: console: {e}" for e in visit.errors]
            problems += [f"{name}: fetched from outside the build: {u}" for u in visit.blocked]
        finally:
            visit.close()
        # the address a teacher copies after moving the control opens the same view
        fragment = "#" + shared.split("#", 1)[1] if "#" in shared else ""
        if not fragment.startswith("#pl-"):
            problems.append(f"{name}: moving the control did not record the view in the URL")
            continue
        again = Visit(browser, site, path, fragment)
        try:
            restored = again.page.locator(f"#{moved}").get_attribute("data-pl-frame")
            if restored != frame:
                problems.append(f"{name}: {fragment} opened frame {restored}, not {frame}")
            problems += [f"{name} ({fragment}): console: {e}" for e in again.errors]
        finally:
            again.close()
    (out / "browser-report.json").write_text(json.dumps(report, indent=1))
    print("\n".join(f"{n:<36} page {r['page_bytes'] / 1e6:5.2f} MB, controls "
                    f"{r['interactive_bytes'] / 1e6:5.2f} MB ({r['controls']})"
                    for n, r in report.items()))
    assert not problems, "\n".join(problems)


AXE_TAGS = ["wcag2a", "wcag2aa", "wcag21a", "wcag21aa"]  # WCAG 2.0 and 2.1, levels A and AA
MAIN_SLIDER_POSITIONS = 12  # issue 21: a slider a reader drags through a trend, not a toggle
PATH_LIKE = re.compile(r"(^|/)_images/|\.(png|jpe?g|gif|svg)$|^[0-9a-f]{16,}", re.I)

# Every block of the chapter column, with the folded solutions opened: anything wider than the
# column, or scrolled sideways inside itself, is reported.
_WIDE_BLOCKS = """() => {
  document.querySelectorAll('details').forEach(d => { d.open = true; });
  const col = document.querySelector('article.bd-article') || document.querySelector('main');
  const edge = col.getBoundingClientRect().right + 1, wide = [];
  const blocks = col.querySelectorAll('pre, div.highlight, div.cell_output > div, table, img, svg, '
                                      + '.pl-interactive, mjx-container[display="true"]');
  for (const el of blocks) {
    const r = el.getBoundingClientRect();
    if (r.width === 0 || el.closest('svg') !== el && el.closest('svg')) { continue; }
    const x = getComputedStyle(el).overflowX;
    const scrolled = (x === 'auto' || x === 'scroll') && el.scrollWidth > el.clientWidth + 1;
    if (r.right > edge || scrolled) {
      wide.push(`${el.tagName.toLowerCase()}.${String(el.className.baseVal ?? el.className)}`
                + ` ${Math.round(r.width)} px${scrolled ? ' (scrolls)' : ''}: `
                + (el.getAttribute('alt') || el.textContent || '').trim().slice(0, 50));
    }
  }
  return [Math.round(col.getBoundingClientRect().width), wide];
}"""


def _explorer_chapters() -> set[str]:
    """Chapters whose notebook shows an explorer (a widgets.*_explorer call): they need a slider."""
    return {p.stem for p in (ROOT / "notebooks").glob("*.ipynb")
            if "_explorer(" in p.read_text(encoding="utf-8")}


def _figure_alts(page) -> list[str]:
    """Problems with the chapter's figures: an image or drawn SVG with no alt text or a path for one."""
    alts = page.evaluate("""() => {
        const col = document.querySelector('article.bd-article') || document;
        return [...Array.from(col.querySelectorAll('img'), i => ['img', i.getAttribute('alt') || '',
                                                               (i.getAttribute('src') || '').slice(-40)]),
                ...Array.from(col.querySelectorAll('svg.pl-figure'),
                              s => ['svg', s.getAttribute('aria-label') || '', ''])];
    }""")
    problems = []
    for kind, alt, src in alts:
        text = alt.strip()
        if len(text) < 12 or PATH_LIKE.search(text) or (src and text.endswith(src)):
            problems.append(f"{kind} alt text is not a description: {text[:60]!r} ({src})")
    return problems


def _main_slider(page, root, label: str) -> list[str]:
    """The output's main slider (most positions) has >= 12 and each move redraws the SVG."""
    sliders = root.locator("input[type=range]")
    sizes = [sliders.nth(k).evaluate("e => Number(e.max) - Number(e.min) + 1")
             for k in range(sliders.count())]
    if not sizes or max(sizes) < MAIN_SLIDER_POSITIONS:
        return [f"{label}: main slider has {max(sizes, default=0)} positions, "
                f"fewer than {MAIN_SLIDER_POSITIONS}"]
    slider = sliders.nth(sizes.index(max(sizes)))
    slider.focus()
    problems, seen = [], set()
    for key in ("Home", "ArrowRight", "ArrowRight", "End", "ArrowLeft"):
        page.keyboard.press(key)
        _, figure, _ = _shown(root)
        if not figure.startswith("<svg"):
            problems.append(f"{label}: after {key} the view is not drawn as SVG")
        seen.add(figure)
    if len(seen) < 4:
        problems.append(f"{label}: moving the main slider over 5 positions drew {len(seen)} "
                        "different figures")
    return problems


def _axe(page) -> list[str]:
    """axe-core's serious and critical WCAG 2 A/AA violations on the page, one line each."""
    from axe_playwright_python.sync_playwright import Axe

    # preload off: axe would fetch the stylesheets by XMLHttpRequest, which file: pages refuse
    result = Axe().run(page, options={"runOnly": {"type": "tag", "values": AXE_TAGS},
                                      "resultTypes": ["violations"], "preload": False})
    return [f"axe {v['impact']} {v['id']}: {v['help']} at "
            + ", ".join(str(n["target"]) for n in v["nodes"][:3])
            + (f" (+{len(v['nodes']) - 3})" if len(v["nodes"]) > 3 else "")
            for v in result.response["violations"] if v["impact"] in ("serious", "critical")]


def test_chapter_pages_fit_describe_their_figures_and_pass_axe(site, browser):
    """Issue 21 at 1280 px: no block wider than the column, every figure described, no serious
    or critical axe-core violation, and each explorer's main slider has 12 positions that redraw."""
    pytest.importorskip("axe_playwright_python", reason="pip install axe-playwright-python")
    with_explorer = _explorer_chapters()
    problems, widths = [], {}
    for path in _chapters(site):
        name = path.stem
        visit = Visit(browser, site, path)
        try:
            visit.wait_for_math()
            page = visit.page
            problems += [f"{name}: {p}" for p in _axe(page)]
            problems += [f"{name}: {p}" for p in _figure_alts(page)]
            controls = page.locator(".pl-interactive")
            if name in with_explorer and controls.count() == 0:
                problems.append(f"{name}: the notebook shows an explorer; the page has none")
            for k in range(controls.count()):
                problems += _main_slider(page, controls.nth(k), f"{name} control {k}")
            widths[name], wide = page.evaluate(_WIDE_BLOCKS)
            problems += [f"{name}: wider than the {widths[name]} px column: {w}" for w in wide]
            problems += [f"{name}: console: {e}" for e in visit.errors]
            problems += [f"{name}: fetched from outside the build: {u}" for u in visit.blocked]
        finally:
            visit.close()
    assert not problems, f"{len(problems)} problems:\n" + "\n".join(problems)


def _shown(root) -> tuple:
    """What one interactive output shows: its view index, drawn figure (SVG or PNG) and text."""
    return (root.get_attribute("data-pl-frame"),
            root.evaluate("""r => { const s = r.querySelector('svg.pl-figure');
                                    const i = r.querySelector('img.pl-frame');
                                    return s ? s.outerHTML : (i.style.display === 'none' ? '' : i.src); }"""),
            root.locator(".pl-panel").inner_text())


def _move(page, root, label: str) -> list[str]:
    """Move the first control of one interactive output; the frame and picture must change."""
    before = _shown(root)
    control = root.locator("[data-pl-param]").first
    kind = control.evaluate("e => e.type")
    if kind == "range":
        control.focus()
        at_end = control.evaluate("e => Number(e.value) === Number(e.max)")
        page.keyboard.press("ArrowLeft" if at_end else "ArrowRight")
    elif kind == "checkbox":
        control.click()
    else:
        index = control.evaluate("e => e.selectedIndex")
        count = control.evaluate("e => e.options.length")
        control.select_option(index=(index + 1) % count)
    after = _shown(root)
    problems = []
    if after[0] == before[0]:
        problems.append(f"{label}: moving the {kind} control left frame {before[0]}")
    if after[1] == before[1] and after[2] == before[2]:
        problems.append(f"{label}: moving the {kind} control changed neither figure nor text")
    return problems


def test_interactive_standalone_page(tmp_path, browser):
    """widgets.interactive's HTML on its own page: every control moves, the fragment restores."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    from precisionlab import widgets

    def view(k: int = 1, name: str = "a", flag: bool = False):
        fig = Figure(figsize=(3, 2))
        fig.subplots().plot([0, 1], [0, k + (3 if flag else 0)], color="k")
        fig.axes[0].set_title(name)
        return widgets.TextPanel(f"k={k} name={name} flag={flag}"), fig

    it = widgets.interactive(view, {"k": [1, 2, 3], "name": ["a", "b"], "flag": [False, True]})
    page_path = tmp_path / "standalone.html"
    page_path.write_text(f"<!doctype html><html><body>{it.static_html()}"
                         f"<p style='height:3000px'></p></body></html>", encoding="utf-8")
    visit = Visit(browser, tmp_path, page_path)
    try:
        page, root = visit.page, visit.page.locator(".pl-interactive")
        assert root.get_attribute("data-pl-frame") == "0"
        seen = {"0"}
        for k in range(3):
            control = root.locator("[data-pl-param]").nth(k)
            kind = control.evaluate("e => e.type")
            if kind == "range":
                control.focus()
                page.keyboard.press("End")
            elif kind == "checkbox":
                control.click()
            else:
                control.select_option(index=1)
            seen.add(root.get_attribute("data-pl-frame"))
        assert seen == {"0", "8", "10", "11"}  # row-major: k=3 is 2*4, name=b +2, flag +1
        assert "k=3 name=b flag=True" in root.locator(".pl-panel").inner_text()
        assert root.locator("output").inner_text() == "3"
        url = page.url
        assert url.endswith(f"#{it.element_id}--k-2--name-1--flag-1")
        assert not visit.errors and not visit.blocked
    finally:
        visit.close()
    again = Visit(browser, tmp_path, page_path, "#" + url.split("#", 1)[1])
    try:
        assert again.page.locator(".pl-interactive").get_attribute("data-pl-frame") == "11"
        assert "k=3 name=b flag=True" in again.page.locator(".pl-panel").inner_text()
    finally:
        again.close()
