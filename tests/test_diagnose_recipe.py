"""diagnose.gradients(..., recipe=...) against the recipes called directly on torch.autograd.grad
gradients, and its SQNR against exact fractions and a float64 math.fsum.

The models are built here (a small CNN and a masked transformer encoder), not chapter 8's.
The decoded tensor of the oracle is q times each block's decode scale, expanded with
repeat_interleave, not the package's `dequantize`.
"""

from __future__ import annotations

import math
import re
from fractions import Fraction

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from precisionlab import diagnose
from precisionlab.diagnose.report import fmt_share
from precisionlab.quantize import RECIPES, Recipe, recipe

MX_IN = Recipe("mx_in", "float8_e4m3fn", "block", 32, "float8_e8m0fnu", axis=1)
ALL = [*RECIPES, MX_IN]


class RecipeCNN(nn.Module):
    """Two 32-channel convolutions and a linear head; one parameter the loss never uses."""

    def __init__(self):
        super().__init__()
        self.c1 = nn.Conv2d(4, 32, 3, padding=1)
        self.c2 = nn.Conv2d(32, 32, 3, padding=1)
        self.head = nn.Linear(32, 16)
        self.unused = nn.Parameter(torch.ones(64))  # gradient 0: SQNR inf under every recipe

    def forward(self, x):
        x = F.relu(self.c1(x))
        x = F.relu(self.c2(x))
        return self.head(x.mean(dim=(2, 3)))


class RecipeEncoder(nn.Module):
    """Embedding, one post-norm encoder layer with a key-padding mask (d = 128), a vocabulary head."""

    def __init__(self, vocab: int = 64, d: int = 128):
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.layer = nn.TransformerEncoderLayer(d, 4, dim_feedforward=256, dropout=0.0,
                                                batch_first=True)
        self.head = nn.Linear(d, vocab)

    def forward(self, tokens, pad):
        return self.head(self.layer(self.emb(tokens), src_key_padding_mask=pad))


def cnn_case():
    torch.manual_seed(0)
    m = RecipeCNN()
    x = torch.randn(4, 4, 8, 8)
    y = torch.randint(0, 16, (4,))
    return m, (x,), lambda out: F.cross_entropy(out, y)


def encoder_case():
    torch.manual_seed(1)
    m = RecipeEncoder()
    tokens = torch.randint(0, 64, (2, 8))
    pad = torch.arange(8)[None, :] >= torch.tensor([8, 5])[:, None]
    return m, (tokens, pad), lambda out: F.cross_entropy(out[~pad], tokens[~pad])


def direct_gradients(m, inputs, loss_fn):
    """{name: g} of every parameter and every leaf module's output, by torch.autograd.grad."""
    outs, hooks = {}, []
    for name, mod in m.named_modules():
        if name and not list(mod.children()):
            hooks.append(mod.register_forward_hook(
                lambda _m, _i, o, name=name: outs.__setitem__(name, o)
                if isinstance(o, torch.Tensor) and o.requires_grad else None))
    loss = loss_fn(m(*inputs))
    for h in hooks:
        h.remove()
    params = dict(m.named_parameters())
    tensors = [*params.values(), *outs.values()]
    grads = torch.autograd.grad(loss, tensors, allow_unused=True)
    grads = [torch.zeros_like(t) if g is None else g for t, g in zip(tensors, grads, strict=True)]
    names = [("parameter", n) for n in params] + [("activation", n) for n in outs]
    return dict(zip(names, grads, strict=True))


def decoded(q) -> torch.Tensor:
    """q * d with each block's decode scale repeated over its elements (float64)."""
    d = q.decode
    for dim, b in enumerate(q.block):
        d = d.repeat_interleave(b, dim=dim)
    return q.values.to(torch.float64) * d


def sqnr_fsum(g: torch.Tensor, deq: torch.Tensor) -> float:
    g64 = g.to(torch.float64).reshape(-1)
    noise = math.fsum(((g64 - deq.reshape(-1)) ** 2).tolist())
    return math.inf if noise == 0 else 10 * math.log10(math.fsum((g64 * g64).tolist()) / noise)


