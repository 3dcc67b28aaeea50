"""The differentiable bouncing ball: an unrolled world model whose program changes with rounding.

The state holds heights ``y`` and velocities ``v`` of N balls (the last axis) in L independent
scenes (the leading axis, *lanes*: a parameter sweep or a batch of scenes advances as one
array). A learnable scalar ``k`` per lane lives inside the simulator. One step of length h:

* **integration** -- semi-implicit Euler ``v' = v - h g; y' = y + h v'`` (the position moves
  with the *new* velocity) or explicit Euler ``y' = y + h v; v' = v - h g`` (with the old one):
  two different discrete maps of the same ODE;
* **penalty contact** -- penetration ``p = max(0, -y)`` pushes back with force ``k p`` (k is a
  stiffness): ``v' += h k p``, p taken at y' (semi-implicit) or at y (explicit);
* **projection contact** -- the unconstrained y' is corrected by ``y' += fl(alpha k) p`` (k is a
  gain) for as long as the stopping rule says *continue*, at most ``max_iter`` passes; then a
  ball that started the solve below the floor bounces: ``v' = -e min(v', 0)``. With
  ``clamp=True`` the step ends with ``y' = max(y', 0)``, as the source's sketch does: the
  residual penetration the loop leaves (and its dependence on k) is cut off.

Arithmetic: every operation is evaluated in float64 from stored values and rounded once into
the state format ``fmt`` (``precisionlab.rounding.round_to``), so a float32 world does IEEE
float32 arithmetic and a bfloat16 world bfloat16 arithmetic, bit for bit on every CPU. Gradients
pass each rounding straight through and are carried in float64 along the branch the forward
pass took: they are the real-arithmetic derivatives of the executed branch, evaluated at the
rounded states (``grad_fmt`` instead rounds the adjoint into a format at every rounded
operation, e.g. to see a float16 backward pass overflow). The loss is a float64 mean over the balls
(``precisionlab.emulate.fixed_sum``).

The stopping rule compares a reduction S of the penetrations with ``tol``; its precision policy
(``POLICIES``) is a parameter of the world:

==============  ===============================================================================
low_precision   S = the sum of the penetrations in a ``precisionlab.gpu`` accumulator of format
                ``reduce_fmt`` (default: the state's format) in gpu order ``order``; continue
                while S >= tol
float32         the same sum with a float32 accumulator (promoted reduction)
per_instance    no sum: ball i keeps iterating while p_i >= tol / N (its share of tol), the
                others stop; a lane runs while any of its balls does
hysteresis      S as in low_precision, two thresholds: an *engaged* solver continues while
                S >= tol_exit, a disengaged one starts only when S >= tol; the solver starts
                engaged (``start_engaged``), disengages when it stops on the tolerance and
                stays engaged after a solve cut off by max_iter
==============  ===============================================================================

Every rollout is logged (`Rollout`): first-contact step, iterations per step, the margin
S - threshold of the deciding test, whether each solve stopped on the tolerance or on
max_iter, decisions that the exactly rounded sum would have made the other way, state ranges,
the loss and its gradient with respect to k.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

import numpy as np
import torch

from . import emulate
from .checks import check_choice
from .formats import get_format
from .gpu import DETERMINISTIC_ORDERS, boundary_terms, exact_sum, reduce_sum
from .rounding import next_up, round_to

__all__ = [
    "CONTACTS",
    "INTEGRATORS",
    "LOSSES",
    "POLICIES",
    "STOPS",
    "Rollout",
    "StiffnessMap",
    "World",
    "autocast_batch",
    "boundary_batch",
    "boundary_rollout",
    "coalesce",
    "contact_boundary",
    "finite_difference",
    "first_contact_steps",
    "horizon_sensitivity",
    "rollout",
    "side_by_side",
    "softplus",
    "stiffness_map",
    "torch_autocast_rollout",
    "torch_boundary_rollout",
]

_F64 = emulate.Precision("float64", "float64")

INTEGRATORS: tuple[str, ...] = ("semi_implicit", "explicit")
CONTACTS: tuple[str, ...] = ("projection", "penalty")
POLICIES: tuple[str, ...] = ("low_precision", "float32", "per_instance", "hysteresis")
LOSSES: tuple[str, ...] = ("penetration", "height", "mean_height")
STOPS: tuple[str, ...] = ("tol", "max_iter", "none")


# --------------------------------------------------------------------------- input checks


def _real(value, name: str) -> float:
    try:
        v = float(value) if not isinstance(value, (bool, str)) else math.nan
    except (TypeError, ValueError):
        v = math.nan
    if not math.isfinite(v):
        raise ValueError(f"{name} must be a finite real number; got {name}={value!r}")
    return v


def _positive(value, name: str) -> float:
    v = _real(value, name)
    if not v > 0:
        raise ValueError(f"{name} must be a finite number > 0; got {name}={value!r}")
    return v


def _nonnegative(value, name: str) -> float:
    v = _real(value, name)
    if v < 0:
        raise ValueError(f"{name} must be a finite number >= 0; got {name}={value!r}")
    return v


def _count(value, name: str, lowest: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < lowest:
        raise ValueError(f"{name} must be an integer >= {lowest}; got {name}={value!r}")
    return int(value)


# --------------------------------------------------------------------------- the world


@dataclass(frozen=True)
class World:
    """The numerical program: integrator, contact model, state format and stopping rule."""

    h: float = 0.01
    g: float = 9.81
    contact: str = "projection"
    integrator: str = "semi_implicit"
    fmt: str = "float32"
    policy: str = "low_precision"
    tol: float = 1e-3
    tol_exit: float | None = None
    max_iter: int = 25
    alpha: float = 0.5
    restitution: float = 0.8
    reduce_fmt: str | None = None
    order: str = "sequential"
    smooth: float = 0.0
    damping: float = 0.0
    clamp: bool = False
    start_engaged: bool = True
    grad_fmt: str | None = None

    def __post_init__(self):
        object.__setattr__(self, "h", _positive(self.h, "h"))
        object.__setattr__(self, "g", _nonnegative(self.g, "g"))
        check_choice(self.contact, "contact", CONTACTS)
        check_choice(self.integrator, "integrator", INTEGRATORS)
        object.__setattr__(self, "fmt", get_format(self.fmt).name)
        check_choice(self.policy, "policy", POLICIES)
        object.__setattr__(self, "tol", _positive(self.tol, "tol"))
        if self.tol_exit is not None:
            te = _positive(self.tol_exit, "tol_exit")
            if not te < self.tol:
                raise ValueError(f"tol_exit must be below tol={self.tol!r} (the enter tolerance); "
                                 f"got tol_exit={self.tol_exit!r}")
            object.__setattr__(self, "tol_exit", te)
        object.__setattr__(self, "max_iter", _count(self.max_iter, "max_iter"))
        object.__setattr__(self, "alpha", _positive(self.alpha, "alpha"))
        e = _nonnegative(self.restitution, "restitution")
        if e > 1:
            raise ValueError(f"restitution must lie in [0, 1]; got restitution={self.restitution!r}")
        object.__setattr__(self, "restitution", e)
        if self.reduce_fmt is not None:
            object.__setattr__(self, "reduce_fmt", get_format(self.reduce_fmt).name)
        check_choice(self.order, "order", DETERMINISTIC_ORDERS)
        object.__setattr__(self, "smooth", _nonnegative(self.smooth, "smooth"))
        object.__setattr__(self, "damping", _nonnegative(self.damping, "damping"))
        for flag in ("clamp", "start_engaged"):
            if not isinstance(getattr(self, flag), (bool, np.bool_)):
                raise ValueError(f"{flag} must be True or False; got {flag}={getattr(self, flag)!r}")
        if self.grad_fmt is not None:
            object.__setattr__(self, "grad_fmt", get_format(self.grad_fmt).name)

    @property
    def accumulator(self) -> str:
        """The format the stopping reduction adds in: float32 for policy float32, else reduce_fmt or fmt."""
        if self.policy == "float32":
            return "float32"
        return self.reduce_fmt or self.fmt

    @property
    def exit_tol(self) -> float:
        """The hysteresis exit threshold: tol_exit, or tol / 2 when it is not given."""
        return self.tol / 2 if self.tol_exit is None else self.tol_exit

    def with_(self, **changes) -> World:
        """A copy with some fields changed (validated again)."""
        return replace(self, **changes)


@dataclass
class Rollout:
    """The log of one rollout over T steps and L lanes of N balls (NumPy arrays, float64 values)."""

    world: World
    heights: np.ndarray  # (T+1, L, N) y_t after each step's contact handling
    velocities: np.ndarray  # (T+1, L, N)
    free_velocities: np.ndarray  # (T, L, N) v' of step t before contact (the impact velocity)
    penetration: np.ndarray  # (T, L, N) p at the end of step t
    iterations: np.ndarray  # (T, L) solver passes run at step t
    stop: np.ndarray  # (T, L) "tol", "max_iter" or "none" (penalty contact)
    margin: np.ndarray  # (T, L) S - threshold of the test that ended the solve
    first_margin: np.ndarray  # (T, L) S - threshold of the first test of the step
    flips: np.ndarray  # (T, L) tests whose decision the exact sum would have reversed
    first_contact: np.ndarray  # (L,) first step whose unconstrained position penetrates (-1: none)
    touching: np.ndarray  # (T, L) some ball's unconstrained position penetrates at step t
    loss: np.ndarray  # (L,)
    grad: np.ndarray  # (L,) dL/dk (exact zeros where the loss does not depend on k)
    loss_requires_grad: bool
    k: np.ndarray = field(default_factory=lambda: np.zeros(0))  # (L,)

    @property
    def y_range(self) -> tuple[float, float]:
        """(min, max) of every height in the rollout."""
        return float(self.heights.min()), float(self.heights.max())

    @property
    def v_range(self) -> tuple[float, float]:
        """(min, max) of every velocity in the rollout."""
        return float(self.velocities.min()), float(self.velocities.max())

    @property
    def total_iterations(self) -> np.ndarray:
        """(L,) solver passes summed over the horizon: the cost of the stopping rule."""
        return self.iterations.sum(axis=0)

    def it_hist(self, lane: int = 0) -> list[int]:
        """The iteration count of every step of one lane, as a list."""
        return [int(i) for i in self.iterations[:, lane]]

    def summary(self, lane: int = 0) -> str:
        """A few lines with everything the rollout logs for one lane."""
        w = self.world
        it = self.iterations[:, lane]
        stops = self.stop[:, lane]
        solved = stops != "none"
        m = self.margin[:, lane][solved]
        contact_steps = np.flatnonzero(it > 0)
        lines = [
            f"{w.contact} contact, {w.integrator} Euler, state in {w.fmt}"
            + (f", stopping rule {w.policy} ({w.accumulator} accumulator)"
               if w.contact == "projection" and w.policy != "per_instance"
               else (", stopping rule per_instance" if w.contact == "projection" else "")),
            f"first contact step: {int(self.first_contact[lane])}",
            f"solver passes: {int(it.sum())} in {contact_steps.size} step(s)"
            + (f", most {int(it.max())} at step {int(it.argmax())}" if it.size and it.max() > 0 else ""),
            f"stops on tol: {int((stops == 'tol').sum())}, on max_iter: {int((stops == 'max_iter').sum())}",
        ]
        if m.size:
            lines.append(f"closest deciding margin |S - tol|: {np.abs(m).min():.3e}; "
                         f"decisions the exact sum would reverse: {int(self.flips[:, lane].sum())}")
        lines += [
            f"height range [{self.heights[:, lane].min():.6g}, {self.heights[:, lane].max():.6g}], "
            f"velocity range [{self.velocities[:, lane].min():.6g}, {self.velocities[:, lane].max():.6g}]",
            f"loss {self.loss[lane]:.6e}, dL/dk {self.grad[lane]:.6e}, "
            f"loss requires grad: {self.loss_requires_grad}",
        ]
        return "\n".join(lines)


# --------------------------------------------------------------------------- rounded arithmetic


class _Round(torch.autograd.Function):
    """y = fl_F(x) stored in float64; dy/dx = 1 (straight through), the adjoint rounded to G if given."""

    @staticmethod
    def forward(ctx, x, fmt, grad_fmt):
        ctx.grad_fmt = grad_fmt
        return round_to(x.detach().contiguous(), fmt)

    @staticmethod
    def backward(ctx, g):
        if ctx.grad_fmt is not None:
            g = round_to(g.contiguous(), ctx.grad_fmt)
        return g, None, None


class _Spread(torch.autograd.Function):
    """k (L,) -> k broadcast to (L, N); the backward sums over N with emulate.fixed_sum (fixed order)."""

    @staticmethod
    def forward(ctx, k, n):
        return k.detach()[:, None].expand(k.shape[0], n).clone()

    @staticmethod
    def backward(ctx, g):
        return emulate.fixed_sum(g, dim=-1), None


def _rounder(fmt: str, grad_fmt: str | None = None):
    if fmt == "float64" and grad_fmt is None:
        return lambda x: x
    return lambda x: _Round.apply(x, fmt, grad_fmt)


def softplus(x: torch.Tensor) -> torch.Tensor:
    """log(1 + e^x) = max(x, 0) + log1p(e^-|x|) in float64 from + - * / (emulate's exp and log)."""
    x = x.to(torch.float64)
    neg = torch.where(x > 0, -x, x)  # -|x| with the derivative's sign right at 0
    pos = torch.where(x > 0, x, torch.zeros_like(x))
    e = emulate.exp(neg, _F64)
    u = 1.0 + e
    # log1p(e) = log(u) e / (u - 1): the rounding of u cancels (Goldberg's trick); e itself once u = 1
    tiny = u == 1.0
    d = torch.where(tiny, torch.ones_like(u), u - 1.0)
    return pos + torch.where(tiny, e, emulate.log(u, _F64) * (e / d))


def _penetration(y: torch.Tensor, world: World, r) -> torch.Tensor:
    """p = max(0, -y), or eps softplus(-y / eps) with eps = world.smooth, rounded to the format."""
    if world.smooth > 0:
        return r(world.smooth * softplus(-y / world.smooth))
    return torch.where(y < 0, -y, torch.zeros_like(y))  # exact in any format


def _contact_weight(y: torch.Tensor, world: World) -> torch.Tensor:
    """dp/d(-y): 1 below the floor and 0 above (hard contact), sigmoid(-y / eps) when smoothed."""
    if world.smooth == 0:
        return (y < 0).to(torch.float64)
    x = (-y / world.smooth).to(torch.float64)
    e = emulate.exp(torch.where(x > 0, -x, x), _F64)  # e^-|x|, never overflows
    return torch.where(x > 0, 1.0 / (1.0 + e), e / (1.0 + e))


def _force(world: World, kb, p, v, r, y):
    """Contact force k p, minus damping c v while in contact: where y < 0, or weighted by
    sigmoid(-y / eps) for a smoothed contact (so a ball in free flight is not damped)."""
    f = r(kb * p)
    if world.damping > 0:
        if world.smooth == 0:
            f = torch.where(p > 0, r(f - r(world.damping * v)), f)
        else:
            w = _contact_weight(y, world)
            f = r(f - r(world.damping * r(w * v)))
    return f


def _integrate(world: World, y, v, r, hg):
    """Unconstrained step: semi-implicit (y uses the new v) or explicit Euler (y uses the old v)."""
    if world.integrator == "semi_implicit":
        v1 = r(v - hg)
        return r(y + r(world.h * v1)), v1
    return r(y + r(world.h * v)), r(v - hg)


# --------------------------------------------------------------------------- the stopping rule


def _reduce(world: World, p: np.ndarray) -> np.ndarray:
    """S per lane: the gpu-simulated sum of p (L, N) in the policy's accumulator."""
    return np.atleast_1d(reduce_sum(p, world.order, acc=world.accumulator))


def _exact_decision(world: World, p: np.ndarray, s: np.ndarray, thr: np.ndarray,
                    go: np.ndarray) -> np.ndarray:
    """exact_sum(p) >= thr per lane, evaluated (math.fsum) only where |S - thr| is within the
    accumulator's error bound 2 (n + 1) u max(S, thr) + n * smallest subnormal; elsewhere the
    rounded decision is provably the exact one."""
    f = get_format(world.accumulator)
    n = p.shape[-1]
    bound = 2 * (n + 1) * 2.0**-f.precision * np.maximum(s, thr) + n * f.min_subnormal
    near = np.abs(s - thr) <= bound
    out = go.copy()
    if near.any():
        out[near] = exact_sum(p[near]) >= thr[near]
    return out


def _solve(world: World, y, c, r, engaged: np.ndarray):
    """The projection loop on y (L, N): returns y, passes, stop, margins, flips, engaged."""
    lanes, n = y.shape
    active = np.ones(lanes, dtype=bool)
    passes = np.zeros(lanes, dtype=np.int64)
    stop = np.full(lanes, "tol", dtype=object)
    first_m = np.full(lanes, np.nan)
    last_m = np.full(lanes, np.nan)
    flips = np.zeros(lanes, dtype=np.int64)
    share = world.tol / n
    for it in range(world.max_iter + 1):
        p = _penetration(y, world, r)
        pn = p.detach().numpy()
        if world.policy == "per_instance":
            go_ball = pn >= share
            go = go_ball.any(axis=1)
            m = (pn - share).max(axis=1)
            exact_go = go
        else:
            s = _reduce(world, pn)
            if world.policy == "hysteresis":
                thr = np.where(engaged, world.exit_tol, world.tol)
            else:
                thr = np.full(lanes, world.tol)
            go = s >= thr
            m = s - thr
            exact_go = _exact_decision(world, pn, s, thr, go)
        go &= active
        last_m = np.where(active, m, last_m)
        if it == 0:
            first_m = m.copy()
        flips += (active & (go != (exact_go & active))).astype(np.int64)
        if world.policy == "hysteresis":
            engaged = np.where(active, go, engaged)
        active = go
        if not active.any():
            break
        if it == world.max_iter:  # a pass was due but the cap is reached
            stop[active] = "max_iter"
            break
        if world.policy == "per_instance":
            mask = go_ball & active[:, None]
        else:
            mask = np.repeat(active[:, None], n, axis=1)
        y = torch.where(torch.from_numpy(mask), r(y + r(c * p)), y)
        passes += active
    return y, passes, stop, last_m, first_m, flips, engaged


# --------------------------------------------------------------------------- rollouts


def _lanes(y0, v0, k):
    """y0 as (L, N) float64, v0 broadcast to it, k as (L,): L is the larger of y0's and k's lane counts."""
    y = np.asarray(y0.detach().numpy() if isinstance(y0, torch.Tensor) else y0, dtype=np.float64)
    if y.ndim == 0:
        y = y.reshape(1, 1)
    elif y.ndim == 1:
        y = y.reshape(1, -1)
    elif y.ndim != 2:
        raise ValueError(f"y0 must be a scalar, (N,) or (L, N); got shape {y.shape}")
    kk = np.asarray(k.detach().numpy() if isinstance(k, torch.Tensor) else k, dtype=np.float64).reshape(-1)
    if kk.size == 0 or not np.all(np.isfinite(kk)):
        raise ValueError(f"k must be finite real number(s); got k={k!r}")
    if not np.all(np.isfinite(y)):
        raise ValueError("y0 must be finite")
    lanes = max(y.shape[0], kk.size)
    if y.shape[0] not in (1, lanes) or kk.size not in (1, lanes):
        raise ValueError(f"y0 has {y.shape[0]} lanes and k has {kk.size}: they must match or be 1")
    y = np.broadcast_to(y, (lanes, y.shape[1])).copy()
    kk = np.broadcast_to(kk, (lanes,)).copy()
    v = np.broadcast_to(np.asarray(v0, dtype=np.float64), y.shape).copy()
    return y, v, kk


def rollout(world: World, y0, k, T: int, v0=0.0, loss: str = "penetration",
            target: float = 0.0, k_transform=None) -> Rollout:
    """Unroll T steps from (y0, v0) with parameter k; L = mean_i p_T,i^2, mean_i (y_T,i - target)^2 or mean_i y_T,i; dL/dk.

    y0: scalar, (N,) or (L, N) heights (rounded into world.fmt); v0 broadcasts to y0; k: a scalar
    or one value per lane (L,). loss "penetration" is the seed's mean squared final penetration,
    "height" the mean squared distance of the final heights from `target`, "mean_height" the
    mean final height (its gradient is the sensitivity dy_T/dk itself). k_transform: a
    differentiable map applied to k before the simulator uses it (for example
    emulate.fake_quantize); the gradient is still taken with respect to k.
    """
    T = _count(T, "T")
    check_choice(loss, "loss", LOSSES)
    target = _real(target, "target")
    y_np, v_np, k_np = _lanes(y0, v0, k)
    lanes, n = y_np.shape
    r = _rounder(world.fmt, world.grad_fmt)
    k_leaf = torch.tensor(k_np, dtype=torch.float64, requires_grad=True)
    k_used = k_leaf if k_transform is None else k_transform(k_leaf)
    kb = _Spread.apply(k_used, n)
    y = r(torch.from_numpy(y_np))
    v = r(torch.from_numpy(v_np))
    hg = float(round_to(world.h * world.g, world.fmt)) if world.fmt != "float64" else world.h * world.g
    if world.contact == "projection":
        c = r(world.alpha * kb)
    engaged = np.full(lanes, bool(world.start_engaged))

    heights, vels, pens = [y.detach().numpy().copy()], [v.detach().numpy().copy()], []
    free, touch = [], []
    iters = np.zeros((T, lanes), dtype=np.int64)
    stops = np.full((T, lanes), "none", dtype=object)
    margin = np.full((T, lanes), np.nan)
    first_margin = np.full((T, lanes), np.nan)
    flips = np.zeros((T, lanes), dtype=np.int64)
    first_contact = np.full(lanes, -1, dtype=np.int64)

    for t in range(T):
        if world.contact == "penalty":
            if world.integrator == "explicit":
                p_old = _penetration(y, world, r)
                y1, v1 = _integrate(world, y, v, r, hg)
                v = r(v1 + r(world.h * _force(world, kb, p_old, v, r, y)))
                y = y1
            else:
                y1, v1 = _integrate(world, y, v, r, hg)
                p_new = _penetration(y1, world, r)
                v = r(v1 + r(world.h * _force(world, kb, p_new, v1, r, y1)))
                y = y1
            touching = (y1 < 0).detach().numpy().any(axis=1)
            p_end = _penetration(y, world, r)
        else:
            y1, v1 = _integrate(world, y, v, r, hg)
            below = y1 < 0
            touching = below.detach().numpy().any(axis=1)
            y, passes, stop, last_m, first_m, fl, engaged = _solve(world, y1, c, r, engaged)
            iters[t], stops[t], margin[t], first_margin[t], flips[t] = passes, stop, last_m, first_m, fl
            bounce = -r(world.restitution * torch.minimum(v1, torch.zeros_like(v1)))
            v = torch.where(below, bounce, v1)
            if world.clamp:
                y = torch.where(y < 0, torch.zeros_like(y), y)  # relu(y): no k past this point
            p_end = _penetration(y, world, r)
        first_contact = np.where((first_contact < 0) & touching, t, first_contact)
        free.append(v1.detach().numpy().copy())
        touch.append(touching.copy())
        heights.append(y.detach().numpy().copy())
        vels.append(v.detach().numpy().copy())
        pens.append(p_end.detach().numpy().copy())

    if loss == "penetration":
        per_ball = p_end * p_end
    elif loss == "height":
        d = y - target
        per_ball = d * d
    else:
        per_ball = y
    loss_lanes = emulate.fixed_sum(per_ball, dim=-1) / n
    needs = bool(loss_lanes.requires_grad)
    grad = np.zeros(lanes)
    if needs:
        (g,) = torch.autograd.grad(loss_lanes, k_leaf, grad_outputs=torch.ones_like(loss_lanes),
                                   allow_unused=True)
        if g is not None:
            grad = g.detach().numpy().copy()
    return Rollout(world=world, heights=np.stack(heights), velocities=np.stack(vels),
                   free_velocities=np.stack(free), penetration=np.stack(pens), iterations=iters, stop=stops, margin=margin,
                   first_margin=first_margin, flips=flips, first_contact=first_contact,
                   touching=np.stack(touch),
                   loss=loss_lanes.detach().numpy().copy(), grad=grad, loss_requires_grad=needs,
                   k=k_np)


def finite_difference(world: World, y0, k: float, T: int, dk: float, v0=0.0,
                      loss: str = "penetration", target: float = 0.0) -> tuple[float, bool]:
    """(L(k + dk) - L(k - dk)) / (2 dk) for lane 0, and whether both runs took k's iteration history."""
    dk = _positive(dk, "dk")
    runs = rollout(world, y0, [k - dk, k, k + dk], T, v0=v0, loss=loss, target=target)
    same = bool(np.array_equal(runs.iterations[:, 0], runs.iterations[:, 1])
                and np.array_equal(runs.iterations[:, 2], runs.iterations[:, 1]))
    return float((runs.loss[2] - runs.loss[0]) / (2 * dk)), same


# --------------------------------------------------------------------------- micro-demo 2


def boundary_batch(fmt="bfloat16", tol: float = 1e-3, n_small: int = 8) -> tuple[np.ndarray, float]:
    """(y0, tol_F): heights -[L, s, ..., s] whose penetrations sum exactly to tol_F = fl_F(tol).

    L is the F value just below tol_F and the n_small terms s = ulp(L) / n_small each: a
    sequential F sum that starts with L drops every s and lands one ulp below tol_F, while the
    exact (or float32) sum is tol_F itself (gpu.boundary_terms).
    """
    f = get_format(fmt)
    tol_f = float(round_to(_positive(tol, "tol"), f))
    terms = boundary_terms(tol_f, f, n_small)
    return -terms.reshape(1, -1), tol_f


def boundary_rollout(fmt="bfloat16", policy: str = "low_precision", low="bfloat16", T: int = 4,
                     max_iter: int = 25, k: float = 0.5, tol: float = 1e-3, n_small: int = 8,
                     **world_fields) -> Rollout:
    """Micro-demo 2: the boundary batch of format `low` at rest inside the floor (g = 0), T solves with gain k.

    The state is stored in `fmt`; tol is fl_low(tol); the loss is the mean squared final
    penetration. Extra keyword arguments are World fields (tol_exit, alpha, order, ...).
    """
    y0, tol_low = boundary_batch(low, tol, n_small)
    world = World(g=0.0, fmt=fmt, policy=policy, tol=tol_low, max_iter=max_iter, **world_fields)
    return rollout(world, y0, k, T, loss="penetration")


def side_by_side(runs: dict, lane: int = 0) -> str:
    """One line per named rollout (first contact step, iterations per step, loss, dL/dk, whether
    the loss needs grad), then max_t,i |p_t,i(first) - p_t,i(other)| for every other run."""
    width = max(len(name) for name in runs)
    lines = [f"{'run':<{width}}  {'contact':>7}  {'iterations per step':<20} {'loss':>12} "
             f"{'dL/dk':>13}  requires grad"]
    for name, r in runs.items():
        lines.append(f"{name:<{width}}  {int(r.first_contact[lane]):>7}  {r.it_hist(lane)!s:<20} "
                     f"{r.loss[lane]:>12.6e} {r.grad[lane]:>13.6e}  {r.loss_requires_grad}")
    names = list(runs)
    first = runs[names[0]]
    for name in names[1:]:
        d = np.abs(first.penetration[:, lane] - runs[name].penetration[:, lane]).max()
        lines.append(f"largest |penetration difference| over the horizon, {names[0]} vs {name}: {d:.6e}")
    return "\n".join(lines)


def torch_boundary_rollout(dtype: torch.dtype = torch.bfloat16, promoted: bool = False,
                           low: torch.dtype | None = None, T: int = 4, max_iter: int = 25,
                           k: float = 0.5, alpha: float = 0.5, tol: float = 1e-3,
                           n_small: int = 8) -> dict:
    """Micro-demo 2 with torch's own kernels: state, gain and gradient in `dtype` ("your hardware").

    The boundary batch of format `low` (default: dtype) is held in a `dtype` tensor; each
    step runs y <- y + alpha k p while S >= tol, S summed one torch add at a time in dtype, or
    by torch.sum in float32 when `promoted`; k is a float32 leaf cast to dtype, as under
    autocast. Returns it_hist, p_hist (T, N), loss (mean p^2 in float32), grad and
    loss_requires_grad. Hardware-dependent by design: for comparison with the emulated run.
    """
    low_fmt = get_format(low if low is not None else dtype)
    y0, tol_low = boundary_batch(low_fmt, tol, n_small)
    kk = torch.tensor(float(k), dtype=torch.float32, requires_grad=True)
    gain = kk.to(dtype)
    y = torch.as_tensor(y0[0]).to(torch.float32).to(dtype)
    it_hist, p_hist = [], []
    p = torch.relu(-y)
    for _ in range(_count(T, "T")):
        it = 0
        while it < max_iter:
            p = torch.relu(-y)
            if promoted:
                s = p.float().sum()
            else:
                s = torch.zeros((), dtype=dtype)
                for term in p:
                    s = s + term
            if bool(s < tol_low):
                break
            y = y + alpha * gain * p
            it += 1
        it_hist.append(it)
        p_hist.append(p.detach().float().numpy().astype(np.float64))
    loss = p.float().pow(2).mean()
    needs = bool(loss.requires_grad)
    value = float(loss.detach())
    grad = 0.0
    if needs:
        (g,) = torch.autograd.grad(loss, kk, allow_unused=True)
        grad = 0.0 if g is None else float(g)
    return {"it_hist": it_hist, "p_hist": np.stack(p_hist), "loss": value, "grad": grad,
            "loss_requires_grad": needs}


def coalesce(indices, values, order: str = "sequential", acc="float16", rng=None):
    """(unique indices, sums): duplicate indices of a COO list summed, each group in the listed
    order with gpu.reduce_sum(order, acc): contact impulses accumulated per body.

    Which order a sparse library uses when it coalesces is its own choice; order="atomic"
    (with rng) draws one random order per call, as scattered atomic adds would.
    """
    idx = np.asarray(indices).reshape(-1)
    val = np.asarray(values, dtype=np.float64).reshape(-1)
    if idx.shape != val.shape:
        raise ValueError(f"indices and values must have the same length; got {idx.size} and {val.size}")
    keys = np.unique(idx)
    sums = np.array([float(reduce_sum(val[idx == key], order, acc=acc, rng=rng)) for key in keys])
    return keys, sums


# --------------------------------------------------------------------------- events 1 ulp apart


def first_contact_steps(world: World, y0, T: int, v0=0.0) -> np.ndarray:
    """For each starting height in y0 (one ball per lane): the first step whose free-flight position is below 0 (T: none)."""
    T = _count(T, "T")
    y = torch.as_tensor(np.asarray(y0, dtype=np.float64).reshape(-1))
    r = _rounder(world.fmt)
    hg = float(round_to(world.h * world.g, world.fmt)) if world.fmt != "float64" else world.h * world.g
    with torch.no_grad():
        y = r(y)
        v = r(torch.full_like(y, float(v0)))
        out = np.full(y.shape[0], T, dtype=np.int64)
        for t in range(T):
            y, v = _integrate(world, y, v, r, hg)
            hit = (y < 0).numpy() & (out == T)
            out[hit] = t
            if (out < T).all():
                break
    return out


def contact_boundary(world: World, lo: float, hi: float, T: int) -> tuple[float, float, int, int]:
    """Adjacent values (a, b = next_up(a)) of world.fmt in [lo, hi] whose drops first touch the floor at different steps.

    Bisection on the monotone map y0 -> first-contact step (rounding is monotone), so
    first_contact(lo) must be below first_contact(hi). Returns (a, b, step_a, step_b).
    """
    f = world.fmt
    a, b = float(round_to(_real(lo, "lo"), f)), float(round_to(_real(hi, "hi"), f))
    sa, sb = first_contact_steps(world, [a, b], T)
    if not sa < sb:
        raise ValueError(f"lo={lo!r} and hi={hi!r} touch the floor at the same step ({sa}); "
                         "widen the interval")
    while float(next_up(a, f)) < b:
        mid = float(round_to(0.5 * (a + b), f))
        if not a < mid < b:
            mid = float(next_up(a, f))
        (sm,) = first_contact_steps(world, [mid], T)
        if sm == sa:
            a = mid
        else:
            b, sb = mid, sm
    return a, b, int(sa), int(sb)


# --------------------------------------------------------------------------- stiffness against step size


@dataclass
class StiffnessMap:
    """Forward and backward growth of penalty-contact rollouts over a (step size, stiffness) grid."""

    h: np.ndarray  # (H,)
    k: np.ndarray  # (K,)
    integrator: str
    forward: np.ndarray  # (H, K) max_t |y_t| / y0: 1 while the motion stays bounded
    backward: np.ndarray  # (H, K) |k dy_T/dk| / y0: the final height's response to a relative change of k
    steps: np.ndarray  # (H,) rollout lengths round(duration / h)

    def regions(self, forward_limit: float = 1.0, backward_limit: float = 100.0) -> np.ndarray:
        """(H, K) codes: 0 both fine, 1 forward fine but backward above backward_limit, 2 forward above forward_limit.

        The default forward_limit 1 flags every rollout whose ball ever rises above its drop height.
        """
        fwd_bad = ~np.isfinite(self.forward) | (self.forward > forward_limit)
        bwd_bad = ~np.isfinite(self.backward) | (self.backward > backward_limit)
        return np.where(fwd_bad, 2, np.where(bwd_bad, 1, 0))


def stiffness_map(hs, ks, integrator: str = "semi_implicit", duration: float = 2.0,
                  y0: float = 1.0, damping: float = 20.0, fmt="float64") -> StiffnessMap:
    """Damped penalty-contact drops from y0 over `duration` for each step size h (rows) and stiffness k (lanes).

    forward = max_t |y_t| / y0; backward = |k dy_T/dk| / y0, the gradient of the mean final
    height (loss "mean_height") scaled to a relative change of k.
    """
    hs = np.asarray(hs, dtype=np.float64).reshape(-1)
    ks = np.asarray(ks, dtype=np.float64).reshape(-1)
    duration = _positive(duration, "duration")
    y0 = _positive(y0, "y0")
    fwd = np.empty((hs.size, ks.size))
    bwd = np.empty((hs.size, ks.size))
    steps = np.empty(hs.size, dtype=np.int64)
    for i, h in enumerate(hs):
        world = World(h=float(h), contact="penalty", integrator=integrator, fmt=fmt, damping=damping)
        T = max(1, round(duration / h))
        steps[i] = T
        with np.errstate(over="ignore", invalid="ignore"):
            run = rollout(world, np.full((1, 1), y0), ks, T, loss="mean_height")
            fwd[i] = np.abs(run.heights).max(axis=(0, 2)) / y0
            bwd[i] = np.abs(ks * run.grad) / y0
    return StiffnessMap(h=hs, k=ks, integrator=integrator, forward=fwd, backward=bwd, steps=steps)


def horizon_sensitivity(world: World, y0, k: float, horizons, v0=0.0) -> np.ndarray:
    """dy_T/dk (the mean final height's gradient, lane 0) for each horizon T in `horizons`."""
    Ts = [_count(t, "horizon") for t in np.asarray(horizons).reshape(-1).tolist()]
    return np.array([rollout(world, y0, _real(k, "k"), T, v0=v0, loss="mean_height").grad[0]
                     for T in Ts])


# --------------------------------------------------------------------------- a real autocast pathway


def autocast_batch(tol: float = 1e-3) -> tuple[np.ndarray, float]:
    """(y0, tol): four float32 penetrations whose squared norm reaches tol in float32 but not in bfloat16.

    Two balls each at p1 and p2, each the largest float32 below the bfloat16 midpoint above
    b1 = 67 * 2^-13 and b2 = 85 * 2^-12: casting to bfloat16 (as autocast does for a matmul)
    rounds each down to b_i, so fl_bf16(sum b_i^2) = 0.00099182 lies below fl_bf16(tol),
    while the float32 sum of p_i^2 is 0.0010011 >= tol. Built for tol = 1e-3.
    """
    from .rounding import next_down

    tol = _positive(tol, "tol")
    bs = np.array([67 * 2.0**-13, 85 * 2.0**-12])
    mids = (bs + np.asarray(next_up(bs, "bfloat16"))) / 2
    p = np.asarray(next_down(mids, "float32"))
    y0 = -np.repeat(p, 2).reshape(1, -1)
    s32 = float(round_to(math.fsum(float(round_to(q * q, "float32")) for q in p.repeat(2)),
                         "float32"))
    sbf = float(round_to(math.fsum(np.repeat(bs, 2) ** 2), "bfloat16"))
    if not (s32 >= float(round_to(tol, "float32")) and sbf < float(round_to(tol, "bfloat16"))):
        raise ValueError(f"the batch is built for tol = 1e-3 (float32 |p|^2 = {s32!r}, bfloat16 "
                         f"{sbf!r}); got tol={tol!r}")
    return y0, tol


def torch_autocast_rollout(autocast: bool, T: int = 4, max_iter: int = 25, k: float = 0.5,
                           alpha: float = 0.5, tol: float = 1e-3) -> dict:
    """The autocast_batch solved with torch: float32 state and gain, stopping test S = p @ p < tol.

    With `autocast`, S is computed inside torch.autocast("cpu", dtype=torch.bfloat16), so the
    matmul casts p to bfloat16 (and returns S in bfloat16); the update y <- y + alpha k p stays
    in float32. Returns it_hist, S at the first test of each step, its dtype, loss (mean p^2),
    grad and loss_requires_grad, as torch_boundary_rollout does. Uses torch's own kernels.
    """
    y0, tol = autocast_batch(tol)
    kk = torch.tensor(float(k), dtype=torch.float32, requires_grad=True)
    y = torch.as_tensor(y0[0], dtype=torch.float32)
    it_hist, first_s, s_dtype = [], [], None
    p = torch.relu(-y)
    for _ in range(_count(T, "T")):
        it = 0
        while it < max_iter:
            p = torch.relu(-y)
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bool(autocast)):
                s = p @ p
            if it == 0:
                first_s.append(float(s.detach()))
                s_dtype = s.dtype
            if bool(s < tol):
                break
            y = y + alpha * kk * p
            it += 1
        it_hist.append(it)
    loss = p.pow(2).mean()
    needs = bool(loss.requires_grad)
    grad = 0.0
    if needs:
        (g,) = torch.autograd.grad(loss, kk, allow_unused=True)
        grad = 0.0 if g is None else float(g)
    return {"it_hist": it_hist, "first_s": first_s, "s_dtype": s_dtype,
            "loss": float(loss.detach()), "grad": grad, "loss_requires_grad": needs}
