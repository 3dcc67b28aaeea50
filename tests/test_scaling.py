"""Tests for precisionlab.scaling against torch.amp.GradScaler and its kernels.

Oracles: torch.amp.GradScaler run side by side (same gradients, same model and data), the
kernels it calls (torch._amp_update_scale_, torch._amp_foreach_non_finite_check_and_unscale_)
driven directly, and torch's own float16 casts for the survival and overflow thresholds.
"""

from __future__ import annotations

import copy
import inspect
import math
import re

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from precisionlab.scaling import (
    GRADSCALER_DEFAULTS,
    DynamicLossScaler,
    StaticLossScaler,
    largest_safe_gradient,
    make_regression_task,
    simulate_scale_history,
    smallest_surviving_gradient,
    trace_dynamic_scaling,
    train_scaled,
    update_scale,
)

FP32_MAX = float(torch.finfo(torch.float32).max)


def _fp16(x: float) -> float:
    """float64 -> float16 in one rounding (NumPy converts directly; torch 2.13 goes through float32)."""
    with np.errstate(over="ignore"):
        return float(np.float16(x))


# --------------------------------------------------------------------------- defaults


def test_defaults_are_gradscalers():
    sig = inspect.signature(torch.amp.GradScaler.__init__).parameters
    ours = inspect.signature(DynamicLossScaler.__init__).parameters
    for name, value in GRADSCALER_DEFAULTS.items():
        assert sig[name].default == value == ours[name].default
    s = DynamicLossScaler()
    t = torch.amp.GradScaler("cpu")
    assert s.get_scale() == t.get_scale() == 65536.0
    # state_dict before any step: GradScaler reports its init values; ours the same keys.
    assert set(s.state_dict()) == set(t.state_dict())


# --------------------------------------------------------------------------- the update rule


def _kernel_update(scale, tracker, found, growth, backoff, interval):
    s = torch.full((), scale, dtype=torch.float32)
    t = torch.full((), tracker, dtype=torch.int32)
    f = torch.full((), 1.0 if found else 0.0)
    torch._amp_update_scale_(s, t, f, growth, backoff, interval)
    return s.item(), int(t.item())


scales = st.one_of(
    st.floats(min_value=2.0**-149, max_value=FP32_MAX, width=32),
    st.sampled_from([2.0**-149, 2.0**-126, 2.0**127, FP32_MAX, 1.0, 65536.0, 3.0]),
)


@settings(max_examples=400, deadline=None)
@given(scale=scales, tracker=st.integers(0, 9), found=st.booleans(),
       growth=st.sampled_from([2.0, 1.5, 1.0001, 3.0, 1e30]),
       backoff=st.sampled_from([0.5, 0.3, 0.9999, 1e-30]),
       interval=st.integers(1, 10))
def test_update_scale_matches_amp_update_scale_kernel(scale, tracker, found, growth, backoff,
                                                      interval):
    tracker = min(tracker, interval - 1)  # the kernel never holds tracker >= interval
    assert update_scale(scale, tracker, found, growth, backoff, interval) == \
        _kernel_update(scale, tracker, found, growth, backoff, interval)


def test_simulate_scale_history_matches_kernel_loop():
    rng = np.random.default_rng(3)
    flags = rng.random(3000) < 0.2
    hist = simulate_scale_history(flags, growth_interval=4)
    s, t = torch.full((), 65536.0), torch.zeros((), dtype=torch.int32)
    expected = []
    for f in flags:
        expected.append(s.item())
        torch._amp_update_scale_(s, t, torch.full((), float(f)), 2.0, 0.5, 4)
    assert hist.scale.tolist() == expected
    assert hist.skipped.tolist() == flags.tolist()


# --------------------------------------------------------------------------- unscaling


@settings(max_examples=150, deadline=None)
@given(values=st.lists(st.one_of(st.floats(width=32, allow_nan=True, allow_infinity=True),
                                 st.floats(-2.0**-126, 2.0**-126, width=32)), min_size=1, max_size=20),
       scale=st.one_of(st.floats(min_value=2.0**-20, max_value=2.0**100, width=32),
                       st.sampled_from([1.0, 3.0, 65536.0, 0.1])),
       dtype=st.sampled_from([torch.float32, torch.bfloat16, torch.float64]))
