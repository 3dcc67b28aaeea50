"""Tests for precisionlab.plotting and precisionlab.tables: figures draw what they claim,
tables agree with ml_dtypes/torch finfo (independent of the registry's own constants)."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt
import ml_dtypes
import numpy as np
import pytest
import torch
from matplotlib.axes import Axes
from matplotlib.colors import to_rgb

from precisionlab import plotting
from precisionlab.formats import FORMAT_NAMES
from precisionlab.rounding import ulp
from precisionlab.tables import FORMAT_COLUMNS, Table, format_rows, format_table, format_value
from precisionlab.updates import POLICIES, steps_to_cross, train_master_vs_lowprec

FINFO = {
    "float64": np.finfo(np.float64),
    "float32": np.finfo(np.float32),
    "float16": np.finfo(np.float16),
    "bfloat16": ml_dtypes.finfo(ml_dtypes.bfloat16),
    "float8_e4m3fn": ml_dtypes.finfo(ml_dtypes.float8_e4m3fn),
    "float8_e5m2": ml_dtypes.finfo(ml_dtypes.float8_e5m2),
}


@pytest.fixture(autouse=True)
def _close_figures():
    yield
    plt.close("all")


def test_house_style_sets_rcparams_and_colours_cover_formats():
    matplotlib.rcParams["axes.spines.top"] = True
    plotting.use_house_style()
    assert matplotlib.rcParams["axes.spines.top"] is False
    assert set(plotting.FORMAT_COLORS) == set(FORMAT_NAMES)
    rgbs = {to_rgb(c) for c in plotting.FORMAT_COLORS.values()}
    assert len(rgbs) == len(FORMAT_NAMES)  # one distinct colour per format
    assert set(plotting.POLICY_STYLES) == set(POLICIES)


def test_ulp_plot_draws_each_format_from_subnormal_to_top():
    formats = ["float16", "bfloat16", "float8_e4m3fn"]
    ax = plotting.plot_ulp_vs_magnitude(formats)
    assert isinstance(ax, Axes)
    steps = {ln.get_label(): ln for ln in ax.get_lines() if ln.get_label() in formats}
    assert set(steps) == set(formats)
    for name, line in steps.items():
        x, y = line.get_data()
        info = FINFO[name]
        assert x[0] == info.smallest_subnormal and x[-1] == info.max
        # The plateau: ulp equals the smallest subnormal up to twice the smallest normal.
        assert y[0] == info.smallest_subnormal
        assert np.all(np.diff(y) >= 0)
    assert ax.get_xscale() == "log" and ax.get_yscale() == "log"
    assert ax.get_xlabel() and ax.get_ylabel() and ax.get_title()
    assert ax.get_legend() is not None


def test_ulp_plot_uses_given_axes():
    _, ax = plt.subplots()
    assert plotting.plot_ulp_vs_magnitude(["bfloat16"], ax=ax) is ax


@pytest.mark.parametrize("fmt", ["float8_e4m3fn", "float8_e5m2", "float16", "bfloat16"])
def test_format_grid_matches_ml_dtypes_enumeration(fmt):
    dt = {"float16": np.float16, "bfloat16": ml_dtypes.bfloat16,
          "float8_e4m3fn": ml_dtypes.float8_e4m3fn, "float8_e5m2": ml_dtypes.float8_e5m2}[fmt]
    n_bits = np.dtype(dt).itemsize * 8
    patterns = np.arange(2**n_bits, dtype=np.uint64).astype(f"uint{n_bits}")
    with np.errstate(invalid="ignore"):
        values = patterns.view(dt).astype(np.float64)
    lo, hi = (-448.0, 448.0) if fmt == "float8_e4m3fn" else (-1.5, 0.75)
    if fmt in ("float16", "bfloat16"):
        lo, hi = 0.3, 0.9
    expected = np.unique(values[np.isfinite(values) & (values >= lo) & (values <= hi)]) + 0.0
    np.testing.assert_array_equal(plotting.format_grid(fmt, lo, hi), expected)


def test_format_grid_refuses_huge_windows():
    with pytest.raises(ValueError, match="narrow the window"):
        plotting.format_grid("bfloat16", -1.0, 1.0)
    with pytest.raises(ValueError, match="lo < hi"):
        plotting.format_grid("bfloat16", 1.0, 1.0)


def test_number_line_marks_value_neighbours_and_midpoints():
    ax = plotting.plot_number_line("bfloat16", 0.0985, 0.1015, x=0.1)
    labels = [c.get_label() for c in ax.collections] + [ln.get_label() for ln in ax.get_lines()]
    assert "bfloat16 values" in labels and "rounding midpoints" in labels
    assert "neighbours of x" in labels
    assert any(lbl.startswith("fl(x) = 0.10009766") for lbl in labels)
    values = next(c for c in ax.collections if c.get_label() == "bfloat16 values")
    xs = sorted(seg[0][0] for seg in values.get_segments())
    np.testing.assert_allclose(np.diff(xs), ulp(0.1, "bfloat16"))  # one binade, equal gaps
    assert ax.get_title()


def test_crossing_heatmap_shows_exact_counts():
    mags, lrs = [1.0, 0.01], [1e-6, 1e-4]
    ax = plotting.plot_crossing_heatmap(mags, lrs)
    assert len(ax.images) == 1
    img = ax.images[0].get_array()
    assert img.shape == (2, 2)
    w = np.array([1.0, 0.010009765625])  # fl_bf16(0.01)
    np.testing.assert_array_equal(img, steps_to_cross(w[:, None], np.array(lrs)[None, :]))
    texts = {t.get_text() for t in ax.texts}
    assert f"{int(img[0, 0]):,}" in texts


def test_crossing_trajectory_plot():
    ax = plotting.plot_crossing_trajectory(1.0, 1e-5, 900)
    master, copy = ax.get_lines()[:2]
    assert len(master.get_xdata()) == 901
    assert len(set(copy.get_ydata())) == 2  # the copy jumps once within 900 steps


def test_training_plots_draw_one_line_per_policy():
    runs = train_master_vs_lowprec(steps=40, policies=("fp32", "bf16"))
    ax = plotting.plot_training_curves(runs)
    assert [ln.get_label() for ln in ax.get_lines()] == ["fp32 weights", "bf16-stored weights"]
    assert ax.get_yscale() == "log"
    np.testing.assert_array_equal(ax.get_lines()[0].get_ydata(), runs["fp32"].loss)
    ax2 = plotting.plot_changed_fraction(runs, window=1)
    np.testing.assert_array_equal(ax2.get_lines()[1].get_ydata(), runs["bf16"].changed)


def test_format_rows_agree_with_library_finfo():
    rows = {r["format"]: r for r in format_rows()}
    assert list(rows) == list(FORMAT_NAMES)
    for name, info in FINFO.items():
        r = rows[name]
        assert r["bits"] == info.bits
        assert r["min_subnormal"] == info.smallest_subnormal
        assert r["min_normal"] == info.smallest_normal
        assert r["max_finite"] == info.max
        assert r["eps"] == info.eps
        assert r["precision"] == info.nmant + 1
        assert r["emin"] == info.minexp
    # torch agrees on the IEEE-style ones it has.
    t = torch.finfo(torch.bfloat16)
    assert rows["bfloat16"]["max_finite"] == t.max and rows["bfloat16"]["eps"] == t.eps
    assert rows["float8_e4m3fn"]["specials"].startswith("NaN only")
    # tf32: float32's exponent range with float16's 10 fraction bits.
    assert rows["tf32"]["min_normal"] == rows["float32"]["min_normal"]
    assert rows["tf32"]["eps"] == rows["float16"]["eps"]


def test_format_table_renders():
    table = format_table(["float16", "bfloat16"])
    assert isinstance(table, Table)
    assert len(table.rows) == 2 and len(table.headers) == len(FORMAT_COLUMNS)
    text = table.to_text()
    assert "65504" in text and "2^-24" in text  # float16's max and smallest subnormal
    html = table._repr_html_()
    assert html.startswith("<table") and html.count("<tr>") == 3
    assert table.to_markdown().count("\n") == 3
    assert repr(table) == text


@pytest.mark.parametrize("x, text", [(2.0**-24, "2^-24"), (65504.0, "65504"), (0.5, "2^-1"),
                                     (1024.0, "1024"), (2.0**40, "2^40"), (0.1, "0.1")])
def test_format_value(x, text):
    assert format_value(x) == text


def test_phantom_strip_places_every_token_and_jitters_from_seed():
    """Each row holds its tokens at r = exp(log-ratio), shifted vertically by default_rng(seed)."""
    gen = np.random.default_rng(7)
    alpha, beta = gen.normal(0, 0.15, 200), gen.normal(0, 0.05, 200)
    adv = np.where(gen.random(200) < 0.5, -1.0, 1.0)

    def points(seed):
        _, ax = plt.subplots()
        plotting.plot_phantom_strip(alpha, beta, adv, 0.2, 0.2, seed=seed, ax=ax)
        pts = np.concatenate([c.get_offsets() for c in ax.collections if len(c.get_offsets())])
        return pts[np.lexsort(pts.T[::-1])]

    rng = np.random.default_rng(3)  # the oracle: rows in order, one uniform draw per row
    rows = [(adv > 0, alpha + beta), (adv > 0, alpha), (adv < 0, alpha + beta), (adv < 0, alpha)]
    want = np.concatenate([np.column_stack([np.exp(logr[sel]),
                                            y + rng.uniform(-0.3, 0.3, int(sel.sum()))])
                           for y, (sel, logr) in enumerate(rows)])
    want = want[np.lexsort(want.T[::-1])]
    got = points(3)
    np.testing.assert_allclose(got, want, rtol=1e-6)  # matplotlib keeps offsets in float64
    np.testing.assert_array_equal(points(3), got)
    assert not np.array_equal(points(4)[:, 1], got[:, 1])