def sqnr_exact(g: torch.Tensor, deq: torch.Tensor) -> float:
    gs = [Fraction(v) for v in g.to(torch.float64).reshape(-1).tolist()]
    ds = [Fraction(v) for v in deq.reshape(-1).tolist()]
    noise = sum((a - b) ** 2 for a, b in zip(gs, ds, strict=True))
    if noise == 0:
        return math.inf
    return 10 * math.log10(sum(a * a for a in gs) / noise)


@pytest.mark.parametrize("case", [cnn_case, encoder_case])
def test_shares_and_sqnr_match_the_recipes_on_direct_gradients(case):
    m, inputs, loss_fn = case()
    report = diagnose.gradients(m, loss_fn, inputs, recipe=ALL, activations=True)
    direct = direct_gradients(m, inputs, loss_fn)
    got = {(t.kind, t.name): t for t in report.tensors}
    assert set(got) == set(direct)
    applied = skipped = exact = 0
    for key, g in direct.items():
        t = got[key]
        assert list(t.recipes) == [r if isinstance(r, str) else r.name for r in ALL]
        for r in ALL:
            rr = recipe(r)
            s = t.recipes[rr.name]
            try:
                q = rr(g)
            except ValueError as e:  # the block does not fit g's shape: the reason is shown
                assert not s.applies and s.saturated is None and s.sqnr_db is None
                why = str(e).split(";")[0]
                assert s.skipped == why.replace("x's size", "size").replace("of x ", "of ")
                skipped += 1
                continue
            assert s.applies and s.skipped == ""
            assert (s.saturated, s.underflowed, s.subnormal) == (
                q.saturated, q.underflowed, q.subnormal)
            ref = sqnr_fsum(g, decoded(q))
            assert s.sqnr_db == ref or abs(s.sqnr_db - ref) <= 1e-9
            if key == ("parameter", "unused"):
                assert s.sqnr_db == math.inf and ref == math.inf
                exact += 1
            applied += 1
    assert applied > 20 and skipped > 5  # both outcomes are exercised
    if case is cnn_case:
        assert exact >= 6  # the unused parameter's zero gradient, exact under every recipe


def test_sqnr_against_exact_fractions_on_small_tensors():
    m, inputs, loss_fn = cnn_case()
    report = diagnose.gradients(m, loss_fn, inputs, recipe=ALL)
    direct = direct_gradients(m, inputs, loss_fn)
    head = next(t for t in report.tensors if t.name == "head.weight")
    g = direct["parameter", "head.weight"]
    finite = 0
    for r in ALL:
        rr = recipe(r)
        s = head.recipes[rr.name]
        if not s.applies:
            continue
        ref = sqnr_exact(g, decoded(rr(g)))
        assert abs(s.sqnr_db - ref) <= 1e-11
        finite += math.isfinite(ref)
    assert finite >= 5


def test_shares_under_recipes_have_weight_by_entries_and_the_table_marks_skips():
    m, inputs, loss_fn = encoder_case()
    report = diagnose.gradients(m, loss_fn, inputs, recipe=["mxfp4", "deepseek_weight"])
    params = [t for t in report.tensors if t.kind == "parameter"]
    for what in ("saturated", "underflowed", "subnormal"):
        done = [t for t in params if t.recipes["mxfp4"].applies]
        want = sum(getattr(t.recipes["mxfp4"], what) * t.numel for t in done) / sum(
            t.numel for t in done)
        assert math.isclose(report.recipe_share(what, "mxfp4"), want, rel_tol=1e-12)
    assert report.recipe_share("underflowed", "mxfp4") > 0
    # the 128x128 weight recipe fits the 384x128 and 256x128 matrices, not a 1-D bias
    dw = {t.name: t.recipes["deepseek_weight"] for t in params}
    assert dw["layer.self_attn.in_proj_weight"].applies
    assert dw["layer.linear1.weight"].applies
    assert not dw["layer.linear1.bias"].applies
    assert "one size per dimension" in dw["layer.linear1.bias"].skipped
    assert not dw["head.weight"].applies and "does not divide" in dw["head.weight"].skipped
    table = report.recipe_table(limit=100)
    text = table.to_text()
    assert all(len(line) <= 80 for line in text.splitlines())
    flat = " ".join(text.split())  # cells wrap at 80 columns
    assert "n/a" in text and "does not divide size 64" in flat and "never padded" in flat
    assert "<table" in table._repr_html_()
    rows = report.recipe_rows()
    assert len(rows) == 2 * len(report.tensors)
    assert {r["recipe"] for r in rows} == {"mxfp4", "deepseek_weight"}
    printed = str(report)
    summary = report.summary().splitlines()
    assert all(len(line) <= 80 for line in summary[3:]), summary  # the recipe lines
    assert "mxfp4: saturated" in printed and "not quantized: " in printed
    assert "n/a" in printed and "SQNR dB" in printed  # print(report) ends with the table
    assert "<table" in report._repr_html_()


