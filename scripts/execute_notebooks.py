#!/usr/bin/env python3
"""Re-execute the book's notebooks in place and check their time budget.

Usage:
    python3 scripts/execute_notebooks.py                       # every notebooks/*.ipynb
    python3 scripts/execute_notebooks.py notebooks/01-*.ipynb   # only the ones given

Each notebook runs top to bottom in a fresh ``python3`` kernel whose working directory
is ``notebooks/``, with widget state stored so that the saved file (and GitHub's preview)
shows the widgets. The notebook is written back only if it ran without error. A table of
wall times is printed at the end; the exit status is non-zero if any notebook failed or
took longer than its budget: 20 s, unless the notebook's metadata sets another under
``precisionlab.budget_s`` (chapter 6 trains live and is allowed 60 s), or --budget is given.
"""

from __future__ import annotations

import argparse
import re
import sys
import time
from pathlib import Path

import nbformat
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError, CellTimeoutError, DeadKernelError

REPO_ROOT = Path(__file__).resolve().parent.parent
NOTEBOOK_DIR = REPO_ROOT / "notebooks"
BUDGET_S = 20.0
CELL_TIMEOUT_S = 120
ANSI = re.compile(r"\x1b\[[0-9;]*m")


def budget_of(path: Path) -> float:
    """The notebook's own time budget (metadata precisionlab.budget_s), else the default."""
    nb = nbformat.read(path, as_version=4)
    return float(nb.metadata.get("precisionlab", {}).get("budget_s", BUDGET_S))


def execute(path: Path, cell_timeout: int) -> tuple[float, str | None]:
    """Run one notebook in place; return (wall seconds, error message or None)."""
    nb = nbformat.read(path, as_version=4)
    client = NotebookClient(
        nb,
        kernel_name="python3",
        timeout=cell_timeout,
        resources={"metadata": {"path": str(NOTEBOOK_DIR)}},
        store_widget_state=True,
        record_timing=False,  # keeps per-cell timestamps out of the stored file
    )
    start = time.perf_counter()
    try:
        client.execute()
    except (CellExecutionError, CellTimeoutError, DeadKernelError) as exc:
        last_line = ANSI.sub("", str(exc)).strip().splitlines()[-1]
        return time.perf_counter() - start, last_line[:200]
    wall = time.perf_counter() - start
    nbformat.write(nb, path)
    return wall, None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "notebooks",
        nargs="*",
        type=Path,
        help="notebooks to run (default: every notebooks/*.ipynb)",
    )
    parser.add_argument(
        "--budget",
        type=float,
        default=None,
        help="maximum wall time per notebook in seconds (default: the notebook's "
        f"metadata precisionlab.budget_s, else {BUDGET_S:g})",
    )
    parser.add_argument(
        "--timeout",
        type=int,
        default=CELL_TIMEOUT_S,
        help=f"per-cell timeout in seconds (default {CELL_TIMEOUT_S})",
    )
    args = parser.parse_args(argv)

    paths = [p.resolve() for p in args.notebooks] or sorted(NOTEBOOK_DIR.glob("*.ipynb"))
    if not paths:
        print(f"no notebooks found in {NOTEBOOK_DIR}", file=sys.stderr)
        return 1
    missing = [p for p in paths if not p.is_file()]
    if missing:
        print("not found: " + ", ".join(map(str, missing)), file=sys.stderr)
        return 1

    rows = []
    for path in paths:
        print(f"executing {path.name} ...", flush=True)
        budget = args.budget if args.budget is not None else budget_of(path)
        wall, error = execute(path, args.timeout)
        if error is not None:
            status = f"ERROR: {error}"
        elif wall > budget:
            status = f"OVER BUDGET (> {budget:g} s)"
        else:
            status = "ok"
        rows.append((path.name, wall, status))

    width = max(len("notebook"), *(len(name) for name, _, _ in rows))
    print()
    print(f"{'notebook':<{width}}  {'wall s':>7}  status")
    print(f"{'-' * width}  {'-' * 7}  ------")
    for name, wall, status in rows:
        print(f"{name:<{width}}  {wall:7.1f}  {status}")
    print(f"{'total':<{width}}  {sum(w for _, w, _ in rows):7.1f}")

    return 0 if all(status == "ok" for _, _, status in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
