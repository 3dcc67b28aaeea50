"""Weight updates in low precision: swallowed updates, boundary crossings, storage policies.

A weight stored in a narrow format only changes when an update carries it past the rounding
boundary next to its current value. This module counts exactly when that happens
(`steps_to_cross`), checks the count by brute force (`simulate_crossing`), and trains a
small least-squares model under different weight-storage policies
(`train_master_vs_lowprec`). All rounding goes through `precisionlab.rounding.round_to`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from tqdm.auto import tqdm

from .checks import check_choice
from .exact import two_prod, two_sum
from .formats import FloatFormat, get_format
from .rounding import DETERMINISTIC_MODES, check_mode, round_to, seed_generator, ulp

__all__ = [
    "DETERMINISTIC_MODES",
    "MASTER_DTYPES",
    "OPTIMIZERS",
    "POLICIES",
    "TrainingRun",
    "boundary_distance",
    "crossing_trajectory",
    "repeated_update",
    "simulate_crossing",
    "steps_to_cross",
    "steps_to_cross_estimate",
    "swallowed",
    "train_master_vs_lowprec",
]

MASTER_DTYPES: tuple[str, ...] = ("float32", "float64")
POLICIES: tuple[str, ...] = ("fp32", "bf16", "master", "bf16_stochastic")
OPTIMIZERS: tuple[str, ...] = ("sgd", "adam")
_MAX_EXACT_STEPS = 2**53  # step counts are carried in float64 while they are computed


# --------------------------------------------------------------------------- input checks


def _check_narrow(fmt) -> FloatFormat:
    fmt = get_format(fmt)
    if fmt.name == "float64":
        raise ValueError(
            "boundary crossings are computed in float64, so fmt must be narrower than float64; "
            "got fmt='float64'"
        )
    return fmt


def _finite_array(x, name: str) -> np.ndarray:
    a = np.asarray(x, dtype=np.float64)
    bad = ~np.isfinite(a)
    if bad.any():
        raise ValueError(f"{name} must be finite; got {name}={a[bad].flat[0]!r}")
    return a


# --------------------------------------------------------------------------- exact arithmetic


def _sign_of_difference(p, e, dh, dl):
    """sign((p + e) - (dh + dl)) exactly, for p = fl(p + e) and dh = fl(dh + dl).

    Rounding is monotone, so p != dh already fixes the order of the exact values; when
    p == dh the low parts decide.
    """
    return np.where(p != dh, np.sign(p - dh), np.sign(e - dl))


# --------------------------------------------------------------------------- the boundary


# A simulation that rounds fewer values than this in all is cheaper on rounding's NumPy tier
# (about 15 ns a value) than compiling its numba loop from a cold cache (a second or more), so
# it rounds with round_to(..., compiled=False). The same bits either way.
_NUMPY_WORK = 1 << 23


@dataclass(frozen=True)
class _Boundary:
    """Moving upward from w: the crossing happens once w + k*s passes b (or reaches it)."""

    w: np.ndarray  # start, mirrored so that the update points up
    s: np.ndarray  # |lr|
    d_hi: np.ndarray  # D = b - w = d_hi + d_lo exactly
    d_lo: np.ndarray
    inclusive: np.ndarray  # True: reaching b already changes fl; False: w + k*s must exceed b
    never: np.ndarray  # the stored value can never change in this direction


def _boundary(w, lr, fmt: FloatFormat, mode: str) -> _Boundary:
    """The rounding boundary next to fl(w) in the direction of lr, for every element."""
    w, lr = np.broadcast_arrays(_finite_array(w, "w"), _finite_array(lr, "lr"))
    # Mirror downward updates: fl_mode(-x) = -fl_mirror(x), with up and down swapped.
    neg = lr < 0
    wm = np.where(neg, -w, w)
    s = np.abs(lr)
    mirror = {"up": "down", "down": "up"}
    modes = (mode, mirror.get(mode, mode))
    v = np.empty_like(wm)
    for flip, m in zip((False, True), modes, strict=True):
        sel = neg == flip
        if sel.any():
            v[sel] = round_to(wm[sel], fmt, m, compiled=wm.size > _NUMPY_WORK)
    if not np.isfinite(v).all():
        bad = w[~np.isfinite(v)].flat[0]
        raise ValueError(
            f"w={bad!r} rounds outside {fmt.name}'s finite range (max {fmt.max_finite!r})"
        )
    mode_m = np.where(neg, modes[1], modes[0])
    # u: the next value of fmt's grid above v. Above max_finite the grid continues with the
    # top binade's spacing, which is where the overflow threshold lies.
    a = np.abs(v)
    gap_down = a - np.asarray(_next_down_nonneg(a, fmt))
    u = np.where(v >= 0, v + np.asarray(ulp(v, fmt)), v + gap_down)
    mid = (v + u) / 2  # exact: v and u have few significant bits
    v_odd = np.fmod(a / np.asarray(ulp(a, fmt)), 2.0) == 1.0
    nearest = (mode_m == "nearest_even") | (mode_m == "nearest_away")
    # Ties: to even rounds a midpoint to u when v is odd; away rounds it to the larger magnitude.
    incl_nearest = np.where(mode_m == "nearest_even", v_odd, v >= 0)
    # Directed modes: fl(x) stays v on [v, u) when rounding down (toward zero for v >= 0),
    # and on (prev, v] when rounding up (toward zero for v < 0).
    keeps_below = (mode_m == "down") | ((mode_m == "toward_zero") & (v >= 0))
    b = np.where(nearest, mid, np.where(keeps_below, u, v))
    inclusive = np.where(nearest, incl_nearest, keeps_below)
    # At the top, rounding toward zero past max_finite stays at max_finite forever.
    never = (s == 0) | (~nearest & keeps_below & (v == fmt.max_finite))
    d_hi, d_lo = two_sum(b, -wm)
    return _Boundary(wm, s, d_hi, d_lo, inclusive, never)


def _next_down_nonneg(a, fmt: FloatFormat):
    """The largest value of fmt below a >= 0 (0 for a = 0, which is never used)."""
    a = np.asarray(a, dtype=np.float64)
    pos = a > 0
    out = np.zeros_like(a)
    if pos.any():
        # The gap below a is the ulp of the binade just below a: equal to ulp(a) except at a
        # power of two, where it is half as large.
        below = np.nextafter(a[pos], 0.0)
        out[pos] = a[pos] - np.asarray(ulp(below, fmt))
    return out


# --------------------------------------------------------------------------- public API


def boundary_distance(w, dw, fmt="bfloat16", mode: str = "nearest_even"):
    """D = |b - w|: how far w moves in dw's direction before fl changes (b: the rounding boundary next to fl(w)).

    For a weight stored in fmt and nearest rounding, D = ulp(w)/2, except at a power of two
    stepping toward zero, where the gap below is half as large and D = ulp(w)/4. An update
    with |dw| < D is rounded away; |dw| = D is a tie. Returned in float64 (exact for fmt
    values w, the rounded D otherwise).
    """
    fmt = _check_narrow(fmt)
    check_mode(mode)
    bd = _boundary(w, dw, fmt, mode)
    out = np.where(bd.never, np.inf, bd.d_hi + bd.d_lo)
    return float(out) if out.ndim == 0 else out


def swallowed(w, dw, fmt="bfloat16", mode: str = "nearest_even"):
    """Elementwise test of fl(w + dw) == fl(w), with w + dw summed exactly before rounding.

    For a weight already stored in fmt, fl(w) = w: True means the update is lost entirely.
    """
    fmt = _check_narrow(fmt)
    check_mode(mode)
    bd = _boundary(w, dw, fmt, mode)
    # One step crosses iff s > D (or s >= D when reaching the boundary suffices).
    zero = np.zeros_like(bd.s)
    cmp = _sign_of_difference(bd.s, zero, bd.d_hi, bd.d_lo)
    crosses = np.where(bd.inclusive, cmp >= 0, cmp > 0) & ~bd.never
    out = ~crosses
    return bool(out) if out.ndim == 0 else out


def steps_to_cross(w, lr, fmt="bfloat16", mode: str = "nearest_even"):
    """The least k >= 1 with fl(w + k*lr) != fl(w), with w + k*lr exact (real arithmetic).

    Closed form: with D the distance from w to the rounding boundary next to fl(w) in the
    direction of lr (the midpoint to the neighbouring value for the nearest modes),
    k = floor(D/|lr|) + 1 when a tie at the boundary still rounds back to fl(w), and
    k = max(1, ceil(D/|lr|)) when it does not. Ties, binade edges (where the gap halves
    below a power of two) and the overflow threshold are handled exactly; the result is an
    int64 array (or int for scalar input).
    """
    fmt = _check_narrow(fmt)
    check_mode(mode)
    bd = _boundary(w, lr, fmt, mode)
    if bd.never.any():
        i = np.flatnonzero(bd.never.ravel())[0]
        raise ValueError(
            f"the stored value never changes for w={np.ravel(np.broadcast_to(w, bd.s.shape))[i]!r}, "
            f"lr={np.ravel(np.broadcast_to(lr, bd.s.shape))[i]!r} in {fmt.name} with mode={mode!r} "
            "(lr = 0, or rounding toward zero at max_finite)"
        )
    with np.errstate(over="ignore"):
        q = (bd.d_hi + bd.d_lo) / bd.s
    if not (q < _MAX_EXACT_STEPS).all():
        raise ValueError(
            f"more than 2^53 steps needed (D/|lr| up to {q.max():.3g}); use "
            "steps_to_cross_estimate for such tiny learning rates"
        )
    k = np.where(bd.inclusive, np.maximum(np.ceil(q), 1.0), np.floor(q) + 1.0)

    def crossed(kk):
        p, e = two_prod(kk, bd.s)
        c = _sign_of_difference(p, e, bd.d_hi, bd.d_lo)
        return np.where(bd.inclusive, c >= 0, c > 0)

    # q = D/|lr| is off by at most a few ulps, so k is at most one step from the answer.
    for _ in range(2):
        k = np.where(crossed(k), k, k + 1)
        k = np.where((k > 1) & crossed(np.maximum(k - 1, 1.0)), k - 1, k)
    if not (crossed(k) & ((k == 1) | ~crossed(np.maximum(k - 1, 1.0)))).all():
        raise RuntimeError("steps_to_cross: correction did not converge")  # pragma: no cover
    out = k.astype(np.int64)
    return int(out) if out.ndim == 0 else out


def steps_to_cross_estimate(w, lr, fmt="bfloat16"):
    """Rule of thumb K ≈ (ulp(W)/2)/|lr| ≈ |W|·2^-p/|lr| = |W|/(2^p·|lr|): |W|/(256·|lr|) for bf16 (p = 8).

    It takes ulp(W) ≈ |W|·2^-(p-1), which is exact at the bottom of a binade and up to 2x too
    large at its top, so the estimate overstates the exact count by a factor in [1, 2).
    """
    fmt = get_format(fmt)
    w = _finite_array(w, "w")
    lr = _finite_array(lr, "lr")
    if (lr == 0).any():
        raise ValueError("lr must be nonzero; got lr=0.0")
    out = np.abs(w) / (2.0**fmt.precision * np.abs(lr))
    return float(out) if out.ndim == 0 else out


def _check_master(master: str) -> np.dtype:
    return np.dtype(check_choice(master, "master dtype", MASTER_DTYPES))


def simulate_crossing(w, lr, max_steps: int, fmt="bfloat16", mode: str = "nearest_even",
                      master: str = "float32", progress: bool | None = None):
    """Brute force: the first k <= max_steps with fl(w_k) != fl(w_0), w_k = master(w_{k-1} + lr); -1 if none.

    The master copy w_k is held in `master` (float32 as in mixed-precision training, or
    float64) and updated one step at a time, as an optimizer does. The steps are taken in
    blocks: np.cumsum adds strictly left to right, so a block of cumulative sums is exactly
    the sequence of master updates, and one rounding call checks a whole block for all
    weights still unchanged. `progress` shows a tqdm bar (default: only for long runs).
    """
    fmt = _check_narrow(fmt)
    check_mode(mode)
    dt = _check_master(master)
    if int(max_steps) != max_steps or max_steps < 1:
        raise ValueError(f"max_steps must be a positive integer; got max_steps={max_steps!r}")
    max_steps = int(max_steps)
    w0, lr0 = np.broadcast_arrays(_finite_array(w, "w"), _finite_array(lr, "lr"))
    shape = w0.shape
    cur = w0.astype(dt).ravel()
    step = lr0.astype(dt).ravel()
    start = np.asarray(round_to(cur, fmt, mode))
    first = np.full(cur.shape, -1, dtype=np.int64)
    live = np.arange(cur.size)  # weights whose copy has not changed yet
    block = int(np.clip(2**20 // max(cur.size, 1), 1, 1024))
    short = max_steps * cur.size <= _NUMPY_WORK  # round on NumPy (_NUMPY_WORK)
    if progress is None:
        # About 0.1 ms per rounding call plus 20 ns per rounded value.
        progress = (max_steps / block) * 1e-4 + max_steps * cur.size * 2e-8 > 2.0
    bar = None
    if progress:
        bar = tqdm(total=max_steps, desc="simulating updates", leave=False)
    done = 0
    while done < max_steps and live.size:
        b = min(block, max_steps - done)
        seq = np.empty((live.size, b + 1), dtype=dt)
        seq[:, 0] = cur[live]
        seq[:, 1:] = step[live, None]
        traj = np.cumsum(seq, axis=1, dtype=dt)[:, 1:]  # w_{done+1} .. w_{done+b}
        changed = np.asarray(round_to(traj, fmt, mode, compiled=not short)) != start[live, None]
        hit = changed.any(axis=1)
        first[live[hit]] = done + 1 + changed[hit].argmax(axis=1)
        cur[live] = traj[:, -1]
        live = live[~hit]
        done += b
        if bar is not None:
            bar.update(b)
    if bar is not None:
        bar.close()
    out = first.reshape(shape)
    return int(out) if out.ndim == 0 else out


def crossing_trajectory(w: float, lr: float, steps: int, fmt="bfloat16",
                        mode: str = "nearest_even", master: str = "float32"):
    """(k, master w_k, fl(w_k)) for k = 0..steps, with w_k = master(w_{k-1} + lr): for plots."""
    fmt = _check_narrow(fmt)
    check_mode(mode)
    dt = _check_master(master)
    w0 = float(_finite_array(w, "w"))
    lr0 = float(_finite_array(lr, "lr"))
    # Each master step rounds the previous one: np.cumsum adds strictly left to right in dt,
    # so it is exactly the loop w_k = master(w_{k-1} + lr).
    seq = np.full(int(steps) + 1, lr0, dtype=dt)
    seq[0] = w0
    vals = np.cumsum(seq, dtype=dt)
    copy = np.asarray(round_to(vals, fmt, mode, compiled=vals.size > _NUMPY_WORK),
                      dtype=np.float64)
    return np.arange(int(steps) + 1), vals.astype(np.float64), copy


def repeated_update(w, dw, steps: int, fmt="bfloat16", mode: str = "nearest_even", *,
                    seed: int | None = None):
    """w_k = fl(fl32(w_{k-1} + dw)) for k = 1..steps, w_0 = fl(w): weights stored in fmt; returns w_steps.

    The sum is formed in float32 and then rounded into fmt, as torch's CPU kernels for
    bfloat16 and float16 do (for fmt = float64 it is formed in float64). mode may be
    "stochastic" (pass `seed`: every step draws, in turn, from np.random.default_rng(seed));
    the starting values are rounded to nearest.
    """
    fmt = get_format(fmt)
    check_mode(mode, stochastic=True)
    if mode == "stochastic" and seed is None:
        raise ValueError("stochastic rounding draws random bits: pass seed=<int>; got seed=None")
    gen = None if seed is None else seed_generator(seed)
    start_mode = "nearest_even" if mode == "stochastic" else mode
    w = np.asarray(round_to(_finite_array(w, "w"), fmt, start_mode), dtype=np.float64)
    dw = np.broadcast_to(_finite_array(dw, "dw"), w.shape)
    carrier = np.float64 if fmt.name == "float64" else np.float32
    wc, dwc = w.astype(carrier), dw.astype(carrier)
    for _ in range(int(steps)):
        wc = round_to(wc + dwc, fmt, mode, gen)
    return wc.astype(np.float64)


# --------------------------------------------------------------------------- training


@dataclass(frozen=True)
class TrainingRun:
    """One storage policy's history: loss after k steps (k = 0..steps), fraction changed per step."""

    policy: str
    loss: np.ndarray  # shape (steps + 1,)
    changed: np.ndarray  # shape (steps,): fraction of the weights the forward pass uses that changed
    weights: np.ndarray | None = None  # after the last step: the weights the forward pass uses
    grad: np.ndarray | None = None  # float32 gradient of L at those weights (the next step's input)

    @property
    def final_loss(self) -> float:
        """The loss after the last step."""
        return float(self.loss[-1])


