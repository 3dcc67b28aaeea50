"""precisionlab.intervals where values leave the format: overflow, infinities and NaN in sums and matmuls.

Oracles, none of them precisionlab's kernels:

* an independent implementation of every summation order (sequential, pairwise, blocked,
  split-K with a partial format, combine formats, atomics in random orders, warps), written
  here step by step with NumPy float16 / ml_dtypes bfloat16 / float32 scalars, whose
  additions are correctly rounded (IEEE, or float32 arithmetic rounded once more, innocuous
  for 11 and 8 bits);
* the exact sum by rational arithmetic (fractions) or math.fsum's correctly rounded sign test.

Every bound, for both rules, must hold the exact sum and every execution, with +-inf inside
only where the bound reaches it and NaN only where it says "may be NaN". The issue's examples
come first, as regression tests.
"""

from __future__ import annotations

import math
from fractions import Fraction

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from oracles import rn, sound

from precisionlab import intervals as iv
from precisionlab.formats import get_format

NP = {"float16": np.float16, "bfloat16": ml_dtypes.bfloat16, "float32": np.float32}
FMTS = tuple(NP)
MAX = {f: get_format(f).max_finite for f in FMTS}


# --------------------------------------------------------------------------- independent kernels


def _add(a, b, dt):
    with np.errstate(over="ignore", invalid="ignore"):
        return (np.asarray(a, dtype=dt) + np.asarray(b, dtype=dt)).astype(dt)


def _seq(v, dt):
    acc = v[0]
    for x in v[1:]:
        acc = _add(acc, x, dt)
    return acc


def _pairwise(v, dt):
    v = list(v)
    while len(v) > 1:
        nxt = [_add(v[i], v[i + 1], dt) for i in range(0, len(v) - 1, 2)]
        v = nxt + ([v[-1]] if len(v) % 2 else [])
    return v[0]


def _shuffle(v, dt):
    v = list(v)
    for off in (16, 8, 4, 2, 1):
        v = [_add(v[i], v[i + off], dt) for i in range(off)]
    return v[0]


