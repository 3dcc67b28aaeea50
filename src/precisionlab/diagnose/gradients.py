"""Will this model train in float16 or bfloat16? One float32 forward and backward, every gradient
tensor reduced to counts as it is produced.

Per parameter tensor (and, with ``activations=True``, per gradient of every leaf module's
output): how many entries a cast to each format would flush to zero, leave subnormal, or
overflow, at the loss scale in force; the range of power-of-two loss scales that lifts all but
a `tail` share of the nonzero entries above float16's normal floor without any overflow; and,
for an optimizer step of size `lr`, how many weights stored in bfloat16 would not move at all
(chapter 1's rule, `updates.swallowed`). The symptom -> cause -> fix table of the underflow
tutorial comes out filled in for the model. With ``recipe=`` (a `quantize.Recipe` or a preset
name such as "mxfp8" or "nvfp4"), each gradient tensor is also quantized under that recipe:
the shares saturated, underflowed to zero and left subnormal, and the SQNR in dB (computed
and tabulated in `recipe_shares`). The per-tensor counts and the report over them,
`TensorGradients` and `GradientReport`, are in `gradient_report`.

A value x rounds (to nearest, ties to even) to zero in a format iff |x| <= q/2 (q the smallest
subnormal), to a subnormal iff q/2 < |x| < n - q/2 (n the smallest normal), and to infinity iff
|x| >= M + ulp(M)/2 (M the largest finite value). Counting is a comparison with these
constants per tensor: no loop over entries.
"""

from __future__ import annotations

import copy
import functools
import math
from collections.abc import Callable, Sequence

import numpy as np
import torch

from ..checks import check_choice
from ..formats import FloatFormat, get_format
from ..updates import swallowed as update_swallowed
from .batch import as_inputs, call, for_program, tensors
from .gradient_report import (
    EXP_BINS,
    EXP_OFFSET,
    GradientReport,
    TensorGradients,
    cast_thresholds,
    loss_scale_range,
)
from .recipe_shares import RecipeShares, as_recipes, recipe_shares
from .report import check_module, check_scalar_loss

__all__ = ["GradientReport", "RecipeShares", "TensorGradients", "cast_thresholds", "gradients",
           "recipe_shares"]

_OPTIMIZERS = ("sgd", "adam")
_ADAM_EPS = 1e-8  # torch.optim.Adam's default eps


def count_torch(g: torch.Tensor, scale: float, formats: Sequence[FloatFormat]):
    """(nonzero, nonfinite, max, min nonzero, flushed, subnormal, overflow, exponent counts,
    near-top counts) of scale*g, in float64 torch operations (any dtype and device)."""
    a = g.detach().abs().to(torch.float64).reshape(-1) * scale  # exact: scale is a power of two
    finite = torch.isfinite(a)
    nz = a != 0
    nonzero = int(nz.sum())
    nonfinite = int((~finite).sum())
    fin_nz = finite & nz
    vals = a[fin_nz]
    mx = float(a[finite].max()) / scale if bool(finite.any()) else math.inf
    mn = float(vals.min()) / scale if vals.numel() else math.inf
    flushed, subnormal, overflow, near_top = {}, {}, {}, {}
    m, e = torch.frexp(vals / scale)
    bins = (e.to(torch.int64) + EXP_OFFSET).clamp(0, EXP_BINS - 1)
    tops = [math.frexp(cast_thresholds(f)[2])[0] for f in formats]
    near = m >= min(tops)  # mantissas within a few ulps of 1: a small subset, kept once
    m_near, bins_near = m[near], bins[near]
    for f, m_t in zip(formats, tops, strict=True):
        z, s, o = cast_thresholds(f)
        flushed[f.name] = int((vals <= z).sum())
        subnormal[f.name] = int(((vals > z) & (vals < s)).sum())
        overflow[f.name] = int((a >= o).sum())  # inf counts; NaN compares False
        near_top[f.name] = torch.bincount(bins_near[m_near >= m_t],
                                          minlength=EXP_BINS).cpu().numpy()
    hist = torch.bincount(bins, minlength=EXP_BINS).cpu().numpy()
    return nonzero, nonfinite, mx, mn, flushed, subnormal, overflow, hist, near_top


