"""Tests for precisionlab.widgets: views build without a display, defaults are drawn, bad
input is rejected with a message naming it, and callbacks survive bad input."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import re
from importlib.resources import files

import ipywidgets
import pytest
from matplotlib.figure import Figure

from precisionlab import widgets
from precisionlab.widgets.view import figure_summary


def test_bit_view_shows_fields_of_one():
    panel, fig = widgets.bit_view(1.0, "bfloat16")
    # IEEE layout of 1.0 in bf16: sign 0, biased exponent 127, fraction 0.
    assert "0 01111111 0000000" in panel.text
    assert "next_up    = 1.0078125" in panel.text  # 1 + 2^-7
    assert "next_down  = 0.99609375" in panel.text  # 1 - 2^-8: the gap halves below 1
    assert isinstance(fig, Figure) and len(fig.axes) == 1
    assert fig.axes[0].collections  # the grid ticks were drawn
    assert "<pre" in panel._repr_html_()


def test_bit_explorer_live_controls_recompute():
    explorer = widgets.bit_explorer(0.1, "float16", "toward_zero")
    box = explorer.widget()
    assert isinstance(box, ipywidgets.VBox)
    controls, panel, image = box.children
    assert [c.description for c in controls.children] == ["value", "fmt", "mode"]
    assert {n: c.value for n, c in explorer.controls.items()} == {
        "value": 0.1, "fmt": "float16", "mode": "toward_zero"}
    assert "rounded into float16 (toward_zero)" in panel.value
    first = image.value
    explorer.controls["fmt"].value = "float8_e5m2"  # the callback calls bit_view again
    assert "rounded into float8_e5m2" in panel.value and image.value != first
    explorer.controls["value"].value = 1000.0
    explorer.controls["fmt"].value = "float8_e4m3fn"  # 1000 > 448: reported, figure hidden
    assert "outside float8_e4m3fn&#x27;s finite range" in panel.value
    assert image.layout.display == "none"
    explorer.controls["fmt"].value = "bfloat16"
    assert "rounded into bfloat16" in panel.value and image.layout.display is None


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"fmt": "fp7"}, "valid choices"),
        ({"fmt": "float64"}, r"fmt='float64' is not in the grid; valid choices: float32, tf32"),
        ({"mode": "stochastic"}, "mode='stochastic' is not in the grid; valid choices"),
        ({"value": float("inf")}, "value=inf is not in the grid; valid choices: 1e-05, 0.001, 0.01"),
        ({"value": "abc"}, "value='abc' is not in the grid"),
    ],
)
def test_bit_explorer_rejects_bad_input(kwargs, match):
    with pytest.raises(ValueError, match=match):
        widgets.bit_explorer(**kwargs)


def test_crossing_view_and_explorer():
    panel, fig = widgets.crossing_view(1.0, 1e-5)
    assert "exact steps to first change   : 391" in panel.text  # 2^-8 / 1e-5 = 390.6 -> 391
    assert "float32-master simulation     : 391" in panel.text
    assert len(fig.axes) == 1 and len(fig.axes[0].get_lines()) >= 2
    explorer = widgets.crossing_explorer(0.25, 1e-4, "float16")
    assert "float16" in explorer.default_panel.text
    explorer.widget()
    explorer.controls["lr"].value = 1e-3
    assert "lr = 0.001" in explorer.widget().children[1].value


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"lr": 0.0}, "lr=0.0 is not in the grid"),
        ({"fmt": "float64"}, "fmt='float64' is not in the grid"),
        ({"w": 0.5}, "w=0.5 is not in the grid; valid choices: 0.25, 1, 4"),
        ({"w": float("nan")}, "not in the grid"),
    ],
)
def test_crossing_explorer_rejects_bad_input(kwargs, match):
    with pytest.raises(ValueError, match=match):
        widgets.crossing_explorer(**kwargs)


def test_figures_are_displayed_as_png_images():
    """The live form shows the view's figure as a PNG, whatever matplotlib backend is active."""
    image = widgets.bit_explorer(0.3, "float16").widget().children[2]
    assert image.format == "png" and image.value[:8] == b"\x89PNG\r\n\x1a\n"