def _ordered_matmul(a_cols: np.ndarray, v: np.ndarray) -> np.ndarray:
    """(A @ v_p for each row v_p of v (P, q)), given a_cols[j] = A[:, j]: each sum in float64 over j = 0..q-1 in order, one IEEE op at a time (no BLAS).

    Row p of the result is acc = A[:, 0] v[p, 0], then acc = acc + A[:, j] v[p, j]: the same
    products and sums for every row as for that row alone, so P independent vectors share
    one pass of the loop. Returns (P, len(A)).
    """
    # every product at once, prods[j] = (A[:, j] v[p, j] for each p); then the sums, in order
    prods = np.ascontiguousarray(v.T)[:, :, None] * a_cols[:, None, :]
    acc = prods[0].copy()
    for term in prods[1:]:
        acc += term
    return acc


def _least_squares_problem(n: int, d: int, seed: int):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, d))
    w_true = rng.standard_normal(d)
    y = _ordered_matmul(np.ascontiguousarray(x.T), w_true[None, :])[0]
    y = y + 1e-3 * rng.standard_normal(n)
    w0 = w_true + 0.5 * rng.standard_normal(d)
    return x, y, w0


class _PolicyRun:
    """One storage policy's weights, optimizer moments and history while the policies train together."""

    def __init__(self, policy: str, w_init: np.ndarray, fmt: FloatFormat, steps: int, seed: int):
        self.policy = policy
        self.rng = np.random.default_rng([seed, POLICIES.index(policy)])
        self.stored_in_fmt = policy in ("bf16", "bf16_stochastic")
        self.mode = "stochastic" if policy == "bf16_stochastic" else "nearest_even"
        self.fmt = fmt
        w = w_init.astype(np.float32)
        self.w = round_to(w, fmt) if self.stored_in_fmt else w
        self.m1 = np.zeros(w.shape, dtype=np.float32)
        self.m2 = np.zeros(w.shape, dtype=np.float32)
        self.losses = np.empty(steps + 1)
        self.changed = np.empty(steps)
        self.used = self._forward_weights(self.w)

    def _forward_weights(self, w: np.ndarray) -> np.ndarray:
        """The weights the forward pass uses: w itself, or fl(w) beside a float32 master."""
        return w if self.policy == "fp32" or self.stored_in_fmt else round_to(w, self.fmt)

    def step(self, k: int, g: np.ndarray, lr: float, optimizer: str) -> None:
        """Step k's update from the float32 gradient g, applied and stored by the policy."""
        if optimizer == "sgd":
            upd = -np.float32(lr) * g
        else:  # Adam with the usual defaults, bias-corrected
            self.m1 = np.float32(0.9) * self.m1 + np.float32(0.1) * g
            self.m2 = np.float32(0.999) * self.m2 + np.float32(0.001) * g * g
            mh = self.m1 / np.float32(1 - 0.9 ** (k + 1))
            vh = self.m2 / np.float32(1 - 0.999 ** (k + 1))
            upd = -np.float32(lr) * mh / (np.sqrt(vh) + np.float32(1e-8))
        w_new = self.w + upd
        if self.stored_in_fmt:
            w_new = round_to(w_new, self.fmt, self.mode,
                             self.rng if self.mode == "stochastic" else None)
        new_used = self._forward_weights(w_new)
        self.changed[k] = np.mean(new_used != self.used)
        self.w, self.used = w_new, new_used


