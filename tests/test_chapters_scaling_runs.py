"""Tests for precisionlab.chapters.scaling_runs (chapters 4 and 5).

Oracles: torch.amp.GradScaler (the scale after each update, given the same inf/NaN flags),
the network's own probe at each recorded scale, a float64 forward pass rounded to float16 by
NumPy's cast, float64 least-squares gradients written out by hand, and numpy's NaN-aware
array comparison.
"""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import nbformat
import numpy as np
import pytest
import torch

from precisionlab import scaling
from precisionlab.chapters.scaling_runs import (
    AmpStep,
    grads_identical,
    scale_actions,
    scaler_in_front,
    train_amp,
)
from precisionlab.scaling import DynamicLossScaler, ScaleHistory, TrainLog
from precisionlab.underflow import AttenuatingNet, make_batch, probe_network

ROOT = Path(__file__).resolve().parent.parent


def _gradscaler_scales(flags, scaler=None, **kw) -> list[float]:
    """GradScaler's (or scaler's) scale before each step and after the last, fed these flags."""
    scaler = torch.amp.GradScaler("cpu", **kw) if scaler is None else scaler
    p = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.SGD([p], lr=0.0)
    out = [scaler.get_scale()]
    for bad in flags:
        scaler.scale(torch.ones(()))  # GradScaler sets up its scale on the first call
        p.grad = torch.tensor([float("inf") if bad else 1.0])
        scaler.step(opt)
        scaler.update()
        out.append(scaler.get_scale())
    return out


# --------------------------------------------------------------------------- scaler_in_front


@pytest.mark.parametrize(("depth", "steps"), [(20, 40), (24, 6)])
def test_scaler_in_front_follows_gradscaler_and_stops_at_the_first_good_step(depth, steps):
    run = scaler_in_front(depth, steps, 1.6, "float16", 16, 4, seed=1)
    h = run.history
    assert h.steps == len(run.losses) <= steps
    assert h.skipped[:-1].all()  # every step before the last was skipped ...
    if h.steps < steps:
        assert not h.skipped[-1]  # ... and it stopped at the first good one
    # The scales follow GradScaler's rule for the same flags (default factors).
    assert h.scale.tolist() == _gradscaler_scales(h.skipped)[:-1]
    # Each flag is what a fresh probe at the recorded scale says (not the next scale's), and
    # like GradScaler's it looks at the gradients only; a non-finite loss makes them non-finite.
    for s, bad in zip(h.scale, h.skipped, strict=True):
        p = probe_network(1.6, "float16", depth, 16, 4, seed=1, loss_scale=s)
        assert bad == (not (p.weight.finite.all() and p.signal.finite.all()))
        assert np.isfinite(p.loss) or bad
    assert run.probe.loss_scale == h.scale[-1]


def test_scaler_in_front_finds_a_scale_when_one_exists():
    run = scaler_in_front(20, 40, 1.6, "float16", 16, 4, seed=1)
    assert not run.history.skipped[-1] and run.history.skipped[:-1].all()
    assert run.history.steps > 1  # the start at 2^16 overflows


def test_scaler_in_front_peaks_against_a_float64_forward_rounded_by_numpy():
    depth, width = 24, 16
    run = scaler_in_front(depth, 3, 1.6, "float16", width, 4, seed=1)
    net = AttenuatingNet(depth, width, 1.6, "float16", seed=1)
    h = make_batch(width, 4, "float16", seed=1)[0].double().numpy()
    peaks = []
    with np.errstate(over="ignore", invalid="ignore"):
        for lin in net.layers:
            w, b = lin.weight.detach().double().numpy(), lin.bias.detach().double().numpy()
            h = (h @ w.T + b).astype(np.float16).astype(np.float64)
            peaks.append(np.abs(h).max())
    peaks = np.array(peaks)
    assert np.array_equal(np.isfinite(run.peak), np.isfinite(peaks))
    assert not np.isfinite(run.peak).all()  # this network overflows in the forward pass
    ok = np.isfinite(peaks)
    assert np.allclose(run.peak[ok], peaks[ok], rtol=1e-2)


def test_scaler_in_front_names_bad_arguments():
    with pytest.raises(ValueError, match="steps"):
        scaler_in_front(8, 0)
    with pytest.raises(ValueError, match="init_scale"):
        scaler_in_front(8, 2, init_scale=-1.0)


# --------------------------------------------------------------------------- scale_actions


def test_scale_actions_of_the_chapter_trace():
    stream = np.full(20, 2e-3)
    stream[[6, 7, 15]] = 2.0
    actions = scale_actions(scaling.trace_dynamic_scaling(stream, "float16", growth_interval=4))
    assert actions[:4] == ["step"] * 3 + ["step; grow to 131072"]
    assert actions[6:9] == ["skip; shrink to 65536", "skip; shrink to 32768", "step"]
    assert actions[15] == "skip; shrink to 32768" and actions[-1] == "step"


