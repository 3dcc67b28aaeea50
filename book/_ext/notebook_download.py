"""Each chapter page's download menu saves the chapter's notebook.

sphinx-book-theme puts a download menu on every page whose ".ipynb" entry links to the
copy of the source in `_sources/` with `target="_blank"`, so a browser opens the JSON in
a new tab instead of saving it. After the build, each such link gets a `download`
attribute with the notebook's file name and a tooltip that says what it saves.
"""

from __future__ import annotations

import re
from pathlib import Path

NOTEBOOK_LINK = re.compile(
    r'<a href="(?P<href>(?:\.\./)*_sources/(?:[^"/]+/)*(?P<name>[^"/]+\.ipynb))"'
    r'\s+target="_blank"')
TOOLTIP = 'title="Download source file"'


def add_download_attribute(page: str) -> str:
    """The page with every notebook link in its download menu made a download."""
    def repl(match: re.Match) -> str:
        return f'<a href="{match["href"]}" download="{match["name"]}"'

    out, count = NOTEBOOK_LINK.subn(repl, page)
    if count:
        out = out.replace(TOOLTIP, 'title="Download this chapter as a notebook (.ipynb)"')
    return out


def _rewrite_pages(app, exception) -> None:
    if exception is not None or app.builder.format != "html":
        return
    for page in Path(app.outdir).rglob("*.html"):
        text = page.read_text(encoding="utf-8")
        new = add_download_attribute(text)
        if new != text:
            page.write_text(new, encoding="utf-8")


def setup(app):
    app.connect("build-finished", _rewrite_pages)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
