"""precisionlab.intervals on attention masks: masking.py (masked softmax, the mask-after bug) and
the softmax family on masked rows of spread logits.

Oracles: mpmath interval arithmetic at 200 bits for softmax, log-softmax and cross entropy
(`exact_rows`: exp of -10^6 is an ordinary number there; a -inf logit contributes exactly 0),
exact rationals (`fraction_round`) for the float32 rounding of an additive mask and of 1/n,
explicit loops over rows and keys, the executed float64-then-rounded results, and programs
that differ only by round-off, which must never be called bugs. Hard regions: -inf and -1e4
masks, fully masked rows, ties, a mask that hides every key but one, logits spread up to
+-10^6.
"""

from __future__ import annotations

import math
from fractions import Fraction

import mpmath
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from oracles import fraction_round, rn, sound
from test_intervals import softmax_kernel

from precisionlab import intervals as iv

FORMATS = ("float16", "bfloat16", "float32")
MASK = -1e4  # BERT's additive mask
F32_ULP_1 = 2.0**-23  # float32's ulp at 1; the softmax budget is one ulp


# --------------------------------------------------------------------------- mpmath oracles


def _ivx(v):
    f = Fraction(float(v))
    return mpmath.iv.mpf(f.numerator) / f.denominator


def exact_rows(rows):
    """Per row, rigorous enclosures (mpmath.iv, 200 bits) of softmax_i and of ln sum_j e^(x_j) - x_i.

    A -inf logit contributes 0 to the sum; its softmax is 0 and its gap +inf (returned as None).
    """
    saved, mpmath.iv.prec = mpmath.iv.prec, 200
    try:
        out = []
        for row in rows:
            es = [None if v == -math.inf else mpmath.iv.exp(_ivx(v)) for v in row]
            s = sum((e for e in es if e is not None), mpmath.iv.mpf(0))
            lse = mpmath.iv.log(s)
            out.append([(mpmath.iv.mpf(0), None) if e is None else (e / s, lse - _ivx(v))
                        for e, v in zip(es, row, strict=True)])
        return out
    finally:
        mpmath.iv.prec = saved


def inside(enc, lo, hi, floor=None, cap=None) -> bool:
    """The mpmath enclosure, clipped to [floor, cap] (limits the true value is known to keep),
    lies within [lo, hi] (None stands for +inf, which needs hi = +inf)."""
    if enc is None:
        return hi == math.inf
    a = enc.a if floor is None else max(enc.a, mpmath.mpf(floor))
    b = enc.b if cap is None else min(enc.b, mpmath.mpf(cap))
    return (lo == -math.inf or a >= mpmath.mpf(float(lo))) and (hi == math.inf or b <= mpmath.mpf(float(hi)))


# --------------------------------------------------------------------------- masked_softmax, mask_after_softmax


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


# --------------------------------------------------------------------------- masked programs


@pytest.mark.parametrize("rule", iv.RULES)
def test_identical_softmax_programs_with_a_bert_mask_are_never_bugs(rule):
    rng = np.random.default_rng(0)
    s = rn(rng.uniform(-4, 4, (8, 12)) + np.where(np.arange(12) >= 9, MASK, 0.0), "float32")
    prog = [iv.Layer("softmax", lambda z: iv.softmax(z, "float32"))]
    assert iv.classify(prog, prog, s, rule=rule).verdict == "Type-I"
    assert iv.classify(prog, prog, s, rule=rule, reference_rule=rule).verdict == "Type-I"
    labels = np.arange(8)
    ce = [iv.Layer("ce", lambda z: iv.cross_entropy(z, labels, "float32"))]
    assert iv.classify(ce, ce, s, rule=rule).verdict == "Type-I"


def test_softmax_rows_holding_inf_or_only_masks_may_be_nan():
    x = np.array([[math.inf, 0.0, 1.0], [-math.inf, -math.inf, -math.inf], [-math.inf, 0.0, 2.0]])
    b = iv.softmax(iv.point(x))
    run = iv.softmax(x)
    assert np.isnan(run[:2]).all() and run[2, 0] == 0.0
    assert b.contains(run).all()
    assert b.nan[:2].all() and b.empty[:2].all() and not b.nan[2].any()
    assert b.lo[2, 0] == b.hi[2, 0] == 0.0  # a masked entry is exactly 0


# --------------------------------------------------------------------------- hypothesis: spread logits and masks


@st.composite
def logits(draw):
    """Rows of logits spread up to +-10^6 (far past exp's range), with -inf or additive -1e4 masks."""
    fmt = draw(st.sampled_from(FORMATS))
    n = draw(st.integers(1, 9))
    spread = draw(st.sampled_from((3.0, 40.0, 800.0, 5000.0, 1e6)))
    mask = draw(st.sampled_from(("none", "-inf", "bert")))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    x = rng.uniform(-spread, spread, (6, n))
    m = rng.random((6, n)) < 0.35
    if mask == "-inf":
        x = np.where(m, -math.inf, x)
    elif mask == "bert":
        x = x + np.where(m, MASK, 0.0)
    if fmt == "float16":
        x = np.clip(x, -6e4, 6e4)
    return fmt, rn(x, fmt)