def test_inf_gradients_are_marked_not_fatal():
    torch.manual_seed(0)
    m = nn.Linear(32, 32)
    x = torch.randn(4, 32) * 10

    def loss_fn(out):
        return out.sum() * 3e38

    report = diagnose.gradients(m, loss_fn, x, recipe="mxfp8")
    w = report.tensors[0]
    assert w.nonfinite > 0
    assert not w.recipes["mxfp8"].applies and "inf/NaN" in w.recipes["mxfp8"].skipped
    assert "inf/NaN" in report.recipe_table().to_text()


def test_without_recipe_the_report_is_unchanged():
    m, inputs, loss_fn = cnn_case()
    plain = diagnose.gradients(m, loss_fn, inputs, lr=1e-3, activations=True)
    none = diagnose.gradients(m, loss_fn, inputs, lr=1e-3, activations=True, recipe=None)
    assert str(plain) == str(none) and plain._repr_html_() == none._repr_html_()
    assert plain.recipes == () and all(t.recipes == {} for t in plain.tensors)
    assert "SQNR" not in str(plain)
    with pytest.raises(ValueError, match="no recipe"):
        plain.recipe_table()
    with pytest.raises(ValueError, match="unknown recipe 'mxfp8'; the report has: none"):
        plain.recipe_share("underflowed", "mxfp8")


@pytest.mark.parametrize("bad, words", [
    ("mxfp5", "unknown recipe 'mxfp5'; valid choices: fp8_tensor"),
    (5, "recipe must be a quantize.Recipe, a preset name"),
    ([], "recipe must be a quantize.Recipe"),
    (["mxfp8", "mxfp8"], "distinct"),
])
def test_bad_recipe_names_the_argument(bad, words):
    m, inputs, loss_fn = cnn_case()
    with pytest.raises(ValueError, match=words):
        diagnose.gradients(m, loss_fn, inputs, recipe=bad)


def test_recipe_share_checks_its_arguments():
    m, inputs, loss_fn = cnn_case()
    report = diagnose.gradients(m, loss_fn, inputs, recipe=MX_IN)
    with pytest.raises(ValueError, match="unknown share 'clipped'"):
        report.recipe_share("clipped", "mx_in")
    assert report.recipe_share("saturated", MX_IN) == report.recipe_share("saturated", "mx_in")
    c2 = next(t for t in report.tensors if t.name == "c2.weight")
    assert c2.recipes["mx_in"].applies  # 32 input channels along axis 1


def _parsed_share(cell: str, value: float) -> bool:
    """True when a share cell ('0', '<0.001%', '0.452%', '12.3%') shows value to its digits."""
    if cell == "0":
        return value == 0
    if cell == "<0.001%":
        return 0 < value < 1e-5
    digits = len(cell.rstrip("%").split(".")[1])
    return abs(Fraction(cell.rstrip("%")) / 100 - Fraction(value)) <= Fraction(1, 2 * 10**digits) / 100


def _table_cells(table):
    """(headers, rows) of a recipe table as text cells."""
    return list(table.headers), [list(r) for r in table.rows]