def test_scale_actions_against_gradscaler():
    rng = np.random.default_rng(3)
    flags = rng.random(300) < 0.15
    scales = _gradscaler_scales(flags, init_scale=2.0**10, growth_interval=3)
    actions = scale_actions(ScaleHistory(np.array(scales[:-1]), flags))
    for k, (bad, act) in enumerate(zip(flags, actions, strict=True)):
        before, after = scales[k], scales[k + 1]
        last = k == flags.size - 1
        if bad:
            assert act == ("skip" if last else f"skip; shrink to {after:g}")
            assert after == before / 2
        elif after > before and not last:
            assert act == f"step; grow to {after:g}"
        else:
            assert act == "step"
    assert any(a.startswith("step; grow") for a in actions)


def test_scale_actions_of_a_static_scale_never_say_shrink():
    # A static scaler skips a step with inf/NaN gradients and keeps S: nothing shrinks.
    flags = np.array([False, True, True, False, True, False])
    scales = _gradscaler_scales(flags, scaling.StaticLossScaler(2.0**16))[:-1]
    actions = scale_actions(ScaleHistory(np.array(scales), flags))
    assert scales == [2.0**16] * flags.size
    assert actions == ["step", "skip", "skip", "step", "skip", "step"]


def test_scale_actions_say_shrink_only_where_gradscaler_shrinks():
    # GradScaler's scale stops halving at float32's smallest value: a skip that keeps S.
    flags = np.ones(160, dtype=bool)
    scales = _gradscaler_scales(flags, init_scale=1.0)
    actions = scale_actions(ScaleHistory(np.array(scales[:-1]), flags))
    for k, act in enumerate(actions[:-1]):
        shrank = scales[k + 1] < scales[k]
        assert act == (f"skip; shrink to {scales[k + 1]:g}" if shrank else "skip")
    assert "skip" in actions[:-1] and any("shrink" in a for a in actions)


# --------------------------------------------------------------------------- grads_identical


def _log(grads) -> TrainLog:
    return TrainLog("x", np.zeros(len(grads)), ScaleHistory(np.ones(len(grads)),
                                                            np.zeros(len(grads), bool)), grads)


def test_grads_identical_against_numpy_nan_aware_equality():
    rng = np.random.default_rng(0)
    steps_a, steps_b = [], []
    for k in range(40):
        a = rng.standard_normal(6).astype(np.float32)
        b = a.copy()
        if k % 4 == 1:
            b[rng.integers(6)] = np.nan
        if k % 4 == 2:
            a[1] = b[1] = np.nan  # NaN in the same place: equal
        if k % 4 == 3:
            a[0], b[2] = np.nan, np.nan  # NaNs in different places: not equal
        steps_a.append([torch.from_numpy(a)])
        steps_b.append([torch.from_numpy(b)])
    got = grads_identical(_log(steps_a), _log(steps_b))
    want = [np.array_equal(a[0].numpy(), b[0].numpy(), equal_nan=True)
            for a, b in zip(steps_a, steps_b, strict=True)]
    assert got == want and True in got and False in got
    # ... which for these arrays (one NaN bit pattern, no -0.0) is byte equality.
    assert got == [a[0].numpy().tobytes() == b[0].numpy().tobytes()
                   for a, b in zip(steps_a, steps_b, strict=True)]


def _bits32(*patterns) -> torch.Tensor:
    """float32 tensor holding these IEEE bit patterns (int32 view of the buffer)."""
    return torch.from_numpy(np.array(patterns, dtype=np.uint32).view(np.float32).copy())


def test_grads_identical_compares_bit_patterns():
    plus_zero, minus_zero = _bits32(0x3F800000, 0x00000000), _bits32(0x3F800000, 0x80000000)
    quiet, payload = _bits32(0x7FC00000), _bits32(0x7FC00001)  # two NaNs
    assert plus_zero.tolist() == minus_zero.tolist()  # equal values ...
    assert np.isnan(quiet.numpy()).all() and np.isnan(payload.numpy()).all()
    # ... but other bits: neither -0.0 for 0.0 nor another NaN payload is identical.
    got = grads_identical(_log([[plus_zero], [quiet], [quiet], [plus_zero]]),
                          _log([[minus_zero], [payload], [quiet.clone()], [plus_zero.double()]]))
    assert got == [False, False, True, False]  # the last: same values, another dtype
    assert grads_identical(_log([[torch.zeros(2, 3)]]), _log([[torch.zeros(3, 2)]])) == [False]


def test_grads_identical_needs_the_gradients():
    with pytest.raises(ValueError, match="keep_grads"):
        grads_identical(_log([]), _log([]))


# --------------------------------------------------------------------------- train_amp


@pytest.fixture(scope="module")
def task():
    return scaling.make_regression_task(seed=0)