def oracle_sum(row, kernel: iv.Kernel, rng=None):
    """One execution of kernel's sum of row (float64 values), by NumPy scalars in the kernel's formats."""
    dt = NP[kernel.acc]
    cdt = NP[kernel.combine_format.name]
    with np.errstate(over="ignore", invalid="ignore"):
        v = [dt(x) for x in row]  # loading into the accumulator rounds to nearest
        n = len(v)
        if kernel.order == "sequential":
            s = _seq(v, dt)
        elif kernel.order == "pairwise":
            s = _pairwise(v, dt)
        elif kernel.order == "warp":
            T = kernel.threads
            per = [_seq(v[t::T], dt) if t < n else dt(0) for t in range(T)]
            warps = [_shuffle(per[w:w + 32], dt) for w in range(0, T, 32)]
            s = _shuffle(warps + [dt(0)] * (32 - len(warps)), dt)
        else:
            t = -(-n // kernel.splits) if kernel.order == "split_k" else kernel.block
            tiles = [_seq(v[i:i + t], dt) for i in range(0, n, t)]
            if kernel.partial is not None:
                tiles = [NP[kernel.partial](x) for x in tiles]
            tiles = [cdt(x) for x in tiles]  # a partial value goes straight into the combine format
            if kernel.order == "atomic":  # rng: a Generator (a random order), or "up" / "down"
                if isinstance(rng, str):  # the adversarial orders: every positive tile first, or last
                    tiles = sorted(tiles, key=float, reverse=rng == "down")
                else:
                    tiles = [tiles[i] for i in rng.permutation(len(tiles))]
            s = _seq(tiles, cdt)
        return float(NP[kernel.out_format.name](s))


def exact_sum(row):
    """The exact sum (a Fraction), or +-inf / NaN when infinities or NaN are summed."""
    if any(math.isnan(x) for x in row) or (math.inf in row and -math.inf in row):
        return math.nan
    if math.inf in row or -math.inf in row:
        return math.inf if math.inf in row else -math.inf
    return sum((Fraction(x) for x in row), Fraction(0))


def holds(b: iv.Interval, i, value) -> bool:
    """value (a Fraction, float, +-inf or NaN) lies in element i of b under the non-finite convention."""
    lo, hi, nan = float(b.lo[i]), float(b.hi[i]), bool(b.nan[i])
    if isinstance(value, float) and math.isnan(value):
        return nan
    if isinstance(value, float) and math.isinf(value):
        return lo <= value <= hi
    return (lo == -math.inf or Fraction(lo) <= value) and (hi == math.inf or value <= Fraction(hi))


# --------------------------------------------------------------------------- the examples


def test_overflowing_running_sum_reaches_inf_and_pairwise_nan():
    x = np.array([[60256.0, 60256.0, -60256.0, -60256.0]])
    seq = iv.Kernel("sequential", acc="float16")
    pair = iv.Kernel("pairwise", acc="float16")
    assert iv.sum_(x, seq)[0] == math.inf and math.isnan(iv.sum_(x, pair)[0])
    for rule in iv.RULES:
        b = iv.sum_(iv.point(x, rule), seq)
        assert b.contains(math.inf).all() and b.contains(0.0).all()  # executed and exact
        p = iv.sum_(iv.point(x, rule), pair)
        assert p.nan.all() and p.contains(np.nan).all() and p.contains(0.0).all()


def test_matmul_overflow_in_accumulators_tensor_cores_and_partials():
    a, b = np.full((2, 4), 200.0), np.full((4, 3), 200.0)  # each product 40000: fits float16
    cases = [iv.Kernel.from_profile("fp16-acc16"),
             iv.Kernel("tensor_core", inputs="float16", model="V100", out="float16"),
             iv.Kernel("split_k", acc="float32", partial="float16", splits=2),  # no cancellation
             iv.Kernel("blocked", acc="float32", combine="float16", block=2),
             iv.Kernel("sequential", acc="float16", out="float32")]  # accumulator narrower than out
    for k in cases:
        c = iv.matmul(a, b, k)
        assert (c == math.inf).all(), k
        for rule in iv.RULES:
            bound = iv.matmul(iv.point(a, rule), b, k)
            assert bound.contains(c).all() and bound.contains(160000.0).all(), (k, rule)


def test_inf_input_keeps_a_sound_lower_bound():
    x = np.array([[math.inf, 1.0, 2.0]])
    for rule in iv.RULES:
        b = iv.sum_(iv.point(x, rule), iv.Kernel())
        assert b.lo[0] == b.hi[0] == math.inf and not b.nan[0]
        assert b.contains(iv.sum_(x, iv.Kernel())).all()


def test_nan_results_are_flagged_not_boxed():
    s = iv.sqrt(iv.point(np.array([-1.0, 4.0])))
    assert list(s.nan) == [True, False] and s.empty[0] and s.contains(iv.sqrt(np.array([-1.0, 4.0]))).all()
    z = iv.sum_(iv.point(np.array([[math.inf, -math.inf, 1.0]])), iv.Kernel())
    assert z.nan.all() and z.empty.all()  # inf - inf: nothing but NaN
    a, w = np.array([[math.nan, 1.0], [math.inf, 1.0], [1.0, 2.0]]), np.array([[1.0], [-2.0]])
    for k in (iv.Kernel(), iv.Kernel("tensor_core", inputs="float16", model="V100")):
        run = iv.matmul(a, w, k)  # NaN and inf operands give IEEE's results, tensor cores too
        assert np.isnan(run[0, 0]) and run[1, 0] == math.inf and run[2, 0] == -3.0
        assert iv.matmul(iv.point(a), w, k).contains(run).all()


# --------------------------------------------------------------------------- hypothesis: near the top


@st.composite
def near_max(draw):
    """A kernel over fmt and rows of values of fmt near its largest value, with cancellation."""
    fmt = draw(st.sampled_from(FMTS))
    order = draw(st.sampled_from(("sequential", "pairwise", "blocked", "split_k", "atomic", "warp")))
    kw = {"order": order, "acc": fmt}
    if order in ("blocked", "atomic"):
        kw["block"] = draw(st.integers(1, 5))
    if order == "split_k":
        kw["splits"] = draw(st.integers(2, 4))
    if order == "warp":
        kw["threads"] = 32
    if order in ("split_k", "atomic") and draw(st.booleans()):
        kw["partial"] = draw(st.sampled_from(FMTS))
    if order in ("blocked", "split_k", "atomic") and draw(st.booleans()):
        kw["combine"] = draw(st.sampled_from(FMTS))
    if draw(st.booleans()):
        kw["out"] = draw(st.sampled_from(FMTS))
    if draw(st.integers(0, 4)) == 0:
        kw["mode"] = "toward_zero"  # saturates instead of overflowing
    n = draw(st.integers(2, 12))
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    lanes = 12
    mags = rng.uniform(0.15, 0.7, (lanes, n)) * MAX[fmt]
    signs = rng.choice([-1.0, 1.0], (lanes, n))
    x = signs * mags
    x[::3, 1::2] = -x[::3, 0:n - 1:2][:, : x[::3, 1::2].shape[1]]  # exact cancellation in some rows
    return iv.Kernel(**kw), rn(x, fmt)


@sound(60)
@given(case=near_max())
def test_sums_near_the_largest_value_are_bounded(case):
    kernel, x = case
    rng = np.random.default_rng(0)
    orders = [rng, rng, "up", "down"] if kernel.order == "atomic" else [None]
    runs = [] if kernel.mode != "nearest_even" else [[oracle_sum(row, kernel, o) for row in x] for o in orders]
    sim = iv.sum_(x, kernel, seed=1)
    for rule in iv.RULES:
        b = iv.sum_(iv.point(x, rule), kernel)
        assert b.contains(sim).all(), (rule, kernel)
        for i, row in enumerate(x):
            assert holds(b, i, exact_sum(list(row))), (rule, kernel, i)
            for r in runs:
                assert holds(b, i, r[i]), (rule, kernel, i, r[i], b.lo[i], b.hi[i], b.nan[i])
    if kernel.order != "atomic" and runs:  # the simulator and the independent kernel agree bit for bit
        assert np.array_equal(sim, np.array(runs[0]), equal_nan=True)


@st.composite
def with_specials(draw):
    """Rows mixing ordinary values with +-inf and NaN entries, and a kernel to sum them."""
    fmt = draw(st.sampled_from(FMTS))
    order = draw(st.sampled_from(("sequential", "pairwise", "blocked", "split_k", "warp")))
    kw = {"order": order, "acc": fmt}
    if order == "blocked":
        kw["block"] = 3
    if order == "warp":
        kw["threads"] = 32
    n = draw(st.integers(1, 10))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    x = rng.uniform(-4, 4, (16, n))
    pick = rng.random((16, n))
    x = np.where(pick < 0.12, math.inf, np.where(pick < 0.22, -math.inf, np.where(pick < 0.27, math.nan, x)))
    return iv.Kernel(**kw), rn(x, fmt)


@sound(50)
@given(case=with_specials())
def test_infinities_and_nan_in_sums_follow_ieee(case):
    kernel, x = case
    run = iv.sum_(x, kernel)
    oracle = [oracle_sum(row, kernel) for row in x]
    assert np.array_equal(run, np.array(oracle), equal_nan=True)
    for rule in iv.RULES:
        b = iv.sum_(iv.point(x, rule), kernel)
        assert b.contains(run).all(), (rule, kernel)
        for i, row in enumerate(x):
            e = exact_sum(list(row))
            assert holds(b, i, e)
            if math.isnan(e):
                assert b.nan[i]


# --------------------------------------------------------------------------- matmuls


MM_KERNELS = [
    iv.Kernel.from_profile("fp16-acc16"),
    iv.Kernel.from_profile("fp16"),
    iv.Kernel.from_profile("bf16", splits=2),
    iv.Kernel("tensor_core", inputs="float16", model="V100", out="float16"),
    iv.Kernel("tensor_core", inputs="bfloat16", model="A100", out="float16"),
    iv.Kernel("tensor_core", inputs="bfloat16", model="A100"),
    iv.Kernel("split_k", acc="float32", partial="float16", splits=3, inputs="float16"),
    iv.Kernel("atomic", acc="float32", partial="float16", combine="float16", block=2, inputs="float16"),
    iv.Kernel("warp", acc="float16", threads=32, inputs="float16"),
    iv.Kernel("pairwise", acc="float16", out="float32", inputs="float16"),
]


@sound(40)
@given(kernel=st.sampled_from(MM_KERNELS), scale=st.sampled_from((30.0, 120.0, 255.0, 1e19)),
       k=st.integers(1, 9), seed=st.integers(0, 2**32 - 1))
def test_matmuls_that_may_overflow_are_bounded(kernel, scale, k, seed):
    rng = np.random.default_rng(seed)
    fmt = kernel.inputs
    a = rn(rng.uniform(-scale, scale, (6, k)), fmt)
    b = rn(rng.uniform(-scale, scale, (k, 4)), fmt)
    if fmt != "bfloat16":
        a, b = np.clip(a, -6e4, 6e4), np.clip(b, -6e4, 6e4)
    runs = [iv.matmul(a, b, kernel, seed=s) for s in (1, 2)]
    exact = [[sum((Fraction(p) * Fraction(q) for p, q in zip(a[i], b[:, j], strict=True)), Fraction(0))
              for j in range(4)] for i in range(6)]
    for rule in iv.RULES:
        B = iv.matmul(iv.point(a, rule), b, kernel)
        for r in runs:
            assert B.contains(r).all(), (rule, kernel, r[~B.contains(r)], B.lo[~B.contains(r)])
        for i in range(6):
            for j in range(4):
                assert holds(B, (i, j), exact[i][j]), (rule, kernel)


def test_structure_bounds_far_from_the_top_are_unchanged_by_overflow_tracking():
    # ordinary data: finite bounds, no NaN flag, the exact value inside (the same numbers as before)
    rng = np.random.default_rng(3)
    a, b = rn(rng.uniform(-1, 1, (4, 512)), "float16"), rn(rng.uniform(-1, 1, (512, 3)), "float16")
    for k in MM_KERNELS:
        B = iv.matmul(iv.point(a), b, k) if k.inputs else None
        if B is not None:
            assert np.isfinite(B.lo).all() and np.isfinite(B.hi).all() and not B.nan.any(), k


def test_oblivious_rule_counts_the_narrowest_stage_format():
    # float32 tiles of 1e4-sized products land in a float16 partial: 4 products of 2e4 overflow there
    a, b = np.full((1, 8), 100.0), np.full((8, 1), 200.0)
    k = iv.Kernel("split_k", acc="float32", partial="float16", splits=2)
    assert iv.matmul(a, b, k)[0, 0] == math.inf
    o = iv.matmul(iv.point(a, "oblivious"), b, k)
    assert o.hi[0, 0] == math.inf and o.contains(160000.0).all()


def test_saturating_rounding_widens_to_the_whole_line():
    # toward zero never overflows: it sticks at the largest value, so the result can be anything
    x = np.array([[60000.0, 60000.0, -60000.0]])
    k = iv.Kernel("sequential", acc="float16", mode="toward_zero")
    run = iv.sum_(x, k)
    assert run[0] == 65504.0 - 60000.0  # the saturated sum, far from the exact 60000
    for rule in iv.RULES:
        b = iv.sum_(iv.point(x, rule), k)
        assert b.contains(run).all() and b.contains(60000.0).all()


@pytest.mark.parametrize("kernel", [
    iv.Kernel("atomic", acc="float16", block=1),
    iv.Kernel("atomic", acc="float16", block=2, partial="float32"),
    iv.Kernel("atomic", acc="float32", block=2, combine="float16"),
    iv.Kernel("warp", acc="float16", threads=32),
])
def test_unordered_stages_bound_every_order_of_their_partial_sums(kernel):
    # in index order the running sums stay below 40000; an order that takes the positive tiles
    # first passes 65504 (float16's largest value) and overflows
    tiles = [40000.0, -40000.0, 30000.0, -30000.0]
    x = np.array([[v / 2 for v in tiles for _ in range(2)]] if kernel.block == 2 else [tiles])
    if kernel.order == "warp":  # the shuffle tree's first level adds lane 16 to lane 0: 70000
        x = np.zeros((1, 32))
        x[0, [0, 1, 16, 17]] = tiles
    runs = [oracle_sum(x[0], kernel, o) for o in ("up", "down")] if kernel.order == "atomic" else [
        oracle_sum(x[0], kernel)]
    assert any(math.isinf(r) or math.isnan(r) for r in runs)
    for rule in iv.RULES:
        b = iv.sum_(iv.point(x, rule), kernel)
        assert b.contains(0.0).all()
        for r in runs:
            assert holds(b, 0, r), (rule, kernel, r)
        assert b.hi[0] == math.inf, (rule, kernel)  # some execution of this kernel overflows


def test_a_summand_past_the_top_saturates_a_toward_zero_sum():
    # loading 70000 into a float16 accumulator that rounds toward zero gives 65504; adding 1000
    # sticks there: the result sits below every relative-error bound, so the bound must widen
    x = np.array([[70000.0, 1000.0], [1000.0, 70000.0]])
    for k in (iv.Kernel(acc="float16", mode="toward_zero"), iv.Kernel("pairwise", acc="float16", mode="toward_zero"),
              iv.Kernel("split_k", acc="float32", splits=2, combine="float16", mode="toward_zero")):
        run = iv.sum_(x, k)
        assert (run == 65504.0).all()
        for rule in iv.RULES:
            b = iv.sum_(iv.point(x, rule), k)
            assert b.contains(run).all() and b.contains(71000.0).all(), (k, rule)


SATURATING = iv.Kernel("split_k", acc="bfloat16", splits=2, combine="float16", mode="toward_zero",
                       inputs="float16")


@sound(25)
@given(k1=st.sampled_from([*MM_KERNELS, SATURATING]),
       k2=st.sampled_from(MM_KERNELS), scale=st.sampled_from((30.0, 300.0, 3000.0)),
       dims=st.tuples(st.integers(1, 6), st.integers(1, 5)), seed=st.integers(0, 2**32 - 1))
def test_networks_whose_activations_overflow_are_bounded_and_never_bugs(k1, k2, scale, dims, seed):
    # x -> relu(x W1 + b1) -> h W2 + b2 in float16, weights large enough that h reaches inf and NaN
    rng = np.random.default_rng(seed)
    d0, d1 = dims
    x, w1 = rn(rng.uniform(-scale, scale, (8, d0)), "float16"), rn(rng.uniform(-scale, scale, (d0, d1)), "float16")
    w2, b = rn(rng.uniform(-1, 1, (d1, 3)), "float16"), rn(rng.uniform(-1, 1, (3,)), "float16")

    def program(salt):
        return [iv.Layer("l1", lambda h: iv.relu(iv.matmul(h, w1, k1, seed=salt))),
                iv.Layer("l2", lambda h: iv.add(iv.matmul(h, w2, k2, seed=salt + 1), b, "float16"))]

    for rule in iv.RULES:
        out = iv.point(x, rule)
        for layer in program(1):
            out = layer.interval(out)
        for salt in (1, 2):
            run = iv.run_layers(program(salt), x)[-1]
            assert out.contains(run).all(), (rule, k1, k2)
        assert iv.classify(program(1), program(1), x, rule=rule).verdict == "Type-I"
        assert iv.classify(program(1), program(2), x, rule=rule, reference_rule=rule).verdict == "Type-I"
