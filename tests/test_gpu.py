"""precisionlab.gpu against independent oracles: exact rationals rounded once per add
(tests/oracles.py), torch's own float16/bfloat16 arithmetic, math.fsum and error bounds."""

from __future__ import annotations

import dataclasses
import math
import zlib
from fractions import Fraction

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from oracles import fraction_round

from precisionlab.formats import get_format
from precisionlab.gpu import (
    DETERMINISTIC_ORDERS,
    ORDERS,
    PROFILE_NAMES,
    PROFILES,
    atomic_orders,
    boundary_terms,
    describe,
    exact_sum,
    flip_probability,
    get_profile,
    iterations_to_reach,
    jacobi_solve,
    matmul,
    reduce_sum,
    round_operands,
    rounded_add,
)
from precisionlab.gpu.arith import RoundedAdder
from precisionlab.gpu.batching import TinyDecoder
from precisionlab.gpu.profiles import FP8_GEMM_ACCUMULATOR
from precisionlab.rounding import round_to

DIRECTED = ["toward_zero", "up", "down", "nearest_away"]

# --------------------------------------------------------------------------- exact references
# Each reference spells its order out in plain Python from the definition in the docs and
# rounds every single add with exact rational arithmetic.


def fl(v, fmt, mode):
    return fraction_round(Fraction(v), fmt, mode)


def ref_add(a, b, fmt, mode):
    return fraction_round(Fraction(a) + Fraction(b), fmt, mode)


def ref_seq(vals, fmt, mode):
    acc = 0.0
    for v in vals:
        acc = ref_add(acc, v, fmt, mode)
    return acc


def ref_pairwise(vals, fmt, mode):
    level = list(vals)
    while len(level) > 1:
        nxt = [ref_add(level[i], level[i + 1], fmt, mode) for i in range(0, len(level) - 1, 2)]
        if len(level) % 2:
            nxt.append(level[-1])
        level = nxt
    return level[0]


def ref_blocked_partials(vals, block, fmt, mode):
    return [ref_seq(vals[i:i + block], fmt, mode) for i in range(0, len(vals), block)]


def ref_shuffle(lanes, fmt, mode):
    lanes = list(lanes)
    for off in (16, 8, 4, 2, 1):
        for i in range(off):
            lanes[i] = ref_add(lanes[i], lanes[i + off], fmt, mode)
    return lanes[0]


def ref_warp(vals, threads, fmt, mode):
    per_thread = [ref_seq(vals[t::threads], fmt, mode) for t in range(threads)]
    warp_sums = [ref_shuffle(per_thread[w:w + 32], fmt, mode) for w in range(0, threads, 32)]
    return ref_shuffle(warp_sums + [0.0] * (32 - len(warp_sums)), fmt, mode)


