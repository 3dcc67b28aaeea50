"""Watch a training run in the reader's own loop: per-layer statistics every N steps, the first
inf or NaN of every step named when it happens, the loss scale and every skipped step; under
torch.distributed, reduced across the ranks.

Hooks, all reading, none writing. On a recorded step (and every step with check="modules"):
a forward hook on every module checks each new output tensor (one `torch.aminmax`) and counts
a leaf module's activations (`watch_counts`); a tensor hook on each output and input that
requires grad does the same for gradients in the backward; a hook on each float16/bfloat16
parameter (each parameter under a GradScaler) checks its gradient, and the other parameters'
.grad are checked at the step's end (one sum each). The first tensor of a step that is not
finite is explained by `watch_cause` (forward: the module re-run on its saved inputs to name
the torch function; the mechanism and chapter from `watch_report.MECHANISMS`). A gradient
is blamed on the module whose backward produced it: the module that took the tensor as
input, or the loss when the tensor is the model's output.
Parameter gradients are counted at the end of a recorded step, from .grad: the reduced
gradient under DDP (replicated: the ranks' counts are the same, reduced by max), this rank's
shard under FSDP2 (summed over the ranks); activations and output gradients are summed over
the ranks, amax reduced by max. Under a GradScaler the output gradients are the scaled ones
(what the backward computes in), the parameter gradients the unscaled ones (what the
optimizer steps with); a step whose scale fell at `scaler.update()` was skipped.
On any other step only the model is hooked (`watch_guard.StepGuard`): its outputs, the
gradient the loss sends in and the parameters' gradients are checked, and when one is not
finite the step is replayed on a snapshot with every module hooked, as on a recorded step.
"""

from __future__ import annotations

import math
import os
import pathlib
import weakref
from functools import partial

import numpy as np
import torch

from ..checks import check_choice, check_count
from .batch import tensors
from .report import check_module
from .watch_args import check_optimizer, check_real, check_scaler, unwrap
from .watch_cause import backward_mechanism, detached_copy, forward_mechanism, replay, tensor_range
from .watch_counts import cast_bounds, check_formats, magnitude_range, tensor_counts
from .watch_guard import StepGuard, all_finite, same_bits
from .watch_log import WatchLog, check_tensorboard, dump_inputs
from .watch_ranks import gather_events, local_shard, rank_and_world, reduce_counts
from .watch_report import LayerStats, NonFinite, SkippedStep, WatchReport

__all__ = ["CHECKS", "ON_NONFINITE", "NonFiniteError", "Watch", "watch"]

ON_NONFINITE: tuple[str, ...] = ("record", "raise", "dump")
CHECKS: tuple[str, ...] = ("outputs", "modules")
_ACT, _OUT_GRAD, _PARAM_GRAD = "activation", "output grad", "param grad"


class NonFiniteError(FloatingPointError):
    """Raised by a watch with on_nonfinite="raise" at the first inf/NaN; `.event` says where."""

    def __init__(self, event: NonFinite):
        super().__init__(event.describe())
        self.event = event


class _Tag:
    """What the watch knows of one tensor of the current step."""

    __slots__ = ("amax", "consumer", "counted", "final", "grad_counted", "leaf", "module", "ref")

    def __init__(self, t: torch.Tensor, module: str | None, leaf: str | None):
        self.ref = weakref.ref(t)
        self.module, self.leaf, self.consumer = module, leaf, None
        self.amax, self.counted, self.grad_counted = math.nan, False, False
        self.final = False  # an output of the model itself


def _amax(lo: float, hi: float) -> float:
    return math.nan if math.isnan(lo) or math.isnan(hi) else max(-lo, hi)


