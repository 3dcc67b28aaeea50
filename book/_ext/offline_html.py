"""Sphinx glue for a book that works from a zipped `_build/html`, with no network.

Two fixes for console errors that the browser test (tests/test_browser.py) caught in
pages built by Jupyter Book 1 with Sphinx 7.4:

* Sphinx re-registers an extension's inline scripts when it starts writing, once as
  ``None`` and once as ``''``, so a script body added before that (sphinx-thebe's
  ``const THEBE_JS_URL = ...``) appears twice and the second copy throws
  "Identifier has already been declared". Each page keeps the first copy only.
* pydata-sphinx-theme starts from the stored light/dark mode, or from the template
  variable ``default_mode`` (``html_context``), and logs an error when both are empty, as
  they are on a first visit.

And one saving: with no widget manager configured (``nb_ipywidgets_js: {}``, because the
book shows precisionlab's self-contained frame switchers instead of live widgets), the
ipywidgets state that MyST-NB embeds in each chapter (tens of kB of JSON) has no reader,
so it is left out.
"""

from __future__ import annotations

WIDGET_STATE = "application/vnd.jupyter.widget-state+json"


def _unique_scripts(app, pagename, templatename, context, doctree) -> None:
    """Drop repeated script entries (same file, same attributes, same inline body)."""
    scripts = context.get("script_files")
    if not scripts:
        return
    no_manager = getattr(app.config, "nb_ipywidgets_js", None) == {}
    seen, unique = set(), []
    for script in scripts:
        attrs = getattr(script, "attributes", {}) or {}
        if no_manager and attrs.get("type") == WIDGET_STATE:
            continue
        key = (getattr(script, "filename", str(script)) or "", tuple(sorted(attrs.items())))
        if key not in seen:
            seen.add(key)
            unique.append(script)
    context["script_files"] = unique


def _default_mode(app, config) -> None:
    context = config.html_context
    if isinstance(context, dict):
        context.setdefault("default_mode", "auto")


def setup(app):
    app.connect("config-inited", _default_mode)
    app.connect("html-page-context", _unique_scripts, priority=900)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
