"""The cheap check of a step `watch` does not record: is anything the step produced not finite?

On a step that takes no statistics, `watch` hooks no module but the model itself. Before the
model's forward, a `Snapshot` keeps what a replay of the step needs: references to the inputs
and their version counters, the random number generators' states, the grad and autocast modes,
and copies of the buffers that an earlier forward changed. After the forward, the model's
outputs are checked (one sum each, `all_finite`); at the end of the backward (a callback queued
by a hook on the outputs' gradient), the parameters' gradients and the outputs' gradients are.
A check that fails calls back into the watch, which replays the step on the snapshot with every
module hooked, forward (and backward, with the saved output gradients, through
`torch.autograd.grad`, which leaves every `.grad` alone) to name the first operation.

What a step's check sees: every inf or NaN that reaches the model's output, the gradient the
loss sends into the model, or a parameter's gradient. An inf that the model absorbs before its
output (clamped, masked out, multiplied by 0) reaches none of them; `watch(check="modules")`
checks every module's output every step instead, at the cost of one aminmax per module.
"""

from __future__ import annotations

import contextlib
from functools import partial

import torch

from .batch import tensors
from .watch_cause import KeepGenerators, scratch_buffers

__all__ = ["Snapshot", "StepGuard", "all_finite", "autocast_modes", "same_bits"]



def all_finite(ts) -> bool:
    """True if every entry of every tensor in ts is finite. Fast path: one sum per tensor
    (in float32 or wider) and their sum, one synchronisation: an inf or NaN entry makes its
    sum inf or NaN, so a finite total proves every entry finite; a total that is not finite
    (an inf, or finite values whose sum overflows) is settled by an exact check per tensor.

    Examples
    --------
    >>> import torch
    >>> from precisionlab.diagnose.watch_guard import all_finite
    >>> all_finite([torch.ones(3), torch.tensor([1.0, float("nan")])])
    False
    >>> all_finite([torch.full((2,), 3e38)])  # the sum overflows, the entries do not
    True
    """
    ts = [t.detach() for t in ts if t.numel()]
    if not ts:
        return True
    sums = [t.sum(dtype=torch.float64 if t.dtype == torch.float64 else torch.float32)
            for t in ts]
    if len({x.device for x in sums}) > 1:
        sums = [x.cpu() for x in sums]
    if len({x.dtype for x in sums}) > 1:
        sums = [x.double() for x in sums]
    total = sums[0] if len(sums) == 1 else torch.stack(sums).sum(dtype=torch.float64)
    if bool(torch.isfinite(total)):
        return True
    return all(bool(torch.isfinite(t).all()) for t in ts)


def _autocast_on(device: str) -> tuple[bool, torch.dtype]:
    try:
        return torch.is_autocast_enabled(device), torch.get_autocast_dtype(device)
    except (TypeError, AttributeError):  # torch < 2.4
        if device == "cpu":
            return torch.is_autocast_cpu_enabled(), torch.get_autocast_cpu_dtype()
        return torch.is_autocast_enabled(), torch.get_autocast_gpu_dtype()


def autocast_modes(devices: tuple[str, ...]) -> tuple[tuple[str, torch.dtype], ...]:
    """The (device type, dtype) of each autocast context in force, of the given devices."""
    return tuple((d, dt) for d in devices for on, dt in (_autocast_on(d),) if on)


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """True if a and b hold the same values, NaN where the other holds NaN."""
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    a, b = a.detach(), b.detach()
    both_nan = torch.isnan(a) & torch.isnan(b)
    return bool(((a == b) | both_nan).all())


