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
non-zero if any notebook failed or either run took longer than its budget.

A budget in seconds holds on one machine only, so the budget is a multiple of the same
machine's **floor**: the cold wall time of a fresh kernel that only imports numpy, torch,
matplotlib and precisionlab (what every chapter's first cell does before its own work),
measured first, with empty caches, in the same way. Each notebook's cold time must stay
within ``precisionlab.budget_x`` times the floor (its notebook metadata; default 3, chapter
6, which trains live, 5), or --budget-x. --budget (seconds) adds an absolute limit.

On a shared machine one run's time moves by a quarter either way with the neighbours' load;
``--repeat N`` runs the floor and every notebook N times (each cold run with caches of its
own) and reports the medians, floor and notebooks alike (N = 1: one run per notebook, the
floor the faster of two; N >= 3 is the fairer measure on a busy machine).

The same times go into ``book/_notebook_times.md`` (rows of the notebooks run are replaced,
the others kept), which the workshop page includes: the run times a teacher plans with are
measured, never typed.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
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
BUDGET_X = 3.0  # cold time / floor
FLOOR_SOURCE = ("import matplotlib.pyplot\nimport numpy\nimport torch\n"
                "import precisionlab\nimport precisionlab.plotting")
TIMES_FILE = REPO_ROOT / "book" / "_notebook_times.md"
CELL_TIMEOUT_S = 120
ANSI = re.compile(r"\x1b\[[0-9;]*m")


def budget_of(path: Path) -> float:
    """The notebook's own budget as a multiple of the floor (metadata precisionlab.budget_x)."""
    nb = nbformat.read(path, as_version=4)
    return float(nb.metadata.get("precisionlab", {}).get("budget_x", BUDGET_X))


def cpu_model() -> str:
    """The CPU's model name (Linux /proc/cpuinfo, else platform.processor()), and its cores."""
    import platform

    name = platform.processor() or platform.machine()
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.is_file():
        for line in cpuinfo.read_text(encoding="utf-8", errors="replace").splitlines():
            if line.startswith("model name"):
                name = line.split(":", 1)[1].strip()
                break
    return f"{name}, {os.cpu_count()} cores"


def execute(nb_or_path, cell_timeout: int, env: dict[str, str]) -> tuple[float, str | None, Any]:
    """Run one notebook with extra environment variables: (wall s, error or None, notebook)."""
    nb = (nbformat.read(nb_or_path, as_version=4) if isinstance(nb_or_path, Path)
          else nb_or_path)
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


def fresh_caches(caches: str) -> dict[str, str]:
    """Environment variables pointing numba's and matplotlib's caches at new empty folders."""
    env = {"NUMBA_CACHE_DIR": os.path.join(caches, "numba"),
           "MPLCONFIGDIR": os.path.join(caches, "matplotlib")}
    for folder in env.values():
        os.mkdir(folder)
    return env


def floor_time(cell_timeout: int, runs: int = 2, stat=min) -> float:
    """The machine's floor: the least (or `stat`) cold wall time of a fresh kernel running FLOOR_SOURCE."""
    times = []
    for _ in range(runs):
        nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(FLOOR_SOURCE)])
        with tempfile.TemporaryDirectory(prefix="precisionlab-floor-") as caches:
            wall, error, _ = execute(nb, cell_timeout, fresh_caches(caches))
        if error is not None:
            raise RuntimeError(f"the floor notebook failed: {error}")
        times.append(wall)
    return float(stat(times))


def cold_and_warm(path: Path, cell_timeout: int) -> tuple[float, float, str | None, Any]:
    """Run a notebook cold (empty numba and matplotlib caches), then warm (the filled ones)."""
    with tempfile.TemporaryDirectory(prefix="precisionlab-caches-") as caches:
        env = fresh_caches(caches)
        cold, error, nb = execute(path, cell_timeout, env)
        if error is not None:
            return cold, float("nan"), f"cold run: {error}", nb
        warm, error, nb = execute(path, cell_timeout, env)
        return cold, warm, (None if error is None else f"warm run: {error}"), nb


