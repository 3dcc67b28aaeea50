"""precisionlab.gpu.batching: a split-K choice by batch size changes a row's bits and a greedy
decoder's completions; one strategy for every batch size (batch invariance) does not."""

from __future__ import annotations

from fractions import Fraction
from math import isqrt

import numpy as np
import pytest
from oracles import fraction_round

from precisionlab.gpu import run_matmul
from precisionlab.gpu.batching import (
    TinyDecoder,
    batch_kernel,
    decode,
    partial_sums,
    rms_norm,
    row_splits_for_batch,
    splits_for_batch,
)


def test_split_heuristic():
    assert [splits_for_batch(b, 64) for b in (1, 16, 32, 64, 128, 512)] == [8, 8, 4, 2, 1, 1]
    assert splits_for_batch(1, 32) == 8 and splits_for_batch(64, 32) == 4
    assert partial_sums(1, 64, 8) == 512 and partial_sums(1, 64, 1) == 64
    with pytest.raises(ValueError, match="batch"):
        splits_for_batch(0, 64)


def test_same_row_other_bits_at_batch_1_and_64():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((64, 64)).astype(np.float32).astype(np.float64)
    w = TinyDecoder.random(seed=0).w
    big = run_matmul(x, w, batch_kernel(splits_for_batch(64, 64), out="float32"))
    alone = np.concatenate([run_matmul(x[i:i + 1], w, batch_kernel(splits_for_batch(1, 64), out="float32"))
                            for i in range(64)])
    assert (big != alone).any(axis=1).mean() > 0.5
    inv = run_matmul(x, w, batch_kernel(1))
    inv_alone = np.concatenate([run_matmul(x[i:i + 1], w, batch_kernel(1)) for i in range(64)])
    assert np.array_equal(inv, inv_alone)


def test_completions_depend_on_the_batch_unless_invariant():
    model = TinyDecoder.random(seed=1)
    prompts = np.random.default_rng(1).integers(0, 32, (64, 4))
    big = decode(model, prompts)
    alone = np.concatenate([decode(model, prompts[i:i + 1]) for i in range(64)])
    changed = (big != alone).any(axis=1)
    assert changed.sum() == 7
    inv_big = decode(model, prompts, invariant=True)
    inv_alone = np.concatenate([decode(model, prompts[i:i + 1], invariant=True)
                                for i in range(8)])
    assert np.array_equal(inv_big[:8], inv_alone)


def test_rows_never_mix():
    """At a fixed split the batch is its rows served alone: the strategy is the only cause."""
    model = TinyDecoder.random(seed=2)
    prompts = np.random.default_rng(2).integers(0, 32, (6, 4))
    big = decode(model, prompts, 12, splits=4)
    alone = np.concatenate([decode(model, prompts[i:i + 1], 12, splits=4) for i in range(6)])
    assert np.array_equal(big, alone)


def test_bad_prompts():
    with pytest.raises(ValueError, match="prompts"):
        decode(TinyDecoder.random(), np.zeros(3, dtype=int))


def test_trainer_micro_batches_give_beta_at_the_same_precision():
    from precisionlab.gpu.batching import score
    model = TinyDecoder.random(seed=1)
    prompts = np.random.default_rng(1).integers(0, 32, (64, 4))
    comp = decode(model, prompts)
    sampler = score(model, prompts, comp)  # the sampler's own batch of 64
    assert np.all(sampler <= 0) and np.all(sampler > np.log(1 / 32))  # greedy: above uniform
    trainer = score(model, prompts, comp, micro_batch=16)
    beta = trainer - sampler
    assert f"{(beta != 0).mean():.1%}" == "53.9%"
    inv = decode(model, prompts, invariant=True)
    b0 = (score(model, prompts, inv, micro_batch=16, invariant=True)
          - score(model, prompts, inv, invariant=True))
    assert not b0.any()
    with pytest.raises(ValueError, match="shapes"):
        score(model, prompts, comp[:3])



def test_bad_tokens_and_splits_are_named():
    model = TinyDecoder.random()
    for bad in ([[-1, 2]], [[32, 2]], [[1.5, 2]]):
        with pytest.raises(ValueError, match="token ids"):
            decode(model, bad, 2)
    with pytest.raises(ValueError, match="splits"):
        decode(model, [[1, 2]], 2, splits=0)
    from precisionlab.gpu.batching import score
    with pytest.raises(ValueError, match="completions"):
        score(model, [[1, 2]], [[40, 1]])


def _fraction_rms_norm(row, splits, eps=1e-6):
    """The RMSNorm of one row by exact rational arithmetic, every operation rounded to float32."""
    def fr(q):
        return Fraction(fraction_round(q, "float32", "nearest_even"))

    sq = [fr(Fraction(float(v)) ** 2) for v in row]
    size = -(-len(sq) // splits)
    parts = []
    for c in range(0, len(sq), size):
        acc = sq[c]
        for v in sq[c + 1:c + size]:
            acc = fr(acc + v)
        parts.append(acc)
    total = parts[0]
    for p in parts[1:]:
        total = fr(total + p)
    ms = fr(fr(total / len(sq)) + fr(Fraction(eps)))
    k = 200  # sqrt to 200 bits below the point: no float32 midpoint is that close
    root = fr(Fraction(isqrt(ms.numerator * 4**k // ms.denominator), 2**k))
    inv = fr(1 / root)
    return [float(fr(Fraction(float(v)) * inv)) for v in row]


@pytest.mark.parametrize("splits", [1, 2, 3, 8])
def test_rms_norm_matches_the_fraction_oracle(splits):
    rng = np.random.default_rng(splits)
    x = (rng.standard_normal((3, 37)) * np.exp2(rng.integers(-12, 12, (3, 37))))
    x = x.astype(np.float32).astype(np.float64)
    got = rms_norm(x, splits=splits)
    for row, out in zip(x, got, strict=True):
        assert out.tolist() == _fraction_rms_norm(row, splits)


def test_rms_norm_row_bits_depend_on_the_batch_unless_invariant():
    assert [row_splits_for_batch(b) for b in (1, 8, 16, 32, 64, 128)] == [8, 8, 4, 2, 1, 1]
    x = np.random.default_rng(0).standard_normal((64, 256)).astype(np.float32).astype(float)
    together = rms_norm(x)
    alone = np.concatenate([rms_norm(r[None]) for r in x])
    assert np.array_equal(alone, rms_norm(x, splits=8))  # batch 1 splits every row in 8
    assert (together != alone).any(axis=1).mean() > 0.5
    inv = np.concatenate([rms_norm(r[None], invariant=True) for r in x])
    assert np.array_equal(inv, rms_norm(x, invariant=True)) and np.array_equal(inv, together)
    with pytest.raises(ValueError, match="batch, n"):
        rms_norm(np.ones(4))
    with pytest.raises(ValueError, match="splits"):
        rms_norm(x, splits=0)
