"""Soundness of the channel normalisation rules (`intervals.torch_ops.channel_norms`): torch's
batch norm (running statistics and batch statistics), group norm and instance norm in float32,
bfloat16, float16 and float64, with parameters in the input's dtype or in float32, lie in the
bound at points and inside boxes; hard cases: a running mean far from the data (cancellation in
the folded x alpha + beta), tiny variances, eps = 0 with a zero variance (inf/NaN: the whole
line), constant channels in a batch, huge inputs; exact float64 values lie inside; the bound is
not vacuous; BatchNorm2d in a bfloat16 copy is round-off and a changed eps is a bug."""

from __future__ import annotations

import copy
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from box_oracles import box_around, inside, points_inside, rule_bound
from torch import nn

from precisionlab import diagnose

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16,
          "float64": torch.float64}


def _stats(c, g, kind):
    mean = torch.randn(c, generator=g, dtype=torch.float64)
    var = torch.rand(c, generator=g, dtype=torch.float64) + 0.1
    if kind == "far":  # running mean far from the data: x alpha and beta cancel
        mean = mean * 100 + 300
        var = var * 1e-2
    elif kind == "tiny":
        var = var * 1e-6
    return mean, var


def _x(shape, g, kind):
    x = torch.randn(shape, generator=g, dtype=torch.float64)
    if kind == "far":
        x = x + 300
    elif kind == "huge":
        x = x * 3e4
    elif kind == "constant":
        x[:, 0] = 1.5  # a constant channel: batch variance 0
    return x


def _call(name, x, p, training=False, groups=2, eps=1e-5):
    """(function, args, kwargs) of one normalisation call."""
    if name == "batch_norm":
        return F.batch_norm, (x, p["mean"], p["var"]), {"weight": p["w"], "bias": p["b"],
                                                        "training": training, "eps": eps}
    if name == "batch_norm_stats":  # no running statistics: the batch's own
        return F.batch_norm, (x, None, None), {"weight": p["w"], "bias": p["b"],
                                               "training": True, "eps": eps}
    if name == "group_norm":
        return F.group_norm, (x, groups), {"weight": p["w"], "bias": p["b"], "eps": eps}
    if name == "instance_norm":
        return F.instance_norm, (x,), {"weight": p["w"], "bias": p["b"], "eps": eps}
    return F.instance_norm, (x, p["mean"], p["var"]), {  # instance_norm_running
        "weight": p["w"], "bias": p["b"], "use_input_stats": False, "eps": eps}


NAMES = ["batch_norm", "batch_norm_train", "batch_norm_stats", "group_norm", "instance_norm",
         "instance_norm_running"]


def _params(c, g, kind, dt, affine=True):
    mean, var = _stats(c, g, kind)
    w = torch.randn(c, generator=g, dtype=torch.float64) * 2 if affine else None
    b = torch.randn(c, generator=g, dtype=torch.float64) if affine else None
    return {k: (None if v is None else v.to(dt)) for k, v in
            (("mean", mean), ("var", var), ("w", w), ("b", b))}


def _run(fn, args, kw):
    """The call on clones of the running statistics (training mode writes into them)."""
    args = tuple(a.clone() if isinstance(a, torch.Tensor) and i else a for i, a in enumerate(args))
    return fn(*args, **kw)


