"""Tests for precisionlab.rl's stored runs: save and load, finding the files, provenance,
and the stored experiments that the chapters replay (re-run with today's package, bit for bit).

Oracles: the scripts that made each file (their configurations, re-run for the first steps
and compared with the stored per-step logs, gradient reports and mu_W exactly) and
round-trips through the file format.
"""

from __future__ import annotations

import importlib.util
from dataclasses import asdict
from pathlib import Path

import numpy as np
import pytest
import torch

from precisionlab import rl
from precisionlab.chapters import rl_findings as findings

# one thread keeps any native-kernel comparison in one order (the emulated runs do not care)
pytestmark = pytest.mark.usefixtures("one_torch_thread")


def test_runs_survive_save_and_load(tmp_path):
    cfg = rl.PolicyConfig(n_prompts=2, max_len=5, vocab=16, width=8, hidden=8, depth=1)
    runs = {"a": rl.RunConfig(steps=2), "b": rl.RunConfig(steps=2, trainer="bf16", lr=1e-3)}
    logs = rl.train_seeds(cfg, runs, [0, 1], progress=False, gradients=(1,))
    rl.save_runs(tmp_path / "runs.json", logs, {"command": "test"})
    meta, back = rl.load_runs(tmp_path / "runs.json")
    assert meta["command"] == "test" and meta["seeds"] == [0, 1]
    for seed in (0, 1):
        for name, run in runs.items():
            assert back[seed][name].config == run
            for k, v in logs[seed][name].arrays().items():
                np.testing.assert_array_equal(back[seed][name].arrays()[k], v)  # bit for bit
            # gradient reports (seed 0 only): the same floats, steps as ints
            np.testing.assert_equal(back[seed][name].gradients, logs[seed][name].gradients)
    assert set(back[0]["a"].gradients) == {1} and back[1]["a"].gradients == {}


def test_find_stored_looks_upwards(tmp_path):
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "x.json").write_text("{}")
    deep = tmp_path / "a" / "b"
    deep.mkdir(parents=True)
    assert rl.find_stored("x.json", deep) == tmp_path / "data" / "x.json"
    # An editable install (this checkout) records a file:// origin: nothing to download.
    with pytest.raises(FileNotFoundError, match=r"scripts/rl_source_regime\.py"):
        rl.find_stored("missing.json", deep)


def test_find_stored_uses_the_clone_pip_installed_from(tmp_path, monkeypatch):
    from importlib import metadata

    clone = tmp_path / "my clone"
    (clone / "data").mkdir(parents=True)
    (clone / "data" / "x.json").write_text("{}")

    class Installed:
        def read_text(self, name):
            assert name == "direct_url.json"
            return ('{"url": "file://localhost' + str(clone).replace(" ", "%20")
                    + '", "vcs_info": {"vcs": "git", "commit_id": "abc"}}')

    monkeypatch.setattr(metadata, "distribution", lambda name: Installed())
    elsewhere = tmp_path / "run"
    elsewhere.mkdir()
    assert rl.find_stored("x.json", elsewhere) == clone / "data" / "x.json"


# --------------------------------------------------------------------------- stored runs


_DATA = Path(__file__).resolve().parents[1] / "data" / "rl_source_regime.json"


def _script(name="rl_source_regime"):
    """scripts/<name>.py, imported as a module (its configurations are the oracle)."""
    path = _DATA.parents[1] / "scripts" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_stored_source_regime_matches_its_script_and_replays_exactly():
    # The chapter loads these results instead of training for minutes; they must be what the
    # script's configuration gives with today's package, bit for bit: re-run the first steps.
    meta, logs = rl.load_runs(_DATA)
    script = _script()
    assert meta["command"].startswith("python3 scripts/rl_source_regime.py")
    assert meta["precisionlab_version"] and meta["torch_version"] and len(meta["seeds"]) >= 3
    cfg = rl.PolicyConfig(**meta["policy"])
    assert cfg == script.POLICY
    assert {k: v.config for k, v in logs[meta["seeds"][0]].items()} == script.runs()
    seed = meta["seeds"][0]
    steps = 3
    for name in ("matched", "mismatched"):
        stored = logs[seed][name].arrays()
        log = rl.train(cfg, rl.with_changes(logs[seed][name].config, steps=steps), seed=seed,
                       progress=False)
        for k, v in log.arrays().items():
            np.testing.assert_array_equal(v, stored[k][:steps], err_msg=f"{name}: {k}")


