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
and tabulated in `recipe_shares`).

A value x rounds (to nearest, ties to even) to zero in a format iff |x| <= q/2 (q the smallest
subnormal), to a subnormal iff q/2 < |x| < n - q/2 (n the smallest normal), and to infinity iff
|x| >= M + ulp(M)/2 (M the largest finite value). Counting is a comparison with these
constants per tensor: no loop over entries.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from ..formats import FloatFormat, get_format
from ..tables import Table
from ..updates import swallowed as update_swallowed
from .recipe_shares import (
    RecipeShares,
    as_recipes,
    recipe_lines,
    recipe_rows,
    recipe_share,
    recipe_shares,
    recipe_table,
)
from .report import (
    Report,
    as_inputs,
    check_module,
    check_scalar_loss,
    fmt_num,
    fmt_share,
    new_axes,
    pow2_label,
    rows_fit,
    short,
)
from .scale_view import ViewTable, scale_alt, scale_figure

__all__ = ["GradientReport", "RecipeShares", "TensorGradients", "cast_thresholds", "gradients",
           "recipe_shares"]

_EXP_OFFSET = 160  # frexp exponents of finite nonzero float32 values lie in -148..128
_EXP_BINS = 300
_OPTIMIZERS = ("sgd", "adam")
_ADAM_EPS = 1e-8  # torch.optim.Adam's default eps


def cast_thresholds(fmt) -> tuple[float, float, float]:
    """(zero_max, subnormal_below, overflow_from) of a format: |x| <= q/2 -> 0, < n - q/2 -> subnormal, >= M + ulp(M)/2 -> inf."""
    f = get_format(fmt)
    if not f.has_inf:
        raise ValueError(f"fmt must be a format with infinities (float16, bfloat16, ...); got {f.name}")
    q = f.min_subnormal
    top_ulp = 2.0 ** (f.emax - f.mantissa_bits)
    return q / 2, f.min_normal - q / 2, f.max_finite + top_ulp / 2


@dataclass(frozen=True)
class TensorGradients:
    """One gradient tensor reduced to counts: sizes, extremes, per-format outcomes of a cast."""

    name: str
    kind: str  # "parameter" or "activation"
    shape: tuple
    numel: int
    nonzero: int  # entries != 0 in float32
    nonfinite: int  # inf or NaN already in float32
    max_abs: float
    min_abs: float  # the smallest nonzero |g| (inf when all are zero)
    flushed: dict  # fmt -> entries nonzero in float32 that become 0
    subnormal: dict  # fmt -> entries that become subnormal
    overflow: dict  # fmt -> entries that become +-inf
    exponents: np.ndarray = field(repr=False)  # counts of finite nonzero |g| by frexp exponent
    swallowed: int = 0  # weights whose bfloat16 update is lost (parameters, when lr is given)
    updated: int = 0  # weights with a nonzero update
    recipes: dict = field(default_factory=dict, repr=False)  # recipe name -> RecipeShares
    # fmt -> counts by frexp exponent of the finite nonzero |g| whose frexp mantissa is at
    # least that of fmt's overflow threshold (the entries of the one bin that overflow)
    near_top: dict = field(default_factory=dict, repr=False)

    def share(self, what: str, fmt: str) -> float:
        """flushed/subnormal/overflow entries of fmt as a share of all entries."""
        return getattr(self, what)[fmt] / self.numel if self.numel else 0.0

    def overflow_at(self, fmt: str, scale_exp: int) -> int:
        """Finite entries with |g| 2^scale_exp >= T (fmt's overflow threshold T = m_T 2^e_T): frexp exponent E > e_T - k, or = e_T - k with mantissa >= m_T."""
        _, e_t = math.frexp(cast_thresholds(fmt)[2])
        i = e_t - scale_exp + _EXP_OFFSET  # the bin of E = e_T - k
        above = int(self.exponents[max(0, min(_EXP_BINS, i + 1)):].sum())
        return above + (int(self.near_top[get_format(fmt).name][i]) if 0 <= i < _EXP_BINS else 0)


