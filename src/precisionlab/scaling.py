"""Loss scaling from scratch, with the semantics and defaults of ``torch.amp.GradScaler``.

Multiplying the loss by S multiplies every gradient by S (chain rule), which lifts gradients
that would be below the float16 floor into its range; dividing by S afterwards, in float32,
gives them back their true size. `StaticLossScaler` keeps S fixed. `DynamicLossScaler`
adapts it the way GradScaler does (torch/amp/grad_scaler.py and the ``_amp_update_scale_``
kernel): start at S = 2^16; if any gradient is inf/NaN, skip the optimizer step, multiply S
by ``backoff_factor`` (0.5) and reset the count of good steps; after ``growth_interval``
(2000) consecutive good steps multiply S by ``growth_factor`` (2.0), unless that overflows
float32. S lives in float32, and unscaling multiplies by fl32(1/S) computed in float64.

Both scalers have GradScaler's interface (``scale``, ``unscale_``, ``step``, ``update``,
``get_scale``, ``state_dict``), so a training loop takes either, and both keep a record of
the scale used at every step and of the skipped steps (`ScaleHistory`).

`train_scaled` computes with `emulate` by default (float16/bfloat16 rounding, float32
accumulation in a fixed order, float64 optimizer arithmetic), so its numbers are the same on
every machine; backend='native' runs torch's CPU autocast kernels instead. The scalers'
own arithmetic (multiplying by a power of two, inf/NaN checks) is exact IEEE arithmetic.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from . import emulate
from .checks import check_choice, check_positive
from .formats import get_format
from .rounding import round_to

__all__ = [
    "GRADSCALER_DEFAULTS",
    "DynamicLossScaler",
    "ScaleHistory",
    "SideBySide",
    "StaticLossScaler",
    "TrainLog",
    "compare_with_gradscaler",
    "forward_loss",
    "forward_loss_split",
    "gradient_stream",
    "largest_safe_gradient",
    "make_regression_task",
    "simulate_scale_history",
    "smallest_surviving_gradient",
    "trace_dynamic_scaling",
    "train_scaled",
    "update_scale",
]

# torch.amp.GradScaler's defaults (checked against its signature in tests/test_scaling.py).
GRADSCALER_DEFAULTS: dict[str, float | int] = {
    "init_scale": 2.0**16,
    "growth_factor": 2.0,
    "backoff_factor": 0.5,
    "growth_interval": 2000,
}
SURVIVAL_FLOORS: tuple[str, ...] = ("zero", "subnormal", "normal")


# --------------------------------------------------------------------------- the rule


def update_scale(scale: float, growth_tracker: int, found_inf: bool, growth_factor: float = 2.0,
                 backoff_factor: float = 0.5, growth_interval: int = 2000) -> tuple[float, int]:
    """One update: inf/NaN -> (fl32(S·backoff), 0); else t+1 good steps, and at t+1 = interval (fl32(S·growth) if finite, 0)."""
    _check_factors(1.0, growth_factor, backoff_factor, growth_interval)
    if isinstance(scale, (bool, str)) or not _is_real(scale) or math.isnan(float(scale)) or scale < 0:
        raise ValueError(f"scale must be a number >= 0 (a float32 value); got scale={scale!r}")
    if isinstance(growth_tracker, bool) or not _is_int(growth_tracker) or growth_tracker < 0:
        raise ValueError(f"growth_tracker must be an integer >= 0; got growth_tracker={growth_tracker!r}")
    return _next_scale(scale, int(growth_tracker), found_inf, growth_factor, backoff_factor,
                       growth_interval)


def _next_scale(scale: float, growth_tracker: int, found_inf: bool, growth_factor: float,
                backoff_factor: float, growth_interval: int) -> tuple[float, int]:
    """update_scale's rule on checked arguments (the loops below check theirs once)."""
    # The kernel multiplies the float32 scale by a double factor and stores the product as
    # float32; float64 arithmetic followed by one rounding to float32 reproduces that exactly.
    s32 = float(np.float32(scale))
    if found_inf:
        return _to_float32(s32 * backoff_factor), 0
    successful = growth_tracker + 1
    if successful == growth_interval:
        grown = _to_float32(s32 * growth_factor)
        return (grown if math.isfinite(grown) else s32), 0  # never grow past float32's range
    return s32, successful


