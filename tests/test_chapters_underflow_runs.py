"""Chapter 4's stored training probes (data/ch4_train_probes.*) against the runs computed now."""

from __future__ import annotations

import pytest

from precisionlab import underflow
from precisionlab.chapters import underflow_runs as U


@pytest.mark.parametrize("kwargs", U.CHAPTER_RUNS, ids=lambda k: f"{k['fmt']}-master{k['master']}")
def test_stored_runs_are_the_ones_computed_now(kwargs):
    """All eight steps of each stored run, every loss and gradient statistic, bit for bit."""
    stored = U.stored_train_probes()
    assert len(stored) == len(U.CHAPTER_RUNS)
    got = U.train_probe(**kwargs)
    now = underflow.train_probe(**kwargs)
    assert got is stored[U.run_key(kwargs)] and U.same_probe(got, now)
    assert got.loss.dtype == now.loss.dtype and len(got.steps) == 8


def test_positional_arguments_find_the_same_stored_run():
    a = U.train_probe(0.82, 96, "float16", steps=8, lr=0.1, seed=0)
    b = U.train_probe(attenuation=0.82, depth=96, fmt="fp16", steps=8, lr=0.1, seed=0)
    assert a is b


def test_arguments_not_stored_are_run_now():
    got = U.train_probe(0.82, 24, "bfloat16", steps=2, lr=0.05, seed=3)
    assert U.same_probe(got, underflow.train_probe(0.82, 24, "bfloat16", steps=2, lr=0.05, seed=3))
    with pytest.raises(TypeError):
        U.train_probe(0.82, 24, "bfloat16", speed=2)


def test_save_and_load_round_trip(tmp_path):
    runs = [(dict(depth=12, fmt="float16", steps=2, seed=1), underflow.train_probe(depth=12, steps=2, seed=1)),
            (dict(depth=12, fmt="bfloat16", steps=1, master=True),
             underflow.train_probe(depth=12, fmt="bfloat16", steps=1, master=True))]
    path = tmp_path / "probes.json"
    U.save_train_probes(path, runs, {"description": "test"})
    back = U.load_train_probes(path)
    assert len(back) == 2
    for kwargs, probe in runs:
        assert U.same_probe(back[U.run_key(kwargs)], probe)


def test_same_probe_tells_a_changed_step():
    a = underflow.train_probe(depth=12, steps=2, seed=1)
    b = underflow.train_probe(depth=12, steps=2, seed=2)
    assert U.same_probe(a, a) and not U.same_probe(a, b) and not U.same_probe(a, b, steps=1)
