"""The watch's cheap steps (`watch_guard`): a step without statistics checks only the model's
outputs and the gradients, and replays the step with every module hooked when one is not
finite. The oracle is the same run watched with check="modules" (every module, every step):
the events must be the same, field for field, forward and backward, under dropout and batch
norm (the replay restores the generators and the buffers), and the run's bits unchanged."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from precisionlab import diagnose
from precisionlab.diagnose.watch_guard import same_bits


def _events(w):
    return [{k: v for k, v in e.to_dict().items() if k != "dump"} for e in w.report.events]


def _run(make, batches, check, loss_fn=lambda out: out.float().pow(2).mean(), opt=True):
    """Train a fresh model (seed 0) on the batches, statistics on step 0 only; return the
    watch and the final parameters."""
    torch.manual_seed(0)
    model = make()
    sgd = torch.optim.SGD(model.parameters(), lr=1e-3)
    with diagnose.watch(model, every=10**6, check=check) as w:
        for x in batches:
            sgd.zero_grad()
            loss = loss_fn(model(x))
            loss.backward()
            if opt:
                sgd.step()
            w.step(loss)
    return w, [p.detach().clone() for p in model.parameters()]


def _same_run(make, batches, **kw):
    cheap, p_cheap = _run(make, batches, "outputs", **kw)
    full, p_full = _run(make, batches, "modules", **kw)
    assert _events(cheap) == _events(full) and _events(cheap)
    for a, b in zip(p_cheap, p_full, strict=True):
        assert torch.equal(a, b) or (torch.isnan(a).all() and torch.isnan(b).all())
    return cheap.report.events


class _Attention(nn.Module):
    def __init__(self):
        super().__init__()
        self.q = nn.Linear(4, 4)

    def forward(self, x):
        s = self.q(x) @ x.transpose(-1, -2)
        mask = torch.ones_like(s, dtype=torch.bool)
        if x[0, 0, 0] > 10:  # this batch masks every key of the first query
            mask[:, 0] = False
        return torch.softmax(s.masked_fill(~mask, -math.inf), dim=-1) @ x


def test_a_fully_masked_row_at_a_cheap_step_is_named_as_by_every_module():
    x = torch.randn(1, 3, 4)
    (ev, *_) = _same_run(_Attention, [x, x, x + 20, x], opt=False)
    assert (ev.step, ev.op, ev.mechanism) == (2, "softmax#0", "softmax_masked_row")


def test_an_overflow_under_dropout_and_batch_norm_is_named_and_the_bits_kept():
    def make():
        m = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.Dropout(0.5), nn.Linear(8, 4))
        with torch.no_grad():
            m[0].weight.fill_(0.5)
        return m
    gen = torch.Generator().manual_seed(1)
    xs = [torch.randn(6, 4, generator=gen) for _ in range(5)]
    xs[3] = torch.full((6, 4), 3e38)  # 4 x 0.5 x 3e38 is past float32's largest, 3.4e38
    events = _same_run(make, xs)
    assert (events[0].step, events[0].op, events[0].mechanism) == (3, "0: linear#0",
                                                                    "overflow")
    # with no inf anywhere the watched run is the plain one, bit for bit
    xs[3] = xs[2]
    torch.manual_seed(0)
    plain = make()
    sgd = torch.optim.SGD(plain.parameters(), lr=1e-3)
    for x in xs:
        sgd.zero_grad()
        plain(x).pow(2).mean().backward()
        sgd.step()
    _, watched = _run(make, xs, "outputs")
    for a, b in zip(plain.parameters(), watched, strict=True):
        assert torch.equal(a.detach().view(torch.int32), b.view(torch.int32))


def test_a_gradient_that_overflows_in_the_backward_only_is_named_in_the_backward():
    def make():  # float16: the forward (w x, |w| < 1) fits, the weight gradient x * 1e4 not
        return nn.Sequential(nn.Linear(2, 1, bias=False)).half()
    small, big = (torch.full((1, 2), v, dtype=torch.float16) for v in (1.0, 100.0))
    events = _same_run(make, [small, small, big], opt=False,
                       loss_fn=lambda out: (out * 1e4).sum())
    ev = events[0]
    assert (ev.step, ev.phase, ev.mechanism) == (2, "backward", "grad_overflow")
    assert ev.op == "0: backward (gradient of 0.weight)"


def test_a_loss_that_is_not_finite_outside_the_model_is_named_there():
    def make():
        return nn.Sequential(nn.Linear(2, 2), nn.Softplus())
    x = torch.ones(1, 2)
    events = _same_run(make, [x, 1000 * x], opt=False,  # softplus(-1000) = 0: log(0) = -inf
                       loss_fn=lambda out: -out.log().sum())
    ev = events[0]
    assert ev.step == 1 and ev.phase == "backward" and ev.op.startswith("the loss, outside")


def test_an_inf_the_model_absorbs_is_seen_every_step_only_with_check_modules():
    class Clamped(nn.Module):  # the inf of the linear is clamped away before the output
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(2, 2)
            with torch.no_grad():
                self.fc.weight.fill_(1.0)

        def forward(self, x):
            return self.fc(x).clamp(-1, 1)
    x = torch.ones(1, 2)
    full, _ = _run(Clamped, [x, x * 1e38 * 3], "modules", opt=False)
    cheap, _ = _run(Clamped, [x, x * 1e38 * 3], "outputs", opt=False)
    assert [(e.step, e.op) for e in full.report.events] == [(1, "fc: linear#0")]
    assert cheap.report.events == ()  # reached neither the output nor a gradient


def test_a_replay_that_cannot_be_trusted_names_what_the_step_shows():
    class Doubled(nn.Module):  # x * 2 saves nothing of x for the backward
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(2, 1, bias=False)

        def forward(self, x):
            return self.fc(x * 2)
    torch.manual_seed(0)
    model = Doubled().half()
    x = torch.full((1, 2), 50.0, dtype=torch.float16)
    with diagnose.watch(model, every=10**6) as w:
        for _ in range(2):
            out = model(x)
            x.mul_(1)  # the input written in place between the forward and the backward
            (out * 1e4).sum().backward()
            w.step()
    first, second = w.report.events  # step 0 has every module hooked; step 1 replays
    assert first.op == "fc: backward (gradient of fc.weight)"
    assert second.step == 1 and second.phase == "backward"
    assert second.op == ("fc: backward (gradient of fc.weight) (a replay of the step did not "
                         "reproduce it: inputs written in place)")


def test_check_is_validated():
    with pytest.raises(ValueError, match=r"check.*'every'.*valid choices: outputs, modules"):
        diagnose.watch(nn.Linear(1, 1), check="every")


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64])
def test_all_finite_against_isfinite_on_hard_values(dtype):
    from precisionlab.diagnose.watch_guard import all_finite
    top = torch.finfo(dtype).max
    cases = [[top, top], [-top, top], [top] * 1000, [math.inf], [-math.inf, math.inf],
             [math.nan], [1.0, math.nan, top], [torch.finfo(dtype).tiny / 4, 0.0], []]
    gen = torch.Generator().manual_seed(0)
    for vals in cases:
        for other in ([], [torch.randn(70, generator=gen).to(dtype)]):
            ts = [torch.tensor(vals, dtype=dtype), *other]
            assert all_finite(ts) == all(bool(torch.isfinite(t).all()) for t in ts), vals
    mixed = [torch.full((3,), 60000.0, dtype=torch.float16), torch.tensor([3e38, 3e38]),
             torch.tensor([1e308, 1e308], dtype=torch.float64)]  # every sum overflows
    assert all_finite(mixed) and not all_finite([*mixed, torch.tensor([math.nan])])


def _plain_and_watched(make, xs, gen_seed, **watch_kw):
    """The final state_dict and generator state of a run without and with a watch."""
    out = []
    for watched in (False, True):
        torch.manual_seed(0)
        model = make(torch.Generator().manual_seed(gen_seed))
        sgd = torch.optim.SGD(model.parameters(), lr=1e-3)
        w = diagnose.watch(model, every=10**6, **watch_kw) if watched else None
        if w is not None:
            w.__enter__()
        for x in xs:
            sgd.zero_grad()
            model(x).float().pow(2).mean().backward()  # the backward needs BN's saved stats
            sgd.step()
            if w is not None:
                w.step()
        if w is not None:
            w.close()
        out.append((model.state_dict(), model.gen.get_state(), w))
    return out


class _NoisyNorm(nn.Module):
    """Batch norm, then noise drawn from a generator of the model's own."""

    def __init__(self, gen):
        super().__init__()
        self.gen = gen
        self.fc, self.bn = nn.Linear(4, 8), nn.BatchNorm1d(8)

    def forward(self, x):
        h = self.bn(self.fc(x))
        return h * (torch.rand(h.shape, generator=self.gen) > 0.3)