def test_train_amp_logs_the_true_norm_of_the_averaged_loss(task):
    factory, x, y = task
    # At the zero start the gradient of mean((xW^T + b - y)^2) is -2/N (y^T x, sum y).
    n = y.numel()
    xd, yd = x.double().numpy(), y.double().numpy()
    true = np.sqrt(((2 / n * yd.T @ xd) ** 2).sum() + ((2 / n * yd.sum(0)) ** 2).sum())
    for accum, s in [(1, 2.0**20), (2, 2.0**20), (2, 2.0**24)]:
        log, _, _ = train_amp(factory, x, y, torch.amp.GradScaler("cpu", init_scale=s), 1,
                              accum=accum, max_norm=1.0)
        assert not log[0].skipped and log[0].scale == s
        assert log[0].norm == pytest.approx(true, rel=2e-3)  # float16 inputs and products


def test_train_amp_book_scaler_and_gradscaler_agree_and_resume(task):
    factory, x, y = task
    kw = {"init_scale": 2.0**34, "growth_interval": 2}
    log_t, model_t, ckpt = train_amp(factory, x, y, torch.amp.GradScaler("cpu", **kw), 12,
                                     max_norm=3e-5)
    log_b, model_b, _ = train_amp(factory, x, y, DynamicLossScaler(**kw), 12, max_norm=3e-5)
    assert log_t == log_b and torch.equal(model_t.weight, model_b.weight)
    assert all(isinstance(e, AmpStep) for e in log_t)
    skipped = [e.skipped for e in log_t]
    assert any(skipped) and not all(skipped)
    assert all((e.norm is None) == e.skipped for e in log_t)
    # The schedule counts updates only: lr = 0.5 * 0.5^(updates // 4).
    for k, e in enumerate(log_t):
        updates = sum(not s for s in skipped[:k + 1])
        assert e.lr == 0.5 * 0.5 ** (updates // 4)
    # Stopped at step 5 and resumed with a fresh default scaler: the checkpoint carries S.
    _, _, half = train_amp(factory, x, y, torch.amp.GradScaler("cpu", **kw), 5, max_norm=3e-5)
    log_r, model_r, _ = train_amp(factory, x, y, torch.amp.GradScaler("cpu"), 12, half,
                                  max_norm=3e-5)
    assert log_r == log_t[5:] and torch.equal(model_r.weight, model_t.weight)
    # The checkpoint returned after 12 steps resumes with nothing left to do.
    log_done, model_done, _ = train_amp(factory, x, y, torch.amp.GradScaler("cpu"), 12, ckpt)
    assert log_done == [] and torch.equal(model_done.weight, model_t.weight)


def test_train_amp_names_bad_arguments(task):
    factory, x, y = task
    with pytest.raises(ValueError, match="accum"):
        train_amp(factory, x, y, DynamicLossScaler(), 1, accum=0)
    with pytest.raises(ValueError, match="max_norm"):
        train_amp(factory, x, y, DynamicLossScaler(), 1, max_norm=0.0)


@pytest.mark.parametrize("accum", [3, 5, 7, 48, 65])
def test_train_amp_refuses_unequal_micro_batches(task, accum):
    factory, x, y = task
    assert len(x) == 64 and len(x) % accum  # chunk(accum) would give unequal pieces
    assert {len(c) for c in x.chunk(accum)} != {len(x) // accum}
    divisors = ", ".join(str(d) for d in range(1, 65) if 64 % d == 0)
    with pytest.raises(ValueError, match=f"accum.*{accum}.*valid choices: {divisors}$"):
        train_amp(factory, x, y, DynamicLossScaler(), 1, accum=accum)


def test_train_amp_refuses_to_resume_before_the_checkpoint(task):
    factory, x, y = task
    first = torch.amp.GradScaler("cpu", init_scale=2.0**20)
    _, _, ckpt = train_amp(factory, x, y, first, 12)
    fresh = torch.amp.GradScaler("cpu")
    with pytest.raises(ValueError, match="steps must be >= 12; got steps=8"):
        train_amp(factory, x, y, fresh, 8, ckpt)
    assert fresh.state_dict() == torch.amp.GradScaler("cpu").state_dict()  # left as it was
    with pytest.raises(ValueError, match="steps"):
        train_amp(factory, x, y, torch.amp.GradScaler("cpu"), -1)


def test_chapter_5_shows_the_loop_that_runs():
    """Every code line of the loop printed in chapter 5's prose is a line of train_amp."""
    nb = nbformat.read(ROOT / "notebooks" / "05-loss-scaling.ipynb", as_version=4)
    text = next(c.source for c in nb.cells
                if c.cell_type == "markdown" and "`scaling_runs.train_amp` is that loop" in c.source)
    shown = re.search(r"```python\n(.*?)```", text, re.S).group(1)
    source = {line.strip() for line in inspect.getsource(train_amp).splitlines()}
    lines = [line.strip() for line in shown.splitlines() if line.strip()]
    assert len(lines) >= 10 and all(line in source for line in lines)