_INF_BITS = 0x7F800000  # float32 +inf; finite |x| have smaller bit patterns, NaN larger
_BATCH = 1 << 16  # float32 tensors smaller than this are counted together, in one call


def _count_loop(bits, offs, zb, sb, ob, ft, counts, ext, hist, near):
    """One pass over float32 bit patterns (int32), tensor t = bits[offs[t]:offs[t+1]]: counts[t]
    = nonzero, nonfinite, then per format flushed (|x| bits <= zb), subnormal (<= sb),
    overflow (>= ob, inf included, NaN not); ext[t] = the largest finite and the smallest
    nonzero finite |x| bits; hist[t] the frexp exponents E + offset of the finite nonzero |x|,
    near[t, k] those whose frexp mantissa field (normalized, 23 bits) is >= ft[k]."""
    nf = zb.size
    quiet_f = ft.min()
    c = np.zeros(3 * nf, dtype=np.int64)  # <= zb, <= sb, >= ob among the finite nonzero
    for t in range(offs.size - 1):
        mx, mn = -1, _INF_BITS
        c[:] = 0
        zeros = nonfinite = 0
        h = hist[t]
        for i in range(offs[t], offs[t + 1]):
            a = bits[i] & 0x7FFFFFFF
            if a == 0:
                zeros += 1
                continue
            if a >= _INF_BITS:
                nonfinite += 1
                if a == _INF_BITS:
                    for k in range(nf):
                        counts[t, 2 + 2 * nf + k] += 1
                continue
            if a > mx:
                mx = a
            if a < mn:
                mn = a
            f = a & 0x7FFFFF
            if a >= 0x800000:
                j = (a >> 23) - 126 + EXP_OFFSET
            else:  # a subnormal: f = 2^(L-1) + ..., frexp exponent L - 149
                n = 0
                while (f >> n) != 0:
                    n += 1
                j = n - 149 + EXP_OFFSET
                f = (f << (24 - n)) & 0x7FFFFF
            h[j] += 1
            for k in range(nf):  # branch-free: a gradient's entries straddle the thresholds
                c[k] += a <= zb[k]
                c[nf + k] += a <= sb[k]
                c[2 * nf + k] += a >= ob[k]
            if f >= quiet_f:  # rare: mantissas within a few ulps of 2
                for k in range(nf):
                    if f >= ft[k]:
                        near[t, k, j] += 1
        n_all = offs[t + 1] - offs[t]
        counts[t, 0], counts[t, 1] = n_all - zeros, nonfinite
        for k in range(nf):
            counts[t, 2 + k] += c[k]
            counts[t, 2 + nf + k] += c[nf + k] - c[k]
            counts[t, 2 + 2 * nf + k] += c[2 * nf + k]
        if zeros and mx < 0:
            mx = 0
        ext[t, 0], ext[t, 1] = mx, mn


@functools.cache
def _count_kernel():
    """_count_loop compiled by numba (or loaded from its on-disk cache) on first use."""
    import numba  # imported only when a CPU float32 gradient is counted

    return numba.njit(cache=True)(_count_loop)


def _f32(x: float, toward: float) -> np.float32:
    """The float32 nearest x in the direction of toward that does not pass x: x rounded down
    (toward=0) or up (toward=inf) to float32, exactly."""
    with np.errstate(over="ignore"):
        f = np.float32(x)
    if (toward < x and float(f) > x) or (toward > x and float(f) < x):
        f = np.nextafter(f, np.float32(toward))
    return f


def _bits(f: np.float32) -> int:
    return int(np.asarray(f, dtype=np.float32).view(np.int32))


def _thresholds(scale: float, formats: Sequence[FloatFormat]):
    """Per format the int32 patterns of float32 |g| with |g| scale <= q/2 (zb), < n - q/2 (sb),
    >= M + ulp(M)/2 (ob), and the least 23-bit field of a frexp mantissa >= that of the
    overflow threshold (ft): comparisons of float32 values with float64 constants, exactly."""
    zb, sb, ob, ft = [], [], [], []
    for f in formats:
        z, s, o = (c / scale for c in cast_thresholds(f))  # exact: scale is a power of two
        zb.append(_bits(_f32(z, 0.0)))
        lo = _f32(s, 0.0)  # the largest float32 below s
        sb.append(_bits(np.nextafter(lo, np.float32(0)) if float(lo) == s else lo))
        ob.append(_bits(_f32(o, math.inf)))
        m_t = math.frexp(cast_thresholds(f)[2])[0]
        ft.append(math.ceil((2 * m_t - 1) * 2.0**23))
    return [np.array(v, dtype=np.int64) for v in (zb, sb, ob, ft)]