def test_unscale_matches_foreach_unscale_kernel(values, scale, dtype):
    grad = torch.tensor(values, dtype=torch.float64).to(dtype)
    p = torch.nn.Parameter(torch.zeros(len(values), dtype=dtype))
    p.grad = grad.clone()
    opt = torch.optim.SGD([p], lr=0.0)
    s = DynamicLossScaler(init_scale=scale)
    s.unscale_(opt)
    ref = [grad.clone()]
    found = torch.zeros(())
    inv = torch.full((), scale, dtype=torch.float32).double().reciprocal().float()
    torch._amp_foreach_non_finite_check_and_unscale_(ref, found, inv)
    assert torch.equal(p.grad.nan_to_num(nan=7.0), ref[0].nan_to_num(nan=7.0))
    # Bit for bit, NaN encodings included (issue 9: bfloat16 NaNs become 0x7fc0).
    ints = {torch.float32: torch.int32, torch.bfloat16: torch.int16, torch.float64: torch.int64}
    assert torch.equal(p.grad.view(ints[dtype]), ref[0].view(ints[dtype]))
    s.step(opt)
    s.update()
    assert s.history.skipped.tolist() == [bool(found.item())]


def test_float16_gradients_are_refused_like_gradscaler():
    p = torch.nn.Parameter(torch.ones(3, dtype=torch.float16))
    p.grad = torch.ones(3, dtype=torch.float16)
    opt = torch.optim.SGD([p], lr=0.1)
    with pytest.raises(ValueError, match="float16 gradients"):
        DynamicLossScaler().unscale_(opt)
    t = torch.amp.GradScaler("cpu")
    t.scale(torch.ones(()))
    with pytest.raises(ValueError, match="FP16"):
        t.unscale_(opt)


# --------------------------------------------------------------------------- side by side


def _side_by_side(seed: int, interval: int, p_bad: float, steps: int, backoff: float = 0.5,
                  growth: float = 2.0):
    """Both scalers see the same raw gradients, with inf/NaN injected at random steps."""
    rng = np.random.default_rng(seed)
    raw = rng.standard_normal((steps, 8)).astype(np.float32)
    bad = np.flatnonzero(rng.random(steps) < p_bad)
    raw[bad, rng.integers(0, 8, bad.size)] = rng.choice([np.inf, -np.inf, np.nan], bad.size)
    raw_t = torch.from_numpy(raw)
    out = {}
    for name, scaler in (
        ("ours", DynamicLossScaler(growth_interval=interval, backoff_factor=backoff,
                                   growth_factor=growth)),
        ("torch", torch.amp.GradScaler("cpu", growth_interval=interval, backoff_factor=backoff,
                                       growth_factor=growth)),
    ):
        p = torch.nn.Parameter(torch.ones(8))
        opt = torch.optim.SGD([p], lr=1e-3)
        scale_used = np.empty(steps)
        nonfinite = np.empty(steps, dtype=bool)
        tracker = np.empty(steps, dtype=np.int64)
        for i in range(steps):
            scale_used[i] = scaler.get_scale()
            p.grad = scaler.scale(raw_t[i])  # what backward of scale(loss) produces
            # A step must be skipped exactly when a scaled gradient is inf/NaN.
            nonfinite[i] = not bool(torch.isfinite(p.grad).all())
            scaler.step(opt)
            scaler.update()
            tracker[i] = scaler.state_dict()["_growth_tracker"]
        out[name] = (scale_used, nonfinite, tracker, p.detach().clone(), scaler)
    return out, bad


@pytest.mark.parametrize(
    "seed, interval, p_bad, backoff, growth",
    [
        (0, 2000, 0.0005, 0.5, 2.0),  # the defaults: growth is rare
        (1, 7, 0.02, 0.5, 2.0),
        (2, 1, 0.3, 0.5, 2.0),  # grows every good step: reaches float32's ceiling
        (3, 3, 0.97, 0.3, 1.5),  # mostly overflows: the scale sinks into float32 subnormals
    ],
)
def test_dynamic_scaler_matches_gradscaler_for_10000_steps(seed, interval, p_bad, backoff,
                                                           growth):
    out, bad = _side_by_side(seed, interval, p_bad, 10_000, backoff, growth)
    (s1, bad1, t1, p1, ours), (s2, bad2, t2, p2, _) = out["ours"], out["torch"]
    assert np.array_equal(s1, s2)  # identical scale histories
    assert np.array_equal(t1, t2)  # identical counts of consecutive good steps
    assert np.array_equal(bad1, bad2)
    # The skipped steps are exactly the inf/NaN ones; identical parameters confirm that
    # GradScaler skipped the same optimizer steps.
    assert np.array_equal(ours.history.skipped, bad1)
    assert set(bad) <= set(ours.history.skipped_steps)
    assert torch.equal(p1.nan_to_num(nan=7.0), p2.nan_to_num(nan=7.0))
    assert np.array_equal(ours.history.scale, s1)