class Watch:
    """The hooks of `watch` over one model: a context manager; `step(loss)` ends a step.

    Attributes
    ----------
    formats : tuple of str
        The formats counted.
    every : int
        Statistics are taken on steps 0, every, 2 every, ...
    events : list of NonFinite
        The first inf/NaN of each step that had one, in step order (all ranks').
    """

    def __init__(self, model, every, formats, scaler, optimizer, log_dir, on_nonfinite,
                 check="outputs", tensorboard=False):
        self.model, self.check, self.tensorboard = model, check, tensorboard
        self.every = every
        self._bounds = cast_bounds(formats)
        self.formats = self._bounds.formats
        self.scaler, self.optimizer, self.on_nonfinite = scaler, optimizer, on_nonfinite
        self.log_dir = None if log_dir is None else pathlib.Path(log_dir)
        self._root = unwrap(model)
        mods = list(self._root.named_modules())
        self._leaves = [p for p, m in mods if next(iter(m.children()), None) is None]
        owners = [p for p, m in mods if next(iter(m.parameters(recurse=False)), None) is not None]
        self._slots = {}
        for p in self._leaves:
            self._slots[(p, _ACT)] = len(self._slots)
            self._slots[(p, _OUT_GRAD)] = len(self._slots)
        for p in owners:
            self._slots[(p, _PARAM_GRAD)] = len(self._slots)
        self._modules = dict(mods)
        self._owners = owners
        self._pnames = {id(p): n for n, p in self._root.named_parameters()}
        self._params = frozenset(self._pnames)
        self._sharded = any(type(p).__name__ == "DTensor" for p in self._root.parameters())
        self._auto = optimizer is not None
        self._masks: set[str] = set()  # modules whose outputs hold -inf masks on purpose
        self.events: list[NonFinite] = []
        self._records: list[LayerStats] = []
        self._skips: list[SkippedStep] = []
        self._scales: list[tuple[int, float]] = []
        self._losses: list[tuple[int, float]] = []
        self._step = 0
        self._handles: list = []
        self._full_handles: list = []  # the per-module hooks, on while self._full
        self._guard = StepGuard(self._root, self._guard_forward, self._guard_backward)
        self._active = self._replaying = self._in_replay = False
        self._rank, self._world = 0, 1
        self._log = WatchLog(None, False, False)
        self._orig_update = None
        self._reset()

    # ---- the step's state
    def _reset(self) -> None:
        self._recording = self._step % self.every == 0
        self._counts = self._amaxes = None  # filled on recorded steps only
        if self._recording:
            n = len(self._slots)
            self._counts = np.zeros((n, 3 + 3 * len(self.formats)), dtype=np.int64)
            self._amaxes = np.full(n, -1.0)
        self._tags: dict[int, _Tag] = {}
        self._fwd_event = self._bwd_event = None
        self._pending: str | None = None  # a module whose non-finite input no module made
        self._step_events: list[NonFinite] = []
        self._update = None
        self._full = self._recording or self.check == "modules" or self._sharded
        self._guard.enabled = not self._full
        if self._active:
            self._install(self._full)

    def _add(self, path: str, kind: str, amax: float, counts: np.ndarray) -> None:
        i = self._slots.get((path, kind))
        if i is None:
            return
        self._counts[i] += counts
        a = math.inf if math.isnan(amax) else amax
        self._amaxes[i] = max(self._amaxes[i], a)

    def _tag_of(self, t: torch.Tensor) -> _Tag | None:
        tag = self._tags.get(id(t))
        return tag if tag is not None and tag.ref() is t else None

    def _new_tag(self, t: torch.Tensor, module: str | None, leaf: str | None) -> _Tag:
        tag = self._tags[id(t)] = _Tag(t, module, leaf)
        if t.requires_grad and torch.is_grad_enabled():
            t.register_hook(partial(self._grad_hook, tag))
        return tag

    # ---- hooks
    def _forward_hook(self, path, leaf, module, args, kwargs, out):
        if not self._active or self._replaying:
            return
        grad = torch.is_grad_enabled()
        for t in tensors(out):
            if not t.is_floating_point():
                continue
            tag = self._tag_of(t)
            if tag is None:
                tag = self._new_tag(t, path, path if leaf else None)
                lo, hi = magnitude_range(t)
                tag.amax = _amax(lo, hi)
                if self._fwd_event is None and not math.isfinite(tag.amax) and not (
                        path in self._masks and not math.isnan(tag.amax)):
                    self._forward_event(path, module, args, kwargs, t)
            if not path:
                tag.final = True
            if leaf and self._recording and grad and not tag.counted and tag.leaf == path:
                tag.counted = True
                self._add(path, _ACT, *tensor_counts(t, self._bounds, tag.amax))
        if self._pending is not None and self._pending != path and (
                not path or self._pending.startswith(path + ".")):
            self._resolve(path, module, args, kwargs)
        if grad:
            for t in tensors(list(args)) + tensors(list(kwargs.values())):
                if t.is_floating_point() and t.requires_grad:
                    tag = self._tag_of(t) or self._new_tag(t, None, None)
                    if tag.consumer is None:
                        tag.consumer = path

    def _grad_hook(self, tag: _Tag, g):
        if not self._active or self._replaying or g is None:
            return
        amax = None
        if self._bwd_event is None and self._fwd_event is None:  # not a forward's consequence
            amax = _amax(*magnitude_range(g))
            if not math.isfinite(amax):
                if tag.consumer is not None:
                    module = tag.consumer
                    op = f"{module or '(model)'}: backward (gradient of its input)"
                elif not tag.final and tag.module:  # used by an enclosing module's own code
                    module = tag.module.rpartition(".")[0]
                    op = (f"{module or '(model)'}: backward of its own code after "
                          f"{tag.module}'s output")
                else:
                    module = tag.module or ""
                    op = (f"the loss, outside the model: gradient of "
                          f"{module or 'the model'}'s output")
                self._backward_event(module, op, g)
        if self._recording and tag.leaf is not None and not tag.grad_counted:
            tag.grad_counted = True
            self._add(tag.leaf, _OUT_GRAD, *tensor_counts(g, self._bounds, amax))

    def _param_hook(self, name: str, g):
        if (not self._active or self._replaying or g is None or self._bwd_event is not None
                or self._fwd_event is not None):
            return
        if not math.isfinite(_amax(*magnitude_range(local_shard(g)))):
            owner = name.rpartition(".")[0]
            self._backward_event(owner, f"{owner or '(model)'}: backward (gradient of {name})",
                                 local_shard(g))

    # ---- events
    def _scale_now(self) -> float | None:
        if self.scaler is None or not self.scaler.is_enabled():
            return None
        return float(self.scaler.get_scale())

    def _forward_event(self, path, module, args, kwargs, out) -> None:
        op = None
        if not self._sharded:  # an FSDP2 module's re-run would gather on one rank only
            self._replaying = True
            try:
                op = replay(module, path, args, kwargs)
            finally:
                self._replaying = False
        if op is not None and op.mask:  # a mask filled with -inf on purpose: only NaN from now
            self._masks.add(path)
            return
        if op is not None:
            name, a, kw, o, label = op.name, op.args, op.kwargs, op.out, op.label
        else:
            name, a, kw, o = f"{type(module).__name__}.forward", args, kwargs, out
            label = f"{path + ': ' if path else ''}{name}"
        mech, detail = forward_mechanism(name, tuple(a), dict(kw), o, self._params)
        ev = self._forward_record(path, module, args, kwargs, label, mech, detail, a, kw, o)
        self._fwd_event = ev
        if mech == "nonfinite_input" and path and not self._sharded and any(
                not bool(torch.isfinite(t).all()) and self._made_outside(t)
                for t in tensors(list(args)) + tensors(list(kwargs.values()))
                if t.is_floating_point()):
            # no module made that input: an enclosing module's own code did (or the batch);
            # re-run the enclosing modules as their forwards end (`_resolve`)
            self._pending = path
            self._step_events.append(ev)
            return
        self._event(ev)

    def _made_outside(self, t: torch.Tensor) -> bool:
        tag = self._tag_of(t)
        return tag is None or tag.module is None

    def _forward_record(self, path, module, args, kwargs, label, mech, detail, a, kw, o):
        ins = [t for t in tensors(list(a)) + tensors(list(kw.values())) if t.is_floating_point()]
        ranges = tuple(tensor_range(t, self._pnames.get(id(t), f"input {k}"))
                       for k, t in enumerate(ins))
        dump = dump_inputs(self.log_dir, path, self._step, self._rank,
                           {"args": args, "kwargs": kwargs}, module) \
            if self.on_nonfinite == "dump" else ""
        return NonFinite(self._step, "forward", path, label, mech, detail, ranges,
                         tensor_range(o, "output"), self._rank, dump)

    def _resolve(self, path, module, args, kwargs) -> None:
        """An enclosing module of the pending one ended its forward: re-run it to find the
        operation of its own code that made the non-finite input, and replace the pending
        event with it; else keep looking outwards, up to the model, and report the event."""
        ev = self._fwd_event
        self._replaying = True
        try:
            op = replay(module, path, args, kwargs)
        finally:
            self._replaying = False
        found = None
        if op is not None and not op.mask:
            mech, detail = forward_mechanism(op.name, tuple(op.args), dict(op.kwargs), op.out,
                                             self._params)
            if mech != "nonfinite_input":
                found = self._forward_record(path, module, args, kwargs, op.label, mech,
                                             detail, op.args, op.kwargs, op.out)
        if found is None and path:
            self._pending = path if any(
                not bool(torch.isfinite(t).all()) and self._made_outside(t)
                for t in tensors(list(args)) + tensors(list(kwargs.values()))
                if t.is_floating_point()) else None
            if self._pending is not None:
                return
        self._pending = None
        if found is not None:
            self._step_events[self._step_events.index(ev)] = found
            self._fwd_event = ev = found
        if self._raises():
            raise NonFiniteError(ev)

    def _backward_event(self, module: str, op: str, g: torch.Tensor) -> None:
        mech, detail = backward_mechanism(g, self._scale_now())
        dump = dump_inputs(self.log_dir, module, self._step, self._rank,
                                           {"grad": g}, None) if self.on_nonfinite == "dump" else ""
        ev = NonFinite(self._step, "backward", module, op, mech, detail, (),
                       tensor_range(g, "gradient"), self._rank, dump)
        self._bwd_event = ev
        self._event(ev)

    def _event(self, ev: NonFinite) -> None:
        self._step_events.append(ev)
        if self._raises():
            raise NonFiniteError(ev)

    def _raises(self) -> bool:  # at once: one process, not inside a replay of the step
        return self.on_nonfinite == "raise" and self._world == 1 and not self._in_replay

    # ---- a step without statistics: the guard's checks and the replay of the step
    def _guard_forward(self, snap, outs) -> None:
        if self._fwd_event is not None or ("" in self._masks and not any(
                bool(torch.isnan(t).any()) for t in outs)):
            return
        self._replay_step(snap, backward=False)

    def _guard_backward(self, snap) -> None:
        if self._fwd_event is None and self._bwd_event is None:
            self._replay_step(snap, backward=True)

    def _replay_step(self, snap, backward: bool) -> None:
        """Re-run the step's forward (and backward) from the snapshot with every module hooked;
        a replay whose outputs differ from the step's is not trusted: the event then names the
        model, as far as the step itself shows."""
        start, faithful = len(self._step_events), snap.inputs_unchanged()
        tags, self._tags = self._tags, {}
        self._in_replay, self._guard.enabled = True, False
        self._install(True)
        try:
            with snap.restored(self._root, self._guard.devices):
                a, kw = detached_copy(tuple(snap.args)), detached_copy(dict(snap.kwargs))
                new = [t for t in tensors(self._root(*a, **kw)) if t.is_floating_point()]
                faithful = faithful and len(new) == len(snap.outs) and all(
                    same_bits(x, y) for x, y in zip(new, snap.outs, strict=True))
                ks = [k for k in snap.grads if new[k].requires_grad] if faithful else []
                if backward and ks and self._fwd_event is None:
                    torch.autograd.grad([new[k] for k in ks], self._guard.params,
                                        [snap.grads[k] for k in ks], allow_unused=True)
        finally:
            self._in_replay, self._guard.enabled = False, not self._full
            self._tags = tags
            self._install(self._full)
        if not faithful:
            del self._step_events[start:]
            self._fwd_event = self._bwd_event = None
            self._pending = None
        why = "outputs differ" if snap.inputs_unchanged() else "inputs written in place"
        lost = f"; buffers not saved: {', '.join(snap.lost)}" if snap.lost else ""
        note = "" if faithful else f" (a replay of the step did not reproduce it: {why}{lost})"
        if len(self._step_events) == start:  # nothing named: what the step itself shows
            self._fallback(snap, backward, note)
        elif self._raises():
            raise NonFiniteError(self._step_events[start])

    def _fallback(self, snap, backward: bool, note: str) -> None:
        if not backward:
            out = next(t for t in snap.outs if not bool(torch.isfinite(t).all()))
            name = f"{type(self._root).__name__}.forward"
            # the model's parameters are its inputs too: one not finite is the likelier cause
            bad = tuple(p for p in self._root.parameters() if not bool(torch.isfinite(p).all()))
            mech, detail = forward_mechanism(name, tuple(snap.args) + bad, dict(snap.kwargs),
                                             out, self._params)
            ev = self._forward_record("", self._root, snap.args, snap.kwargs,
                                      f"(model): {name}", mech, detail + note, snap.args,
                                      snap.kwargs, out)
            self._fwd_event = ev
            return self._event(ev)
        # the gradient the loss sends in comes first in the backward, then the parameters'
        g = next((g for g in snap.grads.values() if not bool(torch.isfinite(g).all())), None)
        if g is not None:
            return self._backward_event("", f"the loss, outside the model: gradient of the "
                                        f"model's output{note}", g)
        for n, p in self._root.named_parameters():
            if p.grad is not None and not bool(torch.isfinite(p.grad).all()):
                owner = n.rpartition(".")[0]
                return self._backward_event(owner, f"{owner or '(model)'}: backward (gradient "
                                            f"of {n}){note}", p.grad)

    # ---- steps
    def step(self, loss=None) -> None:
        """End the step (optimizer=None) or log the loss of the step that just ended.

        Parameters
        ----------
        loss : torch.Tensor or float or None, default None
            The step's loss, logged with it.

        Raises
        ------
        RuntimeError
            If the watch is not open (outside its `with` block).
        """
        if not self._active:
            raise RuntimeError("the watch is not open: call w.step inside `with watch(...) as w`")
        if self._auto:
            if loss is not None and self._step > 0:
                self._log_loss(self._step - 1, loss)
            return
        self._end_step(loss)

    def _log_loss(self, step: int, loss) -> None:
        v = float(loss.detach().float()) if isinstance(loss, torch.Tensor) else float(loss)
        self._losses.append((step, v))
        self._log.rows([{"type": "loss", "step": step, "loss": v if math.isfinite(v) else None}])
        self._log.scalar("loss", v, step)

    def _end_step(self, loss=None) -> None:
        s = self._step
        if self._pending is not None:  # no enclosing module ended (a submodule called alone)
            self._pending = None
            if self.on_nonfinite == "raise" and self._world == 1:
                raise NonFiniteError(self._fwd_event)
        if self._recording:
            for path in self._owners:
                for p in self._modules[path].parameters(recurse=False):
                    if p.grad is not None:
                        self._add(path, _PARAM_GRAD, *tensor_counts(local_shard(p.grad), self._bounds))
        if self._full and not self._step_events and self._world == 1:
            # (under torch.distributed the reduced .grad holds every rank's inf: each rank
            # would name it; there the gradient hooks name the rank the inf came from)
            self._check_param_grads()
        scale = skip = None
        if self.scaler is not None:
            used, new = self._update or (self._scale_now(),) * 2
            scale = used
            if used is not None:
                self._scales.append((s, used))
                if new is not None and new < used:
                    skip = (used, new)
        self._reduce_events()
        if self._recording:
            self._reduce_stats(scale)
        if skip is not None:
            name, bad = "", 0
            for n, p in self._root.named_parameters():
                if p.grad is not None:
                    g = local_shard(p.grad)
                    k = int((~torch.isfinite(g)).sum())
                    if k:
                        name, bad = n, k
                        break
            ev = next(iter(self._step_events), None)  # a forward inf reaches the gradients
            self._skips.append(SkippedStep(s, skip[0], skip[1], name, bad, ev))
            self._log.rows([self._skips[-1].to_dict()])
        if scale is not None:
            self._log.rows([{"type": "scale", "step": s, "scale": scale}])
            self._log.scalar("loss_scale", scale, s)
        if loss is not None:
            self._log_loss(s, loss)
        raise_ev = next(iter(self._step_events), None) if self._world > 1 else None
        self._step += 1
        self._reset()
        if raise_ev is not None and self.on_nonfinite == "raise":
            raise NonFiniteError(raise_ev)

    def _check_param_grads(self) -> None:
        """At the end of a step with every module hooked: a float32 parameter's gradient is
        not hooked in the backward (see `_install`); one sum each names an inf/NaN at its
        step rather than at the next forward."""
        gs = [local_shard(p.grad) for p in self._guard.params if p.grad is not None]
        if not gs or all_finite(gs):
            return
        for n, p in self._root.named_parameters():
            if p.grad is not None and not bool(torch.isfinite(local_shard(p.grad)).all()):
                owner = n.rpartition(".")[0]
                return self._backward_event(owner, f"{owner or '(model)'}: backward (gradient "
                                            f"of {n})", local_shard(p.grad))

    def _reduce_events(self) -> None:
        events = gather_events(self._step_events, self._rank, self._world)
        self._step_events = events
        self.events += events
        self._log.rows([e.to_dict() for e in events])

    def _reduce_stats(self, scale) -> None:
        # DDP: the same reduced .grad on every rank (max, not sum); FSDP2: each rank's shard
        replicated = [] if self._sharded else [
            i for (_, k), i in self._slots.items() if k == _PARAM_GRAD]
        counts, amaxes = reduce_counts(self._counts, self._amaxes, replicated, self._world)
        new = []
        for (path, kind), i in self._slots.items():
            c = counts[i]
            if c[0] == 0:
                continue
            per = {f: tuple(int(v) for v in c[3 + 3 * k:6 + 3 * k])
                   for k, f in enumerate(self.formats)}
            new.append(LayerStats(self._step, path, kind, int(c[0]), float(amaxes[i]),
                                  int(c[1]), int(c[2]), per, scale))
        self._records += new
        self._log.rows([r.to_dict() for r in new])
        self._log.stats(new, self.formats)

    # ---- open, close, report
    def __enter__(self) -> Watch:
        if self._active:
            raise RuntimeError("this watch is already open")
        self._rank, self._world = rank_and_world()
        self._handles += [
            self._root.register_forward_pre_hook(self._guard.pre, with_kwargs=True),
            self._root.register_forward_hook(self._guard.post, with_kwargs=True)]
        self._install(self._full)
        if self.optimizer is not None and self.scaler is None:
            self._handles.append(self.optimizer.register_step_post_hook(
                lambda *_: self._end_step() if self._active else None))
        if self.scaler is not None:
            self._wrap_update()
        self._log = WatchLog(self.log_dir, self.tensorboard, self._rank == 0)
        self._active = True
        return self

    def _install(self, full: bool) -> None:
        """Hook every module and parameter (full) or none (the guard's steps)."""
        if not full:
            for h in self._full_handles:
                h.remove()
            self._full_handles = []
            return
        if self._full_handles:
            return
        leaves, hs = set(self._leaves), self._full_handles
        for path, m in self._modules.items():
            hs.append(m.register_forward_hook(partial(self._forward_hook, path, path in leaves),
                                              with_kwargs=True))
        for n, p in self._root.named_parameters():
            # a float32 parameter's gradient is checked in the backward only under a scaler
            # (autocast's float16 products); else through the activations' gradients and,
            # at the step's end, one sum of each .grad (`_check_param_grads`)
            wide = p.dtype in (torch.float32, torch.float64) and self.scaler is None
            if p.requires_grad and not wide:
                try:
                    hs.append(p.register_hook(partial(self._param_hook, n)))
                except RuntimeError:  # a parameter autograd does not see (sharded): skipped
                    pass

    def _wrap_update(self) -> None:
        scaler = self.scaler
        orig = scaler.update

        def update(*args, **kwargs):
            used = self._scale_now()
            out = orig(*args, **kwargs)
            self._update = (used, self._scale_now())
            if self._auto and self._active:
                self._end_step()
            return out
        self._orig_update = orig
        scaler.update = update

    def close(self) -> None:
        """Remove every hook, give the scaler its own update back, close the log files."""
        self._active = self._guard.enabled = False
        self._install(False)
        for h in self._handles:
            h.remove()
        self._handles = []
        if self._orig_update is not None:
            if "update" in vars(self.scaler):
                del self.scaler.update
            self._orig_update = None
        self._log.close()

    def __exit__(self, *exc) -> None:
        self.close()

    @property
    def first_nonfinite(self) -> NonFinite | None:
        """The first inf/NaN of the run so far (None if none)."""
        return self.events[0] if self.events else None

    @property
    def report(self) -> WatchReport:
        """The run so far as a `WatchReport`."""
        return WatchReport(self.formats, self.every, self._step, tuple(self._records),
                           tuple(self.events), tuple(self._skips), tuple(self._scales),
                           tuple(self._losses), self._world)


