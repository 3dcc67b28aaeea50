"""Soundness of the unrolled recurrent rules (`intervals.torch_ops.recurrent`): torch.lstm,
torch.gru, torch.rnn_tanh and torch.rnn_relu in float32, bfloat16, float16 and float64, on
oneDNN's fused CPU kernel and on torch's native cell (mkldnn off), one and two layers, both
directions, batch-first or not, LSTM projections, no biases, random initial states: the three
outputs at points and at points inside boxes lie in the bound, as do the float64 values;
saturated gates and huge inputs included; packed sequences and training-mode dropout are
refused with what to do; a changed weight is caught."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from box_oracles import box_around, inside, points_inside, rule_bound
from torch import nn

from precisionlab import diagnose
from precisionlab.intervals.torch_ops import arith as B
from precisionlab.intervals.torch_ops import recurrent as RC
from precisionlab.rounding import round_to

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16,
          "float64": torch.float64}
MODULES = {"lstm": nn.LSTM, "gru": nn.GRU, "rnn_tanh": nn.RNN, "rnn_relu": nn.RNN}
CONFIGS = [  # (layers, bidirectional, batch_first, bias, proj_size)
    (1, False, False, True, 0),
    (2, False, True, True, 0),
    (2, True, True, True, 0),
    (1, True, False, False, 0),
    (2, False, True, True, 3),
]


def _module(kind, cfg, dt, seed):
    layers, bidir, bf, bias, proj = cfg
    torch.manual_seed(seed)
    kw = {"nonlinearity": kind[4:]} if kind.startswith("rnn") else {}
    if kind == "lstm" and proj:
        kw["proj_size"] = proj
    m = MODULES[kind](5, 6, num_layers=layers, bidirectional=bidir, batch_first=bf, bias=bias,
                      **kw)
    return m.to(dt).eval()


def _call_args(m, kind, x, h0, c0):
    """The arguments nn.LSTM / nn.GRU / nn.RNN pass to torch.<kind>."""
    hx = (h0, c0) if kind == "lstm" else h0
    return (x, hx, m._flat_weights, m.bias, m.num_layers, 0.0, False, m.bidirectional,
            m.batch_first)


def _states(m, kind, n, dt, g, scale):
    d = 2 if m.bidirectional else 1
    hs = m.proj_size if kind == "lstm" and m.proj_size else m.hidden_size
    h0 = (torch.randn(m.num_layers * d, n, hs, generator=g, dtype=torch.float64) * scale).to(dt)
    c0 = (torch.randn(m.num_layers * d, n, m.hidden_size, generator=g, dtype=torch.float64)
          * scale).to(dt)
    return h0, c0


def _run(fn, args, mkldnn):
    with torch.backends.mkldnn.flags(enabled=mkldnn):
        return fn(*args)


@pytest.mark.filterwarnings("ignore:TF32 acceleration", "ignore:LSTM with projections")
@pytest.mark.parametrize("scale", [1.0, 30.0])
@pytest.mark.parametrize("fmt", ["float32", "bfloat16", "float16", "float64"])
@pytest.mark.parametrize("cfg", CONFIGS, ids=[str(i) for i in range(len(CONFIGS))])
@pytest.mark.parametrize("kind", sorted(MODULES))
def test_unrolled_bound_holds_torchs_outputs(kind, cfg, fmt, scale):
    if cfg[4] and kind != "lstm":
        pytest.skip("proj_size is LSTM's")
    if fmt == "float64" and scale > 1:
        pytest.skip("float64 is its own reference: one scale suffices")
    if kind.startswith("rnn") and cfg[1:3] not in ((False, False), (True, True)):
        pytest.skip("nn.RNN shares the unrolling with the others: two configurations suffice")
    dt = DTYPES[fmt]
    m = _module(kind, cfg, dt, seed=len(kind) + cfg[0])
    g = torch.Generator().manual_seed(hash((kind, cfg, fmt, scale)) % 2**31)
    n, steps = 3, 6
    shape = (n, steps, 5) if m.batch_first else (steps, n, 5)
    x = (torch.randn(shape, generator=g, dtype=torch.float64) * scale).to(dt)
    h0, c0 = _states(m, kind, n, dt, g, min(scale, 2.0))
    fn = getattr(torch, kind)
    args = _call_args(m, kind, x, h0, c0)
    bounds = rule_bound(kind, fn, args, {}, fmt)
    assert len(bounds) == (3 if kind == "lstm" else 2)
    for mkldnn in (True, False) if fmt != "float64" else (False,):
        for b, y in zip(bounds, _run(fn, args, mkldnn), strict=True):
            assert inside(b, y).all(), (kind, cfg, fmt, mkldnn)
    m64 = copy.deepcopy(m).double()
    args64 = _call_args(m64, kind, x.double(), h0.double(), c0.double())
    for b, y in zip(bounds, _run(fn, args64, True), strict=True):
        assert inside(b, y).all()
    if fmt == "float32" and scale == 1.0:  # not vacuous
        assert all((b.hi - b.lo).max() < 1e-3 for b in bounds)
    lo, hi = box_around(x, 2.0**-6, g)
    args = _call_args(m, kind, lo, h0, c0)
    bounds = rule_bound(kind, fn, args, {}, fmt, boxes={id(lo): (lo.double().numpy(),
                                                                 hi.double().numpy())})
    for p in points_inside(lo, hi, 4, g):
        for b, y in zip(bounds, _run(fn, _call_args(m, kind, p, h0, c0), True), strict=True):
            ok = inside(b, y)
            assert ok.all(), (kind, cfg, fmt, np.argwhere(~ok)[:3])


def test_packed_sequences_and_training_dropout_are_refused_with_what_to_do():
    m = nn.LSTM(4, 5, batch_first=True).eval()
    x = torch.randn(2, 6, 4)
    packed = nn.utils.rnn.pack_padded_sequence(x, torch.tensor([6, 3]), batch_first=True)

    def run(z):
        return m(packed)[1][0]
    with pytest.raises(diagnose.UnsupportedOperation, match=r"packed sequence.*padded batch"):
        diagnose.triage(run, run, x)
    d = nn.GRU(4, 5, num_layers=2, dropout=0.5, batch_first=True).train()
    with pytest.raises(diagnose.UnsupportedOperation, match=r"dropout.*model\.eval\(\)"):
        diagnose.triage(d, d, x)


class Tagger(nn.Module):
    def __init__(self, kind):
        super().__init__()
        self.rnn = MODULES[kind](4, 8, num_layers=2, batch_first=True, bidirectional=True)
        self.out = nn.Linear(16, 3)

    def forward(self, x):
        return self.out(self.rnn(x)[0])


@pytest.mark.parametrize("kind", ["lstm", "gru"])
def test_bidirectional_tagger_round_off_and_a_changed_weight(kind):
    torch.manual_seed(6)
    m = Tagger(kind).eval()
    x = torch.randn(2, 5, 4)
    low = copy.deepcopy(m).to(torch.bfloat16)
    r = diagnose.triage(m, lambda z: low(z.bfloat16()), x)
    assert r.verdict == "Type-I", r.summary()
    bug = copy.deepcopy(m)
    with torch.no_grad():
        bug.rnn.weight_hh_l1_reverse.mul_(1 + 2**-5)
    r = diagnose.triage(m, bug, x)
    assert r.verdict == "Type-II" and r.blamed.op.startswith("rnn"), r.blamed


def test_an_empty_batch_is_checked_without_a_worst_element():
    m = nn.LSTM(4, 5, batch_first=True).eval()
    r = diagnose.triage(m, m, torch.randn(0, 3, 4))
    assert r.verdict == "Type-I" and all(c.numel == 0 for c in r.checks if "lstm" in c.op)


def _tf32(t):
    return round_to(t, "tf32", "nearest_away")


def test_cudnn_tf32_operands_lie_in_the_tf32_bound():
    """cuDNN (CUDA, allow_tf32 on by default) may round a float32 LSTM's operands to TF32: an
    LSTM unrolled in float32 with every product's operands so rounded lies in the bound with
    tf32=True (which is wider than the float32 one); no GPU needed for the oracle."""
    torch.manual_seed(9)
    m = nn.LSTM(5, 6).eval()
    g = torch.Generator().manual_seed(9)
    x = torch.randn(6, 3, 5, generator=g) * 3
    h0, c0 = torch.zeros(1, 3, 6), torch.zeros(1, 3, 6)
    w_ih, w_hh, b_ih, b_hh = (p.detach() for p in m._flat_weights)
    h, c, outs = h0[0], c0[0], []
    for t in range(x.shape[0]):
        gates = _tf32(x[t]) @ _tf32(w_ih).T + b_ih + _tf32(h) @ _tf32(w_hh).T + b_hh
        i, f, gg, o = gates.chunk(4, 1)
        c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(gg)
        h = torch.sigmoid(o) * torch.tanh(c)
        outs.append(h)
    def get(t):
        v = t.detach().double().numpy()
        return B.mk(v, v)
    plain = rule_bound("lstm", torch.lstm, _call_args(m, "lstm", x, h0, c0), {}, "float32")
    ws = RC.layer_weights(m._flat_weights, get, True, "lstm", 1, 1)
    wide = RC.recurrent_bound("lstm", get(x), get(h0), get(c0), ws, 1, False, False, "float32",
                              tf32=True)
    assert inside(wide[0], torch.stack(outs)).all() and inside(wide[2], c[None]).all()
    assert ((wide[0].hi - wide[0].lo) > (plain[0].hi - plain[0].lo)).all()
    assert not inside(plain[0], torch.stack(outs)).all()  # the float32 model would miss it
