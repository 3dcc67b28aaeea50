"""precisionlab.chapters.at_scale: a float32 training run whose gradient is all-reduced on W
ranks is bitwise reproducible, is a plain sequential-sum run at W = 1, and departs from it
at W > 1 exactly where the all-reduce's sums differ."""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest
from oracles import fraction_round

from precisionlab.chapters.at_scale import per_example_grads, regression_data, train_run
from precisionlab.gpu.collectives import data_parallel_sum

X, Y = regression_data(examples=32, features=8, seed=3)


def sequential_float32_sum(g):
    acc = np.float32(g[0].astype(np.float32))
    for row in g[1:]:
        acc = acc + row.astype(np.float32)  # IEEE float32 adds, one rounding each
    return acc.astype(np.float64)


def test_world_size_one_is_a_plain_sequential_run_and_reproducible():
    one = train_run(X, Y, 40, 1)
    plain = train_run(X, Y, 40, sum_fn=sequential_float32_sum)
    assert np.array_equal(one.params, plain.params) and np.array_equal(one.grads, plain.grads)
    again = train_run(X, Y, 40, 1)
    assert np.array_equal(one.params, again.params)
    assert np.array_equal(one.params, one.params.astype(np.float32))  # float32 values


@pytest.mark.parametrize("w", [2, 4, 8])
def test_runs_part_from_step_one_where_the_sums_differ(w):
    one, run = train_run(X, Y, 40, 1), train_run(X, Y, 40, w)
    g0 = per_example_grads(np.zeros(8), X, Y)
    assert np.array_equal(run.grads[0], data_parallel_sum(g0, w, "ring"))
    sums_differ = data_parallel_sum(g0, w, "ring") != data_parallel_sum(g0, 1, "ring")
    assert sums_differ.any()
    assert np.array_equal(run.params[1] != one.params[1], sums_differ)  # from w = 0, exactly
    assert (run.params[1:] != one.params[1:]).any(axis=1).all()
    assert np.array_equal(run.params, train_run(X, Y, 40, w).params)


def test_per_example_grads_round_each_operation_once():
    w = regression_data(examples=1, features=8, seed=9)[0][0]
    g = per_example_grads(w, X, Y)
    for i in (0, 5):
        exact = sum(Fraction(a) * Fraction(b) for a, b in zip(X[i], w, strict=True)) - Fraction(Y[i])
        r = fraction_round(fraction_round(exact, "float64", "nearest_even"), "float32",
                           "nearest_even")
        want = [fraction_round(Fraction(r) * Fraction(v), "float32", "nearest_even")
                for v in X[i]]
        assert g[i].tolist() == want


def test_bad_input_is_named():
    with pytest.raises(ValueError, match="power of two"):
        train_run(X, Y, 2, lr=0.3)
    with pytest.raises(ValueError, match="multiple of world_size"):
        train_run(X[:30], Y[:30], 2, 4)
