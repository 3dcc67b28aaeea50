"""diagnose.watch over a training loop: the first inf/NaN named at its step with the mechanism
that fits (overflow, a softmax of -inf rows, log of 0, a division by a zero norm, a scaled
gradient overflow under GradScaler), the cast shares against an independent oracle (numpy on
float64 copies, thresholds from ml_dtypes.finfo, and ml_dtypes' own casts), bad input, and
the run's bits unchanged by the watch."""

from __future__ import annotations

import json
import math
from collections import OrderedDict

import matplotlib
import ml_dtypes
import numpy as np
import pytest
import torch
from torch import nn

from precisionlab import diagnose
from precisionlab.diagnose.watch_counts import cast_bounds, tensor_counts

matplotlib.use("Agg")
FORMATS = ("float16", "bfloat16", "float8_e4m3fn", "float8_e5m2")


def _overflow_model(w0: float) -> nn.Module:
    model = nn.Sequential(OrderedDict(fc=nn.Linear(1, 1, bias=False), act=nn.ReLU())).half()
    with torch.no_grad():
        model.fc.weight.fill_(w0)
    return model


def _overflow_run(w0: float, steps: int, **kw):
    """float16 SGD on loss = -out: the weight grows by lr * 256 = 4 a step, exactly, and the
    output 256 w passes 65504 (rounds to inf from 65520) once w = 257."""
    model = _overflow_model(w0)
    opt = torch.optim.SGD(model.parameters(), lr=1 / 64)
    x = torch.full((1, 1), 256.0, dtype=torch.float16)
    with diagnose.watch(model, **kw) as w:
        for _ in range(steps):
            opt.zero_grad()
            loss = -model(x).sum()
            loss.backward()
            opt.step()
            w.step(loss)
    return w, model


def test_float16_overflow_is_caught_at_the_step_it_happens():
    # w_t = 1 + 4 t: 256 w_63 = 64768 is finite, 256 w_64 = 65792 overflows
    w, _ = _overflow_run(1.0, 66, every=50, formats=("float16",))
    report = w.report
    ev = report.first_nonfinite
    assert (ev.step, ev.phase, ev.module, ev.op) == (64, "forward", "fc", "fc: linear#0")
    assert ev.mechanism == "overflow" and ev.chapter == 1
    assert "65504" in ev.detail
    weight = next(r for r in ev.inputs if r.name == "fc.weight")
    assert weight.max == 257.0 and ev.inputs[0].max == 256.0 and ev.output.inf == 1
    assert [e.step for e in report.events] == [64, 65]
    # statistics on steps 0 and 50: headroom log2(65504 / 256 w)
    acts = [r for r in report.records if r.kind == "activation" and r.module == "fc"]
    assert [r.step for r in acts] == [0, 50]
    assert acts[1].amax == 256 * 201
    assert acts[1].headroom("float16") == pytest.approx(math.log2(65504 / (256 * 201)))
    grads = [r for r in report.records if r.kind == "param grad"]
    assert [g.amax for g in grads] == [256.0, 256.0]
    assert "step 64, forward, fc: linear#0" in report.first_nonfinite.headline()
    for text in (report.summary(), report.first_nonfinite.describe(),
                 report.table().to_text()):  # the book's 80 columns
        assert all(len(line) <= 80 for line in text.splitlines()), text


def test_raise_halts_at_the_first_nonfinite_and_dump_saves_the_inputs(tmp_path):
    with pytest.raises(diagnose.NonFiniteError) as err:
        _overflow_run(249.0, 5, every=1, formats=("float16",), on_nonfinite="raise")
    assert err.value.event.step == 2 and err.value.event.mechanism == "overflow"
    w, _ = _overflow_run(249.0, 3, every=1, formats=("float16",), on_nonfinite="dump",
                         log_dir=tmp_path)
    ev = w.report.first_nonfinite
    saved = torch.load(ev.dump)
    assert saved["step"] == 2 and saved["module"] == "fc" and saved["class"] == "Linear"
    replayed = nn.functional.linear(saved["args"][0], saved["state_dict"]["weight"])
    assert torch.isinf(replayed).all()
    lines = [json.loads(s) for s in (tmp_path / "watch.jsonl").read_text().splitlines()]
    assert {d["type"] for d in lines} >= {"stats", "nonfinite", "loss"}
    assert next(d for d in lines if d["type"] == "nonfinite")["mechanism"] == "overflow"