def _to_float32(x: float) -> float:
    """fl32(x) as a Python float: round to nearest even, overflow to inf, like a C float store."""
    with np.errstate(over="ignore"):
        return float(np.float32(x))


def _reciprocal32(scale: float) -> float:
    """fl32(1/S) with the reciprocal taken in float64 (1/0 = inf, as in GradScaler)."""
    with np.errstate(divide="ignore", over="ignore"):
        return float(np.float32(np.float64(1.0) / np.float64(scale)))


def _is_real(x) -> bool:
    try:
        float(x)
    except (TypeError, ValueError):
        return False
    return not isinstance(x, (bool, str))


def _is_int(x) -> bool:
    return _is_real(x) and math.isfinite(float(x)) and int(x) == x


def _check_factors(init_scale, growth_factor, backoff_factor, growth_interval):
    """Each setting must be a number in its range (a finite float > 0, > 1, in (0, 1), an integer >= 1)."""
    check_positive(init_scale, "init_scale")
    g = float(growth_factor) if _is_real(growth_factor) else math.nan
    if not (math.isfinite(g) and g > 1.0):
        raise ValueError(f"growth_factor must be a finite number > 1.0; got growth_factor={growth_factor!r}")
    b = float(backoff_factor) if _is_real(backoff_factor) else math.nan
    if not 0.0 < b < 1.0:
        raise ValueError(f"backoff_factor must be a number in (0, 1); got backoff_factor={backoff_factor!r}")
    if isinstance(growth_interval, bool) or not _is_int(growth_interval) or growth_interval < 1:
        raise ValueError(
            f"growth_interval must be a positive integer; got growth_interval={growth_interval!r}"
        )


# --------------------------------------------------------------------------- records


@dataclass(frozen=True)
class ScaleHistory:
    """Per step: the scale the loss was multiplied by, and whether the optimizer step was skipped."""

    scale: np.ndarray  # float64 values of the float32 scale
    skipped: np.ndarray  # bool

    @property
    def steps(self) -> int:
        """Number of recorded steps."""
        return len(self.scale)

    @property
    def skipped_steps(self) -> np.ndarray:
        """Indices of the skipped steps."""
        return np.flatnonzero(self.skipped)

    @property
    def growth_steps(self) -> np.ndarray:
        """Indices k where the scale grew after step k (scale[k+1] > scale[k])."""
        return np.flatnonzero(self.scale[1:] > self.scale[:-1])


