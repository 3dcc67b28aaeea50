"""diagnose.gradients against direct torch casts, torch.amp.GradScaler and ml_dtypes."""

import copy
import math

import ml_dtypes
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from diagnose_models import SmallCNN
from oracles import table_round
from torch import nn

from precisionlab import diagnose


def _cnn_case(seed=0, factor=1e-5):
    torch.manual_seed(seed)
    m = SmallCNN()
    x = torch.randn(4, 1, 8, 8)
    y = torch.randint(0, 10, (4,))

    def loss_fn(out):
        return F.cross_entropy(out, y) * factor
    return m, x, loss_fn


def _direct_grads(m, x, loss_fn):
    return torch.autograd.grad(loss_fn(m(x)), list(m.parameters()))


@pytest.mark.parametrize("scale_exp", [0, 10, 40])
def test_shares_match_direct_casts(scale_exp):
    m, x, loss_fn = _cnn_case()
    r = diagnose.gradients(m, loss_fn, x, scale=2.0**scale_exp)
    grads = _direct_grads(m, x, loss_fn)
    seen = {"flushed": 0, "subnormal": 0, "overflow": 0}
    for t, g in zip([t for t in r.tensors if t.kind == "parameter"], grads, strict=True):
        gs = g * 2.0**scale_exp  # exact: a power of two, no float32 overflow here
        for fmt, dt in (("float16", torch.float16), ("bfloat16", torch.bfloat16)):
            c = gs.to(dt)
            small = torch.finfo(dt).tiny
            assert t.flushed[fmt] == int(((gs != 0) & (c == 0)).sum())
            assert t.subnormal[fmt] == int(((c != 0) & (c.abs() < small)).sum())
            assert t.overflow[fmt] == int((torch.isinf(c) & torch.isfinite(gs)).sum())
            for k in seen:
                seen[k] += getattr(t, k)[fmt]
        assert t.numel == g.numel() and t.max_abs == float(g.abs().max())
    # the case exercises what it checks: fp16 flushes and subnormals at 2^0, overflow at 2^40
    if scale_exp == 0:
        assert seen["flushed"] > 0 and seen["subnormal"] > 0
    if scale_exp == 40:
        assert seen["overflow"] > 0


def test_scale_range_against_gradscaler():
    m, x, loss_fn = _cnn_case(factor=1e-3)
    r = diagnose.gradients(m, loss_fn, x, tail=0.01)
    lo, hi = r.scale_range["float16"]
    grads = _direct_grads(m, x, loss_fn)

    def skipped(k):  # GradScaler's verdict on float16 gradients scaled by 2^k
        p = torch.nn.Parameter(torch.zeros(sum(g.numel() for g in grads)))
        p.grad = torch.cat([(g * 2.0**k).reshape(-1) for g in grads]).half().float()
        opt = torch.optim.SGD([p], lr=1.0)
        scaler = torch.amp.GradScaler("cpu", init_scale=2.0**k)
        scaler.scale(torch.ones(()))  # creates the scale tensor, as a real loop's loss would
        scaler.step(opt)
        scaler.update()
        return scaler.get_scale() < 2.0**k
    assert not skipped(hi) and skipped(hi + 1)
    # the low end: no more than tail of the nonzero entries below 2^-14 after scaling, by float64
    flat = torch.cat([g.reshape(-1) for g in grads]).double()
    nz = flat[flat != 0].abs()

    def below(k):
        return float((nz * 2.0**k < 2.0**-14).double().mean())
    assert below(lo) <= 0.01 < below(lo - 1)
    assert math.isclose(r.below_normal("float16", lo), below(lo))


