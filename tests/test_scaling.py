"""precisionlab.scaling's thresholds, traces, comparison helpers and emulated training.

smallest_surviving_gradient, largest_safe_gradient, trace_dynamic_scaling (overflow decided
after rounding into float16), compare_with_gradscaler (its documented default growth_interval
of 7), gradient_stream against its documented formula, train_scaled / forward_loss /
forward_loss_split (one step by hand, a multi-step dynamic-scaled run with momentum and a
skipped step, a Sequential model, gradients kept only when asked), the figures and widgets,
and messages that name the parameter. The scalers themselves are tested in
test_scaling_scalers.py. Oracles: torch's own float16 casts (and NumPy's) for the survival and
overflow thresholds, torch.amp.GradScaler driving an optimizer of the test's own, a NumPy
re-implementation of train_scaled's documented arithmetic with a few of its numbers written
out, the emulate ops composed by hand, and NumPy's generator for the stream's formula.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from precisionlab import emulate
from precisionlab.scaling import (
    DynamicLossScaler,
    StaticLossScaler,
    compare_with_gradscaler,
    forward_loss,
    forward_loss_split,
    gradient_stream,
    largest_safe_gradient,
    make_regression_task,
    simulate_scale_history,
    smallest_surviving_gradient,
    trace_dynamic_scaling,
    train_scaled,
)


def _fp16(x: float) -> float:
    """float64 -> float16 in one rounding (NumPy converts directly; torch 2.13 goes through float32)."""
    with np.errstate(over="ignore"):
        return float(np.float16(x))


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


@pytest.mark.parametrize("factors", [{"growth_interval": 3},
                                     {"growth_factor": 3.0, "backoff_factor": 0.3,
                                      "growth_interval": 2, "init_scale": 5.0}])
def test_trace_dynamic_scaling_is_the_rule_one_step_at_a_time(factors):
    # Oracle: update_scale and one float16 cast per step (NumPy's direct conversion), over
    # 1000 steps (the trace rounds blocks of up to 256 steps per scale) and, with factors 3
    # and 0.3, scales that rarely repeat.
    from precisionlab.scaling import update_scale

    rng = np.random.default_rng(4)
    g = 10.0 ** rng.uniform(-7, 2, 1000)
    hist = trace_dynamic_scaling(g, "float16", **factors)
    kw = {k: v for k, v in factors.items() if k != "init_scale"}
    s, t, scales, skipped = float(np.float32(factors.get("init_scale", 2.0**16))), 0, [], []
    for gi in g:
        scales.append(s)
        skipped.append(math.isinf(_fp16(gi * s)))
        s, t = update_scale(s, t, skipped[-1], **kw)
    assert hist.scale.tolist() == scales and hist.skipped.tolist() == skipped
    assert 50 < sum(skipped) < 950 and len(set(scales)) >= 8


def test_overflow_is_decided_after_rounding_into_float16():
    # S = 1: 65519 rounds down to 65504 (finite); 65520 is the tie with inf's place: inf
    g = [65504.0, 65510.0, 65519.0, 65520.0, 1.0]
    hist = trace_dynamic_scaling(g, "float16", init_scale=1.0)
    with np.errstate(over="ignore"):
        cast = [bool(np.isinf(np.float16(v))) for v in g[:4]]
    assert cast == [False, False, False, True]
    assert hist.skipped.tolist() == [*cast, False]
    assert hist.scale.tolist() == [1.0, 1.0, 1.0, 1.0, 0.5]


# --------------------------------------------------------------------------- errors


def test_other_bad_inputs():
    with pytest.raises(ValueError, match="valid choices"):
        smallest_surviving_gradient(1.0, "float16", "tiny")
    with pytest.raises(ValueError, match="compute format"):
        train_scaled(torch.nn.Linear(2, 2), torch.ones(1, 2), torch.ones(1, 2), compute="fp8")
    with pytest.raises(ValueError, match="finite"):
        trace_dynamic_scaling([1.0, math.nan])
    with pytest.raises(ValueError, match="scale"):
        StaticLossScaler(0.0)


@pytest.mark.parametrize("call", [
    lambda m, x, y: forward_loss(m, x, y, "fp8"),
    lambda m, x, y: forward_loss_split(m, x, y, "fp8"),
    lambda m, x, y: train_scaled(m, x, y, 1, "fp8"),
])
def test_an_unknown_compute_format_is_named(call):
    factory, x, y = make_regression_task(n=4, d_in=3, d_out=2)
    with pytest.raises(ValueError, match=r"^unknown compute format 'fp8'; valid choices: float32, float16, bfloat16$"):
        call(factory(), x, y)


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


def test_compare_with_gradscaler_defaults_to_growth_every_7_good_steps():
    r = compare_with_gradscaler(steps=16, p_bad=0.0)
    want = [2.0**16] * 7 + [2.0**17] * 7 + [2.0**18] * 2
    assert r.ours.scale.tolist() == want and r.reference.scale.tolist() == want
    assert r.ours.growth_steps.tolist() == [6, 13] and not r.ours.skipped.any()


def test_gradient_stream_follows_its_documented_formula():
    steps, start, end, rate, factor, noise, seed = 50, 1e-2, 1e-4, 0.2, 1e4, 0.3, 3
    g = gradient_stream(steps, start, end, rate, factor, noise, seed)
    rng = np.random.default_rng(seed)
    k = np.arange(steps)
    spikes = np.where(rng.random(steps) < rate, factor, 1.0)
    want = start * (end / start) ** (k / (steps - 1)) * np.exp(noise * rng.standard_normal(steps)) * spikes
    assert np.allclose(g, want, rtol=1e-12, atol=0)
    assert (spikes > 1).sum() >= 5  # the fixture has spikes, multiplying
    with pytest.raises(ValueError, match=r"^steps must be a positive integer; got steps=2.5$"):
        gradient_stream(2.5)
    with pytest.raises(ValueError, match=r"^steps must be a positive integer; got steps=0$"):
        gradient_stream(0)


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


def test_train_scaled_keeps_gradients_only_when_asked():
    factory, x, y = make_regression_task(n=4, d_in=3, d_out=2)
    assert train_scaled(factory(), x, y, 2, "float16").grads == []
    kept = train_scaled(factory(), x, y, 2, "float16", keep_grads=True).grads
    assert len(kept) == 2 and len(kept[0]) == 2


# --------------------------------------------------------------------------- a training run


def _f16(a):
    """float64/float32 -> float16 -> float32: NumPy converts with one rounding."""
    with np.errstate(over="ignore"):
        return np.asarray(a).astype(np.float16).astype(np.float32)


def _seq32(a, b):
    """a @ b in float32, k = 0, 1, ... in order, each product and sum rounded (NumPy, no FMA)."""
    with np.errstate(invalid="ignore", over="ignore"):
        return _sequential32(a, b)


def _numpy_training(x, y, w, b, steps, scale, interval, lr, mu):
    """train_scaled's documented arithmetic for a Linear layer in float16 with a dynamic scaler."""
    x, y = x.astype(np.float32), y.astype(np.float64)
    bufs, tracker, losses, scales, skipped = None, 0, [], [], []
    for _ in range(steps):
        out = _f16(_seq32(_f16(x), _f16(w).T) + _f16(b))
        diff = out.astype(np.float64) - y
        losses.append(float(np.float32(math.fsum((diff * diff).ravel()) / diff.size)))
        scales.append(scale)
        g_out = _f16((2.0 * diff * (np.float32(scale) / diff.size)).astype(np.float32))
        gw = _f16(_seq32(g_out.T, _f16(x)))
        gb = _f16([math.fsum(col) for col in g_out.T.astype(np.float64)])
        inv = np.float32(1.0 / scale)
        grads = [gw * inv, gb * inv]
        bad = not all(np.isfinite(g).all() for g in grads)
        skipped.append(bad)
        if bad:
            scale, tracker = float(np.float32(scale * 0.5)), 0
            continue
        g64 = [g.astype(np.float64) for g in grads]
        bufs = g64 if bufs is None else [mu * bb + g for bb, g in zip(bufs, g64, strict=True)]
        bufs = [bb.astype(np.float32).astype(np.float64) for bb in bufs]
        w = (w.astype(np.float64) - lr * bufs[0]).astype(np.float32)
        b = (b.astype(np.float64) - lr * bufs[1]).astype(np.float32)
        tracker += 1
        if tracker == interval:
            scale, tracker = float(np.float32(scale * 2.0)), 0
    return losses, scales, skipped, w, b


