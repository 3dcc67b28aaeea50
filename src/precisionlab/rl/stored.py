"""Stored runs: per-step logs of runs too long for a chapter, written by a script and replayed by the tests."""

from __future__ import annotations

import json
import platform
import sys
import tempfile
import urllib.parse
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import asdict
from importlib import metadata
from pathlib import Path

import numba
import numpy as np
import torch

from .. import __version__
from .policy import Policy, PolicyConfig
from .runs import STEP_FIELDS, RunConfig, RunLog

__all__ = ["find_stored", "load_runs", "provenance", "save_runs"]


def provenance(argv: Sequence[str] | None = None) -> dict[str, str]:
    """A stored file's origin: the command (python3 and argv, default sys.argv) and the versions it ran with."""
    argv = sys.argv if argv is None else argv
    return {"command": "python3 " + " ".join([Path(argv[0]).as_posix(), *argv[1:]]),
            "precisionlab_version": __version__, "torch_version": torch.__version__,
            "numpy_version": np.__version__, "numba_version": numba.__version__,
            "python_version": platform.python_version()}


def save_runs(path, logs: Mapping[int, Mapping[str, RunLog]], meta: Mapping,
              with_state: bool = False) -> None:
    """Write runs to `path` (.json: meta, configs, gradient reports; beside it .npz: every STEP_FIELDS array, exact float64).

    with_state=True also stores each run's per-token snapshots (`record`) and its final
    weights (the policy's state_dict), so that `load_runs` gives back RunLogs a chapter can
    use in place of the live runs; meta must then hold the PolicyConfig as meta["policy"].
    """
    # logs: seed -> run name -> RunLog, every seed with the same run names and configs.
    path = Path(path)
    seeds = sorted(logs)
    names = list(logs[seeds[0]])
    # One (fields, steps) float64 array per seed and run.
    arrays = {f"{seed}.{name}": np.stack(list(logs[seed][name].arrays().values()))
              for seed in seeds for name in names}
    if with_state:
        if "policy" not in meta:
            raise ValueError("with_state=True needs the runs' PolicyConfig in meta['policy'] "
                             "(dataclasses.asdict of it)")
        for key, log in ((f"{s}.{n}", logs[s][n]) for s in seeds for n in names):
            if log.policy is None:
                raise ValueError(f"with_state=True stores final weights, but run {key!r} has "
                                 "policy=None; pass the RunLogs that train returned")
            for step, snap in log.snapshots.items():
                arrays.update({f"{key}.snapshot.{step}.{k}": v for k, v in snap.items()})
            arrays.update({f"{key}.state.{k}": v.detach().numpy()
                           for k, v in log.policy.state_dict().items()})
    np.savez_compressed(path.with_suffix(".npz"), **arrays)
    doc = {**meta, "seeds": seeds, "fields": list(STEP_FIELDS),
           "runs": {name: asdict(logs[seeds[0]][name].config) for name in names},
           "arrays": path.with_suffix(".npz").name}
    # Gradient reports (step -> dict of floats), where a run has them: exact in JSON.
    reports = {f"{seed}.{name}": {str(k): v for k, v in logs[seed][name].gradients.items()}
               for seed in seeds for name in names if logs[seed][name].gradients}
    if reports:
        doc["gradients"] = reports
    if with_state:
        doc["with_state"] = True
    path.write_text(json.dumps(doc, indent=1, allow_nan=True) + "\n")


def load_runs(path) -> tuple[dict, dict[int, dict[str, RunLog]]]:
    """(meta, seed -> run name -> RunLog) from a file written by `save_runs` (gradient reports kept; snapshots and final policies where stored with_state)."""
    path = Path(path)
    meta = json.loads(path.read_text())
    with np.load(path.parent / meta["arrays"]) as z:
        arrays = {k: z[k] for k in z.files}
    logs: dict[int, dict[str, RunLog]] = {}
    for seed in meta["seeds"]:
        logs[seed] = {}
        for name, cfg in meta["runs"].items():
            fields = dict(zip(meta["fields"], arrays[f"{seed}.{name}"], strict=True))
            reports = meta.get("gradients", {}).get(f"{seed}.{name}", {})
            log = RunLog(config=RunConfig(**cfg), **fields,
                         gradients={int(k): v for k, v in reports.items()})
            if meta.get("with_state"):
                _restore_state(log, f"{seed}.{name}", arrays, PolicyConfig(**meta["policy"]),
                               seed)
            logs[seed][name] = log
    return meta, logs


def _restore_state(log: RunLog, key: str, arrays: Mapping[str, np.ndarray],
                   policy_cfg: PolicyConfig, seed: int) -> None:
    """Put a stored run's snapshots and final weights (`save_runs(with_state=True)`) into log."""
    for k, v in arrays.items():
        if k.startswith(key + ".snapshot."):
            step, field_name = k[len(key) + len(".snapshot."):].split(".")
            log.snapshots.setdefault(int(step), {})[field_name] = v
    log.snapshots = dict(sorted(log.snapshots.items()))
    policy = Policy(policy_cfg, seed)
    state = {k[len(key) + len(".state."):]: torch.from_numpy(v.copy())
             for k, v in arrays.items() if k.startswith(key + ".state.")}
    policy.load_state_dict(state)  # strict: every weight and buffer, exact float32
    log.policy = policy


def find_stored(name: str, start=None):
    """Path of data/<name> in the repository, looked for from `start` (default: the working directory) upwards."""
    # Where the repository is absent (e.g. on Colab, where only the package was installed from
    # git), pip's record of the install (direct_url.json) says where it came from: a local
    # clone's data/ is used as it is; from GitHub, the file and its .npz are downloaded at the
    # recorded commit into a temporary directory.
    here = Path(start or Path.cwd()).resolve()
    for d in (here, *here.parents):
        if (d / "data" / name).is_file():
            return d / "data" / name
    try:
        origin = json.loads(metadata.distribution("precisionlab").read_text("direct_url.json"))
    except (metadata.PackageNotFoundError, TypeError, ValueError):
        origin = {}
    url, commit = origin.get("url", ""), origin.get("vcs_info", {}).get("commit_id")
    if url.startswith("file://"):  # installed from a local clone: its data/ folder
        local = Path(urllib.parse.unquote(urllib.parse.urlparse(url).path)) / "data" / name
        if local.is_file():
            return local
    if not (url.startswith("https://github.com/") and commit):
        raise FileNotFoundError(f"data/{name} not found above {here}, and precisionlab was not "
                                f"installed from a GitHub repository; run the script that makes it "
                                f"(scripts/rl_source_regime.py or scripts/ch6_seeds.py for the chapter 6 runs)")
    raw = url.removesuffix(".git").replace("https://github.com/",
                                           "https://raw.githubusercontent.com/")
    out = Path(tempfile.gettempdir()) / "precisionlab-data" / commit
    out.mkdir(parents=True, exist_ok=True)
    for file in (name, str(Path(name).with_suffix(".npz"))):
        if not (out / file).is_file():
            urllib.request.urlretrieve(f"{raw}/{commit}/data/{file}", out / file)
    return out / name
