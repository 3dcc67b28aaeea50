"""The NumPy tier of the torch-operation rules' elementwise kernels (intervals/torch_ops/small.py)
gives the compiled kernels' (fused.py) float64 values and return values bit for bit, on hard
values (signed zeros, subnormals, +-inf, NaN, ties of each format, values past each format's
largest finite, float64's largest, huge gaps, empty intervals) at sizes on both sides of the
tier, and the tier depends on the input's size only."""

from __future__ import annotations

import numpy as np
import pytest

from precisionlab.formats import get_format
from precisionlab.intervals.torch_ops import arith, fused, kernels, small

FORMATS = ("float64", "float32", "tf32", "bfloat16", "float16", "float8_e5m2", "float8_e4m3fn")
SIZES = (1, 7, 130, small.NUMPY_MAX_SIZE, small.NUMPY_MAX_SIZE + 1)


def hard_values(seed: int) -> np.ndarray:
    """Edge values of every format, their neighbours and halfway points, and random bits."""
    rng = np.random.default_rng(seed)
    with np.errstate(over="ignore"):
        return _hard_values(rng)


def _hard_values(rng) -> np.ndarray:
    base = [0.0, -0.0, np.inf, -np.inf, np.nan, 1.0, 1.5, 2.0**-1074, 2.0**-1022,
            np.finfo(np.float64).max, 1e300, 1e-300]
    for name in FORMATS:
        f = get_format(name)
        for v in (f.max_finite, f.min_normal, f.min_subnormal, f.eps):
            base += [v, v * (1 + f.eps / 2), v * (1 + f.eps), v * (1 - f.eps / 4), v / 2,
                     v * 2, 1 + f.eps / 2, 1 + 3 * f.eps / 2]
    base = np.array(base)
    base = np.concatenate([base, -base, np.nextafter(base, np.inf), np.nextafter(base, -np.inf)])
    bits = rng.integers(-2**63, 2**63 - 1, 256, dtype=np.int64, endpoint=True).view(np.float64)
    mags = rng.uniform(-1, 1, 256) * 2.0 ** rng.integers(-1080, 1030, 256)
    return np.concatenate([base, bits, mags])


def sized(n: int, seed: int) -> np.ndarray:
    """n hard values (tiled and shuffled)."""
    v = hard_values(seed)
    return np.random.default_rng(seed + 1).permutation(np.resize(v, max(n, 1)))[:n].copy()


def same_bits(a, b) -> bool:
    """Equal float64 arrays bit for bit (any NaN equals any NaN)."""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    nan = np.isnan(a)
    return bool(np.array_equal(nan, np.isnan(b))
                and np.array_equal(a[~nan].view(np.int64), b[~nan].view(np.int64)))


def pair(n: int, seed: int, finite: bool = False):
    """(lo, hi): mostly ordered ends, some empty (lo > hi) and some NaN."""
    a, b = sized(n, seed), sized(n, seed + 7)
    if finite:
        a, b = (np.where(np.isfinite(z), z, 1.0) for z in (a, b))
    lo, hi = np.minimum(a, b), np.maximum(a, b)
    swap = np.random.default_rng(seed).random(n) < 0.1  # empty intervals
    lo[swap], hi[swap] = hi[swap], lo[swap]
    return np.ascontiguousarray(lo), np.ascontiguousarray(hi)


def run_both(name, *args, n):
    """The small-tier function and the compiled kernel on copies of args with fresh outputs;
    (their return values, their outputs)."""
    outs = []
    for fn in (getattr(small, name), getattr(fused, name, None) or getattr(kernels, name)):
        o1, o2 = np.full(n, 3.25), np.full(n, -3.25)
        r = fn(*[a.copy() if isinstance(a, np.ndarray) else a for a in args], o1, o2)
        outs.append((r, o1, o2))
    return outs


