"""Chapters 4 and 5: runs with a loss scaler, as the chapters read them.

`scaler_in_front` puts GradScaler's rule (`scaling.update_scale`) in front of chapter 4's
`underflow.AttenuatingNet` and records what the scaler does until its first good step.
`train_amp` is the training loop a real model uses: autocast, a loss scaler (torch's
`GradScaler` or the book's `DynamicLossScaler`), gradient accumulation, clipping of the true
gradient norm, a learning-rate schedule that counts only the updates made, and a checkpoint
that carries the scaler's state. `scale_actions` and `grads_identical` turn the records of a
run into what the chapters' tables show: the scaler's decision at each step, and whether two
runs handed the optimizer the same gradients.

Chapter code (`precisionlab.chapters`): imports `scaling` and `underflow`.
"""

from __future__ import annotations

import io
from collections.abc import Callable
from typing import NamedTuple

import numpy as np
import torch

from ..checks import check_positive
from ..scaling import ScaleHistory, TrainLog, update_scale
from ..underflow import AttenuatingNet, ForwardPass, LayerGradients, make_batch

__all__ = ["AmpStep", "ScalerProbe", "grads_identical", "scale_actions", "scaler_in_front",
           "train_amp"]


class ScalerProbe(NamedTuple):
    """What a dynamic scaler in front of AttenuatingNet saw: last probe, losses, scales, peaks."""

    probe: LayerGradients  # the last backward pass (the first good one, or the last tried)
    losses: list[float]  # the loss at every step tried
    history: ScaleHistory  # the scale used and whether the step was skipped, per step
    peak: np.ndarray  # largest |activation| of each layer's forward output, in the net's format


def scaler_in_front(depth: int, steps: int, attenuation: float = 1.2, fmt="float16",
                    width: int = 64, batch: int = 16, *, seed: int = 0,
                    init_scale: float = 2.0**16) -> ScalerProbe:
    """S_0 = init_scale; while a gradient (dL/dW, dL/dh) is inf/NaN: skip, S <- update_scale."""
    if int(steps) != steps or steps < 1:
        raise ValueError(f"steps must be a positive integer; got steps={steps!r}")
    s = check_positive(init_scale, "init_scale")
    net = AttenuatingNet(depth, width, attenuation, fmt, seed)
    # A skipped step leaves the weights as they were, so every step tried runs the same
    # forward pass: it is run once, and each step is its backward pass at that step's scale.
    forward = ForwardPass(net, *make_batch(width, batch, fmt, seed))
    tracker, scales, skipped, losses = 0, [], [], []
    for _ in range(int(steps)):
        # GradScaler looks at the gradients only (dL/dh holds the bias gradient's terms); a
        # non-finite loss makes them non-finite too. The pass stops at the first inf/NaN.
        p = forward.backward(loss_scale=s, stop_at_nonfinite=True)
        bad = p is None
        scales.append(s)
        skipped.append(bad)
        losses.append(forward.loss)
        s, tracker = update_scale(s, tracker, bad)
        if not bad:
            break
    if p is None:  # every step skipped: the last one's backward pass, in full
        p = forward.backward(loss_scale=scales[-1])
    return ScalerProbe(p, losses, ScaleHistory(np.array(scales), np.array(skipped)),
                       forward.peak())  # the largest forward activation, layer by layer


def scale_actions(history: ScaleHistory) -> list[str]:
    """Step k: 'skip' or 'step', plus '; shrink to S_{k+1}' if S_{k+1} < S_k, '; grow to' if >."""
    scale, skipped = np.asarray(history.scale), np.asarray(history.skipped, dtype=bool)
    actions = []
    for k in range(scale.size):
        after = f"{scale[k + 1]:g}" if k + 1 < scale.size else None
        if skipped[k]:  # a static scaler skips without shrinking
            shrinks = after is not None and scale[k + 1] < scale[k]
            actions.append(f"skip; shrink to {after}" if shrinks else "skip")
        elif after is not None and scale[k + 1] > scale[k]:
            actions.append(f"step; grow to {after}")
        else:
            actions.append("step")
    return actions


def _same_bits(u: torch.Tensor, v: torch.Tensor) -> bool:
    """Same dtype, shape and bit pattern (-0.0 is not 0.0; NaNs must share sign and payload)."""
    if u.dtype != v.dtype or u.shape != v.shape:
        return False
    return bool(torch.equal(u.detach().contiguous().reshape(-1).view(torch.uint8),
                            v.detach().contiguous().reshape(-1).view(torch.uint8)))


