"""interactive(view, grid): live ipywidgets in a kernel, views precomputed over the grid elsewhere."""

# One output serves both: a live front end (Jupyter, Colab, VS Code; ipywidgets 7 or 8) shows
# controls recomputing view(**params) with matplotlib; the HTML book shows a self-contained
# control (no kernel, no network) that switches among the views of the grid's product, computed
# once at build time: each view's text panel and its figure as a small JSON spec
# (figure_json.figure_spec) that static/plot.js draws as SVG. The default view is also a PNG
# <img>, shown when scripts are off. A figure the spec cannot express is kept as a PNG frame.
# The scripts and style are package data (static/plot.js, static/switcher.js, switcher.css).

from __future__ import annotations

import base64
import contextlib
import gc
import hashlib
import html
import inspect
import io
import itertools
import json
import math
import re
import textwrap
from importlib.resources import files

import IPython
import ipywidgets as wd
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from PIL import Image

from ..plotting import figure_copies
from .figure_json import UnsupportedFigure, figure_spec
from .view import TextPanel, figure_summary, panel_html

__all__ = ["FRAME_COLORS", "FRAME_DPI", "MAX_FRAMES", "PANEL_COLUMNS", "STATIC_BUDGET_BYTES", "Interactive",
           "frame_png", "interactive"]

MAX_FRAMES = 600                # views one static control may carry (the grid's product)
STATIC_BUDGET_BYTES = 1_000_000  # bytes one static control may add to a page (a chapter may have two)
FRAME_DPI = 100                 # 7 in wide figures -> 700 px, the width of the book's text column
FRAME_COLORS = 96               # palette size of the quantised PNG frames
PANEL_COLUMNS = 80              # the widest text panel line that fits the book's column

_STATIC = files(__package__) / "static"
_STATIC_CSS = (_STATIC / "switcher.css").read_text(encoding="utf-8").strip()
_STATIC_JS = "\n".join((_STATIC / name).read_text(encoding="utf-8").strip()
                       for name in ("plot.js", "switcher.js"))


def frame_png(fig: Figure, dpi: int = FRAME_DPI) -> bytes:
    """The figure as a palette PNG (FRAME_COLORS colours): 3-4 times smaller than full colour."""
    canvas = FigureCanvasAgg(fig)
    fig.set_dpi(dpi)
    canvas.draw()
    rgb = Image.frombuffer("RGBA", canvas.get_width_height(), canvas.buffer_rgba()).convert("RGB")
    buf = io.BytesIO()
    rgb.quantize(colors=FRAME_COLORS, method=Image.Quantize.MEDIANCUT).save(
        buf, format="PNG", optimize=True)
    return buf.getvalue()


@contextlib.contextmanager
def _young_collections():
    """Automatic garbage collection paused; yields collect(), which frees the young generations.

    Each frame's Figure is a web of reference cycles, so only the cycle collector frees it; left
    to itself, the collector also scans the whole heap (torch, the chapter's data) every few
    frames, a third of the static view's time. collect() after each frame frees that frame's
    Figure by scanning only what was made since the last call. Collection is resumed on exit
    (and nothing is collected here if the caller had it off).
    """
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield (lambda: gc.collect(1)) if enabled else (lambda: None)
    finally:
        if enabled:
            gc.enable()


def _label(value) -> str:
    """How a grid value is shown on a control: names for formats, %g for numbers."""
    if isinstance(value, bool) or value is None:
        return str(value)
    if isinstance(value, (int, float)):
        return f"{value:g}"
    return str(getattr(value, "name", value))


def _same(a, b) -> bool:
    """Grid membership: equal and of the same kind (True is not the grid value 1)."""
    return isinstance(a, bool) == isinstance(b, bool) and a == b


def _is_toggle(values) -> bool:
    """A grid list that is exactly {False, True}: shown as a checkbox."""
    return len(values) == 2 and {type(v) for v in values} == {bool}


def _is_numeric(values) -> bool:
    """A grid list of numbers (no bools): shown as a slider over its positions."""
    return all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values)