def test_the_side_by_side_cases_cover_the_edges():
    out, _ = _side_by_side(2, 1, 0.3, 2000)
    assert out["ours"][0].max() == 2.0**127  # growth stopped at float32's largest power of 2
    out, _ = _side_by_side(3, 3, 0.97, 2000, 0.3, 1.5)
    sc = out["ours"][0]
    assert ((sc > 0) & (sc < 2.0**-126)).any()  # through float32's subnormals ...
    assert sc.min() == 0.0  # ... down to a scale of exactly zero


@pytest.mark.parametrize("hidden", [0, 16])
def test_identical_unscaled_gradients_on_a_real_model(hidden):
    factory, x, y = make_regression_task(seed=1)
    torch.manual_seed(0)
    model = factory() if hidden == 0 else torch.nn.Sequential(
        torch.nn.Linear(16, hidden), torch.nn.Tanh(), torch.nn.Linear(hidden, 8))
    twin = copy.deepcopy(model)
    kw = {"init_scale": 2.0**36, "growth_interval": 5}  # starts far too high: overflows first
    a = train_scaled(model, x, y, 120, "float16", DynamicLossScaler(**kw), keep_grads=True)
    b = train_scaled(twin, x, y, 120, "float16", torch.amp.GradScaler("cpu", **kw),
                     keep_grads=True)
    assert a.history.skipped.sum() >= 3  # the comparison includes skipped steps
    assert np.array_equal(a.history.scale, b.history.scale)
    assert np.array_equal(a.history.skipped, b.history.skipped)
    for ga, gb in zip(a.grads, b.grads, strict=True):
        for u, v in zip(ga, gb, strict=True):
            assert torch.equal(u.nan_to_num(nan=7.0), v.nan_to_num(nan=7.0))
            assert torch.equal(u.isnan(), v.isnan())
    for u, v in zip(model.parameters(), twin.parameters(), strict=True):
        assert torch.equal(u, v)


# --------------------------------------------------------------------------- static scaling


def test_static_scaler_keeps_its_scale_and_skips_bad_steps():
    p = torch.nn.Parameter(torch.ones(4))
    opt = torch.optim.SGD([p], lr=0.1)
    s = StaticLossScaler(1024.0)
    grads = [torch.ones(4), torch.tensor([1.0, math.inf, 0, 0]), torch.ones(4)]
    for g in grads:
        p.grad = s.scale(g)
        s.step(opt)
        s.update()
    assert s.history.scale.tolist() == [1024.0] * 3
    assert s.history.skipped.tolist() == [False, True, False]
    assert torch.allclose(p.detach(), torch.full((4,), 0.8))  # two good steps of 0.1 each


def test_static_scaling_recovers_a_gradient_below_the_float16_floor():
    factory, x, y = make_regression_task(target_scale=1e-6)
    plain = train_scaled(factory(), x, y, 3, "float16")
    scaled = train_scaled(factory(), x, y, 3, "float16", StaticLossScaler(2.0**16))
    exact = train_scaled(factory(), x, y, 3, "float32")
    assert (plain.zero_fraction == 1.0).all()  # every gradient entry underflowed ...
    assert (plain.loss == plain.loss[0]).all()  # ... so the loss cannot move
    assert (scaled.zero_fraction == 0.0).all()
    assert np.isclose(scaled.loss[-1], exact.loss[-1], rtol=2e-2)


# --------------------------------------------------------------------------- thresholds


@pytest.mark.parametrize("scale", [1.0, 2.0**15, 2.0**16, 1000.0])
def test_smallest_surviving_gradient_against_float16_casts(scale):
    g0 = smallest_surviving_gradient(scale, "float16", "zero")
    assert _fp16(g0 * scale) == 0.0  # exactly q/2 ties to even: lost
    assert _fp16(math.nextafter(g0, 1) * scale) > 0
    g1 = smallest_surviving_gradient(scale, "float16", "subnormal")
    assert _fp16(g1 * scale) == 2.0**-24
    g2 = smallest_surviving_gradient(scale, "float16", "normal")
    assert _fp16(g2 * scale) == 2.0**-14


def test_checkpoint_numbers_for_scale_32768():
    assert smallest_surviving_gradient(32768.0, "float16", "zero") == 2.0**-40
    assert smallest_surviving_gradient(32768.0, "float16", "subnormal") == 2.0**-39
    assert smallest_surviving_gradient(32768.0, "float16", "normal") == 2.0**-29


@pytest.mark.parametrize("scale", [1.0, 2.0**16, 3.0])
def test_largest_safe_gradient_against_float16_casts(scale):
    g = largest_safe_gradient(scale, "float16")
    assert math.isinf(_fp16(g * scale))
    assert _fp16(math.nextafter(g * scale, 0)) == 65504.0


