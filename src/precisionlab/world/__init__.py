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

Files, one concept each: `model` (World, its input checks, the Rollout log), `dynamics` (one
step's rounded arithmetic: penetration, contact force, Euler integration), `solver` (the
projection solve, its reduction-ordered stopping rule and the exact decision), `rollout`
(rollout, rollouts, finite_difference), `boundary` (sums one ulp below tol, the solves they flip,
coalesce, first-contact steps one ulp apart), `stiffness` (stiffness against step size,
horizon sensitivity), `autocast` (a real torch.autocast pathway).
"""

from .autocast import autocast_batch, torch_autocast_rollout
from .boundary import (
    boundary_batch,
    boundary_rollout,
    coalesce,
    contact_boundary,
    first_contact_steps,
    side_by_side,
    torch_boundary_rollout,
)
from .dynamics import softplus
from .model import CONTACTS, INTEGRATORS, LOSSES, POLICIES, STOPS, Rollout, World
from .rollout import finite_difference, rollout, rollouts
from .stiffness import StiffnessMap, horizon_sensitivity, stiffness_map

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
    "rollouts",
    "side_by_side",
    "softplus",
    "stiffness_map",
    "torch_autocast_rollout",
    "torch_boundary_rollout",
]