def test_a_dynamic_scaled_float16_run_with_momentum_against_numpy():
    factory, x, y = make_regression_task(n=8, d_in=4, d_out=3, target_scale=1e-3, seed=2)
    model = factory()
    with torch.no_grad():
        model.weight.copy_(torch.linspace(-0.3, 0.4, 12).reshape(3, 4))
        model.bias.copy_(torch.tensor([1e-3, -2e-3, 5e-4]))
    w0, b0 = model.weight.detach().numpy().copy(), model.bias.detach().numpy().copy()
    # 2^18: the first scaled gradient overflows float16 (skipped, halved), the scale grows
    # after every 2 good steps until it overflows again at step 6
    log = train_scaled(model, x, y, 8, "float16", DynamicLossScaler(init_scale=2.0**18, growth_interval=2),
                       lr=0.1, momentum=0.9)
    losses, scales, skipped, w, b = _numpy_training(x.numpy(), y.numpy(), w0, b0, 8, 2.0**18, 2, 0.1, 0.9)
    assert skipped == log.history.skipped.tolist() == [True, False, False, False, False, False, True, False]
    assert scales == log.history.scale.tolist() == [2.0**e for e in (18, 17, 17, 18, 18, 19, 19, 18)]
    assert log.loss.tolist() == losses
    assert np.array_equal(model.weight.detach().numpy(), w) and np.array_equal(model.bias.detach().numpy(), b)
    # fixed values: the NumPy run's losses at steps 0, 1, 2 and 5 (float32)
    assert [losses[i] for i in (0, 1, 2, 5)] == [0.2619209885597229, 0.2619209885597229,
                                                 0.19719311594963074, 0.018994120880961418]


def test_a_sequential_model_runs_every_op_in_the_compute_format():
    # a final activation: its output reaches the float32 loss without another float16 rounding
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Tanh(), torch.nn.Linear(3, 2),
                                torch.nn.SiLU())
    gen = torch.Generator().manual_seed(5)
    x = emulate.randn(6, 4, generator=gen)
    y = emulate.randn(6, 2, generator=gen)
    l1, l2 = model[0], model[2]
    h = emulate.tanh(emulate.linear(x, l1.weight, l1.bias, "float16"), "float16")
    out = emulate.silu(emulate.linear(h, l2.weight, l2.bias, "float16"), "float16")
    want = float(emulate.mse_loss(out, y, "float32").detach())
    assert forward_loss(model, x, y, "float16") == want
    log = train_scaled(model, x, y, 1, "float16", lr=0.1, momentum=0.0)
    assert log.loss[0] == want