class _Attention(nn.Module):
    def __init__(self):
        super().__init__()
        self.q = nn.Linear(4, 4)

    def forward(self, x, mask):
        s = self.q(x) @ x.transpose(-1, -2)
        return torch.softmax(s.masked_fill(~mask, -math.inf), dim=-1) @ x


class _Head(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(4, 2)

    def forward(self, x):
        return torch.log(torch.softmax(self.proj(x), dim=-1))


class _Norm(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x):
        y = self.lin(x)
        return y / y.norm(dim=-1, keepdim=True)


def test_softmax_over_a_fully_masked_row_is_named():
    torch.manual_seed(0)
    model = nn.Sequential(OrderedDict(attn=_Attention()))
    x = torch.randn(3, 4)
    mask = torch.ones(3, 3, dtype=torch.bool)
    partial = mask.clone()
    partial[0, 1:] = False  # one key left: finite
    full = mask.clone()
    full[1] = False  # no key left: 0/0
    with diagnose.watch(model, every=1) as w:
        for m in (mask, partial, full):
            model[0](x, m).sum().backward()
            w.step()
    (ev,) = w.report.events
    assert (ev.step, ev.op, ev.mechanism, ev.chapter) == (2, "attn: softmax#0",
                                                         "softmax_masked_row", 7)
    assert "1 rows" in ev.detail


def test_log_of_zero_and_division_by_a_zero_norm_are_named():
    torch.manual_seed(0)
    head = nn.Sequential(OrderedDict(head=_Head()))
    with torch.no_grad():
        head.head.proj.weight.zero_()
        head.head.proj.bias.copy_(torch.tensor([0.0, -200.0]))  # softmax: [1, 0] in float32
    with diagnose.watch(head, every=1) as w:
        head(torch.randn(2, 4))
        w.step()
    ev = w.report.first_nonfinite
    assert (ev.op, ev.mechanism, ev.chapter) == ("head: log#0", "log_zero", 4)

    norm = nn.Sequential(OrderedDict(norm=_Norm()))
    with torch.no_grad():
        norm.norm.lin.weight.zero_()
        norm.norm.lin.bias.zero_()
    with diagnose.watch(norm, every=1) as w:
        norm(torch.randn(2, 4))
        w.step()
    ev = w.report.first_nonfinite
    assert (ev.op, ev.mechanism, ev.chapter) == ("norm: div#0", "div_underflowed_norm",
                                                 4)


class _Scores(nn.Module):
    """Attention whose scores are computed in its own code, between its two children."""

    def __init__(self):
        super().__init__()
        self.qk, self.out = nn.Linear(4, 8), nn.Linear(4, 4)

    def forward(self, x):
        q, k = self.qk(x).chunk(2, dim=-1)
        return self.out(torch.softmax(q @ k.transpose(-1, -2), dim=-1) @ x)


def test_an_inf_made_by_a_parent_modules_own_code_is_named_there():
    # float16 scores past 65504, computed in the attention module's own code: the first module
    # output that is not finite is its child `out`'s (NaN in, from the softmax of inf rows);
    # the watch names the product that overflowed, not `out` with "the batch is not finite"
    torch.manual_seed(0)
    model = nn.Sequential(OrderedDict(attn=_Scores())).half()
    with torch.no_grad():
        model.attn.qk.weight.fill_(1.0)
        model.attn.qk.bias.zero_()
    x = torch.full((1, 3, 4), 100.0, dtype=torch.float16)  # q = k = 400: q.k = 640000
    with diagnose.watch(model, every=1, formats=("float16",)) as w:
        model(x)
        w.step()
    (ev,) = w.report.events
    assert (ev.step, ev.op, ev.mechanism) == (0, "attn: matmul#0", "overflow")
    assert ev.module == "attn"
    with pytest.raises(diagnose.NonFiniteError) as err, diagnose.watch(
            model, every=1, formats=("float16",), on_nonfinite="raise"):
        model(x)  # raised when the attention's forward ends, with the product named
    assert err.value.event.op == "attn: matmul#0"
    # an inf made between two modules in no_grad code of the model itself
    class Between(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = nn.Linear(2, 2), nn.Linear(2, 1)

        def forward(self, x):
            with torch.no_grad():
                h = self.a(x)
            return self.b(h * 1e30)
    torch.manual_seed(0)
    m = Between()
    with diagnose.watch(m, every=1) as w:
        m(torch.full((1, 2), 1e10)).sum().backward()
        w.step()
    ev = w.report.first_nonfinite
    assert (ev.op, ev.mechanism) == ("mul#0", "overflow")
    # a NaN in the batch is still the batch's
    seq = nn.Sequential(nn.Linear(3, 3), nn.Tanh())
    with diagnose.watch(seq, every=1) as w:
        seq(torch.tensor([[1.0, math.nan, 0.0]]))
        w.step()
    ev = w.report.first_nonfinite
    assert (ev.op, ev.mechanism) == ("0: linear#0", "nonfinite_input")


def test_gradscaler_skipped_steps_are_each_explained():
    torch.manual_seed(0)
    model = nn.Linear(4, 4)
    opt = torch.optim.SGD(model.parameters(), lr=1e-4)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**16)
    x = torch.randn(8, 4)
    seen = []  # the oracle: the scale before and after each update
    with diagnose.watch(model, every=2, scaler=scaler, optimizer=opt) as w:
        for _ in range(12):
            opt.zero_grad()
            with torch.autocast("cpu", dtype=torch.float16):
                loss = model(x).float().pow(2).sum()
            scaler.scale(loss).backward()
            before = scaler.get_scale()
            scaler.step(opt)
            scaler.update()
            seen.append((before, scaler.get_scale()))
            w.step(loss)
    report = w.report
    skipped = [i for i, (a, b) in enumerate(seen) if b < a]
    assert skipped == [0, 1, 2, 3]  # 2^16 .. 2^13: the float16 weight gradient overflows
    assert [s.step for s in report.skips] == skipped
    for s in report.skips:
        assert (s.scale, s.new_scale) == seen[s.step]
        assert s.tensor in ("weight", "bias") and s.nonfinite > 0
        assert s.event is not None and s.event.mechanism == "scaled_grad_overflow"
        assert s.event.chapter == 5 and s.event.phase == "backward"
    assert report.steps == 12 and [v for _, v in report.scales] == [a for a, _ in seen]
    assert len(report.losses) == 12
    assert "steps skipped by the GradScaler" in report.summary()
    assert "update" not in vars(scaler)  # the scaler's own update is back


def _oracle(x32: np.ndarray, fmt: str):
    """(flushed, subnormal, overflow) of float32 values: thresholds from ml_dtypes.finfo on
    float64 copies, and the same from ml_dtypes' own cast."""
    dt = getattr(ml_dtypes, fmt) if fmt != "float16" else np.float16
    fi = ml_dtypes.finfo(dt)
    q, n, top = float(fi.smallest_subnormal), float(fi.smallest_normal), float(fi.max)
    ulp = 2.0 ** (math.floor(math.log2(top)) - fi.nmant)
    a = np.abs(x32.astype(np.float64))
    tie_up = int(top / ulp) % 2 == 1
    over = (a > top + ulp / 2) | ((a == top + ulp / 2) & tie_up)
    by_threshold = (int(((a > 0) & (a <= q / 2)).sum()),
                    int(((a > q / 2) & (a < n - q / 2)).sum()), int(over.sum()))
    y = np.abs(x32.astype(dt).astype(np.float64))
    by_cast = (int(((a > 0) & (y == 0)).sum()), int(((y > 0) & (y < n)).sum()),
               int((~np.isfinite(y) & np.isfinite(a)).sum() + np.isinf(a).sum()))
    return by_threshold, by_cast


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_shares_match_an_independent_oracle(dtype):
    rng = np.random.default_rng(0)
    x = np.sign(rng.standard_normal(20000)) * 10.0 ** rng.uniform(-45, 38, 20000)
    edges = []
    for f in FORMATS:
        fi = ml_dtypes.finfo(getattr(ml_dtypes, f) if f != "float16" else np.float16)
        ulp = 2.0 ** (math.floor(math.log2(float(fi.max))) - fi.nmant)
        for e in (float(fi.smallest_subnormal) / 2,
                  float(fi.smallest_normal) - float(fi.smallest_subnormal) / 2,
                  float(fi.max) + ulp / 2, float(fi.max)):
            e32 = np.float32(e)
            edges += [e32, np.nextafter(e32, np.float32(0)), np.nextafter(e32, np.float32(1e38))]
    with np.errstate(over="ignore"):
        x = np.concatenate([x, edges, [0.0, np.inf, -np.inf]]).astype(np.float32)
    t = torch.from_numpy(x).to(dtype)
    x32 = t.float().numpy()  # the values the tensor holds
    amax, c = tensor_counts(t, cast_bounds(FORMATS))
    assert amax == math.inf and c[0] == x.size and c[1] == np.isinf(x32).sum() >= 2
    assert c[2] == (x32 == 0).sum()
    for k, f in enumerate(FORMATS):
        by_threshold, by_cast = _oracle(x32, f)
        got = tuple(int(v) for v in c[3 + 3 * k:6 + 3 * k])
        assert got == by_threshold == by_cast, f


def test_nan_is_counted_apart_from_the_shares():
    t = torch.tensor([float("nan"), 0.0, 1e-8, 1e5])
    amax, c = tensor_counts(t, cast_bounds(["float16"]))
    assert math.isnan(amax) and c.tolist() == [4, 1, 1, 1, 0, 1]


def test_bad_input_names_the_argument_value_and_choices():
    model = nn.Linear(2, 2)
    with pytest.raises(ValueError, match="model has no parameters"):
        diagnose.watch(nn.ReLU())
    other = torch.optim.SGD(nn.Linear(2, 2).parameters(), lr=0.1)
    with pytest.raises(ValueError, match="optimizer holds none of model's parameters"):
        diagnose.watch(model, optimizer=other)
    with pytest.raises(ValueError, match=r"every must be an integer >= 1; got every=0"):
        diagnose.watch(model, every=0)
    with pytest.raises(ValueError, match=r"formats: unknown format 'fp12'; valid choices: .*"
                                         "float16, bfloat16"):
        diagnose.watch(model, formats=("float16", "fp12"))
    with pytest.raises(ValueError, match="formats: unknown format 'float8_e8m0fnu'"):
        diagnose.watch(model, formats=("float8_e8m0fnu",))
    with pytest.raises(ValueError, match="unknown on_nonfinite 'halt'; valid choices: record, "
                                         "raise, dump"):
        diagnose.watch(model, on_nonfinite="halt")
    with pytest.raises(ValueError, match="log_dir=None"):
        diagnose.watch(model, on_nonfinite="dump")
    with pytest.raises(ValueError, match=r"scaler must be a torch\.amp\.GradScaler"):
        diagnose.watch(model, scaler=object())


def _train(watched: bool, tmp_path=None) -> list[torch.Tensor]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.LayerNorm(16), nn.Dropout(0.1),
                          nn.Linear(16, 4))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    gen = torch.Generator().manual_seed(1)
    ctx = diagnose.watch(model, every=2, optimizer=opt, log_dir=tmp_path) if watched else None
    if ctx is not None:
        ctx.__enter__()
    for _ in range(5):
        x = torch.randn(6, 8, generator=gen)
        opt.zero_grad()
        loss = model(x).pow(2).mean()
        loss.backward()
        opt.step()
        if ctx is not None:
            ctx.step(loss)
    if ctx is not None:
        ctx.__exit__(None, None, None)
        assert ctx.report.steps == 5 and len({r.step for r in ctx.report.records}) == 3
    return [p.detach().clone() for p in model.parameters()]


