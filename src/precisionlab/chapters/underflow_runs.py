"""Chapter 4's training probes: a few SGD steps of the attenuating network, stored and replayed.

The chapter trains its 96-layer network for 8 steps three ways (float32, float16, float16 with
float32 master weights) to show which layers stop learning. Those 24 emulated passes take
about 2 s of a cold start (Python's share of 25,000 emulated operations), so they are
computed once by `scripts/ch4_train_probes.py` and stored whole in
data/ch4_train_probes.json and .npz: the losses and every step's per-layer gradient
statistics. `train_probe` takes `underflow.train_probe`'s arguments and returns the stored
run where the file holds one with exactly those arguments (checked and put in one form by
`underflow.train_probe_arguments`), else runs it now, a fresh copy either way. The chapter's
hidden cell re-runs the first step of each (the pass on the initial weights) and compares
every bit; tests/test_chapters_underflow_runs.py re-runs all eight, the updates included. The arithmetic is
precisionlab.emulate's, so the stored bits are every machine's.
"""

from __future__ import annotations

import copy
import inspect
import json
from functools import lru_cache
from pathlib import Path

import numpy as np

from ..underflow import LayerGradients, TrainingProbe, train_probe_arguments
from ..underflow import train_probe as run_train_probe

__all__ = ["CHAPTER_RUNS", "STORED_TRAIN_PROBES", "load_train_probes", "run_key", "same_probe",
           "save_train_probes", "stored_train_probes", "train_probe"]

STORED_TRAIN_PROBES = "ch4_train_probes.json"  # in data/, written by scripts/ch4_train_probes.py
_SIGNATURE = inspect.signature(run_train_probe)
# The chapter's three runs, as it calls underflow.train_probe (the rest its defaults).
CHAPTER_RUNS: tuple[dict, ...] = tuple(
    {"attenuation": 0.82, "depth": 96, "fmt": fmt, "steps": 8, "lr": 0.1, "seed": 0,
     **({"master": True} if master else {})}
    for fmt, master in (("float32", False), ("float16", False), ("float16", True)))


def run_key(*args, **kwargs) -> tuple:
    """underflow.train_probe's arguments (its defaults filled in), checked and in one form, as a key."""
    bound = _SIGNATURE.bind(*args, **kwargs)  # TypeError for an unknown or missing argument
    bound.apply_defaults()
    return tuple(train_probe_arguments(**bound.arguments).items())


def save_train_probes(path, runs: list[tuple[dict, TrainingProbe]], meta: dict) -> None:
    """Write (arguments, TrainingProbe) pairs to path (.json: meta and arguments) and its .npz."""
    path = Path(path)
    entries, arrays = [], {}
    for i, (kwargs, probe) in enumerate(runs):
        entries.append({"args": dict(run_key(**kwargs)), "fmt": probe.fmt,
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
        out[run_key(**e["args"])] = TrainingProbe(e["fmt"], float(e["args"]["attenuation"]),
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
    stored = stored_train_probes().get(run_key(*args, **kwargs))  # bad arguments raise here
    # a copy: a reader who edits one run's arrays changes neither the stored run nor later calls
    return copy.deepcopy(stored) if stored is not None else run_train_probe(*args, **kwargs)


def same_probe(a: TrainingProbe, b: TrainingProbe, steps: int | None = None) -> bool:
    """The same format and attenuation, and every loss and step bit for bit: all of them (the
    same count) with steps=None, else the first `steps` (>= 1) of each."""
    if steps is not None and (isinstance(steps, bool) or int(steps) != steps or steps < 1):
        raise ValueError(f"steps must be None or a positive integer; got steps={steps!r}")
    if steps is None:
        if len(a.steps) != len(b.steps) or a.loss.shape != b.loss.shape:
            return False
        n = len(a.steps)
    else:
        n = int(steps)
        if min(len(a.steps), len(b.steps), a.loss.size, b.loss.size) < n:
            return False
    return (a.fmt, a.attenuation) == (b.fmt, b.attenuation) and a.loss.dtype == b.loss.dtype \
        and a.loss.ndim == b.loss.ndim == 1 and a.loss[:n].tobytes() == b.loss[:n].tobytes() \
        and all(x.same_bits(y) for x, y in zip(a.steps[:n], b.steps[:n], strict=True))