def grads_identical(a: TrainLog, b: TrainLog) -> list[bool]:
    """Per step: bit-identical gradients in both runs, same dtype and shape (needs keep_grads)."""
    if len(a.grads) != len(b.grads) or not a.grads:
        raise ValueError(f"both logs need the gradients of every step (keep_grads=True); got "
                         f"{len(a.grads)} and {len(b.grads)} steps")
    return [len(ga) == len(gb) and all(_same_bits(u, v) for u, v in zip(ga, gb, strict=True))
            for ga, gb in zip(a.grads, b.grads, strict=True)]


class AmpStep(NamedTuple):
    """One optimizer step of train_amp: the scale used, whether it was skipped, lr, true norm."""

    step: int
    scale: float
    skipped: bool
    lr: float  # the learning rate after this step's scheduler call
    norm: float | None  # the true (unscaled) gradient norm before clipping; None if skipped


def train_amp(factory: Callable[[], torch.nn.Module], x: torch.Tensor, y: torch.Tensor, scaler,
              steps: int, checkpoint: io.BytesIO | None = None, *, accum: int = 2,
              max_norm: float = 5e-5, lr: float = 0.5, momentum: float = 0.9,
              step_size: int = 4, gamma: float = 0.5,
              dtype: torch.dtype = torch.float16
              ) -> tuple[list[AmpStep], torch.nn.Module, io.BytesIO]:
    """CPU autocast: sum of scaled loss/accum over micro-batches, unscale_, clip, step, schedule.

    The scheduler steps only when the optimizer did (a skipped step makes no update). With a
    `checkpoint` (what an earlier call returned) the run resumes from its model, optimizer,
    scheduler, scaler and step; `steps` counts from the start of the run. `accum` must divide
    len(x), so that the micro-batches are equal and loss/accum sums to the batch mean. Returns
    the per-step log, the model and a checkpoint taken after the last step.
    """
    if int(steps) != steps or steps < 0:
        raise ValueError(f"steps must be a non-negative integer; got steps={steps!r}")
    if int(accum) != accum or accum < 1 or len(x) % accum:
        divisors = [d for d in range(1, len(x) + 1) if len(x) % d == 0]
        raise ValueError(f"accum must divide the batch of {len(x)} into equal micro-batches; got "
                         f"accum={accum!r}; valid choices: {', '.join(map(str, divisors))}")
    check_positive(max_norm, "max_norm")
    model = factory()
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=momentum)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=step_size, gamma=gamma)
    first = 0
    if checkpoint is not None:
        checkpoint.seek(0)
        state = torch.load(checkpoint, weights_only=True)
        first = state["step"]
        if steps < first:  # checked before the scaler passed in takes the checkpoint's state
            raise ValueError(f"steps counts from the start of the run and the checkpoint was "
                             f"taken after step {first}: steps must be >= {first}; got "
                             f"steps={steps!r}")
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        sched.load_state_dict(state["sched"])
        scaler.load_state_dict(state["scaler"])
    log = []
    for step in range(first, int(steps)):
        opt.zero_grad(set_to_none=True)
        for xb, yb in zip(x.chunk(accum), y.chunk(accum), strict=True):
            with torch.autocast("cpu", dtype=dtype):
                loss = torch.nn.functional.mse_loss(model(xb), yb) / accum
            scaler.scale(loss).backward()  # scaled gradients add up
        scaler.unscale_(opt)  # true gradients from here on ...
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
        scale = scaler.get_scale()
        scaler.step(opt)  # ... and opt.step() only if none is inf/NaN
        scaler.update()
        skipped = scaler.get_scale() < scale
        if not skipped:
            sched.step()  # the schedule counts the updates actually made
        log.append(AmpStep(step, scale, skipped, sched.get_last_lr()[0],
                           None if skipped else float(norm)))  # a skipped norm is inf/NaN
    buf = io.BytesIO()
    torch.save({"model": model.state_dict(), "opt": opt.state_dict(),
                "sched": sched.state_dict(), "scaler": scaler.state_dict(),
                "step": int(steps)}, buf)
    buf.seek(0)
    return log, model, buf
