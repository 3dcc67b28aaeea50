"""precisionlab.gpu.collectives against an exact oracle: Fractions rounded once per add, in an
order written out here from each algorithm's description (not from the module's helpers)."""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from oracles import fraction_round, sound

from precisionlab.gpu import COLLECTIVE_ORDERS, allreduce
from precisionlab.gpu.collectives import btree, dtree, gloo_segments, rank_sequence

BYTES = {"float32": 4, "bfloat16": 2, "float16": 2, "float64": 8}


def fr(v, fmt):
    return Fraction(fraction_round(Fraction(v), fmt, "nearest_even"))


def add(a, b, fmt):
    return Fraction(fraction_round(a + b, fmt, "nearest_even"))


def oracle_chain(x, ranks, fmt):
    acc = fr(x[ranks[0]], fmt)
    for r in ranks[1:]:
        acc = add(acc, fr(x[r], fmt), fmt)
    return acc


def oracle_order(order, j, n, w, fmt):
    """The ranks of element j's chain, from the algorithms' descriptions."""
    if order == "sequential" or w == 1:
        return list(range(w))
    if order == "ring":  # NCCL: chunk c = j // ceil(n/W) starts on c+1, ends on c
        c = j // -(-n // w)
        return [(c + k) % w for k in range(1, w + 1)]
    # gloo: segments of bytes, at least 2W of them, a multiple of W; chunk q ends on q
    total = n * BYTES[fmt]
    segs = max(-(-total // (1 << 20)), 2 * w)
    segs = -(-segs // w) * w
    seg_bytes = -(-total // segs)
    seg_elems = -(-seg_bytes // BYTES[fmt])
    q = (j // seg_elems) // (segs // w)
    return [(q - k) % w for k in range(1, w + 1)]


def oracle_tree(x, children, root, fmt):
    def node(r):
        acc = fr(x[r], fmt)
        for d in children[r]:
            acc = add(acc, node(d), fmt)
        return acc
    return node(root)


def oracle(parts, order, fmt):
    w, n = parts.shape
    out = []
    for j in range(n):
        col = [float(v) for v in parts[:, j]]
        if order in ("tree", "double_tree"):
            trees = [btree(w)] if order == "tree" else list(dtree(w))
            k = j // -(-n // len(trees))
            t = trees[k]
            root = next(r for r in t if all(r not in ch for ch in t.values()))
            out.append(oracle_tree(col, t, root, fmt))
        else:
            out.append(oracle_chain(col, oracle_order(order, j, n, w, fmt), fmt))
    return np.array([float(v) for v in out])


def hard_parts(w, n, seed):
    """Values where the order matters: a few large, many tiny, mixed signs."""
    rng = np.random.default_rng(seed)
    mag = 2.0 ** rng.integers(-26, 8, (w, n))
    return rng.choice([-1.0, 1.0], (w, n)) * rng.uniform(1, 2, (w, n)) * mag


@pytest.mark.parametrize("order", COLLECTIVE_ORDERS)
@pytest.mark.parametrize("fmt", ["float32", "bfloat16"])
@pytest.mark.parametrize("w", [1, 2, 3, 4, 5, 8])
def test_every_order_matches_the_fraction_oracle(order, fmt, w):
    parts = hard_parts(w, 37, seed=w)
    got = allreduce(parts, order, fmt)
    want = oracle(parts, order, fmt)
    np.testing.assert_array_equal(got, want)


@sound(60)
@given(w=st.integers(1, 8), n=st.integers(1, 40), seed=st.integers(0, 2**32 - 1),
       order=st.sampled_from(COLLECTIVE_ORDERS), fmt=st.sampled_from(["float32", "bfloat16"]))
def test_property_oracle(w, n, seed, order, fmt):
    parts = hard_parts(w, n, seed)
    np.testing.assert_array_equal(allreduce(parts, order, fmt), oracle(parts, order, fmt))


@sound(40)
@given(n=st.integers(1, 50), seed=st.integers(0, 2**32 - 1),
       order=st.sampled_from(COLLECTIVE_ORDERS), fmt=st.sampled_from(["float32", "bfloat16"]))
def test_world_size_one_is_the_identity(n, seed, order, fmt):
    parts = hard_parts(1, n, seed)
    want = np.array([float(fr(v, fmt)) for v in parts[0]])
    np.testing.assert_array_equal(allreduce(parts, order, fmt), want)


@sound(40)
@given(w=st.integers(1, 8), n=st.integers(1, 30), seed=st.integers(0, 2**32 - 1),
       order=st.sampled_from(COLLECTIVE_ORDERS))
def test_exact_when_every_sum_fits(w, n, seed, order):
    """Small integers add exactly in float32: every order gives the exact sum."""
    rng = np.random.default_rng(seed)
    parts = rng.integers(-1000, 1000, (w, n)).astype(np.float64)
    np.testing.assert_array_equal(allreduce(parts, order), parts.sum(axis=0))


def test_orders_differ_where_order_matters():
    # 1 + 2^-24 + 2^-24 + ... : the rank order decides whether the tiny terms survive
    parts = np.array([[1.0], [2.0**-24], [2.0**-24], [2.0**-24]])
    seq = allreduce(parts, "sequential")[0]
    ring = allreduce(parts, "ring")[0]  # chunk 0 starts on rank 1: tiny terms first
    assert seq == 1.0
    assert ring == 1.0 + 2.0**-22


def test_nccl_tree_shapes():
    t = btree(14)  # the illustration in NCCL's trees.cc
    assert t[0] == (8,) and t[8] == (4, 12) and t[12] == (10, 13) and t[13] == ()
    t0, t1 = dtree(4)
    assert t0 == {0: (2,), 1: (), 2: (1, 3), 3: ()}
    assert t1 == {3: (1,), 2: (), 1: (2, 0), 0: ()}
    _, s1 = dtree(5)  # odd: shifted by one
    assert s1[1] == (0,) and s1[3] == (2, 4)
    for w in range(1, 17):
        for tree in dtree(w):
            kids = [d for ch in tree.values() for d in ch]
            assert sorted(kids + [r for r in tree if r not in kids]) == list(range(w))


def test_gloo_segments_and_sequence():
    assert gloo_segments(24, 4) == (8, 3)
    assert gloo_segments(1, 4) == (8, 1)  # one element: only segment 0 is non-empty
    assert gloo_segments(1 << 20, 2, 4) == (4, 1 << 18)  # 4 MiB: four 1 MiB segments
    assert rank_sequence("gloo", 6, 24, 4) == [0, 3, 2, 1]
    assert rank_sequence("ring", 0, 8, 4) == [1, 2, 3, 0]


def test_accepts_torch_and_vectors_and_rejects_bad_input():
    torch = pytest.importorskip("torch")
    t = torch.tensor([[1.0, 2.0], [3.0, 4.0]])
    np.testing.assert_array_equal(allreduce(t), [4.0, 6.0])
    np.testing.assert_array_equal(allreduce(np.array([1.0, 2.0, 3.0])), [6.0])
    with pytest.raises(ValueError, match="order"):
        allreduce(t, "butterfly")
    with pytest.raises(ValueError, match="tf32"):
        allreduce(t, "ring", "tf32")
    with pytest.raises(ValueError, match="shape"):
        allreduce(np.zeros((2, 0)))


@sound(25)
@given(w=st.sampled_from([1, 2, 4]), seed=st.integers(0, 2**32 - 1),
       order=st.sampled_from(COLLECTIVE_ORDERS))
def test_data_parallel_sum_is_shard_sums_then_all_reduce(w, seed, order):
    from precisionlab.gpu.collectives import data_parallel_sum
    samples = hard_parts(8, 5, seed)
    parts = np.empty((w, 5))
    for r in range(w):
        for j in range(5):
            rows = samples[r * (8 // w):(r + 1) * (8 // w), j]
            parts[r, j] = float(oracle_chain(list(rows), list(range(len(rows))), "float32"))
    want = oracle(parts, order, "float32")
    np.testing.assert_array_equal(data_parallel_sum(samples, w, order), want)
    with pytest.raises(ValueError, match="multiple"):
        data_parallel_sum(samples[:7], 2)


@sound(15)
@given(w=st.sampled_from([1, 2, 4]), seed=st.integers(0, 2**32 - 1),
       order=st.sampled_from(COLLECTIVE_ORDERS))
def test_bfloat16_reduction_rounds_each_float32_shard_sum_once(w, seed, order):
    """FSDP's reduce_dtype: the backward accumulates in float32; only the collective is bf16."""
    from precisionlab.gpu.collectives import data_parallel_sum
    samples = hard_parts(8, 5, seed)
    parts = np.empty((w, 5))
    for r in range(w):
        for j in range(5):
            rows = samples[r * (8 // w):(r + 1) * (8 // w), j]
            s32 = oracle_chain(list(rows), list(range(len(rows))), "float32")
            parts[r, j] = float(fr(float(s32), "bfloat16"))
    want = oracle(parts, order, "bfloat16")
    np.testing.assert_array_equal(data_parallel_sum(samples, w, order, "bfloat16"), want)
    if w == 1:  # no collective: the float32 sum rounded once
        np.testing.assert_array_equal(want, parts[0])


def test_bad_elements_and_samples_are_named():
    from precisionlab.gpu.collectives import data_parallel_sum
    with pytest.raises(ValueError, match="element"):
        rank_sequence("ring", 8, 8, 4)
    with pytest.raises(ValueError, match="element"):
        rank_sequence("ring", -1, 8, 4)
    with pytest.raises(ValueError, match="N >= 1"):
        data_parallel_sum(np.ones((0, 3)), 1)
    with pytest.raises(ValueError, match="fmt"):
        data_parallel_sum(np.ones((2, 3)), 1, "ring", "tf32")