def _check_grid(view, grid, defaults) -> tuple[list[str], list[tuple], dict]:
    """(names, values per name, fixed keyword arguments) after checking grid and defaults."""
    if not callable(view):
        raise ValueError(f"view must be callable; got view={view!r}")
    sig = inspect.signature(view)
    takes_any = any(p.kind is p.VAR_KEYWORD for p in sig.parameters.values())
    known = [n for n, p in sig.parameters.items() if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
    for where, names in (("grid", list(grid)), ("default", list(defaults))):
        for name in names:
            if not takes_any and name not in known:
                raise ValueError(f"{where} parameter {name!r} is not a parameter of "
                                 f"{getattr(view, '__name__', 'view')}; valid choices: "
                                 + ", ".join(known))
    if not grid:
        raise ValueError("grid must name at least one parameter; got grid={}")
    names, values = [], []
    for name, choices in grid.items():
        if isinstance(choices, (str, bytes)) or not hasattr(choices, "__len__"):
            raise ValueError(f"grid[{name!r}] must be a list of values; got {choices!r}")
        choices = tuple(choices)
        if not choices:
            raise ValueError(f"grid[{name!r}] must hold at least one value; got []")
        labels = [_label(v) for v in choices]
        if len(set(labels)) != len(labels):
            raise ValueError(f"grid[{name!r}] repeats a value; got {list(choices)!r}")
        names.append(name)
        values.append(choices)
    size = math.prod(len(v) for v in values)
    if size > MAX_FRAMES:
        shape = " x ".join(f"{n} {len(v)}" for n, v in zip(names, values, strict=True))
        raise ValueError(f"grid has {size} frames ({shape}); at most {MAX_FRAMES} fit a page: "
                         "shorten a list")
    fixed = {}
    for name, value in defaults.items():
        if name in grid:
            choices = values[names.index(name)]
            if not any(_same(value, c) for c in choices):
                raise ValueError(f"{name}={value!r} is not in the grid; valid choices: "
                                 + ", ".join(_label(c) for c in choices))
        else:
            fixed[name] = value
    return names, values, fixed


def _describe(panel, fig: Figure) -> str:
    """A figure's alt text: what the view says about it (panel.alt), else its axes' titles and labels."""
    return getattr(panel, "alt", "") or figure_summary(fig)


def _data_uri(png: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(png).decode()


class Interactive:
    """view(**params) over the grid's product: live controls in a kernel, a frame switcher in HTML."""

    def __init__(self, view, grid, **defaults):
        names, values, fixed = _check_grid(view, grid, defaults)
        self.view = view
        self.names = names
        self.grid = dict(zip(names, values, strict=True))
        self.fixed = fixed
        chosen = {}
        sig = inspect.signature(view).parameters
        for name, choices in self.grid.items():
            if name in defaults:
                chosen[name] = next(c for c in choices if _same(defaults[name], c))
            elif name in sig and any(_same(sig[name].default, c) for c in choices):
                chosen[name] = sig[name].default
            else:
                chosen[name] = choices[0]
        self.params = chosen
        self.title = getattr(view, "__name__", "view")
        self.default_panel, default_fig = view(**self.fixed, **chosen)  # bad input raises here
        self._default_png = frame_png(default_fig)
        self._default_alt = _describe(self.default_panel, default_fig)
        self._default_fig = default_fig
        self._frames = None
        self._html = None
        self._widget = None
        self.controls: dict = {}
        self.fallbacks: list = []  # (params, reason) of views kept as PNG frames

    # ---------------------------------------------------------------- static frames

    @property
    def size(self) -> int:
        """Number of grid points (frames before de-duplication)."""
        return math.prod(len(v) for v in self.grid.values())

    def _index(self, params: dict) -> tuple[int, ...]:
        return tuple(next(k for k, c in enumerate(self.grid[n]) if _same(params[n], c))
                     for n in self.names)

    def _figure(self, fig: Figure, params: dict):
        """A view's figure for the page: its spec, or PNG bytes when the spec cannot express it."""
        try:
            return figure_spec(fig)
        except UnsupportedFigure as err:  # kept as a picture, never dropped; tests list these
            self.fallbacks.append((params, str(err)))
            return frame_png(fig)

    def frames(self) -> dict:
        """Every grid point's view, row-major: {'frames': [(figure id, panel id)], 'figures', 'alts', 'panels'}."""
        # figures: each distinct one once, a spec dict, PNG bytes (a fallback), or None for a
        # point outside the view's domain; alts: their descriptions; panels: the text panels'
        # HTML, each distinct one once.
        if self._frames is not None:
            return self._frames
        figures, alts, panels, frames = [], [], [], []
        figure_ids, panel_ids = {}, {}
        default_index = self._index(self.params)
        with _young_collections() as collect, figure_copies():
            for index in itertools.product(*(range(len(self.grid[n])) for n in self.names)):
                html_, figure, alt = self._frame(index, index == default_index)
                collect()  # the frame's figure, now garbage, freed without a full-heap scan
                key = figure if figure is None or isinstance(figure, bytes) else json.dumps(
                    figure, separators=(",", ":"))
                frames.append((figure_ids.setdefault(key, len(figure_ids)),
                               panel_ids.setdefault(html_, len(panel_ids))))
                if len(figure_ids) > len(figures):
                    figures.append(figure)
                    alts.append(alt)
                if len(panel_ids) > len(panels):
                    panels.append(html_)
        self._frames = {"frames": frames, "figures": figures, "alts": alts, "panels": panels}
        return self._frames

    def _frame(self, index: tuple[int, ...], is_default: bool) -> tuple[str, object, str]:
        """One grid point's (panel HTML, figure spec or PNG or None, alt text); its Figure is dropped."""
        params = {n: self.grid[n][k] for n, k in zip(self.names, index, strict=True)}
        try:
            panel, fig = ((self.default_panel, self._default_fig) if is_default
                          else self.view(**self.fixed, **params))
            return panel_html(panel), self._figure(fig, params), _describe(panel, fig)
        except ValueError as err:  # outside the view's domain: say so, in <= 80 columns
            message = textwrap.fill(str(err), PANEL_COLUMNS)
            return panel_html(TextPanel(message, error=True)), None, ""

    def panel_texts(self) -> dict[tuple, str]:
        """Each grid point's text panel as plain text (what the page shows), keyed by its control values."""
        fr = self.frames()
        keys = itertools.product(*self.grid.values())
        return {k: html.unescape(re.sub(r"<[^>]+>", "", fr["panels"][p]))
                for k, (_, p) in zip(keys, fr["frames"], strict=True)}

    @property
    def element_id(self) -> str:
        """The control's HTML id: stable while view, grid and defaults stay the same."""
        key = repr((self.title, [(n, [_label(v) for v in self.grid[n]]) for n in self.names],
                    sorted((n, _label(v)) for n, v in {**self.fixed, **self.params}.items())))
        stem = re.sub(r"[^A-Za-z0-9]+", "-", self.title.removesuffix("_view")).strip("-")
        return f"pl-{stem}-{hashlib.sha1(key.encode()).hexdigest()[:6]}"

    def _control_html(self, name: str, labels: list[str], k0: int) -> str:
        """One control, labelled with its parameter's name: checkbox, slider or drop-down."""
        values, esc = self.grid[name], html.escape(name)
        if len(values) == 1:  # nothing to choose: shown as text, not as a control
            return f'<span><span class="pl-name">{esc}</span> = {html.escape(labels[0])}</span>'
        tag = f'data-pl-param="{esc}" aria-label="{esc}"'
        if _is_toggle(values):
            return (f'<label><input type="checkbox" {tag}{" checked" if values[k0] else ""}> '
                    f'<span class="pl-name">{esc}</span></label>')
        if _is_numeric(values):
            return (f'<label><span class="pl-name">{esc}</span><input type="range" min="0" '
                    f'max="{len(values) - 1}" step="1" value="{k0}" {tag} '
                    f'aria-valuetext="{html.escape(labels[k0])}"><output data-pl-for="{esc}">'
                    f"{html.escape(labels[k0])}</output></label>")
        options = "".join(f'<option value="{k}"{" selected" if k == k0 else ""}>'
                          f"{html.escape(lab)}</option>" for k, lab in enumerate(labels))
        return f'<label><span class="pl-name">{esc}</span><select {tag}>{options}</select></label>'

    def static_html(self) -> str:
        """Self-contained HTML: controls, the default view as a PNG, every view's data and the scripts."""
        if self._html is not None:
            return self._html
        data = self.frames()
        uid = self.element_id
        labels = [[_label(v) for v in self.grid[n]] for n in self.names]
        start = self._index(self.params)
        checkbox = [[values.index(False), values.index(True)] if _is_toggle(values) else None
                    for values in self.grid.values()]
        parts = [f'<div class="pl-interactive" id="{uid}" data-pl-frames="{self.size}">',
                 f"<style>{_STATIC_CSS}</style>", '<form class="pl-controls" onsubmit="return false">',
                 *(self._control_html(n, labels[i], start[i]) for i, n in enumerate(self.names)),
                 "</form>"]
        flat0 = 0
        for i, n in enumerate(self.names):
            flat0 = flat0 * len(self.grid[n]) + start[i]
        panel0 = data["frames"][flat0][1]
        parts.append(f'<div class="pl-panel" aria-live="polite">{data["panels"][panel0]}</div>')
        shown = " ".join(self.title.split("_")).strip()  # bit_view -> "bit view"
        said = ", ".join(f"{n}={labels[i][start[i]]}" for i, n in enumerate(self.names))
        about = self._default_alt
        alt = f"{shown}, {said}" + (f": {about}" if about else "")
        # the default view as a picture: what a page without scripts, or a printout, shows
        parts.append(f'<img class="pl-frame" alt="{html.escape(alt)}" '
                     f'src="{_data_uri(self._default_png)}">')
        figures = [None if f is None else _data_uri(f) if isinstance(f, bytes) else f
                   for f in data["figures"]]
        payload = {"id": uid, "view": shown, "names": self.names, "labels": labels,
                   "checkbox": checkbox, "frames": data["frames"], "figures": figures,
                   "alts": data["alts"], "panels": data["panels"]}
        blob = json.dumps(payload, separators=(",", ":")).replace("</", "<\\/")
        parts.append(f'<p class="pl-note">{self.size} views computed when the page was built '
                     f"({len(figures)} distinct figures); run the notebook for live controls.</p>")
        parts.append(f'<script type="application/json" class="pl-data">{blob}</script>')
        parts.append(f"<script>{_STATIC_JS}</script></div>")
        self._html = "".join(parts)
        if len(self._html.encode()) > STATIC_BUDGET_BYTES:
            raise ValueError(f"the static control for {self.title} takes {len(self._html.encode())} "
                             f"bytes, over the page budget of {STATIC_BUDGET_BYTES}: shorten the grid")
        return self._html

    # ---------------------------------------------------------------- live controls

    def widget(self):
        """The live ipywidgets form (7.x and 8.x): controls, text panel and figure, view called on each change."""
        if self._widget is not None:
            return self._widget
        for name in self.names:
            values = self.grid[name]
            options = [(_label(v), v) for v in values]
            if _is_toggle(values):
                box = wd.Checkbox(value=self.params[name], description=name)
            elif _is_numeric(values):
                box = wd.SelectionSlider(options=options, value=self.params[name],
                                         description=name, continuous_update=False)
            else:
                box = wd.Dropdown(options=options, value=self.params[name], description=name)
            self.controls[name] = box
        panel = wd.HTML(value=panel_html(self.default_panel))
        image = wd.Image(value=self._default_png, format="png")

        def redraw(_change=None):
            params = {n: box.value for n, box in self.controls.items()}
            try:
                text, fig = self.view(**self.fixed, **params)
            except ValueError as err:  # outside the view's domain: say so, hide the figure
                panel.value = panel_html(TextPanel(str(err), error=True))
                image.layout.display = "none"
                return
            panel.value = panel_html(text)
            image.value = frame_png(fig)
            image.layout.display = None

        for box in self.controls.values():
            box.observe(redraw, names="value")
        row = wd.HBox(list(self.controls.values()), layout=wd.Layout(flex_flow="row wrap"))
        self._widget = wd.VBox([row, panel, image])
        return self._widget

    # ---------------------------------------------------------------- display

    def _repr_mimebundle_(self, include=None, exclude=None):
        """Both forms; the front end picks (Jupyter, Colab, VS Code: the live widget view first)."""
        # The book's HTML build is told (_config.yml, nb_mime_priority_overrides) to drop the
        # widget-view type and so renders text/html (the frame switcher), as do viewers
        # without a kernel.
        bundle = {"text/plain": repr(self)}
        if (include is None or "text/html" in include) and "text/html" not in (exclude or ()):
            bundle["text/html"] = self.static_html()  # the frames are computed here, once
        shell = IPython.get_ipython()  # looked up per call: None outside IPython
        if getattr(shell, "kernel", None) is not None:  # a front end may be listening: go live
            box = self.widget()
            bundle["application/vnd.jupyter.widget-view+json"] = {
                "version_major": 2, "version_minor": 0, "model_id": box.model_id}
        return bundle

    def __repr__(self) -> str:
        shape = " x ".join(f"{n} ({len(v)})" for n, v in self.grid.items())
        return (f"{self.title} over {shape}; shown: "
                + ", ".join(f"{n}={_label(v)}" for n, v in self.params.items())
                + f"\n{self.default_panel!r}")


def interactive(view, grid, **defaults) -> Interactive:
    """Show view(**params) for params in the product of grid's lists: live or as precomputed frames."""
    return Interactive(view, grid, **defaults)
