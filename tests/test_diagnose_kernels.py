"""triage's whole-rule kernels (intervals/torch_ops/kernels.py, and the compiled passes in
products, rows, rules, layers and triage that use them) give the bounds of the NumPy and torch steps they
replaced: matrix products against the BLAS path, layer / RMS norm, softmax, unary functions,
sums, scaled scores, paired leaves and the hull check against those steps written out here,
bit for bit, on random values with edge cases (infinite ends, whole lines, NaN, values near
each format's largest finite). Their soundness against real kernels is tested in
test_diagnose_rules.py and test_diagnose_layers.py."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
import torch
from test_diagnose_fused import bitwise_equal

from precisionlab import intervals as iv
from precisionlab.diagnose import opcheck
from precisionlab.diagnose.pairing import _join, leaf_of
from precisionlab.formats import get_format
from precisionlab.intervals.torch_ops import arith as B
from precisionlab.intervals.torch_ops import products as P
from precisionlab.intervals.torch_ops import rows as RW
from precisionlab.intervals.torch_ops import rules as R

FORMATS = ("float64", "float32", "bfloat16", "float16")


def same(a: iv.Interval, b: iv.Interval) -> bool:
    """Equal bounds bit for bit."""
    return bitwise_equal(a.lo, b.lo) and bitwise_equal(a.hi, b.hi)


def boxes(shape, seed: int, scale: float = 1.0, edges: bool = True) -> iv.Interval:
    """Random boxes of widths from 0 to about 1e-3 relative; with edges: an exact zero, a point,
    an infinite lower end, a whole line and an entry near float16's largest finite."""
    rng = np.random.default_rng(seed)
    m = rng.standard_normal(shape) * scale
    r = np.abs(m) * rng.choice([0.0, 2.0**-20, 1e-3], size=shape)
    lo, hi = m - r, m + r
    if edges and lo.size >= 8:
        f_lo, f_hi = lo.reshape(-1), hi.reshape(-1)
        f_lo[0] = f_hi[0] = 0.0
        f_lo[1], f_hi[1] = -np.inf, 1.0
        f_lo[2], f_hi[2] = -np.inf, np.inf
        f_lo[3], f_hi[3] = 65000.0, 65600.0
    return B.mk(lo, hi)


# --------------------------------------------------------------------------- matrix products


@pytest.mark.parametrize("fmt", ("float32", "bfloat16", "float16"))
@pytest.mark.parametrize("wdt", (torch.float32, torch.bfloat16, torch.float16))
def test_float32_path_is_the_blas_path(fmt, wdt):
    """`mm`'s compiled path (`_mm32`) against `_mm_blas`: a leaf weight (transposed, with and
    without a bias), and boxes (batched, with operand_rel)."""
    assert P._ieee_float32()
    g = torch.Generator().manual_seed(3)
    w32 = torch.randn(24, 40, generator=g) * 0.2
    w = leaf_of(w32.to(wdt), w32, {"float32"})
    rr = w.radius(fmt)
    a = boxes((2, 5, 40), 1)
    bias = boxes((24,), 2, edges=False)
    bias.lo[3] = bias.hi[3] = -np.inf  # an infinite bias entry
    for bb in (None, bias):
        if rr is None:
            continue
        got = P._mm32(a, w, bb, fmt, True, 0.0, rr)
        want = P._mm_blas(a, w, bb, fmt, True, 0.0, rr)
        assert got is not None and same(got, want)
    q, k = boxes((2, 3, 6, 8), 4), boxes((2, 3, 8, 7), 5)
    for orel in (0.0, 3 * 2.0**-24):
        got = P._mm32(q, k, None, fmt, False, orel, None)
        assert got is not None and same(got, P._mm_blas(q, k, None, fmt, False, orel, None))
    kt = B.mk(np.swapaxes(k.lo, -1, -2).copy(), np.swapaxes(k.hi, -1, -2).copy())
    assert same(P._mm32(q, kt, None, fmt, True, 0.0, None),
                P._mm_blas(q, kt, None, fmt, True, 0.0, None))
    # broadcast batch axes and a full-shape bias are left to the BLAS path
    assert P._mm32(q, boxes((1, 3, 8, 7), 6), None, fmt, False, 0.0, None) is None
    assert P._mm32(a, w, boxes((2, 5, 24), 7), fmt, True, 0.0, rr) is None


# --------------------------------------------------------------------------- rows


