"""QuantizedLinear: forward and backward against float64 products of independently quantized operands."""

from __future__ import annotations

import functools

import numpy as np
import pytest
import torch
from test_quantize import reference

from precisionlab import emulate
from precisionlab.emulate.quantized_linear import (
    QuantizedLinear,
    quantize_input,
    quantized_linear,
)
from precisionlab.quantize import DelayedScaling, Quantized, quantize_blocks, quantize_per_tensor

MX = functools.partial(quantize_blocks, block=8)  # small MX-style blocks along K


def dyadic(shape, seed, low=-3, high=3):
    """Entries k * 2^e with |k| <= 7: exact in float8_e4m3fn under a power-of-two scale."""
    rng = np.random.default_rng(seed)
    k = rng.integers(-7, 8, shape)
    return torch.from_numpy((k * 2.0 ** rng.integers(low, high, shape)).astype(np.float32))


def test_exact_operands_give_the_float64_product_forward_and_backward():
    # Every operand survives its quantizer, and the sums are exact in float32: the layer
    # must equal float64 matmuls of the raw operands, bit for bit.
    x, w, b, dy = dyadic((6, 16), 0), dyadic((4, 16), 1), dyadic((4,), 2), dyadic((6, 4), 3)
    x.requires_grad_(True)
    lin = QuantizedLinear(w, b, x_quantizer=MX, w_quantizer=MX,
                          grad_quantizer=functools.partial(quantize_blocks, block=4))
    y = lin(x)
    y.backward(dy)
    x64, w64 = x.detach().double(), w.double()
    assert torch.equal(y.detach().double(), x64 @ w64.T + b.double())
    assert torch.equal(x.grad.double(), dy.double() @ w64)
    assert torch.equal(lin.weight.grad.double(), dy.double().T @ x64)
    assert lin.stats["x"] == {"saturated": 0.0, "underflowed": 0.0, "subnormal": 0.0}


