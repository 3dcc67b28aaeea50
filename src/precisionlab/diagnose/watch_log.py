"""Where `watch` writes: watch.jsonl (one JSON object a line), TensorBoard event files through
`torch.utils.tensorboard` when asked for, and the dump of a non-finite operation's inputs."""

from __future__ import annotations

import importlib.util
import json
import math
import pathlib
import re

import torch

__all__ = ["TENSORBOARD_MISSING", "WatchLog", "check_tensorboard", "dump_inputs"]

TENSORBOARD_MISSING = ("tensorboard=True writes TensorBoard event files through "
                       "torch.utils.tensorboard, which needs the tensorboard package: "
                       "pip install tensorboard (or pip install 'precisionlab[watch]'); "
                       "or pass tensorboard=False (watch.jsonl is written either way)")


def check_tensorboard(tensorboard, log_dir) -> bool:
    """tensorboard as a bool, checked: True needs a log_dir and the tensorboard package.

    Raises
    ------
    ValueError
        If tensorboard is not a bool, or True without a log_dir.
    ImportError
        If tensorboard=True and the tensorboard package is not installed.
    """
    if not isinstance(tensorboard, bool):
        raise ValueError(f"tensorboard must be True or False; got tensorboard={tensorboard!r}")
    if tensorboard and log_dir is None:
        raise ValueError("tensorboard=True writes its event files under log_dir; got "
                         "log_dir=None")
    if tensorboard and importlib.util.find_spec("tensorboard") is None:
        raise ImportError(TENSORBOARD_MISSING)
    return tensorboard


class WatchLog:
    """The log files of one watch (rank 0 writes; other ranks get a WatchLog that writes
    nothing): `rows` to watch.jsonl, `scalar` to the TensorBoard events."""

    def __init__(self, log_dir: pathlib.Path | None, tensorboard: bool, writes: bool):
        self._jsonl = self._tb = None
        if log_dir is None:
            return
        log_dir.mkdir(parents=True, exist_ok=True)
        if writes:
            self._jsonl = open(log_dir / "watch.jsonl", "w")
            if tensorboard:
                from torch.utils.tensorboard import SummaryWriter
                self._tb = SummaryWriter(str(log_dir))

    def rows(self, rows: list[dict]) -> None:
        """Write each dict as a JSON line."""
        if self._jsonl is not None and rows:
            for r in rows:
                self._jsonl.write(json.dumps(r) + "\n")
            self._jsonl.flush()

    def scalar(self, tag: str, value: float, step: int) -> None:
        """A TensorBoard scalar (finite values only)."""
        if self._tb is not None and math.isfinite(value):
            self._tb.add_scalar(tag, value, step)

    def stats(self, records, formats) -> None:
        """amax/{kind}/{module} and headroom_{format}/{kind}/{module} of each LayerStats."""
        if self._tb is None:
            return
        for r in records:
            tag = f"{r.kind.replace(' ', '_')}/{r.module or 'model'}"
            self.scalar(f"amax/{tag}", r.amax, r.step)
            for f in formats:
                self.scalar(f"headroom_{f}/{tag}", r.headroom(f), r.step)

    def close(self) -> None:
        """Flush and close the files."""
        for f in (self._jsonl, self._tb):
            if f is not None:
                f.close()
        self._jsonl = self._tb = None


def _cpu(obj):
    if isinstance(obj, torch.Tensor):
        to_local = getattr(obj, "to_local", None)
        obj = to_local() if callable(to_local) else obj
        return obj.detach().cpu().clone()
    if isinstance(obj, (list, tuple)):
        return [_cpu(o) for o in obj]
    if isinstance(obj, dict):
        return {k: _cpu(v) for k, v in obj.items()}
    return obj


def dump_inputs(log_dir: pathlib.Path, path: str, step: int, rank: int, what: dict,
                module) -> str:
    """Save what (inputs or a gradient) and the module's class and state to
    log_dir/nonfinite-step{step}-rank{rank}-{path}.pt; return the file's path."""
    safe = re.sub(r"[^A-Za-z0-9_.-]", "_", path or "model")
    data = {"module": path, "step": step, **_cpu(what)}
    if module is not None:
        data["class"] = type(module).__name__
        data["state_dict"] = _cpu(dict(module.state_dict()))
    f = log_dir / f"nonfinite-step{step}-rank{rank}-{safe}.pt"
    torch.save(data, f)
    return str(f)