class Snapshot:
    """What one forward of the model started from (`StepGuard.pre` takes it)."""

    def __init__(self, args, kwargs, rng, cuda_rng, grad, autocast, buffers, lost):
        self.args, self.kwargs = args, kwargs
        ins = tensors(list(args)) + tensors(list(kwargs.values()))
        self.inputs = [(t, t._version) for t in ins]
        self.rng, self.cuda_rng, self.grad, self.autocast = rng, cuda_rng, grad, autocast
        self.buffers, self.lost = buffers, lost  # copies of changing buffers; names not copied
        self.outs: list[torch.Tensor] = []
        self.grads: dict[int, torch.Tensor] = {}
        self.queued = False

    def inputs_unchanged(self) -> bool:
        """True if no input was written in place since the forward began."""
        return all(t._version == v for t, v in self.inputs)

    @contextlib.contextmanager
    def restored(self, root: torch.nn.Module, devices: list[int]):
        """Within: the default random number generators, grad and autocast modes and the copied
        buffers as the forward found them (every buffer a clone); afterwards all as they were,
        a generator= of the model's own included (its draws are not replayed: a replay of a
        model that draws from one does not reproduce the step and is not trusted)."""
        with torch.random.fork_rng(devices=devices), contextlib.ExitStack() as stack:
            torch.set_rng_state(self.rng)
            for d, s in zip(devices, self.cuda_rng, strict=True):
                torch.cuda.set_rng_state(s, d)
            # the replay writes to clones of every buffer: the model's own ones keep their
            # values and version counters (the step's backward may have saved them)
            stack.enter_context(scratch_buffers(root, self.buffers))
            stack.enter_context(KeepGenerators())
            stack.enter_context(torch.set_grad_enabled(self.grad))
            for dev, dt in self.autocast:
                stack.enter_context(torch.autocast(dev, dtype=dt))
            yield


class StepGuard:
    """The model-level hooks of a step without statistics (see the module docstring).

    Parameters
    ----------
    root : torch.nn.Module
        The model (unwrapped).
    on_forward : callable(Snapshot, list of Tensor)
        Called when an output of the model is not finite.
    on_backward : callable(Snapshot)
        Called at the end of a backward in which an output's or a parameter's gradient is
        not finite.
    """

    def __init__(self, root: torch.nn.Module, on_forward, on_backward):
        self.root, self.on_forward, self.on_backward = root, on_forward, on_backward
        self.params = [p for p in root.parameters() if p.requires_grad]
        self.devices = sorted({p.device.index or 0 for p in root.parameters()
                               if p.device.type == "cuda"})
        self.kinds = ("cpu", "cuda") if self.devices else ("cpu",)
        self.buffers = [(n, b) for n, b in root.named_buffers()]
        self.changing: set[str] = set()  # buffers an earlier forward wrote to
        self.enabled = False
        self._versions: list[int] = []
        self._snap: Snapshot | None = None

    def pre(self, module, args, kwargs) -> None:
        """Forward pre-hook of the model: take the snapshot."""
        if not self.enabled:
            return
        self._versions = [b._version for _, b in self.buffers]
        copies = {n: b.detach().clone() for n, b in self.buffers if n in self.changing}
        cuda = [torch.cuda.get_rng_state(d) for d in self.devices]
        self._snap = Snapshot(args, kwargs, torch.get_rng_state(), cuda,
                              torch.is_grad_enabled(), autocast_modes(self.kinds), copies, [])

    def post(self, module, args, kwargs, out) -> None:
        """Forward hook of the model: check its outputs; hook their gradients."""
        snap, self._snap = self._snap, None
        if not self.enabled or snap is None:
            return
        for (n, b), v in zip(self.buffers, self._versions, strict=True):
            if b._version != v and n not in snap.buffers:
                self.changing.add(n)
                snap.lost.append(n)
        outs = [t for t in tensors(out) if t.is_floating_point()]
        snap.outs = [t.detach() for t in outs]
        if not all_finite(outs):
            self.on_forward(snap, outs)
        if torch.is_grad_enabled():
            for k, t in enumerate(outs):
                if t.requires_grad:
                    t.register_hook(partial(self._out_grad, snap, k))

    def _out_grad(self, snap: Snapshot, k: int, g) -> None:
        if g is None or not self.enabled:
            return
        snap.grads[k] = g.detach()
        if not snap.queued:
            snap.queued = True
            torch.autograd.Variable._execution_engine.queue_callback(
                partial(self._backward_done, snap))

    def _backward_done(self, snap: Snapshot) -> None:
        grads = [p.grad for p in self.params if p.grad is not None]
        if not all_finite(list(snap.grads.values()) + grads):
            self.on_backward(snap)
