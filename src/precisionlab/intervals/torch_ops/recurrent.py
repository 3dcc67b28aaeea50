"""Interval rules for torch's fused recurrent layers, torch.lstm, torch.gru, torch.rnn_tanh and
torch.rnn_relu (what nn.LSTM, nn.GRU and nn.RNN call), bounded by unrolling them: layer by layer,
direction by direction, time step by time step (kernel model: `rules`).

Each step is bounded from the boxes of its inputs, of the previous state and of the weights:

* the gates' pre-activations x W_ih^T + b_ih + h W_hh^T + b_hh: the exact range in midpoint-
  radius form (float64 products, their own slack counted), then an absolute error of
  gamma_(K+4)(u) sum |x_k w_k| over all K + 2 terms (any order, any split into partial sums in
  float32: torch's native cell adds the two products, oneDNN's fuses them; u float32's, or
  float64's for float64), plus 4 u_fmt sum |x_k w_k| for a float16/bfloat16 layer whose native
  cell rounds each product, its bias and their sum into the dtype, and K times float32's smallest
  normal (a kernel that flushes subnormals); on CUDA with torch.backends.cudnn.allow_tf32 (the
  default) a float32 layer's operands may be rounded to TF32 first: 2^-10 relative more per
  product (not measured here: no GPU in these tests);
* sigmoid, tanh and relu of those: the exact range at the ends, widened by 16 ulps of the
  internal format and 4 u absolute (oneDNN's and SLEEF's approximations are within a few ulps;
  results below the smallest normal may be flushed to 0), rounded outward into a float16/bfloat16
  dtype (the native cell stores them in it; a fused kernel keeping float32 is inside);
* LSTM: c' = f c + i g and h' = o tanh(c') (then h' W_hr^T with proj_size): the exact ranges,
  widened by 3 u' (|f c| + |i g|) and 2 u' |o tanh c'|, u' the dtype's unit roundoff for float16/
  bfloat16 (each product and sum rounded into it) or the internal format's; GRU: r, z from the
  summed pre-activations, n = tanh(x W_in^T + b_in + r (h W_hn^T + b_hn)) (the sum with r's
  product within 3 u' of its terms), h' = (1 - z) n + z h (torch computes n + z (h - n)): for z in
  [0, 1] the exact range from the ends of z (it is affine in z, increasing in n and h), within
  4 u' (|n| + |h|); RNN: h' = tanh (relu) of the pre-activation.

Bidirectional layers run the reversed sequence with their own weights and concatenate the two
outputs on the feature axis, as torch does. Dropout between layers in training mode is refused
(random), as are packed sequences (pack_padded_sequence: pass the padded batch). The interval
dependency between steps is not tracked (each step starts from boxes): bounds grow with the
sequence's length, soundly.
"""

from __future__ import annotations

import numpy as np
import torch

from ...formats import get_format
from ..interval import Interval
from ..outward import mul_box
from .arith import (
    ABS_SLACK,
    REL_SLACK,
    UnsupportedOperation,
    down,
    gamma,
    internal,
    is_tensor,
    mk,
    nan_where,
    reduced,
    round_into,
    u_out,
    up,
    whole,
    widen_abs,
    widen_rel,
)
from .products import TF32_OPERANDS

__all__ = ["RECURRENT_RULES", "layer_weights", "recurrent_bound"]

ACT_ULPS = 16.0  # sigmoid / tanh inside a fused recurrent kernel: ulps of the internal format
ACT_ABS = 4.0  # and this many u absolute
_GATES = {"lstm": 4, "gru": 3, "rnn_tanh": 1, "rnn_relu": 1}


class _Ctx:
    """The formats and units of one call; tf32: cuDNN may round the float32 products' operands
    to TF32 (torch.backends.cudnn.allow_tf32, on by default for CUDA tensors)."""

    def __init__(self, fmt: str, tf32: bool = False):
        self.fmt = fmt
        self.operand = TF32_OPERANDS if tf32 and fmt == "float32" else 0.0  # any direction
        self.inner = internal(fmt)
        f = get_format(self.inner)
        self.u, self.tiny = f.unit_roundoff, get_format("float32").min_normal
        self.uf = u_out(fmt)
        self.uop = max(self.u, self.uf)  # one elementwise rounding (into the dtype, if 16-bit)