def rowsum(a: np.ndarray) -> np.ndarray:
    """Sums over the last axis in `fused.rowsum`'s order: NumPy's up to 128 terms, longer rows
    as consecutive blocks of 128 added in turn."""
    t = np.zeros((*a.shape[:-1], 1))
    for c in range(0, a.shape[-1], 128):
        t = t + np.sum(a[..., c:c + 128], -1, keepdims=True)
    return t


def np_norm(x, nshape, w, b, eps, fmt, rms=False):
    """Layer / RMS norm in NumPy steps (the rule `kernels.norm_rows` replaced; sums in
    `rowsum`'s order)."""
    eps_lo, eps_hi = (eps, eps) if np.isscalar(eps) else eps
    lead = x.shape[: x.ndim - len(nshape)]
    n = math.prod(nshape)
    lo, hi = x.lo.reshape(*lead, n), x.hi.reshape(*lead, n)
    g = B.gamma(n + 4, 2.0**-53)
    if rms:
        d = B.mk(lo, hi)
    else:
        with np.errstate(invalid="ignore", over="ignore"):
            m_lo, m_hi = rowsum(lo) / n, rowsum(hi) / n
            sl = rowsum(np.abs(lo)) / n + rowsum(np.abs(hi)) / n
            m_lo, m_hi = B.down(m_lo - g * sl), B.up(m_hi + g * sl)
            d = B.mk(B.down(lo - m_hi), B.up(hi - m_lo))
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        sq = R._square(d)
        v_lo = B.down(rowsum(sq.lo) / n * (1 - g))
        v_hi = B.up(rowsum(sq.hi) / n * (1 + g))
        r_hi = B.up(1.0 / np.sqrt(B.down(np.maximum(v_lo, 0.0) + eps_lo)) * (1 + g))
        r_lo = B.down(1.0 / np.sqrt(B.up(v_hi + eps_hi)) * (1 - g))
        r_lo = np.where(np.isnan(r_lo), 0.0, r_lo)
        y = R._mul_iv(d, B.mk(r_lo, r_hi))
        xmax = np.max(np.maximum(np.abs(lo), np.abs(hi)), -1, keepdims=True)
        xhat = np.maximum(np.abs(y.lo), np.abs(y.hi))
        wabs, babs = 1.0, 0.0
        if w is not None:
            wi = B.mk(w.lo.reshape(n), w.hi.reshape(n))
            y = R._mul_iv(y, wi)
            wabs = np.maximum(np.abs(wi.lo), np.abs(wi.hi))
        if b is not None:
            bi = B.mk(b.lo.reshape(n), b.hi.reshape(n))
            y = B.mk(B.down(y.lo + bi.lo), B.up(y.hi + bi.hi))
            babs = np.maximum(np.abs(bi.lo), np.abs(bi.hi))
        u = get_format(B.internal(fmt)).unit_roundoff
        yabs = np.maximum(np.abs(y.lo), np.abs(y.hi))
        r = u * ((2 * n + 16) * xmax * r_hi * wabs + 4 * yabs + 2 * babs)
        r = r + 2 * B.u_out(fmt) * (2 * xhat * wabs + babs + yabs)
        y = B.round_into(B.widen_abs(y, np.fmin(r, np.inf)), fmt)
        big = 4 * n * xmax**2 >= get_format(B.internal(fmt)).max_finite
    nan = (np.isinf(lo) | np.isinf(hi)).any(-1, keepdims=True) | big
    y = B.nan_where(y, nan)
    return B.mk(y.lo.reshape(x.shape), y.hi.reshape(x.shape))


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("n", [5, 48, 300])
def test_norm_rows_are_the_numpy_steps(fmt, n):
    x = boxes((7, n), n, scale=3.0)
    x.lo[4, :], x.hi[4, :] = 1e19, 1e19 + 1e4  # squares that may overflow float32
    w, b = boxes((n,), 1, edges=False), boxes((n,), 2, edges=False)
    for ww, bb, rms, eps in ((w, b, False, 1e-5), (None, None, False, 0.0), (w, None, True,
                                                                             (1e-16, 1e-7))):
        got = RW._norm_rule(x, (n,), ww, bb, eps, fmt, rms)
        assert same(got, np_norm(x, (n,), ww, bb, eps, fmt, rms))
    assert (RW._norm_rule(x, (n,), w, b, 1e-5, fmt).lo[0] == -np.inf).all()  # infinite ends


