"""Optimizers (SGD with momentum, Adam): updates in float64, weights and state stored in F."""

from __future__ import annotations

import math
from collections.abc import Iterable

import torch

from .elementary import sqrt64
from .precision import as_precision

__all__ = ["SGD", "Adam"]


def _params(params: Iterable) -> list:
    """The parameters as a list; ValueError if there are none."""
    params = list(params)
    if not params:
        raise ValueError("the optimizer got an empty parameter list")
    return params


class _Optimizer(torch.optim.Optimizer):
    """torch.optim.Optimizer, its parameter groups added and gradients cleared without torch._dynamo.

    torch wraps `add_param_group` and `zero_grad` in `torch._disable_dynamo`, which imports
    torch._dynamo (about 1 s, cold) on the first call; these two do the same work for the
    optimizers here, which no compiler traces. state_dict and the rest stay torch's.
    """

    def add_param_group(self, param_group: dict) -> None:
        """Add a group: params (a tensor or an iterable of leaf tensors), the defaults filled in."""
        if not isinstance(param_group, dict):
            raise TypeError(f"param_group must be a dict; got {type(param_group).__name__}")
        params = param_group["params"]
        if isinstance(params, set):
            raise TypeError("optimizer parameters need to be organized in ordered collections,"
                            " not a set")
        params = [params] if isinstance(params, torch.Tensor) else list(params)
        named = [isinstance(p, tuple) for p in params]  # model.named_parameters(), as torch
        if any(named):
            if not all(named) or any(len(p) != 2 for p in params):
                raise ValueError("a parameter group must hold all tensors or all (name, "
                                 "tensor) pairs, as model.named_parameters() gives")
            param_group = {**param_group, "param_names": [n for n, _ in params]}
            params = [p for _, p in params]
        if any(("param_names" in g) != any(named) for g in self.param_groups):
            raise ValueError("all parameter groups must be named (name, tensor) pairs or "
                             "none")
        for p in params:
            if not isinstance(p, torch.Tensor):
                raise TypeError(f"an optimizer can only optimize Tensors; got "
                                f"{type(p).__name__}")
            if not (p.is_leaf or p.retains_grad):
                raise ValueError("can't optimize a non-leaf Tensor")
        group = {**param_group, "params": params}
        for name, default in self.defaults.items():
            group.setdefault(name, default)
        if len(params) != len(set(params)):
            raise ValueError("a parameter group holds a parameter more than once")
        if any(not set(g["params"]).isdisjoint(params) for g in self.param_groups):
            raise ValueError("some parameters appear in more than one parameter group")
        self.param_groups.append(group)

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Clear every parameter's gradient: None (set_to_none), else zeros, as torch's does."""
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                if set_to_none:
                    p.grad = None
                    continue
                if p.grad.grad_fn is not None:
                    p.grad.detach_()
                else:
                    p.grad.requires_grad_(False)
                p.grad.zero_()


class SGD(_Optimizer):
    """b <- mu b + g (b = g at the first step), w <- fl_F(w - lr b); float64 inside, state in F."""

    def __init__(self, params, lr: float, momentum: float = 0.0, prec="float32"):
        if not (math.isfinite(lr) and lr > 0):
            raise ValueError(f"lr must be a finite number > 0; got lr={lr!r}")
        if not 0 <= momentum < 1:
            raise ValueError(f"momentum must be in [0, 1); got momentum={momentum!r}")
        super().__init__(_params(params), {"lr": float(lr), "momentum": float(momentum)})
        self.prec = as_precision(prec)

    @torch.no_grad()
    def step(self, closure=None):
        """One update of every parameter that has a gradient."""
        p_ = self.prec
        for group in self.param_groups:
            lr, mu = group["lr"], group["momentum"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                g = p.grad.to(torch.float64)
                if mu:
                    st = self.state[p]
                    b = g if "buf" not in st else mu * st["buf"].to(torch.float64) + g
                    st["buf"] = p_.round(b)
                    g = st["buf"].to(torch.float64)
                p.copy_(p_.round(p.to(torch.float64) - lr * g))


class Adam(_Optimizer):
    """torch's Adam: m, v moments, w <- w - lr m_hat / (sqrt(v_hat) + eps); float64 inside, state in F."""

    def __init__(self, params, lr: float = 1e-3, betas=(0.9, 0.999), eps: float = 1e-8,
                 prec="float32"):
        if not (math.isfinite(lr) and lr > 0):
            raise ValueError(f"lr must be a finite number > 0; got lr={lr!r}")
        for name, b in zip(("betas[0]", "betas[1]"), betas, strict=True):
            if not 0 <= b < 1:
                raise ValueError(f"{name} must be in [0, 1); got {b!r}")
        if not eps > 0:
            raise ValueError(f"eps must be > 0; got eps={eps!r}")
        super().__init__(_params(params), {"lr": float(lr), "betas": tuple(map(float, betas)),
                                           "eps": float(eps)})
        self.prec = as_precision(prec)

    @torch.no_grad()
    def step(self, closure=None):
        """One Adam update of every parameter that has a gradient."""
        p_ = self.prec
        for group in self.param_groups:
            lr, (b1, b2), eps = group["lr"], group["betas"], group["eps"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                g = p.grad.to(torch.float64)
                st = self.state[p]
                if not st:
                    st["step"] = 0
                    st["m"] = torch.zeros_like(p)
                    st["v"] = torch.zeros_like(p)
                st["step"] += 1
                t = st["step"]
                m = p_.round(b1 * st["m"].to(torch.float64) + (1 - b1) * g)
                v = p_.round(b2 * st["v"].to(torch.float64) + (1 - b2) * g * g)
                st["m"].copy_(m)
                st["v"].copy_(v)
                m_hat = m.to(torch.float64) / (1 - b1**t)
                v_hat = v.to(torch.float64) / (1 - b2**t)
                p.copy_(p_.round(p.to(torch.float64) - lr * m_hat / (sqrt64(v_hat) + eps)))