class _ScalerBase:
    """GradScaler's bookkeeping: scale, per-optimizer stage, inf checks, and the history."""

    _READY, _UNSCALED, _STEPPED = "ready", "unscaled", "stepped"

    def __init__(self, init_scale: float, enabled: bool):
        self._enabled = bool(enabled)
        self._scale = float(np.float32(init_scale))  # GradScaler keeps it in a float32 tensor
        self._growth_tracker = 0
        self._per_optimizer: dict[int, dict[str, Any]] = {}
        self._scales: list[float] = []
        self._skipped: list[bool] = []

    # -- GradScaler's public interface

    def is_enabled(self) -> bool:
        """False: scale() and update() do nothing and step() just calls optimizer.step()."""
        return self._enabled

    def get_scale(self) -> float:
        """The current scale S (1.0 when disabled)."""
        return self._scale if self._enabled else 1.0

    def scale(self, outputs):
        """outputs · S for a tensor or a (nested) list/tuple of tensors; S is a float32 tensor."""
        if not self._enabled:
            return outputs
        if isinstance(outputs, torch.Tensor):
            return outputs * torch.tensor(self._scale, dtype=torch.float32, device=outputs.device)
        if isinstance(outputs, (list, tuple)):
            return type(outputs)(self.scale(o) for o in outputs)
        if isinstance(outputs, Iterable):
            return map(self.scale, outputs)
        raise ValueError(
            f"outputs must be a Tensor or an iterable of Tensors; got {type(outputs).__name__}"
        )

    def _state(self, optimizer) -> dict[str, Any]:
        return self._per_optimizer.setdefault(id(optimizer), {"stage": self._READY,
                                                              "found_inf": None})

    def unscale_(self, optimizer: torch.optim.Optimizer) -> None:
        """g <- g · fl32(1/S) for every gradient of optimizer (in float32 for 16-bit grads); records inf/NaN."""
        if not self._enabled:
            return
        state = self._state(optimizer)
        if state["stage"] == self._UNSCALED:
            raise RuntimeError("unscale_() has already been called on this optimizer since the "
                               "last update()")
        if state["stage"] == self._STEPPED:
            raise RuntimeError("unscale_() is being called after step()")
        # GradScaler takes the reciprocal in float64 and rounds it once to float32.
        inv = _reciprocal32(self._scale)
        found = False
        with torch.no_grad():
            for group in optimizer.param_groups:
                for p in group["params"]:
                    g = p.grad
                    if g is None:
                        continue
                    if g.dtype == torch.float16:
                        raise ValueError(
                            "cannot unscale float16 gradients: dividing by S in float16 would "
                            "underflow them again; keep the parameters (and so their .grad) in "
                            "float32 and compute in float16 under autocast"
                        )
                    if g.is_sparse:
                        raise ValueError("sparse gradients are not supported; use dense ones")
                    found |= not bool(torch.isfinite(g).all())
                    if g.dtype == torch.bfloat16:
                        g.copy_(g.float() * inv)  # the kernel's opmath is float32
                        # The kernel stores every bfloat16 NaN as the canonical 0x7fc0 (even
                        # when 1/S = 1); a plain float32 -> bfloat16 copy would keep the payload.
                        g.masked_fill_(g.isnan(), math.nan)
                    else:
                        g.mul_(torch.tensor(inv, dtype=torch.float32))
        state["found_inf"] = found
        state["stage"] = self._UNSCALED

    def step(self, optimizer: torch.optim.Optimizer, *args, **kwargs):
        """Unscale (unless done), then optimizer.step() only if no gradient is inf/NaN; returns its value."""
        if not self._enabled:
            return optimizer.step(*args, **kwargs)
        if "closure" in kwargs:
            raise RuntimeError("closure use is not supported with loss scaling")
        if getattr(optimizer, "_step_supports_amp_scaling", False):
            raise ValueError(
                f"{type(optimizer).__name__} unscales inside its own (fused) step; use the "
                "unfused optimizer (fused=False) with this scaler"
            )
        state = self._state(optimizer)
        if state["stage"] == self._STEPPED:
            raise RuntimeError("step() has already been called since the last update()")
        if state["stage"] == self._READY:
            self.unscale_(optimizer)
        retval = None
        if not state["found_inf"]:
            retval = optimizer.step(*args, **kwargs)
        state["stage"] = self._STEPPED
        return retval

    def update(self, new_scale: float | None = None) -> None:
        """Record this step (scale used, skipped or not), then set the scale for the next step."""
        if not self._enabled:
            return
        checks = [s["found_inf"] for s in self._per_optimizer.values()
                  if s["found_inf"] is not None]
        if new_scale is None and not checks:
            raise RuntimeError("no inf checks were recorded prior to update(); call step() or "
                               "unscale_() first")
        found_inf = any(checks)
        self._scales.append(self._scale)
        self._skipped.append(found_inf)
        if new_scale is not None:
            self._scale = float(np.float32(new_scale))
        else:
            self._scale, self._growth_tracker = self._next(found_inf)
        self._per_optimizer = {}

    def _next(self, found_inf: bool) -> tuple[float, int]:
        raise NotImplementedError

    def state_dict(self) -> dict[str, Any]:
        """GradScaler's five entries: scale, growth_factor, backoff_factor, growth_interval, _growth_tracker."""
        if not self._enabled:
            return {}
        return {"scale": self._scale, "growth_factor": self._growth_factor,
                "backoff_factor": self._backoff_factor, "growth_interval": self._growth_interval,
                "_growth_tracker": self._growth_tracker}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore what state_dict() saved (GradScaler's keys), e.g. from a checkpoint; no-op when disabled."""
        if not self._enabled:
            return
        if len(state_dict) == 0:
            raise RuntimeError("the source state dict is empty, possibly because it was saved "
                               "from a disabled scaler")
        keys = ("scale", "growth_factor", "backoff_factor", "growth_interval", "_growth_tracker")
        missing = [k for k in keys if k not in state_dict]
        if missing:
            raise ValueError(f"state_dict lacks {missing}; valid state dicts come from state_dict() "
                             f"and hold {', '.join(keys)}")
        self._load_settings(state_dict)
        self._scale = float(np.float32(state_dict["scale"]))
        tracker = state_dict["_growth_tracker"]
        if isinstance(tracker, bool) or not _is_int(tracker) or tracker < 0:
            raise ValueError(f"_growth_tracker must be an integer >= 0; got {tracker!r}")
        self._growth_tracker = int(tracker)

    def _load_settings(self, state_dict: dict[str, Any]) -> None:
        raise NotImplementedError

    # -- the record

    @property
    def history(self) -> ScaleHistory:
        """Scale used and skipped flag of every update() so far."""
        return ScaleHistory(np.array(self._scales, dtype=np.float64),
                            np.array(self._skipped, dtype=bool))


class DynamicLossScaler(_ScalerBase):
    """S_{t+1} = S_t·backoff on inf/NaN (step skipped); S_t·growth after growth_interval good steps in a row."""

    def __init__(self, init_scale: float = 2.0**16, growth_factor: float = 2.0,
                 backoff_factor: float = 0.5, growth_interval: int = 2000, enabled: bool = True):
        _check_factors(init_scale, growth_factor, backoff_factor, growth_interval)
        super().__init__(init_scale, enabled)
        self._growth_factor = float(growth_factor)
        self._backoff_factor = float(backoff_factor)
        self._growth_interval = int(growth_interval)

    def _next(self, found_inf: bool) -> tuple[float, int]:
        return update_scale(self._scale, self._growth_tracker, found_inf, self._growth_factor,
                            self._backoff_factor, self._growth_interval)

    def _load_settings(self, state_dict: dict[str, Any]) -> None:
        _check_factors(state_dict["scale"], state_dict["growth_factor"],
                       state_dict["backoff_factor"], state_dict["growth_interval"])
        self._growth_factor = float(state_dict["growth_factor"])
        self._backoff_factor = float(state_dict["backoff_factor"])
        self._growth_interval = int(state_dict["growth_interval"])


class StaticLossScaler(_ScalerBase):
    """S fixed for the whole run; steps whose gradients hold inf/NaN are still skipped."""

    def __init__(self, scale: float = 2.0**16, enabled: bool = True):
        s = float(scale)
        if not (math.isfinite(s) and s > 0):
            raise ValueError(f"scale must be finite and > 0; got scale={scale!r}")
        super().__init__(s, enabled)
        self._growth_factor = 1.0
        self._backoff_factor = 1.0
        self._growth_interval = 0

    def _next(self, found_inf: bool) -> tuple[float, int]:
        return self._scale, 0

    def _load_settings(self, state_dict: dict[str, Any]) -> None:
        s = float(state_dict["scale"])
        if not (math.isfinite(s) and s > 0):
            raise ValueError(f"scale must be finite and > 0; got scale={state_dict['scale']!r}")


# --------------------------------------------------------------------------- scale arithmetic


def simulate_scale_history(found_inf: Sequence[bool], init_scale: float = 2.0**16,
                           growth_factor: float = 2.0, backoff_factor: float = 0.5,
                           growth_interval: int = 2000) -> ScaleHistory:
    """The dynamic scale sequence for a given sequence of per-step inf/NaN flags."""
    _check_factors(init_scale, growth_factor, backoff_factor, growth_interval)
    flags = np.asarray(found_inf, dtype=bool)
    scales = np.empty(flags.size)
    s, t = float(np.float32(init_scale)), 0
    for i, f in enumerate(flags.tolist()):  # a recurrence: each scale depends on the last
        scales[i] = s
        s, t = _next_scale(s, t, f, growth_factor, backoff_factor, growth_interval)
    return ScaleHistory(scales, flags.copy())


_TRACE_BLOCK = 256  # steps whose scaled gradients trace_dynamic_scaling rounds in one call


def trace_dynamic_scaling(max_grad: Sequence[float], fmt="float16", init_scale: float = 2.0**16,
                          growth_factor: float = 2.0, backoff_factor: float = 0.5,
                          growth_interval: int = 2000) -> ScaleHistory:
    """Dynamic scaling when step k's largest true gradient is max_grad[k]: overflow iff fl(g·S) is inf in fmt."""
    f = get_format(fmt)
    g = np.asarray(max_grad, dtype=np.float64)
    if g.ndim != 1 or not np.all(np.isfinite(g)):
        raise ValueError("max_grad must be a 1-D sequence of finite numbers")
    _check_factors(init_scale, growth_factor, backoff_factor, growth_interval)
    scales = np.empty(g.size)
    skipped = np.empty(g.size, dtype=bool)
    s, t = float(np.float32(init_scale)), 0
    # The overflow test needs this step's scale (a recurrence), but the scale takes few
    # values: fl(g·S) is rounded for a block of steps at once, each time S reaches a new value
    # or leaves its block, elementwise the same roundings as one step at a time.
    blocks: dict[float, tuple[int, list[bool]]] = {}
    for i in range(g.size):
        scales[i] = s
        start, over = blocks.get(s, (i + 1, []))
        if not start <= i < start + len(over):
            start = i
            # The scaled gradient is rounded into fmt as the backward pass stores it (a product
            # past float64's range is inf, as in Python).
            with np.errstate(over="ignore"):
                stored = np.asarray(round_to(g[i:i + _TRACE_BLOCK] * s, f), dtype=np.float64)
            over = (~np.isfinite(stored)).tolist()
            blocks[s] = start, over
        skipped[i] = bad = over[i - start]
        s, t = _next_scale(s, t, bad, growth_factor, backoff_factor, growth_interval)
    return ScaleHistory(scales, skipped)


def gradient_stream(steps: int = 600, start: float = 1e-2, end: float = 1e-4,
                    spike_rate: float = 0.01, spike_factor: float = 1e4, noise: float = 0.3,
                    seed: int = 0) -> np.ndarray:
    """Largest |gradient| per step: start·(end/start)^(k/steps)·e^(noise·z), times spike_factor at random steps."""
    if int(steps) != steps or steps < 1:
        raise ValueError(f"steps must be a positive integer; got steps={steps!r}")
    if not 0 <= spike_rate <= 1:
        raise ValueError(f"spike_rate must be in [0, 1]; got spike_rate={spike_rate!r}")
    rng = np.random.default_rng(seed)
    k = np.arange(int(steps))
    # Gradients shrink as a run converges; occasional bad batches spike them.
    trend = float(start) * (float(end) / float(start)) ** (k / max(int(steps) - 1, 1))
    spikes = np.where(rng.random(k.size) < spike_rate, float(spike_factor), 1.0)
    return trend * np.exp(noise * rng.standard_normal(k.size)) * spikes


def smallest_surviving_gradient(scale: float, fmt="float16", floor: str = "zero") -> float:
    """Smallest |g| > 0 with fl(g·S) past the floor: 'zero' -> g·S > q/2 (infimum, not itself kept),
    'subnormal' -> g·S >= q, 'normal' -> g·S >= min_normal; returned as threshold / S."""
    f = get_format(fmt)
    s = float(scale)
    if not (math.isfinite(s) and s > 0):
        raise ValueError(f"scale must be finite and > 0; got scale={scale!r}")
    check_choice(floor, "floor", SURVIVAL_FLOORS)
    t = {"zero": f.min_subnormal / 2, "subnormal": f.min_subnormal, "normal": f.min_normal}[floor]
    return t / s


def largest_safe_gradient(scale: float, fmt="float16") -> float:
    """Largest |g| whose scaled value g·S still rounds to a finite number: (max + ulp/2)/S, exclusive."""
    f = get_format(fmt)
    s = float(scale)
    if not (math.isfinite(s) and s > 0):
        raise ValueError(f"scale must be finite and > 0; got scale={scale!r}")
    # Round-to-nearest sends values below max + ulp(max)/2 to max; at or above it, to inf.
    half_ulp = 2.0 ** (f.emax - f.mantissa_bits - 1)
    return (f.max_finite + half_ulp) / s


# --------------------------------------------------------------------------- against GradScaler


@dataclass(frozen=True)
class SideBySide:
    """Two scalers fed the same gradients: histories, growth trackers and parameters after every step."""

    ours: ScaleHistory
    reference: ScaleHistory
    trackers: tuple[np.ndarray, np.ndarray]
    params: tuple[np.ndarray, np.ndarray]  # (steps, width) each: the parameters after each step
    injected: np.ndarray  # steps whose raw gradient had an inf/NaN planted in it

    @property
    def params_equal(self) -> bool:
        """Bitwise-equal parameters after every step (NaNs compared by position)."""
        a, b = self.params
        return bool(np.array_equal(a, b, equal_nan=True))

    @property
    def identical(self) -> bool:
        """Same scale, same skipped steps, same growth tracker and same parameters at every step."""
        return (np.array_equal(self.ours.scale, self.reference.scale)
                and np.array_equal(self.ours.skipped, self.reference.skipped)
                and np.array_equal(*self.trackers) and self.params_equal)


def compare_with_gradscaler(steps: int = 2000, growth_interval: int = 7, p_bad: float = 0.02,
                            seed: int = 0, width: int = 8, **factors) -> SideBySide:
    """DynamicLossScaler and torch.amp.GradScaler("cpu") on identical raw gradients, inf/NaN planted with probability p_bad.

    Both drive the same optimizer, `emulate.SGD` (float64 inside, float32 weights), so the
    parameters depend only on the scalers' decisions and on IEEE arithmetic, on any CPU.
    """
    rng = np.random.default_rng(seed)
    raw = rng.standard_normal((int(steps), int(width))).astype(np.float32)
    bad = np.flatnonzero(rng.random(int(steps)) < p_bad)
    raw[bad, rng.integers(0, width, bad.size)] = rng.choice([np.inf, -np.inf, np.nan], bad.size)
    raw_t = torch.from_numpy(raw)
    kw = {"growth_interval": growth_interval, **factors}
    results = []
    for scaler in (DynamicLossScaler(**kw), torch.amp.GradScaler("cpu", **kw)):
        p = torch.nn.Parameter(torch.ones(int(width)))
        opt = emulate.SGD([p], lr=1e-3)
        scale = np.empty(int(steps))
        skipped = np.empty(int(steps), dtype=bool)
        tracker = np.empty(int(steps), dtype=np.int64)
        params = np.empty((int(steps), int(width)), dtype=np.float32)
        for i in range(int(steps)):
            scale[i] = scaler.get_scale()
            p.grad = scaler.scale(raw_t[i])  # what backward of scaler.scale(loss) would give
            skipped[i] = not bool(torch.isfinite(p.grad).all())
            scaler.step(opt)
            scaler.update()
            tracker[i] = scaler.state_dict()["_growth_tracker"]
            params[i] = p.detach().numpy()
        results.append((ScaleHistory(scale, skipped), tracker, params))
    (h1, t1, p1), (h2, t2, p2) = results
    return SideBySide(h1, h2, (t1, t2), (p1, p2), bad)


# --------------------------------------------------------------------------- training


@dataclass(frozen=True)
class TrainLog:
    """One run: the loss before each step, the scale history, and (optionally) unscaled gradients."""

    name: str
    loss: np.ndarray
    history: ScaleHistory
    grads: list[list[torch.Tensor]] = field(default_factory=list)
    zero_fraction: np.ndarray = field(default_factory=lambda: np.zeros(0))


def make_regression_task(n: int = 64, d_in: int = 16, d_out: int = 8, target_scale: float = 1e-4,
                         seed: int = 0):
    """(model_factory, x, y): a linear least-squares problem y = fl32(x·W*·target_scale), model output zero at start.

    The data come from `emulate.randn` and y from a float64 product in a fixed order, so x
    and y have the same bits on every machine (torch.randn does not: its vectorised sampler
    depends on the CPU's instruction set).
    """
    gen = torch.Generator().manual_seed(int(seed))
    x = emulate.randn(int(n), int(d_in), generator=gen)
    w_star = emulate.randn(int(d_in), int(d_out), generator=gen, dtype=torch.float64) / math.sqrt(d_in)
    exact = emulate.Precision("float64", "float64")
    y = (emulate.matmul(x.double(), w_star, exact) * float(target_scale)).float()

    def factory() -> torch.nn.Module:
        model = torch.nn.Linear(int(d_in), int(d_out))
        with torch.no_grad():  # a zero-initialised output layer, as in many recipes
            model.weight.zero_()
            model.bias.zero_()
        return model

    return factory, x, y


_AUTOCAST: tuple[str, ...] = ("float32", "float16", "bfloat16")  # the compute formats; float32: no autocast


_EMULATED_ACTIVATIONS = {torch.nn.Tanh: emulate.tanh, torch.nn.SiLU: emulate.silu,
                         torch.nn.Sigmoid: emulate.sigmoid}


def _emulated_forward(model: torch.nn.Module, compute: str) -> Callable:
    """x -> what CPU autocast computes for a Linear layer (fl_F(x W^T + b), float32 accumulation), or a
    Sequential of Linear layers and Tanh/SiLU/Sigmoid (evaluated in F, as autocast leaves them in their input's dtype)."""
    prec = emulate.Precision(compute)
    layers = list(model) if isinstance(model, torch.nn.Sequential) else [model]
    ops = []
    for m in layers:
        if isinstance(m, (torch.nn.Linear, emulate.Linear)):
            ops.append(lambda h, m=m: emulate.linear(h, m.weight, m.bias, prec))
        elif type(m) in _EMULATED_ACTIVATIONS:
            act = _EMULATED_ACTIVATIONS[type(m)]
            ops.append(lambda h, f=act: f(h, prec))
        else:
            raise TypeError(
                f"backend='emulated' trains a Linear layer or a Sequential of Linear, Tanh, SiLU and "
                f"Sigmoid; got {type(m).__name__}. Use backend='native' for other models"
            )

    def forward(x):
        for op in ops:
            x = op(x)
        return x

    return forward


def forward_loss(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor,
                 compute: str = "float16") -> float:
    """The loss of one emulated forward pass in `compute` (as train_scaled computes it), with the model's weights as they are."""
    check_choice(compute, "compute format", _AUTOCAST)
    with torch.no_grad():
        return float(emulate.mse_loss(_emulated_forward(model, compute)(x), y, "float32"))


FORWARD_ROUNDINGS: tuple[str, ...] = ("none", "weights", "inputs", "outputs", "all")


def forward_loss_split(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor,
                       compute: str = "float16") -> dict[str, float]:
    """The loss of a Linear model's emulated forward pass with only some roundings to `compute`:
    'weights' (W and b), 'inputs' (x) or 'outputs' (x W^T + b) alone, 'none', or 'all' (= forward_loss).

    Products are summed in float32 in a fixed order and the loss is taken in float32, as in
    forward_loss; only the chosen operands or results are rounded to `compute`.
    """
    check_choice(compute, "compute format", _AUTOCAST)
    if not isinstance(model, (torch.nn.Linear, emulate.Linear)):
        raise TypeError(f"forward_loss_split takes a Linear model; got {type(model).__name__}")
    f32 = emulate.Precision("float32")

    def rnd(t):
        return None if t is None else round_to(t.detach(), compute).to(torch.float32)

    out = {}
    with torch.no_grad():
        for what in FORWARD_ROUNDINGS:
            w, b, xin = model.weight.detach(), model.bias, x
            if what in ("weights", "all"):
                w, b = rnd(w), rnd(b)
            if what in ("inputs", "all"):
                xin = rnd(x)
            h = emulate.linear(xin, w, None if b is None else b.detach(), f32)
            if what in ("outputs", "all"):
                h = rnd(h)
            out[what] = float(emulate.mse_loss(h, y, "float32"))
    return out


def train_scaled(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, steps: int = 200,
                 compute: str = "float16", scaler=None, lr: float = 0.5, momentum: float = 0.9,
                 name: str = "", keep_grads: bool = False, loss_fn: Callable | None = None,
                 backend: str = "emulated") -> TrainLog:
    """SGD with momentum on float32 master weights, forward/backward in `compute`; scaler: ours, GradScaler or None.

    backend='emulated' (a Linear model): the layer through `emulate.linear` in `compute`
    (operands rounded to it, float32 accumulation, output rounded to it, its gradients
    rounded to it in the backward pass, as autocast does), the loss through
    `emulate.mse_loss` in float32 (torch 2.13's autocast runs mse_loss in float32), and `emulate.SGD`:
    the same bits on every machine. backend='native': any model under torch's CPU autocast
    with torch.optim.SGD and the loss_fn given (default mse_loss): what this machine's
    kernels give.
    """
    check_choice(compute, "compute format", _AUTOCAST)
    check_choice(backend, "backend", emulate.BACKENDS)
    if isinstance(steps, bool) or not _is_int(steps) or steps < 1:
        raise ValueError(f"steps must be a positive integer; got steps={steps!r}")
    dtype = None if compute == "float32" else get_format(compute).torch_dtype
    if backend == "native":
        opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=momentum)
        loss_fn = loss_fn or torch.nn.functional.mse_loss

        def compute_loss():
            with torch.autocast("cpu", dtype=dtype or torch.bfloat16, enabled=dtype is not None):
                return loss_fn(model(x), y)
    else:
        opt = emulate.SGD(model.parameters(), lr=lr, momentum=momentum, prec="float32")
        forward = _emulated_forward(model, compute)
        loss_fn = loss_fn or (lambda out, t: emulate.mse_loss(out, t, "float32"))

        def compute_loss():
            return loss_fn(forward(x), y)

    losses, scales, skipped, grads, zeros = [], [], [], [], []
    params = list(model.parameters())
    n_entries = sum(p.numel() for p in params)
    for _ in range(int(steps)):
        opt.zero_grad(set_to_none=True)
        loss = compute_loss()
        losses.append(float(loss.detach()))
        if scaler is None:
            scales.append(1.0)
            loss.backward()
        else:
            scales.append(float(scaler.get_scale()))
            scaler.scale(loss).backward()
            scaler.unscale_(opt)  # from here on .grad holds the true (unscaled) gradient
        # Without a scaler nothing checks, and a step with inf/NaN gradients is taken anyway.
        bad = not all(bool(torch.isfinite(p.grad).all()) for p in params)
        skipped.append(bad and scaler is not None)
        zeros.append(sum(int((p.grad == 0).sum()) for p in params) / n_entries)
        if keep_grads:
            grads.append([p.grad.detach().clone() for p in params])
        if scaler is None:
            opt.step()
        else:
            scaler.step(opt)
            scaler.update()
    return TrainLog(name or compute, np.array(losses),
                    ScaleHistory(np.array(scales), np.array(skipped, dtype=bool)), grads,
                    np.array(zeros))