def test_trace_dynamic_scaling_overflows_exactly_when_the_cast_does():
    rng = np.random.default_rng(0)
    g = 10.0 ** rng.uniform(-6, 1, 400)
    hist = trace_dynamic_scaling(g, "float16", growth_interval=3)
    expect = [math.isinf(_fp16(gi * s)) for gi, s in zip(g, hist.scale, strict=True)]
    assert hist.skipped.tolist() == expect
    assert 0 < hist.skipped.sum() < 400
    assert np.array_equal(hist.scale, simulate_scale_history(expect, growth_interval=3).scale)


# --------------------------------------------------------------------------- errors


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"growth_factor": 1.0}, "growth_factor"),
        ({"backoff_factor": 1.0}, "backoff_factor"),
        ({"growth_interval": 0}, "growth_interval"),
        ({"init_scale": math.inf}, "init_scale"),
    ],
)
def test_bad_scaler_settings_are_named(kwargs, match):
    with pytest.raises(ValueError, match=match):
        DynamicLossScaler(**kwargs)


def test_call_order_errors_match_gradscaler():
    p = torch.nn.Parameter(torch.ones(2))
    opt = torch.optim.SGD([p], lr=0.1)
    for scaler in (DynamicLossScaler(), torch.amp.GradScaler("cpu")):
        scaler.scale(torch.ones(()))
        with pytest.raises((RuntimeError, AssertionError), match=r"(?i)no inf checks"):
            scaler.update()
        p.grad = torch.ones(2)
        scaler.unscale_(opt)
        with pytest.raises(RuntimeError, match="already been called"):
            scaler.unscale_(opt)
        scaler.step(opt)
        with pytest.raises(RuntimeError, match="already been called"):
            scaler.step(opt)
        scaler.update()


def test_disabled_scaler_is_a_pass_through():
    s = DynamicLossScaler(enabled=False)
    x = torch.ones(3)
    assert s.scale(x) is x and s.get_scale() == 1.0 and s.state_dict() == {}


def test_other_bad_inputs():
    with pytest.raises(ValueError, match="valid choices"):
        smallest_surviving_gradient(1.0, "float16", "tiny")
    with pytest.raises(ValueError, match="compute format"):
        train_scaled(torch.nn.Linear(2, 2), torch.ones(1, 2), torch.ones(1, 2), compute="fp8")
    with pytest.raises(ValueError, match="finite"):
        trace_dynamic_scaling([1.0, math.nan])
    with pytest.raises(ValueError, match="scale"):
        StaticLossScaler(0.0)


# --------------------------------------------------------------------------- helpers, figures, widgets


class _NumpySGD(torch.optim.Optimizer):
    """Oracle optimizer that shares no code with the package: p <- fl32(p - lr·g), in NumPy float64."""

    def __init__(self, params, lr: float):
        super().__init__(params, {"lr": lr})

    @torch.no_grad()
    def step(self, closure=None):
        for group in self.param_groups:
            for p in group["params"]:
                new = p.numpy().astype(np.float64) - group["lr"] * p.grad.numpy().astype(np.float64)
                p.copy_(torch.from_numpy(new.astype(np.float32)))


def _gradscaler_params_by_step(steps: int, growth_interval: int, p_bad: float, seed: int,
                               width: int = 8) -> np.ndarray:
    """torch.amp.GradScaler driving _NumpySGD on the raw gradients compare_with_gradscaler documents."""
    rng = np.random.default_rng(seed)  # the same draws, in the same order, as the package's
    raw = rng.standard_normal((steps, width)).astype(np.float32)
    bad = np.flatnonzero(rng.random(steps) < p_bad)
    raw[bad, rng.integers(0, width, bad.size)] = rng.choice([np.inf, -np.inf, np.nan], bad.size)
    scaler = torch.amp.GradScaler("cpu", growth_interval=growth_interval)
    p = torch.nn.Parameter(torch.ones(width))
    opt = _NumpySGD([p], lr=1e-3)
    out = np.empty((steps, width), dtype=np.float32)
    for i in range(steps):
        p.grad = scaler.scale(torch.from_numpy(raw[i]))
        scaler.step(opt)
        scaler.update()
        out[i] = p.detach().numpy()
    return out