def watch(model, every: int = 50,
          formats=("float16", "bfloat16", "float8_e4m3fn", "float8_e5m2"), scaler=None,
          optimizer=None, log_dir: str | os.PathLike | None = None,
          on_nonfinite: str = "record", check: str = "outputs",
          tensorboard: bool = False) -> Watch:
    """Watch a training loop: every `every` steps per leaf module max|x| and the shares of
    activations and gradients a cast to each format would flush (|x| <= q/2), leave subnormal
    (< n - q/2) or overflow; headroom log2(max_finite / amax); the first inf/NaN of every step.

    Use it around the loop, `with watch(model, ...) as w:`, and end each step with
    `w.step(loss)` after the optimizer (and scaler) step; with `optimizer=` the steps end by
    themselves at `optimizer.step()` (at `scaler.update()` when a scaler is given too, so
    skipped steps count). The watch only reads: the run's numbers are the same with and
    without it. Every forward and backward inside a step counts (micro-batches add up);
    statistics skip forwards run under no_grad.

    Parameters
    ----------
    model : torch.nn.Module
        The model (a DistributedDataParallel or fully_shard'ed model too), with parameters.
    every : int, default 50
        Statistics are taken on steps 0, every, 2 every, ...; inf/NaN are checked every step
        (see `check`).
    formats : sequence of str, default ("float16", "bfloat16", "float8_e4m3fn", "float8_e5m2")
        The formats to count casts into (`watch_counts.WATCH_FORMATS`, or aliases).
    scaler : torch.amp.GradScaler or None, default None
        The run's GradScaler: its scale is logged and each step it skips is explained.
    optimizer : torch.optim.Optimizer or None, default None
        The run's optimizer; given, the steps end by themselves.
    log_dir : str or path or None, default None
        A folder for `watch.jsonl` (one JSON object a line: stats, nonfinite, skip, scale,
        loss); rank 0 writes it.
    tensorboard : bool, default False
        Also write TensorBoard event files to log_dir through torch.utils.tensorboard
        (scalars amax/{kind}/{module}, headroom_{format}/{kind}/{module}, loss_scale, loss;
        a value that is not finite, such as the headroom -inf of an overflowing layer, is
        left out of the events, watch.jsonl has it); needs the tensorboard package
        (`pip install tensorboard`).
    on_nonfinite : {"record", "raise", "dump"}, default "record"
        At the first inf/NaN of a step: record it; raise `NonFiniteError` (at once; under
        torch.distributed at the step's end, on every rank); or record it and save the
        offending module's inputs and state to log_dir/nonfinite-step{S}-rank{R}-{path}.pt.
    check : {"outputs", "modules"}, default "outputs"
        What a step without statistics checks. "outputs": the model's outputs, the gradient
        the loss sends into them and every parameter's gradient (one sum each); when one
        is not finite the step is replayed from a snapshot with every module checked, so the
        first operation is named at its step; an inf absorbed inside the model (clamped,
        masked out) is seen on recorded steps only. "modules": every module's output and
        gradient every step, as on a recorded step (slower). Under FSDP2 every step checks
        every module (a replay would gather parameters on one rank only). A replay (of the
        step, or of one module on a recorded step) runs forwards again: on clones of the
        buffers, with the default generators restored and a generator= of the model's own
        given its state back, so the run's numbers do not change; the user's own hooks run
        again too, and a forward that communicates (SyncBatchNorm, tensor parallelism)
        would wait for the other ranks: use check="modules" there. A replay whose outputs
        are not the step's (a generator of the model's own, an input written in place,
        a non-deterministic kernel) is not trusted: the event names what the step shows.

    Returns
    -------
    Watch
        A context manager; `w.step(loss)`, `w.report` (a `WatchReport`), `w.events`.

    Raises
    ------
    ValueError
        If model is not a Module with real parameters, every < 1, a format is unknown, scaler is
        not a GradScaler, optimizer is not an Optimizer or holds none of model's parameters,
        on_nonfinite or check is unknown, on_nonfinite="dump" or tensorboard=True without a
        log_dir.
    ImportError
        If tensorboard=True and the tensorboard package is not installed.

    Examples
    --------
    A float16 layer whose output passes 65504 is named at the step it happens:

    >>> import torch
    >>> from torch import nn
    >>> from precisionlab import diagnose
    >>> model = nn.Sequential(nn.Linear(2, 2, bias=False)).half()
    >>> with torch.no_grad():
    ...     _ = model[0].weight.fill_(300.0)
    >>> with diagnose.watch(model, every=1, formats=("float16",)) as w:
    ...     for x in (1.0, 200.0):
    ...         out = model(torch.full((1, 2), x, dtype=torch.float16))
    ...         w.step()
    >>> e = w.report.first_nonfinite
    >>> e.step, e.op, e.mechanism, e.chapter
    (1, '0: linear#0', 'overflow', 1)
    """
    check_module(model)
    check_real(model)
    every = check_count(every, "every", 1)
    names = check_formats(formats)
    check_choice(on_nonfinite, "on_nonfinite", ON_NONFINITE)
    check_choice(check, "check", CHECKS)
    check_scaler(scaler)
    check_optimizer(optimizer, model)
    if on_nonfinite == "dump" and log_dir is None:
        raise ValueError("on_nonfinite='dump' saves the inputs under log_dir; got log_dir=None")
    tensorboard = check_tensorboard(tensorboard, log_dir)
    return Watch(model, every, names, scaler, optimizer, log_dir, on_nonfinite, check,
                 tensorboard)
