"""`gradients`' result: one gradient tensor reduced to counts (`TensorGradients`) and the report
over all of them (`GradientReport`): shares, the loss-scale range, swallowed updates, the
symptom -> cause -> fix table, the plot and the loss-scale view.

The counts' conventions live here with the report that reads them: the thresholds of a cast
rounding to nearest (`cast_thresholds`) and the histogram of a tensor's finite nonzero |g| by
frexp exponent (bin E + `EXP_OFFSET`, `EXP_BINS` bins), from which the share below any format's
normal floor at any loss scale (`count_below_normal`) and the range of loss scales that work
(`loss_scale_range`) are read without running the model again.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from ..checks import check_choice, check_integer
from ..formats import FloatFormat, get_format, short_name
from ..tables import Table
from .recipe_shares import recipe_lines, recipe_rows, recipe_share, recipe_table
from .report import Report, fmt_num, fmt_share, new_axes, pow2_label, rows_fit, short
from .scale_view import ViewTable, scale_alt, scale_figure
from .watch_report import headroom

__all__ = ["EXP_BINS", "EXP_OFFSET", "GradientReport", "TensorGradients", "cast_thresholds",
           "count_below_normal", "loss_scale_range"]

EXP_OFFSET = 160  # frexp exponents of finite nonzero float32 values lie in -148..128
EXP_BINS = 300


def cast_thresholds(fmt) -> tuple[float, float, float]:
    """(zero_max, subnormal_below, overflow_from) of a format: |x| <= q/2 -> 0, < n - q/2 -> subnormal, >= M + ulp(M)/2 -> inf.

    The thresholds of a cast rounding to nearest, ties to even (q the smallest subnormal,
    n the smallest normal, M the largest finite value).

    Parameters
    ----------
    fmt : str or FloatFormat or torch.dtype
        A format with infinities ("float16", "bfloat16", "float8_e5m2", "float32", ...).

    Returns
    -------
    zero_max : float
        q/2: a value with |x| <= zero_max rounds to zero.
    subnormal_below : float
        n - q/2: a nonzero value that does not round to zero rounds to a subnormal when
        |x| < subnormal_below.
    overflow_from : float
        M + ulp(M)/2: a value with |x| >= overflow_from rounds to infinity.

    Raises
    ------
    ValueError
        If fmt is unknown or has no infinities (float8_e4m3fn, the MX formats).

    Examples
    --------
    >>> from precisionlab.diagnose import cast_thresholds
    >>> zero_max, subnormal_below, overflow_from = cast_thresholds("float16")
    >>> zero_max == 2.0**-25, subnormal_below == 2.0**-14 - 2.0**-25
    (True, True)
    >>> overflow_from  # 65504 + ulp(65504) / 2
    65520.0
    """
    f = get_format(fmt)
    if not f.has_inf:
        raise ValueError(f"fmt must be a format with infinities (float16, bfloat16, ...); got {f.name}")
    q = f.min_subnormal
    top_ulp = 2.0 ** (f.emax - f.mantissa_bits)
    return q / 2, f.min_normal - q / 2, f.max_finite + top_ulp / 2


@dataclass(frozen=True)
class TensorGradients:
    """One gradient tensor reduced to counts: sizes, extremes, per-format outcomes of a cast.

    Attributes
    ----------
    name : str
        The parameter's name (model.named_parameters()) or the leaf module's path.
    kind : str
        "parameter" or "activation".
    shape : tuple of int
        The gradient's shape.
    numel : int
        Its number of entries.
    nonzero : int
        Entries != 0 in float32.
    nonfinite : int
        Entries already inf or NaN in float32.
    max_abs : float
        The largest finite |g| (unscaled).
    min_abs : float
        The smallest nonzero |g| (inf when every entry is zero).
    flushed : dict
        Format name -> nonzero entries that a cast at the report's scale rounds to zero.
    subnormal : dict
        Format name -> entries that it leaves subnormal.
    overflow : dict
        Format name -> entries that it takes to +-inf.
    swallowed : int
        Weights whose bfloat16 update is lost (parameters, when lr is given).
    updated : int
        Weights with a nonzero update.
    recipes : dict
        Recipe name -> RecipeShares (with recipe=).
    """

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
        """flushed/subnormal/overflow entries of fmt as a share of all entries.

        Parameters
        ----------
        what : {"flushed", "subnormal", "overflow"}
            The outcome of the cast.
        fmt : str
            A registry name among the report's formats ("float16", "bfloat16", ...).

        Returns
        -------
        float
            The share in [0, 1] (0.0 for an empty tensor).
        """
        return getattr(self, what)[fmt] / self.numel if self.numel else 0.0

    def overflow_at(self, fmt: str, scale_exp: int) -> int:
        """Finite entries with |g| 2^scale_exp >= T (fmt's overflow threshold T = m_T 2^e_T): frexp exponent E > e_T - k, or = e_T - k with mantissa >= m_T."""
        _, e_t = math.frexp(cast_thresholds(fmt)[2])
        i = e_t - scale_exp + EXP_OFFSET  # the bin of E = e_T - k
        above = int(self.exponents[max(0, min(EXP_BINS, i + 1)):].sum())
        return above + (int(self.near_top[get_format(fmt).name][i]) if 0 <= i < EXP_BINS else 0)


def count_below_normal(hist: np.ndarray, fmt: FloatFormat, k: int) -> int:
    """Entries with |g| 2^k < fmt's smallest normal 2^emin: frexp exponent E <= emin - k."""
    top = fmt.emin - k + EXP_OFFSET  # |g| in [2^(E-1), 2^E) lies below 2^t iff E <= t
    return int(hist[: max(0, min(EXP_BINS, top + 1))].sum())


@dataclass(frozen=True)
class GradientReport(Report):
    """gradients()'s result: per-tensor counts, the loss-scale range, swallowed updates, the fix table.

    Attributes
    ----------
    tensors : tuple of TensorGradients
        One per gradient tensor: the parameters first (in model order), then, with
        activations=True, the leaf modules' outputs (in forward order).
    formats : tuple of str
        The registry names of the formats counted.
    scale : float
        The loss scale the counts are taken at.
    loss : float
        The float32 loss of the one forward.
    tail : float
        The tail share the loss-scale range allows below the normal floor.
    lr : float or None
        The step size given, or None.
    optimizer : str
        "sgd" or "adam".
    scale_range : dict
        Format name -> (lowest, highest) exponent k of the loss scales 2^k that leave at
        most tail of the nonzero parameter gradients below the normal floor and none
        overflowing, or None where no scale does both.
    recipes : tuple of Recipe
        The scaling recipes each tensor was quantized under (empty without recipe=).
    copied_from : str
        The model's float16/bfloat16 parameter dtypes when its backward ran on a float32
        copy ("bfloat16"), else "".
    forward : tuple of TensorGradients
        With forward=True, one per leaf module's output of the same forward (kind
        "forward", unscaled values, in forward order): its overflow in each format.

    Examples
    --------
    >>> import torch
    >>> from torch import nn
    >>> from precisionlab.diagnose import gradients
    >>> _ = torch.manual_seed(0)
    >>> model = nn.Linear(4, 2)
    >>> x = torch.full((2, 4), 1e-8)
    >>> report = gradients(model, lambda out: out.sum(), x, lr=1e-3)
    >>> report.share("flushed", "float16")
    0.8
    >>> report.below_normal("float16", scale_exp=12)
    0.0
    >>> report.swallowed_share
    0.8
    >>> print(report.fixes())
    symptom                         cause in this model
    ------------------------------  -----------------------
    loss flat, early-layer grads 0  fp16 flushes 80.0%
    slow or noisy progress          fp16 subnormal 0
    inf/NaN loss, skipped steps     fp16 overflow 0
    inf/NaN in the forward          fp16 forward ovf 0 in 0
    weights stop changing           bf16 updates lost 80.0%
    <BLANKLINE>
    symptom                         fix
    ------------------------------  ----------------------------------
    loss flat, early-layer grads 0  loss scale 2^12..2^14, or bfloat16
    slow or noisy progress          -
    inf/NaN loss, skipped steps     -
    inf/NaN in the forward          -
    weights stop changing           float32 master weights
    """

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
    copied_from: str = ""  # the model's low dtypes when the backward ran on a float32 copy
    forward: tuple = ()  # TensorGradients of kind "forward": the leaf modules' outputs

    # ------------------------------------------------------------------ totals
    def _of(self, kind):
        return [t for t in self.tensors if t.kind == kind]

    def total(self, what: str, fmt: str, kind: str = "parameter") -> int:
        """Sum over tensors of kind of flushed/subnormal/overflow/numel/nonzero (fmt ignored for the last two).

        Parameters
        ----------
        what : {"flushed", "subnormal", "overflow", "numel", "nonzero", "swallowed", "updated"}
            The count to add up; "swallowed" and "updated" count weights (with lr).
        fmt : str
            A format of the report (`formats`) for the first three; ignored for the others.
        kind : {"parameter", "activation"}, default "parameter"
            Which gradient tensors to add up.

        Returns
        -------
        int
            The total over the tensors of that kind.
        """
        ts = self._of(kind)
        if what in ("numel", "nonzero", "swallowed", "updated"):
            return sum(getattr(t, what) for t in ts)
        return sum(getattr(t, what)[fmt] for t in ts)

    def share(self, what: str, fmt: str = "float16", kind: str = "parameter") -> float:
        """Share of all parameter-gradient entries that a cast to fmt flushes / leaves subnormal / overflows.

        Parameters
        ----------
        what : {"flushed", "subnormal", "overflow"}
            The outcome of the cast.
        fmt : str, default "float16"
            One of the report's `formats`.
        kind : {"parameter", "activation"}, default "parameter"
            Which gradient tensors to count over.

        Returns
        -------
        float
            The share in [0, 1] of all entries of those tensors (0.0 when there are none).
        """
        n = self.total("numel", fmt, kind)
        return self.total(what, fmt, kind) / n if n else 0.0

    @property
    def swallowed_share(self) -> float | None:
        """Share of weights with a nonzero update whose bfloat16 copy would not change (None without lr).

        The update is the one step the report was asked about (lr, optimizer), applied to
        each weight rounded to bfloat16: it is swallowed when the sum rounds back to the
        same bfloat16 value (chapter 1's rule).
        """
        if self.lr is None:
            return None
        n = self.total("updated", "")
        return self.total("swallowed", "") / n if n else 0.0

    def below_normal(self, fmt: str = "float16", scale_exp: int = 0, kind: str = "parameter") -> float:
        """Share of nonzero entries with |g| 2^scale_exp below fmt's smallest normal.

        Parameters
        ----------
        fmt : str, default "float16"
            Any format `formats.get_format` knows (not only the report's).
        scale_exp : int, default 0
            The loss scale 2^scale_exp to try. The report keeps counts per binade of the
            unscaled gradients, so any scale can be tried without running the model again
            (the report's own `scale` does not enter).
        kind : {"parameter", "activation"}, default "parameter"
            Which gradient tensors to count over.

        Returns
        -------
        float
            The share in [0, 1] of the nonzero finite entries.
        """
        f = get_format(fmt)
        ts = self._of(kind)
        nz = sum(int(t.exponents.sum()) for t in ts)
        return sum(count_below_normal(t.exponents, f, scale_exp) for t in ts) / nz if nz else 0.0

    # ------------------------------------------------------------------ display
    def summary(self) -> str:
        """The loss, the scale and, per format, the lost shares and the scale range.

        Returns
        -------
        str
            One line on the loss and scale (and one when the backward ran on a float32 copy
            of a float16/bfloat16 model), one per format, one on swallowed updates (with lr)
            and one per recipe.
        """
        lines = [f"loss {self.loss:.4g}; counts at loss scale {pow2_label(int(math.log2(self.scale)))}"
                 f" over {self.total('numel', '')} parameter-gradient entries"]
        if self.copied_from:
            lines.append(f"(the backward ran on a float32 copy of the {self.copied_from} model)")
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
        lines += self._forward_lines()
        return "\n".join(lines)

    # ------------------------------------------------------------------ the forward
    def forward_overflow(self, fmt: str = "float16") -> tuple[int, int]:
        """(entries, outputs): the forward values a cast to fmt takes to +-inf (inf already
        in float32 included), and in how many leaf-module outputs.

        Parameters
        ----------
        fmt : str, default "float16"
            One of the report's formats.

        Returns
        -------
        tuple of int
            The entries and the outputs that hold them ((0, 0) without forward=True).
        """
        check_choice(fmt, "fmt", self.formats)
        over = [t.overflow[fmt] for t in self.forward if t.overflow[fmt]]
        return sum(over), len(over)

    def forward_headroom(self, fmt: str = "float16") -> float:
        """log2(fmt's largest finite value / the largest |value| of the forward), binades:
        negative when a forward value overflows fmt (-inf when one is already inf or NaN;
        NaN without forward=True)."""
        check_choice(fmt, "fmt", self.formats)
        if not self.forward:
            return math.nan
        if any(t.nonfinite for t in self.forward):
            return -math.inf
        return headroom(max(t.max_abs for t in self.forward), fmt)

    def _forward_lines(self) -> list[str]:
        if not self.forward:
            return []
        top = max(self.forward, key=lambda t: t.max_abs)
        n, m = sum(t.numel for t in self.forward), len(self.forward)
        lines = [f"forward ({m} leaf output{'s' * (m != 1)}, {n} values): max |x| "
                 f"{fmt_num(top.max_abs)} in {short(top.name, 24)}"]
        for f in self.formats:
            k, o = self.forward_overflow(f)
            lines.append(f"  {f}: {k} values overflow (in {o} outputs), headroom "
                         f"{self.forward_headroom(f):.1f} binades")
        return lines

    def forward_table(self, limit: int = 24) -> Table:
        """One row per leaf module's output of the forward: max |x|, per format the entries
        that overflow and the headroom in binades.

        Parameters
        ----------
        limit : int, default 24
            The most outputs shown; a last row says how many were left out.

        Returns
        -------
        Table
            Columns output, max|x|, then per format "fp16 ovf" and "fp16 hr" (binades).
        """
        heads = ["output", "max|x|"]
        for f in self.formats:
            heads += [f"{short_name(f)} ovf", f"{short_name(f)} hr"]
        rows = []
        for t in self.forward:
            r = [short(t.name, 24), fmt_num(t.max_abs)]
            for f in self.formats:
                hr = -math.inf if t.nonfinite else headroom(t.max_abs, f)
                r += [str(t.overflow[f]), f"{hr:.1f}"]
            rows.append(r)
        return Table(heads, rows_fit(rows, limit))

    # ------------------------------------------------------------------ recipes
    def recipe_share(self, what: str, recipe, kind: str = "parameter") -> float:
        """saturated/underflowed/subnormal entries under recipe as a share of the entries of the tensors it quantized.

        Parameters
        ----------
        what : {"saturated", "underflowed", "subnormal"}
            The share to report.
        recipe : str or Recipe
            One of the report's recipes, by name or as the Recipe.
        kind : {"parameter", "activation"}, default "parameter"
            Which gradient tensors to count over.

        Returns
        -------
        float
            The share in [0, 1]; tensors the recipe did not quantize do not count.

        Raises
        ------
        ValueError
            If the report has no such recipe, or what is unknown.
        """
        return recipe_share(self._of(kind), self.recipes, what, recipe)

    def recipe_rows(self) -> list[dict]:
        """One plain dict per tensor and recipe: tensor, kind, recipe, the three shares, sqnr_db, skipped.

        Returns
        -------
        list of dict
            Keys "tensor", "kind", "recipe", "saturated", "underflowed", "subnormal",
            "sqnr_db" (None where the recipe does not apply) and "skipped" (the reason, or
            ""): ready for a DataFrame or a CSV writer.
        """
        return recipe_rows(self.tensors, self.recipes)

    def recipe_table(self, limit: int = 24) -> Table:
        """A block of rows per tensor, one per recipe: saturated / zero / subnormal shares and SQNR; n/a with the reason where it does not apply.

        Parameters
        ----------
        limit : int, default 24
            The most tensors shown; a last row says how many were left out.

        Returns
        -------
        Table
            The table, with the recipes described in its caption and a key in its note.

        Raises
        ------
        ValueError
            If the report was made without recipe=.
        """
        return recipe_table(self.tensors, self.recipes, limit)

    def to_text(self) -> str:
        """Summary lines, the table, and with recipes the recipe table."""
        text = super().to_text()
        return text + "\n\n" + self.recipe_table().to_text() if self.recipes else text

    def _repr_html_(self) -> str:
        html = super()._repr_html_()
        return html + self.recipe_table()._repr_html_() if self.recipes else html

    def table(self, limit: int = 24) -> Table:
        """One row per tensor: max |g|, smallest nonzero |g|, per format flushed/subnormal shares.

        Parameters
        ----------
        limit : int, default 24
            The most tensors shown; a last row says how many were left out.

        Returns
        -------
        Table
            Columns tensor, max|g|, min|g|>0, then per format (by its short name) the
            flushed ("fp16 0") and subnormal ("fp16 sub") shares, and with lr the share of
            stuck weights ("stuck").
        """
        heads = ["tensor", "max|g|", "min|g|>0"]
        for f in self.formats:
            ab = short_name(f)
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
        """The symptom -> cause -> fix table, each row marked with what this model shows.

        Returns
        -------
        Table
            Columns symptom, cause in this model, fix ("-" where this model does not show
            the cause); float16 rows when float16 was counted, a bfloat16 row with lr.
        """
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
            if self.forward:
                k, m = self.forward_overflow("float16")
                rows.append(["inf/NaN in the forward", f"fp16 forward ovf {k} in {m}",
                             "bfloat16, or float32 there" if k else "-"])
        if self.lr is not None:
            s = self.swallowed_share
            rows.append(["weights stop changing", f"bf16 updates lost {fmt_share(s)}",
                         "float32 master weights" if s else "-"])
        return Table(["symptom", "cause in this model", "fix"], rows, width=80)

    def plot(self, ax=None, fmt: str = "float16"):
        """Per parameter tensor: log2 of max |g| and smallest nonzero |g| against fmt's floors.

        Parameters
        ----------
        ax : matplotlib.axes.Axes or None, default None
            The Axes to draw on; None draws on a new figure.
        fmt : str, default "float16"
            The format whose normal floor and smallest subnormal are drawn (at the
            report's scale).

        Returns
        -------
        matplotlib.axes.Axes
            The Axes drawn on.
        """
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
        table's alt says what the figure shows (drawn and worded in `scale_view`).

        Parameters
        ----------
        scale_exp : int, default 0
            The loss scale 2^scale_exp to look at.
        fmt : str, default "float16"
            The format whose normal floor and overflow threshold apply; exact overflow
            counts need one of the report's formats.

        Returns
        -------
        table : Table
            A two-column ViewTable: the share below the normal floor, the tensors with an
            overflowing entry, the share that overflows, the scales that work; its alt
            text describes the figure.
        figure : matplotlib.figure.Figure
            Bars per tensor of the share below the floor, stems where entries overflow.

        Raises
        ------
        ValueError
            If scale_exp is not an integer, or fmt is unknown or has no infinities.
        """
        f = get_format(fmt)
        check_integer(scale_exp, "scale_exp")
        _, _, over = cast_thresholds(f)
        ts = self._of("parameter")
        below = [count_below_normal(t.exponents, f, scale_exp) / max(int(t.exponents.sum()), 1)
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
        r = self.scale_range.get(f.name) if f.name in self.scale_range else loss_scale_range(
            ts, f, self.tail, self._of("activation"))
        rows.append([f"scales that work (tail {self.tail:g})",
                     "none" if r is None else f"2^{r[0]} .. 2^{r[1]}"])
        names = [t.name for t in ts]
        shares = [n / max(int(t.exponents.sum()), 1) if o and n is not None else None
                  for t, o, n in zip(ts, ovf, over_n, strict=True)]  # the stems' heights
        alt = scale_alt(names, below, ovf, shares, f.name, scale_exp)
        return ViewTable(["", ""], rows, alt=alt), scale_figure(names, below, ovf, shares,
                                                                f.name, scale_exp)


def loss_scale_range(ts: Sequence[TensorGradients], fmt: FloatFormat, tail: float,
                 others: Sequence[TensorGradients] = ()):
    """(k_lo, k_hi): 2^k_lo the least scale leaving <= tail of the nonzero |g| of ts below the
    normal floor, 2^k_hi the largest with max|g| 2^k below the overflow threshold, the maximum
    taken over ts and others (activation gradients); None when k_lo > k_hi."""
    mx = max((t.max_abs for t in (*ts, *others)), default=0.0)
    hist = sum((t.exponents for t in ts), np.zeros(EXP_BINS, dtype=np.int64))
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
        if count_below_normal(hist, fmt, k) <= tail * nz:
            k_lo = k
            break
    return None if k_lo > k_hi else (k_lo, k_hi)