def test_compare_with_gradscaler_reports_identical_runs():
    from precisionlab.scaling import compare_with_gradscaler

    r = compare_with_gradscaler(steps=300, growth_interval=3, p_bad=0.05, seed=4)
    # The parameters after EVERY step against GradScaler run here, with an optimizer of the
    # test's own: neither the package's `identical` flag nor its reference run is trusted.
    oracle = _gradscaler_params_by_step(300, 3, 0.05, 4)
    ours, reference = r.params
    assert ours.shape == (300, 8)
    for i in range(300):
        assert np.array_equal(ours[i], oracle[i], equal_nan=True), f"step {i}"
    assert np.array_equal(reference, oracle, equal_nan=True)
    assert np.array_equal(r.ours.scale, r.reference.scale)
    assert np.array_equal(r.ours.skipped, r.reference.skipped)
    assert np.array_equal(*r.trackers)
    assert r.injected.size > 0 and set(r.injected) <= set(r.ours.skipped_steps)
    # The parameters change exactly at the steps that were not skipped.
    moved = np.any(np.diff(np.vstack([np.ones((1, 8), np.float32), oracle]), axis=0) != 0, axis=1)
    assert np.array_equal(moved, ~r.ours.skipped)
    # The flag agrees with the records, and a run that differs in one step is not identical.
    from dataclasses import replace

    assert r.identical
    tampered = ours.copy()
    tampered[150, 0] = np.nextafter(tampered[150, 0], np.float32(2))
    assert not replace(r, params=(tampered, reference)).identical


def test_gradient_stream_shape_and_validation():
    from precisionlab.scaling import gradient_stream

    g = gradient_stream(500, start=1e-2, end=1e-4, spike_rate=0.0, noise=0.0)
    assert g.shape == (500,) and g[0] == pytest.approx(1e-2) and g[-1] == pytest.approx(1e-4)
    with pytest.raises(ValueError, match="spike_rate"):
        gradient_stream(10, spike_rate=2.0)


def test_scaling_figures_and_widgets(capsys):
    import ipywidgets
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from precisionlab import plotting, widgets

    hist = trace_dynamic_scaling([1e-3, 1e3, 1e-3, 1e-3], growth_interval=2)
    ax = plotting.plot_scale_history({"dyn": hist})
    marks = [ln for ln in ax.get_lines() if "skipped steps (1)" in ln.get_label()]
    assert len(marks) == 1 and marks[0].get_xdata().tolist() == [1]
    ax = plotting.plot_loss_curves({"a": [4.0, 2.0, 1.0]})
    assert ax.get_lines()[0].get_ydata().tolist() == [1.0, 0.5, 0.25]
    panel, fig = widgets.scaling_view(growth_interval=50, spike_rate=0.01)
    assert "skipped steps (overflow):" in panel.text and len(fig.axes) == 2
    explorer = widgets.scaling_explorer()
    assert "growth_interval = 50" in explorer.default_panel.text
    box = explorer.widget()
    assert isinstance(box, ipywidgets.VBox)
    explorer.controls["growth_interval"].value = 10
    assert "growth_interval = 10" in box.children[1].value
    with pytest.raises(ValueError, match="growth_interval"):
        widgets.scaling_view(growth_interval=0)
    plt.close("all")


# --------------------------------------------------------------------------- issue 9: NaN bits, bad settings


@pytest.mark.parametrize("scale", [1.0, 65536.0])
def test_bfloat16_nan_bits_match_gradscaler(scale):
    """GradScaler writes the canonical bfloat16 NaN (0x7fc0) even when 1/S = 1; so must we."""
    raw = torch.from_numpy(np.array([0xFFFF, 0x7FC1, 0x3F80, 0xFF80], dtype=np.uint16).view(np.int16))
    raw = raw.view(torch.bfloat16)
    out = {}
    for name, scaler in (("ours", DynamicLossScaler(init_scale=scale)),
                         ("torch", torch.amp.GradScaler("cpu", init_scale=scale))):
        p = torch.nn.Parameter(torch.zeros(4, dtype=torch.bfloat16))
        p.grad = raw.clone()
        scaler.scale(torch.ones(()))  # GradScaler creates its scale tensor lazily
        scaler.unscale_(torch.optim.SGD([p], lr=0.1))
        out[name] = p.grad.view(torch.int16).tolist()
    assert out["ours"] == out["torch"]
    # float32 gradients: the kernel keeps the NaN's payload; so do we.
    raw32 = torch.from_numpy(np.array([0xFFFFFFFF, 0x7FC00001, 0x3F800000], dtype=np.uint32)
                             .view(np.int32)).view(torch.float32)
    bits = []
    for scaler in (DynamicLossScaler(init_scale=scale), torch.amp.GradScaler("cpu", init_scale=scale)):
        p = torch.nn.Parameter(torch.zeros(3))
        p.grad = raw32.clone()
        scaler.scale(torch.ones(()))
        scaler.unscale_(torch.optim.SGD([p], lr=0.1))
        bits.append(p.grad.view(torch.int32).tolist())
    assert bits[0] == bits[1]
    assert out["ours"][0] == 0x7FC0  # the canonical NaN, not the incoming 0xffff