def test_bit_view_checks_the_mode_with_rounding_check_mode():
    with pytest.raises(ValueError, match="unknown rounding mode 'up-ish'; valid choices: nearest_even"):
        widgets.bit_view(0.1, "bfloat16", "up-ish")
    with pytest.raises(ValueError, match="unknown rounding mode 'stochastic'"):
        widgets.bit_view(0.1, "bfloat16", "stochastic")  # a frame must be reproducible


# --------------------------------------------------------------------------- interactive()

from html.parser import HTMLParser  # noqa: E402


def _toy_view(k: int = 1, name: str = "a", flag: bool = False):
    """A cheap view whose text and figure both depend on every parameter."""
    fig = Figure(figsize=(3, 2))
    ax = fig.subplots()
    ax.plot([0, 1], [0, k * (2 if flag else 1)], color="k")
    ax.set_title(name)
    if k == 3 and name == "b":
        raise ValueError("k=3 with name='b' is outside this view's domain")
    return widgets.TextPanel(f"k={k} name={name} flag={flag}"), fig


class _Assets(HTMLParser):
    """Every tag with its attributes, to find anything a page would fetch."""

    def __init__(self):
        super().__init__()
        self.tags = []

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))


def test_interactive_precomputes_one_view_per_grid_point():
    explorer = widgets.interactive(_toy_view, {"k": [1, 2, 3], "name": ["a", "b"]}, name="b")
    assert explorer.params == {"k": 1, "name": "b"}  # k: the view's own default
    data = explorer.frames()
    assert len(data["frames"]) == 6 == explorer.size
    assert len(set(map(tuple, data["frames"]))) == 6  # every grid point shows something else
    assert len(data["panels"]) == 6
    specs = [f for f in data["figures"] if f is not None]
    assert len(specs) == 5 and all(isinstance(f, dict) for f in specs)  # (k=3, name=b): an error
    assert sorted(f["axes"][0]["items"][0]["y"][1] for f in specs) == [1, 1, 2, 2, 3]
    assert not explorer.fallbacks
    # row-major order: (k=3, name=b) is the last frame; its panel carries the view's message
    assert "outside this view" in data["panels"][data["frames"][-1][1]]
    assert data["figures"][data["frames"][-1][0]] is None


def test_interactive_static_html_is_self_contained():
    explorer = widgets.interactive(_toy_view, {"k": [1, 2], "name": ["a", "b"],
                                               "flag": [False, True]})
    page = explorer.static_html()
    parser = _Assets()
    parser.feed(page)
    kinds = {tag for tag, _ in parser.tags}
    assert {"input", "select", "img", "script", "output"} <= kinds
    for tag, attrs in parser.tags:
        assert tag not in ("link", "iframe", "object", "embed"), tag
        for key in ("src", "href", "data", "srcset"):
            value = attrs.get(key)
            assert value is None or value.startswith("data:image/png;base64,"), (tag, key)
    # the SVG namespace in plot.js is a name, not a request; nothing else names a host
    assert "https://" not in page and "//cdn" not in page
    assert "http://" not in page.replace("http://www.w3.org/2000/svg", "")
    # 8 views; (k=1, flag) and (k=2, no flag) draw the same figure, stored once; the only
    # picture is the default view's PNG (for a page without scripts)
    assert len(explorer.frames()["figures"]) == 6
    assert page.count("data:image/png;base64,") == 1
    assert f'id="{explorer.element_id}"' in page
    assert len(page.encode()) <= widgets.STATIC_BUDGET_BYTES


class _Controls(HTMLParser):
    """The switcher's controls and frame image: tag, attributes, and the text of each <output>."""

    def __init__(self):
        super().__init__()
        self.controls, self.images, self._out, self.outputs = [], [], None, {}

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if "data-pl-param" in attrs:
            self.controls.append((tag, attrs))
        if tag == "img":
            self.images.append(attrs)
        self._out = attrs.get("data-pl-for") if tag == "output" else None

    def handle_data(self, data):
        if self._out is not None:
            self.outputs[self._out] = data


