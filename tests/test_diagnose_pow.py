"""triage's rule for pow(x, n) with an integer exponent n (GPT-2's gelu_new takes x^3): exact
oracles (fractions) at points of random intervals (0-spanning, negative, subnormal, overflowing
float32 and float64), torch's own kernels inside the point bound, NaN, and triage end to end."""

from __future__ import annotations

import math
import types
from fractions import Fraction

import numpy as np
import pytest
import torch

from precisionlab import diagnose
from precisionlab.intervals.torch_ops import arith as B
from precisionlab.intervals.torch_ops import rules as R

EXPONENTS = [-1, 0, 3, 4, 5, 7, 64, 3.0, -1.0]


def bound(lo, hi, n, fmt):
    rec = types.SimpleNamespace(name="pow", func=torch.pow, args=(torch.zeros(len(lo)), n),
                                kwargs={})
    return R.bound(rec, lambda t: B.mk(np.asarray(lo, float), np.asarray(hi, float)), fmt)[0]


def contains(lo: float, hi: float, v) -> bool:
    """v (a Fraction or +-inf) in [lo, hi], compared exactly."""
    if isinstance(v, float):  # an infinity
        return (lo <= v <= hi)
    return (lo == -math.inf or Fraction(lo) <= v) and (hi == math.inf or v <= Fraction(hi))


def exact(p: float, n: int):
    """p^n exactly; +-inf at 0 for n < 0 (IEEE: the sign of zero, taken as +0 here)."""
    if n == 0:
        return Fraction(1)
    if p == 0 and n < 0:
        return math.inf if n % 2 == 0 or math.copysign(1, p) > 0 else -math.inf
    return Fraction(p) ** n


def _ends(rng, k):
    pool = np.concatenate([rng.standard_normal(k) * 10.0 ** rng.integers(-3, 4, k),
                           rng.choice([0.0, -0.0, 1e-40, -1e-40, 3e-45, 1e-310, -1e-310,
                                       1e30, -1e30, 1e150, -1e150, 1.0, -1.0], k)])
    return rng.choice(pool, k)


@pytest.mark.parametrize("n", EXPONENTS)
@pytest.mark.parametrize("fmt", ["float64", "float32", "bfloat16"])
def test_interval_rule_holds_the_exact_range(n, fmt):
    rng = np.random.default_rng(abs(int(n)) * 7 + len(fmt))
    a, b = _ends(rng, 60), _ends(rng, 60)
    lo, hi = np.minimum(a, b), np.maximum(a, b)
    y = bound(lo, hi, n, fmt)
    assert y.shape == lo.shape
    for i in range(len(lo)):
        pts = [lo[i], hi[i], *(lo[i] + (hi[i] - lo[i]) * rng.random(3))]
        if lo[i] <= 0 <= hi[i]:
            pts.append(0.0)
        for p in pts:
            if not math.isfinite(p):
                continue
            v = exact(p, int(n))
            assert contains(y.lo[i], y.hi[i], v), (lo[i], hi[i], p, n, fmt, y.lo[i], y.hi[i])


def test_spanning_zero_and_special_cases():
    lo, hi = np.array([-2.0, -2.0, -2.0, 0.0]), np.array([3.0, 3.0, 3.0, 0.0])
    even4 = bound(lo, hi, 4, "float64").lo[:3]  # even: minimum 0 (less one subnormal step)
    assert ((even4 <= 0) & (even4 > -1e-300)).all()
    assert bound(lo, hi, 3, "float64").lo[0] <= -8 and bound(lo, hi, 3, "float64").hi[0] >= 27
    odd = bound(lo, hi, -1, "float64")
    assert (odd.lo == -np.inf).all() and (odd.hi == np.inf).all()  # 1/x over 0: the whole line
    even = R._int_pow(B.mk(lo, hi), -2)  # the real range; the rule refuses n = -2 (below)
    assert (even.hi == np.inf).all() and 0 < even.lo[0] <= 1 / 9
    one = bound(np.array([-np.inf]), np.array([np.inf]), 0, "float32")
    assert one.lo[0] == one.hi[0] == 1.0  # pow(NaN, 0) = 1
    nan = bound(np.array([-np.inf]), np.array([np.inf]), 3, "float32")
    assert nan.lo[0] == -np.inf and nan.hi[0] == np.inf  # the input may be NaN: so may x^3
    big = bound(np.array([1e30]), np.array([1e30]), 3, "float32")
    assert big.hi[0] == np.inf and big.lo[0] >= np.finfo(np.float32).max  # overflow to inf
    big64 = bound(np.array([1e150]), np.array([1e150]), 3, "float64")
    assert big64.hi[0] == np.inf and big64.lo[0] > 1.79e308  # sound, finite