@pytest.mark.parametrize("kwargs, match", [
    ({"growth_factor": math.inf}, "growth_factor"), ({"growth_factor": None}, "growth_factor"),
    ({"growth_factor": "abc"}, "growth_factor"), ({"growth_factor": math.nan}, "growth_factor"),
    ({"backoff_factor": None}, "backoff_factor"), ({"backoff_factor": -1.0}, "backoff_factor"),
    ({"init_scale": None}, "init_scale"), ({"init_scale": "abc"}, "init_scale"),
    ({"growth_interval": math.nan}, "growth_interval"), ({"growth_interval": math.inf}, "growth_interval"),
    ({"growth_interval": None}, "growth_interval"), ({"growth_interval": "abc"}, "growth_interval"),
    ({"growth_interval": 2.5}, "growth_interval"),
])
def test_bad_settings_name_parameter_and_value(kwargs, match):
    ((_, value),) = kwargs.items()
    with pytest.raises(ValueError, match=rf"{match}.*got {match}={re.escape(repr(value))}"):
        DynamicLossScaler(**kwargs)


@pytest.mark.parametrize("kwargs, match", [
    ({"backoff_factor": -1.0}, "backoff_factor"), ({"growth_factor": math.nan}, "growth_factor"),
    ({"growth_interval": 0}, "growth_interval"), ({"growth_tracker": -1}, "growth_tracker"),
    ({"scale": math.nan}, "scale"), ({"scale": "abc"}, "scale"),
])
def test_update_scale_validates_its_arguments(kwargs, match):
    args = {"scale": 65536.0, "growth_tracker": 0, "found_inf": False, **kwargs}
    with pytest.raises(ValueError, match=match):
        update_scale(**args)


def test_update_scale_defaults_behave_like_a_default_gradscaler():
    """2100 steps of a GradScaler built with no arguments against update_scale called with none.

    The oracle is torch's object itself (its signature and its behaviour), not the package's
    GRADSCALER_DEFAULTS: a changed default growth_factor (say 4.0) gives another scale at step
    2000; a changed backoff_factor another one after the overflow at step 2050.
    """
    scaler = torch.amp.GradScaler("cpu")
    p = torch.nn.Parameter(torch.ones(1))
    opt = torch.optim.SGD([p], lr=0.0)
    scale, tracker = scaler.get_scale(), 0  # update_scale has no initial scale of its own
    for i in range(2100):
        assert scale == scaler.get_scale(), f"step {i}"
        bad = i == 2050
        p.grad = scaler.scale(torch.tensor([math.inf if bad else 1.0]))
        scaler.step(opt)
        scaler.update()
        scale, tracker = update_scale(scale, tracker, bad)
    assert scale == scaler.get_scale() == 65536.0  # grew to 2^17 at 2000, halved at 2050
    assert scaler.get_growth_factor() == inspect.signature(update_scale).parameters["growth_factor"].default


def test_update_scale_defaults_are_gradscalers():
    """The public rule's defaults, exercised: 2000 good steps then x2.0; an overflow then x0.5."""
    sig = inspect.signature(update_scale).parameters
    for name in ("growth_factor", "backoff_factor", "growth_interval"):
        assert sig[name].default == GRADSCALER_DEFAULTS[name]
    d = GRADSCALER_DEFAULTS
    assert update_scale(65536.0, 1999, False) == _kernel_update(
        65536.0, 1999, False, d["growth_factor"], d["backoff_factor"], d["growth_interval"])
    assert update_scale(65536.0, 1998, False) == (65536.0, 1999)
    assert update_scale(65536.0, 5, True) == _kernel_update(
        65536.0, 5, True, d["growth_factor"], d["backoff_factor"], d["growth_interval"])


# --------------------------------------------------------------------------- the emulated training step