def np_softmax(x, dim, fmt):
    """Softmax in NumPy steps (the rule `kernels.softmax_in` / `softmax_out` replaced)."""
    n = x.shape[dim]

    def exact(z):
        _, e_lo, e_hi, s_lo, s_hi = RW._lse_parts(z)
        with np.errstate(invalid="ignore", divide="ignore"):
            other_hi = np.maximum(s_hi - e_lo, 0.0) * (1 + 2.0**-50) + B.ABS_SLACK
            other_lo = np.maximum(s_lo - e_hi, 0.0) * (1 - 2.0**-50)
            lo = e_lo / (e_lo + other_hi) * (1 - 2.0**-50)
            hi = e_hi / (e_hi + other_lo) * (1 + 2.0**-50)
        lo, hi = np.where(np.isnan(lo), 0.0, lo), np.where(np.isnan(hi), 1.0, hi)
        return B.mk(np.clip(lo, 0, 1), np.clip(hi, 0, 1))

    def fn(z):
        u = get_format(B.internal(fmt)).unit_roundoff
        with np.errstate(invalid="ignore", over="ignore"):
            r = 2 * u * (np.max(z.hi, -1, keepdims=True) - z.lo)
        r = np.where(z.hi == -np.inf, 0.0, np.fmin(r, np.inf))
        return B.nan_where(exact(B.widen_abs(z, r)), RW._row_nan(z))
    lo, hi = np.moveaxis(x.lo, dim, -1), np.moveaxis(x.hi, dim, -1)
    y = fn(B.mk(lo, hi))
    y = B.mk(np.moveaxis(y.lo, -1, dim), np.moveaxis(y.hi, -1, dim))
    nan = B.whole(y)
    y = B.finish(y, fmt, n + 4, extra=2.0)
    return B.nan_where(B.mk(np.maximum(y.lo, 0.0), np.minimum(y.hi, 1.0)), nan)


@pytest.mark.parametrize("fmt", FORMATS)
def test_softmax_kernels_are_the_numpy_steps(fmt):
    x = boxes((3, 4, 9), 8, scale=4.0)
    x.lo[1, 2, :] = x.hi[1, 2, :] = -np.inf  # a fully masked row: NaN in the program
    x.lo[2, 0, 3:] = x.hi[2, 0, 3:] = -np.inf  # masked entries
    x.lo[0, 3, 4], x.hi[0, 3, 4] = 80.0, 90.0  # exponentials far apart
    for dim in (-1, 0, 1):
        assert same(RW.softmax_rule(x, dim, fmt), np_softmax(x, dim, fmt))


# --------------------------------------------------------------------------- elementwise


def np_unary(x, fn, fmt, ulps, kind, xmin=0.0, absc=0.0, over=math.inf, flush=False,
             domain=False):
    """A unary rule in NumPy steps (`_mono` / unimodal, `widen_abs`, `finish`, ...), the chain
    `kernels.unary_ends` began."""
    a, b = R._fn64(fn, x.lo), R._fn64(fn, x.hi)
    if kind == 2:
        fmin = float(fn(torch.tensor(xmin, dtype=torch.float64)))
        inside = (x.lo <= xmin) & (x.hi >= xmin)
        lo = np.where(inside, fmin - abs(fmin) * 1e-6, np.minimum(a, b))
        hi = np.maximum(a, b)
    else:
        lo, hi = (a, b) if kind == 0 else (b, a)
    with np.errstate(invalid="ignore", over="ignore"):
        y = B.mk(B.down(lo - np.abs(lo) * B.REL_SLACK - B.ABS_SLACK), B.up(hi + np.abs(hi) * B.REL_SLACK +
                                                                    B.ABS_SLACK))
        if absc:
            y = B.widen_abs(y, absc * np.maximum(np.abs(x.lo), np.abs(x.hi)))
    y = B.finish(y, fmt, ulps)
    if over < math.inf:
        y = B.mk(y.lo, np.where(x.hi >= over, np.inf, y.hi))
    if flush:
        t = -(math.log(get_format(B.internal(fmt)).max_finite) - 1.0)
        low = x.lo < t
        y = B.mk(np.where(low, np.minimum(y.lo, 0.0), y.lo),
                 np.where(low, np.maximum(y.hi, 0.0), y.hi))
    return B.nan_where(y, (R._negative(x) if domain else False) | B.whole(x))


