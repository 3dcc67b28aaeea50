"""Tests for precisionlab.widgets: views build without a display, defaults are drawn, bad
input is rejected with a message naming it, and callbacks survive bad input."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

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
        ({"value": float("inf")}, "value=inf is not in the grid; valid choices: 0.1, 0.3, 1000"),
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


def test_interactive_precomputes_one_frame_per_grid_point():
    explorer = widgets.interactive(_toy_view, {"k": [1, 2, 3], "name": ["a", "b"]}, name="b")
    assert explorer.params == {"k": 1, "name": "b"}  # k: the view's own default
    data = explorer.frames()
    assert len(data["frames"]) == 6 == explorer.size
    assert len(set(map(tuple, data["frames"]))) == 6  # every grid point shows something else
    assert len(data["panels"]) == 6
    png = [p for p in data["images"] if p is not None]
    assert len(png) == 5 and len(set(png)) == 5  # the k=3, name=b frame is an error
    assert all(p[:8] == b"\x89PNG\r\n\x1a\n" for p in png)
    # row-major order: (k=3, name=b) is the last frame; its panel carries the view's message
    assert "outside this view" in data["panels"][data["frames"][-1][1]]
    assert data["images"][data["frames"][-1][0]] is None


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
    assert "http://" not in page and "https://" not in page and "//cdn" not in page
    # 8 frames; (k=1, flag) and (k=2, no flag) draw the same picture, stored once, and the
    # shown picture is not stored twice (the script reads it from the <img>)
    assert len(explorer.frames()["images"]) == 6
    assert page.count("data:image/png;base64,") == 6
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
    assert len(data["alts"]) == len(data["images"])
    assert {a for a, png in zip(data["alts"], data["images"], strict=True) if png} == {"a", "b"}
    assert data["alts"][data["images"].index(None)] == ""  # the error frame shows no figure
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
    js, css = ((static / name).read_text(encoding="utf-8").strip()
               for name in ("switcher.js", "switcher.css"))
    assert "aria-valuetext" in js and ":focus-visible" in css
    page = widgets.interactive(_toy_view, {"k": [1, 2]}).static_html()
    assert f"<script>{js}</script>" in page and f"<style>{css}</style>" in page


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
        ({"k": list(range(7)), "name": list("abcdefg")}, {},
         "grid has 49 frames \\(k 7 x name 7\\); at most 48"),
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
    assert len(data["images"]) > 1 or len(data["panels"]) > 1