def _mag(x: Interval) -> np.ndarray:
    return np.maximum(np.abs(x.lo), np.abs(x.hi))


def _rows(x: Interval, a: int, b: int) -> Interval:
    """Columns a:b (the last axis) of x."""
    return mk(x.lo[..., a:b], x.hi[..., a:b])


def _midrad(x: Interval, g64: float) -> tuple[np.ndarray, np.ndarray]:
    """(m, r) with [lo, hi] inside [m - r, m + r] (r rounded up generously), float64 NumPy."""
    with np.errstate(invalid="ignore", over="ignore"):
        m = x.lo / 2 + x.hi / 2
        return m, np.maximum(x.hi - m, m - x.lo) * (1 + 4 * g64)


def _weights(w: Interval):
    """A weight (G, K) as float64 arrays (mid^T, rad^T, (|mid| + rad)^T) for the products."""
    wm, wr = _midrad(w, gamma(8, 2.0**-53))
    return (np.ascontiguousarray(wm.T), np.ascontiguousarray(wr.T),
            np.ascontiguousarray(np.abs(wm).T + wr.T))


def _affine(terms: list, biases: list, ctx: _Ctx) -> Interval:
    """sum_k x_k W_k^T + sum_j b_j over boxes (terms: (x Interval (N, K), `_weights`)); the
    exact range widened by the kernel's accumulation error (module docstring)."""
    k_all = sum(w[0].shape[0] for _, w in terms) + len(biases)
    g64 = gamma(k_all + 8, 2.0**-53)
    center = rad = size = 0.0
    with np.errstate(invalid="ignore", over="ignore"):
        for x, (wm, wr, wa) in terms:
            xm, xr = _midrad(x, g64)
            xabs = np.abs(xm)
            center = center + xm @ wm
            rad = rad + xabs @ wr + xr @ wa
            size = size + (xabs + xr) @ wa
        for b in biases:
            bm, br = _midrad(b, g64)
            center, rad, size = center + bm, rad + br, size + np.abs(bm) + br
        err = ((gamma(k_all + 4, ctx.u) + 4 * ctx.uf + ctx.operand) * (1 + ctx.operand)
               * (1 + gamma(k_all + 4, ctx.u)) + 3 * g64)
        total = (rad + err * size + k_all * ctx.tiny) * (1 + 4 * g64)
        y = mk(down(center - total), up(center + total))
    return nan_where(y, ~np.isfinite(size) | np.isnan(total))


def _act(x: Interval, kind: str, ctx: _Ctx) -> Interval:
    """sigmoid / tanh / relu of the box inside a fused kernel (module docstring)."""
    if kind == "relu":
        y = mk(np.maximum(x.lo, 0.0), np.maximum(x.hi, 0.0))
        return nan_where(round_into(y, ctx.fmt) if reduced(ctx.fmt) else y, whole(x))
    fn = torch.sigmoid if kind == "sigmoid" else torch.tanh
    a, b = (fn(torch.from_numpy(np.ascontiguousarray(z))).numpy() for z in (x.lo, x.hi))
    with np.errstate(invalid="ignore"):
        y = mk(down(a - np.abs(a) * REL_SLACK - ABS_SLACK), up(b + np.abs(b) * REL_SLACK
                                                              + ABS_SLACK))
    y = widen_abs(widen_rel(y, ACT_ULPS, ctx.inner, ftz=True), ACT_ABS * ctx.u)
    if reduced(ctx.fmt):
        y = round_into(y, ctx.fmt)
    return nan_where(y, whole(x))


def _prod(a: Interval, b: Interval) -> tuple[Interval, np.ndarray]:
    lo, hi, nan = mul_box(a.lo, a.hi, b.lo, b.hi)
    return mk(np.where(nan, -np.inf, lo), np.where(nan, np.inf, hi)), nan