def count_compiled(gs: Sequence[torch.Tensor], scale: float, formats: Sequence[FloatFormat]):
    """`count_torch`'s tuple for each float32 CPU tensor of gs, from one compiled pass over
    their bit patterns (the small ones concatenated into one call): the same counts."""
    zb, sb, ob, ft = _thresholds(scale, formats)
    nf = len(formats)
    kernel = _count_kernel()
    flat = [g.detach().reshape(-1) for g in gs]
    groups = [[i] for i, g in enumerate(flat) if g.numel() >= _BATCH]
    small = [i for i, g in enumerate(flat) if g.numel() < _BATCH]
    if small:
        groups.append(small)
    out = [None] * len(gs)
    for grp in groups:
        x = flat[grp[0]] if len(grp) == 1 else torch.cat([flat[i] for i in grp])
        bits = x.contiguous().view(torch.int32).numpy()
        offs = np.zeros(len(grp) + 1, dtype=np.int64)
        offs[1:] = np.cumsum([flat[i].numel() for i in grp])
        counts = np.zeros((len(grp), 2 + 3 * nf), dtype=np.int64)
        ext = np.zeros((len(grp), 2), dtype=np.int64)
        hist = np.zeros((len(grp), EXP_BINS), dtype=np.int64)
        near = np.zeros((len(grp), nf, EXP_BINS), dtype=np.int64)
        kernel(bits, offs, zb, sb, ob, ft, counts, ext, hist, near)
        for r, i in enumerate(grp):
            c = counts[r]
            mx, mn = (math.inf if b in (-1, _INF_BITS) else
                      float(np.array(b, dtype=np.int32).view(np.float32)) for b in ext[r])
            names = [f.name for f in formats]
            out[i] = (int(c[0]), int(c[1]), mx, mn,
                      {n: int(c[2 + k]) for k, n in enumerate(names)},
                      {n: int(c[2 + nf + k]) for k, n in enumerate(names)},
                      {n: int(c[2 + 2 * nf + k]) for k, n in enumerate(names)},
                      hist[r].copy(), {n: near[r, k].copy() for k, n in enumerate(names)})
    return out


# Fewer float32 entries than this in one call are cheaper to count in torch (`count_torch`)
# than to compile the numba pass from a cold cache (a second or more); the same counts.
COMPILED_MIN = 1 << 22


def _count_all(gs: Sequence[torch.Tensor], scale: float, formats: Sequence[FloatFormat]):
    """The counts of each tensor: compiled for float32 tensors on the CPU when they hold
    COMPILED_MIN entries or more together, else `count_torch`."""
    fast = [i for i, g in enumerate(gs) if g.dtype == torch.float32 and g.device.type == "cpu"]
    if sum(gs[i].numel() for i in fast) < COMPILED_MIN:
        fast = []
    out = [None] * len(gs)
    for i, c in zip(fast, count_compiled([gs[i] for i in fast], scale, formats) if fast else [],
                    strict=True):
        out[i] = c
    for i, g in enumerate(gs):
        if out[i] is None:
            out[i] = count_torch(g, scale, formats)
    return out


def _swallowed(w: np.ndarray, step: np.ndarray) -> int:
    """Weights whose bfloat16 copy w + step rounds back to w (`updates.swallowed`, which
    rounds on NumPy below its own size threshold: no numba compile from a cold cache)."""
    return int(np.count_nonzero(update_swallowed(w, step, "bfloat16")))


