"""The torch-operation rules' compiled kernels (intervals/torch_ops/fused.py) give the NumPy
path's values bit for bit: the float64 step against np.nextafter, relative widening against its
NumPy steps, a leaf's box against frexp/ldexp, the matrix-product close against `_close_numpy`,
and the quick check against `check_inside`; on edge values (zeros, subnormals, +-inf, NaN,
values near each format's largest finite) and random magnitudes and bit patterns."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
import torch
from test_diagnose_bound_ops import edge_values

from precisionlab.diagnose import opcheck
from precisionlab.formats import get_format
from precisionlab.intervals.torch_ops import arith as B
from precisionlab.intervals.torch_ops import products as P

FORMATS = ("float64", "float32", "bfloat16", "float16")


def bitwise_equal(a, b) -> bool:
    """Equal float64 arrays bit for bit (any NaN equals any NaN)."""
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    if a.shape != b.shape:
        return False
    nan = np.isnan(a)
    return bool(np.array_equal(nan, np.isnan(b)) and
                np.array_equal(a[~nan].view(np.int64), b[~nan].view(np.int64)))


def np_step(x, sign):
    """The NumPy path: np.nextafter toward sign * inf, infinities kept."""
    with np.errstate(over="ignore"):
        y = np.nextafter(x, sign * np.inf)
    return np.where(np.isinf(x), x, y)


def with_nan(seed=0):
    x = edge_values(seed)
    return np.concatenate([x, [np.nan, -np.nan, 2.0**-1074, -(2.0**-1074), 2.0**-1022,
                               np.finfo(np.float64).max, -np.finfo(np.float64).max]])


@pytest.mark.parametrize("sign", [-1, 1])
def test_step_is_nextafter(sign):
    x = with_nan()
    assert bitwise_equal(B._step(x, sign), np_step(x, sign))
    # shapes: 0-d, strided and read-only inputs
    assert B._step(np.float64(1.5), sign).shape == ()
    m = x[: 2 * (x.size // 2)].reshape(-1, 2)
    assert bitwise_equal(B._step(m[:, 1], sign), np_step(m[:, 1], sign))
    ro = np.broadcast_to(x[:1], (5,))
    assert bitwise_equal(B._step(ro, sign), np_step(ro, sign))


def np_widen_rel(lo, hi, ulps, fmt, ftz):
    """The NumPy path of `widen_rel` (then `_ftz`)."""
    f = get_format(fmt)
    with np.errstate(invalid="ignore", over="ignore"):
        dlo = np_step(ulps * np.maximum(np_step(f.eps * np.abs(lo), 1), f.min_subnormal), 1)
        dhi = np_step(ulps * np.maximum(np_step(f.eps * np.abs(hi), 1), f.min_subnormal), 1)
        a, b = np_step(lo - dlo, -1), np_step(hi + dhi, 1)
    a, b = np.where(np.isinf(lo), lo, a), np.where(np.isinf(hi), hi, b)
    if ftz:
        n = f.min_normal
        a = np.where((a > 0) & (a < n), 0.0, a)
        b = np.where((b < 0) & (b > -n), 0.0, b)
    return a, b


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("ulps", [0.5, 1.0, 4.0, 13.0])
def test_widen_rel_is_the_numpy_steps(fmt, ulps):
    x = edge_values(2)
    lo, hi = np.sort(np.stack([x, np.roll(x, 3)]), axis=0)
    for ftz in (False, True):
        got = B.widen_rel(B.mk(lo, hi), ulps, fmt, ftz=ftz)
        want = np_widen_rel(lo, hi, ulps, fmt, ftz)
        assert bitwise_equal(got.lo, want[0]) and bitwise_equal(got.hi, want[1])
    # a NaN end gives the whole line, as the validating constructor does
    y = B.widen_rel(B.mk(np.array([np.nan, 1.0]), np.array([2.0, 3.0])), ulps, fmt)
    assert y.lo[0] == -np.inf and y.hi[0] == np.inf and y.lo[1] < 1 and y.hi[1] > 3


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_leaf_box_is_frexp_ldexp(dtype):
    f = get_format(B.fmt_of(dtype))
    fi = torch.finfo(dtype)
    edges = [0.0, -0.0, math.inf, -math.inf, math.nan, fi.max, -fi.max, fi.tiny, -fi.tiny,
             fi.smallest_normal / 2, f.min_subnormal, -f.min_subnormal, 1.0, -1.0, fi.eps]
    rng = np.random.default_rng(3)
    vals = np.concatenate([edges, rng.standard_normal(3000) * np.exp2(rng.integers(-40, 40, 3000))])
    t = torch.tensor(vals, dtype=torch.float64).to(dtype)
    v = t.to(torch.float64).numpy()
    with np.errstate(divide="ignore", invalid="ignore"):
        _, e = np.frexp(np.abs(v))
        half = np.ldexp(1.0, np.maximum(e - 1, f.emin) - f.mantissa_bits - 1)
    half = np.where(v == 0, f.min_subnormal / 2, half)
    lo = np.where(np.isfinite(v), v - half, v)
    hi = np.where(np.isfinite(v), v + half, v)
    want = B.mk(lo, hi)
    got = B.leaf(t)
    assert bitwise_equal(got.lo, want.lo) and bitwise_equal(got.hi, want.hi)
    assert got.lo[4] == -np.inf and got.hi[4] == np.inf  # NaN: no information
    fin = np.isfinite(v)
    assert (got.hi[fin] - got.lo[fin] > 0).all()


def close_inputs(seed, rows=37, n=11, big=False):
    rng = np.random.default_rng(seed)
    pm = rng.standard_normal((rows, n)) * np.exp2(rng.integers(-30, 30, (rows, n)))
    pr = np.abs(rng.standard_normal((rows, n))) * 1e-6
    s = np.abs(pm) * 2 + pr
    pm[0, :4] = [0.0, -0.0, 5e-324, -5e-324]
    pm[1, 0] = np.nan
    if big:  # sums near and past the accumulators' and the formats' largest values
        s[2:6] = [[3e38], [1e36], [6e4], [3.4e38 / 1.0001]]
        pm[2:6] = s[2:6] * 0.9
    blo = rng.standard_normal(n)
    bhi = blo + np.abs(rng.standard_normal(n)) * 1e-3
    blo[0] = bhi[0] = -np.inf
    blo[1] = bhi[1] = np.inf
    blo[2], bhi[2] = -np.inf, 0.0
    return [torch.from_numpy(z) for z in (pm, pr, s)], B.mk(blo, bhi)


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("big", [False, True])
def test_close_products_fused_is_the_numpy_path(fmt, big, monkeypatch):
    # close_products takes the NumPy steps below CLOSE_COMPILED_MIN outputs and the compiled
    # pass from it: with the threshold at 0 the compiled pass runs on these small inputs.
    (pm, pr, s), bias = close_inputs(4, big=big)
    g64 = B.gamma(52, 2.0**-53)
    for b in (None, bias, B.mk(bias.lo[None], bias.hi[None])):
        small = P.close_products(pm, pr, s, 48, b, fmt, g64)
        monkeypatch.setattr(P, "CLOSE_COMPILED_MIN", 0)
        got = P.close_products(pm, pr, s, 48, b, fmt, g64)
        monkeypatch.undo()
        want = P._close_numpy(pm.numpy(), pr.numpy(), s.numpy(), 48, b, fmt, g64)
        assert bitwise_equal(got[0], want[0]) and bitwise_equal(got[1], want[1])
        assert bitwise_equal(small[0], want[0]) and bitwise_equal(small[1], want[1])
    # a full-shape bias takes the NumPy path and gives the same bounds as a row of it
    full = B.mk(np.broadcast_to(bias.lo, pm.shape).copy(), np.broadcast_to(bias.hi, pm.shape).copy())
    a = P.close_products(pm, pr, s, 48, full, fmt, g64)
    b = P.close_products(pm, pr, s, 48, bias, fmt, g64)
    assert bitwise_equal(a[0], b[0]) and bitwise_equal(a[1], b[1])
    assert np.isinf(b[0][:, 0]).all() and (b[1][:, 1] == np.inf).all()


def test_quick_check_is_check_inside():
    rng = np.random.default_rng(5)
    lo = rng.standard_normal((6, 50))
    hi = lo + np.abs(rng.standard_normal((6, 50)))
    ref = lo + (hi - lo) * rng.random((6, 50))
    tgt = lo + (hi - lo) * rng.random((6, 50))
    hi[0, :3] = lo[0, :3] = ref[0, :3] = tgt[0, :3] = 2.0  # zero widths: 0 / 0
    lo[1, 0], hi[1, 1] = -np.inf, np.inf
    ref[1, 0] = tgt[1, 0] = -np.inf  # an infinite value at its infinite end
    ref[2, 5] = lo[2, 5]  # on an edge
    hi[3, 7] = lo[3, 7] + 5e-324
    ref[3, 7] = tgt[3, 7] = lo[3, 7]
    b = B.mk(lo, hi)
    got = opcheck.check(0, "op", b, ref, tgt)
    want = opcheck.check_inside(0, "op", lo, hi, ref, tgt, False)
    assert dataclasses.astuple(got) == dataclasses.astuple(want)
    for bad in (np.nan, hi[4, 4] + 1.0):  # outside or NaN: the full check
        r = ref.copy()
        r[4, 4] = bad
        got = opcheck.check(0, "op", b, r, tgt)
        want = opcheck.check_any(0, "op", lo, hi, r, tgt, False)
        assert got.verdict == "Type-II"
        assert str(dataclasses.astuple(got)) == str(dataclasses.astuple(want))
    # 0-d arrays
    z = B.mk(np.array(1.0), np.array(2.0))
    c = opcheck.check(0, "op", z, np.array(1.5), np.array(1.5))
    assert c.verdict == "Type-I" and c.element == () and c.margin == 0.5
