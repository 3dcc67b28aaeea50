"""Tests for the stored input of chapter 4's explorer (precisionlab.widgets.underflow).

data/ch4_network_probes.json and .npz (scripts/ch4_network_probes.py) hold one backward pass
of AttenuatingNet per grid point, which the explorer replays. Oracles: the pass computed now
(`compute_network_probe`, the package's emulated arithmetic), bit for bit, in this process
and in fresh interpreters under every CPU dispatch level; the script's own list of grid
points; and a save/load round trip.
"""

from __future__ import annotations

import hashlib
import importlib.util
import textwrap
from pathlib import Path

import numpy as np
import pytest

from precisionlab.widgets import underflow as explorer

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "data" / explorer.STORED_PROBES


def _script():
    spec = importlib.util.spec_from_file_location("ch4_network_probes",
                                                  ROOT / "scripts" / "ch4_network_probes.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _digest(probe) -> str:
    return hashlib.sha256(b"".join(v.tobytes() for v in probe.arrays().values())).hexdigest()


def test_the_file_holds_every_pass_the_explorer_draws():
    meta, probes = explorer.load_network_probes(DATA)
    assert meta["command"].startswith("python3 scripts/ch4_network_probes.py")
    assert meta["precisionlab_version"] and meta["torch_version"]
    assert list(probes) == _script().keys()
    assert len(probes) == len(explorer.UNDERFLOW_GRID["attenuation"]) * 3 == 36
    assert all(p.depth == 96 and p.loss_scale == 1 and not p.flush_to_zero
               for p in probes.values())


@pytest.mark.parametrize("a", explorer.UNDERFLOW_GRID["attenuation"])
def test_stored_passes_are_the_ones_computed_now(a):
    # A stale file (another network, batch or arithmetic), or one stale pass in it, fails
    # here: every one of the 36 is recomputed (about 0.1 s each). Chapter 4 checks only the
    # three at a = 0.82, and nothing else compares the others.
    _, probes = explorer.load_network_probes(DATA)
    for fmt in explorer.UNDERFLOW_GRID["fmt"]:
        key = (96, a, fmt, 0)
        assert probes[key].same_bits(explorer.compute_network_probe(*key)), key


def test_stored_float16_pass_has_the_same_bits_under_every_dispatch_level(same_bits):
    program = textwrap.dedent("""
        import hashlib
        from precisionlab.widgets import underflow as explorer
        probe = explorer.compute_network_probe(96, 0.82, "float16", 0)
        print(hashlib.sha256(b"".join(v.tobytes() for v in probe.arrays().values())).hexdigest())
    """)
    _, probes = explorer.load_network_probes(DATA)
    assert same_bits(program) == _digest(probes[96, 0.82, "float16", 0])


def test_network_probe_replays_the_file_and_computes_the_rest():
    stored = explorer.stored_network_probes()
    assert explorer.network_probe(96, 0.82, "float16", 0) is stored[96, 0.82, "float16", 0]
    assert explorer.network_probe(96, 0.82, "fp16", 0) is stored[96, 0.82, "float16", 0]
    other = explorer.network_probe(12, 0.82, "float16", 0)  # not on the grid: computed, once
    assert other.depth == 12 and other.same_bits(explorer.compute_network_probe(12, 0.82,
                                                                                "float16", 0))
    assert explorer.network_probe(12, 0.82, "float16", 0) is other


def test_without_the_file_every_pass_is_computed(monkeypatch):
    def missing(name, start=None):
        raise FileNotFoundError(name)

    monkeypatch.setattr(explorer, "find_stored", missing)
    explorer.stored_network_probes.cache_clear()
    try:
        assert explorer.stored_network_probes() == {}
        panel, _ = explorer.underflow_view(0.5, 24, "bfloat16", network=True)
        assert "g0 fitted to the float32 network" in panel.text
    finally:
        monkeypatch.undo()
        explorer.stored_network_probes.cache_clear()
    assert len(explorer.stored_network_probes()) == 36


def test_save_and_load_round_trip(tmp_path):
    probes = {(8, 0.7, "float16", 1): explorer.compute_network_probe(8, 0.7, "float16", 1),
              (8, 0.7, "float32", 1): explorer.compute_network_probe(8, 0.7, "float32", 1)}
    path = tmp_path / "probes.json"
    explorer.save_network_probes(path, probes, {"description": "test"})
    meta, back = explorer.load_network_probes(path)
    assert meta["description"] == "test" and list(back) == list(probes)
    assert all(back[k].same_bits(p) for k, p in probes.items())
    assert back[8, 0.7, "float16", 1].weight.finite.dtype == np.bool_


def test_save_refuses_passes_the_explorer_does_not_draw(tmp_path):
    from precisionlab.underflow import probe_network

    scaled = probe_network(0.7, "float16", 8, 64, 16, seed=1, loss_scale=4.0)
    with pytest.raises(ValueError, match="not a plain pass"):
        explorer.save_network_probes(tmp_path / "p.json", {(8, 0.7, "float16", 1): scaled}, {})
    meta = tmp_path / "wide.json"
    explorer.save_network_probes(meta, {}, {})
    meta.write_text(meta.read_text().replace('"width": 64', '"width": 32'))
    with pytest.raises(ValueError, match="width 32"):
        explorer.load_network_probes(meta)