def _sequential32(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """a @ b summed over k = 0, 1, ... in float32, each product and sum rounded (NumPy, no FMA)."""
    acc = np.zeros((a.shape[0], b.shape[1]), dtype=np.float32)
    for k in range(a.shape[1]):
        acc = acc + (a[:, k:k + 1] * b[k:k + 1, :]).astype(np.float32)
    return acc


def test_one_emulated_float16_step_against_a_numpy_oracle():
    """fl16 operands, float32 sums in order k = 0, 1, ..., loss in float32, gradient stored in
    float16, unscaled by fl32(1/S), SGD in float64 rounded to float32: each step by hand."""
    factory, x, y = make_regression_task(n=8, d_in=4, d_out=3, target_scale=1e-3, seed=2)
    model = factory()
    with torch.no_grad():  # a non-zero start, so that every term matters
        model.weight.copy_(torch.linspace(-0.3, 0.4, 12).reshape(3, 4))
        model.bias.copy_(torch.tensor([1e-3, -2e-3, 5e-4]))
    w0, b0 = model.weight.detach().numpy().copy(), model.bias.detach().numpy().copy()
    S, lr = 1024.0, 0.5
    log = train_scaled(model, x, y, 1, "float16", StaticLossScaler(S), lr=lr, keep_grads=True)

    def f16(a):  # float32 -> float16 in NumPy is one rounding
        return a.astype(np.float16).astype(np.float32)

    xn, yn = x.numpy(), y.numpy()
    out = f16(_sequential32(f16(xn), f16(w0).T) + f16(b0))
    diff = out.astype(np.float64) - yn.astype(np.float64)
    loss = np.float32(np.sum(diff * diff) / diff.size)
    assert log.loss[0] == loss
    g_out = f16((2.0 * diff * (S / diff.size)).astype(np.float32))
    gw = f16(_sequential32(g_out.T, f16(xn)))
    gb = f16(g_out.astype(np.float64).sum(0).astype(np.float32))
    inv = np.float32(1.0 / S)
    gw, gb = gw * inv, gb * inv
    assert np.array_equal(log.grads[0][0].numpy(), gw)
    assert np.array_equal(log.grads[0][1].numpy(), gb)
    assert np.array_equal(model.weight.detach().numpy(), (w0 - lr * gw.astype(np.float64)).astype(np.float32))
    assert np.array_equal(model.bias.detach().numpy(), (b0 - lr * gb.astype(np.float64)).astype(np.float32))


_PORTABLE = """
import hashlib, numpy as np, torch
from precisionlab import scaling
f, x, y = scaling.make_regression_task(seed=0)
h = hashlib.sha256(x.numpy().tobytes() + y.numpy().tobytes())
for c, s in [("float16", scaling.DynamicLossScaler(growth_interval=5)), ("bfloat16", None)]:
    m = f()
    r = scaling.train_scaled(m, x, y, 30, c, s)
    h.update(r.loss.tobytes() + m.weight.detach().numpy().tobytes())
print(h.hexdigest())
"""


def test_emulated_training_has_the_same_bits_under_every_kernel_dispatch(same_bits):
    same_bits(_PORTABLE)


def test_native_backend_runs_any_model_and_agrees_in_float32():
    factory, x, y = make_regression_task(seed=3)
    emu = train_scaled(factory(), x, y, 40, "float32")
    nat = train_scaled(factory(), x, y, 40, "float32", backend="native")
    assert np.allclose(emu.loss, nat.loss, rtol=1e-4, atol=0)
    seq = torch.nn.Sequential(torch.nn.Linear(16, 4), torch.nn.ReLU(), torch.nn.Linear(4, 8))
    train_scaled(seq, x, y, 2, "bfloat16", backend="native")
    with pytest.raises(TypeError, match=r"ReLU.*backend='native'"):
        train_scaled(seq, x, y, 2, "bfloat16")
    with pytest.raises(ValueError, match="backend"):
        train_scaled(factory(), x, y, 2, "float16", backend="gpu")


def test_make_regression_task_targets_are_the_float64_product():
    from precisionlab import emulate

    _, x, y = make_regression_task(n=5, d_in=3, d_out=2, seed=7)
    gen = torch.Generator().manual_seed(7)
    x_ref = emulate.randn(5, 3, generator=gen).numpy()
    w = emulate.randn(3, 2, generator=gen, dtype=torch.float64).numpy() / math.sqrt(3)
    assert np.array_equal(x.numpy(), x_ref)
    exact = [[math.fsum(float(x_ref[i, k]) * w[k, j] for k in range(3)) for j in range(2)]
             for i in range(5)]
    assert np.allclose(y.numpy(), np.float32(np.array(exact) * 1e-4), rtol=1e-6, atol=0)


def test_forward_loss_split_against_a_numpy_oracle():
    """Each rounding alone, by hand: fl16 of W and b, of x, or of the output; float32 sums in
    order k; the loss as a float64 mean rounded to float32. 'all' is forward_loss itself."""
    from precisionlab.scaling import forward_loss, forward_loss_split

    factory, x, y = make_regression_task(n=8, d_in=4, d_out=3, target_scale=1e-3, seed=5)
    model = factory()
    with torch.no_grad():  # weights of mixed sizes, some below float16's smallest normal
        model.weight.copy_(torch.tensor([[3e-5, -2e-6, 0.25, 1e-3]] * 3) * torch.tensor([[1.0], [-0.7], [1.3]]))
        model.bias.copy_(torch.tensor([1e-8, -3e-4, 2e-5]))
    split = forward_loss_split(model, x, y, "float16")

    def f16(a):
        return a.astype(np.float16).astype(np.float32)

    xn, yn = x.numpy(), y.numpy()
    w, b = model.weight.detach().numpy(), model.bias.detach().numpy()
    cases = {"none": (xn, w, b, False), "weights": (xn, f16(w), f16(b), False),
             "inputs": (f16(xn), w, b, False), "outputs": (xn, w, b, True),
             "all": (f16(xn), f16(w), f16(b), True)}
    for name, (xi, wi, bi, round_out) in cases.items():
        out = _sequential32(xi, wi.T) + bi
        out = f16(out) if round_out else out.astype(np.float32)
        diff = out.astype(np.float64) - yn.astype(np.float64)
        assert split[name] == float(np.float32(np.sum(diff * diff) / diff.size)), name
    assert split["all"] == forward_loss(model, x, y, "float16")
    assert split["none"] == forward_loss(model, x, y, "float32")
    with pytest.raises(TypeError, match="Linear"):
        forward_loss_split(torch.nn.Sequential(model), x, y)
    with pytest.raises(ValueError, match="valid choices"):
        forward_loss_split(model, x, y, "float8")


def _amp_loop(model, scaler, x, y, steps, accum=2, opt_state=None, start=0):
    """float16 CPU autocast, gradient accumulation, unscale_ then clipping, a scheduler that
    steps only when the optimizer did: the recipe of chapter 5, as a test harness."""
    opt = torch.optim.SGD(model.parameters(), lr=0.5, momentum=0.9)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=4, gamma=0.5)
    if opt_state is not None:
        opt.load_state_dict(opt_state[0])
        sched.load_state_dict(opt_state[1])
    scales, skipped = [], []
    for _ in range(start, steps):
        opt.zero_grad(set_to_none=True)
        for xb, yb in zip(x.chunk(accum), y.chunk(accum), strict=True):
            with torch.autocast("cpu", dtype=torch.float16):
                loss = torch.nn.functional.mse_loss(model(xb), yb) / accum
            scaler.scale(loss).backward()
        scaler.unscale_(opt)
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1e-3)
        before = scaler.get_scale()
        scaler.step(opt)
        scaler.update()
        scales.append(before)
        skipped.append(scaler.get_scale() < before)
        if not skipped[-1]:
            sched.step()
    return scales, skipped, (opt.state_dict(), sched.state_dict())