@pytest.mark.parametrize("kind", ["plain", "far", "tiny", "huge", "constant"])
@pytest.mark.parametrize("pdt", ["same", "float32"])
@pytest.mark.parametrize("fmt", ["float32", "bfloat16", "float16", "float64"])
@pytest.mark.parametrize("name", NAMES)
def test_normalisation_of_points_and_boxes_is_inside_the_bound(name, fmt, pdt, kind):
    dt = DTYPES[fmt]
    if pdt == "float32" and fmt in ("float32", "float64"):
        pytest.skip("parameters in the input's dtype already")
    if kind == "huge" and fmt == "float16":
        pytest.skip("3e4 noise overflows float16 itself")
    g = torch.Generator().manual_seed(hash((name, fmt, pdt, kind)) % 2**31)
    shape = (3, 4, 5, 6)
    x = _x(shape, g, kind).to(dt)
    p = _params(4, g, kind, dt if pdt == "same" else torch.float32, affine=kind != "tiny")
    rname = "batch_norm" if name.startswith("batch_norm") else name.removesuffix("_running")
    fn, args, kw = _call(name.removesuffix("_train") if name != "instance_norm_running" else name,
                         x, p, training=name == "batch_norm_train")
    b = rule_bound(rname, fn, args, kw, fmt)[0]
    y = _run(fn, args, kw)
    assert inside(b, y).all(), (name, fmt, pdt, kind)
    exact = _run(fn, tuple(a.double() if isinstance(a, torch.Tensor) else a for a in args),
                 {k: (v.double() if isinstance(v, torch.Tensor) else v) for k, v in kw.items()})
    assert inside(b, exact).all()
    if kind == "plain" and fmt == "float32" and name in ("batch_norm", "instance_norm_running"):
        assert (b.hi - b.lo).max() < 1e-4  # not vacuous
    lo, hi = box_around(x, 2.0**-5, g)
    args2 = (lo, *args[1:])
    b = rule_bound(rname, fn, args2, kw, fmt, boxes={id(lo): (lo.double().numpy(),
                                                             hi.double().numpy())})[0]
    for pt in points_inside(lo, hi, 5, g):
        ok = inside(b, _run(fn, (pt, *args[1:]), kw))
        assert ok.all(), (name, fmt, pdt, kind, np.argwhere(~ok)[:3])


def test_zero_variance_without_eps_is_the_whole_line():
    x = torch.randn(2, 3, 4)
    mean, var = torch.zeros(3), torch.tensor([1.0, 0.0, -1.0])
    b = rule_bound("batch_norm", F.batch_norm, (x, mean, var), {"eps": 0.0}, "float32")[0]
    assert np.isfinite(b.lo[:, 0]).all() and (b.lo[:, 1:] == -np.inf).all()
    assert inside(b, F.batch_norm(x, mean, var, eps=0.0)).all()


@pytest.mark.parametrize("fmt", ["float32", "bfloat16", "float16"])
@pytest.mark.parametrize("eps", [0.0, 1e-45])
def test_tiny_inputs_whose_squares_underflow(fmt, eps):
    """Batch statistics (and layer / RMS norm, `kernels.norm_rows`) of entries so small that
    their squares underflow the internal format, or that float16's CPU batch and instance norm
    hold a variance below its normal range: with eps 0 (or subnormal) torch gives inf, NaN or
    values far from the exact ones (float32 x ~ 1e-22, bfloat16 x ~ 1e-39, float16 x ~ 3e-6),
    which the bound holds (it was [1.67, 1.70] where float32's layer norm gave 2.16)."""
    g = torch.Generator().manual_seed(11)
    dt = DTYPES[fmt]
    for scale in ({"float32": (1e-40, 1e-30, 1e-22), "bfloat16": (1e-40, 1e-39, 1e-22),
                   "float16": (3e-6, 1e-4)}[fmt]):
        x = (torch.randn(4, 6, 5, generator=g, dtype=torch.float64) * scale).to(dt)
        lo, hi = box_around(x, 1e-2, g)
        box = {id(lo): (lo.double().numpy(), hi.double().numpy())}
        calls = [("batch_norm", lambda z: torch.batch_norm(z, None, None, None, None, True, 0.1,
                                                           eps, False)),
                 ("group_norm", lambda z: F.group_norm(z, 2, eps=eps)),
                 ("instance_norm", lambda z: F.instance_norm(z, eps=eps)),
                 ("layer_norm", lambda z: F.layer_norm(z, (5,), eps=eps)),
                 ("rms_norm", lambda z: F.rms_norm(z, (5,), eps=eps))]
        for name, fn in calls:
            if name == "batch_norm":
                args, f = (lo, None, None, None, None, True, 0.1, eps, False), torch.batch_norm
            elif name == "group_norm":
                args, f = (lo, 2, None, None, eps), F.group_norm
            elif name == "instance_norm":
                args, f = (lo, None, None, None, None, True, 0.1, eps), F.instance_norm
            elif name == "layer_norm":
                args, f = (lo, (5,), None, None, eps), F.layer_norm
            else:
                args, f = (lo, (5,), None, eps), F.rms_norm
            b = rule_bound(name, f, args, {}, fmt, boxes=box)[0]
            for pt in points_inside(lo, hi, 4, g):
                ok = inside(b, fn(pt))
                assert ok.all(), (name, fmt, scale, eps, np.argwhere(~ok)[:3])