def _count(g: torch.Tensor, scale: float, formats: Sequence[FloatFormat]):
    """(nonzero, nonfinite, max, min nonzero, flushed, subnormal, overflow, exponent counts) of scale*g."""
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
    bins = (e.to(torch.int64) + _EXP_OFFSET).clamp(0, _EXP_BINS - 1)
    tops = [math.frexp(cast_thresholds(f)[2])[0] for f in formats]
    near = m >= min(tops)  # mantissas within a few ulps of 1: a small subset, kept once
    m_near, bins_near = m[near], bins[near]
    for f, m_t in zip(formats, tops, strict=True):
        z, s, o = cast_thresholds(f)
        flushed[f.name] = int((vals <= z).sum())
        subnormal[f.name] = int(((vals > z) & (vals < s)).sum())
        overflow[f.name] = int((a >= o).sum())  # inf counts; NaN compares False
        near_top[f.name] = torch.bincount(bins_near[m_near >= m_t],
                                          minlength=_EXP_BINS).cpu().numpy()
    hist = torch.bincount(bins, minlength=_EXP_BINS).cpu().numpy()
    return nonzero, nonfinite, mx, mn, flushed, subnormal, overflow, hist, near_top


def _stats(name, kind, g, scale, formats, w=None, lr=None, optimizer="sgd",
           recipes=()) -> TensorGradients:
    nonzero, nonfinite, mx, mn, fl, sub, ov, hist, top = _count(g, scale, formats)
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
            swallowed = int(np.count_nonzero(update_swallowed(wb.numpy(), step[keep].numpy(), "bfloat16")))
    return TensorGradients(name, kind, tuple(g.shape), g.numel(), nonzero, nonfinite, mx, mn,
                           fl, sub, ov, hist, swallowed, updated,
                           recipe_shares(g, recipes) if recipes else {}, top)


def _below_normal(hist: np.ndarray, fmt: FloatFormat, k: int) -> int:
    """Entries with |g| 2^k < fmt's smallest normal 2^emin: frexp exponent E <= emin - k."""
    top = fmt.emin - k + _EXP_OFFSET  # |g| in [2^(E-1), 2^E) lies below 2^t iff E <= t
    return int(hist[: max(0, min(_EXP_BINS, top + 1))].sum())


