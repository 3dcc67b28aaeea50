"""Chapter 7's comparisons with the source: its first-order charge, its labels, the corpus table,
the dot product in every order, and the case built beside the corpus.

Oracles: exact rationals (fractions.Fraction, `fraction_round` for every rounding), explicit
loops over orders and tiles, NumPy's float16 cast for the regenerated data, and hand-written
expectations of the source's labels.
"""

from __future__ import annotations

import math
from dataclasses import replace
from fractions import Fraction

import numpy as np
import pytest
from oracles import fraction_round

from precisionlab import intervals as iv
from precisionlab.formats import get_format

EPS32, EPS16 = get_format("float32").eps, get_format("float16").eps


# --------------------------------------------------------------------------- the source's charge


def charge_oracle(x, w, eps, tile, out="float16"):
    """The source's charge by exact rationals and explicit loops (one element at a time)."""
    e, e_out = Fraction(eps), Fraction(get_format(out).eps)
    m, k = x.shape
    lo_c, hi_c = np.empty((m, w.shape[1])), np.empty((m, w.shape[1]))
    for i, j in np.ndindex(lo_c.shape):
        c_lo = c_hi = Fraction(0)
        inf_lo = inf_hi = None
        for t in range(0, k, tile):
            p = [Fraction(x[i, q]) * Fraction(w[q, j]) for q in range(t, t + tile)]
            lo = [v - e * abs(v) for v in p]
            hi = [v + e * abs(v) for v in p]
            t_lo = sum(lo) - sum(abs(v) for v in lo) * (tile - 1) * e
            t_hi = sum(hi) + sum(abs(v) for v in hi) * (tile - 1) * e
            r_lo = fraction_round(t_lo, out, "down")
            r_hi = fraction_round(t_hi, out, "up")
            if math.isinf(r_lo):
                inf_lo = r_lo
            if math.isinf(r_hi):
                inf_hi = r_hi
            if inf_lo is None:
                c_lo += Fraction(r_lo)
                c_lo -= e_out * abs(c_lo)
            if inf_hi is None:
                c_hi += Fraction(r_hi)
                c_hi += e_out * abs(c_hi)
        lo_c[i, j] = float(c_lo) if inf_lo is None else inf_lo
        hi_c[i, j] = float(c_hi) if inf_hi is None else inf_hi
    return lo_c, hi_c


def close(got, want):
    """Equal infinities, or finite values within 1e-12 relative (the charge is evaluated in float64)."""
    same_inf = np.isinf(want) & (got == want)
    with np.errstate(invalid="ignore"):  # inf - inf where an end is infinite
        finite = np.isfinite(want) & (np.abs(got - want) <= 1e-12 * np.abs(want) + 1e-300)
    return bool(np.all(same_inf | finite))


@pytest.mark.parametrize("eps", [EPS32, EPS16])
@pytest.mark.parametrize("tile", [1, 4, 8])
def test_source_charge_matches_exact_rationals_and_holds_the_exact_product(eps, tile):
    x = iv.uniform_data((3, 16), 11, "float16")
    w = iv.uniform_data((16, 2), 12, "float16", scale=4.0)
    got = iv.source_charge(x, w, eps, tile=tile)
    lo, hi = charge_oracle(x, w, eps, tile)
    assert close(got.lo, lo) and close(got.hi, hi)
    for i, j in np.ndindex(lo.shape):
        exact = sum(Fraction(x[i, q]) * Fraction(w[q, j]) for q in range(16))
        assert Fraction(got.lo[i, j]) <= exact <= Fraction(got.hi[i, j])


def test_source_charge_grows_with_the_tile_eps_and_reaches_inf_on_overflow():
    x = iv.uniform_data((2, 32), 13, "float16")
    w = iv.uniform_data((32, 3), 14, "float16")
    narrow = iv.source_charge(x, w, EPS32, tile=8)
    wide = iv.source_charge(x, w, EPS16, tile=8)
    assert np.all(wide.lo < narrow.lo) and np.all(wide.hi > narrow.hi)
    # tiles of four products 200 * 200 sum to 160000, past float16's 65504
    big = iv.source_charge(np.full((1, 8), 200.0), np.full((8, 1), 200.0), EPS32, tile=4)
    lo, hi = charge_oracle(np.full((1, 8), 200.0), np.full((8, 1), 200.0), EPS32, 4)
    assert hi[0, 0] == math.inf and close(big.hi, hi) and close(big.lo, lo)
    assert big.lo[0, 0] < 2 * 65504  # each tile's lower end rounds down to the largest float16


