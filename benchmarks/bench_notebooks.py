"""Where a chapter's time goes: each cell's wall time, cold, beside the machine's floor.

Run: python benchmarks/bench_notebooks.py notebooks/06-*.ipynb [--top 12]
Each notebook runs once in a fresh kernel with empty numba and matplotlib caches (as
scripts/execute_notebooks.py's cold run does; nothing is written back), with nbclient's
per-cell timestamps on. The table lists the slowest cells with the first line of their
source, and the kernel's own start-up and import floor measured the same way, so a reader
sees which cells to make cheaper and how far the chapter is from its budget (3x the floor,
chapter 6 5x).
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import sys
import tempfile
from pathlib import Path

import nbformat
from nbclient import NotebookClient

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))
from execute_notebooks import (  # the script is no package: found by its path
    NOTEBOOK_DIR,
    budget_of,
    cpu_model,
    floor_time,
    fresh_caches,
)


def cell_times(path: Path, timeout: int) -> tuple[float, list[tuple[float, int, str]]]:
    """(whole run s, [(cell s, index, first source line)]) of one cold run of a notebook."""
    nb = nbformat.read(path, as_version=4)
    with tempfile.TemporaryDirectory(prefix="precisionlab-bench-") as caches:
        env = fresh_caches(caches)
        saved = {k: os.environ.get(k) for k in env}
        os.environ.update(env)
        try:
            client = NotebookClient(nb, kernel_name="python3", timeout=timeout,
                                    resources={"metadata": {"path": str(NOTEBOOK_DIR)}},
                                    record_timing=True)
            start = dt.datetime.now(dt.timezone.utc)
            client.execute()
            total = (dt.datetime.now(dt.timezone.utc) - start).total_seconds()
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
    rows = []
    for i, cell in enumerate(nb.cells):
        timing = cell.get("metadata", {}).get("execution", {})
        begin, end = timing.get("iopub.execute_input"), timing.get("shell.execute_reply")
        if cell.cell_type != "code" or not (begin and end):
            continue
        seconds = (dt.datetime.fromisoformat(end.replace("Z", "+00:00"))
                   - dt.datetime.fromisoformat(begin.replace("Z", "+00:00"))).total_seconds()
        first = next((ln for ln in cell.source.splitlines() if ln.strip()), "")
        rows.append((seconds, i, first[:60]))
    return total, rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("notebooks", nargs="+", type=Path)
    parser.add_argument("--top", type=int, default=12, help="cells to list per notebook")
    parser.add_argument("--timeout", type=int, default=300, help="per-cell timeout (s)")
    args = parser.parse_args(argv)
    floor = floor_time(args.timeout)
    print(f"floor (fresh kernel importing numpy, torch, matplotlib, precisionlab): "
          f"{floor:.1f} s on {cpu_model()}")
    for path in args.notebooks:
        total, rows = cell_times(path.resolve(), args.timeout)
        cells = sum(r[0] for r in rows)
        print(f"\n{path.name}: {total:.1f} s cold = {total / floor:.1f}x the floor (budget "
              f"{budget_of(path.resolve()):g}x); cells {cells:.1f} s, kernel start-up and "
              f"the rest {total - cells:.1f} s")
        print(f"{'cell':>5}  {'s':>6}  {'share':>6}  first line")
        for seconds, i, first in sorted(rows, reverse=True)[:args.top]:
            print(f"{i:5d}  {seconds:6.2f}  {seconds / total:6.1%}  {first}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