def test_the_watch_never_changes_the_runs_bits(tmp_path):
    plain, watched = _train(False), _train(True, tmp_path)
    for a, b in zip(plain, watched, strict=True):
        assert torch.equal(a.view(torch.int32), b.view(torch.int32))


def test_report_prints_a_table_and_plots_headroom():
    w, _ = _overflow_run(1.0, 66, every=10, formats=("float16", "bfloat16"))
    report = w.report
    text = str(report)
    assert "fp16\nhr" in report.table().headers[3] or "fp16 hr" == report.table().headers[3]
    assert "bf16" in text and "ovf" in text and "fc     param grad" in text
    assert "overflow" in report.events_table().to_text()
    ax = report.plot()
    assert ax.get_ylabel() == "headroom in fp16 (binades)" and ax.lines
    steps, hr = report.series("fc", "activation")
    assert list(steps) == [0, 10, 20, 30, 40, 50, 60] and np.all(np.diff(hr) < 0)
    matplotlib.pyplot.close("all")
    with pytest.raises(ValueError, match="valid choices: float16, bfloat16"):
        report.plot(fmt="float8_e5m2")


def test_tensorboard_event_files_read_back_by_tensorboards_own_reader(tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    w, _ = _overflow_run(1.0, 3, every=1, formats=("float16",), log_dir=tmp_path,
                         tensorboard=True)
    (events_file,) = tmp_path.glob("events.out.tfevents.*")
    acc = EventAccumulator(str(events_file))
    acc.Reload()
    tags = set(acc.Tags()["scalars"])
    assert {"loss", "amax/activation/fc", "headroom_float16/activation/fc",
            "amax/param_grad/fc"} <= tags
    report = w.report
    for kind, tag in (("activation", "activation"), ("param grad", "param_grad")):
        rows = [r for r in report.records if r.module == "fc" and r.kind == kind]
        got = [(e.step, e.value) for e in acc.Scalars(f"amax/{tag}/fc")]
        assert got == [(r.step, pytest.approx(r.amax)) for r in rows]  # float32 in the file
        hr = [(e.step, e.value) for e in acc.Scalars(f"headroom_float16/{tag}/fc")]
        assert hr == [(r.step, pytest.approx(r.headroom("float16"), rel=1e-6)) for r in rows]
    assert [(e.step, e.value) for e in acc.Scalars("loss")] == [
        (s, pytest.approx(v)) for s, v in report.losses]


def test_tensorboard_output_asked_for_without_the_package_names_what_to_install(
        tmp_path, monkeypatch):
    import importlib.util
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "tensorboard" else find_spec(name, *a))
    model = _overflow_model(1.0)
    with pytest.raises(ImportError, match=r"pip install tensorboard"):
        diagnose.watch(model, log_dir=tmp_path, tensorboard=True)
    with diagnose.watch(model, every=1, log_dir=tmp_path) as w:  # not asked for: no error
        model(torch.ones(1, 1, dtype=torch.float16))
        w.step()
    assert (tmp_path / "watch.jsonl").read_text() and not list(tmp_path.glob("events.*"))
    with pytest.raises(ValueError, match=r"tensorboard=True .* got log_dir=None"):
        diagnose.watch(model, tensorboard=True)
    with pytest.raises(ValueError, match="tensorboard must be True or False; got "
                                         "tensorboard='yes'"):
        diagnose.watch(model, log_dir=tmp_path, tensorboard="yes")