def write_times(rows, floor: float, path: Path, repeat: int = 1) -> None:
    """Merge (name, budget_x, cold, warm, status) rows into the markdown table at path."""
    import platform

    import torch

    present = {p.stem for p in NOTEBOOK_DIR.glob("*.ipynb")}
    table: dict[str, str] = {}
    if path.is_file():  # the other notebooks' rows are kept
        for line in path.read_text(encoding="utf-8").splitlines():
            m = re.match(r"\| \{doc\}`(\d\d-[a-z0-9-]+) <", line)
            if not (m and m.group(1) in present):
                continue
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            if len(cells) == 4:  # a row measured before floors were: no floor, no multiple
                line = f"| {cells[0]} | {cells[1]} | {cells[2]} | - | - | {BUDGET_X:g}x |"
            table[m.group(1)] = line
    for name, budget_x, cold, warm, _status in rows:
        stem = Path(name).stem
        table[stem] = (f"| {{doc}}`{stem} <../notebooks/{stem}>` | {cold:.1f} | {warm:.1f} | "
                       f"{floor:.1f} | {cold / floor:.1f}x | {budget_x:g}x |")
    lines = [
        "<!-- Written by scripts/execute_notebooks.py from its measurements: do not edit. -->",
        "| Notebook | Cold start (s) | Warm (s) | Floor (s) | Cold / floor | Budget |",
        "| --- | ---: | ---: | ---: | ---: | ---: |",
        *(table[k] for k in sorted(table)),
        "",
        f"Last measured with Python {platform.python_version()}, torch "
        f"{torch.__version__.split('+')[0]}, on {cpu_model()}. Cold: a fresh kernel with "
        "empty numba and matplotlib caches, as on a new Colab runtime; warm: the same caches "
        "filled. Floor: a fresh kernel that only imports numpy, torch, matplotlib and "
        "precisionlab, cold, on the same machine; the budget is a multiple of it, so it "
        "travels to a slower or faster laptop."
        + (f" Each time is the median of {repeat} runs." if repeat > 1 else ""),
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
        "--budget-x",
        type=float,
        default=None,
        help="maximum cold time per notebook as a multiple of the floor (default: the "
        f"notebook's metadata precisionlab.budget_x, else {BUDGET_X:g})",
    )
    parser.add_argument(
        "--budget",
        type=float,
        default=None,
        help="also a maximum wall time per notebook in seconds (default: none)",
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
        "--repeat",
        type=int,
        default=1,
        help="runs of the floor and of each notebook, cold then warm; the medians are "
        "reported (default 1: one run each, the floor the faster of two)",
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

    if args.repeat < 1:
        print(f"--repeat must be at least 1; got {args.repeat}", file=sys.stderr)
        return 2
    print("measuring the floor (a fresh kernel importing torch and precisionlab) ...", flush=True)
    floor = (floor_time(args.timeout) if args.repeat == 1
             else floor_time(args.timeout, args.repeat, statistics.median))
    print(f"floor: {floor:.1f} s on {cpu_model()}")
    rows = []
    for path in paths:
        print(f"executing {path.name} (cold, then warm) ...", flush=True)
        budget_x = args.budget_x if args.budget_x is not None else budget_of(path)
        runs = []
        for _ in range(args.repeat):  # stopped by the first failure: the row is an error
            runs.append(cold_and_warm(path, args.timeout))
            if runs[-1][2] is not None:
                break
        error, nb = runs[-1][2], runs[-1][3]
        cold = statistics.median(r[0] for r in runs)
        warm = float("nan") if error else statistics.median(r[1] for r in runs)
        if error is not None:
            status = f"ERROR in the {error}"
        elif cold > budget_x * floor:
            status = f"OVER BUDGET (cold {cold / floor:.1f}x > {budget_x:g}x the floor)"
        elif args.budget is not None and max(cold, warm) > args.budget:
            status = f"OVER BUDGET (> {args.budget:g} s)"
        else:
            status = "ok"
        if error is None and not args.time_only:
            nbformat.write(nb, path)
        rows.append((path.name, budget_x, cold, warm, status))

    width = max(len("notebook"), *(len(row[0]) for row in rows))
    print()
    print(f"{'notebook':<{width}}  {'budget':>7}  {'cold s':>7}  {'warm s':>7}  {'cold/floor':>10}"
          "  status")
    print(f"{'-' * width}  {'-' * 7}  {'-' * 7}  {'-' * 7}  {'-' * 10}  ------")
    for name, budget_x, cold, warm, status in rows:
        print(f"{name:<{width}}  {budget_x:6g}x  {cold:7.1f}  {warm:7.1f}  {cold / floor:9.1f}x"
              f"  {status}")
    total_cold = sum(row[2] for row in rows)
    total_warm = sum(row[3] for row in rows)
    print(f"{'total':<{width}}  {'':>8}  {total_cold:7.1f}  {total_warm:7.1f}")
    print("cold: empty NUMBA_CACHE_DIR and MPLCONFIGDIR; warm: the same, filled by the cold run"
          + ("; notebooks not written (--time-only)" if args.time_only else ""))
    measured = [row for row in rows if not row[4].startswith("ERROR")]
    if measured and args.times_file:
        write_times(measured, floor, Path(args.times_file), args.repeat)
        print(f"times written to {args.times_file}")

    return 0 if all(row[4] == "ok" for row in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