def train_master_vs_lowprec(steps: int = 300, lr: float = 0.05, optimizer: str = "sgd",
                            policies=("fp32", "bf16", "master"), n: int = 256, d: int = 64,
                            fmt="bfloat16", seed: int = 0) -> dict[str, TrainingRun]:
    """Least squares L(w) = |Xw - y|^2 / (2n) trained by SGD or Adam under weight-storage policies.

    fp32: float32 weights and updates. bf16: weights stored in fmt, each update
    applied and rounded back (nearest-even), so small updates are swallowed. master: float32
    master weights updated exactly as fp32, the forward and gradient use fl(w) in fmt.
    bf16_stochastic: as bf16 but the update is rounded stochastically. Loss and gradient are
    evaluated in float64 at the weights the forward pass uses; deterministic given `seed`.
    The policies are independent (each draws from its own stream): they train side by side,
    one column each of the products with X, every column's sums in the same fixed order.
    """
    fmt = get_format(fmt)
    for p in policies:
        check_choice(p, "policy", POLICIES)
    check_choice(optimizer, "optimizer", OPTIMIZERS)
    x, y, w_init = _least_squares_problem(n, d, seed)
    x_cols = np.ascontiguousarray(x.T)  # x_cols[j]: column j of X, for X w; x[i], row i, for X^T r
    runs = [_PolicyRun(policy, w_init, fmt, steps, seed) for policy in dict.fromkeys(policies)]
    if not runs:
        return {}
    for k in range(steps + 1):
        used = np.stack([run.used for run in runs]).astype(np.float64)  # (P, d)
        r = _ordered_matmul(x_cols, used) - y  # (P, n)
        grads = (_ordered_matmul(x, r) / n).astype(np.float32)  # rows of X in order
        for p, run in enumerate(runs):
            run.losses[k] = math.fsum(r[p] * r[p]) / (2 * n)
            if k < steps:
                run.step(k, grads[p], lr, optimizer)
    return {run.policy: TrainingRun(run.policy, run.losses, run.changed,
                                    run.used.astype(np.float64),
                                    grads[p].copy())
            for p, run in enumerate(runs)}

