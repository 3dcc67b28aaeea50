"""precisionlab.emulate: the cases a mutation run found unchecked (scripts/mutation_run.py).

Defaults, the native back end against torch's own op in the same dtype, optional operands
(no bias, no weight, a bias that needs no gradient), inputs of more than two dimensions, the
float32 format (where a float32 intermediate rounds twice and float64 does not), and the
parameter names in error messages. Oracles: float64 arithmetic followed by one cast to float32
(exact for one +, -, *, / since 53 >= 2 * 24 + 2), exact sums (math.fsum), mpmath, torch.
"""

from __future__ import annotations

import math

import mpmath as mp
import numpy as np
import pytest
import torch

from precisionlab import emulate as em
from precisionlab.emulate.elementary import cos2pi64
from precisionlab.emulate.summation import sum_over, sum_to

BF16_NATIVE = em.Precision("bfloat16", backend="native")


def _x(*shape, seed=0, lo=-2.0, hi=2.0):
    """float32 values uniform in [lo, hi) (torch.rand in float64, cast once)."""
    u = torch.rand(*shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    return (lo + (hi - lo) * u).float()


def _bits_equal(a, b):
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)


# --------------------------------------------------------------------------- defaults


@pytest.mark.parametrize("name", ["exp", "log", "tanh", "sigmoid", "gelu", "silu", "log_softmax",
                                  "rms_norm", "sum", "mean"])
def test_the_default_precision_is_float32(name):
    x = _x(3, 5, lo=0.25)
    f = getattr(em, name)
    assert _bits_equal(f(x), f(x, prec=em.Precision("float32")))


def test_the_default_precision_of_products_losses_norms_and_adam_is_float32():
    a, b, t = _x(3, 4, seed=1), _x(4, 2, seed=2), _x(3, 4, seed=3)
    f32 = em.Precision("float32")
    assert _bits_equal(em.matmul(a, b), em.matmul(a, b, f32))
    assert _bits_equal(em.linear(a, b.T), em.linear(a, b.T, prec=f32))
    assert _bits_equal(em.mse_loss(a, t), em.mse_loss(a, t, f32))
    x = _x(2, 4, 3, seed=4)
    assert _bits_equal(em.group_norm(x, 2), em.group_norm(x, 2, prec=f32))
    # Adam's default: one step, w - lr g/(|g| + eps) in float64 (m_hat = g, v_hat = g^2), then float32
    w, g = _x(5, seed=5), _x(5, seed=6)
    p = torch.nn.Parameter(w.clone())
    p.grad = g.clone()
    em.Adam([p]).step()
    w64, g64 = w.double(), g.double()
    m = (0.1 * g64).float().double() / 0.1
    v = (0.001 * g64 * g64).float().double() / (1 - 0.999)
    want = (w64 - 1e-3 * m / (v.sqrt() + 1e-8)).float()
    assert torch.equal(p.detach(), want)


# --------------------------------------------------------------------------- the native back end


def test_native_ops_are_torchs_ops_in_the_format():
    a, b = _x(3, 4, seed=1), _x(4, 5, seed=2)
    bf = torch.bfloat16
    assert _bits_equal(em.matmul(a, b, BF16_NATIVE), (a.to(bf) @ b.to(bf)).float())
    x = _x(2, 3, 4, seed=3)
    assert _bits_equal(em.log_softmax(x, BF16_NATIVE), torch.log_softmax(x.to(bf), -1).float())
    assert _bits_equal(em.rms_norm(x, BF16_NATIVE),
                       torch.nn.functional.rms_norm(x.to(bf), (4,), eps=1e-6).float())
    assert _bits_equal(em.sum(x, 1, prec=BF16_NATIVE), torch.sum(x.to(bf), 1).float())
    assert _bits_equal(em.mean(x, 0, keepdim=True, prec=BF16_NATIVE),
                       torch.mean(x.to(bf), 0, keepdim=True).float())
    w, c = _x(4, seed=4), _x(4, seed=5)
    y = torch.nn.functional.group_norm(x.reshape(2, 4, 3).to(bf), 2, w.to(bf), c.to(bf), 1e-5).float()
    assert _bits_equal(em.group_norm(x.reshape(2, 4, 3), 2, w, c, BF16_NATIVE), y)