@pytest.mark.parametrize("fmt", FORMATS)
def test_unary_kernel_is_the_numpy_steps(fmt):
    x = boxes((6, 50), 9, scale=30.0)
    x.lo[5, :3], x.hi[5, :3] = [-800.0, -1.0, 1e300], [-700.0, 2.0, 1e301]
    inner = get_format(B.internal(fmt))
    t = -(math.log(inner.max_finite) - 1.0)
    cases = [  # (fn, ulps, kind, xmin, absc, over, flush, domain), as rules.RULES uses them
        (R._gelu64("none"), 4.0, 2, -0.7517916243, 8 * inner.unit_roundoff, inner.max_finite / 2,
         False, False),
        (R._gelu64("tanh"), 8.0, 2, -0.7517916243, 8 * inner.unit_roundoff, inner.max_finite / 2,
         False, False),
        (torch.nn.functional.silu, 4.0, 2, -1.2784645428, 0.0, math.inf, True, False),
        (torch.tanh, 4.0, 0, 0.0, 0.0, math.inf, False, False),
        (torch.sigmoid, 4.0, 0, 0.0, 0.0, math.inf, True, False),
        (torch.exp, 4.0, 0, 0.0, 0.0, math.inf, False, False),
        (torch.log, 4.0, 0, 0.0, 0.0, math.inf, False, True),
    ]
    for fn, ulps, kind, xmin, absc, over, flush, domain in cases:
        got = R.unary_bound(x, fn, fmt, ulps, kind, xmin, absc, over, t if flush else -math.inf,
                            domain)
        assert same(got, np_unary(x, fn, fmt, ulps, kind, xmin, absc, over, flush, domain))


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("minus", [False, True])
def test_fused_sum_is_add_finite(fmt, minus):
    a, b = boxes((4, 30), 10, edges=False), boxes((4, 30), 11, edges=False)
    big = np.finfo(np.float64).max
    a.lo[0, :2], a.hi[0, :2] = big / 1.5, big / 1.5  # sums past float64's largest finite
    b.lo[0, :2], b.hi[0, :2] = (-big / 1.5, -big / 1.5) if minus else (big / 1.5, big / 1.5)
    want = B.round_into(R._add_finite(a, b, minus, B.internal(fmt)), fmt)
    assert same(R._add_fused(a, b, minus, fmt), want)
    row = B.mk(b.lo[1], b.hi[1])  # broadcast
    want = B.round_into(R._add_finite(a, row, minus, B.internal(fmt)), fmt)
    assert same(R._add_fused(a, row, minus, fmt), want)
    assert R._add_fused(boxes((4, 30), 12), b, minus, fmt) is None  # an infinite end


def test_scaled_is_mul_iv():
    from precisionlab.intervals.torch_ops import fused, kernels

    s = boxes((2, 3, 5, 5), 13, scale=5.0)
    for c in ((0.37 * (1 - 2.0**-52), 0.37 * (1 + 2.0**-52)), (-2.0, 0.5), (0.0, np.inf)):
        lo, hi = np.empty(s.shape), np.empty(s.shape)
        kernels.scaled(fused.flat(s.lo), fused.flat(s.hi), *c, lo.reshape(-1), hi.reshape(-1))
        assert same(B.mk(lo, hi), R._mul_iv(s, B.mk(*c)))


# --------------------------------------------------------------------------- leaves and checks


def test_leaf_pairs_are_joined_leaves():
    g = torch.Generator().manual_seed(14)
    v = torch.randn(40, generator=g) * torch.exp2(torch.randint(-30, 30, (40,), generator=g))
    v[:6] = torch.tensor([0.0, -0.0, math.inf, -math.inf, math.nan, 1e-41])
    pairs = [(v.to(torch.bfloat16), v), (v[:7].half(), v[:7].double()),
             (v.reshape(5, 8), v.reshape(5, 8)), (v[:3].bfloat16(), v[:3])]
    got = B.leaf_pairs(pairs)
    for (t, o), y in zip(pairs, got, strict=True):
        want = _join(B.leaf(t), B.leaf(o))
        assert same(y, want) and same(B.leaf(t, o), want)


@pytest.mark.parametrize("nan", [False, True])
def test_hull_check_is_the_check_on_the_hull(nan):
    g = torch.Generator().manual_seed(15)
    ref = torch.randn(3, 4, 5, generator=g)
    tgt = ref.bfloat16()
    if nan:
        ref[1, 2, 3] = math.nan
    r, t = opcheck.values(ref, tgt)
    h = opcheck.hull(t.astype(np.float64), r.astype(np.float64))
    c, held = opcheck.check_hull(7, "op", ref, tgt)
    want, want_h = opcheck.check_values(7, "op", h, ref, tgt, True, True)
    assert str(dataclasses.astuple(c)) == str(dataclasses.astuple(want))
    assert same(held, h) and same(want_h, h)
