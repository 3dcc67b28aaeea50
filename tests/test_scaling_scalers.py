"""precisionlab.scaling's loss scalers and their update rule, against torch.amp.GradScaler and its kernels.

DynamicLossScaler and StaticLossScaler (scale, unscale_, step, update, state dicts) and
update_scale / simulate_scale_history: the defaults, the update rule, unscaling (NaN bits
included), outputs that are lists and tuples, arguments passed through step(), closures and
fused optimizers refused, several optimizers with only one seeing inf, an inf in the first
parameter, scales that are not float32 values, the state after a failed unscale_, and the
chapter 5 recipe with a checkpoint. Oracles: torch.amp.GradScaler run side by side (same
gradients, same model and data) and the kernels it calls (torch._amp_update_scale_,
torch._amp_foreach_non_finite_check_and_unscale_) driven directly.
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
    make_regression_task,
    simulate_scale_history,
    train_scaled,
    update_scale,
)

FP32_MAX = float(torch.finfo(torch.float32).max)
SCALERS = [lambda: DynamicLossScaler(init_scale=4.0), lambda: torch.amp.GradScaler("cpu", init_scale=4.0)]


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


def test_growth_blocked_by_float32_overflow_resets_the_tracker():
    top = 2.0**127
    s, t = torch.full((), top), torch.full((), 2, dtype=torch.int32)
    torch._amp_update_scale_(s, t, torch.zeros(()), 2.0, 0.5, 3)
    assert update_scale(top, 2, False, 2.0, 0.5, 3) == (s.item(), int(t.item())) == (top, 0)
    assert update_scale(3.0, 0, True, 2.0, 0.3, 3) == (float(np.float32(3.0 * 0.3)), 0)


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


def test_a_failed_unscale_records_no_inf_check():
    s = DynamicLossScaler()
    p = torch.nn.Parameter(torch.ones(2, dtype=torch.float16))
    p.grad = torch.ones(2, dtype=torch.float16)
    opt = torch.optim.SGD([p], lr=0.1)
    with pytest.raises(ValueError, match=r"cannot unscale float16 gradients"):
        s.unscale_(opt)
    with pytest.raises(RuntimeError, match=r"^no inf checks were recorded prior to update\(\); call step"):
        s.update()


# --------------------------------------------------------------------------- scale and step


@pytest.mark.parametrize("make", SCALERS, ids=["ours", "GradScaler"])
def test_lists_and_tuples_of_outputs_keep_their_type(make):
    s = make()
    a, b = torch.tensor([1.0, 2.0]), torch.tensor([0.5])
    out = s.scale([a, (b, a)])
    assert type(out) is list and type(out[1]) is tuple
    assert out[0].tolist() == [4.0, 8.0] and out[1][0].tolist() == [2.0]
    assert [t.tolist() for t in s.scale(iter([a]))] == [[4.0, 8.0]]  # any iterable: lazily


def test_scale_names_what_it_cannot_scale():
    with pytest.raises(ValueError, match=r"^outputs must be a Tensor or an iterable of Tensors; got float$"):
        DynamicLossScaler().scale(3.0)


class _Counting(torch.optim.SGD):
    """SGD whose step takes a keyword argument and returns it."""

    def step(self, factor=1.0):
        super().step()
        return factor


@pytest.mark.parametrize("make", SCALERS, ids=["ours", "GradScaler"])
def test_step_passes_arguments_through_and_returns_the_optimizers_value(make):
    s = make()
    p = torch.nn.Parameter(torch.ones(2))
    opt = _Counting([p], lr=0.5)
    p.grad = s.scale(torch.ones(2))
    assert s.step(opt, factor=3.0) == 3.0
    assert p.tolist() == [0.5, 0.5]
    s.update()


def test_closures_and_fused_optimizers_are_refused():
    s = DynamicLossScaler()
    p = torch.nn.Parameter(torch.ones(1))
    p.grad = torch.ones(1)
    opt = torch.optim.SGD([p], lr=0.1)
    with pytest.raises(RuntimeError, match=r"^closure use is not supported with loss scaling$"):
        s.step(opt, closure=lambda: 0.0)
    opt._step_supports_amp_scaling = True  # what fused optimizers declare
    with pytest.raises(ValueError, match=r"^SGD unscales inside its own \(fused\) step"):
        s.step(opt)


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


# --------------------------------------------------------------------------- several optimizers and parameters, scales off float32


def _two_optimizers(scaler, steps=12, inf_at=(3, 7), growth_interval=4):
    """Two SGD optimizers on two parameters; at the steps in inf_at only the SECOND one's gradient is inf."""
    pa, pb = torch.nn.Parameter(torch.ones(3)), torch.nn.Parameter(torch.ones(2))
    oa, ob = torch.optim.SGD([pa], lr=0.1), torch.optim.SGD([pb], lr=0.1)
    scales, params = [], []
    for i in range(steps):
        scales.append(scaler.get_scale())
        pa.grad = scaler.scale(torch.full((3,), 0.5))
        pb.grad = scaler.scale(torch.tensor([math.inf if i in inf_at else 0.25, 0.25]))
        scaler.step(oa)
        scaler.step(ob)
        scaler.update()
        params.append(torch.cat([pa.detach(), pb.detach()]).clone())
    return scales, torch.stack(params)


