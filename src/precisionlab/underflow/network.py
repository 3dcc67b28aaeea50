"""The attenuation model, the network that realises it, and its gradient statistics and training probes.

`underflow`'s package docstring tells the story; `diagnosis` reads what this module measures.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction
from functools import lru_cache

import numpy as np
import torch

from .. import emulate
from ..checks import check_choice, check_positive
from ..emulate import BACKENDS, Precision, exp64, fixed_sum, log64, sqrt64
from ..formats import get_format

__all__ = [
    "FLOORS",
    "NETWORK_FORMATS",
    "STATUSES",
    "AttenuatingNet",
    "ForwardPass",
    "GradientStats",
    "LayerGradients",
    "TrainingProbe",
    "first_underflow_depth",
    "fit_g0",
    "floor_value",
    "gradient_by_depth",
    "make_batch",
    "measured_underflow_depth",
    "orthonormal_columns",
    "pass_products",
    "predicted_underflow_depth",
    "probe_gradients",
    "probe_network",
    "train_probe",
    "train_probe_arguments",
    "zero_counts",
]

FLOORS: tuple[str, ...] = ("normal", "subnormal", "zero")
# torch can run a whole network in these formats on CPU; the model itself accepts any format.
NETWORK_FORMATS: tuple[str, ...] = ("float16", "bfloat16", "float32")
STATUSES: tuple[str, ...] = ("healthy", "subnormal", "underflowing", "zero", "non-finite")


# --------------------------------------------------------------------------- the model


def _check_floor(floor: str) -> str:
    return check_choice(floor, "floor", FLOORS)


def floor_value(fmt="float16", floor: str = "zero") -> float:
    """The floor's magnitude: min_normal ('normal'), q = min_subnormal ('subnormal') or q/2 ('zero')."""
    f = get_format(fmt)
    _check_floor(floor)
    # At q/2 exactly, ties-to-even picks 0 (whose last bit is even) over q: the value is lost.
    return {"normal": f.min_normal, "subnormal": f.min_subnormal, "zero": f.min_subnormal / 2}[floor]


def gradient_by_depth(attenuation: float, depth: int, g0: float = 1.0) -> np.ndarray:
    """g_k = g0 · a^k for k = 0, ..., depth - 1 (float64)."""
    a = check_positive(attenuation, "attenuation")
    g = check_positive(g0, "g0")
    if int(depth) != depth or depth < 1:
        raise ValueError(f"depth must be a positive integer; got depth={depth!r}")
    return g * np.power(a, np.arange(int(depth), dtype=np.float64))


def first_underflow_depth(attenuation: float, fmt="float16", g0: float = 1.0,
                          floor: str = "zero") -> int | None:
    """Smallest k >= 0 with g0 · a^k past the floor (<= q/2 for 'zero', < the value otherwise), or None.

    Exact: the float64 estimate k = log(T/g0)/log(a) is confirmed with rational arithmetic
    whenever it lies close to an integer. None means the gradient never gets there (a >= 1).
    """
    a = check_positive(attenuation, "attenuation")
    g = check_positive(g0, "g0")
    t = floor_value(fmt, floor)
    strict = floor != "zero"

    def below(k: int) -> bool:
        # log-domain margin first; fall back to exact rationals only when it is too thin to trust.
        margin = k * math.log(a) + math.log(g) - math.log(t)
        if abs(margin) > 1e-9 * (k + 1):
            return margin < 0
        x = Fraction(g) * Fraction(a) ** k
        return x < Fraction(t) if strict else x <= Fraction(t)

    if below(0):
        return 0
    if a >= 1:
        return None
    k = max(1, math.ceil((math.log(t) - math.log(g)) / math.log(a)))
    while k > 1 and below(k - 1):
        k -= 1
    while not below(k):
        k += 1
    return k


# --------------------------------------------------------------------------- the network


def _network_format(fmt) -> str:
    f = get_format(fmt)
    if f.name not in NETWORK_FORMATS:
        raise ValueError(
            f"the network runs in {f.name!r} only as a model; valid choices for a real network: "
            f"{', '.join(NETWORK_FORMATS)}"
        )
    return f.name


