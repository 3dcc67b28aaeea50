#!/usr/bin/env python3
"""Re-execute the book's notebooks in place and check their cold and warm time against budget.

Usage:
    python3 scripts/execute_notebooks.py                       # every notebooks/*.ipynb
    python3 scripts/execute_notebooks.py notebooks/01-*.ipynb   # only the ones given
    python3 scripts/execute_notebooks.py --time-only           # time them, write nothing

Each notebook runs top to bottom twice, each time in a fresh ``python3`` kernel whose
working directory is ``notebooks/``:

* **cold** -- with empty caches, as on a fresh install, a Colab VM or a workshop laptop:
  ``NUMBA_CACHE_DIR`` and ``MPLCONFIGDIR`` point at new empty temporary folders (with
  ``NUMBA_CACHE_DIR`` set, numba neither reads nor writes the ``__pycache__`` folders next
  to the sources, so every kernel a chapter uses is compiled);
* **warm** -- again with the same folders, now filled by the cold run.

Widget state is stored so that the saved file (and GitHub's preview) shows the widgets. The
warm run's notebook is written back only if both runs finished without error (never with
--time-only). A table of cold and warm wall times is printed at the end; the exit status is
non-zero if any notebook failed or either run took longer than its budget: 20 s, unless the
notebook's metadata sets another under ``precisionlab.budget_s`` (chapter 6 trains live and
is allowed 30 s), or --budget is given.

The same times go into ``book/_notebook_times.md`` (rows of the notebooks run are replaced,
the others kept), which the workshop page includes: the run times a teacher plans with are
measured, never typed.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import nbformat
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError, CellTimeoutError, DeadKernelError

REPO_ROOT = Path(__file__).resolve().parent.parent
NOTEBOOK_DIR = REPO_ROOT / "notebooks"
BUDGET_S = 20.0
TIMES_FILE = REPO_ROOT / "book" / "_notebook_times.md"
CELL_TIMEOUT_S = 120
ANSI = re.compile(r"\x1b\[[0-9;]*m")


def budget_of(path: Path) -> float:
    """The notebook's own time budget (metadata precisionlab.budget_s), else the default."""
    nb = nbformat.read(path, as_version=4)
    return float(nb.metadata.get("precisionlab", {}).get("budget_s", BUDGET_S))


def execute(path: Path, cell_timeout: int, env: dict[str, str]) -> tuple[float, str | None, Any]:
    """Run one notebook with extra environment variables: (wall s, error or None, notebook)."""
    nb = nbformat.read(path, as_version=4)
    client = NotebookClient(
        nb,
        kernel_name="python3",
        timeout=cell_timeout,
        resources={"metadata": {"path": str(NOTEBOOK_DIR)}},
        store_widget_state=True,
        record_timing=False,  # keeps per-cell timestamps out of the stored file
    )
    saved = {name: os.environ.get(name) for name in env}
    os.environ.update(env)  # the kernel is a child process and inherits them
    start = time.perf_counter()
    try:
        client.execute()
    except (CellExecutionError, CellTimeoutError, DeadKernelError) as exc:
        last_line = ANSI.sub("", str(exc)).strip().splitlines()[-1]
        return time.perf_counter() - start, last_line[:200], nb
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
    return time.perf_counter() - start, None, nb


def cold_and_warm(path: Path, cell_timeout: int) -> tuple[float, float, str | None, Any]:
    """Run a notebook cold (empty numba and matplotlib caches), then warm (the filled ones)."""
    with tempfile.TemporaryDirectory(prefix="precisionlab-caches-") as caches:
        env = {"NUMBA_CACHE_DIR": os.path.join(caches, "numba"),
               "MPLCONFIGDIR": os.path.join(caches, "matplotlib")}
        for folder in env.values():
            os.mkdir(folder)
        cold, error, nb = execute(path, cell_timeout, env)
        if error is not None:
            return cold, float("nan"), f"cold run: {error}", nb
        warm, error, nb = execute(path, cell_timeout, env)
        return cold, warm, (None if error is None else f"warm run: {error}"), nb


def write_times(rows, path: Path) -> None:
    """Merge (name, budget, cold, warm, status) rows into the markdown table at path."""
    import platform

    import torch

    present = {p.stem for p in NOTEBOOK_DIR.glob("*.ipynb")}
    table: dict[str, str] = {}
    if path.is_file():
        for line in path.read_text(encoding="utf-8").splitlines():
            m = re.match(r"\| \{doc\}`(\d\d-[a-z0-9-]+) <", line)
            if m and m.group(1) in present:
                table[m.group(1)] = line
    for name, budget, cold, warm, _status in rows:
        stem = Path(name).stem
        table[stem] = f"| {{doc}}`{stem} <../notebooks/{stem}>` | {cold:.1f} | {warm:.1f} | {budget:g} |"
    lines = [
        "<!-- Written by scripts/execute_notebooks.py from its measurements: do not edit. -->",
        "| Notebook | Cold start (s) | Warm (s) | Budget (s) |",
        "| --- | ---: | ---: | ---: |",
        *(table[k] for k in sorted(table)),
        "",
        f"Last measured with Python {platform.python_version()}, torch "
        f"{torch.__version__.split('+')[0]}, on {os.cpu_count()} CPU cores. Cold: a fresh "
        "kernel with empty numba and matplotlib caches, as on a new Colab runtime; warm: "
        "the same caches filled.",
        "",
    ]
    path.write_text("\n".join(lines), encoding="utf-8")


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
    parser.add_argument(
        "--times-file",
        default=str(TIMES_FILE),
        help="markdown table of the measured times, merged per notebook "
        f"(default {TIMES_FILE.relative_to(REPO_ROOT)}; an empty string writes none)",
    )
    parser.add_argument(
        "--time-only",
        action="store_true",
        help="run and time the notebooks but do not write them back",
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
        print(f"executing {path.name} (cold, then warm) ...", flush=True)
        budget = args.budget if args.budget is not None else budget_of(path)
        cold, warm, error, nb = cold_and_warm(path, args.timeout)
        if error is not None:
            status = f"ERROR in the {error}"
        elif max(cold, warm) > budget:
            status = f"OVER BUDGET ({'cold' if cold > budget else 'warm'} > {budget:g} s)"
        else:
            status = "ok"
        if error is None and not args.time_only:
            nbformat.write(nb, path)
        rows.append((path.name, budget, cold, warm, status))

    width = max(len("notebook"), *(len(row[0]) for row in rows))
    print()
    print(f"{'notebook':<{width}}  {'budget s':>8}  {'cold s':>7}  {'warm s':>7}  status")
    print(f"{'-' * width}  {'-' * 8}  {'-' * 7}  {'-' * 7}  ------")
    for name, budget, cold, warm, status in rows:
        print(f"{name:<{width}}  {budget:8g}  {cold:7.1f}  {warm:7.1f}  {status}")
    total_cold = sum(row[2] for row in rows)
    total_warm = sum(row[3] for row in rows)
    print(f"{'total':<{width}}  {'':>8}  {total_cold:7.1f}  {total_warm:7.1f}")
    print("cold: empty NUMBA_CACHE_DIR and MPLCONFIGDIR; warm: the same, filled by the cold run"
          + ("; notebooks not written (--time-only)" if args.time_only else ""))
    measured = [row for row in rows if not row[4].startswith("ERROR")]
    if measured and args.times_file:
        write_times(measured, Path(args.times_file))
        print(f"times written to {args.times_file}")

    return 0 if all(row[4] == "ok" for row in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
