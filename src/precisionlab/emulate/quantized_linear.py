"""A linear layer whose matmul inputs pass through quantizers: y = Q_x(x) Q_w(W)^T + b, float32 accumulation."""

from __future__ import annotations

from collections.abc import Callable

import torch

from ..quantize import Quantized
from .products import linear

__all__ = ["QuantizedLinear", "quantize_input", "quantized_linear"]

Quantizer = Callable[[torch.Tensor], Quantized]


def quantize_input(t: torch.Tensor, quantizer: Quantizer, key: str = "x") -> Quantized:
    """quantizer(t), checked: a constant input quantized once can be passed to quantized_linear as x (a stateful quantizer, e.g. DelayedScaling, then runs once, with the scale it holds now)."""
    if not callable(quantizer):
        raise TypeError(f"{key} quantizer must be a function x -> Quantized (e.g. "
                        f"functools.partial(quantize_blocks, block=32)); got {quantizer!r}")
    result = quantizer(t.detach())
    if not isinstance(result, Quantized):
        raise TypeError(f"{key} quantizer must return a Quantized; got {type(result).__name__}")
    return result


def _dequantized(t: torch.Tensor, quantizer: Quantizer, stats: dict | None, key: str):
    """fl32(q * d) of quantizer(t): exact when the scales are powers of two; its shares go to stats[key]."""
    result = quantize_input(t, quantizer, key)
    if stats is not None:
        stats[key] = result.shares
    return result.dequantize().to(torch.float32)


class _Quantize(torch.autograd.Function):
    """Forward x -> fl32(Q(x)); backward passes the gradient straight through (d/dx of Q taken as 1)."""

    @staticmethod
    def forward(ctx, x, quantizer, stats, key):
        return _dequantized(x, quantizer, stats, key)

    @staticmethod
    def backward(ctx, g):
        return g, None, None, None


class _QuantizeGrad(torch.autograd.Function):
    """Forward: the identity; backward: the incoming gradient dy -> fl32(Q(dy))."""

    @staticmethod
    def forward(ctx, y, quantizer, stats, key):
        ctx.quantizer, ctx.stats, ctx.key = quantizer, stats, key
        return y.view_as(y)

    @staticmethod
    def backward(ctx, g):
        return _dequantized(g, ctx.quantizer, ctx.stats, ctx.key), None, None, None


def _input(x: torch.Tensor | Quantized, quantizer: Quantizer | None, stats: dict | None):
    """x^ = fl32(Q_x(x)); a Quantized x is already x^ (quantized once by the caller): no Q_x then."""
    if not isinstance(x, Quantized):
        return x if quantizer is None else _Quantize.apply(x, quantizer, stats, "x")
    if quantizer is not None:
        raise ValueError("x is already quantized (a Quantized), so x_quantizer must be None; "
                         f"got x_quantizer={quantizer!r}")
    if stats is not None:
        stats["x"] = x.shares
    return x.dequantize().to(torch.float32)


def quantized_linear(x: torch.Tensor | Quantized, w: torch.Tensor,
                     b: torch.Tensor | None = None, *,
                     x_quantizer: Quantizer | None = None, w_quantizer: Quantizer | None = None,
                     grad_quantizer: Quantizer | None = None,
                     stats: dict | None = None) -> torch.Tensor:
    """y = fl32(acc32(x^ w^^T) + b), x^ = fl32(Q_x(x)), w^ = fl32(Q_w(W)); backward: dx = Q_g(dy) w^, dW = Q_g(dy)^T x^.

    Each quantizer maps a tensor to a `Quantized` (quantize_per_tensor, quantize_blocks with
    a block along K, a DelayedScaling object, ...); None leaves that operand in float32. The
    products and sums run in emulate's portable float32 matmul (fixed order, float32
    accumulator), the dequantized operands rounded once to float32 (exact for power-of-two
    scales). Gradients reach x and W straight through their quantizers, as FP8 training
    recipes do; the output gradient dy is quantized (E5M2 in Transformer Engine's HYBRID
    recipe) before both backward matmuls. stats, if given, receives each quantizer's shares
    (saturated, underflowed, subnormal) under "x", "w" and "grad". An input that stays the
    same every step can be quantized once, `quantize_input(x, Q_x)`, and passed as x (a
    `Quantized`, with x_quantizer None): the same x^, without Q_x's work each call, and no
    gradient to x. The same x^ for a stateless Q_x (a recipe) only: a stateful one such as
    `quantize.DelayedScaling` is then called once, so every call uses the scale it held then
    (m = 1 before it has a history) and its history records x's amax once, where passing x
    with x_quantizer=Q_x calls it on every call and x^ follows its updated scale.
    """
    xh = _input(x, x_quantizer, stats)
    wh = w if w_quantizer is None else _Quantize.apply(w, w_quantizer, stats, "w")
    y = linear(xh, wh, b, "float32")
    if grad_quantizer is not None:
        y = _QuantizeGrad.apply(y, grad_quantizer, stats, "grad")
    return y


class QuantizedLinear(torch.nn.Module):
    """y = x W^T + b through `quantized_linear`; float32 master parameters; the last shares in `.stats`."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None, *,
                 x_quantizer: Quantizer | None = None, w_quantizer: Quantizer | None = None,
                 grad_quantizer: Quantizer | None = None):
        super().__init__()
        self.weight = torch.nn.Parameter(weight.detach().to(torch.float32).clone())
        self.bias = None if bias is None else torch.nn.Parameter(
            bias.detach().to(torch.float32).clone())
        self.x_quantizer, self.w_quantizer = x_quantizer, w_quantizer
        self.grad_quantizer = grad_quantizer
        self.stats: dict[str, dict[str, float]] = {}

    @classmethod
    def from_torch(cls, lin: torch.nn.Linear, **quantizers) -> QuantizedLinear:
        """A quantized copy of a torch.nn.Linear (its parameters in float32)."""
        return cls(lin.weight, lin.bias, **quantizers)

    def forward(self, x: torch.Tensor | Quantized) -> torch.Tensor:
        """x W^T + b with the layer's quantizers (x may be a Quantized); their shares land in self.stats."""
        return quantized_linear(x, self.weight, self.bias, x_quantizer=self.x_quantizer,
                                w_quantizer=self.w_quantizer, grad_quantizer=self.grad_quantizer,
                                stats=self.stats)
