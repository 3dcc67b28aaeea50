"""Chapter 9, scaling at finer grain, measured: what a quantizer keeps of the book's tensors,
and a run under it.

Chapter 9 puts the `quantize` recipes to work on tensors of the book:

* `network_signals`: the backward signals dL/dh of chapter 4's 96-layer network (float32,
  emulated), one tensor per depth; `quantize_layers` quantizes each under one quantizer and
  records its shares and SQNR; `SharedScale` is the "one global scale" quantizer (one
  float32 scale from the largest amax over all tensors, as one loss scale for a network);
* `outlier_activations` and `outlier_report`: activations whose few outlier channels are
  tens to hundreds of times larger than the rest, and what a recipe keeps of the ordinary
  channels (`share_beside_outliers` counts the ordinary values that share a block with an
  outlier); `block_sqnr` per group of channels, for the chapter's explorer;
* `outlier_regression` and `train_quantized`: a linear regression on such activations,
  trained with Adam through `emulate.QuantizedLinear`; `forward_input_runs`, the chapter's
  six runs, which scripts/ch9_forward_input.py stores (`save_quantized_runs`) and the
  chapter reads back (`load_quantized_runs`);
* `spike_stream` and `scaling_trace`: tensors whose size drifts down, with one spike, through
  delayed and current scaling, step by step.

Every number is portable: float64 sums by `emulate.fixed_sum`, normal samples by
`emulate.randn`, matrix products by `emulate`'s fixed-order kernels.

Chapter code (`precisionlab.chapters`): imports `quantize`, `emulate` and `underflow`.
"""

from __future__ import annotations

import json
import math
import numbers
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import numpy as np
import torch

from .. import emulate
from ..checks import check_choice, check_count, check_positive
from ..emulate.sqnr import energy, sqnr_db
from ..formats import get_format
from ..quantize import RECIPES, DelayedScaling, Quantized, Recipe
from ..quantize.choices import ELEMENT_FORMATS, check_format
from ..quantize.grid import block_shape
from ..underflow import AttenuatingNet, make_batch, pass_products

__all__ = [
    "FORWARD_INPUT_RUNS",
    "OUTLIER_CHANNELS",
    "LayerQuantization",
    "OutlierReport",
    "QuantizedRun",
    "ScalingTrace",
    "SharedScale",
    "block_sqnr",
    "forward_input_quantizer",
    "forward_input_runs",
    "least_squares_floor",
    "load_quantized_runs",
    "network_signals",
    "ordinary_sqnr",
    "outlier_activations",
    "outlier_regression",
    "outlier_report",
    "quantize_layers",
    "save_quantized_runs",
    "scaling_trace",
    "share_beside_outliers",
    "spike_stream",
    "trace_table_rows",
    "train_quantized",
]

OUTLIER_CHANNELS: tuple[int, ...] = (17, 90, 161, 230)  # one in each 64 channels of 256

Quantizer = Callable[[torch.Tensor], Quantized]


def block_sqnr(x: torch.Tensor, xhat: torch.Tensor, block: int,
               where: Sequence[int] = ()) -> np.ndarray:
    """SQNR in dB of each group of `block` consecutive channels, over its ordinary channels (not `where`)."""
    channels = x.shape[-1]
    block_shape((channels,), block)  # an integer that divides the channels, else ValueError
    keep = torch.ones(channels, dtype=torch.float64)
    keep[list(_channels(where, channels) if len(where) else ())] = 0
    x64 = x.to(torch.float64) * keep
    e = (x.to(torch.float64) - xhat.to(torch.float64)) * keep
    signal = emulate.fixed_sum(emulate.fixed_sum((x64 * x64).reshape(-1, channels // block,
                                                                      block), -1), 0)
    noise = emulate.fixed_sum(emulate.fixed_sum((e * e).reshape(-1, channels // block,
                                                                 block), -1), 0)
    s, n = signal.numpy(), noise.numpy()
    with np.errstate(divide="ignore"):
        return np.where(n > 0, 10 * np.log10(s / np.where(n > 0, n, 1)), np.inf)


@dataclass(frozen=True)
class SharedScale:
    """One float32 scale m = fl32(max_E / amax) for every tensor given (amax: the largest over all of them)."""

    elem: str
    amax: float

    def __post_init__(self) -> None:
        object.__setattr__(self, "elem", check_format(self.elem, "elem", ELEMENT_FORMATS).name)
        object.__setattr__(self, "amax", check_positive(self.amax, "amax"))

    @classmethod
    def over(cls, tensors: Sequence[torch.Tensor], elem="float8_e4m3fn") -> SharedScale:
        """The shared scale of all tensors: amax = max over every entry of every tensor."""
        return cls(elem, max(float(t.detach().abs().max()) for t in tensors))

    def __call__(self, x) -> Quantized:
        """q = fl_E(fl32(x m)), saturating at +-max_E (Transformer Engine's rule, this amax)."""
        held = DelayedScaling(self.elem, amax_history_len=1)
        held.update(self.amax)  # the scale the next call quantizes with
        return held(x)


