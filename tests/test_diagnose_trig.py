"""Soundness of the cos and sin rules (`intervals.torch_ops.trig`): torch's results in float32,
bfloat16, float16 and float64 (vectorised and strided scalar paths) and mpmath's exact values lie
in the bound, for every 16-bit input, for float32 inputs near the extrema and zeros, huge and
tiny inputs, and for points inside boxes that hold an extremum; inf and NaN give the whole
line; the bound is a few ulps wide where nothing forces it wider."""

from __future__ import annotations

import math

import mpmath
import numpy as np
import pytest
import torch
from box_oracles import inside, points_inside, rule_bound, strided

from precisionlab.intervals.torch_ops import trig

mpmath.mp.dps = 40
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16,
          "float64": torch.float64}
FNS = {"cos": (torch.cos, mpmath.cos), "sin": (torch.sin, mpmath.sin)}


def _all16(dt):
    x = torch.arange(-32768, 32768, dtype=torch.int32).to(torch.int16).view(dt)
    return x[torch.isfinite(x)]


def _hard32() -> torch.Tensor:
    """float32 inputs where a bound breaks first: near k pi / 2 (zeros and extrema), the
    neighbours of 0, subnormals, position-table sizes (up to 2^15 rad), huge values."""
    k = torch.arange(-64, 65, dtype=torch.float64)
    near = (k * math.pi / 2).to(torch.float32)
    around = torch.cat([torch.nextafter(near, torch.tensor(math.inf)), near,
                        torch.nextafter(near, torch.tensor(-math.inf))])
    g = torch.Generator().manual_seed(0)
    rand = torch.cat([torch.randn(4000, generator=g) * 10 ** e for e in range(-3, 6)])
    special = torch.tensor([0.0, -0.0, 1e-45, -1e-45, 1e-38, 3e-39, 1.0, 32767.0, 2.0**20,
                            2.0**20 + 2.0, 1e7, 1e30, -3.4e38, 3.4e38])
    return torch.cat([around, rand.float(), special])


@pytest.mark.parametrize("name", sorted(FNS))
@pytest.mark.parametrize("fmt", ["bfloat16", "float16"])
def test_every_16_bit_input(name, fmt):
    fn, _ = FNS[name]
    x = _all16(DTYPES[fmt])
    b = rule_bound(name, fn, (x,), {}, fmt)[0]
    for y in (fn(x), fn(strided(x)), fn(x.double()), fn(x.float())):
        ok = inside(b, y)
        assert ok.all(), (name, fmt, x[~torch.from_numpy(ok)][:4])


@pytest.mark.parametrize("name", sorted(FNS))
@pytest.mark.parametrize("fmt", ["float32", "float64"])
def test_hard_float32_and_float64_inputs(name, fmt):
    fn, exact = FNS[name]
    x = _hard32().to(DTYPES[fmt])
    b = rule_bound(name, fn, (x,), {}, fmt)[0]
    for y in (fn(x), fn(strided(x)), fn(x.double())):
        ok = inside(b, y)
        assert ok.all(), (name, fmt, x[~torch.from_numpy(ok)][:4])
    sub = x[:: max(1, x.numel() // 400)]
    bs = rule_bound(name, fn, (sub,), {}, fmt)[0]
    e = np.array([float(exact(mpmath.mpf(float(v)))) for v in sub])
    assert inside(bs, e).all()


@pytest.mark.parametrize("name", sorted(FNS))
@pytest.mark.parametrize("fmt", ["float32", "bfloat16", "float16"])
def test_points_inside_boxes(name, fmt):
    """Boxes of every width, from one ulp to several periods, many holding an extremum: the
    ends and random points inside, in fmt, give values inside the bound."""
    fn, _ = FNS[name]
    g = torch.Generator().manual_seed(1)
    dt = DTYPES[fmt]
    c = (torch.randn(3000, generator=g, dtype=torch.float64) * 20).to(dt)
    w = (torch.rand(3000, generator=g, dtype=torch.float64) * 10.0 ** torch.randint(
        -6, 2, (3000,), generator=g)).to(dt)
    lo, hi = (c.double() - w.double()).to(dt), (c.double() + w.double()).to(dt)
    lo, hi = torch.minimum(lo, hi), torch.maximum(lo, hi)
    b = rule_bound(name, fn, (lo,), {}, fmt, boxes={id(lo): (lo.double().numpy(),
                                                            hi.double().numpy())})[0]
    for p in points_inside(lo, hi, 12, g):
        ok = inside(b, fn(p))
        assert ok.all(), (name, fmt, lo[~torch.from_numpy(ok)][:3], hi[~torch.from_numpy(ok)][:3])
    # a box holding an extremum reaches it
    top = 0.0 if name == "cos" else math.pi / 2
    x = torch.tensor([top - 0.1], dtype=dt)
    y = trig.trig_bound(trig_box(top - 0.1, top + 0.1), fmt, sine=name == "sin")
    assert y.hi[0] >= 1.0 and y.lo[0] < float(fn(x)[0])


def trig_box(a: float, b: float):
    from precisionlab.intervals.torch_ops import arith as B
    return B.mk(np.array([a]), np.array([b]))


def test_infinite_and_nan_inputs_give_the_whole_line_and_bounds_are_tight():
    x = torch.tensor([math.inf, -math.inf, math.nan, 0.5])
    for name, (fn, _) in FNS.items():
        b = rule_bound(name, fn, (x,), {}, "float32")[0]
        assert (b.lo[:3] == -np.inf).all() and (b.hi[:3] == np.inf).all()
        assert inside(b, fn(x)).all()
        # 0.5 in float32: within a few ulps
        assert b.hi[3] - b.lo[3] < 32 * 2.0**-24
    # beyond 2^20 only |cos| <= 1 is assumed
    big = torch.tensor([2.0**21])
    b = rule_bound("cos", torch.cos, (big,), {}, "float32")[0]
    assert b.lo[0] <= -1.0 and b.hi[0] >= 1.0 and b.hi[0] < 1.0 + 1e-5