def test_update_backs_off_when_any_of_several_optimizers_saw_inf():
    kw = {"init_scale": 1024.0, "growth_interval": 4}
    ours, ours_p = _two_optimizers(DynamicLossScaler(**kw))
    ref, ref_p = _two_optimizers(torch.amp.GradScaler("cpu", **kw))
    assert ours == ref
    assert ours[4] == 512.0  # step 3: only optimizer b saw inf, and the scale still halved
    assert torch.equal(ours_p, ref_p)
    # optimizer a stepped at step 3 (its gradients were finite), b did not
    assert ours_p[3, 0] < ours_p[2, 0] and ours_p[3, 3] == ours_p[2, 3]


def _first_param_inf(scaler):
    """One optimizer, two parameter groups; the first parameter's gradient holds an inf."""
    p1, p2 = torch.nn.Parameter(torch.ones(2)), torch.nn.Parameter(torch.ones(2))
    opt = torch.optim.SGD([{"params": [p1]}, {"params": [p2], "lr": 0.5}], lr=0.1)
    p1.grad = scaler.scale(torch.tensor([math.inf, 1.0]))
    p2.grad = scaler.scale(torch.tensor([1.0, 1.0]))
    scaler.step(opt)
    scaler.update()
    return scaler.get_scale(), p1.detach().clone(), p2.detach().clone()


def test_an_inf_in_the_first_of_several_parameters_skips_the_step():
    ours = _first_param_inf(DynamicLossScaler(init_scale=8.0))
    ref = _first_param_inf(torch.amp.GradScaler("cpu", init_scale=8.0))
    assert ours[0] == ref[0] == 4.0
    assert torch.equal(ours[1], ref[1]) and torch.equal(ours[2], ref[2])
    assert ours[2].tolist() == [1.0, 1.0]  # nothing moved


@pytest.mark.parametrize("init", [0.1, 3.3, 1e10 + 1])
def test_scales_that_are_not_float32_values_are_stored_as_float32(init):
    ours, ref = DynamicLossScaler(init_scale=init), torch.amp.GradScaler("cpu", init_scale=init)
    x = torch.ones(())
    assert torch.equal(ours.scale(x), ref.scale(x))
    assert ours.get_scale() == ref.get_scale() == float(np.float32(init)) != init
    hist = simulate_scale_history([False, True, False], init_scale=init, growth_interval=2)
    s, t, kernel = torch.full((), init, dtype=torch.float32), torch.zeros((), dtype=torch.int32), []
    for f in (False, True, False):
        kernel.append(s.item())
        torch._amp_update_scale_(s, t, torch.full((), float(f)), 2.0, 0.5, 2)
    assert hist.scale.tolist() == kernel
    p = torch.nn.Parameter(torch.ones(1))
    opt = torch.optim.SGD([p], lr=0.0)
    for sc in (ours, ref):  # update(new_scale) with a float that float32 cannot hold
        p.grad = sc.scale(torch.ones(1))
        sc.step(opt)
        sc.update(new_scale=0.3)
    assert ours.get_scale() == ref.get_scale() == float(np.float32(0.3))


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


def test_static_scaler_state_dict_and_its_checks():
    s = StaticLossScaler(1024.0)
    assert s.state_dict() == {"scale": 1024.0, "growth_factor": 1.0, "backoff_factor": 1.0,
                              "growth_interval": 0, "_growth_tracker": 0}
    t = StaticLossScaler(8.0)
    t.load_state_dict({**s.state_dict(), "scale": 2.0**-3})
    assert t.get_scale() == 0.125
    for bad in (math.inf, 0.0, -1.0):
        with pytest.raises(ValueError, match=f"^scale must be finite and > 0; got scale={bad!r}$"):
            t.load_state_dict({**s.state_dict(), "scale": bad})
    assert t.get_scale() == 0.125


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


# --------------------------------------------------------------------------- NaN bits, bad settings (issue 9)


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


# --------------------------------------------------------------------------- state dicts and the chapter 5 recipe


@pytest.mark.parametrize("tracker", [1.5, -1, True, "2"])
def test_load_state_dict_rejects_a_tracker_that_is_not_a_count(tracker):
    state = {**DynamicLossScaler().state_dict(), "_growth_tracker": tracker}
    with pytest.raises(ValueError, match=f"^_growth_tracker must be an integer >= 0; got {tracker!r}$"):
        DynamicLossScaler().load_state_dict(state)


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