@pytest.mark.parametrize("bad_step", [1, 3])  # 1: the first guarded step, no buffer copied yet
@pytest.mark.parametrize("check", ["outputs", "modules"])
def test_a_replay_leaves_batch_norm_statistics_and_the_models_generator_alone(bad_step, check):
    gen = torch.Generator().manual_seed(2)
    xs = [torch.randn(6, 4, generator=gen) for _ in range(5)]
    xs[bad_step] = torch.full((6, 4), 3e38)  # the linear's or the norm's output overflows
    (plain, g_plain, _), (watched, g_watched, w) = _plain_and_watched(_NoisyNorm, xs, 5,
                                                                      check=check)
    assert w.report.events and w.report.events[0].step == bad_step
    assert torch.equal(g_plain, g_watched)  # the replay drew nothing from self.gen
    for (n, a), b in zip(plain.items(), watched.values(), strict=True):
        assert same_bits(a, b), n  # running_mean, running_var, num_batches_tracked included


def test_a_training_batch_norm_is_not_blamed_on_its_running_statistics():
    from precisionlab.diagnose.watch_cause import forward_mechanism
    x = torch.tensor([[3e38], [-3e38]])  # finite, but its variance overflows
    mean, var = torch.tensor([math.inf]), torch.ones(1)  # already updated with this batch
    out = torch.nn.functional.batch_norm(x, mean.clone(), var.clone(), training=True)
    mech, _ = forward_mechanism("batch_norm", (x, mean, var, None, None, True, 0.1, 1e-5),
                                {}, out)
    assert mech != "nonfinite_input"
    mech, _ = forward_mechanism("batch_norm", (x, mean, var, None, None, False, 0.1, 1e-5),
                                {}, out)
    assert mech == "nonfinite_input"  # in eval the running statistics are read


