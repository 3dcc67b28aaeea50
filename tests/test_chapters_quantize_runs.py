"""Tests for chapter 9's measurements (precisionlab.chapters.quantize_runs), its figures and its explorer.

Oracles: math.fsum for the SQNR sums, torch's own float8 casts of the scaled tensor for the
quantized values and their shares, brute-force block membership, the float64 product for the
regression targets, the chapter 4 probe (`underflow.probe_network`) for the signals, and an
exact least-squares solve in fractions for the floors.
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest
import torch
from oracles import fsum_sqnr

from precisionlab import emulate, plotting, underflow, widgets
from precisionlab.chapters import quantize_runs
from precisionlab.chapters.quantize_runs import (
    OUTLIER_CHANNELS,
    SharedScale,
    block_sqnr,
    least_squares_floor,
    outlier_activations,
    outlier_regression,
    outlier_report,
    quantize_layers,
    scaling_trace,
    share_beside_outliers,
    spike_stream,
    train_quantized,
)
from precisionlab.quantize import RECIPES, DelayedScaling, Recipe, quantize_per_tensor

E4M3_TIE = 464.0  # 448 + ulp(448)/2: |x m| above it rounds past E4M3's largest value
FP4_TENSOR = Recipe("fp4_tensor", "float4_e2m1fn", "tensor")


def _e4m3_oracle(x: torch.Tensor, amax: float):
    """torch's float8_e4m3fn cast of fl32(x m), m = fl32(448 / amax), clipped first: (q, m)."""
    m = torch.tensor(448.0, dtype=torch.float32) / torch.tensor(amax, dtype=torch.float32)
    y = x.to(torch.float32) * m
    q = y.clamp(-448, 448).to(torch.float8_e4m3fn).to(torch.float32)
    return q, y, m


# ----------------------------------------------------------------------------- SQNR