def test_interactive_controls_are_labelled_and_frames_described():
    explorer = widgets.interactive(_toy_view, {"k": [1, 2, 3], "name": ["a", "b"],
                                               "flag": [False, True]}, k=2)
    page = explorer.static_html()
    parsed = _Controls()
    parsed.feed(page)
    # one native, focusable control per parameter, each named by an aria-label
    assert [(tag, a.get("type"), a["aria-label"]) for tag, a in parsed.controls] == [
        ("input", "range", "k"), ("select", None, "name"), ("input", "checkbox", "flag")]
    assert all("tabindex" not in a and "disabled" not in a for _, a in parsed.controls)
    slider = parsed.controls[0][1]
    assert (slider["value"], slider["aria-valuetext"], parsed.outputs["k"]) == ("1", "2", "2")
    # the shown frame says which view and parameters it shows, then what the figure holds
    (img,) = parsed.images
    assert img["alt"] == "toy view, k=2, name=a, flag=False: a"  # the Axes' title is "a"
    data = explorer.frames()
    assert len(data["alts"]) == len(data["figures"])
    assert {a for a, f in zip(data["alts"], data["figures"], strict=True) if f} == {"a", "b"}
    assert data["alts"][data["figures"].index(None)] == ""  # the error frame shows no figure
    assert '"view":"toy view"' in page and '"alts":[' in page


def test_interactive_alt_text_comes_from_the_view_when_it_gives_one():
    def described(k: int = 1):
        fig = Figure(figsize=(3, 2))
        fig.subplots().plot([0, 1], [0, k])
        return widgets.TextPanel(f"k={k}", alt=f"a line of slope {k}"), fig

    data = widgets.interactive(described, {"k": [1, 2]}).frames()
    assert data["alts"] == ["a line of slope 1", "a line of slope 2"]


def test_book_views_describe_their_figures():
    _, fig = widgets.bit_view(0.1, "bfloat16")
    assert figure_summary(fig) == "bfloat16 near 0.1 (x: value)"
    _, fig = widgets.scaling_view(steps=40)  # two Axes, each titled
    assert figure_summary(fig) == ("Loss scale per step (x: step; y: log2(loss scale)); "
                                   "Headroom below overflow (x: step; y: scaled gradient)")


def test_switcher_script_and_style_are_package_data():
    static = files("precisionlab.widgets") / "static"
    plot, js, css = ((static / name).read_text(encoding="utf-8").strip()
                     for name in ("plot.js", "switcher.js", "switcher.css"))
    assert "aria-valuetext" in js and ":focus-visible" in css and "aria-label" in plot
    page = widgets.interactive(_toy_view, {"k": [1, 2]}).static_html()
    assert f"<script>{plot}\n{js}</script>" in page and f"<style>{css}</style>" in page


def test_interactive_mimebundle_offers_live_widget_only_in_a_kernel(monkeypatch):
    import IPython

    explorer = widgets.interactive(_toy_view, {"k": [1, 2]})
    bundle = explorer._repr_mimebundle_()
    assert set(bundle) == {"text/plain", "text/html"}  # no kernel: nothing live to offer

    class Shell:
        kernel = object()

    monkeypatch.setattr(IPython, "get_ipython", lambda: Shell())
    bundle = explorer._repr_mimebundle_()
    view = bundle["application/vnd.jupyter.widget-view+json"]
    assert view == {"version_major": 2, "version_minor": 0,
                    "model_id": explorer.widget().model_id}
    assert bundle["text/html"] == explorer.static_html()


def test_interactive_live_checkbox_and_error_frames():
    explorer = widgets.interactive(_toy_view, {"k": [1, 3], "name": ["a", "b"],
                                               "flag": [False, True]})
    box = explorer.widget()
    assert isinstance(explorer.controls["flag"], ipywidgets.Checkbox)
    assert isinstance(explorer.controls["k"], ipywidgets.SelectionSlider)
    assert isinstance(explorer.controls["name"], ipywidgets.Dropdown)
    panel, image = box.children[1:]
    explorer.controls["flag"].value = True
    assert "flag=True" in panel.value
    explorer.controls["k"].value = 3
    explorer.controls["name"].value = "b"
    assert "outside this view" in panel.value and image.layout.display == "none"


