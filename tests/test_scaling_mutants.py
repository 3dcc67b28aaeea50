"""precisionlab.scaling on the fixtures the side-by-side tests never build, against GradScaler and NumPy.

Several optimizers with only one seeing inf; one optimizer whose FIRST parameter holds the inf;
scales that are not float32 values (init_scale, update(new_scale)); gradients exactly at the
float16 overflow boundary; a multi-step emulated training run (momentum, dynamic scale, a
skipped step) against a NumPy re-implementation of the documented arithmetic, with a few of
its numbers written out; and a Sequential model against the emulate ops composed by hand.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from precisionlab import emulate
from precisionlab.scaling import (
    DynamicLossScaler,
    forward_loss,
    make_regression_task,
    simulate_scale_history,
    trace_dynamic_scaling,
    train_scaled,
    update_scale,
)


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


def test_overflow_is_decided_after_rounding_into_float16():
    # S = 1: 65519 rounds down to 65504 (finite); 65520 is the tie with inf's place: inf
    g = [65504.0, 65510.0, 65519.0, 65520.0, 1.0]
    hist = trace_dynamic_scaling(g, "float16", init_scale=1.0)
    with np.errstate(over="ignore"):
        cast = [bool(np.isinf(np.float16(v))) for v in g[:4]]
    assert cast == [False, False, False, True]
    assert hist.skipped.tolist() == [*cast, False]
    assert hist.scale.tolist() == [1.0, 1.0, 1.0, 1.0, 0.5]


def test_growth_blocked_by_float32_overflow_resets_the_tracker():
    top = 2.0**127
    s, t = torch.full((), top), torch.full((), 2, dtype=torch.int32)
    torch._amp_update_scale_(s, t, torch.zeros(()), 2.0, 0.5, 3)
    assert update_scale(top, 2, False, 2.0, 0.5, 3) == (s.item(), int(t.item())) == (top, 0)
    assert update_scale(3.0, 0, True, 2.0, 0.3, 3) == (float(np.float32(3.0 * 0.3)), 0)


# --------------------------------------------------------------------------- a training run


def _f16(a):
    """float64/float32 -> float16 -> float32: NumPy converts with one rounding."""
    with np.errstate(over="ignore"):
        return np.asarray(a).astype(np.float16).astype(np.float32)


def _seq32(a, b):
    """a @ b in float32, k = 0, 1, ... in order, each product and sum rounded (NumPy, no FMA)."""
    with np.errstate(invalid="ignore", over="ignore"):
        return _seq32_loop(a, b)


def _seq32_loop(a, b):
    acc = np.zeros((a.shape[0], b.shape[1]), dtype=np.float32)
    for k in range(a.shape[1]):
        acc = acc + (a[:, k:k + 1] * b[k:k + 1, :]).astype(np.float32)
    return acc


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
