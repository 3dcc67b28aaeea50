"""Gradient tensors under a scaling recipe (FP8 per tensor, MX blocks, NVFP4, DeepSeek-V3 tiles):
per tensor the shares saturated, underflowed to zero and left subnormal, and the SQNR.

`gradients(..., recipe=...)` calls `recipe_shares` on every gradient tensor and keeps the
result in the tensor's `recipes` dict ({recipe name: RecipeShares}); the report's recipe
shares, summary lines, rows and table are computed here from those dicts (tensors are any
objects with name, kind, numel and recipes). A tensor the recipe's block does not divide, or
one with inf/NaN entries, is marked with the reason, never padded.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from ..checks import check_choice
from ..emulate import sqnr_db
from ..quantize import RECIPES, Recipe
from ..quantize import recipe as get_recipe
from ..tables import Table, show, wrap
from .report import fmt_share, short

__all__ = ["SHARES", "RecipeShares", "as_recipes", "fmt_db", "recipe_lines", "recipe_rows",
           "recipe_share", "recipe_shares", "recipe_table"]

SHARES = ("saturated", "underflowed", "subnormal")  # the shares a RecipeShares holds


@dataclass(frozen=True)
class RecipeShares:
    """One gradient tensor under one recipe: shares saturated/underflowed/subnormal and SQNR = 10 log10(sum g^2 / sum (g - deq)^2) dB.

    Attributes
    ----------
    recipe : str
        The recipe's name.
    saturated : float or None
        Share of the tensor's entries clipped at the element format's largest value (None
        where the recipe does not apply; so are the next three).
    underflowed : float or None
        Share of entries nonzero in g that quantize to zero.
    subnormal : float or None
        Share of entries left subnormal in the element format.
    sqnr_db : float or None
        The signal-to-quantization-noise ratio in dB (inf when the quantized tensor
        equals g).
    skipped : str
        Why the recipe does not apply to this tensor ("" where it does).
    """

    recipe: str
    saturated: float | None = None  # None where the recipe does not apply (see skipped)
    underflowed: float | None = None
    subnormal: float | None = None
    sqnr_db: float | None = None  # inf when the quantized tensor equals g
    skipped: str = ""  # why the recipe does not apply to this tensor ("" where it does)

    @property
    def applies(self) -> bool:
        """True when the recipe quantized this tensor (its block divides the shape, g is finite)."""
        return not self.skipped


def recipe_shares(g: torch.Tensor, recipes: Sequence[Recipe]) -> dict[str, RecipeShares]:
    """{recipe name: RecipeShares} for gradient g; a block that does not divide g (or inf/NaN in g) is reported, not padded."""
    out = {}
    g32 = g.detach().to(torch.float32).cpu()
    finite = bool(torch.isfinite(g32).all())
    for r in recipes:
        try:
            r.block_sizes(tuple(g32.shape))
        except ValueError as e:
            reason = str(e).split(";")[0].replace("x's size", "size").replace("of x ", "of ")
            out[r.name] = RecipeShares(r.name, skipped=reason)
            continue
        if not finite:
            out[r.name] = RecipeShares(r.name, skipped="inf/NaN entries: no finite scale")
            continue
        q = r(g32)
        # an all-zero g quantizes to zeros: exact, inf dB (sqnr_db leaves 0 / 0 undefined)
        sqnr = sqnr_db(g32, q.dequantize()) if bool(g32.any()) else math.inf
        out[r.name] = RecipeShares(r.name, q.saturated, q.underflowed, q.subnormal, sqnr)
    return out


def as_recipes(recipe) -> tuple[Recipe, ...]:
    """() for None; the Recipe(s) a Recipe, a preset name or a sequence of them names (distinct names)."""
    if recipe is None:
        return ()
    items = [recipe] if isinstance(recipe, (str, Recipe)) else recipe
    try:
        out = tuple(get_recipe(r) for r in items)
    except TypeError:
        out = ()
    if not out:
        raise ValueError(f"recipe must be a quantize.Recipe, a preset name ({', '.join(RECIPES)}) "
                         f"or a non-empty sequence of them; got recipe={recipe!r}")
    names = [r.name for r in out]
    if len(set(names)) != len(names):
        raise ValueError(f"recipe names must be distinct (the report is keyed by name); got "
                         f"{names}")
    return out


def fmt_db(x: float | None) -> str:
    """An SQNR in dB with one decimal ('inf' when exact, '-' for None)."""
    return "-" if x is None else "inf" if x == math.inf else f"{x:.1f}"


def recipe_share(tensors: Sequence, recipes: Sequence[Recipe], what: str, recipe) -> float:
    """saturated/underflowed/subnormal entries of tensors under recipe as a share of the entries of the tensors it quantized."""
    name = recipe.name if isinstance(recipe, Recipe) else recipe
    if name not in {r.name for r in recipes}:
        raise ValueError(f"unknown recipe {name!r}; the report has: "
                         f"{', '.join(r.name for r in recipes) or 'none'}")
    check_choice(what, "share", SHARES)
    done = [(t.numel, t.recipes[name]) for t in tensors if t.recipes[name].applies]
    n = sum(k for k, _ in done)
    return sum(k * getattr(s, what) for k, s in done) / n if n else 0.0


def recipe_lines(tensors: Sequence, recipes: Sequence[Recipe]) -> list[str]:
    """Per recipe one summary line over tensors: the three shares, the lowest SQNR and its tensor, how many were not quantized."""
    lines = []
    for r in recipes:
        done = [t for t in tensors if t.recipes[r.name].applies]
        worst = min(done, key=lambda t: t.recipes[r.name].sqnr_db, default=None)
        low = "-" if worst is None else \
            f"{fmt_db(worst.recipes[r.name].sqnr_db)} dB ({short(worst.name, 24)})"
        sat, zero, sub = (fmt_share(recipe_share(tensors, recipes, w, r.name)) for w in SHARES)
        lines.append(wrap(f"{r.name}: saturated {sat}, underflowed {zero}, subnormal {sub}; "
                          f"lowest SQNR {low}; not quantized: {len(tensors) - len(done)} of "
                          f"{len(tensors)} tensors"))
    return lines


def recipe_rows(tensors: Sequence, recipes: Sequence[Recipe]) -> list[dict]:
    """One plain dict per tensor and recipe: tensor, kind, recipe, the three shares, sqnr_db, skipped."""
    return [{"tensor": t.name, "kind": t.kind, "recipe": r.name,
             "saturated": s.saturated, "underflowed": s.underflowed,
             "subnormal": s.subnormal, "sqnr_db": s.sqnr_db, "skipped": s.skipped}
            for t in tensors for r in recipes for s in (t.recipes[r.name],)]


def recipe_table(tensors: Sequence, recipes: Sequence[Recipe], limit: int = 24) -> Table:
    """A block of rows per tensor, one row per recipe: saturated / zero / subnormal shares and SQNR; n/a with a numbered reason where it does not apply."""
    if not recipes:
        raise ValueError("the report has no recipe; call gradients(..., recipe='mxfp8') "
                         f"with one of: {', '.join(RECIPES)}")
    rows, reasons = [], {}  # reasons: why n/a -> its number, in order of first use
    for t in tensors[:limit]:
        name = short(("act " if t.kind == "activation" else "") + t.name, 24)
        for i, r in enumerate(recipes):
            s = t.recipes[r.name]
            cells = ([fmt_share(s.saturated), fmt_share(s.underflowed), fmt_share(s.subnormal),
                      fmt_db(s.sqnr_db), ""] if s.applies else
                     ["n/a"] * 4 + [f"({reasons.setdefault(s.skipped, len(reasons) + 1)})"])
            rows.append([name if i == 0 else "", r.name, *cells])
    if len(tensors) > limit:
        rows.append([f"(+{len(tensors) - limit} more tensors)", *[""] * 6])
    cols = ["tensor", "recipe", "sat", "0", "sub", "SQNR dB", "why n/a"]
    if not reasons:  # every recipe applies: no reasons to give
        cols, rows = cols[:-1], [row[:-1] for row in rows]
    why = "".join(f"\n({k}) {text}" for text, k in reasons.items())
    return show(rows, cols, title="; ".join(r.describe() for r in recipes), key=2,
                align="ll" + "r" * 4 + "l" * (len(cols) - 6),
                note="sat: saturated at the element format's max; 0: nonzero entries "
                     "quantized to zero; sub: left subnormal (shares of the tensor's "
                     "entries).\nSQNR dB = 10 log10(sum g^2 / sum (g - deq)^2), inf when "
                     "exact.\nn/a: the recipe does not apply (its block does not divide the "
                     "shape, or g has inf/NaN); tensors are never padded." + why)