@pytest.mark.parametrize(
    "grid, defaults, match",
    [
        ({}, {}, "at least one parameter"),
        ({"kk": [1]}, {}, "grid parameter 'kk' is not a parameter of _toy_view; valid choices: "
                          "k, name, flag"),
        ({"k": [1]}, {"nam": "a"}, "default parameter 'nam' is not a parameter"),
        ({"k": 3}, {}, r"grid\['k'\] must be a list of values; got 3"),
        ({"k": "123"}, {}, r"grid\['k'\] must be a list"),
        ({"k": []}, {}, r"grid\['k'\] must hold at least one value"),
        ({"k": [1, 1.0]}, {}, r"grid\['k'\] repeats a value"),
        ({"k": [1, 2]}, {"k": 5}, "k=5 is not in the grid; valid choices: 1, 2"),
        ({"flag": [False, True]}, {"flag": 1}, "flag=1 is not in the grid; valid choices: False, True"),
        ({"k": list(range(25)), "name": [str(j) for j in range(25)]}, {},
         "grid has 625 frames \\(k 25 x name 25\\); at most 600"),
    ],
)
def test_interactive_rejects_bad_grids(grid, defaults, match):
    with pytest.raises(ValueError, match=match):
        widgets.interactive(_toy_view, grid, **defaults)


def test_interactive_rejects_a_view_that_is_not_callable():
    with pytest.raises(ValueError, match="view must be callable; got view=3"):
        widgets.interactive(3, {"k": [1]})


def test_interactive_default_view_errors_surface_at_the_call():
    with pytest.raises(ValueError, match="outside this view's domain"):
        widgets.interactive(_toy_view, {"k": [3], "name": ["b"]})


@pytest.mark.parametrize(
    "explorer, kwargs",
    [
        (widgets.bit_explorer, {}),
        (widgets.crossing_explorer, {}),
        (widgets.reduction_explorer, {}),
        (widgets.underflow_explorer, {}),
        (widgets.scaling_explorer, {}),
        (widgets.phantom_explorer, {"steps": 3}),
    ],
    ids=lambda v: getattr(v, "__name__", ""),
)
def test_every_explorer_meets_the_page_budget(explorer, kwargs):
    """The book's explorers: grid within MAX_FRAMES, distinct frames, static HTML within budget."""
    it = explorer(**kwargs)
    assert it.size <= widgets.MAX_FRAMES
    page = it.static_html()
    assert len(page.encode()) <= widgets.STATIC_BUDGET_BYTES
    data = it.frames()
    shown = {tuple(f) for f in data["frames"]}
    assert len(shown) > 1  # moving a control changes what is shown
    assert len(data["figures"]) > 1 and len(data["panels"]) > 1
    assert not it.fallbacks  # every view drawn from its spec, none kept as a PNG
    assert _panel_columns(data["panels"]) <= widgets.PANEL_COLUMNS


# --------------------------------------------------------------------------- figure specs

import html as _html  # noqa: E402
import math  # noqa: E402

import numpy as np  # noqa: E402
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from matplotlib import cbook  # noqa: E402

from precisionlab.widgets import figure_json  # noqa: E402


def _panel_columns(panels) -> int:
    """The widest line of the text panels' HTML, as the reader sees it."""
    return max(len(line) for p in panels
               for line in _html.unescape(re.sub("<[^>]+>", "", p)).splitlines())


def _round(v: float, digits: int = figure_json.DIGITS) -> float:
    """v to `digits` significant digits, by Python's own formatting (the oracle)."""
    return float(f"{v:.{digits}g}")


def _expanded(line) -> np.ndarray:
    """The vertices matplotlib draws for a Line2D: its data with the step drawstyle applied."""
    x, y = (np.asarray(v, dtype=float) for v in line.get_data())
    style = line.get_drawstyle()
    if style != "default":
        x, y = cbook.STEP_LOOKUP_MAP[style](x, y)
    return np.column_stack([x, y])