def test_recipe_table_is_a_block_of_rows_per_tensor_that_fits_the_column():
    m, inputs, loss_fn = encoder_case()
    names = ["mxfp4", "deepseek_weight"]
    report = diagnose.gradients(m, loss_fn, inputs, recipe=names, activations=True)
    table = report.recipe_table(limit=100)
    heads, rows = _table_cells(table)
    assert heads == ["tensor", "recipe", "sat", "0", "sub", "SQNR dB", "why n/a"]
    assert len(rows) == len(names) * len(report.tensors)
    reasons = dict(line.split(" ", 1) for line in table.note.splitlines()
                   if line.startswith("("))
    seen_na = 0
    for i, t in enumerate(report.tensors):
        block = rows[len(names) * i: len(names) * (i + 1)]
        label = ("act " if t.kind == "activation" else "") + t.name
        first = block[0][0]
        assert first == label or (first.startswith("…") and label.endswith(first[1:]))
        assert [r[0] for r in block[1:]] == [""] * (len(names) - 1)  # one name per block
        for row, name in zip(block, names, strict=True):
            s = t.recipes[name]
            assert row[1] == name
            if s.applies:
                assert all(_parsed_share(c, v) for c, v in zip(
                    row[2:5], (s.saturated, s.underflowed, s.subnormal), strict=True)), row
                assert row[5] == "inf" if s.sqnr_db == math.inf else \
                    abs(float(row[5]) - s.sqnr_db) <= 0.05
                assert row[6] == ""
            else:  # n/a, and the note gives the reason under the row's number
                assert row[2:6] == ["n/a"] * 4 and reasons[row[6]] == s.skipped
                seen_na += 1
    assert seen_na > 10 and len(reasons) > 2
    # the reasons are numbered 1, 2, ... in the order the rows first use them
    used = list(dict.fromkeys(r[6] for r in rows if r[6]))
    assert used == [f"({k})" for k in range(1, len(reasons) + 1)] == list(reasons)
    assert any("does not divide size 64" in why for why in reasons.values())
    widths = [max(len(r[j]) for r in rows) for j in range(len(heads))]
    assert sum(widths) + 2 * (len(widths) - 1) <= 80  # cells on one line fit 80 columns
    text = table.to_text()
    assert all(len(line) <= 80 for line in text.splitlines())
    assert sum(set(line) == {"-", " "} for line in text.splitlines()) == 1  # one block
    assert table._repr_html_().count("<th ") == 7


def test_recipe_table_without_skips_has_no_reason_column():
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(64, 128), nn.GELU(), nn.Linear(128, 32))
    x, y = torch.randn(32, 64), torch.randint(0, 32, (32,))
    report = diagnose.gradients(m, lambda out: F.cross_entropy(out, y), x,
                                recipe=["fp8_tensor", "mxfp8", "nvfp4"], activations=True)
    heads, rows = _table_cells(report.recipe_table())
    assert heads == ["tensor", "recipe", "sat", "0", "sub", "SQNR dB"]
    assert [r[1] for r in rows] == ["fp8_tensor", "mxfp8", "nvfp4"] * len(report.tensors)
    assert "n/a" not in [c for r in rows for c in r]
    limited = report.recipe_table(limit=2)  # two tensors' blocks, then what was left out
    left = len(report.tensors) - 2
    assert len(limited.rows) == 7 and limited.rows[-1][0] == f"(+{left} more tensors)"
    every = report.recipe_table(limit=len(report.tensors))  # all shown: nothing left out
    assert [list(r) for r in every.rows] == rows and "more tensors" not in every.to_text()


def _direct_recipe(g, rr):
    """rr(g), or None where the recipe's block does not fit g's shape (the oracle's 'skipped')."""
    try:
        return rr(g)
    except ValueError:
        return None