def _combo(pairs: list, plus: list, ops: int, ctx: _Ctx) -> Interval:
    """sum a_i b_i + sum p_j (exact range) within ops u' of sum |a_i b_i| + sum |p_j|."""
    lo = hi = mag = 0.0
    bad = False
    for a, b in pairs:
        p, nan = _prod(a, b)
        lo, hi, mag, bad = lo + p.lo, hi + p.hi, mag + _mag(a) * _mag(b), bad | nan
    for p in plus:
        lo, hi, mag = lo + p.lo, hi + p.hi, mag + _mag(p)
    with np.errstate(invalid="ignore", over="ignore"):
        r = ops * ctx.uop * mag * (1 + 2.0**-40) + ops * ctx.tiny
        y = mk(down(lo - r), up(hi + r))
    y = nan_where(y, bad | np.isnan(r) | np.isnan(y.lo) | np.isnan(y.hi))
    return round_into(y, ctx.fmt) if reduced(ctx.fmt) else y


def _interp(z: Interval, n: Interval, h: Interval, ctx: _Ctx) -> Interval:
    """(1 - z) n + z h within 4 u' (|n| + |h|): for z in [0, 1], the ends of z at the ends of n
    and h (increasing in both, affine in z); elsewhere interval arithmetic."""
    with np.errstate(invalid="ignore", over="ignore"):
        lo = np.minimum((1 - z.lo) * n.lo + z.lo * h.lo, (1 - z.hi) * n.lo + z.hi * h.lo)
        hi = np.maximum((1 - z.lo) * n.hi + z.lo * h.hi, (1 - z.hi) * n.hi + z.hi * h.hi)
        # four roundings of float64 (1 - z, two products, a sum): relative 2^-50 of the terms
        slack = 2.0**-50 * (_mag(n) + _mag(h)) + ABS_SLACK
        lo, hi = down(lo - slack), up(hi + slack)
    inside = (z.lo >= 0) & (z.hi <= 1)
    if not inside.all():
        one_minus = mk(down(1 - z.hi), up(1 - z.lo))
        a, na = _prod(one_minus, n)
        b, nb = _prod(z, h)
        with np.errstate(invalid="ignore"):
            lo = np.where(inside, lo, down(a.lo + b.lo))
            hi = np.where(inside, hi, up(a.hi + b.hi))
        lo, hi = np.where(na | nb, -np.inf, lo), np.where(na | nb, np.inf, hi)
    with np.errstate(invalid="ignore", over="ignore"):
        r = 4 * ctx.uop * (_mag(n) + _mag(h)) * (1 + 2.0**-40) + 4 * ctx.tiny
        y = mk(down(lo - r), up(hi + r))
    y = nan_where(y, np.isnan(y.lo) | np.isnan(y.hi) | whole(n) | whole(h) | whole(z))
    return round_into(y, ctx.fmt) if reduced(ctx.fmt) else y