def _distance_to_polyline(p: np.ndarray, poly: np.ndarray) -> float:
    """Smallest distance from point p to the segments of poly (brute force over all segments)."""
    a, b = poly[:-1], poly[1:]
    d = b - a
    seg = (d ** 2).sum(axis=1)
    t = np.clip(((p - a) * d).sum(axis=1) / np.where(seg > 0, seg, 1), 0, 1)
    return float(np.min(np.hypot(*(a + t[:, None] * d - p).T)))


def _check_lines(fig, spec) -> int:
    """Every Line2D of fig against its spec item: kept points are the figure's own (rounded),
    in order, first and last kept, and every dropped vertex within TOLERANCE_PX of the kept
    line in display pixels (matplotlib's transData at PX_PER_INCH dots per inch)."""
    fig.set_dpi(figure_json.PX_PER_INCH)
    checked = 0
    for ax, ax_spec in zip(fig.axes, spec["axes"], strict=True):
        items = [it for it in ax_spec["items"] if it["t"] == "line"]
        lines = sorted((ln for ln in ax.get_lines() if ln.get_visible()), key=lambda ln: ln.get_zorder())
        assert len(items) == len(lines)
        for line, it in zip(lines, items, strict=True):
            full = _expanded(line)
            kept = np.array([(x if x is not None else np.nan, y if y is not None else np.nan)
                             for x, y in zip(it["x"], it["y"], strict=True)])
            dx, dy = (d if c == "d" else figure_json.DIGITS
                      for d, c in zip(ax_spec["digits"], it["c"], strict=True))
            want = np.array([[_round(x, dx), _round(y, dy)] if np.isfinite([x, y]).all()
                             else [np.nan] * 2 for x, y in full])
            j = 0  # kept points appear in the figure's vertices, in order
            for point in kept:
                while j < len(want) and not np.array_equal(want[j], point, equal_nan=True):
                    j += 1
                assert j < len(want), (line.get_label(), point)
            if np.isfinite(full).all() and line.get_transform() == ax.transData:
                assert np.array_equal(kept[[0, -1]], want[[0, -1]])
                px_full = ax.transData.transform(full)
                px_kept = ax.transData.transform(kept)
                if len(px_kept) > 1:
                    worst = max(_distance_to_polyline(p, px_kept) for p in px_full)
                    assert worst <= figure_json.TOLERANCE_PX + 0.05, (line.get_label(), worst)
            checked += 1
    return checked