# --------------------------------------------------------------------------- shapes and optional operands


def test_sum_keeps_the_dimension_when_asked():
    x = _x(3, 4)
    assert em.sum(x, 1, keepdim=True).shape == (3, 1) and em.sum(x, 1).shape == (3,)
    assert em.mean(x, 0, keepdim=True).shape == (1, 4)


def test_rms_norm_and_log_softmax_work_row_by_row_in_three_dimensions():
    # each (last-dim) row is normalised on its own: the batched result equals the rows one at a time
    x = _x(2, 3, 4, seed=7)
    x[1, 2] *= 300.0  # a row far larger than the others (log_softmax's shift must be per row)
    for f in (em.rms_norm, em.log_softmax):
        rows = torch.stack([f(r, "bfloat16") for r in x.reshape(-1, 4)]).reshape(2, 3, 4)
        assert _bits_equal(f(x, "bfloat16"), rows)
    xs = torch.tensor([[0.0, 1.0], [0.0, 1000.0]])
    want = torch.tensor([-math.log1p(math.e), -math.log1p(math.exp(-1))], dtype=torch.float64).float()
    assert torch.equal(em.log_softmax(xs)[0], want)


def _grads(fn, *ts):
    leaves = [None if t is None else t.clone().requires_grad_() for t in ts]
    out = fn(*leaves)
    out.backward(_x(*out.shape, seed=11))
    return out, [None if t is None else t.grad for t in leaves]


@pytest.mark.parametrize("fmt", ["bfloat16", "float32"])
def test_group_norm_with_only_a_weight_or_only_a_bias(fmt):
    # weight 1 and bias 0 are exact: leaving either out must give the same bits and gradients
    x, w, b = _x(2, 4, 3, seed=1), _x(4, seed=2), _x(4, seed=3)
    ones, zeros = torch.ones(4), torch.zeros(4)
    y1, (gx1, gw1, _) = _grads(lambda x, w, z: em.group_norm(x, 2, w, z, fmt), x, w, zeros)
    y2, (gx2, gw2) = _grads(lambda x, w: em.group_norm(x, 2, w, None, fmt), x, w)
    assert _bits_equal(y1, y2) and _bits_equal(gx1, gx2) and _bits_equal(gw1, gw2)
    y3, (gx3, _, gb3) = _grads(lambda x, o, b: em.group_norm(x, 2, o, b, fmt), x, ones, b)
    y4, (gx4, gb4) = _grads(lambda x, b: em.group_norm(x, 2, None, b, fmt), x, b)
    assert _bits_equal(y3, y4) and _bits_equal(gx3, gx4) and _bits_equal(gb3, gb4)


def test_linear_weight_gradient_without_a_bias_or_with_a_constant_one():
    x, w, b = _x(5, 3, seed=1), _x(2, 3, seed=2), _x(2, seed=3)
    _, (gx1, gw1) = _grads(lambda x, w: em.linear(x, w, None, "bfloat16"), x, w)
    _, (gx2, gw2, _) = _grads(lambda x, w, z: em.linear(x, w, z, "bfloat16"), x, w, torch.zeros(2))
    assert _bits_equal(gx1, gx2) and _bits_equal(gw1, gw2)
    xl, wl = x.clone().requires_grad_(), w.clone().requires_grad_()
    em.linear(xl, wl, b, "bfloat16").backward(_x(5, 2, seed=11))  # b needs no gradient
    assert _bits_equal(wl.grad, gw1)


def test_linear_bias_gradient_in_float32_is_one_rounding_of_the_exact_sum():
    # 64 rows of float32 values in [2^-8, 2^8): their float64 sum is exact, a float32 one is not
    n = 64
    g = (_x(n, 2, seed=21, lo=-8.0, hi=8.0).double().exp2() * torch.sign(_x(n, 2, seed=22))).float()
    b = torch.zeros(2, requires_grad=True)
    em.linear(torch.zeros(n, 3), torch.zeros(2, 3), b, "float32").backward(g)
    want = [float(np.float32(math.fsum(g[:, j].tolist()))) for j in range(2)]
    assert b.grad.tolist() == want


