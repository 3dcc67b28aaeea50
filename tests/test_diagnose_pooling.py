"""Soundness of the pooling rules (`intervals.torch_ops.pooling`): torch's max, average and
adaptive pooling in float32, bfloat16 and float16 (and float64), at the ends of random boxes and
at points inside them, lie in the bound; windows with -inf, inf, NaN, subnormal and huge entries
(sums that overflow float16 or float32) included; max pooling of points is exact (zero width);
a CNN's pooling in bfloat16 is round-off and a pooling with the wrong window is a bug."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from box_oracles import box_around, inside, points_inside, rule_bound

from precisionlab import diagnose

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16,
          "float64": torch.float64}

CASES = [  # (name, function, the call's other arguments, keyword arguments, input shape)
    ("max_pool2d", F.max_pool2d, (2,), {}, (2, 3, 7, 8)),
    ("max_pool2d", F.max_pool2d, (3,), {"stride": 2, "padding": 1, "dilation": 1,
                                        "ceil_mode": True}, (2, 3, 9, 7)),
    ("max_pool2d", F.max_pool2d, ((2, 3),), {"stride": 1, "dilation": 2}, (3, 8, 9)),
    ("max_pool2d_with_indices", F.max_pool2d_with_indices, (2,), {}, (2, 3, 6, 6)),
    ("max_pool1d", F.max_pool1d, (3,), {"stride": 2, "padding": 1}, (2, 4, 11)),
    ("max_pool1d_with_indices", F.max_pool1d_with_indices, (2,), {}, (2, 4, 10)),
    ("avg_pool2d", F.avg_pool2d, (2,), {}, (2, 3, 7, 8)),
    ("avg_pool2d", F.avg_pool2d, (3, 2, 1), {"ceil_mode": True, "count_include_pad": False},
     (2, 3, 9, 7)),
    ("avg_pool2d", F.avg_pool2d, (3,), {"stride": 1, "padding": 1, "divisor_override": 5},
     (2, 3, 6, 6)),
    ("avg_pool1d", F.avg_pool1d, (4,), {"stride": 2, "padding": 2}, (2, 4, 13)),
    ("adaptive_avg_pool2d", F.adaptive_avg_pool2d, (1,), {}, (2, 5, 7, 9)),
    ("adaptive_avg_pool2d", F.adaptive_avg_pool2d, ((3, None),), {}, (2, 5, 7, 9)),
    ("adaptive_avg_pool1d", F.adaptive_avg_pool1d, (4,), {}, (2, 5, 11)),
    ("adaptive_max_pool2d", F.adaptive_max_pool2d, ((2, 3),), {}, (2, 5, 7, 9)),
    ("adaptive_max_pool2d_with_indices", F.adaptive_max_pool2d_with_indices, (2,), {},
     (2, 5, 7, 7)),
    ("adaptive_max_pool1d", F.adaptive_max_pool1d, (3,), {}, (2, 5, 10)),
]
IDS = [f"{c[0]}-{i}" for i, c in enumerate(CASES)]


def _value(out):
    return out[0] if isinstance(out, tuple) else out


def _inputs(shape, dt, g, kind):
    x = torch.randn(shape, generator=g, dtype=torch.float64)
    if kind == "offset":  # cancellation-free but large: 1e4 + noise
        x = x + 1e4
    elif kind == "tiny":  # subnormal in every format
        x = x * 1e-41 if dt in (torch.float32, torch.float64) else x * 1e-6
    elif kind == "special":
        flat = x.view(-1)
        flat[::7] = -math.inf
        flat[3::11] = math.inf
        flat[5::13] = math.nan
    elif kind == "huge":  # window sums overflow the 16-bit formats and float32
        x = x.abs() * (6e4 if dt == torch.float16 else 3e38)
    return x.to(dt)


@pytest.mark.parametrize("kind", ["plain", "offset", "tiny", "special", "huge"])
@pytest.mark.parametrize("fmt", ["float32", "bfloat16", "float16"])
@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_pooling_of_points_and_boxes_is_inside_the_bound(case, fmt, kind):
    name, fn, more, kw, shape = case
    dt = DTYPES[fmt]
    g = torch.Generator().manual_seed(hash((name, fmt, kind)) % 2**31)
    x = _inputs(shape, dt, g, kind)
    # a point: the rule's bound holds torch's value (in fmt and in float64)
    b = rule_bound(name, fn, (x, *more), kw, fmt)[0]
    for y in (_value(fn(x, *more, **kw)), _value(fn(x.double(), *more, **kw))):
        assert inside(b, y).all(), (name, fmt, kind)
    if name.startswith(("max", "adaptive_max")) and kind == "plain":
        assert (b.lo == b.hi).all()  # exact
    if kind == "special":
        return
    lo, hi = box_around(x, 2.0**-4, g)
    b = rule_bound(name, fn, (lo, *more), kw, fmt,
                   boxes={id(lo): (lo.double().numpy(), hi.double().numpy())})[0]
    for p in points_inside(lo, hi, 6, g):
        ok = inside(b, _value(fn(p, *more, **kw)))
        assert ok.all(), (name, fmt, kind, np.argwhere(~ok)[:3])


def test_average_pooling_bound_is_a_few_ulps_wide():
    g = torch.Generator().manual_seed(2)
    x = torch.randn(2, 3, 8, 8, generator=g)
    b = rule_bound("adaptive_avg_pool2d", F.adaptive_avg_pool2d, (x, 1), {}, "float32")[0]
    y = F.adaptive_avg_pool2d(x, 1).double().numpy()
    mag = F.adaptive_avg_pool2d(x.abs(), 1).double().numpy()
    assert ((b.hi - b.lo) < 200 * 2.0**-24 * mag + 1e-30).all() and inside(b, y).all()


class Pooled(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 6, 3, padding=1)
        self.pool = torch.nn.MaxPool2d(2)
        self.avg = torch.nn.AdaptiveAvgPool2d((2, 2))

    def forward(self, x):
        return self.avg(self.pool(torch.relu(self.conv(x)))).flatten(1)


def test_pooling_in_a_cnn_round_off_and_a_wrong_window():
    torch.manual_seed(3)
    m = Pooled().eval()
    x = torch.randn(2, 3, 8, 8)
    low = Pooled().eval().to(torch.bfloat16)
    low.load_state_dict(m.state_dict())
    r = diagnose.triage(m, lambda z: low(z.bfloat16()), x)
    assert r.verdict == "Type-I", r.summary()
    wrong = Pooled().eval()  # a 3 x 3 window (padded): the same shape, other values
    wrong.load_state_dict(m.state_dict())
    wrong.pool = torch.nn.MaxPool2d(3, stride=2, padding=1)
    r = diagnose.triage(m, wrong, x)
    assert r.verdict == "Type-II" and r.blamed.op.startswith("pool"), r.blamed