def test_training_recipe_with_both_scalers_and_a_checkpoint():
    """The book's scaler and GradScaler in the same real loop (accumulation, clipping,
    scheduler): same scales, skips and weights; a checkpoint of the scaler's state_dict
    resumes the run bit for bit, and each scaler loads the other's state."""
    factory, x, y = make_regression_task(seed=1)
    kw = {"init_scale": 2.0**36, "growth_interval": 3}
    runs = {}
    for name, make in (("torch", lambda: torch.amp.GradScaler("cpu", **kw)),
                       ("book", lambda: DynamicLossScaler(**kw))):
        model = factory()
        scales, skipped, _ = _amp_loop(model, make(), x, y, 16)
        runs[name] = (scales, skipped, model.weight.detach().clone())
        # Interrupted at step 7: save model, optimizer, scheduler and scaler; resume in new objects.
        m1, s1 = factory(), make()
        a_scales, _, opt_state = _amp_loop(m1, s1, x, y, 7)
        ckpt = copy.deepcopy({"model": m1.state_dict(), "scaler": s1.state_dict()})
        m2, s2 = factory(), make()
        m2.load_state_dict(ckpt["model"])
        s2.load_state_dict(ckpt["scaler"])
        b_scales, _, _ = _amp_loop(m2, s2, x, y, 16, opt_state=copy.deepcopy(opt_state), start=7)
        assert a_scales + b_scales == scales
        assert torch.equal(m2.weight, model.weight)
    assert runs["torch"][0] == runs["book"][0] and runs["torch"][1] == runs["book"][1]
    assert torch.equal(runs["torch"][2], runs["book"][2])
    assert sum(runs["book"][1]) >= 5  # the too-high start was corrected by skipping
    # Each loads the other's state dict (GradScaler's five keys).
    theirs = torch.amp.GradScaler("cpu", init_scale=2.0**20, growth_interval=7)
    theirs.scale(torch.ones(1))
    ours = DynamicLossScaler()
    ours.load_state_dict(theirs.state_dict())
    assert ours.state_dict() == theirs.state_dict()
    back = torch.amp.GradScaler("cpu")
    back.load_state_dict(ours.state_dict())
    back.scale(torch.ones(1))
    assert back.state_dict() == theirs.state_dict()
    with pytest.raises(RuntimeError, match="empty"):
        DynamicLossScaler().load_state_dict({})
    with pytest.raises(ValueError, match="lacks"):
        DynamicLossScaler().load_state_dict({"scale": 1.0})
    bad = {**ours.state_dict(), "backoff_factor": 2.0}
    with pytest.raises(ValueError, match="backoff_factor"):
        DynamicLossScaler().load_state_dict(bad)
    DynamicLossScaler(enabled=False).load_state_dict({})  # disabled: a no-op, like GradScaler