def test_non_integer_exponent_is_refused():
    with pytest.raises(diagnose.UnsupportedOperation, match="integer exponent"):
        bound(np.array([1.0]), np.array([2.0]), 1.5, "float32")


@pytest.mark.parametrize("n", [-2, -3, -2.0, 65, 257, 2049, 2**24 + 1, 1e20, 2**70])
def test_exponents_outside_the_sound_range_are_refused(n):
    """Below -1 torch's bfloat16 kernel squares into bfloat16 first (a subnormal square loses
    ulps; a flushed one gives inf), and above 64 the exponent nears what bfloat16 holds
    exactly (torch rounds 257 to 256): refused, never a false verdict and never a raw error."""
    with pytest.raises(diagnose.UnsupportedOperation, match=r"from -1 to 64"):
        bound(np.array([1.0]), np.array([2.0]), n, "bfloat16")
    if abs(n) >= 2**63:
        return  # torch itself cannot run z.pow(2**70) (OverflowError): no program to triage
    low = lambda z: z.pow(n)  # noqa: E731
    with pytest.raises(diagnose.UnsupportedOperation, match=r"from -1 to 64"):
        diagnose.triage(low, low, torch.ones(3))


def test_a_number_base_is_refused_with_what_to_do():
    f = lambda z: torch.pow(2.0, z)  # noqa: E731
    with pytest.raises(diagnose.UnsupportedOperation, match="tensor base"):
        diagnose.triage(f, f, torch.ones(3))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.float64])
@pytest.mark.parametrize("n", [-1, 3, 4, 5, 7, 31, 64, 3.0])
def test_torch_kernels_lie_in_the_point_bound(dtype, n):
    g = torch.Generator().manual_seed(1)
    x = torch.cat([torch.randn(2000, generator=g) * 10.0 ** torch.randint(-3, 4, (2000,),
                                                                         generator=g),
                   torch.tensor([0.0, -0.0, 1e-40, -1e-40, 1e-3, 300.0, -300.0, float("nan"),
                                 float("inf"), -float("inf")])]).to(dtype)
    fmt = B.fmt_of(dtype)
    for xs in (x, torch.empty(2 * x.numel(), dtype=dtype)[::2].copy_(x)):  # vector, scalar path
        y = torch.pow(xs, n).to(torch.float64).numpy()
        xv = x.to(torch.float64).numpy()
        b = bound(xv, xv, n, fmt)
        free = (b.lo == -np.inf) & (b.hi == np.inf)
        ok = ((b.lo <= y) & (y <= b.hi)) | (np.isnan(y) & (free | np.isnan(xv)))
        assert ok.all(), (xv[~ok][:5], y[~ok][:5], b.lo[~ok][:5], b.hi[~ok][:5])


def test_triage_on_integer_powers():
    torch.manual_seed(0)
    x = torch.randn(4, 16)
    f = lambda z: torch.pow(z, 3) + z ** -1 + z ** 4  # noqa: E731
    low = lambda z: f(z.to(torch.bfloat16))  # noqa: E731
    assert diagnose.triage(f, f, x).verdict == "Type-I"
    assert diagnose.triage(f, low, x).verdict == "Type-I"
    bug = lambda z: torch.pow(z, 3) * (1 + 2**-10) + z ** -1 + z ** 4  # noqa: E731
    r = diagnose.triage(f, bug, x)
    assert r.verdict == "Type-II"
    xn = x.clone()
    xn[0, 0] = float("nan")
    assert diagnose.triage(f, f, xn).verdict == "Type-I"  # NaN in both: no bug