@pytest.mark.parametrize("make", [
    lambda: widgets.bit_view(0.1, "bfloat16"),
    lambda: widgets.crossing_view(4.0, 1e-6, "bfloat16"),  # 15 600 steps: simplified
    lambda: widgets.scaling_view(steps=200),                # a log axis and step lines
    lambda: widgets.allclose_view(256, "float16", 0.1),     # symlog, fill_between, markers
    lambda: widgets.underflow_view(0.82, 96, "float16"),
    lambda: widgets.reduction_view("atomic", "float16", margin=1e-3, runs=300),
], ids=["bit", "crossing", "scaling", "allclose", "underflow", "reduction"])
def test_figure_spec_holds_the_figures_numbers(make):
    """The page draws the numbers the live widget's matplotlib figure draws."""
    _, fig = make()
    spec = figure_json.figure_spec(fig)
    assert _check_lines(fig, spec) >= 1
    fig.canvas.draw()  # matplotlib's own tick labels and limits, after a full draw
    for ax, a in zip(fig.axes, spec["axes"], strict=True):
        assert a["title"] == ax.get_title() and a["xlabel"] == ax.get_xlabel()
        dx, dy = a["digits"]
        assert a["xlim"] == [_round(v, dx) for v in ax.get_xlim()]
        assert a["ylim"] == [_round(v, dy) for v in ax.get_ylim()]
        assert a["xscale"]["type"] == ax.get_xscale() and a["yscale"]["type"] == ax.get_yscale()
        for which, axis in (("xticks", ax.xaxis), ("yticks", ax.yaxis)):
            lo, hi = sorted(ax.get_xlim() if which == "xticks" else ax.get_ylim())
            d = dy if which == "yticks" else dx
            text = {_round(t.get_position()[which == "yticks"], d): t.get_text()
                    for t in axis.get_ticklabels() if t.get_visible()}
            shown = [(_round(v, d), figure_json.plain_text(text.get(_round(v, d), "")))
                     for v in axis.get_ticklocs()
                     if lo - 1e-9 * (hi - lo) <= v <= hi + 1e-9 * (hi - lo)]
            assert [tuple(t) for t in a[which]] == shown
        legend = ax.get_legend()
        if legend is not None:
            assert [e["label"] for e in a["legend"]["entries"]] == [t.get_text()
                                                                  for t in legend.get_texts()]
        for coll in ax.collections:  # vlines and fill_between: the same vertices, rounded
            items = [it for it in a["items"] if it["t"] in ("segs", "poly")]
            if hasattr(coll, "get_segments"):
                flat = [_round(v, (dx, dy)[j % 2]) for s in coll.get_segments()
                        for j, v in enumerate(np.ravel(s))]
                assert any(it.get("xy") == flat for it in items), coll.get_label()
            else:
                polys = [[_round(v, (dx, dy)[j % 2]) for j, v in enumerate(p.vertices.ravel())]
                         for p in coll.get_paths()]
                assert any(it.get("polys") == polys for it in items), coll.get_label()


def test_figure_spec_keeps_bars_and_text():
    _, fig = widgets.reduction_view("atomic", "float16", margin=1e-3, runs=300)
    spec = figure_json.figure_spec(fig)
    bars = [p for it in spec["axes"][0]["items"] if it["t"] == "poly" for p in it["polys"]]
    rects = [r for r in fig.axes[0].patches]
    assert len(bars) == len(rects)
    heights = sorted(_round(r.get_height(), spec["axes"][0]["digits"][1]) for r in rects)
    assert sorted(p[5] for p in bars) == heights  # the top-right corner's y is the bar's height
    _, fig = widgets.bit_view(0.1, "bfloat16")
    texts = [it["s"] for it in figure_json.figure_spec(fig)["axes"][0]["items"] if it["t"] == "text"]
    assert sorted(texts) == sorted(t.get_text() for t in fig.axes[0].texts)


def test_unsupported_artists_raise_and_the_view_is_kept_as_a_png():
    def pictured(k: int = 1):
        fig = Figure(figsize=(3, 2))
        fig.subplots().imshow(np.arange(4.0 * k).reshape(2, -1))
        return widgets.TextPanel(f"k={k}"), fig

    with pytest.raises(figure_json.UnsupportedFigure, match="AxesImage"):
        figure_json.figure_spec(pictured()[1])
    explorer = widgets.interactive(pictured, {"k": [1, 2]})
    data = explorer.frames()
    assert [type(f) for f in data["figures"]] == [bytes, bytes]
    assert len(explorer.fallbacks) == 2 and "AxesImage" in explorer.fallbacks[0][1]
    assert explorer.static_html().count("data:image/png;base64,") == 3  # default <img> + 2


@pytest.mark.parametrize("text, shown", [
    ("$\\mathdefault{10^{-5}}$", "10\u207b\u2075"),
    ("$\\mathdefault{-10^{2}}$", "\u221210\u00b2"),
    ("$\\mathdefault{0}$", "0"),
    ("g0\u00b7a^k, a = 0.82", "g0\u00b7a^k, a = 0.82"),  # outside $...$: left as written
    ("$g_{0}$ costs \\$3", "g\u2080 costs $3"),
])
def test_plain_text_turns_mathtext_into_unicode(text, shown):
    assert figure_json.plain_text(text) == shown


def test_plain_text_refuses_what_it_cannot_show():
    with pytest.raises(figure_json.UnsupportedFigure, match="frac"):
        figure_json.plain_text("$\\frac{1}{2}$")