def test_the_tier_depends_on_the_input_size_only():
    assert small.numpy_tier(small.NUMPY_MAX_SIZE) and not small.numpy_tier(
        small.NUMPY_MAX_SIZE + 1)
    assert small.numpy_tier(1) == small.numpy_tier(1)  # no state: the same answer again


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("sign", [-1.0, 1.0])
def test_step_matches_the_kernel(n, sign):
    a = sized(n, n)
    o1, o2 = np.empty(n), np.empty(n)
    small.step(a, sign, o1)
    fused.step(a, sign, o2)
    assert same_bits(o1, o2)


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("ftz", [False, True])
def test_widen_rel_matches_the_kernel(n, fmt, ftz):
    f = get_format(fmt)
    lo, hi = pair(n, n + 1)
    for ulps in (0.5, 1.0, 3.0):
        (r1, a1, b1), (r2, a2, b2) = run_both(
            "widen_rel", lo, hi, ulps, f.eps, f.min_subnormal, f.min_normal if ftz else 0.0, n=n)
        assert r1 == r2 and same_bits(a1, a2) and same_bits(b1, b2)


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("fmt", FORMATS)
def test_round_out_matches_the_kernel(n, fmt):
    lo, hi = pair(n, n + 2)
    (r1, a1, b1), (r2, a2, b2) = run_both("round_out", lo, hi, *arith.rounding(fmt), n=n)
    assert r1 == r2 and same_bits(a1, a2) and same_bits(b1, b2)
    ordered = (lo <= hi).all()
    assert r1 == ordered or not ordered  # an ordered box stays ordered


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("minus", [False, True])
def test_add_out_matches_the_kernel(n, fmt, minus):
    alo, ahi = pair(n, n + 3, finite=True)
    blo, bhi = pair(n, n + 4, finite=True)
    (r1, a1, b1), (r2, a2, b2) = run_both("add_out", alo, ahi, blo, bhi, minus,
                                          *arith.rounding(fmt), n=n)
    assert r1 == r2 and r1 >= 0 and same_bits(a1, a2) and same_bits(b1, b2)
    # an end that is not finite: both refuse (-1)
    ahi[n // 2] = np.inf
    (r1, *_), (r2, *_) = run_both("add_out", alo, ahi, blo, bhi, minus,
                                  *arith.rounding(fmt), n=n)
    assert r1 == r2 == -1


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("fmt", (*FORMATS, "int"))
@pytest.mark.parametrize("join", [False, True])
def test_leaf_box_matches_the_kernel(n, fmt, join):
    if fmt == "int":
        emin, mbits, half0 = 0, -1, 0.0
    else:
        f = get_format(fmt)
        emin, mbits, half0 = f.emin, (-1 if fmt == "float64" else f.mantissa_bits), \
            f.min_subnormal / 2
    v = sized(n, n + 5)
    c, d = pair(n, n + 6)
    o = []
    for fn in (small.leaf_box, fused.leaf_box):
        lo, hi = c.copy(), d.copy()
        fn(v, emin, mbits, half0, join, lo, hi)
        o.append((lo, hi))
    assert same_bits(o[0][0], o[1][0]) and same_bits(o[0][1], o[1][1])


@pytest.mark.parametrize("n", SIZES)
def test_scaled_matches_the_kernel(n):
    lo, hi = pair(n, n + 8)
    for c_lo, c_hi in ((0.5, 2.0), (-3.0, 0.0), (-0.0, 0.0), (-np.inf, 1.0), (1e300, 1e308),
                       (2.0**-1074, 2.0**-1000), (np.nan, 1.0), (-2.0, -1.0)):
        (_, a1, b1), (_, a2, b2) = run_both("scaled", lo, hi, c_lo, c_hi, n=n)
        assert same_bits(a1, a2) and same_bits(b1, b2)


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("kind", [0, 1, 2])
@pytest.mark.parametrize("absc", [0.0, 2.0**-24])
def test_unary_ends_matches_the_kernel(n, kind, absc):
    lo, hi = pair(n, n + 9)
    fa, fb = sized(n, n + 10), sized(n, n + 11)  # f's values: any, NaN and inf among them
    for xmin, fminv in ((0.0, 0.0), (1.5, -0.25), (-np.inf, 1.0)):
        (_, a1, b1), (_, a2, b2) = run_both("unary_ends", lo, hi, fa, fb, kind, xmin, fminv,
                                            2.0**-52, 2.0**-1074, absc, n=n)
        assert same_bits(a1, a2) and same_bits(b1, b2)


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("keep", [False, True])
def test_inside_worst_matches_the_kernel(n, dtype, keep):
    rng = np.random.default_rng(n)
    with np.errstate(invalid="ignore", over="ignore"):
        _inside_worst_cases(n, dtype, keep, rng)


def _inside_worst_cases(n, dtype, keep, rng):
    lo, hi = pair(n, n + 12)
    lo, hi = np.minimum(lo, hi), np.maximum(lo, hi)  # ordered (NaN ends stay)
    for case in ("inside", "ends", "outside"):
        t = rng.random(n)
        ref = np.where(np.isfinite(lo) & np.isfinite(hi), lo + t * (hi - lo), 0.0)
        if case == "ends":  # values at the ends: margin 0, ties between entries
            ref = np.where(t < 0.5, lo, hi)
        ref = np.where(np.isnan(ref), 0.0, ref).astype(dtype).astype(np.float64)
        ok = (ref >= lo) & (ref <= hi)
        lo2 = np.where(ok, lo, -np.inf) if case != "outside" else lo
        hi2 = np.where(ok, hi, np.inf) if case != "outside" else hi
        tgt = ref.copy()  # outside: values of other entries; else ends or midpoints
        tgt[::3] = ref[::-1][::3] if case == "outside" else np.where(
            t[::3] < 0.3, lo2[::3], np.where(t[::3] < 0.6, hi2[::3], ref[::3]))
        tgt = tgt.astype(dtype).astype(np.float64)
        if case != "outside":
            tgt = np.where((tgt >= lo2) & (tgt <= hi2), tgt, ref)
        ref_d, tgt_d = ref.astype(dtype), tgt.astype(dtype)
        got = []
        for fn in (small.inside_worst, fused.inside_worst):
            h1, h2 = np.full(n, 7.0), np.full(n, -7.0)
            r = fn(lo2.copy(), hi2.copy(), ref_d.copy(), tgt_d.copy(), keep, h1, h2)
            got.append((r, h1, h2))
        (r1, a1, b1), (r2, a2, b2) = got
        assert r1[0] == r2[0] and same_bits(np.array(r1[1:]), np.array(r2[1:]))
        assert same_bits(a1, a2) and same_bits(b1, b2)


@pytest.mark.parametrize("n", [1, 3, 16, 130, small.NUMPY_MAX_SIZE // 4])
@pytest.mark.parametrize("rows", [1, 4, 5])
def test_softmax_in_matches_the_kernel(n, rows):
    m = n * rows
    if m > small.NUMPY_MAX_SIZE + 1:
        m, rows = (small.NUMPY_MAX_SIZE // n + 1) * n, small.NUMPY_MAX_SIZE // n + 1
    rng = np.random.default_rng(m)
    with np.errstate(invalid="ignore", over="ignore"):
        lo, hi = pair(m, m + 13)
        scale = rng.choice([1e-3, 1.0, 1e4, 1e300], m)
        lo, hi = np.where(np.isfinite(lo), lo % 7, lo) * scale, np.where(np.isfinite(hi), hi % 7,
                                                                         hi) * scale
    mask = rng.random(m) < 0.3  # masked scores: -inf, or -1e4 added
    lo[mask], hi[mask] = -np.inf, -np.inf
    lo[rng.random(m) < 0.05] -= 1e4
    if rows > 1:
        lo[:n], hi[:n] = -np.inf, -np.inf  # a row masked throughout
    for u2 in (2.0**-24, 2.0**-8):
        got = []
        for fn in (small.softmax_in, kernels.softmax_in):
            a, b, r = np.full(m, 9.0), np.full(m, -9.0), np.zeros(rows, bool)
            fn(lo.copy(), hi.copy(), n, u2, a, b, r)
            got.append((a, b, r))
        (a1, b1, r1), (a2, b2, r2) = got
        assert same_bits(a1, a2) and same_bits(b1, b2) and np.array_equal(r1, r2)


ROW_LENGTHS = (1, 7, 8, 9, 127, 128, 129, 300)


def norm_box(nrow: int, n: int, seed: int):
    """(lo, hi) of nrow rows of n entries, each row of one kind: ordinary, straddling zero, point
    values, subnormal-scale (float32's and float64's), huge (squares past float32's largest),
    float64's largest, an infinite end, a NaN end, hard values."""
    rng = np.random.default_rng(seed)
    lo, hi = np.empty((nrow, n)), np.empty((nrow, n))
    kinds = ("plain", "straddle", "point", "sub32", "sub64", "huge", "max64", "inf", "nan", "hard")
    for r in range(nrow):
        kind = kinds[(r + seed) % len(kinds)]
        x = rng.standard_normal(n) * rng.choice([1e-3, 1.0, 3e2])
        w = np.abs(rng.standard_normal(n)) * rng.choice([0.0, 1e-6, 0.1])
        scale = {"sub32": 1e-40, "sub64": 1e-310, "huge": 1e19, "max64": 1e153}.get(kind, 1.0)
        with np.errstate(under="ignore", over="ignore"):
            a, b = (x - w) * scale, (x + w) * scale
        if kind == "straddle":
            a, b = -np.abs(a) - 0.5, np.abs(b) + 0.5
        elif kind == "point":
            b = a
        elif kind == "inf":
            b[rng.integers(n)] = np.inf
        elif kind == "nan":
            a[rng.integers(n)] = np.nan
        elif kind == "hard":
            a, b = pair(n, seed + r, finite=rng.random() < 0.7)
        lo[r], hi[r] = a, b
    return lo.reshape(-1).copy(), hi.reshape(-1).copy()


def norm_args(n, seed, fmt, rms, eps, has_w, has_b, nrow=5):
    """`kernels.norm_rows`' arguments as `rows._norm_rule` passes them (without the outputs)."""
    inner = get_format(arith.internal(fmt))
    lo, hi = norm_box(nrow, n, seed)
    rng = np.random.default_rng(seed + 1)
    none = np.zeros(1)
    wlo, whi, blo, bhi = none, none, none, none
    if has_w:
        wlo = rng.standard_normal(n) * rng.choice([1e-3, 1.0, 1e3], n)
        wlo[::11], wlo[1::13] = 0.0, -0.0
        whi = wlo + np.abs(rng.standard_normal(n)) * (rng.random(n) < 0.5)
        whi[2::17] = np.inf  # an unbounded weight
    if has_b:
        blo = rng.standard_normal(n)
        bhi = blo + np.abs(rng.standard_normal(n)) * (rng.random(n) < 0.5)
        blo[3::19] = -1e300
    e_lo, e_hi = (eps, eps) if np.isscalar(eps) else eps
    return (lo, hi, nrow, n, rms, float(e_lo), float(e_hi), has_w, wlo, whi, has_b, blo, bhi,
            arith.gamma(n + 4, 2.0**-53), inner.unit_roundoff, arith.u_out(fmt),
            inner.max_finite, inner.min_normal, *arith.rounding(fmt))


def norm_both(args):
    """small.norm_rows and kernels.norm_rows on copies of args; their outputs."""
    size = args[0].size
    outs = []
    for fn in (small.norm_rows, kernels.norm_rows):
        o1, o2 = np.full(size, 3.25), np.full(size, -3.25)
        fn(*[a.copy() if isinstance(a, np.ndarray) else a for a in args], o1, o2)
        outs.append((o1, o2))
    return outs


@pytest.mark.parametrize("n", ROW_LENGTHS)
@pytest.mark.parametrize("fmt", ["float32", "bfloat16", "float16", "float64"])
@pytest.mark.parametrize("rms", [False, True])
def test_norm_rows_matches_the_kernel(n, fmt, rms):
    for eps in (0.0, 1e-5, (np.finfo(np.float64).eps, np.finfo(np.float32).eps)):
        for has_w, has_b in ((False, False), (True, False), (True, True)):
            if rms and has_b:
                continue
            args = norm_args(n, n + len(fmt), fmt, rms, eps, has_w, has_b, nrow=12)
            (a1, b1), (a2, b2) = norm_both(args)
            assert same_bits(a1, a2) and same_bits(b1, b2), (eps, has_w, has_b)


@pytest.mark.parametrize("n", [8, 300])
def test_norm_rows_as_channel_norms_call_it(n):
    """channel_norms' call: no weight or bias, float64 (no rounding), the dtype's tiny."""
    args = list(norm_args(n, n, "bfloat16", False, 1e-5, False, False, nrow=10))
    args[-4:] = arith.rounding("float64")
    args[17] = get_format("float16").min_normal
    (a1, b1), (a2, b2) = norm_both(args)
    assert same_bits(a1, a2) and same_bits(b1, b2)


def test_norm_rows_past_the_tier_calls_the_kernel(monkeypatch):
    n = 300
    nrow = small.NUMPY_MAX_SIZE // n + 1
    calls = []
    real = kernels.norm_rows

    def spy(*a):
        calls.append(a[0].size)
        return real(*a)

    monkeypatch.setattr(kernels, "norm_rows", spy)
    big = norm_args(n, 3, "bfloat16", False, 1e-5, True, True, nrow=nrow)
    assert big[0].size > small.NUMPY_MAX_SIZE
    small.norm_rows(*big, np.empty(big[0].size), np.empty(big[0].size))
    assert calls == [big[0].size]
    few = norm_args(n, 3, "bfloat16", False, 1e-5, True, True, nrow=small.NUMPY_MAX_SIZE // n)
    small.norm_rows(*few, np.empty(few[0].size), np.empty(few[0].size))
    assert calls == [big[0].size]  # within the tier: NumPy only


def softmax_exps(n: int, rows: int, seed: int):
    """(ea, eb, row_nan): exponentials of shifted boxes as `rows.softmax_rule` makes them, with
    zeros (masked entries), subnormals, ones, NaN from inf - inf, huge values and flagged rows."""
    rng = np.random.default_rng(seed)
    m = n * rows
    a = -np.abs(rng.standard_normal(m)) * rng.choice([1e-3, 1.0, 30.0, 745.0, 800.0], m)
    b = a + np.abs(rng.standard_normal(m)) * rng.choice([0.0, 1e-8, 1.0], m)
    b[rng.random(m) < 0.2] = 0.0  # the row maximum
    a[rng.random(m) < 0.1] = -np.inf
    with np.errstate(over="ignore", invalid="ignore"):
        ea, eb = np.exp(a), np.exp(b)
    eb[rng.random(m) < 0.02] = np.nan
    eb[rng.random(m) < 0.02] = np.inf
    ea[rng.random(m) < 0.01] = np.nan
    return ea, eb, rng.random(rows) < 0.2


@pytest.mark.parametrize("n", ROW_LENGTHS)
@pytest.mark.parametrize("rows", [1, 6])
def test_softmax_out_matches_the_kernel(n, rows):
    ea, eb, row_nan = softmax_exps(n, rows, n + rows)
    m = n * rows
    for g in (arith.gamma(n + 2, 2.0**-53), 0.0):
        got = []
        for fn in (small.softmax_out, kernels.softmax_out):
            o1, o2 = np.full(m, 3.25), np.full(m, -3.25)
            fn(ea.copy(), eb.copy(), n, g, arith.REL_SLACK, arith.ABS_SLACK, row_nan.copy(),
               o1, o2)
            got.append((o1, o2))
        (a1, b1), (a2, b2) = got
        assert same_bits(a1, a2) and same_bits(b1, b2)


def test_softmax_out_past_the_tier_calls_the_kernel(monkeypatch):
    n = 128
    rows = small.NUMPY_MAX_SIZE // n + 1
    calls = []
    real = kernels.softmax_out
    monkeypatch.setattr(kernels, "softmax_out", lambda *a: calls.append(1) or real(*a))
    ea, eb, row_nan = softmax_exps(n, rows, 5)
    m = n * rows
    small.softmax_out(ea, eb, n, 1e-14, 2.0**-52, 2.0**-1074, row_nan, np.empty(m), np.empty(m))
    assert calls == [1]
    small.softmax_out(ea[:m - n], eb[:m - n], n, 1e-14, 2.0**-52, 2.0**-1074, row_nan,
                      np.empty(m - n), np.empty(m - n))
    assert calls == [1]


MM_INNER = (1, 7, 8, 9, 127, 128, 129, 300)
MM_FORMATS = ("float32", "bfloat16", "float16")


def mm_box(size: int, seed: int, mild: bool = False):
    """(lo, hi) of size entries: ordinary values, with zeros, subnormals, huge values (past
    float32's largest and float64's half largest), infinite ends, NaN ends and hard values
    (mild: ordinary values, zeros and subnormals only, rarer)."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(size) * rng.choice([1e-3, 1.0, 3e2], size)
    w = np.abs(rng.standard_normal(size)) * rng.choice([0.0, 1e-6, 0.1], size)
    lo, hi = x - w, x + w
    kind = rng.integers(0, 40 if mild else 12, size)
    if mild:
        kind = np.where(kind < 4, kind, 99)
    hard_lo, hard_hi = pair(size, seed)
    with np.errstate(over="ignore", under="ignore"):
        for k, lo_v, hi_v in ((0, 0.0, 0.0), (1, -0.0, 0.0), (2, lo * 1e-42, hi * 1e-42),
                              (3, lo * 1e-310, hi * 1e-310), (4, lo * 1e39, hi * 1e39),
                              (5, -np.finfo(np.float64).max, np.finfo(np.float64).max),
                              (6, lo, np.inf), (7, -np.inf, hi), (8, np.nan, hi),
                              (9, hard_lo, hard_hi)):
            sel = kind == k
            lo = np.where(sel, lo_v, lo)
            hi = np.where(sel, hi_v, hi)
    return np.ascontiguousarray(lo), np.ascontiguousarray(hi)


def operand_both(lo, hi, nb, nr, nc, by_rows, fmt):
    """small.mm_operand and kernels.mm_operand as `products._operand` calls them; for each,
    (return value, mid, stack, rows, lo, hi after the call)."""
    g64 = arith.gamma(nc + 4, 2.0**-53)
    size = nb * nr * nc
    outs = []
    for fn in (small.mm_operand, kernels.mm_operand):
        mid, stack = np.full(size, 3.25), np.full(2 * size, 3.25, dtype=np.float32)
        rows = np.full(nb * nr if by_rows else 1, 3.25)
        a, b = lo.copy(), hi.copy()
        top = fn(a, b, nb, nr, nc, by_rows, *arith.rounding(fmt), 1 + 4 * g64, 1 + 2 * g64, mid,
                 stack, rows)
        outs.append((top, mid, stack, rows, a, b))
    return outs


def assert_same_operand(got):
    (t1, *r1), (t2, *r2) = got
    assert same_bits(t1, t2), (t1, t2)
    for x, y in zip(r1, r2, strict=True):
        assert same_bits(x, y)


@pytest.mark.parametrize("nc", MM_INNER)
@pytest.mark.parametrize("fmt", MM_FORMATS)
@pytest.mark.parametrize("by_rows", [True, False])
def test_mm_operand_matches_the_kernel(nc, fmt, by_rows):
    for nb, nr in ((1, 1), (1, 5), (3, 4)):
        lo, hi = mm_box(nb * nr * nc, nc + nr + len(fmt))
        assert_same_operand(operand_both(lo, hi, nb, nr, nc, by_rows, fmt))
        fin = np.isfinite(lo) & np.isfinite(hi)  # no NaN: the largest entry returned
        lo, hi = np.where(fin, lo, 0.5), np.where(fin, hi, 1.0)
        assert_same_operand(operand_both(lo, hi, nb, nr, nc, by_rows, fmt))


def test_mm_operand_on_its_edges():
    """All-negative radii (empty intervals: the largest is 0), -0 ends, float64's largest."""
    for lo, hi in ((np.full(8, 2.0), np.full(8, 1.0)), (np.full(8, -0.0), np.full(8, -0.0)),
                   (np.full(8, -np.finfo(np.float64).max), np.full(8, np.finfo(np.float64).max))):
        for by_rows in (True, False):
            assert_same_operand(operand_both(lo, hi, 2, 2, 2, by_rows, "bfloat16"))


def test_mm_operand_past_the_tier_calls_the_kernel(monkeypatch):
    calls = []
    real = kernels.mm_operand
    monkeypatch.setattr(kernels, "mm_operand", lambda *a: calls.append(a[0].size) or real(*a))
    nc = 128
    nr = small.NUMPY_MAX_SIZE // nc  # the tier: the operand's nr x nc values
    for rows, expect in ((nr, []), (nr + 1, [(nr + 1) * nc])):
        lo, hi = mm_box(rows * nc, 3)
        size = rows * nc
        small.mm_operand(lo, hi, 1, rows, nc, True, *arith.rounding("float16"), 1.0, 1.0,
                         np.empty(size), np.empty(2 * size, dtype=np.float32), np.empty(rows))
        assert calls == expect


def close_args(nb, m, k, n, leaf, fmt, has_bias, seed, orel=0.0, mild=False):
    """`kernels.mm_close`'s arguments as `products._mm32` makes them (without the outputs),
    from operands of `mm_box` values, with hard values put into the float32 products (mild:
    mild operands, a few hard products, so that most results are finite)."""
    from precisionlab.intervals.torch_ops import products
    rng = np.random.default_rng(seed)
    g64 = arith.gamma(k + 4, 2.0**-53)
    lo, hi = mm_box(nb * m * k, seed, mild)
    mid = np.empty(nb * m * k)
    sa = np.empty(2 * nb * m * k, dtype=np.float32)
    rows = np.empty(nb * m)
    top = kernels.mm_operand(lo, hi, nb, m, k, True, *arith.rounding(fmt), 1 + 4 * g64,
                             1 + 2 * g64, mid, sa, rows)
    am, sa = mid.reshape(nb, m, k), sa.reshape(nb, 2 * m, k)
    with np.errstate(all="ignore"):
        if leaf:
            wt = (rng.standard_normal((nb, k, n)) * 0.3).astype(np.float32)
            pm, prod = am @ wt.astype(np.float64), sa @ np.abs(wt)
            top, (rho, tau) = top + float(np.abs(wt).max()), (2.0**-9, 2.0**-24)
        else:
            blo, bhi = mm_box(nb * k * n, seed + 1, mild)
            bm = np.empty(nb * k * n)
            sb = np.empty(2 * nb * k * n, dtype=np.float32)
            top = top + kernels.mm_operand(blo, bhi, nb, k, n, False, *arith.rounding(fmt),
                                           1 + 4 * g64, 1 + 2 * g64, bm, sb, np.empty(1))
            pm = am @ bm.reshape(nb, k, n)
            prod = sa @ sb.reshape(nb, k, 2 * n)
            rho = tau = 0.0
    pm, prod = pm.reshape(-1).copy(), prod.reshape(-1).copy()
    rare = 0.001 if mild else 1.0
    spots = rng.random(prod.size) < 0.05 * rare
    prod[spots] = rng.choice(np.array([0.0, np.inf, np.nan, 1e-45, 3e38, 1.0],
                                      dtype=np.float32), int(spots.sum()))
    spots = rng.random(pm.size) < 0.03 * rare
    pm[spots] = rng.choice([0.0, -0.0, np.inf, -np.inf, np.nan, 1e-310, 1e308], int(spots.sum()))
    bias = None
    if has_bias:
        b1, b2 = mm_box(n, seed + 2, mild)
        b1, b2 = np.minimum(b1, b2), np.maximum(b1, b2)
        b1[::5], b2[::5] = b1[::5], b1[::5]  # points, infinite ones among them
        b1[1::7] = b2[1::7] = np.inf
        b1[3::11] = b2[3::11] = -np.inf
        bias = arith.round_into(arith.bare(b1, b2), fmt)
    top = top if top == top else 0.0
    return (pm, prod, nb, m, n, leaf, rows, rho, tau, 1 + 2 * arith.gamma(k + 2, 2.0**-24),
            2 * k * 2.0**-126 * (1 + top), float(orel), n,
            *products._close_args(k, bias, fmt, g64), *arith.rounding(fmt))


def close_both(args):
    """small.mm_close and kernels.mm_close on copies of args: (return value, lo, hi) each."""
    size = args[0].size
    outs = []
    for fn in (small.mm_close, kernels.mm_close):
        o1, o2 = np.full(size, 3.25), np.full(size, -3.25)
        r = fn(*[a.copy() if isinstance(a, np.ndarray) else a for a in args], o1, o2)
        outs.append((r, o1, o2))
    return outs


@pytest.mark.parametrize("k", MM_INNER)
@pytest.mark.parametrize("fmt", MM_FORMATS)
@pytest.mark.parametrize("leaf", [True, False])
def test_mm_close_matches_the_kernel(k, fmt, leaf):
    for nb, m, n in ((1, 1, 1), (1, 6, 9), (2, 3, 130)):
        for has_bias in (False, True):
            for orel, mild in ((0.0, False), (2.0**-10, False), (0.0, True), (2.0**-10, True)):
                args = close_args(nb, m, k, n, leaf, fmt, has_bias, k + m + n, orel, mild)
                (r1, a1, b1), (r2, a2, b2) = close_both(args)
                assert r1 == r2 and same_bits(a1, a2) and same_bits(b1, b2), (nb, m, n)


def test_mm_close_past_the_tier_calls_the_kernel(monkeypatch):
    calls = []
    real = kernels.mm_close
    monkeypatch.setattr(kernels, "mm_close", lambda *a: calls.append(a[1].size) or real(*a))
    n = 128
    m = small.NUMPY_MAX_SIZE // n  # the tier: the output's m x n values
    few = close_args(1, m, 9, n, True, "bfloat16", True, 4)
    assert few[0].size == small.NUMPY_MAX_SIZE < few[1].size  # prod: 2 m x n
    small.mm_close(*few, np.empty(m * n), np.empty(m * n))
    assert calls == []
    big = close_args(1, m + 1, 9, n, True, "bfloat16", True, 4)
    small.mm_close(*big, np.empty((m + 1) * n), np.empty((m + 1) * n))
    assert calls == [big[1].size]