def _step(kind: str, x: Interval, h: Interval, c: Interval | None, w: dict, ctx: _Ctx):
    """One time step of one direction of one layer: (h', c') (c' None but for LSTM)."""
    hid = w["hh"][0].shape[0] if "hr" not in w else w["hr"][0].shape[1]
    if kind in ("lstm", "rnn_tanh", "rnn_relu"):
        pre = _affine([(x, w["ih"]), (h, w["hh"])], w["b"], ctx)
        if kind != "lstm":
            return _act(pre, "tanh" if kind == "rnn_tanh" else "relu", ctx), None
        cell = c.shape[-1]
        i, f, g, o = (_rows(pre, j * cell, (j + 1) * cell) for j in range(4))
        i, f, o = (_act(z, "sigmoid", ctx) for z in (i, f, o))
        g = _act(g, "tanh", ctx)
        c2 = _combo([(f, c), (i, g)], [], 3, ctx)
        h2 = _combo([(o, _act(c2, "tanh", ctx))], [], 2, ctx)
        if "hr" in w:
            h2 = _affine([(h2, w["hr"])], [], ctx)
            if reduced(ctx.fmt):
                h2 = round_into(h2, ctx.fmt)
        return h2, c2
    # GRU: gates r, z, n
    ih, hh = w["ih"], w["hh"]

    def part(wt, a, b):  # rows a:b of W, columns of the transposed arrays
        return tuple(t[:, a:b] for t in wt)
    bias = w["b"]
    rz = _affine([(x, part(ih, 0, 2 * hid)), (h, part(hh, 0, 2 * hid))],
                 [_rows(b, 0, 2 * hid) for b in bias], ctx)
    r, z = (_act(_rows(rz, j * hid, (j + 1) * hid), "sigmoid", ctx) for j in range(2))
    gi = _affine([(x, part(ih, 2 * hid, 3 * hid))], [_rows(b, 2 * hid, 3 * hid)
                                                     for b in bias[:1]], ctx)
    gh = _affine([(h, part(hh, 2 * hid, 3 * hid))], [_rows(b, 2 * hid, 3 * hid)
                                                     for b in bias[1:]], ctx)
    if reduced(ctx.fmt):
        gi, gh = round_into(gi, ctx.fmt), round_into(gh, ctx.fmt)
    n = _act(_combo([(r, gh)], [gi], 3, ctx), "tanh", ctx)
    return _interp(z, n, h, ctx), None


def layer_weights(params: list, get, has_bias: bool, kind: str, layers: int, dirs: int) -> list:
    """The weights of torch.<kind>'s flat parameter list, per layer and direction, in the form
    `recurrent_bound` takes.

    Parameters
    ----------
    params : list of torch.Tensor
        The flat weights (nn.LSTM's _flat_weights): per layer and direction w_ih, w_hh, then
        b_ih, b_hh when has_bias, then w_hr for an LSTM with proj_size.
    get : callable
        Tensor -> its bound (Interval).
    has_bias : bool
        Whether the layer has biases.
    kind : str
        "lstm", "gru", "rnn_tanh" or "rnn_relu".
    layers, dirs : int
        The number of layers and of directions (1 or 2).

    Returns
    -------
    list of dict
        {"ih", "hh", and "hr" with projections: the weights as products take them, "b": the
        bias bounds}, one per layer and direction.
    """
    per = len(params) // (layers * dirs)
    proj = kind == "lstm" and per == (5 if has_bias else 3)
    if per * layers * dirs != len(params) or per not in ((4, 5) if has_bias else (2, 3)):
        raise UnsupportedOperation(
            f"triage expected {'4' if has_bias else '2'} weights per layer and direction of "
            f"torch.{kind}; got {len(params)} for {layers} layers and {dirs} directions")
    out = []
    for j in range(layers * dirs):
        ps = [get(t) for t in params[j * per:(j + 1) * per]]
        w = {"ih": _weights(ps[0]), "hh": _weights(ps[1]),
             "b": [mk(b.lo[None], b.hi[None]) for b in ps[2:4]] if has_bias else []}
        if proj:
            w["hr"] = _weights(ps[-1])
        out.append(w)
    return out


