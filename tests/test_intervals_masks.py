"""precisionlab.intervals on large logit gaps and attention masks, and verdicts on non-finite outputs.

Oracles: mpmath interval arithmetic at 200 bits for softmax, log-softmax and cross entropy
(exp of -10^6 is an ordinary number there; a -inf logit contributes exactly 0), the executed
float64-then-rounded results, and programs that differ only by round-off, which must never be
called bugs. The issue's examples come first, as regression tests.
"""

from __future__ import annotations

import math
from fractions import Fraction

import mpmath
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_intervals import softmax_kernel

from precisionlab import intervals as iv
from precisionlab.rounding import round_to

FORMATS = ("float16", "bfloat16", "float32")
MASK = -1e4  # BERT's additive mask


def sound(n: int):
    """Derandomised (the same examples on every run) and without deadline."""
    return settings(max_examples=n, deadline=None, derandomize=True, database=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def rn(x, fmt):
    return np.asarray(round_to(np.ascontiguousarray(x, dtype=np.float64), fmt), dtype=np.float64)


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


# --------------------------------------------------------------------------- the examples


def test_a_large_logit_gap_gives_a_valid_tight_softmax_bound():
    x = np.array([[0.0, 0.0, -1000.0]])
    b = iv.softmax(iv.point(x), "float32")
    run = iv.softmax(x, "float32")
    assert not np.isnan(b.lo).any() and not np.isnan(b.hi).any() and not b.nan.any()
    assert b.contains(run).all() and run[0, 2] == 0.0
    assert b.lo[0, 2] == 0.0 and 0 < b.hi[0, 2] <= 2.0**-148  # e^-1000 rounds to 0 in float32
    assert b.lo[0, 0] <= 0.5 <= b.hi[0, 0] and b.width[0, 0] < 2.0**-20
    lsm = iv.log_softmax(iv.point(x), "float32")
    assert lsm.contains(iv.log_softmax(x, "float32")).all() and lsm.lo[0, 2] < -1000 - math.log(2) < lsm.hi[0, 2]
    assert lsm.width[0, 2] < 1e-3  # e^1000 overflows float64, the bound does not
    ce = iv.cross_entropy(iv.point(np.array([[0.0, 1000.0]])), np.array([0]), "float32")
    assert ce.lo[0] <= 1000.0 <= ce.hi[0] and ce.width[0] < 1e-3


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


def test_identical_programs_that_overflow_to_inf_are_not_bugs():
    x = np.array([[60000.0, 60000.0, 1.0], [1.0, 2.0, 3.0]])
    prog = [iv.Layer("fp16 sum", lambda v: iv.sum_(v, iv.Kernel("sequential", acc="float16")))]
    v = iv.classify(prog, prog, x)
    assert v.verdict == "Type-I" and v.nonfinite == 0
    assert iv.allclose(iv.sum_(x, iv.Kernel("sequential", acc="float16")), np.array([math.inf, 6.0]), 0, 0)


# --------------------------------------------------------------------------- verdicts on non-finite values


def test_inf_where_the_reference_is_finite_is_reported():
    x = np.array([[60000.0, 60000.0], [1.0, 2.0]])
    target = [iv.Layer("fp16 sum", lambda v: iv.sum_(v, iv.Kernel("sequential", acc="float16")))]
    reference = [iv.Layer("fp32 sum", lambda v: iv.sum_(v, iv.Kernel("sequential", acc="float32")))]
    v = iv.classify(target, reference, x)
    c = v.layers[0]
    assert v.verdict == "Type-I"  # float16's range explains it: round-off, not a bug
    assert c.nonfinite == 1 and c.nonfinite_index == (0,) and c.nonfinite_target == math.inf
    assert c.nonfinite_reference == 120000.0 and "non-finite in one program only" in str(v)


def test_a_non_finite_reference_the_bound_excludes_is_a_bug():
    x = np.array([[1.0, 2.0], [3.0, 4.0]])
    prog = [iv.Layer("sum", lambda v: iv.sum_(v, iv.Kernel()))]
    for bad in (np.array([3.0, math.nan]), np.array([math.inf, 7.0])):
        v = iv.classify(prog, bad, x)
        assert v.verdict == "Type-II" and v.margin == -math.inf and v.nonfinite == 1


def test_nan_in_both_programs_where_the_bound_allows_nan_is_no_difference():
    x = np.array([[math.inf, -math.inf, 1.0], [1.0, 2.0, 3.0]])
    prog = [iv.Layer("sum", lambda v: iv.sum_(v, iv.Kernel("pairwise")))]
    v = iv.classify(prog, prog, x)
    assert v.verdict == "Type-I" and v.nonfinite == 0
    assert iv.classify(prog, np.array([math.nan, 6.0]), x).verdict == "Type-I"
    assert iv.classify(prog, np.array([0.0, 6.0]), x).verdict == "Type-II"  # NaN only: 0 is not possible


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
