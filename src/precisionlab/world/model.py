"""The world's parameters (`World`), their input checks, and the log of a rollout (`Rollout`)."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np

from ..checks import check_choice, check_count, check_nonnegative, check_positive
from ..formats import get_format
from ..gpu import DETERMINISTIC_ORDERS
from ..rounding import round_to

INTEGRATORS: tuple[str, ...] = ("semi_implicit", "explicit")
CONTACTS: tuple[str, ...] = ("projection", "penalty")
POLICIES: tuple[str, ...] = ("low_precision", "float32", "per_instance", "hysteresis")
LOSSES: tuple[str, ...] = ("penetration", "height", "mean_height")
STOPS: tuple[str, ...] = ("tol", "max_iter", "none")


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
        object.__setattr__(self, "h", check_positive(self.h, "h"))
        object.__setattr__(self, "g", check_nonnegative(self.g, "g"))
        check_choice(self.contact, "contact", CONTACTS)
        check_choice(self.integrator, "integrator", INTEGRATORS)
        object.__setattr__(self, "fmt", get_format(self.fmt).name)
        check_choice(self.policy, "policy", POLICIES)
        object.__setattr__(self, "tol", check_positive(self.tol, "tol"))
        if self.tol_exit is not None:
            te = check_positive(self.tol_exit, "tol_exit")
            if not te < self.tol:
                raise ValueError(f"tol_exit must be below tol={self.tol!r} (the enter tolerance); "
                                 f"got tol_exit={self.tol_exit!r}")
            object.__setattr__(self, "tol_exit", te)
        object.__setattr__(self, "max_iter", check_count(self.max_iter, "max_iter"))
        object.__setattr__(self, "alpha", check_positive(self.alpha, "alpha"))
        e = check_nonnegative(self.restitution, "restitution")
        if e > 1:
            raise ValueError(f"restitution must lie in [0, 1]; got restitution={self.restitution!r}")
        object.__setattr__(self, "restitution", e)
        if self.reduce_fmt is not None:
            object.__setattr__(self, "reduce_fmt", get_format(self.reduce_fmt).name)
        check_choice(self.order, "order", DETERMINISTIC_ORDERS)
        object.__setattr__(self, "smooth", check_nonnegative(self.smooth, "smooth"))
        object.__setattr__(self, "damping", check_nonnegative(self.damping, "damping"))
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
    def gravity_step(self) -> float:
        """fl(h g): the velocity a step of free flight removes, rounded to the state format."""
        if self.fmt == "float64":
            return self.h * self.g
        return float(round_to(self.h * self.g, self.fmt))

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