def recurrent_bound(kind: str, x: Interval, h0: Interval, c0: Interval | None, weights: list,
                    layers: int, bidirectional: bool, batch_first: bool, fmt: str,
                    tf32: bool = False) -> list:
    """The bounds of torch.<kind>'s outputs (output, h_n and, for LSTM, c_n) by unrolling.

    Parameters
    ----------
    kind : str
        "lstm", "gru", "rnn_tanh" or "rnn_relu".
    x : Interval
        The input's bound, (L, N, I), or (N, L, I) when batch_first.
    h0, c0 : Interval, Interval or None
        The initial states' bounds, (layers * directions, N, H); c0 only for LSTM.
    weights : list
        Per layer and direction, the weights as `layer_weights` gives them.
    layers : int
        The number of stacked layers.
    bidirectional : bool
        Whether each layer also runs the reversed sequence.
    batch_first : bool
        Whether x and the output are (N, L, features).
    fmt : str
        The results' format.
    tf32 : bool, default False
        Whether a float32 layer's products may round their operands to TF32 (cuDNN).

    Returns
    -------
    list of Interval
        The output's bound, then h_n's (and c_n's).
    """
    ctx = _Ctx(fmt, tf32)
    if batch_first:
        x = mk(np.swapaxes(x.lo, 0, 1), np.swapaxes(x.hi, 0, 1))
    dirs = 2 if bidirectional else 1
    steps = x.shape[0]
    hn, cn = [], []
    seq = [mk(x.lo[t], x.hi[t]) for t in range(steps)]
    for layer in range(layers):
        outs = []
        for d in range(dirs):
            j = layer * dirs + d
            w = weights[j]
            h = mk(h0.lo[j], h0.hi[j])
            c = None if c0 is None else mk(c0.lo[j], c0.hi[j])
            got = [None] * steps
            for t in (range(steps - 1, -1, -1) if d else range(steps)):
                h, c = _step(kind, seq[t], h, c, w, ctx)
                got[t] = h
            hn.append(h)
            cn.append(c)
            outs.append(got)
        seq = [outs[0][t] if dirs == 1 else mk(np.concatenate([outs[0][t].lo, outs[1][t].lo], -1),
                                               np.concatenate([outs[0][t].hi, outs[1][t].hi], -1))
               for t in range(steps)]
    lo = np.stack([s.lo for s in seq]) if steps else np.zeros((0, *h0.shape[1:]))
    hi = np.stack([s.hi for s in seq]) if steps else np.zeros((0, *h0.shape[1:]))
    if batch_first:
        lo, hi = np.swapaxes(lo, 0, 1), np.swapaxes(hi, 0, 1)
    res = [mk(lo, hi), mk(np.stack([h.lo for h in hn]), np.stack([h.hi for h in hn]))]
    if kind == "lstm":
        res.append(mk(np.stack([c.lo for c in cn]), np.stack([c.hi for c in cn])))
    return [round_into(r, fmt) for r in res]


def _rule(kind: str):
    def rule(rec, get, fmt):
        a = rec.args
        packed = is_tensor(a[1]) if kind == "lstm" else (len(a) > 2 and is_tensor(a[2]))
        if packed:
            raise UnsupportedOperation(
                f"triage cannot bound torch.{kind} on a packed sequence (pack_padded_sequence): "
                "run the layer on the padded batch instead (its outputs past each sequence's "
                "end are then computed but can be ignored)")
        if len(a) < 9:
            raise UnsupportedOperation(f"triage expected torch.{kind}(input, hx, params, "
                                       "has_biases, num_layers, dropout, train, bidirectional, "
                                       f"batch_first); got {len(a)} arguments")
        x, hx, params, has_bias, layers, dropout, train, bidir, batch_first = a[:9]
        if train and float(dropout) > 0 and int(layers) > 1:
            raise UnsupportedOperation(
                f"triage cannot bound torch.{kind}'s dropout between layers in training mode: "
                "it draws a random mask; call model.eval() (or set dropout=0) first")
        xb = get(x)
        if xb.ndim != 3:
            raise UnsupportedOperation(f"triage bounds torch.{kind} of a batched input (3 axes); "
                                       f"got shape {xb.shape}")
        if kind == "lstm":
            h0, c0 = get(hx[0]), get(hx[1])
        else:
            h0, c0 = get(hx), None
        dirs = 2 if bidir else 1
        ws = layer_weights(list(params), get, bool(has_bias), kind, int(layers), dirs)
        tf32 = x.device.type == "cuda" and bool(torch.backends.cudnn.allow_tf32)
        return recurrent_bound(kind, xb, h0, c0, ws, int(layers), bool(bidir),
                               bool(batch_first), fmt, tf32)
    return rule


RECURRENT_RULES = {k: _rule(k) for k in _GATES}