def test_swallowed_updates_against_ml_dtypes():
    torch.manual_seed(1)
    lin = torch.nn.Linear(64, 8, bias=False)
    with torch.no_grad():  # powers of two and their neighbours: the asymmetric case of chapter 1
        w = 2.0 ** torch.randint(-3, 3, (8, 64)).double()
        w[::2] *= torch.where(torch.rand(4, 64) < 0.5, 1.0, 1 + 2.0**-7).double()
        lin.weight.copy_(w.float() * torch.where(torch.rand(8, 64) < 0.5, 1.0, -1.0))
    x = torch.randn(16, 64)
    lr = 2.0**-9

    def loss_fn(out):
        return out.square().mean()
    for opt in ("sgd", "adam"):
        r = diagnose.gradients(lin, loss_fn, x, lr=lr, optimizer=opt)
        (g,) = torch.autograd.grad(loss_fn(lin(x)), [lin.weight])
        wb = lin.weight.detach().to(torch.bfloat16).double().numpy()
        gd = g.double().numpy()
        step = -lr * (gd if opt == "sgd" else gd / (np.abs(gd) + 1e-8))  # Adam's first step
        # rounded once from the float64 sum (exact here up to 2^-53, far from any tie), by
        # table search; ml_dtypes would round through float32 first
        moved = table_round(wb + step, "bfloat16", "nearest_even") != wb
        if opt == "sgd":  # steps of 2^-9 hit ties exactly: ml_dtypes agrees there
            assert np.array_equal(moved, (wb + step).astype(ml_dtypes.bfloat16).astype(
                np.float64) != wb)
        upd = step != 0
        assert r.tensors[0].updated == int(upd.sum())
        assert r.tensors[0].swallowed == int((~moved & upd).sum())
        assert 0 < r.swallowed_share < 1  # both outcomes occur


def test_activation_gradients_and_display():
    m, x, loss_fn = _cnn_case()
    r = diagnose.gradients(m, loss_fn, x, activations=True, lr=1e-3)
    acts = [t.name for t in r.tensors if t.kind == "activation"]
    assert acts == ["c1", "c2", "head"]
    text = str(r)
    assert all(len(line) <= 80 for line in text.splitlines()), text
    assert "fix" in r.fixes().to_text()
    import matplotlib

    matplotlib.use("Agg")
    assert r.plot() is not None
    m.zero_grad()
    assert all(p.grad is None for p in m.parameters())  # the model's own grads are untouched


def test_bad_input_names_the_argument():
    m, x, loss_fn = _cnn_case()
    with pytest.raises(ValueError, match=r"model must be a torch\.nn\.Module"):
        diagnose.gradients(lambda z: z, loss_fn, x)
    with pytest.raises(ValueError, match="scalar"):
        diagnose.gradients(m, lambda out: out, x)
    with pytest.raises(ValueError, match="no parameters"):
        diagnose.gradients(torch.nn.ReLU(), lambda out: out.sum(), x)
    with pytest.raises(ValueError, match="scale must be a power of two"):
        diagnose.gradients(m, loss_fn, x, scale=1000)
    with pytest.raises(ValueError, match="unknown optimizer"):
        diagnose.gradients(m, loss_fn, x, lr=1e-3, optimizer="lion")
    with pytest.raises(ValueError, match="batch must be"):
        diagnose.gradients(m, loss_fn, None)


def test_scale_range_top_respects_activation_gradients():
    """With activations=True the top of the range keeps the activation gradients finite too: a
    float16 backward overflows there first when the inputs are small (weight gradients carry the
    inputs' factor, activation gradients do not)."""
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(16, 10, bias=False))
    x, y = torch.randn(4, 16) * 1e-3, torch.randint(0, 10, (4,))

    def loss_fn(out):
        return F.cross_entropy(out, y)
    r_par = diagnose.gradients(m, loss_fn, x, tail=0.01)
    r_all = diagnose.gradients(m, loss_fn, x, tail=0.01, activations=True)
    top = max(t.max_abs for t in r_all.tensors)
    assert top > max(t.max_abs for t in r_all.tensors if t.kind == "parameter")
    _, _, over = diagnose.cast_thresholds("float16")
    hi = r_all.scale_range["float16"][1]
    assert top * 2.0**hi < over <= top * 2.0 ** (hi + 1)
    assert hi < r_par.scale_range["float16"][1]