def test_simplify_keeps_every_point_within_tolerance():
    rng = np.random.default_rng(0)
    x = np.arange(5000.0)
    y = np.cumsum(rng.normal(size=x.size))
    keep = figure_json.simplify(x, y, tol=0.5)
    assert keep[0] == 0 and keep[-1] == x.size - 1 and np.all(np.diff(keep) > 0)
    assert keep.size < x.size / 2
    poly = np.column_stack([x[keep], y[keep]])
    worst = max(_distance_to_polyline(p, poly) for p in np.column_stack([x, y])[::7])
    assert worst <= 0.5
    line = np.arange(100.0)
    assert list(figure_json.simplify(line, 2 * line)) == [0, 99]  # a straight line: its ends


def _rdp_reference(x: list[float], y: list[float], tol: float) -> list[int]:
    """Ramer-Douglas-Peucker by recursion on Python floats, one segment at a time."""
    def farthest(i: int, j: int) -> tuple[float, int]:
        dx, dy = x[j] - x[i], y[j] - y[i]
        seg, best, at = dx * dx + dy * dy, -1.0, i + 1
        for k in range(i + 1, j):
            sx, sy = x[k] - x[i], y[k] - y[i]
            t = 0.0 if seg == 0 else min(max((sx * dx + sy * dy) / seg, 0.0), 1.0)
            d = float(np.hypot(sx - t * dx, sy - t * dy))  # np.hypot: the bits simplify gets
            if d > best:
                best, at = d, k
        return best, at

    def keep(i: int, j: int) -> list[int]:
        if j - i < 2:
            return []
        d, k = farthest(i, j)
        return [*keep(i, k), k, *keep(k, j)] if d > tol else []

    n = len(x)
    return list(range(n)) if n <= 2 else [0, *keep(0, n - 1), n - 1]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.integers(-40, 40), st.integers(-40, 40)), max_size=60),
       st.sampled_from([0.0, 0.25, 1.0, 3.0]), st.sampled_from([1.0, 0.37, 8.0]))
def test_simplify_keeps_what_one_segment_at_a_time_keeps(points, tol, scale):
    """Generation-at-a-time RDP = the recursive one: repeated points, ties, back-tracking."""
    x = [a * scale for a, _ in points]
    y = [b * scale / 3 for _, b in points]
    got = figure_json.simplify(np.array(x, dtype=np.float64), np.array(y, dtype=np.float64), tol)
    assert got.tolist() == _rdp_reference(x, y, tol)


@pytest.mark.parametrize("name", ["BIT", "CROSSING", "REDUCTION", "WORLD", "UNDERFLOW",
                                  "SCALING", "ALLCLOSE"])
def test_each_explorer_has_a_main_slider_of_twelve_positions(name):
    """Issue 21: a slider a reader drags through many values, not a toggle."""
    grid = getattr(widgets, f"{name}_GRID")
    sliders = [len(v) for v in grid.values()
               if all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in v)]
    assert max(sliders) >= 12
    assert math.prod(len(v) for v in grid.values()) <= widgets.MAX_FRAMES


@pytest.mark.parametrize("make", [
    lambda: widgets.world_view(policy="hysteresis", horizon=30),
    lambda: widgets.underflow_view(0.9, 48, "bfloat16", network=True),
    lambda: widgets.allclose_view(256, "bfloat16", 0.1),
    lambda: widgets.crossing_view(0.25, 5e-3, "float8_e5m2"),
    lambda: widgets.bit_view(1e-5, "float8_e4m3fn", "toward_zero"),  # rounds to 0
], ids=["world", "underflow-network", "allclose", "crossing", "bit-zero"])
def test_book_views_are_drawn_from_specs(make):
    """Corners of the grids the PNG frames never needed: the spec expresses them all."""
    panel, fig = make()
    assert figure_json.figure_spec(fig)["axes"]
    assert max(len(line) for line in panel.text.splitlines()) <= widgets.PANEL_COLUMNS


