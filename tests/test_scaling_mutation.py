"""precisionlab.scaling on the cases a mutation run (scripts/mutation_run.py) found untested.

Lists and tuples of outputs, keyword arguments passed through step(), closures and fused
optimizers refused, the state after a failed unscale_, StaticLossScaler's state dict, the
documented defaults (compare_with_gradscaler's growth_interval = 7, train_scaled keeps no
gradients), gradient_stream against its documented formula, and messages that name the
parameter. Oracles: torch.amp.GradScaler side by side, NumPy's generator for the formula.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from precisionlab.scaling import (
    DynamicLossScaler,
    StaticLossScaler,
    compare_with_gradscaler,
    forward_loss,
    forward_loss_split,
    gradient_stream,
    make_regression_task,
    train_scaled,
)

SCALERS = [lambda: DynamicLossScaler(init_scale=4.0), lambda: torch.amp.GradScaler("cpu", init_scale=4.0)]


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


def test_a_failed_unscale_records_no_inf_check():
    s = DynamicLossScaler()
    p = torch.nn.Parameter(torch.ones(2, dtype=torch.float16))
    p.grad = torch.ones(2, dtype=torch.float16)
    opt = torch.optim.SGD([p], lr=0.1)
    with pytest.raises(ValueError, match=r"cannot unscale float16 gradients"):
        s.unscale_(opt)
    with pytest.raises(RuntimeError, match=r"^no inf checks were recorded prior to update\(\); call step"):
        s.update()


@pytest.mark.parametrize("tracker", [1.5, -1, True, "2"])
def test_load_state_dict_rejects_a_tracker_that_is_not_a_count(tracker):
    state = {**DynamicLossScaler().state_dict(), "_growth_tracker": tracker}
    with pytest.raises(ValueError, match=f"^_growth_tracker must be an integer >= 0; got {tracker!r}$"):
        DynamicLossScaler().load_state_dict(state)


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


@pytest.mark.parametrize("call", [
    lambda m, x, y: forward_loss(m, x, y, "fp8"),
    lambda m, x, y: forward_loss_split(m, x, y, "fp8"),
    lambda m, x, y: train_scaled(m, x, y, 1, "fp8"),
])
def test_an_unknown_compute_format_is_named(call):
    factory, x, y = make_regression_task(n=4, d_in=3, d_out=2)
    with pytest.raises(ValueError, match=r"^unknown compute format 'fp8'; valid choices: float32, float16, bfloat16$"):
        call(factory(), x, y)


def test_train_scaled_keeps_gradients_only_when_asked():
    factory, x, y = make_regression_task(n=4, d_in=3, d_out=2)
    assert train_scaled(factory(), x, y, 2, "float16").grads == []
    kept = train_scaled(factory(), x, y, 2, "float16", keep_grads=True).grads
    assert len(kept) == 2 and len(kept[0]) == 2
