"""Gradient underflow by depth: the attenuation model, a network that realises it, per-layer health.

The attenuation model: if every layer multiplies the backward signal by a factor ``a < 1``, a
gradient entry of typical size ``g0`` at the last layer has typical size ``g0 · a^k`` at depth
``k`` (``k`` layers below the loss). Once that falls to half the format's smallest subnormal
``q/2``, round-to-nearest turns the typical entry into exactly zero and the layer stops
learning. `first_underflow_depth` solves for ``k`` exactly.

`AttenuatingNet` is a real deep network whose initialisation sets ``a``: affine layers
``h <- W h + b`` with ``W = a · Q`` (``Q`` random orthogonal, so every backward step multiplies
the gradient's norm by exactly ``a``) and biases of variance ``1 - a^2`` (so the forward signal
stays at unit scale at every depth). `probe_gradients` runs one backward pass in the network's
own dtype (float16, bfloat16 or float32) and returns per-layer statistics; `train_probe`
repeats that for a few SGD steps; `health_table`, `health_summary` and `diagnose` print what
a practitioner would look at.
"""

from __future__ import annotations

import math
import textwrap
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction

import numpy as np
import torch

from .checks import check_choice
from .checks import check_positive as _check_positive
from .formats import FloatFormat, get_format

__all__ = [
    "FLOORS",
    "NETWORK_FORMATS",
    "STATUSES",
    "AttenuatingNet",
    "Diagnosis",
    "GradientStats",
    "LayerGradients",
    "TrainingProbe",
    "diagnose",
    "first_underflow_depth",
    "fit_g0",
    "floor_value",
    "gradient_by_depth",
    "health_summary",
    "health_table",
    "layer_status",
    "make_batch",
    "measured_underflow_depth",
    "predicted_underflow_depth",
    "probe_gradients",
    "train_probe",
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
    a = _check_positive(attenuation, "attenuation")
    g = _check_positive(g0, "g0")
    if int(depth) != depth or depth < 1:
        raise ValueError(f"depth must be a positive integer; got depth={depth!r}")
    return g * np.power(a, np.arange(int(depth), dtype=np.float64))


def first_underflow_depth(attenuation: float, fmt="float16", g0: float = 1.0,
                          floor: str = "zero") -> int | None:
    """Smallest k >= 0 with g0 · a^k past the floor (<= q/2 for 'zero', < the value otherwise), or None.

    Exact: the float64 estimate k = log(T/g0)/log(a) is confirmed with rational arithmetic
    whenever it lies close to an integer. None means the gradient never gets there (a >= 1).
    """
    a = _check_positive(attenuation, "attenuation")
    g = _check_positive(g0, "g0")
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


def _torch_dtype(fmt) -> torch.dtype:
    f = get_format(fmt)
    if f.name not in NETWORK_FORMATS:
        raise ValueError(
            f"the network runs in {f.name!r} only as a model; valid choices for a real network: "
            f"{', '.join(NETWORK_FORMATS)}"
        )
    return f.torch_dtype


class AttenuatingNet(torch.nn.Module):
    """depth affine layers h <- W h + b, W = a·Q (Q orthogonal), b ~ N(0, 1 - a^2): backward gain a per layer."""

    def __init__(self, depth: int = 96, width: int = 64, attenuation: float = 0.82,
                 fmt="float32", seed: int = 0):
        super().__init__()
        a = _check_positive(attenuation, "attenuation")
        if int(depth) != depth or depth < 1:
            raise ValueError(f"depth must be a positive integer; got depth={depth!r}")
        if int(width) != width or width < 1:
            raise ValueError(f"width must be a positive integer; got width={width!r}")
        dtype = _torch_dtype(fmt)
        self.attenuation = a
        self.fmt = get_format(fmt).name
        gen = torch.Generator().manual_seed(int(seed))
        n, L = int(width), int(depth)
        # Bias variance 1 - a^2 keeps E|h|^2 at its input value for a < 1 (the stationary
        # point of v <- a^2 v + s^2); for a >= 1 no bias keeps it bounded, so use unit variance.
        bias_std = math.sqrt(1 - a * a) if a < 1 else 1.0
        # One batched QR for all layers (what nn.init.orthogonal_ does one matrix at a time):
        # Q·sign(diag R) is Haar-distributed. Built in float32, then rounded to the format, so
        # every format stores the same network.
        q, r = torch.linalg.qr(torch.randn(L, n, n, generator=gen))
        q = q * torch.sign(torch.diagonal(r, dim1=-2, dim2=-1)).unsqueeze(-2)
        biases = bias_std * torch.randn(L, n, generator=gen)
        layers = []
        for i in range(L):
            lin = torch.nn.Linear(n, n)
            with torch.no_grad():
                lin.weight.copy_(a * q[i])
                lin.bias.copy_(biases[i])
            layers.append(lin)
        self.layers = torch.nn.ModuleList(layers).to(dtype)

    @property
    def depth(self) -> int:
        """Number of layers."""
        return len(self.layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """h_{i+1} = W_i h_i + b_i for i = 0, ..., depth - 1."""
        for lin in self.layers:
            x = lin(x)
        return x


def make_batch(width: int = 64, batch: int = 16, fmt="float32", seed: int = 0):
    """(x, t): inputs and regression targets with i.i.d. N(0, 1) entries, rounded to fmt."""
    dtype = _torch_dtype(fmt)
    gen = torch.Generator().manual_seed(int(seed) + 10_000)  # independent of the weights' stream
    x = torch.randn(int(batch), int(width), generator=gen)
    t = torch.randn(int(batch), int(width), generator=gen)
    return x.to(dtype), t.to(dtype)


@dataclass(frozen=True)
class GradientStats:
    """Per-layer statistics of one kind of gradient; index k = depth below the loss (0 = last layer)."""

    norm: np.ndarray  # Euclidean norm over the layer's entries, accumulated in float64
    median_abs: np.ndarray  # median |entry|: the "typical" gradient entry
    max_abs: np.ndarray
    zero_fraction: np.ndarray  # fraction of entries that are exactly 0
    finite: np.ndarray  # bool: no inf/NaN in the layer's gradient

    @classmethod
    def of(cls, tensors: Sequence[torch.Tensor]) -> GradientStats:
        """Statistics of tensors listed from the input layer to the last (stored reversed, by depth)."""
        g = torch.stack([t.detach().to(torch.float64) for t in tensors[::-1]]).flatten(1).numpy()
        mag = np.abs(g)
        with np.errstate(invalid="ignore"):  # inf - inf inside the norm of an overflowed layer
            norm = np.sqrt(np.sum(mag * mag, axis=1))
        return cls(
            norm=norm,
            median_abs=np.median(mag, axis=1),  # partition-based; midpoint for even counts
            max_abs=mag.max(axis=1),
            zero_fraction=(g == 0).mean(axis=1),
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

    @property
    def depth(self) -> int:
        """Number of layers."""
        return len(self.weight.norm)

    def stats(self, which: str) -> GradientStats:
        """The 'weight' or 'signal' statistics."""
        if which not in ("weight", "signal"):
            raise ValueError(f"unknown gradient kind {which!r}; valid choices: weight, signal")
        return self.weight if which == "weight" else self.signal


def probe_gradients(net: AttenuatingNet, x: torch.Tensor, t: torch.Tensor,
                    loss_scale: float = 1.0) -> LayerGradients:
    """One pass of L = mean((net(x) - t)^2): network in its own dtype, L in float32 (as autocast
    computes losses); backward from S·L, statistics of the stored gradients divided by S in float64."""
    s = _check_positive(loss_scale, "loss_scale")
    net.zero_grad(set_to_none=True)
    outputs = []
    h = x
    for lin in net.layers:
        h = lin(h)
        h.retain_grad()  # keep dL/dh_k, the backward signal, as autograd stored it
        outputs.append(h)
    loss = torch.nn.functional.mse_loss(h.float(), t.float())
    (loss * s).backward()  # the gradient enters the network rounded to its dtype
    return LayerGradients(
        fmt=net.fmt,
        loss=float(loss.detach()),
        weight=GradientStats.of([lin.weight.grad.double() / s for lin in net.layers]),
        signal=GradientStats.of([o.grad.double() / s for o in outputs]),
    )


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


def train_probe(attenuation: float = 0.82, depth: int = 96, fmt="float16", steps: int = 10,
                lr: float = 0.1, width: int = 64, batch: int = 16, seed: int = 0) -> TrainingProbe:
    """Plain SGD, w <- w - lr·g with weights, activations and gradients all stored in fmt."""
    if int(steps) != steps or steps < 1:
        raise ValueError(f"steps must be a positive integer; got steps={steps!r}")
    lr = _check_positive(lr, "lr")
    net = AttenuatingNet(depth, width, attenuation, fmt, seed)
    x, t = make_batch(width, batch, fmt, seed)
    losses, records = [], []
    for _ in range(int(steps)):
        rec = probe_gradients(net, x, t)
        losses.append(rec.loss)
        records.append(rec)
        with torch.no_grad():
            for p in net.parameters():
                p.sub_(lr * p.grad)  # the update is rounded to fmt, like the weights
    return TrainingProbe(get_format(fmt).name, float(attenuation), np.array(losses), tuple(records))


def measured_underflow_depth(grads: LayerGradients, which: str = "signal",
                             fraction: float = 0.5) -> int | None:
    """First depth k whose gradient has at least `fraction` exact zeros (the typical entry is 0), or None."""
    if not 0 < fraction <= 1:
        raise ValueError(f"fraction must be in (0, 1]; got fraction={fraction!r}")
    hits = np.flatnonzero(grads.stats(which).zero_fraction >= fraction)
    return int(hits[0]) if hits.size else None


def fit_g0(grads32: LayerGradients, attenuation: float, which: str = "signal") -> float:
    """The model's intercept: g0 = exp(median_k(log m_k - k log a)), m_k = median |g| at depth k."""
    a = _check_positive(attenuation, "attenuation")
    med = grads32.stats(which).median_abs
    k = np.arange(med.size)
    ok = med > 0
    if not ok.any():
        raise ValueError("every layer's median gradient is 0; give a probe that did not underflow")
    # The median over depths of log m_k - k log a is robust to a few atypical layers.
    return float(np.exp(np.median(np.log(med[ok]) - k[ok] * math.log(a))))


def predicted_underflow_depth(grads32: LayerGradients, attenuation: float, fmt="float16",
                              which: str = "signal", floor: str = "zero") -> int | None:
    """The attenuation model's first-underflow depth, with g0 fitted to a float32 probe (fit_g0)."""
    return first_underflow_depth(attenuation, fmt, fit_g0(grads32, attenuation, which), floor)


# --------------------------------------------------------------------------- diagnosis


def layer_status(grads: LayerGradients, which: str = "weight", fmt=None) -> np.ndarray:
    """Per layer: non-finite (inf/NaN), zero (all 0), underflowing (>= half 0), subnormal (median < min normal), healthy."""
    f: FloatFormat = get_format(fmt if fmt is not None else grads.fmt)
    st = grads.stats(which)
    status = np.full(grads.depth, "healthy", dtype=object)
    status[st.median_abs < f.min_normal] = "subnormal"
    status[st.zero_fraction >= 0.5] = "underflowing"
    status[st.zero_fraction == 1] = "zero"
    status[~st.finite] = "non-finite"
    return status


def health_table(grads: LayerGradients, depths: Sequence[int] | None = None, fmt=None) -> str:
    """Per-layer text table of the weight gradients (norm, median, max, % zeros, status) and % zero signal."""
    status = layer_status(grads, "weight", fmt)
    w, sig = grads.weight, grads.signal
    n = grads.depth
    rows = range(n) if depths is None else depths
    lines = [f"{'depth':>5} {'layer':>5} {'|dL/dW|':>9} {'median':>9} {'max':>9} {'zeros':>6}"
             f" {'sig 0s':>6}  status"]
    for k in rows:
        if not 0 <= k < n:
            raise ValueError(f"depth {k!r} is outside 0..{n - 1}")
        lines.append(
            f"{k:>5} {n - 1 - k:>5} {w.norm[k]:>9.3g} {w.median_abs[k]:>9.3g}"
            f" {w.max_abs[k]:>9.3g} {w.zero_fraction[k]:>6.1%} {sig.zero_fraction[k]:>6.1%}"
            f"  {status[k]}"
        )
    return "\n".join(lines)


def health_summary(grads: LayerGradients, which: str = "weight", fmt=None) -> str:
    """Depth ranges by the worst status seen so far, from the loss downward, e.g. 'depth  0-26  healthy'.

    Underflow only gets worse with depth, but a layer near a threshold can flicker across it;
    carrying the worst status down keeps one line per stage. health_table shows every layer.
    """
    rank = {name: i for i, name in enumerate(STATUSES)}
    status = layer_status(grads, which, fmt)
    worst = np.maximum.accumulate([rank[x] for x in status])
    st = grads.stats(which)
    cuts = np.flatnonzero(worst[1:] != worst[:-1]) + 1
    starts = np.concatenate([[0], cuts])
    ends = np.concatenate([cuts, [grads.depth]]) - 1
    lines = []
    for s, e in zip(starts, ends, strict=True):
        zeros = st.zero_fraction[s:e + 1]
        lines.append(f"depth {s:>3}-{e:<3} {STATUSES[worst[s]]:<12} median "
                     f"{st.median_abs[s]:.2g} .. {st.median_abs[e]:.2g}, zeros "
                     f"{zeros.min():.0%} .. {zeros.max():.0%}")
    return "\n".join(lines)


@dataclass(frozen=True)
class Diagnosis:
    """What the numbers say: the likely cause, the evidence, what to check first, the cheapest fix."""

    cause: str  # "overflow", "underflow" or "none"
    evidence: str
    first_check: str
    first_fix: str

    def __str__(self) -> str:
        rows = [("likely cause", self.cause), ("evidence", self.evidence),
                ("first check", self.first_check), ("first fix", self.first_fix)]
        # Wrapped at 72 columns so that it reads in a notebook or a terminal without scrolling.
        return "\n".join(textwrap.fill(text, 72, initial_indent=f"{label:<13}: ",
                                        subsequent_indent=" " * 15) for label, text in rows)


def diagnose(losses: Sequence[float], grads: LayerGradients, fmt=None) -> Diagnosis:
    """Rules: inf/NaN in the loss or a gradient -> overflow; layers whose weight gradients are mostly
    exact zeros -> underflow; otherwise no precision problem visible in these numbers."""
    status = layer_status(grads, "weight", fmt)
    losses = np.asarray(losses, dtype=np.float64)
    bad_steps = int((~np.isfinite(losses)).sum())
    bad_layers = int((status == "non-finite").sum())
    if bad_steps or bad_layers:
        return Diagnosis(
            "overflow",
            f"loss non-finite at {bad_steps} of {losses.size} steps; {bad_layers} of "
            f"{grads.depth} layers have inf/NaN gradients",
            "the loss scaler's count of skipped steps; the first layer whose activations or "
            "gradients exceed the format's largest finite value",
            "a lower (initial) loss scale, or bfloat16, whose range matches float32",
        )
    dead = np.flatnonzero(np.isin(status, ("zero", "underflowing")))
    if dead.size:
        alive = f"depth 0 still has median |g| {grads.weight.median_abs[0]:.2g}" \
            if dead[0] > 0 else "every layer is affected"
        return Diagnosis(
            "underflow",
            f"{dead.size} of {grads.depth} layers (from depth {dead[0]}) have mostly exact-zero "
            f"weight gradients; {alive}",
            "per-layer gradient norms and fractions of exact zeros, next to the same step in "
            "float32",
            "dynamic loss scaling (a GradScaler), or bfloat16",
        )
    return Diagnosis("none", "all gradients finite; no layer is mostly exact zeros",
                     "a short run against float32 if the final quality is off",
                     "keep float32 master weights")