def network_signals(attenuation: float = 0.82, depth: int = 96, width: int = 64,
                    batch: int = 16, *, seed: int = 0) -> torch.Tensor:
    """dL/dh_k of chapter 4's AttenuatingNet in float32 (emulated), stacked by depth k below the loss."""
    net = AttenuatingNet(depth, width, attenuation, "float32", seed)
    x, t = make_batch(width, batch, "float32", seed)
    outs, h = [], x
    with emulate.planned_products(pass_products(net, x)):  # one pass: NumPy's tier, no compile
        for lin in net.layers:
            h = lin(h)
            h.retain_grad()
            outs.append(h)
        emulate.mse_loss(h, t, "float32").backward()
    return torch.stack([o.grad.detach() for o in outs[::-1]])


@dataclass(frozen=True)
class LayerQuantization:
    """Per-layer (index = depth) shares of entries saturated, underflowed, subnormal, and SQNR in dB."""

    saturated: np.ndarray
    underflowed: np.ndarray
    subnormal: np.ndarray
    sqnr: np.ndarray

    def first_depth(self, share: float = 0.5) -> int | None:
        """The first layer with underflowed >= share, or None."""
        hit = np.flatnonzero(self.underflowed >= share)
        return int(hit[0]) if hit.size else None


def quantize_layers(tensors: Sequence[torch.Tensor], quantizer: Quantizer) -> LayerQuantization:
    """quantizer(t) for each tensor: its three shares and sqnr_db(t, dequantized)."""
    rows = []
    for t in tensors:
        q = quantizer(t)
        rows.append((q.saturated, q.underflowed, q.subnormal, sqnr_db(t, q.dequantize())))
    cols = np.array(rows, dtype=np.float64).reshape(-1, 4).T
    return LayerQuantization(*cols)


def _channels(where, channels: int) -> tuple[int, ...]:
    """The outlier channel indices, checked against the number of channels."""
    idx = tuple(int(c) for c in where)
    if not idx or len(set(idx)) != len(idx) or min(idx) < 0 or max(idx) >= channels:
        raise ValueError(f"where must list distinct channels in [0, {channels - 1}]; "
                         f"got where={tuple(where)!r}")
    return idx


def outlier_activations(tokens: int = 64, channels: int = 256, outlier: float = 100.0,
                        where: Sequence[int] = OUTLIER_CHANNELS, *, seed: int = 0) -> torch.Tensor:
    """x_tc ~ N(0, 1), multiplied by `outlier` in the channels `where`; float32, (tokens, channels)."""
    s = check_positive(outlier, "outlier")
    check_count(tokens, "tokens")
    check_count(channels, "channels")
    idx = _channels(where, channels)
    x = emulate.randn(tokens, channels, generator=torch.Generator().manual_seed(int(seed)),
                      dtype=torch.float64)
    x[:, list(idx)] *= s
    return x.to(torch.float32)