def test_block_sqnr_is_the_sqnr_of_each_group_of_ordinary_channels():
    x = outlier_activations(8, 64, 30.0, (5, 40), seed=2)
    xhat = RECIPES["mxfp4"](x).dequantize()
    got = block_sqnr(x, xhat, 16, (5, 40))
    keep = [c for c in range(64) if c not in (5, 40)]
    for k in range(4):
        cols = [c for c in keep if c // 16 == k]
        assert got[k] == pytest.approx(fsum_sqnr(x[:, cols], xhat[:, cols]), rel=1e-12)
    with pytest.raises(ValueError, match="divide"):
        block_sqnr(x, xhat, 24)


# ----------------------------------------------------------------------------- one shared scale


def test_shared_scale_is_per_tensor_scaling_with_the_given_amax():
    gen = torch.Generator().manual_seed(0)
    x = emulate.randn(16, 64, generator=gen)
    own = float(x.abs().max())
    a, b = SharedScale("float8_e4m3fn", own)(x), quantize_per_tensor(x)
    assert torch.equal(a.values, b.values) and a.shares == b.shares
    for amax in (own * 40, own / 3):  # far above (underflow), below (saturation)
        q = SharedScale("e4m3", amax)(x)
        ref, y, _ = _e4m3_oracle(x, amax)
        assert torch.equal(q.values, ref)
        assert q.saturated == float((y.abs() > E4M3_TIE).double().mean())
        assert q.underflowed == float(((x != 0) & (ref == 0)).double().mean())
    tensors = [x, 7 * x[:3], x / 100]
    assert SharedScale.over(tensors).amax == 7 * own
    with pytest.raises(ValueError, match="elem"):
        SharedScale("int8", 1.0)
    with pytest.raises(ValueError, match="amax"):
        SharedScale("float8_e4m3fn", 0.0)


def test_network_signals_are_chapter_4s_backward_signals():
    sig = quantize_runs.network_signals(0.82, 12, 16, 4, seed=1)
    probe = underflow.probe_network(0.82, "float32", 12, 16, 4, seed=1)
    assert sig.shape == (12, 4, 16)
    mag = sig.abs().reshape(12, -1).to(torch.float64).numpy()
    assert np.array_equal(mag.max(axis=1), probe.signal.max_abs)
    assert np.array_equal(np.median(mag, axis=1), probe.signal.median_abs)


def test_quantize_layers_against_torch_casts_and_fsum():
    sig = quantize_runs.network_signals(0.82, 24, 16, 4, seed=0)
    shared = SharedScale.over(sig)
    got = quantize_layers(sig, shared)
    for k, s in enumerate(sig):
        ref, y, m = _e4m3_oracle(s, shared.amax)
        assert got.underflowed[k] == float(((s != 0) & (ref == 0)).double().mean())
        assert got.saturated[k] == float((y.abs() > E4M3_TIE).double().mean())
        small = (ref != 0) & (ref.abs() < 2.0**-6)
        assert got.subnormal[k] == float(small.double().mean())
        assert got.sqnr[k] == pytest.approx(fsum_sqnr(s, ref.double() * (1 / m).double()),
                                            rel=1e-9, abs=1e-12)
    # one scale for the deep stack: the first layer with half its entries zero
    half = [k for k in range(24) if got.underflowed[k] >= 0.5]
    assert got.first_depth() == (half[0] if half else None)
    assert got.first_depth(2.0) is None


# ----------------------------------------------------------------------------- outliers


def test_outlier_activations_scale_only_the_outlier_channels():
    z = emulate.randn(8, 32, generator=torch.Generator().manual_seed(4), dtype=torch.float64)
    x = outlier_activations(8, 32, 300.0, (3, 20), seed=4)
    assert x.dtype == torch.float32 and x.shape == (8, 32)
    rest = [c for c in range(32) if c not in (3, 20)]
    assert torch.equal(x[:, rest], z[:, rest].float())
    assert torch.equal(x[:, [3, 20]], (z[:, [3, 20]] * 300.0).float())
    for bad, match in (({"outlier": 0}, "outlier"), ({"where": (40,)}, "where"),
                       ({"where": (1, 1)}, "where"), ({"tokens": 0}, "tokens")):
        with pytest.raises(ValueError, match=match):
            outlier_activations(**{"tokens": 8, "channels": 32, **bad})


@pytest.mark.parametrize("block", [None, 8, 16, 32, 64, 128, 256])
def test_share_beside_outliers_by_brute_force(block):
    size = block or 256
    hit = {c // size for c in OUTLIER_CHANNELS}
    ordinary = [c for c in range(256) if c not in OUTLIER_CHANNELS]
    want = sum(c // size in hit for c in ordinary) / len(ordinary)
    assert share_beside_outliers(256, OUTLIER_CHANNELS, block) == want


def test_share_beside_outliers_rejects_bad_blocks():
    assert share_beside_outliers(256, OUTLIER_CHANNELS, 32) == 124 / 252
    with pytest.raises(ValueError, match="divides channels=256"):
        share_beside_outliers(256, OUTLIER_CHANNELS, 24)
    with pytest.raises(ValueError, match="where"):
        share_beside_outliers(256, (), 32)


def test_outlier_report_counts_what_the_quantizer_lost():
    x = outlier_activations(16, 64, 1000.0, (7,), seed=0)
    r = outlier_report(x, (7,), FP4_TENSOR)
    # per tensor: the scale maps ~3000 to 6, every ordinary |x| < 62.5 maps below 0.125
    assert float(x[:, [c for c in range(64) if c != 7]].abs().max()) * 6 / \
        float(x.abs().max()) < 0.25
    assert r.ordinary_lost == 1.0 and r.sqnr_ordinary == 0.0
    q = FP4_TENSOR(x).dequantize()
    assert r.sqnr == pytest.approx(fsum_sqnr(x, q), rel=1e-12)
    r8 = outlier_report(x, (7,), RECIPES["mxfp8"])
    keep = [c for c in range(64) if c != 7]
    q8 = RECIPES["mxfp8"](x).dequantize()
    lost = ((x[:, keep] != 0) & (q8[:, keep] == 0)).double().mean()
    assert r8.ordinary_lost == float(lost)
    assert r8.sqnr_ordinary == pytest.approx(fsum_sqnr(x[:, keep], q8[:, keep]), rel=1e-12)


# ----------------------------------------------------------------------------- training


def test_outlier_regression_targets_ignore_the_outlier_channels():
    x1, y1 = outlier_regression(32, 16, 3, 1.0, (2, 9), seed=5)
    x2, y2 = outlier_regression(32, 16, 3, 500.0, (2, 9), seed=5)
    assert torch.equal(y1, y2) and not torch.equal(x1, x2)
    gen = torch.Generator().manual_seed(10_005)
    w = emulate.randn(3, 16, generator=gen, dtype=torch.float64) / 4.0
    w[:, [2, 9]] = 0
    exact = x1.double() @ w.T  # float64 products of float32 inputs: within fl32 of y
    assert torch.allclose(y1.double(), exact, rtol=1e-6, atol=1e-6)


def test_train_quantized_per_tensor_fp4_never_moves_the_dead_weights():
    x, y = outlier_regression(64, 32, 4, 100.0, (3,), seed=0)
    ordinary = [c for c in range(32) if c != 3]
    run = train_quantized(x, y, FP4_TENSOR, RECIPES["fp8_tensor_e5m2"], steps=15)
    assert run.losses.shape == (15,)
    assert run.losses[0] == pytest.approx(1.0, rel=1e-6)  # W = 0: the loss of W = 0
    assert float(run.weight[:, ordinary].abs().max()) == 0.0  # zero gradient, every step
    assert float(run.weight[:, 3].abs().max()) > 0
    plain = train_quantized(x, y, None, steps=15)
    assert plain.losses[-1] < 0.5 < run.losses[-1]
    with pytest.raises(ValueError, match="steps"):
        train_quantized(x, y, None, steps=0)
    with pytest.raises(ValueError, match="lr"):
        train_quantized(x, y, None, lr=-1.0)


def _train_per_step(x, y, x_quantizer, grad_quantizer, steps, w_quantizer=None, lr=1e-2):
    """Oracle: train_quantized's loop with the layer quantizing the constant x on every step."""
    lin = emulate.QuantizedLinear(torch.zeros(y.shape[-1], x.shape[-1]), None,
                                  x_quantizer=x_quantizer, w_quantizer=w_quantizer,
                                  grad_quantizer=grad_quantizer)
    opt = emulate.Adam(lin.parameters(), lr=lr)
    y0 = float(emulate.fixed_sum(y.double().ravel() ** 2, -1)) / y.numel()  # as the runs do
    losses = []
    for _ in range(steps):
        opt.zero_grad()
        loss = emulate.mse_loss(lin(x), y, "float32")
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()) / y0)
    return np.array(losses), lin.weight.detach()


@pytest.mark.parametrize("name, quantize_w", [("fp8_tensor", False), ("mxfp4", False),
                                              ("nvfp4", True)])
def test_train_quantized_quantizes_x_once_with_the_bits_of_quantizing_every_step(name,
                                                                                 quantize_w):
    x, y = outlier_regression(64, 32, 4, 100.0, (3,), seed=1)
    calls = []

    def counting(t):  # the recipe, counting its calls on x
        calls.append(t)
        return RECIPES[name](t)

    wq = RECIPES[name] if quantize_w else None
    grad_q = RECIPES["fp8_tensor_e5m2"]
    run = train_quantized(x, y, counting, grad_q, steps=6, w_quantizer=wq)
    losses, weight = _train_per_step(x, y, RECIPES[name], grad_q, 6, wq)
    assert len(calls) == 1  # the constant input: quantized once
    assert np.array_equal(run.losses, losses) and torch.equal(run.weight, weight)
    assert len(set(run.losses.tolist())) == 6  # the oracle compares a moving run


def test_train_quantized_takes_its_learning_rate():
    x, y = outlier_regression(32, 32, 2, 100.0, (3,), seed=3)
    q = RECIPES["mxfp8"]
    runs = {lr: train_quantized(x, y, q, steps=4, lr=lr) for lr in (1e-2, 3e-2)}
    for lr, run in runs.items():  # the oracle's Adam with the same lr, bit for bit
        losses, weight = _train_per_step(x, y, q, None, 4, lr=lr)
        assert np.array_equal(run.losses, losses) and torch.equal(run.weight, weight)
    assert not np.array_equal(runs[1e-2].losses, runs[3e-2].losses)


def test_train_quantized_calls_a_stateful_x_quantizer_once():
    x, y = outlier_regression(32, 16, 2, 100.0, (3,), seed=2)
    ds = DelayedScaling(amax_history_len=4)
    train_quantized(x, y, ds, steps=3)
    assert ds.history.tolist() == [float(x.abs().max()), 0.0, 0.0, 0.0]


# ----------------------------------------------------------------------------- delayed scaling


def _exact_floor(x: np.ndarray, y: np.ndarray) -> Fraction:
    """min_W ||x W - y||^2 / ||y||^2 in fractions: normal equations on x's nonzero columns."""
    cols = [j for j in range(x.shape[1]) if np.any(x[:, j])]
    a = [[Fraction(float(x[i, j])) for j in cols] for i in range(x.shape[0])]
    g = [[sum(r[p] * r[q] for r in a) for q in range(len(cols))] for p in range(len(cols))]
    total, norm = Fraction(0), Fraction(0)
    for o in range(y.shape[1]):
        b = [Fraction(float(v)) for v in y[:, o]]
        rhs = [sum(a[i][p] * b[i] for i in range(len(b))) for p in range(len(cols))]
        m = [[*row[:], r] for row, r in zip(g, rhs, strict=True)]  # Gauss-Jordan, exact
        w, row = [Fraction(0)] * len(cols), 0  # free variables (dependent columns) stay 0
        pivots = []
        for p in range(len(cols)):
            piv = next((r for r in range(row, len(cols)) if m[r][p] != 0), None)
            if piv is None:
                continue
            m[row], m[piv] = m[piv], m[row]
            m[row] = [v / m[row][p] for v in m[row]]
            for r in range(len(cols)):
                if r != row and m[r][p] != 0:
                    m[r] = [u - m[r][p] * v for u, v in zip(m[r], m[row], strict=True)]
            pivots.append((row, p))
            row += 1
        for r, p in pivots:
            w[p] = m[r][-1]
        total += sum((sum(a[i][p] * w[p] for p in range(len(cols))) - b[i]) ** 2
                     for i in range(len(b)))
        norm += sum(v * v for v in b)
    return total / norm


def test_least_squares_floor_against_an_exact_solve():
    x, y = outlier_regression(40, 32, 2, 100.0, (2,), seed=3)
    for q in (RECIPES["mxfp4"], FP4_TENSOR, RECIPES["fp8_tensor"]):
        xh = q(x).dequantize()
        want = _exact_floor(xh.numpy(), y.double().numpy())
        assert math.isclose(least_squares_floor(xh, y), float(want), rel_tol=1e-9,
                            abs_tol=1e-15)
    # A run cannot end below its input's floor (the stalled fp4 case has all-zero columns).
    run = train_quantized(x, y, FP4_TENSOR, RECIPES["fp8_tensor_e5m2"], steps=40)
    assert run.losses.min() >= least_squares_floor(FP4_TENSOR(x).dequantize(), y) * (1 - 1e-6)
    with pytest.raises(ValueError, match="same"):
        least_squares_floor(x, y[:5])


def test_spike_stream_is_a_geometric_drift_with_one_spike():
    s = spike_stream(10, 7, 30.0, (4, 4), 0.5, seed=2)
    z = emulate.randn(10, 4, 4, generator=torch.Generator().manual_seed(2),
                      dtype=torch.float64)
    sigma = np.geomspace(1.0, 0.5, 10)
    sigma[7] *= 30.0
    assert torch.equal(s, (z * torch.from_numpy(sigma).reshape(-1, 1, 1)).float())
    with pytest.raises(ValueError, match="spike_at"):
        spike_stream(10, 10)
    with pytest.raises(ValueError, match="spike_at"):  # a bool is not a step
        spike_stream(10, True)
    with pytest.raises(ValueError, match="steps"):
        spike_stream(1, 0)


def test_scaling_trace_of_delayed_max_against_its_rule():
    s = spike_stream(30, 25, 20.0, (8, 8), seed=1)
    t = scaling_trace(s, DelayedScaling("float8_e4m3fn", 1024, "max"))
    amax = s.abs().amax(dim=(1, 2)).double().numpy()
    assert np.array_equal(t.amax, amax)
    for k in range(1, 30):
        held = float(amax[:k].max())  # the history's largest amax
        ref, y, m = _e4m3_oracle(s[k], held)
        assert t.admitted[k] == pytest.approx(448 / float(m), rel=1e-7)
        assert t.saturated[k] == float((y.abs() > E4M3_TIE).double().mean())
        assert t.sqnr[k] == pytest.approx(fsum_sqnr(s[k], ref.double() * (1 / m).double()),
                                          rel=1e-9)
    assert t.saturated[25] > 0.5  # the spike, clipped
    cur = scaling_trace(s, quantize_per_tensor)
    assert cur.saturated.max() == 0 and np.allclose(cur.admitted, amax, rtol=1e-6)
    rows = quantize_runs.trace_table_rows({"a": t, "b": cur}, [0, 25])
    assert rows[1] == (25, amax[25], t.admitted[25], t.saturated[25], cur.admitted[25], 0.0)


# ----------------------------------------------------------------------------- figures, explorer


def test_plotting_functions_draw_one_line_per_result():
    sig = quantize_runs.network_signals(0.82, 8, 32, 4, seed=0)
    layers = {"a": quantize_layers(sig, RECIPES["fp8_tensor"]),
              "b": quantize_layers(sig, RECIPES["mxfp4"])}
    for which in ("sqnr", "underflowed"):
        ax = plotting.plot_layer_quantization(layers, which)
        assert len(ax.get_lines()) == 2
    with pytest.raises(ValueError, match="which"):
        plotting.plot_layer_quantization(layers, "zeros")
    ax = plotting.plot_outlier_sweep([1, 10], {"a": [30, 20]})
    assert ax.get_xscale() == "log"
    s = spike_stream(6, 3, seed=0)
    tr = {"cur": scaling_trace(s, quantize_per_tensor)}
    assert len(plotting.plot_scaling_trace(tr, "admitted").get_lines()) == 2
    with pytest.raises(ValueError, match="which"):
        plotting.plot_scaling_trace(tr, "scale")
    ax = plotting.plot_block_sqnr({"a": [10.0, math.inf]}, 16, (3,))
    assert ax.get_lines()[0].get_ydata().max() == plotting.quantize.SQNR_CEILING_DB


def test_block_view_panel_states_the_reports_numbers():
    panel, fig = widgets.block_view(100, 32, "float8_e8m0fnu")
    text = panel.text
    x = outlier_activations(64, 256, 100.0, OUTLIER_CHANNELS, seed=0)
    assert f"with an outlier: {share_beside_outliers(256, OUTLIER_CHANNELS, 32):.1%}" in text
    for elem, short in (("float4_e2m1fn", "fp4_e2m1"), ("float8_e4m3fn", "fp8_e4m3")):
        r = outlier_report(x, OUTLIER_CHANNELS, Recipe("r", elem, "block", 32, "float8_e8m0fnu"))
        line = next(ln for ln in text.splitlines() if ln.startswith(short))
        assert f"{r.sqnr_ordinary:.1f} dB" in line and f"{r.underflowed:.1%}" in line
    assert fig.axes[0].get_title()
    for kwargs, match in (({"outlier": 0}, "outlier"), ({"block": 24}, "block"),
                          ({"scale_format": "int8"}, "scale_format")):
        with pytest.raises(ValueError, match=match):
            widgets.block_view(**kwargs)


def test_block_explorer_meets_the_page_budget():
    it = widgets.block_explorer()
    assert it.size <= widgets.MAX_FRAMES
    assert max(len(v) for v in widgets.BLOCK_GRID.values()) >= 12  # the main slider
    page = it.static_html()
    assert len(page.encode()) <= widgets.STATIC_BUDGET_BYTES
    data = it.frames()
    assert len(data["figures"]) > 1 and len(data["panels"]) > 1
    assert not it.fallbacks  # every view drawn from its spec
    widest = max(len(line) for text in it.panel_texts().values() for line in text.splitlines())
    assert widest <= widgets.PANEL_COLUMNS


_PORTABLE = """
import hashlib, numpy as np, torch
from precisionlab.chapters import quantize_runs as qr
from precisionlab.quantize import RECIPES, DelayedScaling, Recipe
sig = qr.network_signals(0.82, 32, 32, 4, seed=0)
parts = [qr.quantize_layers(sig, q) for q in (qr.SharedScale.over(sig), RECIPES["mxfp8"],
                                              RECIPES["nvfp4"])]
x, y = qr.outlier_regression(64, 32, 4, 100.0, (3,), seed=0)
run = qr.train_quantized(x, y, RECIPES["nvfp4"], RECIPES["fp8_tensor_e5m2"], steps=8)
t = qr.scaling_trace(qr.spike_stream(12, 9, seed=0), DelayedScaling())
h = hashlib.sha256()
for p in parts:
    for a in (p.saturated, p.underflowed, p.subnormal, p.sqnr):
        h.update(np.ascontiguousarray(a).tobytes())
h.update(run.losses.tobytes()); h.update(run.weight.numpy().tobytes())
h.update(np.ascontiguousarray(t.sqnr).tobytes())
print(h.hexdigest())
"""


def test_chapter_measurements_have_the_same_bits_under_every_kernel_dispatch(same_bits):
    same_bits(_PORTABLE)


def test_stored_forward_input_runs_are_this_code_s_runs():
    from pathlib import Path

    stored = Path(__file__).resolve().parents[1] / "data" / "ch9_forward_input.json"
    meta, runs = quantize_runs.load_quantized_runs(stored)
    assert (meta["steps"], meta["seed"]) == (120, 0)
    again = quantize_runs.forward_input_runs(meta["steps"], seed=meta["seed"])
    assert list(runs) == list(again) == list(quantize_runs.FORWARD_INPUT_RUNS)
    for name, run in again.items():
        assert np.array_equal(run.losses, runs[name].losses), name
        assert torch.equal(run.weight, runs[name].weight), name


def test_forward_input_quantizer_names():
    assert quantize_runs.forward_input_quantizer("float32") is None
    assert quantize_runs.forward_input_quantizer("fp4_tensor").grain == "tensor"
    with pytest.raises(ValueError, match="name"):
        quantize_runs.forward_input_quantizer("fp3")


def test_saved_runs_load_back_exactly(tmp_path):
    run = quantize_runs.QuantizedRun(np.array([1.0, 2.0**-60, np.nan]),
                                     torch.tensor([[1.5, -2.0**-130]], dtype=torch.float32))
    quantize_runs.save_quantized_runs(tmp_path / "r.json", {"a": run}, {"steps": 3})
    meta, back = quantize_runs.load_quantized_runs(tmp_path / "r.json")
    assert meta["steps"] == 3 and list(back) == ["a"]
    assert np.array_equal(back["a"].losses, run.losses, equal_nan=True)
    assert torch.equal(back["a"].weight, run.weight)
