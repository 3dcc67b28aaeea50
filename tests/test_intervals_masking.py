"""precisionlab.intervals.masking: masked softmax (-inf and additive masks) and the mask-after bug.

Oracles: mpmath interval arithmetic at 200 bits for the exact softmax of the masked scores
(`exact_rows`: a -inf logit contributes exactly 0), exact rationals (`fraction_round`) for the
float32 rounding of an additive mask and of 1/n, and explicit loops over rows and keys.
Hard regions: -inf and -1e4 masks, fully masked rows, ties, a mask that hides every key but one.
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest
from oracles import fraction_round
from test_intervals_masks import exact_rows, inside

from precisionlab import intervals as iv

F32_ULP_1 = 2.0**-23  # float32's ulp at 1; the softmax budget is one ulp


def scores_and_mask(seed, shape=(6, 7), full_row=None):
    """float32 scores in [-8, 8] and a random mask with at least one key per row (except full_row)."""
    s = iv.uniform_data(shape, seed, "float32", scale=8.0)
    rng = np.random.default_rng(seed + 1000)
    mask = rng.random(shape) < 0.6
    mask[np.arange(shape[0]), rng.integers(0, shape[1], shape[0])] = True
    if full_row is not None:
        mask[full_row] = False
    return s, mask


def rounded_logits(s, mask, fill):
    """The masked scores by an explicit loop: fill for -inf, else fl32(s + fill) exactly rounded."""
    z = np.empty_like(s)
    for i, j in np.ndindex(s.shape):
        if mask[i, j]:
            z[i, j] = s[i, j]
        elif math.isinf(fill):
            z[i, j] = fill
        else:
            z[i, j] = fraction_round(Fraction(s[i, j]) + Fraction(fill), "float32", "nearest_even")
    return z


def near(executed, enc_mid, ulps=1.0):
    """|executed - exact| within `ulps` float32 ulps of the exact value (at most 1, so ulp <= 2^-23)."""
    return abs(executed - enc_mid) <= ulps * F32_ULP_1 * max(abs(enc_mid), 2.0**-126) + 2.0**-149


@pytest.mark.parametrize("fill", [-math.inf, -1e4, -30.0])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_masked_softmax_matches_the_exact_softmax_of_the_masked_scores(fill, seed):
    s, mask = scores_and_mask(seed)
    z = rounded_logits(s, mask, fill)
    assert np.array_equal(iv.masked_scores(s, mask, fill), z)
    executed = iv.masked_softmax(s, mask, fill)
    bound = iv.masked_softmax(iv.point(s), mask, fill)
    assert bound.contains(executed).all() and not bound.nan.any()
    for i, row in enumerate(exact_rows(z.tolist())):
        for j, (enc, _) in enumerate(row):
            assert inside(enc, bound.lo[i, j], bound.hi[i, j], floor=0.0, cap=1.0)
            mid = float(enc.mid)
            assert near(executed[i, j], mid), (i, j, executed[i, j], mid)
    if math.isinf(fill) or fill == -1e4:  # e^(about -1e4) is 0 in float32: masked keys get 0
        assert np.all(executed[~mask] == 0) and np.all(bound.lo[~mask] == 0)
    if math.isinf(fill):
        assert np.all(bound.hi[~mask] == 0)


@pytest.mark.parametrize("fill", [-math.inf, -1e4])
def test_a_fully_masked_row(fill):
    s, mask = scores_and_mask(5, full_row=2)
    executed = iv.masked_softmax(s, mask, fill)
    bound = iv.masked_softmax(iv.point(s), mask, fill)
    others = np.arange(s.shape[0]) != 2
    assert not bound.nan[others].any() and np.all(np.isfinite(executed[others]))
    if math.isinf(fill):  # every key -inf: NaN in the whole row, as torch.softmax gives
        assert np.all(np.isnan(executed[2])) and bound.nan[2].all()
    else:  # every score shifted by the same -1e4: a softmax over the rounded, shifted scores
        z = rounded_logits(s, mask, fill)[2]
        assert not bound.nan[2].any() and bound.contains(executed).all()
        for j, (enc, _) in enumerate(exact_rows([z.tolist()])[0]):
            assert inside(enc, bound.lo[2, j], bound.hi[2, j], floor=0.0, cap=1.0)
            assert near(executed[2, j], float(enc.mid))
        assert math.isclose(math.fsum(executed[2]), 1.0, rel_tol=1e-6)


@pytest.mark.parametrize("fill", [-math.inf, -1e4])
@pytest.mark.parametrize("n_open", [1, 2, 3, 5, 7])
def test_tied_scores_share_the_weight_equally(fill, n_open):
    s = np.full((1, 8), 0.75)
    mask = np.arange(8)[None, :] < n_open
    executed = iv.masked_softmax(s, mask, fill)[0]
    share = fraction_round(Fraction(1, n_open), "float32", "nearest_even")
    assert np.all(executed[:n_open] == share) and np.all(executed[n_open:] == 0)
    bound = iv.masked_softmax(iv.point(s), mask, fill)
    assert np.all(bound.lo[0, :n_open] <= 1 / n_open) and np.all(bound.hi[0, :n_open] >= 1 / n_open)


def test_a_single_open_key_takes_all_the_weight_whatever_its_score():
    s = np.array([[-80.0, 3.0, 80.0, 80.0]])
    mask = np.array([[True, False, False, False]])
    for fill in (-math.inf, -1e4):
        assert iv.masked_softmax(s, mask, fill)[0].tolist() == [1.0, 0.0, 0.0, 0.0]
        b = iv.masked_softmax(iv.point(s), mask, fill)
        assert b.contains(np.array([[1.0, 0.0, 0.0, 0.0]])).all()


@pytest.mark.parametrize("seed", [0, 3])
def test_mask_after_softmax_is_the_unmasked_softmax_with_masked_entries_zeroed(seed):
    s, mask = scores_and_mask(seed)
    executed = iv.mask_after_softmax(s, mask)
    bound = iv.mask_after_softmax(iv.point(s), mask)
    assert bound.contains(executed).all()
    for i, row in enumerate(exact_rows(s.tolist())):
        for j, (enc, _) in enumerate(row):
            if mask[i, j]:
                assert near(executed[i, j], float(enc.mid))
                assert inside(enc, bound.lo[i, j], bound.hi[i, j], floor=0.0, cap=1.0)
            else:
                assert executed[i, j] == 0 and bound.lo[i, j] == bound.hi[i, j] == 0
    partial = ~mask.all(axis=1)
    assert np.all(executed.sum(axis=1)[partial] < 1)  # the rows no longer sum to 1


@pytest.mark.parametrize("fill", [-math.inf, -1e4])
def test_verdicts_tell_a_misplaced_mask_from_the_same_program(fill):
    s, _ = scores_and_mask(7, shape=(5, 5))
    causal = np.tril(np.ones((5, 5), dtype=bool))
    target = iv.Layer("masked softmax", lambda x: iv.masked_softmax(x, causal, fill))
    same = iv.classify(target, iv.masked_softmax(s, causal, fill), s)
    after = iv.classify(target, iv.mask_after_softmax(s, causal), s)
    wrong_axis = iv.classify(target, iv.masked_softmax(s, causal.T, fill), s)
    assert (same.verdict, after.verdict, wrong_axis.verdict) == ("Type-I", "Type-II", "Type-II")


def test_identical_programs_with_a_fully_masked_row_are_not_bugs():
    s, mask = scores_and_mask(9, full_row=0)
    target = iv.Layer("masked softmax", lambda x: iv.masked_softmax(x, mask))
    v = iv.classify(target, iv.masked_softmax(s, mask), s)  # NaN row in both programs
    assert v.verdict == "Type-I"


def test_a_mask_broadcasts_over_the_queries():
    s, _ = scores_and_mask(4)
    keys = np.arange(s.shape[1]) < 4  # padding: the last keys are masked for every query
    assert np.array_equal(iv.masked_softmax(s, keys, -1e4),
                          iv.masked_softmax(s, np.broadcast_to(keys, s.shape), -1e4))


@pytest.mark.parametrize(
    "kwargs, words",
    [({"mask": np.ones((2, 3), dtype=int)}, ["mask", "boolean", "int"]),
     ({"mask": np.ones((3, 2), dtype=bool)}, ["mask", "(2, 3)", "(3, 2)"]),
     ({"fill": math.nan}, ["fill=nan", "-inf"]),
     ({"fill": math.inf}, ["fill=inf", "-inf"]),
     ({"fill": "-1e4"}, ["fill='-1e4'", "finite"])],
)
def test_bad_masks_and_fills_are_named(kwargs, words):
    args = {"mask": np.ones((2, 3), dtype=bool), "fill": -1e4} | kwargs
    with pytest.raises(ValueError) as err:
        iv.masked_softmax(np.zeros((2, 3)), **args)
    assert all(w in str(err.value) for w in words), str(err.value)