def test_summary_lines_rows_and_shares_against_the_recipes_called_directly():
    # Oracle: every recipe called on the autograd gradients; shares as exact Fractions of
    # entry counts over the tensors it quantized, the lowest SQNR by math.fsum.
    m, inputs, loss_fn = cnn_case()
    report = diagnose.gradients(m, loss_fn, inputs, recipe=ALL)
    direct = direct_gradients(m, inputs, loss_fn)
    params = [n for kind, n in direct if kind == "parameter"]
    flat = " ".join(report.summary().split())  # the recipe lines wrap at 80 columns
    rows = {(r["tensor"], r["recipe"]): r for r in report.recipe_rows()}
    assert len(rows) == len(report.recipe_rows())
    differ = partial = none = 0
    for r in ALL:
        rr = recipe(r)
        qs = {n: _direct_recipe(direct["parameter", n], rr) for n in params}
        done = [n for n in params if qs[n] is not None]
        entries = sum(direct["parameter", n].numel() for n in done)
        want = {}
        for what in ("saturated", "underflowed", "subnormal"):
            count = sum(round(getattr(qs[n], what) * direct["parameter", n].numel())
                        for n in done)
            want[what] = Fraction(count, entries) if entries else Fraction(0)  # none: 0
            assert math.isclose(report.recipe_share(what, rr.name), float(want[what]),
                                rel_tol=1e-12, abs_tol=1e-15)
        differ += want["saturated"] != want["subnormal"]
        partial += 0 < len(done) < len(params)
        none += not done
        sqnrs = {n: sqnr_fsum(direct["parameter", n], decoded(qs[n])) for n in done}
        line = re.search(rf"{re.escape(rr.name)}: saturated (\S+), underflowed (\S+), subnormal "
                         rf"(\S+); lowest SQNR (-|(\S+) dB \((\S+)\)); not quantized: (\d+) of "
                         rf"(\d+) tensors", flat)
        assert line, (rr.name, flat)
        sat, zero, sub, lowest, db, name, skipped, total = line.groups()
        for cell, what in zip((sat, zero, sub), want, strict=True):
            cell, v = cell.rstrip(","), float(want[what])
            assert cell == fmt_share(v) or _parsed_share(cell, v), (rr.name, what, cell)
        if done:
            low = min(sqnrs, key=sqnrs.get)
            assert abs(float(db) - sqnrs[low]) <= 0.05 and name == low
        else:
            assert lowest == "-"
        assert (int(skipped), int(total)) == (len(params) - len(done), len(params))
        for n in params:  # one plain row per tensor and recipe, the recipe's own numbers
            row, q = rows[n, rr.name], qs[n]
            assert row["kind"] == "parameter"
            if q is None:
                assert row["skipped"] and row["sqnr_db"] is None
                assert row["saturated"] is row["underflowed"] is row["subnormal"] is None
                continue
            assert (row["saturated"], row["underflowed"], row["subnormal"], row["skipped"]) == (
                q.saturated, q.underflowed, q.subnormal, "")
            assert row["sqnr_db"] == sqnrs[n] or abs(row["sqnr_db"] - sqnrs[n]) <= 1e-9
    assert differ >= 2 and partial >= 2  # the shares differ, and some recipes skip tensors
    assert none < len(ALL)


class Dyadic(nn.Module):
    """loss = sum(p * x): the gradient of p is the batch x itself."""

    def __init__(self):
        super().__init__()
        self.p = nn.Parameter(torch.zeros(4, 64))

    def forward(self, x):
        return (self.p * x).sum()


def test_a_gradient_the_recipe_keeps_exactly_has_infinite_sqnr():
    # Entries k 2^e, |k| <= 7, e in [-3, 3): exact in E4M3 under MXFP8's power-of-two block
    # scales, so the noise is 0 while the signal is not (exact Fractions agree).
    gen = torch.Generator().manual_seed(5)
    k = torch.randint(-7, 8, (4, 64), generator=gen)
    k[:, 0] = 7  # no block of zeros
    x = (k * 2.0 ** torch.randint(-3, 3, (4, 64), generator=gen)).to(torch.float32)
    report = diagnose.gradients(Dyadic(), lambda out: out, x, recipe="mxfp8")
    s = report.tensors[0].recipes["mxfp8"]
    assert s.applies and sqnr_exact(x, decoded(recipe("mxfp8")(x))) == math.inf
    assert s.sqnr_db == math.inf and (s.saturated, s.underflowed) == (0.0, 0.0)
    assert "lowest SQNR inf dB (p)" in " ".join(report.summary().split())