@dataclass(frozen=True)
class GradientReport(Report):
    """gradients()'s result: per-tensor counts, the loss-scale range, swallowed updates, the fix table."""

    tensors: tuple  # TensorGradients, parameters first (in model order), then activations
    formats: tuple  # format names
    scale: float  # the loss scale the shares are counted at
    loss: float
    tail: float
    lr: float | None
    optimizer: str
    scale_range: dict  # fmt -> (lowest exponent, highest exponent) or None
    title: str = "gradients in reduced precision"
    recipes: tuple = ()  # the quantize.Recipe objects each tensor was quantized under

    # ------------------------------------------------------------------ totals
    def _of(self, kind):
        return [t for t in self.tensors if t.kind == kind]

    def total(self, what: str, fmt: str, kind: str = "parameter") -> int:
        """Sum over tensors of kind of flushed/subnormal/overflow/numel/nonzero (fmt ignored for the last two)."""
        ts = self._of(kind)
        if what in ("numel", "nonzero", "swallowed", "updated"):
            return sum(getattr(t, what) for t in ts)
        return sum(getattr(t, what)[fmt] for t in ts)

    def share(self, what: str, fmt: str = "float16", kind: str = "parameter") -> float:
        """Share of all parameter-gradient entries that a cast to fmt flushes / leaves subnormal / overflows."""
        n = self.total("numel", fmt, kind)
        return self.total(what, fmt, kind) / n if n else 0.0

    @property
    def swallowed_share(self) -> float | None:
        """Share of weights with a nonzero update whose bfloat16 copy would not change (None without lr)."""
        if self.lr is None:
            return None
        n = self.total("updated", "")
        return self.total("swallowed", "") / n if n else 0.0

    def below_normal(self, fmt: str = "float16", scale_exp: int = 0, kind: str = "parameter") -> float:
        """Share of nonzero entries with |g| 2^scale_exp below fmt's smallest normal."""
        f = get_format(fmt)
        ts = self._of(kind)
        nz = sum(int(t.exponents.sum()) for t in ts)
        return sum(_below_normal(t.exponents, f, scale_exp) for t in ts) / nz if nz else 0.0

    # ------------------------------------------------------------------ display
    def summary(self) -> str:
        """The loss, the scale and, per format, the lost shares and the scale range."""
        lines = [f"loss {self.loss:.4g}; counts at loss scale {pow2_label(int(math.log2(self.scale)))}"
                 f" over {self.total('numel', '')} parameter-gradient entries"]
        for f in self.formats:
            r = self.scale_range[f]
            rng = "none lifts the tail without overflow" if r is None else \
                f"{pow2_label(r[0])} .. {pow2_label(r[1])}"
            lines.append(f"{f}: flushed {fmt_share(self.share('flushed', f))}, subnormal "
                         f"{fmt_share(self.share('subnormal', f))}, overflow "
                         f"{fmt_share(self.share('overflow', f))}; loss scales: {rng}")
        if self.lr is not None:
            lines.append(f"{self.optimizer} step lr={self.lr:g}: bfloat16 weights that would not "
                         f"move: {fmt_share(self.swallowed_share)}")
        lines += recipe_lines(self._of("parameter"), self.recipes)
        return "\n".join(lines)

    # ------------------------------------------------------------------ recipes
    def recipe_share(self, what: str, recipe, kind: str = "parameter") -> float:
        """saturated/underflowed/subnormal entries under recipe as a share of the entries of the tensors it quantized."""
        return recipe_share(self._of(kind), self.recipes, what, recipe)

    def recipe_rows(self) -> list[dict]:
        """One plain dict per tensor and recipe: tensor, kind, recipe, the three shares, sqnr_db, skipped."""
        return recipe_rows(self.tensors, self.recipes)

    def recipe_table(self, limit: int = 24) -> Table:
        """A block of rows per tensor, one per recipe: saturated / zero / subnormal shares and SQNR; n/a with the reason where it does not apply."""
        return recipe_table(self.tensors, self.recipes, limit)

    def to_text(self) -> str:
        """Summary lines, the table, and with recipes the recipe table."""
        text = super().to_text()
        return text + "\n\n" + self.recipe_table().to_text() if self.recipes else text

    def _repr_html_(self) -> str:
        html = super()._repr_html_()
        return html + self.recipe_table()._repr_html_() if self.recipes else html

    def table(self, limit: int = 24) -> Table:
        """One row per tensor: max |g|, smallest nonzero |g|, per format flushed/subnormal shares."""
        heads = ["tensor", "max|g|", "min|g|>0"]
        for f in self.formats:
            ab = {"float16": "f16", "bfloat16": "bf16"}.get(f, f)
            heads += [f"{ab} 0", f"{ab} sub"]
        if self.lr is not None:
            heads.append("stuck")
        rows = []
        for t in self.tensors:
            r = [short(("act " if t.kind == "activation" else "") + t.name, 24), fmt_num(t.max_abs),
                 fmt_num(t.min_abs)]
            for f in self.formats:
                r += [fmt_share(t.share("flushed", f)), fmt_share(t.share("subnormal", f))]
            if self.lr is not None:
                r.append(fmt_share(t.swallowed / t.updated) if t.updated else "-")
            rows.append(r)
        return Table(heads, rows_fit(rows, limit))

    def fixes(self) -> Table:
        """The symptom -> cause -> fix table, each row marked with what this model shows."""
        f16 = "float16" in self.formats
        rows = []
        if f16:
            fl, sub, ov = (self.share(w, "float16") for w in ("flushed", "subnormal", "overflow"))
            r = self.scale_range["float16"]
            fix = (f"loss scale {pow2_label(r[0])}..{pow2_label(r[1])}, or bfloat16" if r
                   else "bfloat16, or per-tensor scaling")
            rows.append(["loss flat, early-layer grads 0", f"fp16 flushes {fmt_share(fl)}",
                         fix if fl else "-"])
            rows.append(["slow or noisy progress", f"fp16 subnormal {fmt_share(sub)}",
                         fix if sub else "-"])
            rows.append(["inf/NaN loss, skipped steps", f"fp16 overflow {fmt_share(ov)}",
                         (f"scale <= {pow2_label(r[1])}" if r else "bfloat16") if ov else "-"])
        if self.lr is not None:
            s = self.swallowed_share
            rows.append(["weights stop changing", f"bf16 updates lost {fmt_share(s)}",
                         "float32 master weights" if s else "-"])
        return Table(["symptom", "cause in this model", "fix"], rows, width=80)

    def plot(self, ax=None, fmt: str = "float16"):
        """Per parameter tensor: log2 of max |g| and smallest nonzero |g| against fmt's floors."""
        ax = new_axes(ax)
        ts = self._of("parameter")
        x = np.arange(len(ts))
        with np.errstate(divide="ignore"):
            hi = np.log2([max(t.max_abs, 2.0**-160) for t in ts])
            lo = np.log2([min(max(t.min_abs, 2.0**-160), 2.0**130) for t in ts])
        ax.vlines(x, lo, hi, color="#0072B2", lw=3, label="nonzero |g|: smallest .. largest")
        f = get_format(fmt)
        s = math.log2(self.scale)
        ax.axhline(f.emin - s, color="#E69F00", ls="--", lw=1, label=f"{fmt} normal floor")
        ax.axhline(math.log2(f.min_subnormal) - s, color="#D55E00", ls=":", lw=1,
                   label=f"{fmt} smallest subnormal")
        ax.set_xticks(x)
        ax.set_xticklabels([short(t.name, 18) for t in ts], rotation=60, ha="right", fontsize=7)
        ax.set_ylabel("log2 |gradient|")
        ax.legend(fontsize=7, loc="lower left")
        return ax

    def scale_view(self, scale_exp: int = 0, fmt: str = "float16"):
        """(ViewTable, Figure): per parameter tensor, the share of nonzero entries that stay below
        fmt's normal floor and the share that overflows, at loss scale 2^scale_exp; the
        table's alt says what the figure shows (drawn and worded in `scale_view`)."""
        f = get_format(fmt)
        if isinstance(scale_exp, bool) or not isinstance(scale_exp, (int, np.integer)):
            raise ValueError(f"scale_exp must be an integer; got scale_exp={scale_exp!r}")
        _, _, over = cast_thresholds(f)
        ts = self._of("parameter")
        below = [_below_normal(t.exponents, f, scale_exp) / max(int(t.exponents.sum()), 1)
                 for t in ts]
        ovf = [t.max_abs * 2.0**scale_exp >= over for t in ts]
        counted = f.name in self.formats  # exact overflow counts need the report's formats
        over_n = [t.overflow_at(f.name, int(scale_exp)) if counted else None for t in ts]
        total = self.below_normal(f.name, scale_exp)
        rows = [[f"loss scale 2^{scale_exp}, {f.name}", ""],
                ["nonzero gradients below the normal floor", fmt_share(total)],
                ["tensors with an overflowing entry", f"{sum(ovf)} of {len(ts)}"]]
        if counted:
            nz = sum(int(t.exponents.sum()) for t in ts)
            rows.append(["nonzero gradients that overflow", fmt_share(sum(over_n) / nz if nz
                                                                       else 0.0)])
        r = self.scale_range.get(f.name) if f.name in self.scale_range else _scale_range(
            ts, f, self.tail, self._of("activation"))
        rows.append([f"scales that work (tail {self.tail:g})",
                     "none" if r is None else f"2^{r[0]} .. 2^{r[1]}"])
        names = [t.name for t in ts]
        shares = [n / max(int(t.exponents.sum()), 1) if o and n is not None else None
                  for t, o, n in zip(ts, ovf, over_n, strict=True)]  # the stems' heights
        alt = scale_alt(names, below, ovf, shares, f.name, scale_exp)
        return ViewTable(["", ""], rows, alt=alt), scale_figure(names, below, ovf, shares,
                                                                f.name, scale_exp)