def test_an_untrusted_replay_names_the_losss_gradient_before_a_parameters():
    class Noisy(nn.Module):  # draws from its own generator: a replay cannot reproduce it
        def __init__(self):
            super().__init__()
            self.gen, self.fc = torch.Generator().manual_seed(0), nn.Linear(4, 4)

        def forward(self, x):
            return self.fc(x) * (torch.rand(4, generator=self.gen) + 1)
    torch.manual_seed(0)
    model = Noisy()
    with diagnose.watch(model, every=10**6) as w:
        for x in (torch.ones(2, 4), torch.full((2, 4), 1e14)):
            model(x).pow(4).sum().backward()  # 4 out**3 past 3.4e38: the loss's gradient inf
            w.step()
    (ev,) = w.report.events
    assert ev.step == 1 and ev.op.startswith("the loss, outside the model")
    assert "did not reproduce it: outputs differ" in ev.op


def test_a_float32_weight_gradient_overflow_is_named_at_its_step_with_every_module_hooked():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 1, bias=False))
    with diagnose.watch(model, every=1) as w:
        for v in (1.0, 1e38):  # the input needs no gradient: only the weight's overflows
            model.zero_grad()
            (model(torch.full((3, 4), v)) * 10).sum().backward()
            w.step()
    assert [(e.step, e.op) for e in w.report.events] == [
        (1, "0: backward (gradient of 0.weight)")]
    assert not bool(torch.isfinite(model[0].weight.grad).all())  # the oracle


def test_a_compiled_model_is_watched_through_its_original_module():
    from precisionlab.diagnose.watch_args import unwrap
    model = nn.Sequential(nn.Linear(2, 2))
    assert unwrap(torch.compile(model)) is model  # module paths are the model's own


@pytest.mark.parametrize("check", ["outputs", "modules"])
def test_a_nan_made_in_the_backward_of_the_models_own_code_is_not_blamed_on_the_loss(check):
    class Masked(nn.Module):  # sqrt(0 * h): its backward is 0 * inf = NaN at fc's output
        def __init__(self):
            super().__init__()
            self.fc, self.out = nn.Linear(2, 2), nn.Linear(2, 1)

        def forward(self, x):
            return self.out((self.fc(x) * 0).sqrt())
    torch.manual_seed(0)
    model = Masked()
    with diagnose.watch(model, every=10**6, check=check) as w:
        for _ in range(2):
            model.zero_grad()
            model(torch.ones(1, 2)).sum().backward()
            w.step()
    assert torch.isnan(model.fc.weight.grad).all()  # the oracle: torch's own backward
    assert [(e.step, e.phase, e.op) for e in w.report.events] == [
        (s, "backward", "(model): backward of its own code after fc's output") for s in (0, 1)]


def test_a_model_with_complex_parameters_is_refused_by_name():
    class Complex(nn.Module):
        def __init__(self):
            super().__init__()
            self.w = nn.Parameter(torch.ones(2, dtype=torch.complex64))
    with pytest.raises(ValueError, match=r"complex parameters \(w\).*view_as_real"):
        diagnose.watch(Complex())


def test_a_skipped_step_whose_inf_came_from_an_autocast_forward_is_explained_by_it():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 4))
    sgd = torch.optim.SGD(model.parameters(), lr=1e-3)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**8)
    xs = [torch.randn(8, 4) for _ in range(5)]
    xs[3] = xs[3] * 1e5  # past 65504: autocast's float16 copy of the batch is inf
    with diagnose.watch(model, every=100, scaler=scaler, optimizer=sgd) as w:
        for x in xs:
            sgd.zero_grad()
            with torch.autocast("cpu", dtype=torch.float16):
                loss = model(x).float().pow(2).mean()
            scaler.scale(loss).backward()
            scaler.step(sgd)
            scaler.update()
    assert not bool(torch.isfinite(xs[3].half()).all())  # the oracle: torch's own cast
    (skip,) = w.report.skips
    assert (skip.step, skip.scale, skip.new_scale) == (3, 256.0, 128.0)
    assert (skip.event.step, skip.event.phase, skip.event.op, skip.event.mechanism) == (
        3, "forward", "0: linear#0", "overflow")
    assert "first in the forward: 0: linear#0 (overflow" in skip.describe()