# --------------------------------------------------------------------------- float32: no double rounding


def test_log_and_gelu_gradients_in_float32_round_once():
    x = _x(4000, seed=31, lo=0.05, hi=3.0)
    g = torch.full_like(x, 3.0)
    xl = x.clone().requires_grad_()
    em.log(xl, "float32").backward(g)
    assert torch.equal(xl.grad, (3.0 / x.double()).float())  # one rounding of 3/x
    xs = _x(4000, seed=32, lo=-3.0, hi=3.0)
    xl = xs.clone().requires_grad_()
    em.gelu(xl, "float32").backward(torch.ones_like(xs))
    c, d = math.sqrt(2.0 / math.pi), xs.double()
    t = torch.tensor([math.tanh(v) for v in (c * (d + 0.044715 * d**3)).tolist()], dtype=torch.float64)
    dy = 0.5 * (1 + t) + 0.5 * d * (1 - t * t) * c * (1 + 3 * 0.044715 * d * d)
    assert (xl.grad != dy.float()).sum() <= 2  # float64 libm vs the package's tanh: ties only


def test_log64_of_float32_input_is_computed_in_float64():
    x = _x(2000, seed=41, lo=0.01, hi=50.0)
    y = em.log64(x)
    assert y.dtype == torch.float64
    assert max(abs(a - math.log(v)) / math.ulp(math.log(v)) for a, v in zip(y.tolist(), x.tolist(), strict=True)
               if abs(math.log(v)) > 1e-3) <= 2


# 2 pi u near +-pi/4 mod pi/2, where the series' last terms decide the last bit: correctly rounded here
_COS_POINTS = ["0x1.c035d14fe8555p-1", "0x1.c0e7c75d0204ap-1", "0x1.3f405ecef2abap-1",
               "0x1.40a7c1b9159ccp-1", "0x1.0094538b58f4cp-3", "0x1.bf1ccbd9a3625p-1"]


def test_cos2pi_is_correctly_rounded_at_the_octant_edges():
    mp.mp.prec = 200
    u = [float.fromhex(h) for h in _COS_POINTS]
    got = cos2pi64(torch.tensor(u, dtype=torch.float64)).tolist()
    assert got == [float(mp.cos(2 * mp.pi * mp.mpf(v))) for v in u]


# --------------------------------------------------------------------------- sums over several dims


def test_sum_to_and_sum_over_undo_broadcasting_like_torch():
    g = torch.tensor([[[1.0, 2.0, 4.0]], [[8.0, 16.0, 32.0]]]).expand(2, 2, 3)  # exact sums
    assert torch.equal(sum_to(g, torch.Size([1, 3])), g.sum(dim=(0, 1)).reshape(1, 3))
    assert torch.equal(sum_to(g, torch.Size([2, 1])), g.sum(dim=(0, 2)).reshape(2, 1))
    assert torch.equal(sum_to(g, torch.Size([2, 3])), g.sum(0))
    assert torch.equal(sum_over(g, (0, 2)), g.sum(dim=(0, 2)))


# --------------------------------------------------------------------------- bad input names the parameter


def test_errors_name_the_parameter():
    with pytest.raises(ValueError, match="unknown accumulate "):
        em.Precision("float16", accumulate="float8")
    for name, kw in (("zero_point", {"zero_point": 1.5}), ("quant_min", {"quant_min": 0.5}),
                     ("quant_max", {"quant_max": "7"})):
        with pytest.raises(ValueError, match=f"{name}="):
            em.fake_quantize(torch.zeros(2), 1.0, **kw)
    p = [torch.nn.Parameter(torch.zeros(2))]
    for lr in (0.0, math.inf, -1e-3):
        with pytest.raises(ValueError, match="lr"):
            em.Adam(p, lr=lr)
    em.Adam(p, betas=(0.0, 0.0))  # beta = 0 is allowed, as in torch