@pytest.mark.parametrize("fmt, ks", [("float16", range(-4, 50)), ("bfloat16", range(110, 170))])
def test_overflow_at_every_scale_matches_direct_counts(fmt, ks):
    m, x, loss_fn = _cnn_case(factor=1.0)
    r = diagnose.gradients(m, loss_fn, x)
    grads = _direct_grads(m, x, loss_fn)
    _, _, over = diagnose.cast_thresholds(fmt)
    seen = set()
    for t, g in zip(r.tensors, grads, strict=True):
        a = g.abs().double()
        assert t.overflow_at(fmt, 0) == t.overflow[fmt]  # the counts at the report's scale 1
        for k in ks:
            want = int((a * 2.0**k >= over).sum())  # float64: exact for k in these ranges
            assert t.overflow_at(fmt, k) == want
            seen.add(0 < want < t.nonzero)
    assert seen == {True, False}  # partial overflows occur, not only none or all


def test_scale_view_shows_every_overflow_and_names_every_tensor():
    import matplotlib.colors as mcolors

    from precisionlab.diagnose.report import fmt_share

    m, x, loss_fn = _cnn_case(factor=1.0)
    r = diagnose.gradients(m, loss_fn, x, tail=0.01)
    grads = _direct_grads(m, x, loss_fn)
    params = [t for t in r.tensors if t.kind == "parameter"]
    _, _, over = diagnose.cast_thresholds("float16")
    big = max(params, key=lambda t: t.numel)  # the first scale at which it overflows
    k = math.floor(math.log2(over / big.max_abs))
    k += big.max_abs * 2.0**k < over
    table, fig = r.scale_view(k, "float16")
    ax = fig.axes[0]
    over_n = [int((g.abs().double() * 2.0**k >= over).sum()) for g in grads]
    nz = [int((g != 0).sum()) for g in grads]
    shares = [o / n for o, n in zip(over_n, nz, strict=True)]
    assert 0 < shares[params.index(big)] < 0.01  # a share a bar of its height would hide
    below = [int(((g != 0) & (g.abs().double() * 2.0**k < 2.0**-14)).sum()) / n
             for g, n in zip(grads, nz, strict=True)]
    assert [b.get_height() for b in ax.patches] == below  # the bars are unchanged
    segments = ax.collections[0].get_segments()
    stems = {round(s[0][0] - 0.3): s[1][1] for s in segments}
    assert stems == {i: max(s, 0.05) for i, s in enumerate(shares) if s}
    assert [s[0][0] for s in segments] == [i + 0.3 for i, s in enumerate(shares) if s]  # beside
    # red bars exactly for the tensors with an overflowing entry, blue for the rest
    assert [mcolors.to_hex(b.get_facecolor()) for b in ax.patches] == [
        "#d55e00" if n else "#0072b2" for n in over_n]
    assert 0 < sum(map(bool, over_n)) < len(over_n)  # both colours occur
    assert mcolors.to_hex(ax.collections[0].get_color()[0]) == "#d55e00"
    label = ax.get_legend().get_texts()[0].get_text()
    assert f"largest {fmt_share(max(shares))}" in label and "at least 5%" in label
    assert [t.get_text() for t in ax.get_xticklabels()] == [t.name for t in params]
    row = next(line for line in table.to_text().splitlines() if "that overflow" in line)
    assert row.split()[-1] == fmt_share(sum(over_n) / sum(nz))
    _, fig0 = r.scale_view(-40, "float16")  # nothing overflows: no stems, no legend
    assert not fig0.axes[0].collections and fig0.axes[0].get_legend() is None