def test_provenance_names_the_command_and_the_versions():
    import platform

    import numba

    from precisionlab import __version__

    got = rl.provenance(["scripts/make_it.py", "--steps", "3"])
    assert got == {"command": "python3 scripts/make_it.py --steps 3",
                   "precisionlab_version": __version__, "torch_version": torch.__version__,
                   "numpy_version": np.__version__, "numba_version": numba.__version__,
                   "python_version": platform.python_version()}
    assert rl.provenance()["command"].startswith("python3 ")  # sys.argv by default


_CH6 = _DATA.parent / "ch6_seeds.json"


def test_stored_chapter_seeds_match_their_script_and_replay_exactly():
    # Chapter 6 loads its seeds 1 and 2 instead of training them: they must be what the
    # script's configuration gives with today's package, bit for bit, gradient reports and
    # per-step mu_W included.
    script = _script("ch6_seeds")
    meta, logs = rl.load_runs(_CH6)
    assert meta["command"].startswith("python3 scripts/ch6_seeds.py")
    assert meta["precisionlab_version"] and meta["torch_version"]
    assert meta["seeds"] == list(script.SEEDS) and rl.PolicyConfig(**meta["policy"]) == script.POLICY
    seed = meta["seeds"][0]
    assert {k: v.config for k, v in logs[seed].items()} == script.runs()
    steps = 4
    assert set(script.RECORDED) <= set(script.REPORTED) <= set(script.runs())
    replay = script.train_seed(seed, {k: script.runs()[k] for k in script.REPORTED}, steps)
    for name in script.REPORTED:
        stored = logs[seed][name]
        assert set(stored.gradients) == set(script.GRADIENT_STEPS)
        for k, v in replay[name].arrays().items():
            np.testing.assert_array_equal(v, stored.arrays()[k][:steps], err_msg=f"{name}: {k}")
        np.testing.assert_equal(replay[name].gradients[3], stored.gradients[3])  # nan == nan
    for name in script.RECORDED:
        assert findings.weight_means(replay[name]) == meta["weight_means"][f"{seed}.{name}"][:steps]
    unreported = [k for k in script.runs() if k not in script.REPORTED]
    assert all(not logs[seed][k].gradients for k in unreported)


def test_stored_runs_chapter_6_only_loads_replay_to_the_last_step():
    # Chapter 6 loads seed 0's eps = 0.05 pair and its two fixes instead of training them,
    # and its hidden cells can afford to re-run only their first steps: here every step.
    script = _script("ch6_seeds")
    meta, logs = rl.load_runs(_CH6)
    seed = meta["seeds"][0]
    names = ["matched, eps 0.05", "mismatched, eps 0.05", "ratio from shadow, eps 0.05",
             "detached weights, eps 0.05"]
    replay = script.train_seed(seed, {k: script.runs()[k] for k in names})
    for name in names:
        stored = logs[seed][name]
        assert len(stored.reward) == script.STEPS
        for k, v in replay[name].arrays().items():
            np.testing.assert_array_equal(v, stored.arrays()[k], err_msg=f"{name}: {k}")
        np.testing.assert_equal(replay[name].gradients, stored.gradients)  # nan == nan


def test_stored_chapter_seeds_every_other_run_replays_its_first_steps():
    # The chapter's hidden cells re-run one or two runs of each of its stored groups (the
    # convergence table's rows, the interventions); here the first steps of every seed-0 run
    # the two tests above do not re-run, so that a stale file fails the tests.
    script = _script("ch6_seeds")
    meta, logs = rl.load_runs(_CH6)
    seed, steps = meta["seeds"][0], 2
    covered = {*script.REPORTED, "ratio from shadow, eps 0.05", "detached weights, eps 0.05"}
    names = [k for k in script.runs() if k not in covered]
    assert len(names) == 10  # the table's five other rows and the five interventions
    replay = script.train_seed(seed, {k: script.runs()[k] for k in names}, steps)
    for name in names:
        for k, v in replay[name].arrays().items():
            np.testing.assert_array_equal(v, logs[seed][name].arrays()[k][:steps],
                                          err_msg=f"{name}: {k}")


def test_stored_chapter_seeds_on_the_other_seeds_replay_their_first_steps():
    # Seeds 1 and 2 hold every run too (the chapter repeats its contrasts and convergence rows
    # on them, and its hidden cells re-run only seed 1's mismatched run): the first steps of
    # each, mu_W of the recorded runs included, so that one stale run on them fails here.
    script = _script("ch6_seeds")
    meta, logs = rl.load_runs(_CH6)
    steps = 2
    for seed in meta["seeds"][1:]:
        assert {k: v.config for k, v in logs[seed].items()} == script.runs()
        replay = script.train_seed(seed, script.runs(), steps)
        for name, log in replay.items():
            for k, v in log.arrays().items():
                np.testing.assert_array_equal(v, logs[seed][name].arrays()[k][:steps],
                                              err_msg=f"{seed} {name}: {k}")
        for name in script.RECORDED:
            assert findings.weight_means(replay[name]) == \
                meta["weight_means"][f"{seed}.{name}"][:steps]
        assert {k for k, v in logs[seed].items() if v.gradients} == set(script.REPORTED)


