"""Cost of the chapter-6 RL simulation: where the chapter's time goes, then its parts.

Run: python benchmarks/bench_rl.py [--repeats 5] [--threads 1] [--no-chapter]

First table (skipped with --no-chapter): chapter 6's code cells run in order in one IPython
shell (working directory notebooks/, outputs discarded), timed per cell in wall-clock and
CPU seconds and summed per section of the chapter (its "##" headings), with the costliest
cells listed after. Results are displayed (figures rendered to PNG, widgets to their
frames) and the output discarded. The process has compiled nothing yet, so numba kernels
compile where they are first used, unless numba's on-disk cache (NUMBA_CACHE_DIR, or the
__pycache__ folders beside the sources) already holds them: set NUMBA_CACHE_DIR to an empty
folder for a cold run, as scripts/execute_notebooks.py does. Wall time on a loaded machine exceeds CPU
time; the CPU column is the load-independent share.

Second table: every timing is the median of `repeats` calls after one warm-up call, on one
torch thread by default (the setting chapter 6 uses). Rows: one rollout of the engine (8
prompts x 8 completions, sampled token by token) on the emulated arithmetic (the fused
numba kernel) and on torch's own kernels (backend="native"); one scoring forward of that
batch without gradients (fused kernel) and with them (the emulate ops that autograd
records); one trainer forward + backward; and a whole 30-step training run (which also
syncs, scores the shadow forward, takes emulate.Adam steps and logs).
Goal: chapter 6 executes in < 30 s cold on 2 CPU cores. It trains 2 runs of 30 steps live
(the matched and mismatched pair), two of 15 on torch's kernels, the one run its explorer
widget lacks and, in an exercise's solution, two of 5 steps; the convergence table, the
interventions, the eps = 0.05 runs and their fixes and the repeats on seeds 1 and 2 are
stored (scripts/ch6_seeds.py), and hidden cells re-run the first steps of many of them.
A 30-step run should take about 1 s or less.
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import nbformat
import torch
from bench_rounding import median_seconds  # same timing rule as the other benchmarks

from precisionlab import rl

CHAPTER = Path(__file__).resolve().parents[1] / "notebooks" / "06-phantom-clipping.ipynb"


def chapter_times(path: Path = CHAPTER) -> list[tuple[str, int, str, float, float]]:
    """(section, cell index, first line, wall s, CPU s) of every code cell, run in order in one shell."""
    # optional imports: only this table needs IPython and the inline backend
    from IPython.core.interactiveshell import InteractiveShell
    from IPython.utils.capture import capture_output

    nb = nbformat.read(path, as_version=4)
    here = Path.cwd()
    os.chdir(path.parent)
    import matplotlib
    from matplotlib_inline.backend_inline import configure_inline_support

    inline = "module://matplotlib_inline.backend_inline"  # figures rendered to PNG, as in a kernel
    matplotlib.use(inline)
    shell = InteractiveShell.instance()
    configure_inline_support(shell, inline)
    rows, section = [], "opening"
    try:
        for i, cell in enumerate(nb.cells):
            if cell.cell_type == "markdown":
                heads = [ln[3:].strip() for ln in cell.source.splitlines()
                         if ln.startswith("## ")]
                section = heads[-1] if heads else section
                continue
            if cell.cell_type != "code":
                continue
            wall, cpu = time.perf_counter(), time.process_time()
            with capture_output():  # displayed, so that figures and widgets render
                result = shell.run_cell(cell.source, store_history=False)
            wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
            if not result.success:
                raise RuntimeError(f"cell {i} failed: {result.error_in_exec!r}")
            first = next((ln for ln in cell.source.splitlines() if ln.strip()), "")
            rows.append((section, i, first, wall, cpu))
    finally:
        os.chdir(here)
    return rows


def print_chapter(rows, top: int = 8) -> None:
    """The per-section table, then the `top` costliest cells."""
    sections: dict[str, list[float]] = {}
    for section, _, _, wall, cpu in rows:
        acc = sections.setdefault(section, [0, 0.0, 0.0])
        acc[0] += 1
        acc[1] += wall
        acc[2] += cpu
    total_w, total_c = sum(r[3] for r in rows), sum(r[4] for r in rows)
    width = min(48, max(len(s) for s in sections))
    print(f"chapter 6, cell by cell in one shell: {total_w:.1f} s wall, {total_c:.1f} s CPU")
    print(f"{'section':<{width}}  {'cells':>5}  {'wall s':>7}  {'CPU s':>6}  {'CPU %':>5}")
    print(f"{'-' * width}  {'-' * 5}  {'-' * 7}  {'-' * 6}  {'-' * 5}")
    for name, (n, wall, cpu) in sections.items():
        print(f"{name[:width]:<{width}}  {n:>5}  {wall:>7.2f}  {cpu:>6.2f}  "
              f"{cpu / total_c:>5.1%}")
    print()
    print("costliest cells (CPU s): cell index, section, first line")
    for section, i, first, _, cpu in sorted(rows, key=lambda r: -r[4])[:top]:
        print(f"{cpu:6.2f}  [{i:>3}] {section[:24]:<24} {first[:60]}")
    print()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--no-chapter", action="store_true",
                    help="skip the first table (chapter 6 cell by cell)")
    args = ap.parse_args()
    if not args.no_chapter:
        print_chapter(chapter_times())  # the chapter sets one thread itself
    torch.set_num_threads(args.threads)
    cfg = rl.PolicyConfig()
    policy = rl.Policy(cfg, seed=0)
    rows = []

    for backend in rl.BACKENDS:
        for precision in ("bf16", "fp32"):
            engine = rl.Engine(policy, precision, backend)
            g = torch.Generator().manual_seed(1)
            rows.append((f"rollout, {precision} engine, {backend}",
                         median_seconds(lambda e=engine, g=g: e.generate(8, g), args.repeats)))
    batch = rl.Engine(policy, "bf16").generate(8, torch.Generator().manual_seed(1))
    n_tok = int(batch.mask.sum())
    for precision in rl.PRECISIONS:
        def fused(p=precision):
            with torch.no_grad():
                rl.sequence_logprobs(policy, batch, p)

        def recorded(p=precision):
            rl.sequence_logprobs(policy, batch, p)

        def step(p=precision):
            policy.zero_grad()
            rl.sequence_logprobs(policy, batch, p).sum().backward()

        rows.append((f"score {n_tok} tokens, {precision}, fused kernel",
                     median_seconds(fused, args.repeats)))
        rows.append((f"score {n_tok} tokens, {precision}, emulate ops",
                     median_seconds(recorded, args.repeats)))
        rows.append((f"trainer fwd+bwd, {precision}, emulate ops",
                     median_seconds(step, args.repeats)))
        with torch.no_grad():
            rows.append((f"score {n_tok} tokens, {precision}, native", median_seconds(
                lambda p=precision: rl.sequence_logprobs(policy, batch, p, backend="native"),
                args.repeats)))

    for trainer, engine, backend in [("bf16", "bf16", "emulated"), ("fp32", "bf16", "emulated"),
                                     ("fp16", "fp16", "emulated"), ("fp32", "bf16", "native")]:
        run = rl.RunConfig(trainer=trainer, engine=engine, steps=30, lr=1e-4, backend=backend)
        rows.append((f"30-step run, {trainer} trainer / {engine} engine, {backend}",
                     median_seconds(lambda r=run: rl.train(cfg, r, progress=False),
                                    max(1, args.repeats // 2))))

    width = max(len(name) for name, _ in rows)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} thread(s)")
    print(f"{'what':<{width}}  {'median ms':>10}")
    print(f"{'-' * width}  {'-' * 10}")
    for name, seconds in rows:
        print(f"{name:<{width}}  {seconds * 1e3:>10.2f}")


if __name__ == "__main__":
    main()