def _scale_range(ts: Sequence[TensorGradients], fmt: FloatFormat, tail: float,
                 others: Sequence[TensorGradients] = ()):
    """(k_lo, k_hi): 2^k_lo the least scale leaving <= tail of the nonzero |g| of ts below the
    normal floor, 2^k_hi the largest with max|g| 2^k below the overflow threshold, the maximum
    taken over ts and others (activation gradients); None when k_lo > k_hi."""
    mx = max((t.max_abs for t in (*ts, *others)), default=0.0)
    hist = sum((t.exponents for t in ts), np.zeros(_EXP_BINS, dtype=np.int64))
    nz = int(hist.sum())
    if nz == 0 or not math.isfinite(mx):
        return None
    _, _, over = cast_thresholds(fmt)
    k_hi = math.floor(math.log2(over / mx))
    while mx * 2.0**k_hi >= over:
        k_hi -= 1
    while mx * 2.0 ** (k_hi + 1) < over:
        k_hi += 1
    k_lo = -300
    for k in range(-300, 300):
        if _below_normal(hist, fmt, k) <= tail * nz:
            k_lo = k
            break
    return None if k_lo > k_hi else (k_lo, k_hi)


def gradients(model, loss_fn: Callable, batch, formats: Sequence[str] = ("float16", "bfloat16"),
              scale: float = 1.0, lr: float | None = None, optimizer: str = "sgd",
              tail: float = 1e-3, activations: bool = False, recipe=None) -> GradientReport:
    """Gradient counts of loss_fn(model(*batch)) after one float32 backward: per tensor and format,
    entries with |scale g| <= q/2 (flushed), < n - q/2 (subnormal), >= M + ulp(M)/2 (overflow).

    loss_fn(output) returns a scalar; batch is a tensor or a tuple of model inputs. scale: a
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
    restored.
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
    if optimizer not in _OPTIMIZERS:
        raise ValueError(f"unknown optimizer {optimizer!r}; valid choices: {', '.join(_OPTIMIZERS)}")
    if not (isinstance(tail, (int, float)) and 0 <= tail < 1):
        raise ValueError(f"tail must be a share in [0, 1); got tail={tail!r}")
    recipes = as_recipes(recipe)

    params = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    if not params:
        raise ValueError("model has no parameters with requires_grad=True")
    saved = {n: p.grad for n, p in params}
    act_stats: list[TensorGradients] = []
    hooks = []
    if activations:
        def make_hook(mod_name):
            def fwd(_mod, _inp, out):
                if isinstance(out, torch.Tensor) and out.requires_grad and out.is_floating_point():
                    out.register_hook(lambda g: act_stats.append(
                        _stats(mod_name, "activation", g, s, fmts, recipes=recipes)) or None)
            return fwd

        for mod_name, mod in model.named_modules():
            if mod_name and not any(True for _ in mod.children()):
                hooks.append(mod.register_forward_hook(make_hook(mod_name)))
    try:
        for _, p in params:
            p.grad = None
        with torch.enable_grad():
            out = model(*inputs)
            loss = check_scalar_loss(loss_fn(out))
            grads = torch.autograd.grad(loss, [p for _, p in params], allow_unused=True)
    finally:
        for h in hooks:
            h.remove()
        for n, p in params:
            p.grad = saved[n]
    stats = []
    for (n, p), g in zip(params, grads, strict=True):
        g = torch.zeros_like(p) if g is None else g
        stats.append(_stats(n, "parameter", g, s, fmts, p, lr, optimizer, recipes))
        del g
    act_stats.reverse()  # hooks fire from the output back: put them in forward order
    ranges = {f.name: _scale_range(stats, f, tail, act_stats) for f in fmts}
    return GradientReport(tuple(stats + act_stats), tuple(f.name for f in fmts), s, float(loss.detach()),
                          float(tail), None if lr is None else float(lr), optimizer, ranges,
                          recipes=recipes)

