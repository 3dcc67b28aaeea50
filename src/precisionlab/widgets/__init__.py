"""The chapters' explorers: each is interactive(xxx_view, XXX_GRID, **defaults), one output that
a live front end (Jupyter, Colab, VS Code) shows as ipywidgets controls recomputing xxx_view,
and the HTML book as a self-contained view switcher (no kernel, no network) drawing each
view's figure as SVG from its data. Views only
check their input and call the package's plain functions. Files, one concept each:

* `view`: what a view returns, (TextPanel, Figure), and the input check it uses;
* `frames`: `interactive` / `Interactive`, the live form and the static view switcher (every
  grid point's text panel and figure spec, the default view as a PNG, grid checks, page
  budgets); its scripts and style are `static/plot.js`, `static/switcher.js` and
  `static/switcher.css`, package data;
* `figure_json`: a matplotlib Figure as a small JSON spec (data, scales, ticks, labels,
  legend) that `static/plot.js` draws as SVG in the page;
* `bits` and `crossing` (chapter 1): fl(x) bit by bit; steps until fl(w + k·lr) moves;
* `reduction` (chapter 2): one vector summed in each GPU order, tested against tol;
* `world` (chapter 3): the bouncing ball's solver passes under a stopping rule, by horizon;
* `underflow` (chapter 4): the attenuation model g0·a^k against a format's floors;
* `scaling` (chapter 5): dynamic loss scaling's scale and headroom;
* `phantom` (chapter 6): phantom clipping in a short GRPO run;
* `allclose` (chapter 7): a matmul's bounds and verdicts with an injected bug;
* `blocks` (chapter 9): what a block scale keeps of activations with outlier channels.

Each name below is imported from its file on first use (`__getattr__`), so a chapter loads its
own explorer only: chapter 5's does not bring chapter 7's interval engine, chapter 6's RL
engine or numba, which cost it about half a second to import.
"""

from __future__ import annotations

import importlib

# Each public name -> the file that defines it; the files themselves are reachable too
# (widgets.underflow.network_probe).
_HOMES: dict[str, str] = {
    **dict.fromkeys(("ALLCLOSE_GRID", "allclose_explorer", "allclose_view"), "allclose"),
    **dict.fromkeys(("BIT_GRID", "bit_explorer", "bit_view"), "bits"),
    **dict.fromkeys(("BLOCK_GRID", "block_explorer", "block_view"), "blocks"),
    **dict.fromkeys(("CROSSING_GRID", "crossing_explorer", "crossing_view"), "crossing"),
    **dict.fromkeys(("MAX_FRAMES", "PANEL_COLUMNS", "STATIC_BUDGET_BYTES", "Interactive",
                     "interactive"), "frames"),
    **dict.fromkeys(("PHANTOM_GRID", "phantom_explorer", "phantom_view"), "phantom"),
    **dict.fromkeys(("REDUCTION_GRID", "reduction_data", "reduction_explorer",
                     "reduction_view"), "reduction"),
    **dict.fromkeys(("SCALING_GRID", "scaling_explorer", "scaling_view"), "scaling"),
    **dict.fromkeys(("UNDERFLOW_GRID", "underflow_explorer", "underflow_view"), "underflow"),
    "TextPanel": "view",
    **dict.fromkeys(("WORLD_GRID", "world_explorer", "world_scenes", "world_view"), "world"),
}
_FILES = frozenset({*_HOMES.values(), "figure_json"})

__all__ = sorted(_HOMES)


def __getattr__(name: str):
    """A public name from its file, or one of the files, imported now (once: Python keeps it)."""
    if name in _FILES:
        return importlib.import_module(f".{name}", __name__)
    if name in _HOMES:
        return getattr(importlib.import_module(f".{_HOMES[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__, *_FILES})
