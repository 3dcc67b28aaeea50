"""torch's Adam for the native back end, without building a torch.optim.Optimizer."""

from __future__ import annotations

import torch
from torch.optim.adam import adam as torch_adam

__all__ = ["TorchAdam"]


class TorchAdam:
    """torch.optim.Adam(params, lr, foreach=False), stepping through torch's own `adam` function.

    The Adam class's step is `torch.optim.adam.adam` on its state (m and v zeros like each
    weight, the step count a float32 scalar) with the defaults betas = (0.9, 0.999),
    eps = 1e-8, no weight decay; this calls it with exactly those, so the weights it gives are
    the class's, bit for bit (tests/test_rl.py). Building a torch.optim.Optimizer imports
    torch._dynamo, about a second on a cold start, for nothing the native runs use.
    """

    def __init__(self, params, lr: float):
        self.params = list(params)
        # torch.optim.Adam's own checks; betas, eps, weight_decay, amsgrad and the rest are not
        # parameters here (a TypeError names any that is passed): the defaults are the only ones
        if isinstance(lr, torch.Tensor) or not 0.0 <= lr < float("inf"):
            raise ValueError(f"lr must be a finite number >= 0; got lr={lr!r}")
        for i, p in enumerate(self.params):
            if not isinstance(p, torch.Tensor):
                raise TypeError("TorchAdam takes tensors, not parameter groups; got "
                                f"params[{i}] of type {type(p).__name__}")
            if not p.is_leaf:
                raise ValueError(f"TorchAdam can't optimize a non-leaf tensor (params[{i}])")
        self.lr = float(lr)
        scalar = torch.float64 if torch.get_default_dtype() == torch.float64 else torch.float32
        self.steps = [torch.tensor(0.0, dtype=scalar) for _ in self.params]
        self.exp_avgs = [torch.zeros_like(p, memory_format=torch.preserve_format)
                         for p in self.params]
        self.exp_avg_sqs = [torch.zeros_like(p, memory_format=torch.preserve_format)
                            for p in self.params]

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Drop every weight's gradient (the only use here: set_to_none)."""
        if not set_to_none:
            raise ValueError("TorchAdam.zero_grad sets gradients to None only: set_to_none must be "
                             f"True; got set_to_none={set_to_none!r}")
        for p in self.params:
            p.grad = None

    @torch.no_grad()
    def step(self) -> None:
        """One Adam step of the weights that have a gradient, as torch.optim.Adam.step."""
        held = [i for i, p in enumerate(self.params) if p.grad is not None]
        torch_adam([self.params[i] for i in held], [self.params[i].grad for i in held],
                   [self.exp_avgs[i] for i in held], [self.exp_avg_sqs[i] for i in held], [],
                   [self.steps[i] for i in held], foreach=False, capturable=False,
                   differentiable=False, fused=None, grad_scale=None, found_inf=None,
                   has_complex=False, decoupled_weight_decay=False, amsgrad=False, beta1=0.9,
                   beta2=0.999, lr=self.lr, weight_decay=0.0, eps=1e-8, maximize=False)
