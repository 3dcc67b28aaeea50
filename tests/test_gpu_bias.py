"""gpu.add_errors_by_binade against exact rationals: every add's error and binade, by hand."""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest
from oracles import fraction_round

from precisionlab.gpu import add_errors_by_binade, atomic_orders, exact_sum, reduce_sum


def _floor_log2(q: Fraction) -> int:
    e = q.numerator.bit_length() - q.denominator.bit_length()
    while Fraction(2) ** e > q:
        e -= 1
    while Fraction(2) ** (e + 1) <= q:
        e += 1
    return e


def _reference(x, orders, fmt, edges):
    """Per binade and band: adds, error sum (Fractions), up/down counts, by the definition."""
    loads = [fraction_round(Fraction(float(v)), fmt, "nearest_even") for v in x]
    books: dict = {}
    finals = []
    for row in orders:
        s = Fraction(0)
        for i in row:
            t = Fraction(loads[i])
            exact = s + t
            new = Fraction(fraction_round(exact, fmt, "nearest_even"))
            if exact != 0:
                e = _floor_log2(abs(exact))
                u = Fraction(2) ** (e - 7 if fmt == "bfloat16" else e - 10)
                band = sum(abs(t) / u >= Fraction(edge) for edge in edges) - 1
                b = books.setdefault(e, {"adds": 0, "err": Fraction(0), "up": 0, "down": 0,
                                         "band_adds": [0] * len(edges),
                                         "band_err": [Fraction(0)] * len(edges)})
                err = new - exact
                b["adds"] += 1
                b["err"] += err
                b["up"] += err > 0
                b["down"] += err < 0
                b["band_adds"][band] += 1
                b["band_err"][band] += err
            s = new
        finals.append(float(s))
    load_error = sum(Fraction(v) for v in loads) - sum(Fraction(float(v)) for v in x)
    return books, np.array(finals), load_error


@pytest.mark.parametrize("fmt", ["bfloat16", "float16"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_every_add_is_booked_to_the_binade_of_its_exact_sum(fmt, seed):
    rng = np.random.default_rng(seed)
    x = rng.uniform(0.05, 1.0, 40) * 2.0 ** rng.integers(-9, -3, 40)
    if seed == 2:
        x[::3] *= -1  # cancellation: sums of both signs, binades of |S + t|
    orders = atomic_orders(7, x.size, seed=seed + 10)
    edges = (0.0, 0.5, 1.0, 1.5, 2.0)
    split = add_errors_by_binade(x, orders, fmt, edges)
    books, finals, load_error = _reference(x, orders, fmt, edges)
    lanes = orders.shape[0]
    assert split.exponents.tolist() == sorted(books)
    for j, e in enumerate(split.exponents):
        b = books[int(e)]
        assert split.adds[j] == b["adds"] / lanes
        assert split.up[j] == b["up"] / lanes and split.down[j] == b["down"] / lanes
        assert split.error[j] == pytest.approx(float(b["err"] / lanes), rel=1e-12, abs=1e-300)
        assert split.band_adds[j].tolist() == [n / lanes for n in b["band_adds"]]
        for got, want in zip(split.band_error[j], b["band_err"], strict=True):
            assert got == pytest.approx(float(want / lanes), rel=1e-12, abs=1e-300)
    assert np.array_equal(split.sums, finals)
    assert split.load_error == float(load_error)
    assert split.exact == float(exact_sum(x))


def test_the_split_adds_up_to_the_bias_of_reduce_sum_atomic():
    rng = np.random.default_rng(5)
    y = rng.uniform(0.1, 1.0, 128) * 2.0**-7
    orders = atomic_orders(500, y.size, seed=3)
    sums = reduce_sum(np.broadcast_to(y, (500, y.size)), "atomic", "bfloat16", block=1,
                      seed=3)
    split = add_errors_by_binade(y, orders, "bfloat16")
    assert np.array_equal(split.sums, sums)
    bias = float(exact_sum(np.concatenate([sums, -np.full(500, float(exact_sum(y)))]))) / 500
    assert split.total == pytest.approx(bias, rel=1e-9)
    assert np.allclose(split.band_adds.sum(axis=1), split.adds)
    assert np.allclose(split.band_error.sum(axis=1), split.error, rtol=1e-12, atol=0)


@pytest.mark.parametrize(("args", "match"), [
    ((np.ones((2, 3)), np.zeros((1, 3), dtype=int)), "1-D"),
    ((np.ones(3), np.zeros((2, 3), dtype=int)), "permutation"),
    ((np.ones(3), np.zeros((2, 4), dtype=int)), r"shape \(lanes, 3\)"),
    ((np.ones(3), np.zeros((2, 3))), "integer"),
    ((np.array([1.0, np.inf]), np.array([[0, 1]])), "finite"),
])
def test_bad_inputs_name_the_parameter(args, match):
    with pytest.raises(ValueError, match=match):
        add_errors_by_binade(*args)


def test_bad_band_edges_and_formats_are_rejected():
    x, o = np.ones(3), np.array([[0, 1, 2]])
    with pytest.raises(ValueError, match="band_edges"):
        add_errors_by_binade(x, o, band_edges=(0.5, 1.0))
    with pytest.raises(ValueError, match="band_edges"):
        add_errors_by_binade(x, o, band_edges=(0.0, 1.0, 1.0))
    with pytest.raises(ValueError, match="float64"):
        add_errors_by_binade(x, o, "float64")
    with pytest.raises(ValueError, match=r"unknown|valid"):
        add_errors_by_binade(x, o, "float7")