def ref_split_k(vals, splits, partial, fmt, mode):
    chunk = -(-len(vals) // splits)
    parts = [ref_seq(vals[s * chunk:(s + 1) * chunk], fmt, mode) for s in range(splits)]
    if partial is not None:
        parts = [fl(fl(p, partial, mode), fmt, mode) for p in parts]
    return ref_seq(parts, fmt, mode)


def ref_kahan(vals, fmt, mode):
    s = c = 0.0
    for v in vals:
        y = ref_add(v, -c, fmt, mode)
        t = ref_add(s, y, fmt, mode)
        c = ref_add(ref_add(t, -s, fmt, mode), -y, fmt, mode)
        s = t
    return s


def reference(x, order, fmt, mode, out, *, block=32, splits=4, threads=256, partial=None,
              perm=None):
    vals = [fl(v, fmt, mode) for v in x]  # loads round into the accumulator
    if order == "sequential":
        s = ref_seq(vals, fmt, mode)
    elif order == "pairwise":
        s = ref_pairwise(vals, fmt, mode)
    elif order == "blocked":
        s = ref_seq(ref_blocked_partials(vals, block, fmt, mode), fmt, mode)
    elif order == "warp":
        s = ref_warp(vals, threads, fmt, mode)
    elif order == "split_k":
        s = ref_split_k(vals, splits, partial, fmt, mode)
    elif order == "atomic":
        parts = ref_blocked_partials(vals, block, fmt, mode)
        s = ref_seq([parts[j] for j in perm], fmt, mode)
    else:
        s = ref_kahan(vals, fmt, mode)
    return fl(s, out, mode)


def spread_inputs(fmt, lanes, n, seed):
    """float64 inputs over a range of binades, mostly not values of fmt, plus exact ties."""
    f = get_format(fmt)
    rng = np.random.default_rng(seed)
    hi = min(f.emax - 4 - int(np.ceil(np.log2(n))), 6)
    x = rng.standard_normal((lanes, n)) * np.exp2(rng.integers(max(f.emin, hi - 14), hi, size=(lanes, n)))
    # a quarter of the entries: exact multiples of a small power of two, so sums hit ties
    mask = rng.random((lanes, n)) < 0.25
    x[mask] = rng.integers(-40, 40, size=mask.sum()) * 2.0 ** (hi - 8)
    return x


# --------------------------------------------------------------------------- reductions vs rationals

CASES = [("float16", "nearest_even"), ("bfloat16", "nearest_even"), ("float32", "nearest_even"),
         ("tf32", "nearest_even"), ("float8_e4m3fn", "nearest_even")] + \
    [("float16", m) for m in DIRECTED] + [("float32", m) for m in DIRECTED] + \
    [("bfloat16", "toward_zero")]


@pytest.mark.parametrize("order", ORDERS)
@pytest.mark.parametrize("fmt, mode", CASES)
def test_every_order_equals_exact_rational_reference(order, fmt, mode):
    n = 300 if order == "warp" else 37
    # zlib.crc32, not hash(): str hashes change per process, so a failure could not be replayed.
    x = spread_inputs(fmt, 6, n, seed=zlib.crc32(f"{order}/{fmt}/{mode}".encode()))
    kw = dict(block=5, splits=3, threads=64)
    perms = atomic_orders(6, -(-n // 5), seed=11) if order == "atomic" else None
    got = reduce_sum(x, order, fmt, mode=mode, seed=11, **kw)
    want = [reference(row, order, fmt, mode, fmt, perm=None if perms is None else perms[i], **kw)
            for i, row in enumerate(x)]
    assert np.array_equal(got, want), (got, want)


@pytest.mark.parametrize("order", ["blocked", "atomic"])
def test_single_element_blocks_and_one_block(order):
    x = spread_inputs("float16", 4, 19, seed=1)
    for block in (1, 19, 64):
        perms = atomic_orders(4, -(-19 // block), seed=block)
        got = reduce_sum(x, order, "float16", block=block, seed=block)
        want = [reference(r, order, "float16", "nearest_even", "float16", block=block, perm=p)
                for r, p in zip(x, perms, strict=True)]
        assert np.array_equal(got, want)


def test_split_k_partials_rounded_to_workspace_format():
    x = spread_inputs("float32", 5, 50, seed=2)
    got = reduce_sum(x, "split_k", "float32", splits=4, partial="bfloat16")
    want = [reference(r, "split_k", "float32", "nearest_even", "float32", splits=4,
                      partial="bfloat16") for r in x]
    assert np.array_equal(got, want)
    assert not np.array_equal(got, reduce_sum(x, "split_k", "float32", splits=4))


@pytest.mark.parametrize("order", ORDERS)
def test_output_format_is_a_final_rounding(order):
    x = spread_inputs("float32", 5, 40, seed=3)
    perms = atomic_orders(5, 8, seed=4)
    got = reduce_sum(x, order, "float32", "float16", seed=4, block=5, splits=3, threads=32)
    want = [reference(r, order, "float32", "nearest_even", "float16", block=5, splits=3,
                      threads=32, perm=p) for r, p in zip(x, perms, strict=True)]
    assert np.array_equal(got, want)


@pytest.mark.parametrize("fmt", ["float32", "bfloat16"])
@pytest.mark.parametrize("mode", DIRECTED)
@pytest.mark.parametrize("order", ["sequential", "pairwise", "kahan"])
def test_tiny_terms_beside_large_ones_under_directed_rounding(fmt, mode, order):
    """Sums whose float64 value is inexact and lands on a boundary of fmt (round to odd matters)."""
    rng = np.random.default_rng(13)
    big = np.asarray(round_to(rng.standard_normal((8, 6)) * 4, fmt))
    tiny = rng.choice([-1.0, 1.0], (8, 6)) * np.exp2(rng.integers(-90, -60, (8, 6)))
    x = np.stack([big, tiny], axis=-1).reshape(8, 12)  # big, tiny, big, tiny, ...
    got = reduce_sum(x, order, fmt, mode=mode)
    want = [reference(r, order, fmt, mode, fmt) for r in x]
    assert np.array_equal(got, want)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(-2.0**10, 2.0**10, width=16, allow_subnormal=True), min_size=1,
                max_size=40),
       st.sampled_from(DETERMINISTIC_ORDERS))
def test_float16_values_any_order_matches_rationals(values, order):
    got = reduce_sum(np.array(values), order, "float16", block=3, splits=2, threads=32)
    assert got == reference(values, order, "float16", "nearest_even", "float16", block=3,
                            splits=2, threads=32)


# --------------------------------------------------------------------------- torch's own arithmetic


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_sequential_equals_torch_step_by_step_loop(dtype):
    g = torch.Generator().manual_seed(0)
    X = (torch.randn(64, 300, generator=g) * torch.exp2(torch.randint(-6, 6, (64, 300), generator=g))).to(dtype)
    acc = torch.zeros(64, dtype=dtype)
    for i in range(X.shape[1]):
        acc = acc + X[:, i]  # torch rounds each add to dtype
    got = reduce_sum(X, "sequential", str(dtype).removeprefix("torch."))
    assert np.array_equal(got, acc.double().numpy())


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_pairwise_and_kahan_equal_torch_low_precision_ops(dtype):
    g = torch.Generator().manual_seed(1)
    X = (torch.rand(32, 77, generator=g) * 8).to(dtype)
    level = X
    while level.shape[1] > 1:
        h = level.shape[1] // 2
        pairs = level[:, 0:2 * h:2] + level[:, 1:2 * h:2]
        level = pairs if level.shape[1] % 2 == 0 else torch.cat([pairs, level[:, -1:]], dim=1)
    name = str(dtype).removeprefix("torch.")
    assert np.array_equal(reduce_sum(X, "pairwise", name), level[:, 0].double().numpy())
    s = torch.zeros(32, dtype=dtype)
    c = torch.zeros(32, dtype=dtype)
    for i in range(X.shape[1]):
        y = X[:, i] - c
        t = s + y
        c = (t - s) - y
        s = t
    assert np.array_equal(reduce_sum(X, "kahan", name), s.double().numpy())


# --------------------------------------------------------------------------- properties


@settings(max_examples=40, deadline=None)
@given(st.lists(st.floats(2.0**-10, 2.0**8, width=32), min_size=2, max_size=60),
       st.sampled_from(DETERMINISTIC_ORDERS), st.sampled_from(["float16", "bfloat16", "float32"]))
def test_error_within_the_recursive_summation_bound(values, order, fmt):
    """|fl(S) - S| <= gamma_{n-1} sum|x| for any order (Higham, Lemma 3.1 / eq. 4.4) on fmt values."""
    x = np.asarray(round_to(np.array(values), fmt))
    n = len(x)
    u = get_format(fmt).unit_roundoff
    gamma = (n - 1) * u / (1 - (n - 1) * u) if order != "kahan" else 2 * u + n * u * u * 4
    got = reduce_sum(x, order, fmt, block=4, splits=3, threads=32)
    exact = sum(Fraction(v) for v in x)
    assert abs(Fraction(got) - exact) <= Fraction(gamma) * sum(abs(Fraction(v)) for v in x)


def test_deterministic_orders_ignore_the_seed_and_atomics_do_not():
    x = np.abs(spread_inputs("float16", 1, 500, seed=5)[0])
    lanes = np.broadcast_to(x, (200, x.size))
    for order in DETERMINISTIC_ORDERS:
        a = reduce_sum(lanes, order, "float16", seed=0)
        b = reduce_sum(lanes, order, "float16", seed=1)
        assert np.array_equal(a, b) and np.unique(a).size == 1
    a = reduce_sum(lanes, "atomic", "float16", block=1, seed=0)
    b = reduce_sum(lanes, "atomic", "float16", block=1, seed=0)
    c = reduce_sum(lanes, "atomic", "float16", block=1, seed=1)
    assert np.array_equal(a, b) and not np.array_equal(a, c) and np.unique(a).size > 5


def test_broadcast_lanes_equal_materialised_lanes():
    x = spread_inputs("bfloat16", 1, 97, seed=6)[0]
    shared = np.broadcast_to(x, (3, 50, 97))
    full = np.array(shared)
    for order in ORDERS:
        a = reduce_sum(shared, order, "bfloat16", seed=2, block=4)
        b = reduce_sum(full, order, "bfloat16", seed=2, block=4)
        assert a.shape == (3, 50) and np.array_equal(a, b), order


def test_atomic_orders_are_uniform_permutations():
    perms = atomic_orders(60_000, 4, seed=3)
    assert (np.sort(perms, axis=1) == np.arange(4)).all()
    codes = perms @ np.array([64, 16, 4, 1])
    _, counts = np.unique(codes, return_counts=True)
    assert counts.size == 24  # all 4! orders occur
    expected = 60_000 / 24
    chi2 = ((counts - expected) ** 2 / expected).sum()
    assert chi2 < 60  # 23 degrees of freedom: P(chi2 > 60) < 1e-4


def _fisher_yates_oracle(u: np.ndarray) -> np.ndarray:
    """The documented swaps in plain Python: per lane, i with i + floor(u[l, i] (m - i))."""
    lanes, m = u.shape
    out = np.empty((lanes, m), dtype=np.int32)
    for lane in range(lanes):
        row = list(range(m))
        for i in range(m - 1):
            j = min(i + int(u[lane, i] * (m - i)), m - 1)
            row[i], row[j] = row[j], row[i]
        out[lane] = row
    return out


@pytest.mark.parametrize("lanes, m", [(1, 1), (3, 2), (1, 9), (7, 5), (40, 33), (64, 1024)])
def test_both_shuffles_make_the_documented_swaps(lanes, m):
    """The NumPy steps (short permutations, no numba) and the compiled loop (longer ones) give
    the oracle's permutations; u at 0 (j = i) and just below 1 (j = m - 1) included."""
    from precisionlab.gpu import reductions

    u = np.random.default_rng(m).random((lanes, m))
    u[:, ::3] = np.nextafter(1.0, 0.0)
    u[:, 1::5] = 0.0
    want = _fisher_yates_oracle(u)
    for shuffle in (reductions._fisher_yates_numpy, reductions._fisher_yates_kernel()):
        got = np.empty((lanes, m), dtype=np.int32)
        shuffle(u, got)
        assert np.array_equal(got, want), shuffle


@pytest.mark.parametrize("lanes, m", [(300, 7), (100, 512), (2, 513), (200, 400)])
def test_atomic_orders_take_each_tier_by_size_with_the_same_orders(monkeypatch, lanes, m):
    """atomic_orders through both tiers: NumPy for at most 512 entries a permutation and 2^16
    in all, the loop beyond; forcing either tier gives the same orders."""
    from precisionlab.gpu import reductions

    used = []
    real = reductions._fisher_yates_numpy
    monkeypatch.setattr(reductions, "_fisher_yates_numpy",
                        lambda u, out: used.append("numpy") or real(u, out))
    auto = atomic_orders(lanes, m, seed=5)
    small = m <= 512 and lanes * m <= 1 << 16
    assert used == (["numpy"] if small else [])
    monkeypatch.setattr(reductions, "FISHER_YATES_NUMPY_MAX", 0)
    assert np.array_equal(atomic_orders(lanes, m, seed=5), auto)
    monkeypatch.setattr(reductions, "FISHER_YATES_NUMPY_MAX", 1 << 40)
    monkeypatch.setattr(reductions, "FISHER_YATES_NUMPY_MAX_M", 1 << 40)
    assert np.array_equal(atomic_orders(lanes, m, seed=5), auto)


def test_stochastic_mode_lands_on_a_neighbour_of_the_exact_sum():
    a, b = 1.0, 2.0**-12  # 1 + 2^-12 lies a quarter of the way from 1 to 1 + 2^-10 in float16
    x = np.broadcast_to(np.array([a, b]), (40_000, 2))
    got = reduce_sum(x, "sequential", "float16", mode="stochastic", seed=4)
    assert set(np.unique(got)) == {1.0, 1.0 + 2.0**-10}
    p_up = (got > 1).mean()
    assert abs(p_up - 0.25) < 5 * math.sqrt(0.25 * 0.75 / got.size)


@pytest.mark.parametrize("fmt", ["float16", "bfloat16", "tf32", "float32", "float8_e5m2"])
@pytest.mark.parametrize("mode", ["nearest_even", *DIRECTED])
def test_rounded_add_against_rationals(fmt, mode):
    rng = np.random.default_rng(7)
    f = get_format(fmt)
    a = np.asarray(round_to(rng.standard_normal(400) * np.exp2(rng.integers(-20, 10, 400)), "float32"))
    b = np.asarray(round_to(rng.standard_normal(400) * np.exp2(rng.integers(-40, 10, 400)), "float32"))
    b[:50] = -a[:50] * (1 + 2.0**-30)  # cancellation
    a[50:150] = round_to(a[50:150], f)  # a value of fmt plus a term far below its last bit
    b[50:150] = np.sign(b[50:150]) * np.abs(a[50:150]) * 2.0**-70
    got = rounded_add(a, b, f, mode)
    want = [fraction_round(Fraction(x) + Fraction(y), f, mode) for x, y in zip(a, b, strict=True)]
    assert np.array_equal(got, want)


@pytest.mark.parametrize("mode", ["nearest_even", *DIRECTED])
def test_overflow_and_infinities_follow_ieee(mode):
    """inf absorbs finite terms in every mode; a finite overflow is inf, or max_finite when rounding toward zero."""
    with np.errstate(over="ignore", invalid="ignore"):
        assert reduce_sum(np.array([np.inf, 1.0, -3.0]), "sequential", "float16", mode=mode) == np.inf
        got = reduce_sum(np.array([60000.0, 60000.0]), "sequential", "float16", mode=mode)
    toward_zero = mode in ("toward_zero", "down")
    assert got == (65504.0 if toward_zero else np.inf)


def test_exact_sum_is_math_fsum():
    x = np.array([[1e16, 1.0, -1e16], [0.1, 0.2, 0.3]])
    assert exact_sum(x).tolist() == [1.0, math.fsum([0.1, 0.2, 0.3])]


# --------------------------------------------------------------------------- bad input


@pytest.mark.parametrize(
    "kwargs, match",
    [(dict(order="tree"), "valid choices: sequential, pairwise"),
     (dict(order="atomic"), "pass seed=<int>; got seed=None"),
     (dict(mode="stochastic"), "pass seed=<int>; got seed=None"),
     (dict(order="atomic", seed=np.random.default_rng(0)), "seed must be an integer >= 0"),
     (dict(order="atomic", seed=-1), "seed must be an integer >= 0"),
     (dict(mode="sideways"), "valid choices: nearest_even"),
     (dict(acc="float12"), "valid choices: float64"),
     (dict(block=0), "block must be a positive integer"),
     (dict(order="warp", threads=48), "multiple of 32"),
     (dict(order="warp", threads=2048), "at most 1024"),
     (dict(acc="float64", mode="up"), "nearest_even"),
     (dict(splits=2.5), "splits must be a positive integer")],
)
def test_bad_arguments_name_the_value_and_the_choices(kwargs, match):
    with pytest.raises(ValueError, match=match):
        reduce_sum(np.ones(8), **kwargs)


def test_empty_input_is_rejected():
    with pytest.raises(ValueError, match="non-empty last axis"):
        reduce_sum(np.ones((3, 0)))


# --------------------------------------------------------------------------- decisions


def test_boundary_terms_flip_the_stopping_test_in_torch_and_in_the_simulator():
    tol = 2.0**-10
    p = boundary_terms(tol, "float16", 4)
    assert sum(Fraction(v) for v in p) == Fraction(tol)  # the exact sum sits on tol
    t = torch.tensor(p, dtype=torch.float16)
    for order, want_stop in ((t, True), (t.flip(0), False)):
        acc = torch.zeros((), dtype=torch.float16)
        for v in order:
            acc = acc + v
        assert bool(acc < tol) is want_stop
    assert reduce_sum(p, "sequential", "float16") < tol
    assert reduce_sum(p[::-1], "sequential", "float16") == tol
    assert reduce_sum(p, "sequential", "float32") == tol


@pytest.mark.parametrize("tol, n_small, match", [(1e-3, 4, "positive float16 value"),
                                                 (2.0**-10, 3, "power of two"),
                                                 (2.0**-14, 64, "below float16's smallest")])
def test_boundary_terms_reject_impossible_requests(tol, n_small, match):
    with pytest.raises(ValueError, match=match):
        boundary_terms(tol, "float16", n_small)


def test_flip_probability_counts_disagreements_by_brute_force():
    rng = np.random.default_rng(8)
    sums = 1.0 + rng.standard_normal(500) * 1e-3
    margins = np.array([-3e-3, -1e-4, 1e-5, 1e-3, 5e-3])
    got = flip_probability(sums, 1.0, margins)
    for m, g in zip(margins, got, strict=True):
        tol = 1.0 * (1 + m)
        assert g == np.mean([(s < tol) != (1.0 < tol) for s in sums])


# --------------------------------------------------------------------------- profiles and matmul


def test_profiles_are_frozen_and_unknown_names_list_the_valid_ones():
    p = get_profile("tf32")
    with pytest.raises(dataclasses.FrozenInstanceError):
        p.inputs = "float16"
    with pytest.raises(ValueError, match="valid choices: " + ", ".join(PROFILE_NAMES)):
        get_profile("tf16")
    assert "tf32 (nearest_away" in describe("tf32")
    assert "every 128 products" in describe("fp8")


def ref_matmul_entry(a_row, b_col, p):
    """One output entry: FMA chain with exact products, each step rounded once (rationals)."""
    acc_fmt, total, acc = p.accumulator_format, Fraction(0), 0.0
    for t, (x, y) in enumerate(zip(a_row, b_col, strict=True)):
        acc = fraction_round(Fraction(acc) + Fraction(x) * Fraction(y), acc_fmt, p.acc_mode)
        if p.promote_every and ((t + 1) % p.promote_every == 0 or t == len(a_row) - 1):
            total = Fraction(fraction_round(total + Fraction(acc), p.promote_to, "nearest_even"))
            acc = 0.0
    s = total if p.promote_every else acc
    return fraction_round(Fraction(s), p.output, "nearest_even")


@pytest.mark.parametrize("name", PROFILE_NAMES)
def test_matmul_equals_rational_fma_chain(name):
    rng = np.random.default_rng(9)
    k = 300 if name.startswith("fp8") else 23
    A = rng.standard_normal((3, k)) * np.exp2(rng.integers(-6, 3, (3, k)))
    B = rng.standard_normal((k, 2))
    p = get_profile(name)
    got = matmul(A, B, name)
    Ar, Br = round_operands(A, p), round_operands(B, p)
    want = [[ref_matmul_entry(Ar[i], Br[:, j], p) for j in range(2)] for i in range(3)]
    assert np.array_equal(got, want)


def test_operand_rounding_follows_the_profile():
    x = np.array([1 + 2.0**-11, 1 + 3 * 2.0**-11, 500.0, -1e6])
    assert np.array_equal(round_operands(x, "tf32"), round_to(x, "tf32", "nearest_away"))
    # tf32-raw: stored as float32 words, then the low 13 bits dropped (a mask, independently)
    words = x.astype(np.float32).view(np.uint32) & np.uint32(0xFFFFE000)
    assert np.array_equal(round_operands(x, "tf32-raw"), words.view(np.float32).astype(np.float64))
    assert np.array_equal(round_operands(x, "bf16"), round_to(x, "bfloat16"))
    assert np.array_equal(round_operands(x, "fp8"), round_to(x, "float8_e4m3fn", saturate=True))
    assert get_profile("fp8").accumulator_format is FP8_GEMM_ACCUMULATOR


@pytest.mark.parametrize("name", ["fp32", "tf32", "bf16", "fp16"])
@pytest.mark.parametrize("shape", [(1, 1, 1), (3, 7, 5), (16, 33, 8), (24, 200, 12)])
@pytest.mark.parametrize("splits", [1, 3])
def test_fp32_accumulate_matmul_within_standard_bound(name, shape, splits):
    """|C - AB| <= gamma_{k+s} |A||B| (1 + u_out) + u_out |AB| for the rounded operands A, B."""
    m, k, n = shape
    rng = np.random.default_rng(k)
    p = get_profile(name)
    A = round_operands(rng.standard_normal((m, k)), p)
    B = round_operands(rng.standard_normal((k, n)), p)
    C = matmul(A, B, p, splits=splits)
    exact = np.array([[math.fsum(A[i] * B[:, j]) for j in range(n)] for i in range(m)])
    u = get_format("float32").unit_roundoff
    u_out = get_format(p.output).unit_roundoff if p.output != "float32" else u
    steps = k + splits
    gamma = steps * u / (1 - steps * u)
    absprod = np.abs(A) @ np.abs(B)
    bound = gamma * absprod * (1 + u_out) + u_out * np.abs(exact) + 1e-300
    assert (np.abs(C - exact) <= bound).all()
    # and torch's float32 matmul of the same operands obeys the same bound (sanity of the bound)
    if name == "fp32":
        t = (torch.from_numpy(A).float() @ torch.from_numpy(B).float()).double().numpy()
        assert (np.abs(t - exact) <= bound).all()


def test_single_product_is_torch_float32_multiply():
    rng = np.random.default_rng(10)
    a = rng.standard_normal((50, 1)).astype(np.float32)
    b = rng.standard_normal((1, 40)).astype(np.float32)
    want = (torch.from_numpy(a) * torch.from_numpy(b)).double().numpy()
    assert np.array_equal(matmul(a, b, "fp32"), want)


def test_split_k_equals_rational_partials():
    rng = np.random.default_rng(12)
    A, B = rng.standard_normal((2, 30)), rng.standard_normal((30, 2))
    got = matmul(A, B, "tf32", splits=4)
    p = get_profile("tf32")
    Ar, Br = round_operands(A, p), round_operands(B, p)
    for i in range(2):
        for j in range(2):
            parts = [ref_matmul_entry(Ar[i, s:s + 8], Br[s:s + 8, j], p) for s in range(0, 30, 8)]
            assert got[i, j] == ref_seq(parts, "float32", "nearest_even")


@pytest.mark.parametrize("args, match", [((np.ones((2, 3)), np.ones((2, 3))), "inner dimensions"),
                                         ((np.ones(3), np.ones((3, 1))), "2-D matrix")])
def test_matmul_rejects_bad_shapes(args, match):
    with pytest.raises(ValueError, match=match):
        matmul(*args)
    with pytest.raises(ValueError, match="splits"):
        matmul(np.ones((2, 2)), np.ones((2, 2)), splits=0)


# --------------------------------------------------------------------------- solver


def small_system(seed=1, n=32):
    rng = np.random.default_rng(seed)
    A = (rng.standard_normal((n, n)) * 0.1 + 2 * np.eye(n)).astype(np.float32)
    return A, rng.standard_normal(n).astype(np.float32)


def test_jacobi_fp32_converges_to_the_float64_solution():
    A, b = small_system()
    res = jacobi_solve(A, b, "fp32", tol=1e-5, max_iter=100)
    assert res.converged
    x64 = np.linalg.solve(A.astype(np.float64), b.astype(np.float64))
    assert np.linalg.norm(res.x - x64) <= 1e-4 * np.linalg.norm(x64)


def test_history_predicts_the_iteration_count_of_every_tolerance():
    A, b = small_system()
    long = jacobi_solve(A, b, "tf32", tol=1e-12, max_iter=40)
    assert not long.converged and long.residuals.size == 41
    for tol in (1e-2, 1e-3, 5e-4, 1e-4):
        run = jacobi_solve(A, b, "tf32", tol=tol, max_iter=40)
        want = iterations_to_reach(long.residuals, tol)
        assert run.iterations == (want if want is not None else 40)
        assert run.converged == (want is not None)


def test_solver_rejects_bad_input():
    with pytest.raises(ValueError, match="square"):
        jacobi_solve(np.ones((2, 3)), np.ones(2))
    with pytest.raises(ValueError, match="tol must be positive"):
        jacobi_solve(np.eye(2), np.ones(2), tol=0)
    with pytest.raises(ValueError, match="valid choices"):
        jacobi_solve(np.eye(2), np.ones(2), "fp64")


def test_every_profile_name_is_registered_once():
    assert list(PROFILES) == list(PROFILE_NAMES)
    assert {"fp32", "tf32", "bf16", "fp16", "fp8"} <= set(PROFILE_NAMES)


@pytest.mark.parametrize("fmt", ["float16", "bfloat16", "float8_e4m3fn"])
def test_convert_of_a_long_input_is_the_ml_dtypes_cast_of_every_value(fmt):
    # convert rounds long inputs on rounding's NumPy tier (compiled=False): every value is the nearest-even cast that ml_dtypes (NumPy for
    # float16) makes, with the hard regions mixed in: ties, subnormals, overflow, +-inf, NaN.
    import ml_dtypes

    from precisionlab.gpu.arith import RoundedAdder

    f = get_format(fmt)
    rng = np.random.default_rng(7)
    x = rng.standard_normal((3, 5000)) * 2.0 ** rng.integers(-30, 20, (3, 5000))
    x.flat[::97] = f.max_finite * 1.5
    x.flat[1::97] = f.min_subnormal * 0.75
    x.flat[2::97] = 1 + 2.0 ** -(f.precision)  # a tie at 1
    x.flat[3::97] = [np.inf, -np.inf, np.nan] * (len(x.flat[3::97]) // 3) + [
        np.nan] * (len(x.flat[3::97]) % 3)
    cast = np.float16 if fmt == "float16" else getattr(ml_dtypes, fmt)
    with np.errstate(over="ignore", invalid="ignore"):
        got = RoundedAdder(fmt).convert(x)
        want = x.astype(cast).astype(np.float64)
    assert got.shape == x.shape
    np.testing.assert_array_equal(got, want.astype(got.dtype))
    assert np.array_equal(np.signbit(got), np.signbit(want))


@pytest.mark.parametrize("mode", ["nearest_even", "nearest_away", "toward_zero", "up", "down"])
def test_round_float64_of_a_long_input_is_round_to_of_every_value(mode):
    # round_float64 rounds long inputs on rounding's NumPy tier: each value (one in 7 checked,
    # and those around 4096, where the tier would change) is what round_to gives for
    # that value alone, and the whole is round_to's of the whole array.
    from precisionlab.gpu.arith import round_float64

    rng = np.random.default_rng(11)
    x = rng.standard_normal((3, 5000)) * 2.0 ** rng.integers(-30, 20, (3, 5000))
    x.flat[::89] = [np.inf, -np.inf, np.nan, 7e4, -0.0, 2.0**-26] * (len(x.flat[::89]) // 6) + [
        0.0] * (len(x.flat[::89]) % 6)
    with np.errstate(over="ignore", invalid="ignore"):
        got = round_float64(x, "float16", mode)
        whole = np.asarray(round_to(x, "float16", mode), dtype=np.float64)
        picks = sorted({*range(0, x.size, 7), 4094, 4095, 4096, 8189, 8190, 8191})
        one = [float(round_to(float(x.flat[i]), "float16", mode)) for i in picks]
    assert got.shape == x.shape
    np.testing.assert_array_equal(got, whole)
    np.testing.assert_array_equal(got.flat[picks], one)
    assert np.array_equal(np.signbit(got), np.signbit(whole))


def test_one_off_roundings_of_long_inputs_compile_no_numba_loop(monkeypatch):
    # Operand loads (round_operands, the tensor-core feeds and their 'exact' check), rounded_add,
    # reduce_sum's adds and output, a simulated matmul's accumulators and TinyDecoder's weights
    # round at most CONVERT_NUMPY_MAX values in all: they stay on rounding's NumPy tier, where a
    # cold compile would cost more than it saves, with the bits of the compiled tier (computed
    # first, by round_to itself or with the adders' work unknown, before numba_kernel is
    # refused).
    from precisionlab import rounding_kernel
    from precisionlab.exact import two_sum
    from precisionlab.gpu import tensor_core_matmul
    from precisionlab.gpu.arith import round_to_odd

    rng = np.random.default_rng(5)
    a = rng.standard_normal((64, 80)).astype(np.float32).astype(np.float64)  # 5120 values
    b = rng.standard_normal((80, 4)).astype(np.float32).astype(np.float64)
    y = rng.standard_normal((5000, 2))
    assert min(a.size, len(y)) >= rounding_kernel.NUMBA_MIN_SIZE
    loads = {"tf32": round_to(a, "tf32", "nearest_away"), "bf16": round_to(a, "bfloat16"),
             "tf32-raw": round_to(a, "tf32", "toward_zero"),
             "fp8": round_to(a, "float8_e4m3fn", saturate=True)}
    tc = {feed: tensor_core_matmul(loads[name], round_to(b, "tf32", mode), model="A100",
                                   inputs="tf32", operands="exact")
          for feed, name, mode in (("converted", "tf32", "nearest_away"),
                                   ("raw", "tf32-raw", "toward_zero"))}
    added = round_to(round_to_odd(*two_sum(y[:, 0], y[:, 1])), "bfloat16", "toward_zero")
    summed = round_to(reduce_sum(y, "sequential", "float32"), "float16")
    lanes = rng.standard_normal((4096, 24))  # 98,304 adds, each of 4096 lanes at once

    def compiled_sum(acc, mode):  # the same adds by an adder whose work is unknown: numba
        adder = RoundedAdder(acc, mode, np.random.default_rng(0) if mode == "stochastic" else None)
        total = adder.convert(lanes[:, 0])
        for j in range(1, lanes.shape[1]):
            total = adder.add(total, adder.convert(lanes[:, j]))
        return total

    sums = {(acc, mode): compiled_sum(acc, mode)
            for acc, mode in (("bfloat16", "nearest_even"), ("float16", "toward_zero"),
                              ("float8_e5m2", "up"))}
    a64, b64 = rng.standard_normal((70, 64)), rng.standard_normal((64, 70))
    b_bf = round_to(rng.standard_normal((80, 70)), "bfloat16")
    exact_tc = tensor_core_matmul(loads["bf16"], b_bf, model="A100", inputs="bfloat16",
                                  operands="exact")
    product = matmul(a64, b64, "bf16")
    decoder = TinyDecoder.random(vocab=256, d=64)

    def refuse(*args):
        raise AssertionError(f"numba_kernel{args} was built")

    monkeypatch.setattr(rounding_kernel, "numba_kernel", refuse)
    for name, want in loads.items():
        assert np.array_equal(round_operands(a, name), want)
    for feed, want in tc.items():
        assert np.array_equal(tensor_core_matmul(a, b, model="A100", inputs="tf32", operands=feed), want)
    assert np.array_equal(rounded_add(y[:, 0], y[:, 1], "bfloat16", "toward_zero"), added)
    assert np.array_equal(reduce_sum(y, "sequential", "float32", out="float16"), summed)
    for (acc, mode), want in sums.items():
        assert np.array_equal(reduce_sum(lanes, "sequential", acc, mode=mode), want), acc
    assert np.array_equal(tensor_core_matmul(loads["bf16"], b_bf, model="A100",
                                             inputs="bfloat16", operands="exact"), exact_tc)
    assert np.array_equal(matmul(a64, b64, "bf16"), product)
    assert all(np.array_equal(getattr(TinyDecoder.random(vocab=256, d=64), k), getattr(decoder, k))
               for k in ("embed", "w", "u"))