def _precision(fmt, backend: str) -> Precision:
    check_choice(backend, "backend", BACKENDS)
    return Precision(_network_format(fmt), backend=backend)


def orthonormal_columns(a: torch.Tensor) -> torch.Tensor:
    """Modified Gram-Schmidt on each (n, n) matrix of a (float64), dot products by fixed_sum.

    The result Q has positive diag(R) in a = QR, so for Gaussian a it is Haar-distributed (what
    Q·sign(diag R) from a LAPACK QR gives), and it has the same bits on every CPU.
    """
    v = a.to(torch.float64).clone()
    for j in range(v.shape[-1]):
        col = v[..., :, j]
        col = col / sqrt64(fixed_sum(col * col, -1)).unsqueeze(-1)
        v[..., :, j] = col
        if j + 1 < v.shape[-1]:
            rest = v[..., :, j + 1:]
            r = fixed_sum(col.unsqueeze(-1) * rest, -2)  # <q_j, v_i> for the remaining columns
            v[..., :, j + 1:] = rest - col.unsqueeze(-1) * r.unsqueeze(-2)
    return v


@lru_cache(maxsize=8)
def _initial_draws(depth: int, width: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(Q, z): depth Haar-orthogonal (width, width) matrices and N(0, 1) bias draws, float64."""
    gen = torch.Generator().manual_seed(int(seed))
    q = orthonormal_columns(emulate.randn(depth, width, width, generator=gen, dtype=torch.float64))
    return q, emulate.randn(depth, width, generator=gen, dtype=torch.float64)


class AttenuatingNet(torch.nn.Module):
    """depth affine layers h <- W h + b, W = a·Q (Q orthogonal), b ~ N(0, 1 - a^2): backward gain a per layer.

    Parameters are float32 tensors holding values of fmt; every layer runs through
    emulate.linear in Precision(fmt) (backend="emulated": products exact, float32 accumulation
    in a fixed order, one rounding to fmt) or with torch's own kernels in fmt (backend="native").
    """

    def __init__(self, depth: int = 96, width: int = 64, attenuation: float = 0.82,
                 fmt="float32", seed: int = 0, backend: str = "emulated"):
        super().__init__()
        a = check_positive(attenuation, "attenuation")
        if int(depth) != depth or depth < 1:
            raise ValueError(f"depth must be a positive integer; got depth={depth!r}")
        if int(width) != width or width < 1:
            raise ValueError(f"width must be a positive integer; got width={width!r}")
        self.prec = _precision(fmt, backend)
        self.attenuation = a
        self.fmt = self.prec.fmt
        self.backend = backend
        n, L = int(width), int(depth)
        # Bias variance 1 - a^2 keeps E|h|^2 at its input value for a < 1 (the stationary
        # point of v <- a^2 v + s^2); for a >= 1 no bias keeps it bounded, so use unit variance.
        bias_std = math.sqrt(1 - a * a) if a < 1 else 1.0
        # Built in float64 with elementwise arithmetic only, then rounded once to the format:
        # every format stores the same network, on every CPU.
        q, z = _initial_draws(L, n, int(seed))
        with emulate.planned_products(L * n * n):  # L n^2 weights rounded once: no compile
            self.layers = torch.nn.ModuleList(
                [emulate.Linear(a * q[i], bias_std * z[i], self.prec) for i in range(L)])

    @property
    def depth(self) -> int:
        """Number of layers."""
        return len(self.layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """h_{i+1} = fl(W_i h_i + b_i) for i = 0, ..., depth - 1, in the network's Precision."""
        for lin in self.layers:
            x = lin(x)
        return x


def make_batch(width: int = 64, batch: int = 16, fmt="float32", seed: int = 0):
    """(x, t): inputs and regression targets with i.i.d. N(0, 1) entries, rounded to fmt (float32 tensors)."""
    prec = Precision(_network_format(fmt))
    gen = torch.Generator().manual_seed(int(seed) + 10_000)  # independent of the weights' stream
    x = emulate.randn(int(batch), int(width), generator=gen, dtype=torch.float64)
    t = emulate.randn(int(batch), int(width), generator=gen, dtype=torch.float64)
    return prec.round(x), prec.round(t)


class _FlushToZero(torch.autograd.Function):
    """x -> 0 where |x| < tiny, else x, in both passes: a flush-to-zero unit's stores."""

    @staticmethod
    def forward(ctx, x, tiny):
        ctx.tiny = tiny
        return _flush(x, tiny)

    @staticmethod
    def backward(ctx, g):
        return _flush(g, ctx.tiny), None


def _flush(x: torch.Tensor, tiny: float) -> torch.Tensor:
    """0 where |x| < tiny (inf and NaN kept): exact, so the same bits on every machine."""
    return torch.where(x.abs() < tiny, torch.zeros_like(x), x)


class _GradTo(torch.autograd.Function):
    """Identity forward; backward rounds the incoming gradient to F (a cast back to F's dtype)."""

    @staticmethod
    def forward(ctx, x, prec):
        ctx.prec = prec
        return x.view_as(x)

    @staticmethod
    def backward(ctx, g):
        return ctx.prec.round(g), None


@dataclass(frozen=True)
class GradientStats:
    """Per-layer statistics of one kind of gradient; index k = depth below the loss (0 = last layer)."""

    norm: np.ndarray  # Euclidean norm over the layer's entries, a fixed_sum in float64
    median_abs: np.ndarray  # median |entry|: the "typical" gradient entry
    max_abs: np.ndarray
    zero_fraction: np.ndarray  # fraction of entries that are exactly 0
    finite: np.ndarray  # bool: no inf/NaN in the layer's gradient

    @classmethod
    def of(cls, tensors: Sequence[torch.Tensor]) -> GradientStats:
        """Statistics of tensors listed from the input layer to the last (stored reversed, by depth)."""
        gt = torch.stack([t.detach().to(torch.float64) for t in tensors[::-1]]).flatten(1)
        norm = sqrt64(fixed_sum(gt * gt, -1)).numpy()  # fixed order, IEEE root: same bits everywhere
        g = gt.numpy()
        mag = np.abs(g)
        return cls(
            norm=norm,
            median_abs=np.median(mag, axis=1),  # selection; midpoint of two values for even counts
            max_abs=mag.max(axis=1),
            zero_fraction=(g == 0).sum(axis=1) / g.shape[1],
            finite=np.isfinite(g).all(axis=1),
        )


@dataclass(frozen=True)
class LayerGradients:
    """One backward pass: the loss, weight gradients dL/dW_k and backward signals dL/dh_k by depth k.

    The signal dL/dh_k (gradient of the loss with respect to layer k's output, one entry per
    example and unit) is what each layer's Jacobian multiplies by a; the weight gradient
    sums signal x input over the batch, so its entries are larger by a depth-independent factor.
    """

    fmt: str
    loss: float
    weight: GradientStats
    signal: GradientStats
    loss_scale: float = 1.0  # S of the backward pass (the statistics are divided by it)
    flush_to_zero: bool = False  # whether results below the smallest normal were flushed

    @property
    def depth(self) -> int:
        """Number of layers."""
        return len(self.weight.norm)

    def stats(self, which: str) -> GradientStats:
        """The 'weight' or 'signal' statistics."""
        if which not in ("weight", "signal"):
            raise ValueError(f"unknown gradient kind {which!r}; valid choices: weight, signal")
        return self.weight if which == "weight" else self.signal

    def arrays(self) -> dict[str, np.ndarray]:
        """The loss and every statistic as named arrays ('loss', 'weight.norm', ..., 'signal.finite')."""
        out = {"loss": np.array(self.loss, dtype=np.float64)}
        for which in ("weight", "signal"):
            st = self.stats(which)
            out.update({f"{which}.{name}": np.asarray(getattr(st, name))
                        for name in GradientStats.__dataclass_fields__})
        return out

    @classmethod
    def from_arrays(cls, fmt: str, arrays, loss_scale: float = 1.0,
                    flush_to_zero: bool = False) -> LayerGradients:
        """The LayerGradients whose arrays() are `arrays` (a mapping with the same keys)."""
        stats = {which: GradientStats(**{name: np.array(arrays[f"{which}.{name}"])
                                         for name in GradientStats.__dataclass_fields__})
                 for which in ("weight", "signal")}
        return cls(get_format(fmt).name, float(arrays["loss"]), stats["weight"], stats["signal"],
                   float(loss_scale), bool(flush_to_zero))

    def same_bits(self, other: LayerGradients) -> bool:
        """Same format, loss scale and flushing, and every number with the same dtype, shape and bits."""
        if (self.fmt, self.loss_scale, self.flush_to_zero) != \
                (other.fmt, other.loss_scale, other.flush_to_zero):
            return False
        mine, theirs = self.arrays(), other.arrays()
        return all(u.dtype == v.dtype and u.shape == v.shape and u.tobytes() == v.tobytes()
                   for u, v in ((mine[k], theirs[k]) for k in mine))


class ForwardPass:
    """One forward pass of L = mean((net(x) - t)^2), kept so that backward(S) can follow it at any
    loss scale S: what a loss scaler that skips steps (and so keeps the weights) meets again.

    backward(S) is probe_gradients' backward pass from fl32(S·L), with the same bits as a
    fresh probe_gradients(net, x, t, S): the graph is kept, the gradients are reset before each
    backward pass, and the weights must not change in between.
    """

    def __init__(self, net: AttenuatingNet, x: torch.Tensor, t: torch.Tensor,
                 flush_to_zero: bool = False):
        if not isinstance(flush_to_zero, (bool, np.bool_)):
            raise ValueError(f"flush_to_zero must be True or False; got flush_to_zero={flush_to_zero!r}")
        prec = net.prec
        self.net, self.flush_to_zero = net, bool(flush_to_zero)
        self._tiny = tiny = get_format(net.fmt).min_normal if flush_to_zero else None
        loss_prec = Precision("float32", backend=prec.backend)
        outputs = []
        h = prec.round(x) if not prec.native else x.to(torch.float32)
        if tiny is not None:
            h = _FlushToZero.apply(h, tiny)
        for lin in net.layers:
            out = lin(h)
            out.retain_grad()  # keep dL/dh_k, the backward signal, as the backward pass stored it
            outputs.append(out)
            # With flushing, out.grad is the flushed gradient that enters the layer's backward.
            h = out if tiny is None else _FlushToZero.apply(out, tiny)
        self.outputs = outputs  # each layer's output, from the input layer to the last
        self._loss = emulate.mse_loss(_GradTo.apply(h, prec), t.to(torch.float32), loss_prec)
        self.loss = float(self._loss.detach())

    def peak(self) -> np.ndarray:
        """Largest |entry| of each layer's output, from the input layer to the last (float64)."""
        return np.array([float(o.detach().abs().max()) for o in self.outputs])

    def backward(self, loss_scale: float = 1.0,
                 stop_at_nonfinite: bool = False) -> LayerGradients | None:
        """The backward pass from fl32(S·L): statistics of the stored gradients divided by S.

        stop_at_nonfinite=True asks what a loss scaler asks: it stops at the first dL/dW or
        dL/dh that holds an inf or NaN and returns None (the scaler would skip the step);
        otherwise the pass runs to the end and gives the same statistics.
        """
        s = check_positive(loss_scale, "loss_scale")
        net, tiny = self.net, self._tiny
        net.zero_grad(set_to_none=True)
        for o in self.outputs:
            o.grad = None  # retained gradients would add up over backward passes
        hooks = []
        if stop_at_nonfinite:  # checked as each gradient is made, the bias gradients excepted
            hooks = [t.register_hook(_stop_at_nonfinite)
                     for t in (*self.outputs, *(lin.weight for lin in net.layers))]
        try:
            # one float32 multiply; the graph below it is kept for the next backward pass
            (self._loss * torch.tensor(s, dtype=torch.float32)).backward(retain_graph=True)
        except _NonFinite:
            return None
        finally:
            for h in hooks:
                h.remove()
        weight_grads = [lin.weight.grad for lin in net.layers]
        if tiny is not None:
            weight_grads = [_flush(g, tiny) for g in weight_grads]
        return LayerGradients(
            fmt=net.fmt,
            loss=self.loss,
            weight=GradientStats.of([g.double() / s for g in weight_grads]),
            signal=GradientStats.of([o.grad.double() / s for o in self.outputs]),
            loss_scale=s,
            flush_to_zero=self.flush_to_zero,
        )


class _NonFinite(Exception):
    """Raised in a backward pass to stop it at the first inf/NaN gradient."""


def _stop_at_nonfinite(grad: torch.Tensor) -> None:
    if not bool(torch.isfinite(grad).all()):
        raise _NonFinite


def pass_products(net: AttenuatingNet, x: torch.Tensor) -> int:
    """Multiply-adds of one forward and backward pass of net on x (what
    `emulate.planned_products` is told): per layer h W^T forward and g^T h backward, and g W
    for the layer's input gradient, which the first layer does not need."""
    weights = [lin.weight.numel() for lin in net.layers]
    return x.shape[0] * (3 * sum(weights) - weights[0])



def probe_gradients(net: AttenuatingNet, x: torch.Tensor, t: torch.Tensor,
                    loss_scale: float = 1.0, flush_to_zero: bool = False) -> LayerGradients:
    """One pass of L = mean((net(x) - t)^2): layers in the network's Precision, L in float32 (as
    autocast computes losses); backward from fl32(S·L), the gradient entering the network rounded
    to its format; statistics of the stored gradients divided by S in float64.

    flush_to_zero=True models a unit without subnormals: every value it stores below the
    format's smallest normal becomes 0 (the input, each layer's output in the forward pass, the
    gradient entering each layer's backward pass, and the weight gradients), so a flushed
    entry contributes nothing to the next layer's sums. The weights themselves are not flushed.
    """
    s = check_positive(loss_scale, "loss_scale")
    with emulate.planned_products(pass_products(net, x)):  # one pass: NumPy's tier, no compile
        return ForwardPass(net, x, t, flush_to_zero).backward(s)


def probe_network(attenuation: float = 0.82, fmt="float32", depth: int = 96, width: int = 64,
                  batch: int = 16, *, seed: int = 0, backend: str = "emulated",
                  loss_scale: float = 1.0, flush_to_zero: bool = False) -> LayerGradients:
    """probe_gradients of AttenuatingNet(depth, width, a, fmt, seed) on make_batch(width, batch, fmt, seed)."""
    net = AttenuatingNet(depth, width, attenuation, fmt, seed, backend)
    x, t = make_batch(width, batch, fmt, seed)
    return probe_gradients(net, x, t, loss_scale=loss_scale, flush_to_zero=flush_to_zero)


@dataclass(frozen=True)
class TrainingProbe:
    """A few SGD steps: the loss before each step and the per-layer gradient statistics of each step."""

    fmt: str
    attenuation: float
    loss: np.ndarray  # shape (steps,)
    steps: tuple[LayerGradients, ...]

    def zero_fraction(self, which: str = "weight") -> np.ndarray:
        """Array (steps, depth) of exactly-zero fractions of the weight gradients or signals."""
        return np.stack([s.stats(which).zero_fraction for s in self.steps])

    def norm(self, which: str = "weight") -> np.ndarray:
        """Array (steps, depth) of per-layer gradient norms."""
        return np.stack([s.stats(which).norm for s in self.steps])


def train_probe_arguments(attenuation, depth, fmt, steps, lr, width, batch, seed, backend,
                          master) -> dict:
    """train_probe's arguments checked (ValueError naming a bad one) and in one form each: what
    the run depends on, so that equal dicts mean the same run (chapters.underflow_runs' key)."""
    if isinstance(steps, bool) or int(steps) != steps or steps < 1:
        raise ValueError(f"steps must be a positive integer; got steps={steps!r}")
    if not isinstance(master, (bool, np.bool_)):
        raise ValueError(f"master must be True or False; got master={master!r}")
    for name, v in (("depth", depth), ("width", width)):
        if isinstance(v, (bool, str)) or int(v) != v or v < 1:
            raise ValueError(f"{name} must be a positive integer; got {name}={v!r}")
    check_choice(backend, "backend", BACKENDS)
    return {"attenuation": check_positive(attenuation, "attenuation"), "depth": int(depth),
            "fmt": _network_format(fmt), "steps": int(steps), "lr": check_positive(lr, "lr"),
            "width": int(width), "batch": int(batch), "seed": int(seed), "backend": str(backend),
            "master": bool(master)}


def train_probe(attenuation: float = 0.82, depth: int = 96, fmt="float16", steps: int = 10,
                lr: float = 0.1, width: int = 64, batch: int = 16, seed: int = 0,
                backend: str = "emulated", master: bool = False) -> TrainingProbe:
    """Plain SGD, w <- fl(w - lr·g), with weights, activations and gradients all stored in fmt;
    master=True keeps float32 master weights instead: m <- fl32(m - lr·g), w = fl_fmt(m)."""
    train_probe_arguments(attenuation, depth, fmt, steps, lr, width, batch, seed, backend, master)
    lr = check_positive(lr, "lr")
    net = AttenuatingNet(depth, width, attenuation, fmt, seed, backend)
    x, t = make_batch(width, batch, fmt, seed)
    if master:
        if net.prec.native:
            raise ValueError("master=True runs with backend='emulated' only; got backend='native'")
        copies = [torch.nn.Parameter(p.detach().clone()) for p in net.parameters()]
        master_opt = emulate.SGD(copies, lr, prec="float32")

        @torch.no_grad()
        def update():
            for m, p in zip(copies, net.parameters(), strict=True):
                m.grad = p.grad
            master_opt.step()  # the update lands in float32 ...
            for m, p in zip(copies, net.parameters(), strict=True):
                p.copy_(net.prec.round(m))  # ... and the network uses its fmt copy
    elif net.prec.native:
        dt = get_format(net.fmt).torch_dtype

        @torch.no_grad()
        def update():
            for p in net.parameters():  # torch's own kernels in fmt: lr·g rounded, then w - lr·g
                p.copy_((p.to(dt) - lr * p.grad.to(dt)).to(torch.float32))
    else:
        opt = emulate.SGD(net.parameters(), lr, prec=net.prec)
        update = opt.step
    losses, records = [], []
    with emulate.planned_products(int(steps) * pass_products(net, x)):  # all the steps' passes
        for _ in range(int(steps)):
            rec = probe_gradients(net, x, t)
            losses.append(rec.loss)
            records.append(rec)
            update()
    return TrainingProbe(net.fmt, float(attenuation), np.array(losses), tuple(records))


def measured_underflow_depth(grads: LayerGradients, which: str = "signal",
                             fraction: float = 0.5) -> int | None:
    """First depth k whose gradient has at least `fraction` exact zeros (the typical entry is 0), or None."""
    if not 0 < fraction <= 1:
        raise ValueError(f"fraction must be in (0, 1]; got fraction={fraction!r}")
    hits = np.flatnonzero(grads.stats(which).zero_fraction >= fraction)
    return int(hits[0]) if hits.size else None


def zero_counts(grads: LayerGradients) -> tuple[int, int, int | None]:
    """(layers with some exact zeros in dL/dW, layers with all, first depth with half of dL/dh zero)."""
    z = grads.weight.zero_fraction
    return int((z > 0).sum()), int((z == 1).sum()), measured_underflow_depth(grads)


def fit_g0(grads32: LayerGradients, attenuation: float, which: str = "signal") -> float:
    """The model's intercept: g0 = exp(median_k(log m_k - k log a)), m_k = median |g| at depth k."""
    a = check_positive(attenuation, "attenuation")
    med = grads32.stats(which).median_abs
    k = np.arange(med.size)
    ok = med > 0
    if not ok.any():
        raise ValueError("every layer's median gradient is 0; give a probe that did not underflow")
    # The median over depths of log m_k - k log a is robust to a few atypical layers. log64 and
    # exp64 use only +, -, *, /: the fitted g0 has the same bits on every CPU.
    logs = log64(torch.from_numpy(med[ok])) - torch.from_numpy(k[ok].astype(np.float64)) * \
        log64(torch.tensor(a, dtype=torch.float64))
    return float(exp64(torch.tensor(np.median(logs.numpy()), dtype=torch.float64)))


def predicted_underflow_depth(grads32: LayerGradients, attenuation: float, fmt="float16",
                              which: str = "signal", floor: str = "zero") -> int | None:
    """The attenuation model's first-underflow depth, with g0 fitted to a float32 probe (fit_g0)."""
    return first_underflow_depth(attenuation, fmt, fit_g0(grads32, attenuation, which), floor)
