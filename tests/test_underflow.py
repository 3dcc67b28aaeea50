"""Tests for precisionlab.underflow.

Oracles: exact rational arithmetic (fractions.Fraction) for the attenuation model, float64
backpropagation written out by hand (NumPy) for the network's gradients, orthogonality
(W^T W = a^2 I) and LAPACK's QR for the initialisation, scalar math.log/math.fsum for the
portable random draws and norms, torch's native kernels for the emulated network, and the
float16 network itself for the model's predicted underflow depth.
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from precisionlab import emulate
from precisionlab.formats import get_format
from precisionlab.rounding import round_to
from precisionlab.underflow import (
    FLOORS,
    AttenuatingNet,
    ForwardPass,
    GradientStats,
    LayerGradients,
    diagnose,
    first_underflow_depth,
    fit_g0,
    floor_value,
    gradient_by_depth,
    health_summary,
    health_table,
    layer_status,
    make_batch,
    measured_underflow_depth,
    predicted_underflow_depth,
    probe_gradients,
    probe_network,
    train_probe,
    zero_counts,
)


def _brute_force_depth(a: float, fmt: str, g0: float, floor: str, limit: int = 5000):
    """Walk k = 0, 1, ... in exact rationals until g0·a^k passes the floor."""
    f = get_format(fmt)
    t = Fraction({"normal": f.min_normal, "subnormal": f.min_subnormal,
                  "zero": f.min_subnormal / 2}[floor])
    x, fa = Fraction(g0), Fraction(a)
    for k in range(limit):
        if (x <= t) if floor == "zero" else (x < t):
            return k
        x *= fa
    return None


# --------------------------------------------------------------------------- the model


@settings(max_examples=300, deadline=None)
@given(a=st.floats(0.05, 0.95), g0=st.floats(1e-6, 10.0),
       fmt=st.sampled_from(["float16", "float8_e5m2", "float8_e4m3fn"]),
       floor=st.sampled_from(FLOORS))
def test_first_underflow_depth_matches_exact_walk(a, g0, fmt, floor):
    assert first_underflow_depth(a, fmt, g0, floor) == _brute_force_depth(a, fmt, g0, floor)


@settings(max_examples=40, deadline=None)
@given(a=st.floats(0.3, 0.8), floor=st.sampled_from(FLOORS))
def test_first_underflow_depth_matches_exact_walk_bfloat16(a, floor):
    assert first_underflow_depth(a, "bfloat16", 1.0, floor) == \
        _brute_force_depth(a, "bfloat16", 1.0, floor)


def test_exact_ties_at_the_floors():
    # 0.5^25 = 2^-25 = q/2 exactly: ties-to-even sends it to 0, so the 'zero' floor counts it.
    assert first_underflow_depth(0.5, "float16", 1.0, "zero") == 25
    assert first_underflow_depth(0.5, "float16", 1.0, "subnormal") == 25  # 2^-25 < 2^-24
    assert first_underflow_depth(0.5, "float16", 1.0, "normal") == 15  # 2^-15 < 2^-14
    assert float(torch.tensor(2.0**-25).to(torch.float16)) == 0.0
    assert float(torch.tensor(2.0**-25 * (1 + 2**-20)).to(torch.float16)) == 2.0**-24


def test_checkpoint_question_96_layers_at_0_82():
    # 0.82^k against the float16 floors, starting from a gradient of 1 at the output.
    assert first_underflow_depth(0.82, "float16", 1.0, "normal") == 49
    assert first_underflow_depth(0.82, "float16", 1.0, "subnormal") == 84
    assert first_underflow_depth(0.82, "float16", 1.0, "zero") == 88
    assert 0.82**83 >= 2.0**-24 > 0.82**84 and 0.82**87 > 2.0**-25 >= 0.82**88
    assert first_underflow_depth(0.82, "bfloat16", 1.0, "zero") > 96


def test_never_and_immediately():
    assert first_underflow_depth(1.0, "float16", 1.0) is None
    assert first_underflow_depth(1.3, "float16", 1e-9) == 0  # already below the floor
    assert first_underflow_depth(0.9, "float16", 2.0**-25, "zero") == 0


def test_gradient_by_depth_and_floors():
    g = gradient_by_depth(0.82, 96, 0.5)
    assert g.shape == (96,) and g[0] == 0.5
    assert np.allclose(g, [0.5 * 0.82**k for k in range(96)], rtol=1e-13, atol=0)
    assert floor_value("float16", "zero") == 2.0**-25
    assert floor_value("fp16", "subnormal") == 2.0**-24
    assert floor_value("bfloat16", "normal") == 2.0**-126


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda: first_underflow_depth(0.0), "attenuation"),
        (lambda: first_underflow_depth(math.nan), "attenuation"),
        (lambda: first_underflow_depth(0.8, g0=-1.0), "g0"),
        (lambda: first_underflow_depth(0.8, floor="tiny"), "valid choices: normal, subnormal, zero"),
        (lambda: first_underflow_depth(0.8, "fp7"), "valid choices"),
        (lambda: gradient_by_depth(0.8, 0), "depth"),
        (lambda: AttenuatingNet(4, 4, 0.8, "float8_e5m2"), "valid choices for a real network"),
        (lambda: AttenuatingNet(0, 4, 0.8), "depth"),
        (lambda: AttenuatingNet(4, 4, 0.8, backend="gpu"), "valid choices: emulated, native"),
        (lambda: train_probe(0.8, 4, steps=0), "steps"),
    ],
)
def test_bad_input_is_named(call, match):
    with pytest.raises(ValueError, match=match):
        call()


# --------------------------------------------------------------------------- the network


def test_initialisation_sets_the_attenuation():
    net = AttenuatingNet(12, 32, 0.7, "float32", seed=3)
    for lin in net.layers:
        w = lin.weight.detach().double()
        assert torch.allclose(w.T @ w, 0.49 * torch.eye(32, dtype=torch.float64), atol=1e-6)
    x, t = make_batch(32, 8, "float32", seed=3)
    g = probe_gradients(net, x, t)
    ratios = g.signal.norm[1:] / g.signal.norm[:-1]
    assert np.allclose(ratios, 0.7, rtol=1e-5)  # exactly a per layer, up to float32 rounding


def test_forward_signal_stays_at_unit_scale():
    net = AttenuatingNet(60, 64, 0.82, "float32", seed=0)
    x, _ = make_batch(64, 64, "float32", seed=0)
    with torch.no_grad():
        h = x
        for lin in net.layers:
            h = lin(h)
            assert 0.7 < float(h.pow(2).mean().sqrt()) < 1.3


def _float64_backprop(net: AttenuatingNet, x, t):
    """(signal norms, weight-gradient norms, weight-gradient medians, loss) by hand in float64."""
    W = [lin.weight.detach().double().numpy() for lin in net.layers]
    b = [lin.bias.detach().double().numpy() for lin in net.layers]
    hs = [x.double().numpy()]
    for Wi, bi in zip(W, b, strict=True):
        hs.append(hs[-1] @ Wi.T + bi)
    delta = 2 * (hs[-1] - t.double().numpy()) / hs[-1].size  # d mean((h - t)^2) / dh
    sig_norm, w_norm, w_med = [], [], []
    for i in reversed(range(len(W))):  # depth 0 is the last layer
        sig_norm.append(np.linalg.norm(delta))
        gw = delta.T @ hs[i]
        w_norm.append(np.linalg.norm(gw))
        w_med.append(np.median(np.abs(gw)))
        delta = delta @ W[i]
    return sig_norm, w_norm, w_med, np.mean((hs[-1] - t.double().numpy()) ** 2)


def test_probe_matches_float64_backprop_by_hand():
    net = AttenuatingNet(10, 16, 0.8, "float32", seed=5)
    x, t = make_batch(16, 4, "float32", seed=5)
    got = probe_gradients(net, x, t)
    sig_norm, w_norm, w_med, loss = _float64_backprop(net, x, t)
    assert np.allclose(got.signal.norm, sig_norm, rtol=1e-4)
    assert np.allclose(got.weight.norm, w_norm, rtol=1e-4)
    assert np.allclose(got.weight.median_abs, w_med, rtol=1e-4)
    assert got.loss == pytest.approx(loss, rel=1e-5)


def test_probe_network_is_one_pass_of_the_seeded_network_and_batch():
    # Oracle: float64 backpropagation by hand through AttenuatingNet(depth, width, a, seed) on
    # make_batch(width, batch, seed); a swapped argument or seed changes the numbers.
    got = probe_network(0.8, "float32", 10, 16, 4, seed=5)
    sig_norm, w_norm, _, loss = _float64_backprop(
        AttenuatingNet(10, 16, 0.8, "float32", seed=5), *make_batch(16, 4, "float32", seed=5))
    assert got.depth == 10 and got.loss == pytest.approx(loss, rel=1e-5)
    assert np.allclose(got.signal.norm, sig_norm, rtol=1e-4)
    assert np.allclose(got.weight.norm, w_norm, rtol=1e-4)
    other = probe_network(0.8, "float32", 10, 16, 4, seed=6)
    assert not np.allclose(other.signal.norm, sig_norm, rtol=1e-2)
    # The options reach probe_gradients: S = 2^10 is exact in float32 and divided out again.
    scaled = probe_network(0.8, "float32", 10, 16, 4, seed=5, loss_scale=2.0**10)
    assert scaled.loss_scale == 2.0**10 and np.array_equal(scaled.signal.norm, got.signal.norm)
    ftz = probe_network(0.82, "float16", 40, 16, 4, seed=5, flush_to_zero=True)
    plain = probe_network(0.82, "float16", 40, 16, 4, seed=5)
    assert ftz.flush_to_zero and not plain.flush_to_zero
    assert ftz.signal.zero_fraction.sum() > plain.signal.zero_fraction.sum()


def test_zero_counts_counts_layers_by_hand():
    zf = [0, 0.25, 0.5, 1.0, 1.0, 0.0]
    g = _synthetic(zf, [1e-3] * 6, [True] * 6)
    some = sum(1 for z in zf if z > 0)
    every = sum(1 for z in zf if z == 1)
    half = next(k for k, z in enumerate(zf) if z >= 0.5)
    assert zero_counts(g) == (some, every, half) == (4, 2, 2)
    assert zero_counts(_synthetic([0, 0.1], [1e-3] * 2, [True] * 2)) == (1, 0, None)


def _float16_signal_zero_fractions(net: AttenuatingNet, x, t, flush: bool = False) -> np.ndarray:
    """Oracle for the float16 backward pass, in NumPy: per depth, the fraction of exact zeros in dL/dh.

    The entering gradient 2(h - t)/N is rounded once to float16; each layer's input gradient is
    g W with exact float32 products added in k order in float32 (no FMA), then rounded to
    float16 by NumPy's cast. Shares with the package only the forward output h and the weights.
    flush=True: every float16 value below 2^-14 becomes 0, in the forward pass (NumPy's own
    float16 forward, same float32 order) and after each rounding of the backward pass.
    """
    def fl(v):
        v = v.astype(np.float16)
        return np.where(np.abs(v) < np.float16(2.0**-14), np.float16(0), v) if flush else v

    if flush:
        h = fl(x.numpy())
        for lin in net.layers:
            w32 = lin.weight.detach().numpy().astype(np.float32)
            acc = np.zeros((h.shape[0], w32.shape[0]), np.float32)
            h32 = h.astype(np.float32)
            for k in range(w32.shape[1]):
                acc = acc + h32[:, k:k + 1] * w32[:, k][None, :]
            h = fl(acc + lin.bias.detach().numpy().astype(np.float32))
        h = h.astype(np.float64)
    else:
        with torch.no_grad():
            h = net(x).double().numpy()
    delta = fl(2 * (h - t.double().numpy()) / h.size)
    fractions = []
    for lin in reversed(net.layers):
        fractions.append(float(np.mean(delta == 0)))
        d32 = delta.astype(np.float32)
        w32 = lin.weight.detach().numpy().astype(np.float32)
        acc = np.zeros((d32.shape[0], w32.shape[1]), np.float32)
        for k in range(w32.shape[0]):
            acc = acc + d32[:, k:k + 1] * w32[k:k + 1, :]
        delta = fl(acc)
    return np.array(fractions)


def _first_depth_below_half_q(g0: float, a: float) -> int:
    """Oracle for the model: smallest k with g0·a^k <= 2^-25 (float16's q/2), by exact rationals."""
    k, g = 0, Fraction(g0)
    while g > Fraction(2) ** -25:
        g *= Fraction(a)
        k += 1
    return k


@pytest.mark.parametrize("attenuation", [0.7, 0.75, 0.8, 0.82])
@pytest.mark.parametrize("seed", [0, 1])
def test_model_predicts_the_float16_networks_underflow_depth(attenuation, seed):
    """Both depths exactly, each against its own oracle; then the claim relating them."""
    nets = {f: AttenuatingNet(100, 64, attenuation, f, seed) for f in ("float32", "float16")}
    batches = {f: make_batch(64, 16, f, seed) for f in nets}
    probes = {f: probe_gradients(n, *batches[f]) for f, n in nets.items()}
    predicted = predicted_underflow_depth(probes["float32"], attenuation, "float16")
    measured = measured_underflow_depth(probes["float16"])
    g0 = fit_g0(probes["float32"], attenuation)
    assert predicted == _first_depth_below_half_q(g0, attenuation)
    zeros = _float16_signal_zero_fractions(nets["float16"], *batches["float16"])
    np.testing.assert_array_equal(probes["float16"].signal.zero_fraction, zeros)
    assert measured == int(np.flatnonzero(zeros >= 0.5)[0])
    # The chapter's claim: the network underflows at the model's depth or a little later,
    # never earlier. Over seeds 0-7 and these attenuations, 31 of 32 networks land within one
    # layer; seed 1 at a = 0.82 lands two layers deeper (58 against 56).
    assert 0 <= measured - predicted <= 2
    assert measured_underflow_depth(probes["float32"]) is None


def test_flush_to_zero_pass_against_a_numpy_oracle():
    """Flush-to-zero backward pass: every stored entry is 0 or at least 2^-14, and the exact-zero
    shares of dL/dh match a NumPy float16 pass that flushes after every rounding."""
    net = AttenuatingNet(96, 64, 0.82, "float16", seed=0)
    x, t = make_batch(64, 16, "float16", seed=0)
    ftz = probe_gradients(net, x, t, flush_to_zero=True)
    plain = probe_gradients(net, x, t)
    assert ftz.flush_to_zero and not plain.flush_to_zero
    zeros = _float16_signal_zero_fractions(net, x, t, flush=True)
    np.testing.assert_array_equal(ftz.signal.zero_fraction, zeros)
    tiny = get_format("float16").min_normal
    for stats in (ftz.signal, ftz.weight):  # no subnormal median or largest entry anywhere
        for v in (stats.median_abs, stats.max_abs):
            assert ((v == 0) | (v >= tiny)).all()
    assert ((plain.signal.median_abs > 0) & (plain.signal.median_abs < tiny)).any()
    # The chapter's numbers: every entry lost from depth 23, half from depth 18; subnormals
    # (plain float16) keep half until 58 and some until 75.
    assert measured_underflow_depth(ftz, fraction=1.0) == int(np.flatnonzero(zeros == 1)[0]) == 23
    assert measured_underflow_depth(ftz) == 18
    assert (measured_underflow_depth(plain), measured_underflow_depth(plain, fraction=1.0)) == (58, 75)
    # Flushing loses entries earlier than the float32 run's largest entry suggests (depth 27).
    p32 = probe_gradients(AttenuatingNet(96, 64, 0.82, "float32"), *make_batch(64, 16, "float32"))
    assert int(np.flatnonzero(p32.signal.max_abs < tiny)[0]) == 27
    with pytest.raises(ValueError, match="flush_to_zero"):
        probe_gradients(net, x, t, flush_to_zero="yes")


def test_flush_to_zero_changes_nothing_above_the_smallest_normal():
    """With no value near 2^-14 (a short float32 network), flushing is the identity."""
    net = AttenuatingNet(12, 16, 0.8, "float32", seed=3)
    batch = make_batch(16, 4, "float32", seed=3)
    a, b = probe_gradients(net, *batch), probe_gradients(net, *batch, flush_to_zero=True)
    assert np.array_equal(a.signal.norm, b.signal.norm) and np.array_equal(a.weight.norm, b.weight.norm)


def test_bfloat16_and_float32_never_underflow_at_96_layers():
    for fmt in ("bfloat16", "float32"):
        g = probe_gradients(AttenuatingNet(96, 64, 0.82, fmt), *make_batch(64, 16, fmt))
        assert (g.weight.zero_fraction == 0).all() and (g.signal.zero_fraction < 0.01).all()
        assert (layer_status(g) == "healthy").all()


def test_float16_network_has_exact_zeros_only_deep_down():
    g = probe_gradients(AttenuatingNet(96, 64, 0.82, "float16"), *make_batch(64, 16, "float16"))
    status = layer_status(g)
    assert status[0] == "healthy" and status[-1] == "zero"
    # An occasional tiny product, no more: at most 8 of a layer's 4096 entries (depth 19).
    assert g.weight.zero_fraction[:20].max() < 0.0025
    # Once the whole backward signal is zero, every layer below it has zero weight gradients.
    dead = np.flatnonzero(g.signal.zero_fraction == 1)
    assert dead.size and (g.weight.zero_fraction[dead[0]:] == 1).all()


def test_train_probe_keeps_the_format_and_learns():
    p = train_probe(0.82, 64, "float16", steps=4, lr=0.1)
    assert p.fmt == "float16" and p.loss.shape == (4,) and p.loss[-1] < p.loss[0]
    assert p.zero_fraction().shape == (4, 64) and p.norm("signal").shape == (4, 64)


def test_train_probe_with_float32_master_weights_against_a_numpy_loop():
    """master=True: m <- fl32(m - lr g) in NumPy float64 then one cast, the network's weights
    fl16(m) by NumPy's cast; the same losses and gradient statistics, step by step."""
    steps, lr = 3, 0.1
    got = train_probe(0.82, 24, "float16", steps=steps, lr=lr, seed=2, master=True)
    plain = train_probe(0.82, 24, "float16", steps=steps, lr=lr, seed=2)
    net = AttenuatingNet(24, 64, 0.82, "float16", 2)
    x, t = make_batch(64, 16, "float16", 2)
    masters = [p.detach().numpy().astype(np.float32) for p in net.parameters()]
    for k in range(steps):
        rec = probe_gradients(net, x, t)
        assert rec.loss == got.loss[k]
        np.testing.assert_array_equal(rec.weight.norm, got.steps[k].weight.norm)
        with torch.no_grad():
            for i, p in enumerate(net.parameters()):
                g = p.grad.numpy().astype(np.float64)
                masters[i] = (masters[i].astype(np.float64) - lr * g).astype(np.float32)
                p.copy_(torch.from_numpy(masters[i].astype(np.float16).astype(np.float32)))
    # Updates below half a float16 ulp of a weight are lost without master weights and kept with
    # them, so the two runs part ways after the first step.
    assert got.loss[0] == plain.loss[0] and (got.loss != plain.loss).any()
    with pytest.raises(ValueError, match="master must be True or False"):
        train_probe(0.82, 4, "float16", steps=1, master="yes")
    with pytest.raises(ValueError, match="backend='emulated' only"):
        train_probe(0.82, 4, "float16", steps=1, master=True, backend="native")


# --------------------------------------------------------------------------- portability


def _box_muller(generator: torch.Generator, n: int) -> np.ndarray:
    """n N(0, 1) draws from the formula, sqrt(-2 ln(1 - u1)) cos(2 pi u2) with math.log and
    math.cos, on the next 2n float64 uniforms of `generator` (u1 the first n, u2 the next n)."""
    u = torch.rand(2, n, generator=generator, dtype=torch.float64).tolist()
    return np.array([math.sqrt(-2.0 * math.log(1.0 - a)) * math.cos(2.0 * math.pi * b)
                     for a, b in zip(u[0], u[1], strict=True)])


def test_batch_draws_are_box_muller_on_torch_uniforms():
    # make_batch's x and t: the next Box-Muller draws of a stream seeded by seed + 10000,
    # rounded once to the format; math.log/math.cos against the package's float64 functions
    # may move a float64 last bit, so allow one float32 ulp.
    x, t = make_batch(5, 3, "float32", seed=7)
    g = torch.Generator().manual_seed(7 + 10_000)
    want_x, want_t = _box_muller(g, 15), _box_muller(g, 15)
    np.testing.assert_allclose(x.reshape(-1).numpy(), np.float32(want_x), rtol=2**-23, atol=0)
    np.testing.assert_allclose(t.reshape(-1).numpy(), np.float32(want_t), rtol=2**-23, atol=0)
    big = _box_muller(torch.Generator().manual_seed(0), 200_000)
    z = emulate.randn(200_000, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    np.testing.assert_allclose(z.numpy(), big, rtol=1e-13, atol=1e-13)


def test_orthogonal_matrices_match_lapack_qr():
    from precisionlab.underflow import orthonormal_columns

    a = emulate.randn(4, 24, 24, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    q = orthonormal_columns(a)
    ref, r = torch.linalg.qr(a)
    ref = ref * torch.sign(torch.diagonal(r, dim1=-2, dim2=-1)).unsqueeze(-2)  # diag(R) > 0
    assert torch.allclose(q, ref, atol=1e-10, rtol=0)


def test_every_format_stores_the_float64_network_rounded_once():
    nets = {f: AttenuatingNet(6, 16, 0.8, f, seed=2) for f in ("float32", "bfloat16", "float16")}
    for f, net in nets.items():
        for lin, lin32 in zip(net.layers, nets["float32"].layers, strict=True):
            assert lin.weight.dtype == torch.float32
            assert torch.equal(lin.weight, torch.as_tensor(round_to(lin.weight.double(), f)))
            assert torch.allclose(lin.weight, lin32.weight, rtol=2.0**-get_format(f).mantissa_bits,
                                  atol=0)


def test_stats_norm_is_the_exactly_rounded_sum_to_float64_accuracy():
    rng = np.random.default_rng(0)
    ts = [torch.from_numpy(rng.standard_normal((16, 64)) * 10.0**rng.integers(-8, 3))
          for _ in range(5)]
    stats = GradientStats.of(ts)
    want = [math.sqrt(math.fsum(float(v) ** 2 for v in t.reshape(-1))) for t in ts[::-1]]
    assert np.allclose(stats.norm, want, rtol=1e-14, atol=0)


def test_gradient_entering_the_network_is_in_its_format():
    g = probe_gradients(AttenuatingNet(8, 16, 0.8, "float16"), *make_batch(16, 4, "float16"))
    top = g.signal.max_abs  # an entry of each layer's dL/dh, depth 0 (the loss's own) included
    assert np.array_equal(np.asarray(round_to(top, "float16")), top)


@pytest.mark.parametrize("fmt", ["float32", "bfloat16", "float16"])
def test_native_backend_runs_torch_kernels_on_the_same_network(fmt):
    emu = AttenuatingNet(30, 32, 0.7, fmt, seed=4)
    nat = AttenuatingNet(30, 32, 0.7, fmt, seed=4, backend="native")
    for a, b in zip(emu.layers, nat.layers, strict=True):
        assert torch.equal(a.weight, b.weight) and torch.equal(a.bias, b.bias)
    batch = make_batch(32, 8, fmt, seed=4)
    ge, gn = probe_gradients(emu, *batch), probe_gradients(nat, *batch)
    assert gn.fmt == ge.fmt == fmt
    # Different kernels, different rounding: close, not necessarily equal.
    tol = 1e-5 if fmt == "float32" else 0.1
    assert ge.loss == pytest.approx(gn.loss, rel=tol)
    assert np.allclose(ge.signal.norm[:10], gn.signal.norm[:10], rtol=tol, atol=0)
    p = train_probe(0.82, 24, fmt, steps=2, backend="native")
    assert p.loss.shape == (2,) and np.isfinite(p.loss).all()


# --------------------------------------------------------------------------- diagnosis


def _synthetic(zero_fraction, median, finite, fmt="float16"):
    n = len(zero_fraction)
    stats = GradientStats(norm=np.ones(n), median_abs=np.array(median, dtype=float),
                          max_abs=np.ones(n), zero_fraction=np.array(zero_fraction, dtype=float),
                          finite=np.array(finite))
    return LayerGradients(fmt, 1.0, stats, stats)


def test_layer_status_follows_the_documented_rules():
    g = _synthetic([0, 0.2, 0.5, 1.0, 0.0], [1e-3, 1e-6, 0, 0, 1.0],
                   [True, True, True, True, False])
    assert layer_status(g).tolist() == ["healthy", "subnormal", "underflowing", "zero",
                                        "non-finite"]
    # The same numbers are healthy in bfloat16, whose smallest normal is 2^-126.
    assert layer_status(g, fmt="bfloat16")[1] == "healthy"


def test_diagnose_names_each_cause():
    under = probe_gradients(AttenuatingNet(96, 64, 0.82, "float16"),
                            *make_batch(64, 16, "float16"))
    d = diagnose([under.loss], under)
    assert d.cause == "underflow" and "depth 0 still has" in d.evidence
    assert "2^16" in d.first_check  # the one-step test that tells underflow from a cut graph
    over = train_probe(1.2, 48, "float16", steps=2)
    assert not np.isfinite(over.loss).all()
    d_over = diagnose(over.loss, over.steps[-1])
    assert d_over.cause == "overflow" and "no loss scaler (S = 1)" in d_over.evidence
    assert "lower" not in d_over.first_fix  # with S = 1 there is no scale to lower
    ok = probe_gradients(AttenuatingNet(96, 64, 0.82, "bfloat16"),
                         *make_batch(64, 16, "bfloat16"))
    assert diagnose([ok.loss], ok).cause == "none"
    assert "likely cause : underflow" in str(d)


def _scaler_run(net, batch, steps, init_scale=2.0**16):
    """A dynamic scaler (GradScaler's rule, scaling.update_scale) driving probe_gradients."""
    from precisionlab.scaling import ScaleHistory, update_scale

    s, tracker, scales, skipped, losses = init_scale, 0, [], [], []
    for _ in range(steps):
        p = probe_gradients(net, *batch, loss_scale=s)
        bad = not (np.isfinite(p.loss) and p.weight.finite.all() and p.signal.finite.all())
        scales.append(s)
        skipped.append(bad)
        losses.append(p.loss)
        s, tracker = update_scale(s, tracker, bad)
    return p, losses, ScaleHistory(np.array(scales), np.array(skipped))


def test_diagnose_tells_a_collapsing_scale_from_a_scaler_at_work():
    from precisionlab.scaling import simulate_scale_history

    # Forward activations past 65504: the loss is NaN at every scale and the scale halves
    # every step; this is not an overflow a lower loss scale can fix.
    deep = AttenuatingNet(56, 64, 1.2, "float16")
    batch = make_batch(64, 16, "float16")
    p, losses, hist = _scaler_run(deep, batch, 12)
    assert hist.skipped.all() and np.isnan(losses).all()
    d = diagnose(losses, p, scale_history=hist)
    assert d.cause == "scale collapsing" and "2^10 to 2^5" in d.evidence
    assert "forward" in d.first_check and "trades the overflow for underflow" in d.first_fix
    # The 48-layer network overflows only backward: the scaler settles, but below 1.
    p48, losses48, hist48 = _scaler_run(AttenuatingNet(48, 64, 1.2, "float16"), batch, 26)
    assert hist48.skipped[:-1].all() and not hist48.skipped[-1] and hist48.scale[-1] == 2.0**-9
    assert diagnose(losses48, p48, scale_history=hist48).cause == "scale collapsing"
    # A too-high start (chapter 5: 2^36, five skips) and rare probing skips are not collapse.
    fine = probe_gradients(AttenuatingNet(20, 64, 0.82, "float16"), *batch)
    start = simulate_scale_history([True] * 5 + [False] * 40, init_scale=2.0**36, growth_interval=5)
    assert diagnose([fine.loss], fine, scale_history=start).cause == "none"
    # However short the record: five skips from 2^36, then the first good step at 2^31.
    for good in (1, 2, 3):
        short = simulate_scale_history([True] * 5 + [False] * good, init_scale=2.0**36)
        assert short.scale[-1] == 2.0**31
        assert diagnose([fine.loss], fine, scale_history=short).cause == "none"
    # Skips that go on after the first good step, halving the scale, are a collapse.
    relapse = simulate_scale_history([True] * 3 + [False] * 3 + [True] * 6, init_scale=2.0**36)
    assert diagnose([fine.loss], fine, scale_history=relapse).cause == "scale collapsing"
    probing = simulate_scale_history(([False] * 9 + [True]) * 10, growth_interval=9)
    assert diagnose([fine.loss], fine, scale_history=probing).cause == "none"
    # A non-finite step under a steady scaler is an overflow the scaler handles by skipping.
    over = probe_gradients(AttenuatingNet(48, 64, 1.2, "float16"), *batch, loss_scale=2.0**16)
    d_ok = diagnose([over.loss], over, scale_history=probing)
    assert d_ok.cause == "overflow" and d_ok.first_fix.startswith("none while skips stay rare")
    assert "S = 65536" in diagnose([over.loss], over).evidence
    with pytest.raises(ValueError, match="scale_history"):
        diagnose([fine.loss], fine, scale_history=simulate_scale_history([]))


def test_tables_list_what_they_claim():
    g = _synthetic([0, 0, 0.6, 1.0], [1e-3, 1e-3, 0, 0], [True] * 4)
    table = health_table(g)
    text = table.to_text()  # header, rule, one line per layer
    assert len(text.splitlines()) == 6 and text.splitlines()[-1].endswith("zero")
    assert [r[-1] for r in table.rows] == ["healthy", "healthy", "underflowing", "zero"]
    sig = GradientStats(norm=np.ones(4), median_abs=np.ones(4), max_abs=np.ones(4),
                        zero_fraction=np.array([0, 0.125, 0.25, 0.5]), finite=np.ones(4, bool))
    mixed = LayerGradients("float16", 1.0, g.weight, sig)
    # depth, layer, norm, median, max, dL/dW zeros, signal zeros, status: by hand
    assert list(health_table(mixed, depths=[2]).rows[0]) == \
        ["2", "1", "1", "0", "1", "60.0%", "25.0%", "underflowing"]
    assert "<table" in table._repr_html_() and max(map(len, text.splitlines())) <= 80
    assert health_table(g, depths=[3]).to_text().splitlines()[2].split()[:2] == ["3", "0"]
    summary = health_summary(g).splitlines()
    assert [line.split()[1] for line in summary] == ["0-1", "2-2", "3-3"]
    # A layer that dips back below a threshold does not open a new range.
    flicker = _synthetic([0, 0.6, 0.4, 0.7, 1.0], [1e-3, 0, 6e-8, 0, 0], [True] * 5)
    assert [line.split()[1:3] for line in health_summary(flicker).splitlines()] == \
        [["0-0", "healthy"], ["1-3", "underflowing"], ["4-4", "zero"]]
    with pytest.raises(ValueError, match="outside"):
        health_table(g, depths=[7])


def test_fit_g0_recovers_the_intercept_of_an_exact_profile():
    k = np.arange(40)
    med = 3e-3 * 0.8**k
    med[5] = 1.0  # one atypical layer does not move the median-based fit
    stats = GradientStats(np.ones(40), med, np.ones(40), np.zeros(40), np.ones(40, bool))
    g = LayerGradients("float32", 1.0, stats, stats)
    assert fit_g0(g, 0.8) == pytest.approx(3e-3, rel=1e-12)
    assert predicted_underflow_depth(g, 0.8) == first_underflow_depth(0.8, "float16", 3e-3)


# --------------------------------------------------------------------------- figures and widgets


def test_underflow_figures_draw_what_they_claim():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from precisionlab import plotting

    ax = plotting.plot_attenuation_model(0.82, 96, "float16", 1.0)
    labels = [line.get_label() for line in ax.get_lines()]
    assert any("past q/2: 88" in lab for lab in labels) and any("normal: 49" in lab for lab in labels)
    probes = {f: probe_gradients(AttenuatingNet(40, 16, 0.7, f), *make_batch(16, 4, f))
              for f in ("float32", "float16")}
    ax = plotting.plot_layer_gradients(probes, "signal", model=(0.7, 1e-3))
    assert {"float32", "float16", "model g0·a^k (a = 0.7)"} <= {ln.get_label() for ln in ax.get_lines()}
    ax = plotting.plot_zero_fraction(probes, "both")
    assert len([ln for ln in ax.get_lines() if ln.get_label().startswith("float16")]) == 2
    plt.close("all")


def test_underflow_view_and_explorer(capsys):
    import ipywidgets

    from precisionlab import widgets

    panel, fig = widgets.underflow_view(0.82, 96, "float16", 1.0)
    assert "model, first depth rounds to exactly 0         : 88" in panel.text
    assert len(fig.axes) == 1
    panel, _ = widgets.underflow_view(0.82, 96, "float16", network=True)
    assert "network, first depth with >= half zeros in dL/dh : 58" in panel.text
    explorer = widgets.underflow_explorer()
    assert "88" in explorer.default_panel.text
    box = explorer.widget()
    assert isinstance(box, ipywidgets.VBox)
    explorer.controls["attenuation"].value = 0.7  # the callback redraws
    assert "model, first depth rounds to exactly 0         : 49" in box.children[1].value
    # e5m2 has no real network: the view says so instead of drawing
    with pytest.raises(ValueError, match="network runs only in"):
        widgets.underflow_view(fmt="float8_e5m2", network=True)
    for kwargs, match in [({"attenuation": 1.2}, "attenuation"), ({"depth": 1}, "depth"),
                          ({"g0": -1.0}, "g0"), ({"fmt": "fp7"}, "valid choices")]:
        with pytest.raises(ValueError, match=match):
            widgets.underflow_view(**kwargs)


# --------------------------------------------------------------------------- one forward, many backward


@pytest.mark.parametrize("depth, a, fmt, ftz, backend", [
    (24, 1.4, "float16", False, "emulated"), (30, 0.82, "float16", True, "emulated"),
    (12, 0.7, "bfloat16", False, "emulated"), (10, 1.3, "float32", False, "emulated"),
    (16, 1.2, "float16", False, "native")])
def test_forward_pass_backward_is_a_fresh_probe_at_every_scale(depth, a, fmt, ftz, backend):
    # Oracle: probe_gradients, one fresh forward and backward pass per scale. The kept graph
    # and the reset gradients change no bit, in any order of scales, overflowing ones too.
    net = AttenuatingNet(depth, 32, a, fmt, seed=2, backend=backend)
    batch = make_batch(32, 8, fmt, seed=2)
    forward = ForwardPass(net, *batch, flush_to_zero=ftz)
    verdicts = set()
    for s in (2.0**16, 1.0, 2.0**-5, 3.0, 2.0**-20, 2.0**16):
        fresh = probe_gradients(net, *batch, loss_scale=s, flush_to_zero=ftz)
        got = forward.backward(s)
        assert got.same_bits(fresh), s
        assert got.loss == forward.loss and got.loss_scale == s and got.flush_to_zero == ftz
        # Stopped at the first inf/NaN: None exactly when a weight gradient or a signal of the
        # full pass is not finite (the bias gradients are not looked at), else the same pass.
        checked = forward.backward(s, stop_at_nonfinite=True)
        finite = bool(fresh.weight.finite.all() and fresh.signal.finite.all())
        assert (checked is not None) == finite, s
        assert checked is None or checked.same_bits(fresh)
        verdicts.add(finite)
        assert forward.backward(s).same_bits(fresh)  # a stopped pass leaves nothing behind
    assert verdicts == ({True, False} if a > 1 and fmt == "float16" else {True})
    if not ftz:
        with torch.no_grad():  # the peaks are those of a plain forward pass
            h, peak = batch[0], []
            for lin in net.layers:
                h = lin(h)
                peak.append(float(h.abs().max()))
        assert forward.peak().tobytes() == np.array(peak).tobytes()
    with pytest.raises(ValueError, match="loss_scale"):
        forward.backward(0.0)
    with pytest.raises(ValueError, match="flush_to_zero"):
        ForwardPass(net, *batch, flush_to_zero="no")


def test_layer_gradients_arrays_round_trip_and_compare_bits():
    g = probe_gradients(AttenuatingNet(6, 16, 0.9, "float16"), *make_batch(16, 4, "float16"))
    arrays = g.arrays()
    assert set(arrays) == {"loss"} | {f"{w}.{n}" for w in ("weight", "signal")
                                      for n in ("norm", "median_abs", "max_abs",
                                                "zero_fraction", "finite")}
    back = LayerGradients.from_arrays("fp16", arrays)
    assert back.fmt == "float16" and back.same_bits(g) and g.same_bits(back)
    nudged = dict(arrays, **{"signal.norm": np.nextafter(arrays["signal.norm"], 1.0)})
    assert not LayerGradients.from_arrays("float16", nudged).same_bits(g)
    assert not LayerGradients.from_arrays("float16", arrays, loss_scale=2.0).same_bits(g)
    assert not LayerGradients.from_arrays("bfloat16", arrays).same_bits(g)
    negzero = dict(arrays, loss=np.array(-0.0)), dict(arrays, loss=np.array(0.0))
    a, b = (LayerGradients.from_arrays("float16", d) for d in negzero)
    assert a.loss == b.loss and not a.same_bits(b)  # bits, not values
