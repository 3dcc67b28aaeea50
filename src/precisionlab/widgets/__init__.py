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
"""

from .allclose import ALLCLOSE_GRID, allclose_explorer, allclose_view
from .bits import BIT_GRID, bit_explorer, bit_view
from .blocks import BLOCK_GRID, block_explorer, block_view
from .crossing import CROSSING_GRID, crossing_explorer, crossing_view
from .frames import MAX_FRAMES, PANEL_COLUMNS, STATIC_BUDGET_BYTES, Interactive, interactive
from .phantom import PHANTOM_GRID, phantom_explorer, phantom_view
from .reduction import REDUCTION_GRID, reduction_data, reduction_explorer, reduction_view
from .scaling import SCALING_GRID, scaling_explorer, scaling_view
from .underflow import UNDERFLOW_GRID, underflow_explorer, underflow_view
from .view import TextPanel
from .world import WORLD_GRID, world_explorer, world_scenes, world_view

__all__ = [
    "ALLCLOSE_GRID",
    "BIT_GRID",
    "BLOCK_GRID",
    "CROSSING_GRID",
    "MAX_FRAMES",
    "PANEL_COLUMNS",
    "PHANTOM_GRID",
    "REDUCTION_GRID",
    "SCALING_GRID",
    "STATIC_BUDGET_BYTES",
    "UNDERFLOW_GRID",
    "WORLD_GRID",
    "Interactive",
    "TextPanel",
    "allclose_explorer",
    "allclose_view",
    "bit_explorer",
    "bit_view",
    "block_explorer",
    "block_view",
    "crossing_explorer",
    "crossing_view",
    "interactive",
    "phantom_explorer",
    "phantom_view",
    "reduction_data",
    "reduction_explorer",
    "reduction_view",
    "scaling_explorer",
    "scaling_view",
    "underflow_explorer",
    "underflow_view",
    "world_explorer",
    "world_scenes",
    "world_view",
]
