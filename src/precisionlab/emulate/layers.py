"""`Linear`, a module whose forward is emulate.linear in a fixed Precision."""

from __future__ import annotations

import torch

from .precision import as_precision
from .products import linear

__all__ = ["Linear"]


class Linear(torch.nn.Module):
    """y = x W^T + b through `linear` with a fixed Precision; parameters stored in their own dtype."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, prec):
        super().__init__()
        self.prec = as_precision(prec)
        self.weight = torch.nn.Parameter(self.prec.round(weight))
        self.bias = None if bias is None else torch.nn.Parameter(self.prec.round(bias))

    @classmethod
    def from_torch(cls, lin: torch.nn.Linear, prec) -> Linear:
        """An emulated copy of a torch.nn.Linear, its parameters rounded to F."""
        return cls(lin.weight.detach().float(), None if lin.bias is None else lin.bias.detach().float(),
                   prec)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x W^T + b in self.prec."""
        return linear(x, self.weight, self.bias, self.prec)