def _names(tied):
    """The alt's list of names: up to three, then how many more."""
    if len(tied) > 3:
        return f"{', '.join(tied[:3])} and {len(tied) - 3} more"
    return tied[0] if len(tied) == 1 else f"{', '.join(tied[:-1])} and {tied[-1]}"


def _highest_bars(below, names):
    """What the alt must say of the highest bar, naming every tensor that ties for it."""
    from precisionlab.diagnose.report import fmt_share

    top = max(below)
    tied = [n for n, b in zip(names, below, strict=True) if b == top]
    if len(tied) == 1:
        return f"(the highest bar: {fmt_share(top)}, {tied[0]})"
    return f"(the {len(tied)} highest bars, {fmt_share(top)} each: {_names(tied)})"


def _largest_overflow(ovf, names):
    """What the alt must say of the largest overflow share, naming every tensor that has it."""
    from precisionlab.diagnose.report import fmt_share

    top = max(ovf)
    tied = [n for n, o in zip(names, ovf, strict=True) if o == top]
    return f"the largest overflow share {fmt_share(top)} ({_names(tied)})"


class _Twins(torch.nn.Module):
    """Two linear layers with the same weights side by side: their gradients are equal."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(3)
        self.a, self.b = torch.nn.Linear(8, 8), torch.nn.Linear(8, 8)
        self.b.load_state_dict(self.a.state_dict())

    def forward(self, x):
        return self.a(x) + self.b(x)


def test_scale_view_alt_text_names_every_bar_that_ties_for_the_highest():
    m, x = _Twins(), torch.randn(4, 8, generator=torch.Generator().manual_seed(4))

    def loss_fn(out):
        return out.square().sum()

    r = diagnose.gradients(m, loss_fn, x)
    grads = [g.abs().double() for g in _direct_grads(m, x, loss_fn)]
    assert torch.equal(grads[0], grads[2]) and torch.equal(grads[1], grads[3])  # twins
    names = [t.name for t in r.tensors]
    _, _, over = diagnose.cast_thresholds("float16")
    seen = set()
    for k in range(-40, 24):
        alt = r.scale_view(k)[0].alt
        below = [int(((g != 0) & (g * 2.0**k < 2.0**-14)).sum()) / int((g != 0).sum())
                 for g in grads]
        ovf = [int((g * 2.0**k >= over).sum()) / int((g != 0).sum()) for g in grads]
        if max(below) > 0:
            assert _highest_bars(below, names) in alt
            seen.add(("below", below.count(max(below))))
        if max(ovf) > 0:
            assert _largest_overflow(ovf, names) in alt
            seen.add(("overflow", ovf.count(max(ovf))))
    # a tensor and its twin tie (2), or all four tensors do (4): never one alone
    assert {n for _, n in seen} <= {2, 4}
    assert {("below", 2), ("below", 4), ("overflow", 2)} <= seen
    assert "(the 4 highest bars, 100.0% each: a.weight, a.bias, b.weight and 1 more)" in \
        r.scale_view(-40)[0].alt  # every entry of every tensor below the floor


def test_scale_view_labels_at_most_48_ticks_on_big_models():
    torch.manual_seed(0)
    m = torch.nn.Sequential(*[torch.nn.Linear(4, 4) for _ in range(30)])  # 60 tensors
    r = diagnose.gradients(m, lambda out: out.square().sum(), torch.randn(2, 4))
    ax = r.scale_view(0)[1].axes[0]
    names = [t.name for t in r.tensors]
    ticks = [t.get_text() for t in ax.get_xticklabels()]
    assert len(names) == 60 and ticks == names[::2]


def test_scale_view_alt_text_states_each_frames_counts():
    import re

    from precisionlab import widgets

    m, x, loss_fn = _cnn_case(factor=1.0)
    r = diagnose.gradients(m, loss_fn, x, tail=0.01)
    grads = [g.abs().double() for g in _direct_grads(m, x, loss_fn)]
    names = [t.name for t in r.tensors]
    _, _, over = diagnose.cast_thresholds("float16")
    ks = list(range(-8, 44, 4))
    view = widgets.interactive(r.scale_view, {"scale_exp": ks}, scale_exp=0)
    fr = view.frames()
    alts = [fr["alts"][f] for f, _ in fr["frames"]]
    counts = []
    for k, alt in zip(ks, alts, strict=True):
        below = [int(((g != 0) & (g * 2.0**k < 2.0**-14)).sum()) / int((g != 0).sum())
                 for g in grads]
        ovf = [int((g * 2.0**k >= over).sum()) / int((g != 0).sum()) for g in grads]
        low, red = sum(b > 0 for b in below), sum(o > 0 for o in ovf)
        assert alt == r.scale_view(k)[0].alt and f"at loss scale 2^{k}." in alt
        assert f"{low} of {len(grads)} tensors have such entries" in alt
        assert f"; {red} of {len(grads)} have an entry that overflows" in alt
        assert ("(red, with a stem)" in alt) == (red > 0)
        if low:
            assert _highest_bars(below, names) in alt
        if red:
            assert _largest_overflow(ovf, names) in alt
        else:
            assert "largest overflow" not in alt
        counts.append((low, red))
    assert len(set(counts)) >= 4  # the sweep crosses both floors and the overflow
    assert len(set(alts)) == len(ks)  # each frame is described, not the default one
    img = re.search(r'<img class="pl-frame" alt="([^"]*)"', view.static_html()).group(1)
    assert img.endswith(alts[ks.index(0)].replace("'", "&#x27;"))


class _Probe(torch.nn.Module):
    """loss = sum(p * x): the gradient of p is the batch x itself."""

    def __init__(self):
        super().__init__()
        self.p = torch.nn.Parameter(torch.zeros(2, 8))

    def forward(self, x):
        return (self.p * x).sum()


def test_scale_view_counts_an_entry_exactly_at_the_overflow_threshold():
    import matplotlib.colors as mcolors

    from precisionlab.diagnose.report import fmt_share

    # |g| 2^20 = 65520 = 65504 + ulp(65504)/2: a tie that float16 rounds to inf (torch's cast
    # is the oracle); at 2^19 it stays finite. The report counts float16 only under formats.
    x = torch.full((2, 8), 2.0**-12)
    x[1, 3] = -65520 * 2.0**-20
    share = int(torch.isinf((x * 2.0**20).half()).sum()) / x.numel()
    assert share > 0
    assert not torch.isinf((x * 2.0**19).half()).any()
    for formats in (("float16", "bfloat16"), ("bfloat16",)):
        r = diagnose.gradients(_Probe(), lambda out: out, x, formats=formats)
        table, fig = r.scale_view(20, "float16")
        rows = dict(table.rows)
        assert rows["tensors with an overflowing entry"] == "1 of 1"
        assert "; 1 of 1 have an entry that overflows (red, with a stem)" in table.alt
        ax = fig.axes[0]
        assert mcolors.to_hex(ax.patches[0].get_facecolor()) == "#d55e00"
        (stem,) = ax.collections[0].get_segments()
        if "float16" in formats:  # counted: the share (1 of 16 entries), drawn as it is
            assert stem[1][1] == share and rows["nonzero gradients that overflow"] == \
                fmt_share(share)
            assert f"the largest overflow share {fmt_share(share)} (p)" in table.alt
        else:  # not counted: the share is unknown, the stem has the least height
            assert stem[1][1] == 0.05 and "largest overflow share" not in table.alt
            assert "nonzero gradients that overflow" not in rows
        quiet = r.scale_view(19, "float16")
        assert dict(quiet[0].rows)["tensors with an overflowing entry"] == "0 of 1"
        assert not quiet[1].axes[0].collections


def _special_values(scale_exp, fmts):
    """float32 values around every threshold of fmts at loss scale 2^scale_exp, with zeros,
    subnormals, infinities and NaN."""
    from precisionlab.diagnose import cast_thresholds
    vals = [0.0, -0.0, 2.0**-149, 3 * 2.0**-149, 2.0**-126, 2.0**-127 * 1.5, math.inf,
            -math.inf, math.nan, 3.4e38, 1.0, -1.0]
    for f in fmts:
        for c in cast_thresholds(f):
            t = np.float64(c) / 2.0**scale_exp
            if 2.0**-149 <= t <= 3.4e38:
                x = np.float32(t)
                vals += [float(x), float(np.nextafter(x, np.float32(0))),
                         float(np.nextafter(x, np.float32(np.inf)))]
    return torch.tensor(vals, dtype=torch.float32)


@pytest.mark.parametrize("scale_exp", [-140, -20, 0, 12, 40, 150])
def test_compiled_counts_equal_the_float64_counts(scale_exp):
    """The compiled pass over float32 bit patterns gives count_torch's counts exactly: every
    threshold and its float32 neighbours, subnormals, inf, NaN, big and small tensors."""
    from precisionlab.diagnose.gradients import count_compiled, count_torch
    from precisionlab.formats import get_format
    fmts = [get_format(f) for f in ("float16", "bfloat16", "float8_e5m2", "float32")]
    g = torch.Generator().manual_seed(scale_exp + 200)
    wide = (torch.randn(70_000, generator=g) * 2.0 ** torch.randint(-160, 120, (70_000,),
                                                                    generator=g)).float()
    special = _special_values(scale_exp, fmts)
    wide[:special.numel()] = special
    tensors = [wide, special, torch.zeros(0), torch.zeros(5), torch.full((3,), math.nan),
               torch.randn(4, 5, generator=g) * 1e-6]
    scale = 2.0**scale_exp
    for got, t in zip(count_compiled(tensors, scale, fmts), tensors, strict=True):
        want = count_torch(t, scale, fmts)
        for a, b in zip(got[:7], want[:7], strict=True):
            assert a == b
        assert np.array_equal(got[7], want[7])
        assert all(np.array_equal(got[8][k], want[8][k]) for k in want[8])


def test_a_bfloat16_model_is_counted_from_float32_gradients():
    """A bfloat16 model's backward runs on a float32 copy (its bfloat16 images cast up,
    exactly): the counts are those of the float32 gradients a direct float32 backward of the
    same weights gives, the model itself is left as it was, and the summary says so."""
    m, x, loss_fn = _cnn_case()
    low = m.to(torch.bfloat16)
    xb = x.to(torch.bfloat16)
    r = diagnose.gradients(low, lambda out: loss_fn(out.float()), xb)
    assert all(p.dtype == torch.bfloat16 and p.grad is None for p in low.parameters())
    f32 = copy.deepcopy(low).float()
    grads = torch.autograd.grad(loss_fn(f32(xb.float())), list(f32.parameters()))
    assert all(g.dtype == torch.float32 for g in grads)
    for t, g in zip(r.tensors, grads, strict=True):
        c = g.to(torch.float16)
        assert t.flushed["float16"] == int(((g != 0) & (c == 0)).sum()) and t.numel == g.numel()
        assert t.max_abs == float(g.abs().max())
    assert r.total("flushed", "float16") > 0
    assert "float32 copy of the bfloat16 model" in r.summary()
    # float32 images: cast_inputs=True rounds them to the model's bfloat16 first
    rc = diagnose.gradients(low, lambda out: loss_fn(out.float()), x, cast_inputs=True)
    assert [t.flushed for t in rc.tensors] == [t.flushed for t in r.tensors]


# ---- forward activations (forward=True): leaf outputs against each format's range
_EDGES = [1.0, 65504.0, 65519.99609375, 65520.0, -7e4, 3.3e38, 1e-8]  # float16 rounds 65520 up


def _planted(values):
    """A one-layer model whose output is exactly `values` (identity weight, no bias), then a
    ReLU and a small head: the planted activations pass 65504 or not."""
    n = len(values)
    model = nn.Sequential(nn.Linear(n, n, bias=False), nn.ReLU(), nn.Linear(n, 1))
    with torch.no_grad():
        model[0].weight.copy_(torch.eye(n))
        model[2].weight.fill_(1e-3)
    return model, torch.tensor([values], dtype=torch.float32)


@pytest.mark.parametrize("fmt", ["float16", "bfloat16", "float8_e5m2"])
def test_forward_activations_overflow_counted_against_torchs_own_cast(fmt):
    model, x = _planted(_EDGES)
    r = diagnose.gradients(model, lambda out: out.sum(), x, formats=(fmt,))
    dt = getattr(torch, fmt)
    with torch.no_grad():
        h = model[0](x)
        outs = {"0": h, "1": torch.relu(h), "2": model(x)}
    assert [t.name for t in r.forward] == ["0", "1", "2"]
    for t in r.forward:
        v = outs[t.name]
        oracle = int((torch.isinf(v.to(dt)) & torch.isfinite(v)).sum())  # the cast itself
        assert t.kind == "forward" and t.overflow[fmt] == oracle
        assert t.max_abs == float(v.abs().max())
    total = sum(t.overflow[fmt] for t in r.forward)
    assert r.forward_overflow(fmt) == (total, sum(1 for t in r.forward if t.overflow[fmt]))
    if fmt == "float16":  # 65520, -7e4 and 3.3e38 overflow, 65519.996 rounds down to 65504;
        # the ReLU keeps the positive two; the head's 1e-3 x 3.3e38 overflows too
        assert [t.overflow["float16"] for t in r.forward] == [3, 2, 1]
        assert r.forward_headroom("float16") == pytest.approx(math.log2(65504 / 3.3e38),
                                                              rel=1e-6)


def test_forward_activations_that_fit_and_the_report_lines():
    model, x = _planted([1.0, -60000.0, 65504.0, 2.0])
    fit = diagnose.gradients(model, lambda out: out.sum(), x)
    assert fit.forward_overflow("float16") == (0, 0)
    assert fit.forward_headroom("float16") == 0.0  # 65504 itself is the top
    assert "float16: 0 values overflow (in 0 outputs), headroom 0.0 binades" in fit.summary()
    assert ["inf/NaN in the forward", "fp16 forward ovf 0 in 0", "-"] in fit.fixes().rows
    big, xb = _planted([1.0, 7e4, 2.0, 3.0])
    over = diagnose.gradients(big, lambda out: out.sum(), xb)
    assert over.forward_overflow("float16") == (2, 2)  # the linear's and the ReLU's 7e4
    assert ["inf/NaN in the forward", "fp16 forward ovf 2 in 2",
            "bfloat16, or float32 there"] in over.fixes().rows
    text = over.forward_table().to_text()
    assert text.splitlines()[0].split() == ["output", "max|x|", "fp16", "ovf", "fp16", "hr",
                                            "bf16", "ovf", "bf16", "hr"]
    assert "-0.1" in text  # log2(65504 / 7e4) = -0.096 binades
    # the parameter gradients are those of forward=False, which counts no forward
    off = diagnose.gradients(big, lambda out: out.sum(), xb, forward=False)
    assert off.forward == () and "forward" not in off.summary()
    assert [t.overflow for t in off.tensors] == [t.overflow for t in over.tensors]
    with pytest.raises(ValueError, match="forward must be True or False; got forward='yes'"):
        diagnose.gradients(big, lambda out: out.sum(), xb, forward="yes")


def test_forward_counts_of_a_gpt2_built_from_a_config_against_torchs_casts():
    """A real transformers model (GPT-2, 2 layers, from a config; no weights downloaded), its
    second MLP's weights scaled so that some activations pass 65504: every leaf output's
    overflow count per format is what torch's own cast makes inf, and max|x| and the headroom
    are the values themselves."""
    transformers = pytest.importorskip("transformers")
    from precisionlab.diagnose.batch import tensors
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=101,
                                  n_positions=32, bos_token_id=0, eos_token_id=0,
                                  attn_pdrop=0.0, resid_pdrop=0.0, embd_pdrop=0.0)
    model = transformers.GPT2LMHeadModel(cfg).eval()
    with torch.no_grad():
        model.transformer.h[1].mlp.c_fc.weight.mul_(2e5)
    ids = torch.randint(0, 101, (2, 16))
    r = diagnose.gradients(model, lambda out: out.logits.float().logsumexp(-1).mean(), (ids,))
    seen = []  # the oracle: each leaf module's output of a plain forward, in call order
    hooks = [m.register_forward_hook(lambda m, a, o, n=n: seen.append((n, o)))
             for n, m in model.named_modules() if next(iter(m.children()), None) is None]
    with torch.no_grad():
        model(ids)
    for h in hooks:
        h.remove()
    outs = [(n, t) for n, o in seen for t in tensors(o) if t.is_floating_point()]
    assert [t.name.split("#")[0].split("[")[0] for t in r.forward] == [n for n, _ in outs]
    total = 0
    for t, (_, x) in zip(r.forward, outs, strict=True):
        assert t.numel == x.numel() and t.max_abs == float(x.abs().max())
        for fmt, dt in (("float16", torch.float16), ("bfloat16", torch.bfloat16)):
            assert t.overflow[fmt] == int((~torch.isfinite(x.to(dt))).sum()), (t.name, fmt)
        total += t.overflow["float16"]
    assert total > 0 and r.forward_overflow("bfloat16") == (0, 0)  # the planted overflow
    amax = max(float(x.abs().max()) for _, x in outs)
    assert r.forward_headroom("float16") == pytest.approx(math.log2(65504 / amax), abs=1e-12)


def _png(fig) -> bytes:
    import io

    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=60)
    return buf.getvalue()


def test_scale_figures_drawn_on_a_copy_match_one_drawn_afresh():
    """Inside plotting.figure_copies (an explorer's frames) scale_figure copies the empty figure
    of a tensor list it has drawn before: the same pixels as a figure made from nothing, and
    no copy once rcParams have changed."""
    import matplotlib as mpl

    from precisionlab.diagnose.scale_view import scale_figure
    from precisionlab.plotting import figure_copies

    names = tuple(f"block.{i}.weight" for i in range(30))
    a = ([0.1] * 30, [False] * 30, [None] * 30)
    b = ([i / 40 for i in range(30)], [i % 7 == 0 for i in range(30)],
         [0.01 * i if i % 7 == 0 else None for i in range(30)])
    with figure_copies():
        scale_figure(names, *a, "float16", 0)  # drawn once: later figures of these names copy it
        copy = scale_figure(names, *b, "float16", 8)
        with mpl.rc_context({"axes.labelsize": 17.0}):
            assert scale_figure(names, *b, "float16", 8).axes[0].xaxis.label.get_size() == 17.0
    assert _png(copy) == _png(scale_figure(names, *b, "float16", 8))  # outside: made afresh


def test_scale_figures_are_not_copied_after_an_rcparams_list_changes_in_place():
    import matplotlib as mpl

    from precisionlab.diagnose.scale_view import scale_figure
    from precisionlab.plotting import figure_copies

    names = tuple(f"layer{i}.bias" for i in range(12))
    data = ([0.2] * 12, [False] * 12, [None] * 12)
    family = mpl.rcParams["font.family"]
    with figure_copies():
        scale_figure(names, *data, "bfloat16", 4)
        family.insert(0, "serif")  # the same list, changed in place
        try:
            label = scale_figure(names, *data, "bfloat16", 4).axes[0].xaxis.label
            assert label.get_fontfamily()[0] == "serif"
        finally:
            family.remove("serif")
