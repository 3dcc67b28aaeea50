"""Checks of `watch`'s arguments: the optimizer, the scaler; the model inside a DDP wrapper."""

from __future__ import annotations

import torch

__all__ = ["check_optimizer", "check_real", "check_scaler", "unwrap"]


def unwrap(model: torch.nn.Module) -> torch.nn.Module:
    """The module inside DistributedDataParallel / DataParallel wrappers and torch.compile's
    OptimizedModule (its `_orig_mod`), so that module paths are the model's own."""
    while True:
        name = type(model).__name__
        if name in ("DistributedDataParallel", "DataParallel") and isinstance(
                getattr(model, "module", None), torch.nn.Module):
            model = model.module
        elif name == "OptimizedModule" and isinstance(
                getattr(model, "_orig_mod", None), torch.nn.Module):
            model = model._orig_mod
        else:
            return model


def check_optimizer(optimizer, model) -> None:
    """Raise ValueError unless optimizer is None or a torch Optimizer holding some of model's
    parameters."""
    if optimizer is None:
        return
    groups = getattr(optimizer, "param_groups", None)
    if not isinstance(optimizer, torch.optim.Optimizer) or groups is None:
        raise ValueError("optimizer must be a torch.optim.Optimizer or None; got "
                         f"optimizer={type(optimizer).__name__}")
    held = {id(p) for g in groups for p in g["params"]}
    mine = {id(p) for p in model.parameters()}
    if not held & mine:
        raise ValueError(f"optimizer holds none of model's parameters (it holds {len(held)} "
                         f"tensors, the model {len(mine)}): pass the optimizer that trains "
                         "this model, or optimizer=None and call w.step(loss) each step")


def check_scaler(scaler) -> None:
    """Raise ValueError unless scaler is None or GradScaler-like (get_scale, update,
    is_enabled)."""
    if scaler is not None and not all(callable(getattr(scaler, a, None))
                                      for a in ("get_scale", "update", "is_enabled")):
        raise ValueError("scaler must be a torch.amp.GradScaler (get_scale, update, is_enabled) "
                         f"or None; got scaler={type(scaler).__name__}")


def check_real(model) -> None:
    """Raise ValueError if model has a complex parameter (the formats counted are real)."""
    cplx = [n for n, p in unwrap(model).named_parameters() if p.is_complex()]
    if cplx:
        raise ValueError(f"model has complex parameters ({', '.join(cplx[:3])}): watch counts "
                         "real formats only; watch a model with real parameters (a complex "
                         "one as its real and imaginary parts, torch.view_as_real)")
