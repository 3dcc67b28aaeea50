"""Chapter 4's stored training probes (data/ch4_train_probes.*) against the runs computed now."""

from __future__ import annotations

import pytest

from precisionlab import underflow
from precisionlab.chapters import underflow_runs as U


@pytest.mark.parametrize("kwargs", U.CHAPTER_RUNS, ids=lambda k: f"{k['fmt']}-master{k.get('master', False)}")
def test_stored_runs_are_the_ones_computed_now(kwargs):
    """All eight steps of each stored run, every loss and gradient statistic, bit for bit, in
    the chapter's own call form (so a changed default of train_probe misses the stored key)."""
    stored = U.stored_train_probes()
    assert len(stored) == len(U.CHAPTER_RUNS) and U.run_key(**kwargs) in stored
    got = U.train_probe(**kwargs)
    now = underflow.train_probe(**kwargs)
    assert U.same_probe(got, now) and U.same_probe(got, stored[U.run_key(**kwargs)])
    assert got is not stored[U.run_key(**kwargs)]  # a copy: editing it changes nothing stored
    assert got.loss.dtype == now.loss.dtype and len(got.steps) == 8


def test_positional_arguments_and_aliases_find_the_same_stored_run():
    a = U.train_probe(0.82, 96, "float16", steps=8, lr=0.1, seed=0)
    b = U.train_probe(attenuation=0.82, depth=96, fmt="fp16", steps=8, lr=0.1, seed=0, width=64)
    assert U.run_key(0.82, 96, "float16", steps=8, lr=0.1, seed=0) in U.stored_train_probes()
    assert U.same_probe(a, b)
    a.loss[0] = 99.0  # a reader's edit stays in the reader's copy
    assert U.train_probe(0.82, 96, "float16", steps=8, lr=0.1, seed=0).loss[0] != 99.0


def test_arguments_not_stored_are_run_now():
    got = U.train_probe(0.82, 24, "bfloat16", steps=2, lr=0.05, seed=3)
    assert U.same_probe(got, underflow.train_probe(0.82, 24, "bfloat16", steps=2, lr=0.05, seed=3))
    with pytest.raises(TypeError):
        U.train_probe(0.82, 24, "bfloat16", speed=2)


@pytest.mark.parametrize("bad", [{"master": "yes"}, {"master": "False"}, {"master": 1},
                                 {"depth": 96.5}, {"depth": "96"}, {"steps": 8.5},
                                 {"steps": "8"}, {"lr": "0.1"}, {"width": 64.9},
                                 {"backend": "gpu"}, {"fmt": "float8_e4m3fn"}])
def test_bad_arguments_raise_as_train_probe_does_instead_of_finding_a_run(bad):
    kwargs = {**U.CHAPTER_RUNS[1], **bad}
    with pytest.raises(ValueError) as stored_path:
        U.train_probe(**kwargs)
    with pytest.raises(ValueError) as direct:
        underflow.train_probe(**kwargs)
    assert str(stored_path.value) == str(direct.value)


def test_save_and_load_round_trip(tmp_path):
    runs = [(dict(depth=12, fmt="float16", steps=2, seed=1), underflow.train_probe(depth=12, steps=2, seed=1)),
            (dict(depth=12, fmt="bfloat16", steps=1, master=True),
             underflow.train_probe(depth=12, fmt="bfloat16", steps=1, master=True))]
    path = tmp_path / "probes.json"
    U.save_train_probes(path, runs, {"description": "test"})
    back = U.load_train_probes(path)
    assert len(back) == 2
    for kwargs, probe in runs:
        assert U.same_probe(back[U.run_key(**kwargs)], probe)


def test_same_probe_tells_a_changed_step_and_a_different_length():
    a = underflow.train_probe(depth=12, steps=2, seed=1)
    b = underflow.train_probe(depth=12, steps=2, seed=2)
    c = underflow.train_probe(depth=12, steps=3, seed=1)
    assert U.same_probe(a, a) and not U.same_probe(a, b) and not U.same_probe(a, b, steps=1)
    assert not U.same_probe(a, c) and not U.same_probe(c, a)  # all steps: the same count
    assert U.same_probe(a, c, steps=2) and U.same_probe(c, a, steps=2)
    assert not U.same_probe(a, c, steps=3)
    with pytest.raises(ValueError, match="steps must be None or a positive integer"):
        U.same_probe(a, b, steps=0)