def test_runs_with_state_survive_save_and_load(tmp_path):
    # with_state: snapshots and the trained weights come back exactly, as a Policy
    cfg = rl.PolicyConfig(n_prompts=2, max_len=5, vocab=16, width=8, hidden=8, depth=1)
    runs = {"a (x, y)": rl.RunConfig(steps=3), "eps 0.05": rl.RunConfig(steps=3, trainer="bf16")}
    logs = rl.train_seeds(cfg, runs, [0, 10], progress=False, record=range(3), gradients=(1,))
    rl.save_runs(tmp_path / "runs.json", logs, {"policy": asdict(cfg)}, with_state=True)
    _, back = rl.load_runs(tmp_path / "runs.json")
    for seed in (0, 10):
        for name in runs:
            got, want = back[seed][name], logs[seed][name]
            assert list(got.snapshots) == [0, 1, 2]
            for step, snap in want.snapshots.items():
                assert set(got.snapshots[step]) == set(snap)
                for k, v in snap.items():
                    assert got.snapshots[step][k].dtype == v.dtype
                    np.testing.assert_array_equal(got.snapshots[step][k], v)
            assert isinstance(got.policy, rl.Policy) and got.policy.cfg == cfg
            w, g = want.policy.state_dict(), got.policy.state_dict()
            assert list(w) == list(g) and all(torch.equal(w[k], g[k]) for k in w)
    # without state nothing extra is stored or restored
    rl.save_runs(tmp_path / "plain.json", logs, {"policy": asdict(cfg)})
    _, plain = rl.load_runs(tmp_path / "plain.json")
    assert plain[0]["a (x, y)"].snapshots == {} and plain[0]["a (x, y)"].policy is None


def test_save_runs_with_state_rejects_what_it_cannot_store(tmp_path):
    cfg = rl.PolicyConfig(n_prompts=2, max_len=5, vocab=16, width=8, hidden=8, depth=1)
    logs = rl.train_seeds(cfg, {"a": rl.RunConfig(steps=1)}, [0], progress=False)
    with pytest.raises(ValueError, match=r"meta\['policy'\]"):
        rl.save_runs(tmp_path / "r.json", logs, {}, with_state=True)
    logs[0]["a"].policy = None
    with pytest.raises(ValueError, match="policy=None"):
        rl.save_runs(tmp_path / "r.json", logs, {"policy": {}}, with_state=True)


def test_stored_key_runs_of_chapter_6_replay_exactly_with_their_final_weights():
    # Chapter 6 loads its two key runs instead of training them: per-step logs, snapshots,
    # gradient reports and trained weights must be what the script's runs give today. A
    # short prefix first (what the chapter's hidden cell re-runs), then every step.
    script = _script("ch6_key_runs")
    meta, logs = rl.load_runs(_DATA.parent / "ch6_key_runs.json")
    assert meta["command"].startswith("python3 scripts/ch6_key_runs.py")
    assert meta["seeds"] == [script.SEED] and rl.PolicyConfig(**meta["policy"]) == script.POLICY
    stored = logs[script.SEED]
    assert {k: v.config for k, v in stored.items()} == script.runs()
    for steps in (4, None):
        replay = script.train(steps)
        for name, log in replay.items():
            n = len(log.reward)
            for k, v in log.arrays().items():
                np.testing.assert_array_equal(v, stored[name].arrays()[k][:n], err_msg=f"{name}: {k}")
            assert sorted(log.snapshots) == list(range(n))
            for step, snap in log.snapshots.items():
                for k, v in snap.items():
                    np.testing.assert_array_equal(v, stored[name].snapshots[step][k])
            for step, rep in log.gradients.items():
                np.testing.assert_equal(rep, stored[name].gradients[step])  # nan == nan
    for name, log in replay.items():  # every step: the final weights too
        assert set(log.gradients) == set(script.GRADIENT_STEPS)
        w, g = log.policy.state_dict(), stored[name].policy.state_dict()
        assert list(w) == list(g) and all(torch.equal(w[k], g[k]) for k in w)