def share_beside_outliers(channels: int, where: Sequence[int], block: int | None) -> float:
    """Share of the ordinary channels whose block (`block` consecutive channels; None: all) holds an outlier."""
    idx = _channels(where, channels)
    if block is None:
        return 1.0
    if isinstance(block, bool) or not isinstance(block, numbers.Integral) or block < 1 \
            or channels % block:
        raise ValueError(f"block must be an integer >= 1 that divides channels={channels}; "
                         f"got block={block!r}")
    hit = {c // block for c in idx}
    beside = sum(1 for c in range(channels) if c // block in hit and c not in idx)
    return beside / (channels - len(idx))


@dataclass(frozen=True)
class OutlierReport:
    """What a quantizer kept: shares of all entries, SQNR (dB) of all and of the ordinary channels."""

    saturated: float
    underflowed: float
    sqnr: float
    sqnr_ordinary: float
    ordinary_lost: float  # share of the ordinary channels' nonzero entries that became 0


def _ordinary(x: torch.Tensor, xhat: torch.Tensor, where: Sequence[int]):
    """x and xhat without the outlier channels `where` (the last axis)."""
    keep = torch.ones(x.shape[-1], dtype=torch.bool)
    keep[list(_channels(where, x.shape[-1]))] = False
    return x[:, keep], xhat[:, keep]


def ordinary_sqnr(x: torch.Tensor, xhat: torch.Tensor, where: Sequence[int]) -> float:
    """sqnr_db of xhat against x over the ordinary channels (all but `where`): OutlierReport.sqnr_ordinary."""
    return sqnr_db(*_ordinary(x, xhat, where))


def outlier_report(x: torch.Tensor, where: Sequence[int], quantizer: Quantizer) -> OutlierReport:
    """quantizer(x) on activations whose channels `where` are outliers: shares and SQNR, all and ordinary."""
    _channels(where, x.shape[-1])
    q = quantizer(x)
    xhat = q.dequantize()
    xo, xho = _ordinary(x, xhat, where)
    lost = int(((xo != 0) & (xho == 0)).sum()) / max(int((xo != 0).sum()), 1)
    return OutlierReport(q.saturated, q.underflowed, sqnr_db(x, xhat), sqnr_db(xo, xho), lost)


def outlier_regression(tokens: int = 512, channels: int = 128, outputs: int = 16,
                       outlier: float = 100.0, where: Sequence[int] = (17, 90), *,
                       seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """(x, y): outlier_activations and targets y = x W*^T (emulated float32), W* ~ N(0, 1/C), 0 on `where`."""
    x = outlier_activations(tokens, channels, outlier, where, seed=seed)
    gen = torch.Generator().manual_seed(int(seed) + 10_000)  # apart from the inputs' stream
    w = emulate.randn(outputs, channels, generator=gen, dtype=torch.float64) / math.sqrt(channels)
    w[:, list(_channels(where, channels))] = 0  # the outlier channels carry no signal
    return x, emulate.linear(x, w.to(torch.float32), None, "float32").detach()


class QuantizedRun(NamedTuple):
    """A run of train_quantized: the loss per step over the loss of W = 0, and the final weights."""

    losses: np.ndarray
    weight: torch.Tensor


def train_quantized(x: torch.Tensor, y: torch.Tensor, x_quantizer: Quantizer | None,
                    grad_quantizer: Quantizer | None = None, *, steps: int = 120,
                    lr: float = 1e-2, w_quantizer: Quantizer | None = None) -> QuantizedRun:
    """Adam on L = mean((Q(x) W^T - y)^2), W_0 = 0, Q(x) computed once (a stateful Q runs once): L_t / mean(y^2) per step."""
    check_count(steps, "steps")
    # x is the same every step, so Q(x) is computed once, before the first step (a stateful
    # quantizer such as DelayedScaling is called once, with the scale it holds then).
    xq = x if x_quantizer is None else emulate.quantize_input(x, x_quantizer)
    lin = emulate.QuantizedLinear(torch.zeros(y.shape[-1], x.shape[-1]), None,
                                  w_quantizer=w_quantizer, grad_quantizer=grad_quantizer)
    opt = emulate.Adam(lin.parameters(), lr=check_positive(lr, "lr"))
    y0 = energy(y) / y.numel()  # the loss of W = 0
    losses = []
    for _ in range(int(steps)):
        opt.zero_grad()
        loss = emulate.mse_loss(lin(xq), y, "float32")
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()) / y0)
    return QuantizedRun(np.array(losses), lin.weight.detach().clone())


FORWARD_INPUT_RUNS: tuple[str, ...] = ("float32", "fp8_tensor", "mxfp8", "fp4_tensor", "mxfp4",
                                       "nvfp4")


def forward_input_quantizer(name: str) -> Quantizer | None:
    """The forward input's quantizer in run `name` of FORWARD_INPUT_RUNS: None for float32, a Recipe otherwise."""
    check_choice(name, "name", FORWARD_INPUT_RUNS)
    if name == "float32":
        return None
    if name == "fp4_tensor":  # E2M1 with one float32 scale per tensor (no registered recipe)
        return Recipe("fp4_tensor", "float4_e2m1fn", "tensor")
    return RECIPES[name]


def forward_input_runs(steps: int = 120, *, seed: int = 0) -> dict[str, QuantizedRun]:
    """Chapter 9's runs: `train_quantized` on outlier_regression(512, 128, 16, 100, (17, 90)), each run's x quantizer, dy per-tensor E5M2 (none in float32)."""
    x, y = outlier_regression(512, 128, 16, 100.0, (17, 90), seed=seed)
    grad = RECIPES["fp8_tensor_e5m2"]
    return {n: train_quantized(x, y, forward_input_quantizer(n),
                               None if n == "float32" else grad, steps=steps)
            for n in FORWARD_INPUT_RUNS}


def save_quantized_runs(path, runs: Mapping[str, QuantizedRun], meta: Mapping) -> None:
    """Write runs to `path` (.json: meta and the run names) and beside it an .npz of each run's losses and final weight, exact."""
    path = Path(path)
    np.savez_compressed(path.with_suffix(".npz"), **{
        f"{k}{i}": v for i, r in enumerate(runs.values())
        for k, v in (("losses", r.losses), ("weight", r.weight.numpy()))})
    doc = {**meta, "runs": list(runs), "arrays": path.with_suffix(".npz").name}
    path.write_text(json.dumps(doc, indent=1) + "\n")


def load_quantized_runs(path) -> tuple[dict, dict[str, QuantizedRun]]:
    """(meta, name -> QuantizedRun) from the .json (and its .npz) save_quantized_runs wrote."""
    path = Path(path)
    doc = json.loads(path.read_text())
    with np.load(path.parent / doc["arrays"]) as z:
        runs = {n: QuantizedRun(np.array(z[f"losses{i}"], dtype=np.float64),
                                torch.from_numpy(np.array(z[f"weight{i}"], dtype=np.float32)))
                for i, n in enumerate(doc["runs"])}
    return doc, runs


def least_squares_floor(xhat, y) -> float:
    """min_W mean((xhat W^T - y)^2) / mean(y^2): the lowest loss any W reaches on the inputs xhat (float64 SVD solve)."""
    a = np.asarray(torch.as_tensor(xhat).detach().to(torch.float64).numpy())
    b = np.asarray(torch.as_tensor(y).detach().to(torch.float64).numpy())
    if a.ndim != 2 or b.ndim != 2 or a.shape[0] != b.shape[0]:
        raise ValueError(f"need xhat (tokens, channels) and y (tokens, outputs) with the same "
                         f"tokens; got shapes {a.shape} and {b.shape}")
    # LAPACK's SVD solver (gelsd) handles the all-zero columns of a stalled quantizer; QR-based
    # solvers with a rank cut-off (torch's default gelsy) can return W = 0 there instead. torch
    # runs it under its own thread setting: NumPy's BLAS threads made the same solve 15-50
    # times slower on a busy two-core machine. The solve's last bits follow LAPACK's kernels
    # and torch's thread count (about 1e-15 relative here, 1 against 2 threads): quote the
    # floor to a few digits, never bit for bit.
    ta, tb = torch.from_numpy(a), torch.from_numpy(b)
    w = torch.linalg.lstsq(ta, tb, driver="gelsd").solution
    r = (ta @ w - tb).numpy()
    return float(np.square(r).sum() / np.square(b).sum())


def spike_stream(steps: int = 120, spike_at: int = 100, spike: float = 30.0,
                 shape: tuple[int, ...] = (32, 32), decay: float = 0.5, *,
                 seed: int = 0) -> torch.Tensor:
    """g_t = sigma_t z_t, z_t ~ N(0, 1): sigma_t falls geometrically from 1 to `decay`, times `spike` at step spike_at."""
    check_count(steps, "steps", 2)
    if isinstance(spike_at, bool) or not (isinstance(spike_at, numbers.Integral)
                                          and 0 <= spike_at < steps):
        raise ValueError(f"spike_at must be a step in [0, {steps - 1}]; got spike_at={spike_at!r}")
    sigma = np.geomspace(1.0, check_positive(decay, "decay"), int(steps))
    sigma[int(spike_at)] *= check_positive(spike, "spike")
    z = emulate.randn(int(steps), *shape, generator=torch.Generator().manual_seed(int(seed)),
                      dtype=torch.float64)
    view = torch.from_numpy(sigma).reshape(-1, *([1] * len(shape)))
    return (z * view).to(torch.float32)


@dataclass(frozen=True)
class ScalingTrace:
    """Per step: the tensor's amax, the amax its scale admits (max_E d), saturated and underflowed shares, SQNR."""

    amax: np.ndarray
    admitted: np.ndarray
    saturated: np.ndarray
    underflowed: np.ndarray
    sqnr: np.ndarray


def scaling_trace(stream: torch.Tensor, quantizer: Quantizer) -> ScalingTrace:
    """quantizer(g_t) for t = 0, 1, ... in order (a stateful one, such as DelayedScaling, keeps its history)."""
    rows = []
    for g in stream:
        q = quantizer(g)
        top = get_format(q.elem).max_finite * float(q.decode.max())
        rows.append((float(g.abs().max()), top, q.saturated, q.underflowed,
                     sqnr_db(g, q.dequantize())))
    return ScalingTrace(*np.array(rows, dtype=np.float64).T)


def trace_table_rows(traces: Mapping[str, ScalingTrace], steps: Sequence[int]) -> list[tuple]:
    """(step, amax, then admitted amax and saturated share of each trace) for the chosen steps."""
    first = next(iter(traces.values()))
    return [(k, first.amax[k], *(v for t in traces.values()
                                 for v in (t.admitted[k], t.saturated[k]))) for k in steps]