def test_a_parameter_with_one_value_is_shown_as_text_not_a_control():
    explorer = widgets.interactive(_toy_view, {"k": [2], "name": ["a", "b"]})
    parsed = _Controls()
    parsed.feed(explorer.static_html())
    assert [a["aria-label"] for _, a in parsed.controls] == ["name"]
    assert '<span class="pl-name">k</span> = 2' in explorer.static_html()


def test_text_panels_wrap_instead_of_scrolling():
    style = widgets.TextPanel("x" * 120)._repr_html_()
    assert "white-space: pre-wrap" in style and "12.5px" in style
    message = "k=3 with name='b' is outside this view's domain " * 3

    def wordy(k: int = 1, name: str = "b"):
        if k == 3:
            raise ValueError(message)
        return _toy_view(k, name)

    explorer = widgets.interactive(wordy, {"k": [1, 3], "name": ["b"]})
    assert _panel_columns(explorer.frames()["panels"]) <= widgets.PANEL_COLUMNS


# --------------------------------------------------------------------------- phantom explorer


def test_phantom_explorer_with_supplied_runs_shows_the_same_views():
    """Runs handed in (a chapter's, trained with extras) give every view of the retrained explorer."""
    from precisionlab import rl

    kw = {"engine": "bf16", "trainer": "fp32", "eps": 0.05, "lr": 1.5e-4, "steps": 3}
    base = rl.RunConfig(trainer="fp32", engine="bf16", lr=1.5e-4, steps=3)
    # the oracle: the explorer that trains every run itself
    plain = widgets.phantom_explorer(**kw)
    runs = {(t, e): rl.train(rl.PolicyConfig(), rl.with_changes(
                base, trainer=t, eps_low=e, eps_high=e), seed=0, progress=False,
                record=range(3), gradients=(1,))  # extras that must not change a view
            for t, e in [("fp32", 0.05), ("bf16", 0.05), ("fp32", 0.2), ("fp32", 10.0)]}
    given = widgets.phantom_explorer(**kw, runs=runs)
    assert given.frames() == plain.frames()
    assert given.element_id == plain.element_id and repr(given) == repr(plain)
    assert given.static_html() == plain.static_html()
    # a supplied log is used where it is asked for: the view reads its numbers, not a retrain
    import dataclasses

    marked = dataclasses.replace(runs["fp32", 0.05], reward=runs["fp32", 0.05].reward - 0.5)
    text, _ = widgets.phantom_view(**kw, step=2, runs={("fp32", 0.05): marked})
    assert f"reward {marked.reward[2]:.2f}" in str(text)
    assert f"reward {runs['fp32', 0.05].reward[2]:.2f}" not in str(text)
    # a log of another run is refused, naming the parameter
    wrong = {("fp32", 0.2): runs["fp32", 0.05]}
    with pytest.raises(ValueError, match=r"runs\[\('fp32', 0.2\)\] must be the RunLog"):
        widgets.phantom_explorer(**kw, runs=wrong)


@pytest.mark.parametrize("fmt", ["float64", "float4_e2m1fn", "float6_e2m3fn", "float6_e3m2fn",
                                 "float8_e8m0fnu", "e8m0", "float128", 3])
def test_crossing_view_lists_exactly_the_formats_it_takes(fmt):
    """The error's valid choices are the formats the view accepts: every one of them draws."""
    from precisionlab.formats import FORMATS

    with pytest.raises(ValueError, match="fmt must be") as info:
        widgets.crossing_view(1.0, 1e-3, fmt)
    listed = str(info.value).split("valid choices: ")[1].split("; got")[0].split(", ")
    taken = []
    for name, f in FORMATS.items():
        try:  # a step of 3/4 of an ulp of w = 0.25 (the trajectory window stays small)
            widgets.crossing_view(0.25, 0.75 * 0.25 * f.eps, name)
        except ValueError as e:
            assert "fmt must be" in str(e)
            continue
        taken.append(name)
    assert listed == taken == ["float32", "tf32", "float16", "bfloat16", "float8_e4m3fn",
                               "float8_e5m2"]
    assert widgets.crossing_view(0.25, 5e-3, "bf16")[0].text.startswith("w = fl(0.25)")