def fl32_matmul_bound(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """|fl32 sum - exact| <= K u sum |a||b| (u = 2^-24) for a sequential float32 sum, plus one rounding."""
    k = a.shape[1]
    return (k + 1) * 2.0**-24 * (a.abs() @ b.abs()) + 1e-300


@pytest.mark.parametrize("elem, scale_format", [("float8_e4m3fn", "float8_e8m0fnu"),
                                                ("float4_e2m1fn", "float8_e8m0fnu"),
                                                ("float8_e5m2", "float32")])
def test_forward_and_backward_match_independently_quantized_operands(elem, scale_format):
    rng = np.random.default_rng(4)
    x = rng.standard_normal((8, 16)).astype(np.float32)
    x[:, 3] *= 100.0  # an outlier channel
    w = (rng.standard_normal((4, 16)) / 4).astype(np.float32)
    dy = rng.standard_normal((8, 4)).astype(np.float32) * 1e-3
    q = functools.partial(quantize_blocks, elem=elem, block=4, scale_format=scale_format)
    xt = torch.from_numpy(x).requires_grad_(True)
    stats: dict = {}
    y = quantized_linear(xt, torch.from_numpy(w), None, x_quantizer=q, w_quantizer=q,
                         grad_quantizer=q, stats=stats)
    y.backward(torch.from_numpy(dy))

    def deq(a):  # the loop reference's dequantized operand, then rounded to float32 once
        ref = reference(a, elem, (1, 4), scale_format)
        d = np.repeat(np.array(ref["d"], dtype=np.float64), 4, axis=1)
        return torch.from_numpy((ref["q"] * d).astype(np.float32)).double(), ref

    xh, xref = deq(x)
    wh, _ = deq(w)
    gh, _ = deq(dy)
    exact = xh @ wh.T
    assert ((y.detach().double() - exact).abs() <= fl32_matmul_bound(xh, wh.T)).all()
    assert ((xt.grad.double() - gh @ wh).abs() <= fl32_matmul_bound(gh, wh)).all()
    assert stats["x"]["underflowed"] == xref["underflowed"]
    assert set(stats) == {"x", "w", "grad"}


def test_no_quantizers_is_emulate_linear_and_from_torch_copies_parameters():
    torch.manual_seed(0)
    lin = torch.nn.Linear(16, 4)
    q = QuantizedLinear.from_torch(lin)
    x = torch.randn(3, 16)
    assert torch.equal(q(x), emulate.linear(x, lin.weight.detach(), lin.bias.detach(), "float32"))
    assert torch.equal(q.weight, lin.weight) and q.weight.dtype == torch.float32


def test_gradient_quantizer_underflow_is_reported_and_zeroes_the_gradient():
    x = dyadic((4, 16), 5).requires_grad_(True)
    w = dyadic((2, 16), 6)
    tiny = torch.full((4, 2), 1e-30)
    tiny[0, 0] = 1.0  # one large entry sets the per-tensor scale: the rest underflow in e5m2
    stats: dict = {}
    y = quantized_linear(x, w, grad_quantizer=functools.partial(
        quantize_per_tensor, elem="float8_e5m2", scale_format="float8_e8m0fnu"), stats=stats)
    y.backward(tiny)
    assert stats["grad"]["underflowed"] == 7 / 8
    assert torch.equal(x.grad[1:], torch.zeros(3, 16))


def test_delayed_scaling_inside_the_layer_updates_between_calls():
    ds = DelayedScaling(amax_history_len=4)
    lin = QuantizedLinear(dyadic((2, 16), 7), x_quantizer=ds)
    lin(dyadic((3, 16), 8) * 64)
    first = ds.scale
    lin(dyadic((3, 16), 9) * 64)
    assert first != 1.0 and ds.history[1] > 0


@pytest.mark.parametrize("bad, err", [(3, TypeError), (lambda t: t, TypeError)])
def test_a_bad_quantizer_is_named(bad, err):
    with pytest.raises(err, match="x quantizer must"):
        quantized_linear(torch.ones(2, 4), torch.ones(3, 4), x_quantizer=bad)


class Counting:
    """A quantizer that counts its calls (the inputs it was handed, in order)."""

    def __init__(self, quantizer):
        self.quantizer, self.seen = quantizer, []

    def __call__(self, t):
        self.seen.append(t.clone())
        return self.quantizer(t)


def test_a_quantized_input_gives_the_same_bits_as_quantizing_in_the_layer():
    # Oracle: the layer quantizing x itself. A Quantized x (quantized once by the caller)
    # must give the same output, dW and shares, bit for bit.
    rng = np.random.default_rng(10)
    x = torch.from_numpy(rng.standard_normal((8, 16)).astype(np.float32))
    x[:, 5] *= 300.0  # an outlier channel: some entries saturate or underflow
    w, dy = dyadic((4, 16), 11), torch.from_numpy(rng.standard_normal((8, 4)).astype(np.float32))
    q = functools.partial(quantize_blocks, elem="float4_e2m1fn", block=4)
    grad_q = functools.partial(quantize_per_tensor, elem="float8_e5m2")
    per_call = QuantizedLinear(w, x_quantizer=q, grad_quantizer=grad_q)
    once = QuantizedLinear(w, grad_quantizer=grad_q)
    y_ref, y = per_call(x), once(quantize_input(x, q))
    y_ref.backward(dy)
    y.backward(dy)
    assert torch.equal(y, y_ref) and torch.equal(once.weight.grad, per_call.weight.grad)
    assert once.stats == per_call.stats and once.stats["x"]["underflowed"] > 0


def test_a_changing_input_is_still_quantized_on_every_call():
    counting = Counting(MX)
    lin = QuantizedLinear(dyadic((3, 16), 12), x_quantizer=counting)
    xs = [torch.from_numpy(np.random.default_rng(s).standard_normal((5, 16)).astype(np.float32))
          for s in range(3)]
    for x in xs:  # each output is the product with this call's own quantized input
        xh = MX(x).dequantize().to(torch.float32)
        assert torch.equal(lin(x), emulate.linear(xh, lin.weight, None, "float32"))
    assert len(counting.seen) == 3
    assert all(torch.equal(a, b) for a, b in zip(counting.seen, xs, strict=True))


def test_a_quantized_input_with_an_x_quantizer_is_refused():
    x = dyadic((2, 16), 13)
    with pytest.raises(ValueError, match="x_quantizer must be None"):
        quantized_linear(quantize_input(x, MX), torch.ones(3, 16), x_quantizer=MX)
    with pytest.raises(TypeError, match="x quantizer must"):
        quantize_input(x, 3)


def test_x_and_w_each_pass_through_their_own_quantizer():
    # Oracle: the loop reference quantizing x in FP4 and W in E4M3 (blocks of 4 along K), the
    # products in float64; the layer must not quantize one operand with the other's quantizer.
    rng = np.random.default_rng(14)
    x = rng.standard_normal((8, 16)).astype(np.float32)
    x[:, 3] *= 100.0
    w = (rng.standard_normal((4, 16)) / 4).astype(np.float32)
    dy = torch.from_numpy(rng.standard_normal((8, 4)).astype(np.float32))
    qx = functools.partial(quantize_blocks, elem="float4_e2m1fn", block=4)
    qw = functools.partial(quantize_blocks, elem="float8_e4m3fn", block=4)

    def deq(a, elem):
        ref = reference(a, elem, (1, 4), "float8_e8m0fnu")
        d = np.repeat(np.array(ref["d"], dtype=np.float64), 4, axis=1)
        return torch.from_numpy((ref["q"] * d).astype(np.float32)).double(), ref

    (xh, xref), (wh, wref) = deq(x, "float4_e2m1fn"), deq(w, "float8_e4m3fn")
    swapped = deq(x, "float8_e4m3fn")[0] @ deq(w, "float4_e2m1fn")[0].T
    bound = fl32_matmul_bound(xh, wh.T)
    assert ((swapped - xh @ wh.T).abs() > bound).any()  # the oracle tells the two apart
    xt = torch.from_numpy(x).requires_grad_(True)
    per_call = QuantizedLinear(torch.from_numpy(w), x_quantizer=qx, w_quantizer=qw)
    once = QuantizedLinear(torch.from_numpy(w), w_quantizer=qw)
    for lin, xin in ((per_call, xt), (once, quantize_input(xt, qx))):
        y = lin(xin)
        assert ((y.detach().double() - xh @ wh.T).abs() <= bound).all()
        y.backward(dy)
        assert ((lin.weight.grad.double() - dy.double().T @ xh).abs()
                <= fl32_matmul_bound(dy.double().T, xh)).all()
        for key, ref in (("x", xref), ("w", wref)):
            assert lin.stats[key] == {k: ref[k] for k in ("saturated", "underflowed",
                                                          "subnormal")}
    assert ((xt.grad.double() - dy.double() @ wh).abs() <= fl32_matmul_bound(dy.double(), wh)).all()


def test_a_layer_records_the_shares_of_each_calls_quantized_input():
    # Oracle: the loop reference's shares of each input; the layer's stats["x"] follows the
    # latest call, never an earlier one.
    lin = QuantizedLinear(dyadic((3, 16), 15))
    q = functools.partial(quantize_blocks, elem="float4_e2m1fn", block=4)
    rng = np.random.default_rng(16)
    seen = []
    for spread in (1.0, 1e3):
        x = rng.standard_normal((6, 16)).astype(np.float32)
        x[:, ::4] *= spread  # one large entry per block: the others underflow in FP4
        lin(quantize_input(torch.from_numpy(x), q))
        ref = reference(x, "float4_e2m1fn", (1, 4), "float8_e8m0fnu")
        assert lin.stats["x"] == {k: ref[k] for k in ("saturated", "underflowed", "subnormal")}
        seen.append(ref["underflowed"])
    assert seen[0] != seen[1]


def _passthrough(t: torch.Tensor) -> Quantized:
    """A differentiable 'quantizer': q = 1 * t with one decode scale 1 (float32 elements)."""
    return Quantized(t * 1.0, torch.ones(1, 1), torch.ones(1, 1, dtype=torch.float64),
                     "float32", "float32", tuple(t.shape), 0.0, 0.0, 0.0)


def test_a_quantized_input_is_a_constant_even_from_a_differentiable_quantizer():
    # Oracle: emulate.linear on x itself (the quantizer is the identity) and dW = dy^T x; the
    # input quantized once carries no gradient back to x, where x_quantizer passes one through.
    x, w, dy = dyadic((5, 16), 17), dyadic((3, 16), 18), dyadic((5, 3), 19)
    x.requires_grad_(True)
    xq = quantize_input(x, _passthrough)
    assert not xq.values.requires_grad
    once = QuantizedLinear(w)
    y = once(xq)
    assert torch.equal(y, emulate.linear(x.detach(), w, None, "float32"))
    y.backward(dy)
    assert x.grad is None and torch.equal(once.weight.grad.double(),
                                          dy.double().T @ x.detach().double())
    QuantizedLinear(w, x_quantizer=_passthrough)(x).backward(dy)
    assert torch.equal(x.grad.double(), dy.double() @ w.double())
