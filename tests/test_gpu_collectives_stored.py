"""data/ch10_gloo.*: the stored gloo all-reduce bits (scripts/ch10_gloo.py) are the
simulator's gloo order at every world size, and what the JSON summary says of them."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from precisionlab.gpu.collectives import data_parallel_sum

DATA = Path(__file__).resolve().parents[1] / "data"


def test_stored_gloo_bits_are_the_simulators():
    meta = json.loads((DATA / "ch10_gloo.json").read_text(encoding="utf-8"))
    with np.load(DATA / "ch10_gloo.npz") as z:
        x = z["samples"].astype(np.float64)
        for w, s in meta["worlds"].items():
            got = z[f"gloo_w{w}"]
            sim = data_parallel_sum(x, int(w), "gloo").astype(np.float32)
            assert np.array_equal(got.view(np.uint32), sim.view(np.uint32))
            assert s["ranks_agree"] and s["equal_to_simulator"] == got.size
            assert s["differ_from_w1"] == int((got != z["gloo_w1"]).sum())