@pytest.mark.parametrize(
    "args, words",
    [((np.ones((2, 6)), np.ones((6, 2)), EPS32, 4), ["tile", "k = 6", "tile=4"]),
     ((np.ones((2, 8)), np.ones((8, 2)), -1.0, 4), ["eps_tile", "-1.0"]),
     ((np.ones((2, 8)), np.ones((7, 2)), EPS32, 4), ["(2, 8)", "(7, 2)"]),
     ((np.ones((2, 8)), np.ones((8, 2)), EPS32, 0), ["tile", "positive"])],
)
def test_source_charge_names_bad_arguments(args, words):
    with pytest.raises(ValueError) as err:
        iv.source_charge(*args)
    assert all(w in str(err.value) for w in words), str(err.value)


def test_the_data_is_regenerated_from_numpy_draws_and_numpys_float16_cast():
    rng = np.random.default_rng(7)
    a = rng.uniform(-2, 2, 4).astype(np.float16).astype(np.float64)
    b = rng.uniform(-2, 2, 4).astype(np.float16).astype(np.float64)
    assert np.array_equal(iv.uniform_data((2, 4), 7, "float16", scale=2.0), np.stack([a, b]))


# --------------------------------------------------------------------------- labels, table, extra case


def test_source_issue_names_the_issue_only_where_the_labels_agree():
    want = {"atomic split-K, fp16 C": "#1808", "tf32 tensor cores": "#4551",
            "bf16 reference": "#1937", "transposed strides": "#1666",
            "gradient accumulation": "#34191"}
    got = {name: iv.source_issue(iv.build_case(name)) for name in iv.CORPUS}
    assert {n: i for n, i in got.items() if i} == want
    tail = iv.build_case("fp16 fast-path tail")  # #2680's mechanism, but a bug: not "like" it
    assert tail.source == "#2680" and got["fp16 fast-path tail"] == ""
    assert iv.source_issue(replace(tail, truth="Type-I")) == "#2680"


def test_the_corpus_table_marks_each_methods_verdict_against_the_truth():
    r = iv.evaluate_case(iv.build_case("transposed strides"))
    wrong = replace(r, high_precision="Type-I")
    t = iv.corpus_table([r, wrong])
    assert t.headers[:2] == ["case", "like"] and len(t.rows) == 2
    assert t.rows[0][:4] == ["transposed strides", "#1666", "kernel", "Type-II"]
    assert t.rows[0][5:] == ["Type-II ok", "Type-II ok", "Type-II ok"]
    assert t.rows[1][5:] == ["Type-II ok", "Type-II ok", "Type-I WRONG"]
    assert t.rows[0][4] == f"{r.max_diff:.3g}"
    assert list(r.correct) == list(iv.METHODS)


def test_the_fp64_build_case_stands_beside_the_corpus():
    assert "fp64 build differs" in iv.EXTRA_CASES and "fp64 build differs" not in iv.CORPUS
    c = iv.build_case("fp64 build differs")
    rng = np.random.default_rng(60)
    x = rng.uniform(-1, 1, (8, 1027)).astype(np.float16).astype(np.float64)
    assert np.array_equal(c.x, x) and (c.truth, c.source) == ("Type-I", "#2680")
    # the float64 build never loads the last k mod 16 = 3 products; the float16 build does
    moved = c.x.copy()
    moved[:, -3:] = 0.5
    high, fp16 = c.target_high[0], c.target[0]
    assert np.array_equal(high.run(moved), high.run(c.x))
    assert not np.array_equal(fp16.run(moved), fp16.run(c.x))
    r = iv.evaluate_case(c)  # round-off that re-execution calls a bug
    assert (r.structure.verdict, r.high_precision, r.passes_allclose) == ("Type-I", "Type-II", False)
    with pytest.raises(ValueError, match="fp64 build differs"):
        iv.build_case("fp64 build")