@pytest.mark.parametrize("fmt", ["float32", "bfloat16"])
@pytest.mark.parametrize("name", NAMES)
def test_infinite_and_nan_inputs(name, fmt):
    """inf, -inf and NaN entries: torch's outputs (inf, NaN, or NaN over a whole batch row)
    lie in the bound, the whole line wherever NaN may come out."""
    g = torch.Generator().manual_seed(8)
    dt = DTYPES[fmt]
    x = torch.randn(3, 4, 5, 6, generator=g)
    x[0, 0, 0, 0], x[1, 1, 2, 3], x[2, 3, 4, 5] = math.inf, -math.inf, math.nan
    x = x.to(dt)
    p = _params(4, g, "plain", dt)
    rname = "batch_norm" if name.startswith("batch_norm") else name.removesuffix("_running")
    fn, args, kw = _call(name.removesuffix("_train") if name != "instance_norm_running" else name,
                         x, p, training=name == "batch_norm_train")
    assert inside(rule_bound(rname, fn, args, kw, fmt)[0], _run(fn, args, kw)).all()


def test_unbatched_and_two_dimensional_inputs():
    g = torch.Generator().manual_seed(4)
    x = torch.randn(5, 4, generator=g)  # BatchNorm1d on (N, C)
    p = _params(4, g, "plain", torch.float32)
    for training in (False, True):
        fn, args, kw = _call("batch_norm", x, p, training=training)
        assert inside(rule_bound("batch_norm", fn, args, kw, "float32")[0], _run(fn, args, kw)).all()
    fn, args, kw = _call("group_norm", x, p, groups=4)
    assert inside(rule_bound("group_norm", fn, args, kw, "float32")[0], fn(*args, **kw)).all()


class BN(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8)
        self.gn = nn.GroupNorm(2, 8)

    def forward(self, x):
        return self.gn(torch.relu(self.bn(self.conv(x))))


def test_batch_norm_in_a_cnn_bfloat16_round_off_and_eps_bug():
    torch.manual_seed(5)
    m = BN()
    with torch.no_grad():  # running statistics that are not the defaults
        m.bn.running_mean.uniform_(-1, 1)
        m.bn.running_var.uniform_(0.5, 2)
    m.eval()
    x = torch.randn(2, 3, 6, 6)
    assert diagnose.triage(m, m, x).verdict == "Type-I"
    low = copy.deepcopy(m).to(torch.bfloat16)
    r = diagnose.triage(m, lambda z: low(z.bfloat16()), x)
    assert r.verdict == "Type-I", r.summary()
    bug = copy.deepcopy(m)
    bug.bn.eps = 1e-2
    r = diagnose.triage(m, bug, x)
    assert r.verdict == "Type-II" and r.blamed.op.startswith("bn"), r.blamed
    bug = copy.deepcopy(m)
    bug.gn.eps = 1e-1
    r = diagnose.triage(m, bug, x)
    assert r.verdict == "Type-II" and r.blamed.op.startswith("gn"), r.blamed
    assert math.isfinite(r.blamed.width)
