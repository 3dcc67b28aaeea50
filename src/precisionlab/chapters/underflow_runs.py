"""Chapter 4's training probes: a few SGD steps of the attenuating network, stored and replayed.

The chapter trains its 96-layer network for 8 steps three ways (float32, float16, float16 with
float32 master weights) to show which layers stop learning. Those 24 emulated passes take
about 2 s of a cold start (Python's share of 25,000 emulated operations), so they are
computed once by `scripts/ch4_train_probes.py` and stored whole in
data/ch4_train_probes.json and .npz: the losses and every step's per-layer gradient
statistics. `train_probe` takes `underflow.train_probe`'s arguments and returns the stored
run where the file holds one with exactly those arguments, else runs it now; the chapter's
hidden cell re-runs the first steps of each and compares every bit, and
tests/test_chapters_underflow_runs.py re-runs all of them. The arithmetic is
precisionlab.emulate's, so the stored bits are every machine's.
"""

from __future__ import annotations

import inspect
import json
from functools import lru_cache
from pathlib import Path

import numpy as np

from ..formats import get_format
from ..underflow import LayerGradients, TrainingProbe
from ..underflow import train_probe as run_train_probe

__all__ = ["CHAPTER_RUNS", "STORED_TRAIN_PROBES", "load_train_probes", "run_key", "same_probe",
           "save_train_probes", "stored_train_probes", "train_probe"]

STORED_TRAIN_PROBES = "ch4_train_probes.json"  # in data/, written by scripts/ch4_train_probes.py
_DEFAULTS = {"attenuation": 0.82, "depth": 96, "fmt": "float16", "steps": 10, "lr": 0.1,
             "width": 64, "batch": 16, "seed": 0, "backend": "emulated", "master": False}
# The chapter's three runs (underflow.train_probe's keyword arguments).
CHAPTER_RUNS: tuple[dict, ...] = tuple(
    {**_DEFAULTS, "fmt": fmt, "steps": 8, "master": master}
    for fmt, master in (("float32", False), ("float16", False), ("float16", True)))


def run_key(kwargs: dict) -> tuple:
    """A run's arguments as a hashable, normalised key (format by registry name, numbers as floats)."""
    k = {**_DEFAULTS, **kwargs}
    if set(k) != set(_DEFAULTS):
        raise ValueError(f"unknown train_probe arguments {sorted(set(k) - set(_DEFAULTS))}; valid "
                         f"choices: {', '.join(_DEFAULTS)}")
    return (float(k["attenuation"]), int(k["depth"]), get_format(k["fmt"]).name, int(k["steps"]),
            float(k["lr"]), int(k["width"]), int(k["batch"]), int(k["seed"]), str(k["backend"]),
            bool(k["master"]))


def save_train_probes(path, runs: list[tuple[dict, TrainingProbe]], meta: dict) -> None:
    """Write (arguments, TrainingProbe) pairs to path (.json: meta and arguments) and its .npz."""
    path = Path(path)
    entries, arrays = [], {}
    for i, (kwargs, probe) in enumerate(runs):
        entries.append({"args": dict(zip(_DEFAULTS, run_key(kwargs), strict=True)), "fmt": probe.fmt,
                        "steps": len(probe.steps)})
        arrays[f"r{i}.loss"] = probe.loss
        for s, rec in enumerate(probe.steps):
            arrays.update({f"r{i}.s{s}.{k}": v for k, v in rec.arrays().items()})
    np.savez_compressed(path.with_suffix(".npz"), **arrays)
    path.write_text(json.dumps({**meta, "runs": entries,
                                "arrays": path.with_suffix(".npz").name}, indent=1) + "\n")


def load_train_probes(path) -> dict[tuple, TrainingProbe]:
    """{argument key: TrainingProbe} from a file save_train_probes wrote."""
    path = Path(path)
    meta = json.loads(path.read_text())
    with np.load(path.parent / meta["arrays"]) as z:
        arrays = {k: z[k] for k in z.files}
    out = {}
    for i, e in enumerate(meta["runs"]):
        steps = tuple(
            LayerGradients.from_arrays(e["fmt"], {k.split(".", 2)[2]: v for k, v in arrays.items()
                                                  if k.startswith(f"r{i}.s{s}.")})
            for s in range(e["steps"]))
        out[run_key(e["args"])] = TrainingProbe(e["fmt"], float(e["args"]["attenuation"]),
                                             arrays[f"r{i}.loss"], steps)
    return out


@lru_cache(maxsize=1)
def stored_train_probes() -> dict[tuple, TrainingProbe]:
    """The stored runs (data/ch4_train_probes.json, found by rl.find_stored), or {} where there are none."""
    from ..rl import find_stored  # rl (and numba) only once the file is looked for

    try:
        path = find_stored(STORED_TRAIN_PROBES)
    except OSError:  # no repository and no download: every run is computed
        return {}
    return load_train_probes(path)


def train_probe(*args, **kwargs) -> TrainingProbe:
    """underflow.train_probe(*args, **kwargs): the stored run where data/ holds these arguments, else run now."""
    bound = inspect.signature(run_train_probe).bind(*args, **kwargs).arguments  # TypeError if bad
    stored = stored_train_probes().get(run_key(bound))
    return stored if stored is not None else run_train_probe(*args, **kwargs)


def same_probe(a: TrainingProbe, b: TrainingProbe, steps: int | None = None) -> bool:
    """The same format and attenuation, and the first `steps` (default all) losses and steps bit for bit."""
    n = len(a.steps) if steps is None else steps
    return (a.fmt, a.attenuation) == (b.fmt, b.attenuation) and len(a.steps) >= n \
        and len(b.steps) >= n and a.loss[:n].tobytes() == b.loss[:n].tobytes() \
        and all(x.same_bits(y) for x, y in zip(a.steps[:n], b.steps[:n], strict=True))