@sound(60)
@given(case=logits())
def test_softmax_log_softmax_and_cross_entropy_hold_exact_and_executed(case):
    fmt, x = case
    exact = exact_rows(x)
    labels = np.random.default_rng(1).integers(0, x.shape[1], x.shape[0])
    sm, lsm = iv.softmax(iv.point(x), fmt), iv.log_softmax(iv.point(x), fmt)
    ce = iv.cross_entropy(iv.point(x), labels, fmt)
    assert sm.contains(iv.softmax(x, fmt)).all()
    assert lsm.contains(iv.log_softmax(x, fmt)).all()
    assert ce.contains(iv.cross_entropy(x, labels, fmt)).all()
    for r, row in enumerate(exact):
        if np.all(x[r] == -math.inf):  # NaN in every program
            assert sm.nan[r].all() and ce.nan[r]
            continue
        for i, (s, gap) in enumerate(row):
            assert inside(s, sm.lo[r, i], sm.hi[r, i], 0, 1), (fmt, x[r], i)
            if gap is None:  # a masked logit: log-softmax -inf
                assert lsm.lo[r, i] == -math.inf
            else:
                assert inside(-gap, lsm.lo[r, i], lsm.hi[r, i], cap=0), (fmt, x[r], i)
        assert inside(row[labels[r]][1], ce.lo[r], ce.hi[r], floor=0)
        assert not sm.nan[r].any()
    finite = np.isfinite(x).all(axis=-1)
    finite &= np.ptp(np.where(finite[:, None], x, 0.0), axis=-1) < 30
    assert (sm.width[finite] < 2.0 ** -(3 if fmt == "float16" else 6)).all()  # and tight where it can be


softmax_pieces = softmax_kernel  # softmax from rounded pieces, as a fused kernel does


@sound(40)
@given(case=logits(), order=st.sampled_from(("sequential", "pairwise", "atomic", "warp")))
def test_a_softmax_kernel_from_pieces_holds_masks(case, order):
    fmt, x = case
    kernel = iv.Kernel(order, acc=fmt, **({"block": 2} if order == "atomic" else {}),
                       **({"threads": 32} if order == "warp" else {}))
    runs = [softmax_pieces(x, fmt, kernel, s) for s in (1, 2)]
    exact = exact_rows(x)
    for rule in iv.RULES:
        b = softmax_pieces(iv.point(x, rule), fmt, kernel, None)
        for r in runs:
            assert b.contains(r).all(), (rule, kernel)
        for r, row in enumerate(exact):
            if not np.all(x[r] == -math.inf):
                assert all(inside(s, b.lo[r, i], b.hi[r, i], 0, 1) for i, (s, _) in enumerate(row))
    program = [iv.Layer("softmax", lambda z: softmax_pieces(z, fmt, kernel, 1))]
    other = [iv.Layer("softmax", lambda z: softmax_pieces(z, fmt, kernel, 2))]
    for rule in iv.RULES:
        assert iv.classify(program, other, x, rule=rule, reference_rule=rule).verdict == "Type-I"
        assert iv.classify(program, program, x, rule=rule).verdict == "Type-I"


@sound(25)
@given(fmt=st.sampled_from(FORMATS), mask=st.sampled_from(("-inf", "bert")),
       order=st.sampled_from(("sequential", "blocked", "atomic")), seed=st.integers(0, 2**32 - 1))
def test_masked_attention_programs_that_differ_by_round_off_are_never_bugs(fmt, mask, order, seed):
    rng = np.random.default_rng(seed)
    q, k = rn(rng.uniform(-2, 2, (6, 8)), fmt), rn(rng.uniform(-2, 2, (8, 6)), fmt)
    v = rn(rng.uniform(-1, 1, (6, 4)), fmt)
    keep = np.tril(np.ones((6, 6), dtype=bool))
    kern = iv.Kernel(order, acc="float32", inputs=fmt, out=fmt, **({"block": 2} if order != "sequential" else {}))

    def program(salt):
        def scores(x):
            return iv.matmul(x, k, kern, seed=salt)

        def attend(s):
            if mask == "-inf":
                return iv.softmax(iv.where(keep, s, np.full(keep.shape, -math.inf)), fmt)
            return iv.softmax(iv.add(s, np.where(keep, 0.0, MASK), fmt), fmt)

        return [iv.Layer("scores", scores), iv.Layer("softmax", attend),
                iv.Layer("P V", lambda p: iv.matmul(p, v, kern, seed=salt + 1))]

    for rule in iv.RULES:
        assert iv.classify(program(1), program(1), q, rule=rule).verdict == "Type-I"
        assert iv.classify(program(1), program(5), q, rule=rule, reference_rule=rule).verdict == "Type-I"


# --------------------------------------------------------------------------- the corpus


@pytest.mark.parametrize("name", ["masked attention, bf16", "causal mask after softmax"])
def test_masked_attention_cases_are_labelled_right(name):
    assert name in iv.CORPUS
    r = iv.evaluate_case(iv.build_case(name))
    assert not r.passes_allclose and r.structure.verdict == r.case.truth
    if r.case.truth == "Type-I":
        assert r.oblivious.verdict == "Type-I"
        soft = r.structure.layers[1]
        assert soft.name == "masked softmax" and soft.max_width < 0.1  # masks do not blow the bound up
    else:
        assert r.structure.deciding.name == "masked softmax" and r.structure.margin < -0.01