def _stats(name, kind, g, counts, w=None, lr=None, optimizer="sgd",
           recipes=()) -> TensorGradients:
    """One tensor's TensorGradients from its counts (`count_torch`'s tuple)."""
    nonzero, nonfinite, mx, mn, fl, sub, ov, hist, top = counts
    swallowed = updated = 0
    if w is not None and lr is not None:
        gd = g.detach().to(torch.float64).reshape(-1).cpu()
        # Adam's first step: the bias-corrected moments are g and g^2, so the step is
        # lr g / (|g| + eps) with torch's eps = 1e-8: lr sign(g) unless |g| is near eps
        step = -lr * (gd if optimizer == "sgd" else gd / (gd.abs() + _ADAM_EPS))
        keep = (step != 0) & torch.isfinite(step)
        wb = w.detach().to(torch.bfloat16).to(torch.float64).reshape(-1).cpu()[keep]
        updated = int(keep.sum())
        if updated:
            swallowed = _swallowed(wb.numpy(), step[keep].numpy())
    return TensorGradients(name, kind, tuple(g.shape), g.numel(), nonzero, nonfinite, mx, mn,
                           fl, sub, ov, hist, swallowed, updated,
                           recipe_shares(g, recipes) if recipes else {}, top)


_LOW = (torch.float16, torch.bfloat16)  # parameter dtypes the backward does not run in


def gradients(model, loss_fn: Callable, batch, formats: Sequence[str] = ("float16", "bfloat16"),
              scale: float = 1.0, lr: float | None = None, optimizer: str = "sgd",
              tail: float = 1e-3, activations: bool = False, recipe=None,
              cast_inputs: bool = False, forward: bool = True) -> GradientReport:
    """Gradient counts of loss_fn(model(*batch)) after one float32 backward: per tensor and format,
    entries with |scale g| <= q/2 (flushed), < n - q/2 (subnormal), >= M + ulp(M)/2 (overflow).

    loss_fn(output) returns a scalar; batch is a tensor, a tuple or a dict (keywords) of model inputs. scale: a
    power-of-two loss scale the shares are counted at. lr: a step size; the report then counts
    the weights whose bfloat16 copy would not move under w - lr g ("sgd") or Adam's first
    step w - lr g / (|g| + 1e-8) ("adam"). tail: the share of nonzero parameter
    gradients allowed to stay below the normal floor when the loss-scale range is chosen; its
    top keeps every parameter gradient (and, with activations=True, every leaf module's output
    gradient) below the overflow threshold. recipe: a `quantize.Recipe`, a preset name
    (`quantize.RECIPES`: "fp8_tensor", "mxfp8", "nvfp4", ...) or a sequence of them; each
    gradient tensor g (unscaled) is then quantized under it and the report gives per tensor
    the shares saturated / underflowed to zero / subnormal and the SQNR
    10 log10(sum g^2 / sum (g - deq)^2) dB; a tensor the recipe's block does not divide (or
    with inf/NaN entries) is marked with the reason, never padded. The model's own .grad are
    restored. forward: also count the values of the same forward, every leaf module's output,
    against each format's range (`GradientReport.forward`): a float32 value past float16's
    65504 is an inf in a float16 forward.

    What one call tells: for this batch and these weights (one step), which gradients and
    leaf-module outputs a cast to each format would flush, leave subnormal or overflow. It
    does not run the model in the format (its rounding on the way is not modelled), sees
    values inside a module's own code (attention scores of a written-out attention) only
    through the module's output, and says nothing of later steps, where weights and
    activations grow; `watch` follows a run.

    Parameters
    ----------
    model : torch.nn.Module
        The model, with at least one parameter that requires grad. It runs once as it is
        (its dtype and mode are not changed) when its floating parameters are float32 or
        wider; a model with float16 or bfloat16 parameters runs as a float32 copy (its
        float16/bfloat16 inputs cast up, exactly), so that the counts are those of float32
        gradients, which is what the shares predict a cast from; the summary says so.
    loss_fn : callable
        loss_fn(model(*batch)) -> a scalar floating-point tensor that depends on the
        parameters.
    batch : torch.Tensor, tuple or dict
        The model's input: a tensor, a non-empty tuple or list of positional inputs, or a
        dict of keyword inputs (a tokenizer's input_ids and attention_mask), passed as
        model(**batch); loss_fn gets what the model returns (a ModelOutput as it is).
    formats : sequence of str
        The formats to count casts into, each one with infinities ("float16", "bfloat16",
        "float8_e5m2", "float32", ...). Default: ("float16", "bfloat16").
    scale : float, default 1.0
        A power-of-two loss scale (1, 1024, 65536, ...) the shares are counted at.
    lr : float or None, default None
        A step size > 0: also count the weights whose bfloat16 copy would not move.
    optimizer : {"sgd", "adam"}, default "sgd"
        The step lr is taken with: w - lr g, or Adam's first step w - lr g / (|g| + 1e-8).
    tail : float, default 1e-3
        The share, in [0, 1), of nonzero parameter gradients allowed to stay below the
        normal floor when the loss-scale range is chosen.
    activations : bool, default False
        Also count the gradient of every leaf module's output.
    forward : bool, default True
        Also count every leaf module's output in the forward (unscaled): overflow and
        headroom per format, in `GradientReport.forward`, `forward_table`, the summary and
        the fix table.
    recipe : str or Recipe or sequence or None, default None
        A scaling recipe ("fp8_tensor", "mxfp8", "nvfp4", ... from `quantize.RECIPES`, or a
        `quantize.Recipe`) or a sequence of them with distinct names: also quantize each
        gradient tensor under it.
    cast_inputs : bool, default False
        Cast the batch's floating tensors (images, inputs_embeds) to the model's parameter
        dtype first, as the model would be fed them (integer ids and masks are never cast).

    Returns
    -------
    GradientReport
        Per tensor the counts (`GradientReport.tensors`), the loss-scale range per format
        (`scale_range`), the shares, and the symptom -> cause -> fix table (`fixes`).

    Raises
    ------
    ValueError
        If model is not a Module with trainable parameters, batch is not a tensor, a
        tuple or a dict, loss_fn is not callable or returns no scalar loss that depends on the
        parameters, formats is empty or names a format without infinities, scale is not a
        power of two, lr is not a number > 0, optimizer or recipe is unknown, or tail lies
        outside [0, 1).

    Examples
    --------
    Inputs of 1e-8 make weight gradients of 2e-8, below float16's smallest subnormal: 8 of
    the 10 gradient entries would flush to zero, and loss scales 2^12 .. 2^14 lift them
    without overflowing the bias gradients (2).

    >>> import torch
    >>> from torch import nn
    >>> from precisionlab.diagnose import gradients
    >>> _ = torch.manual_seed(0)
    >>> model = nn.Linear(4, 2)
    >>> x = torch.full((2, 4), 1e-8)
    >>> report = gradients(model, lambda out: out.sum(), x)
    >>> print("\\n".join(report.summary().splitlines()[1:]))
    float16: flushed 80.0%, subnormal 0, overflow 0; loss scales: 2^12 .. 2^14
    bfloat16: flushed 0, subnormal 0, overflow 0; loss scales: 2^-100 .. 2^126
    forward (1 leaf output, 4 values): max |x| 0.132 in (model)
      float16: 0 values overflow (in 0 outputs), headroom 18.9 binades
      bfloat16: 0 values overflow (in 0 outputs), headroom 130.9 binades
    >>> report.scale_range["float16"], report.total("flushed", "float16")
    ((12, 14), 8)
    >>> print(report.table())
    tensor  max|g|  min|g|>0  fp16 0  fp16 sub  bf16 0  bf16 sub
    ------  ------  --------  ------  --------  ------  --------
    weight  2e-08   2e-08     100.0%  0         0       0
    bias    2       2         0       0         0       0

    Under the MX FP8 recipe, blocks of 32 entries along the last axis: the weight gradient
    (2 x 32) is quantized, the bias gradient (2 entries) is marked as not divisible, never
    padded:

    >>> model = nn.Linear(32, 2)
    >>> x = torch.ones(3, 32)
    >>> report = gradients(model, lambda out: out.sum(), x, recipe="mxfp8")
    >>> [(t.name, t.recipes["mxfp8"].applies) for t in report.tensors]
    [('weight', True), ('bias', False)]
    """
    check_module(model)
    inputs = as_inputs(batch)
    if not callable(loss_fn):
        raise ValueError(f"loss_fn must be callable (output -> scalar loss); got {loss_fn!r}")
    fmts = tuple(get_format(f) for f in formats)
    if not fmts:
        raise ValueError("formats must name at least one format; got ()")
    for f in fmts:
        cast_thresholds(f)
    s = float(scale) if not isinstance(scale, bool) else math.nan
    if not (math.isfinite(s) and s > 0 and math.frexp(s)[0] == 0.5):
        raise ValueError(f"scale must be a power of two (1, 1024, 65536, ...); got scale={scale!r}")
    if lr is not None and not (isinstance(lr, (int, float)) and math.isfinite(lr) and lr > 0):
        raise ValueError(f"lr must be a finite number > 0 or None; got lr={lr!r}")
    check_choice(optimizer, "optimizer", _OPTIMIZERS)
    for name, flag in (("activations", activations), ("forward", forward)):
        if not isinstance(flag, bool):
            raise ValueError(f"{name} must be True or False; got {name}={flag!r}")
    if not (isinstance(tail, (int, float)) and 0 <= tail < 1):
        raise ValueError(f"tail must be a share in [0, 1); got tail={tail!r}")
    recipes = as_recipes(recipe)
    inputs = for_program(model, inputs, cast_inputs)

    params = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    if not params:
        raise ValueError("model has no parameters with requires_grad=True")
    low = sorted({str(p.dtype).removeprefix("torch.") for p in model.parameters()
                  if p.dtype in _LOW})
    run = model
    if low:  # a float32 copy: the gradients whose casts the report predicts
        run = copy.deepcopy(model).float()
        inputs = inputs.map(lambda x: x.float() if isinstance(x, torch.Tensor)
                            and x.dtype in _LOW else x)
    run_params = dict(run.named_parameters())
    saved = {n: p.grad for n, p in params}
    act_stats: list[TensorGradients] = []
    outputs: list[tuple[str, torch.Tensor]] = []  # (name, value) of each leaf output
    calls: dict[str, int] = {}
    hooks = []

    def make_hook(mod_name):
        def fwd(_mod, _inp, out):
            if activations and mod_name != "(model)" and isinstance(out, torch.Tensor) \
                    and out.requires_grad and out.is_floating_point():
                out.register_hook(lambda g: act_stats.append(_stats(
                    mod_name, "activation", g, _count_all([g], s, fmts)[0],
                    recipes=recipes)) or None)
            if forward:
                calls[mod_name] = k = calls.get(mod_name, -1) + 1  # a module called again
                name = mod_name + (f"#{k}" if k else "")
                ts = [t for t in tensors(out) if t.is_floating_point()]
                outputs.extend((name + (f"[{k}]" if len(ts) > 1 else ""), t.detach())
                               for k, t in enumerate(ts))
        return fwd

    if activations or forward:
        for mod_name, mod in run.named_modules():  # the model itself when it has no children
            if not any(True for _ in mod.children()):
                hooks.append(mod.register_forward_hook(make_hook(mod_name or "(model)")))
    try:
        for _, p in params:
            p.grad = None
        with torch.enable_grad():
            out = call(run, inputs, "model")
            loss = check_scalar_loss(loss_fn(out))
            grads = torch.autograd.grad(loss, [run_params[n] for n, _ in params],
                                        allow_unused=True)
    finally:
        for h in hooks:
            h.remove()
        for n, p in params:
            p.grad = saved[n]
    grads = [torch.zeros_like(run_params[n]) if g is None else g
             for (n, _), g in zip(params, grads, strict=True)]
    counts = _count_all(grads, s, fmts)
    stats = [_stats(n, "parameter", g, c, p, lr, optimizer, recipes)
             for (n, p), g, c in zip(params, grads, counts, strict=True)]
    del grads
    act_stats.reverse()  # hooks fire from the output back: put them in forward order
    ranges = {f.name: loss_scale_range(stats, f, tail, act_stats) for f in fmts}
    values = _count_all([t for _, t in outputs], 1.0, fmts) if outputs else []
    fwd = tuple(_stats(n, "forward", t, c) for (n, t), c in zip(outputs, values, strict=True))
    outputs.clear()
    return GradientReport(tuple(stats + act_stats), tuple(f.name for f in fmts), s, float(loss.detach()),
                          float(tail), None if lr is None else float(lr), optimizer, ranges,
                          recipes=recipes, copied_from=", ".join(low), forward=fwd)
