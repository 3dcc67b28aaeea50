"""The explorers' static views: seconds to compute every frame (static_html) of each explorer.

Run: python benchmarks/bench_widgets.py [--baseline REV] [--only bit,crossing] [--repeats 1]
Each explorer is built with its chapter's defaults (chapter 8's needs the chapter's model and
is left out; chapter 6's trains its short runs once, untimed, as the chapter's own runs are
stored). A row times static_html() of a freshly built explorer, in-process, the median of
`repeats`, after one untimed warm-up explorer (fonts, compiled kernels, trained runs cached);
the `first` column is that warm-up's own wall time; `cpu s` is the process' CPU time (what
the speed-up compares: on a shared machine it moves far less with the load than wall time). With --baseline REV the same rows are measured
on the package as of git revision REV (exported to a temporary folder) and shown beside these
(each explorer in fresh interpreters for both packages, one right after the other), with the
speed-up and whether the two emit the same static HTML, byte for byte. Goal: every explorer's static view well under a
second per 100 frames, so that no chapter spends most of its time drawing its explorer.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

EXPLORERS = {  # name -> (chapter, call building it with the chapter's arguments)
    "bit": (1, "bit_explorer(value=0.1, fmt='bfloat16', mode='nearest_even')"),
    "crossing": (1, "crossing_explorer(w=1.0, lr=1e-5, fmt='bfloat16')"),
    "reduction": (2, "reduction_explorer(order='atomic', acc='float16', block=1, margin=1e-3)"),
    "world": (3, "world_explorer(tol=1e-3, policy='low_precision', horizon=120)"),
    "underflow": (4, "underflow_explorer(attenuation=0.82, depth=96, fmt='float16', g0=1.0)"),
    "scaling": (5, "scaling_explorer(growth_interval=50, spike_rate=0.01, init_scale=2.0**16)"),
    "phantom": (6, "phantom_explorer(engine='bf16', trainer='fp32', eps=0.05, steps=25)"),
    "allclose": (7, "allclose_explorer(k=4096, fmt='float32', bug=0.001)"),
    "block": (9, "block_explorer(outlier=100, block=16, scale_format='float8_e8m0fnu')"),
    "collective": (10, "collective_explorer(world_size=4, order='ring', fmt='float32')"),
}


def measure(names: list[str], repeats: int) -> dict:
    """{name: {'first', 'seconds', 'frames', 'sha'}} for the package on sys.path."""
    import torch

    import precisionlab
    from precisionlab import widgets
    from precisionlab.widgets.collectives import collective_explorer

    torch.set_num_threads(1)  # idle intra-op threads spinning would count as CPU time
    precisionlab.plotting.use_house_style()  # as every chapter does
    scope = {**{n: getattr(widgets, n) for n in widgets.__all__},
             "collective_explorer": collective_explorer}
    out = {}
    for name in names:
        call = EXPLORERS[name][1]
        t0 = time.perf_counter()
        html = eval(call, scope).static_html()  # warm-up: caches, fonts, trained runs
        first = time.perf_counter() - t0
        times, cpu = [], []
        for _ in range(repeats):
            explorer = eval(call, scope)
            t0, c0 = time.perf_counter(), time.process_time()
            again = explorer.static_html()
            times.append(time.perf_counter() - t0)
            cpu.append(time.process_time() - c0)
            assert again == html, f"{name}: two builds differ"
        out[name] = {"first": first, "seconds": statistics.median(times),
                     "cpu": statistics.median(cpu),
                     "frames": explorer.size, "sha": hashlib.sha1(html.encode()).hexdigest()}
        print(f"  measured {name}: {out[name]['seconds']:.2f} s", file=sys.stderr, flush=True)
    return out


def _child(src: str | None, name: str, repeats: int) -> dict:
    """measure([name]) in a fresh interpreter, with the package from src (None: as installed)."""
    env = dict(os.environ)
    if src is not None:
        env["PYTHONPATH"] = src
    res = subprocess.run([sys.executable, __file__, "--json", "--only", name,
                          "--repeats", str(repeats)], env=env, check=True,
                         stdout=subprocess.PIPE, text=True)
    return json.loads(res.stdout)[name]


def compare(rev: str, names: list[str], repeats: int) -> tuple[dict, dict]:
    """(before, now): each explorer measured in fresh interpreters, revision rev's package and
    this one's, one after the other (alternating which goes first), so that both see the same
    load on a shared machine."""
    before, now = {}, {}
    with tempfile.TemporaryDirectory() as tmp:
        archive = subprocess.run(["git", "-C", str(REPO), "archive", rev, "src"],
                                 check=True, capture_output=True).stdout
        subprocess.run(["tar", "-x", "-C", tmp], input=archive, check=True)
        for k, name in enumerate(names):
            sides = [(before, str(Path(tmp) / "src")), (now, os.environ.get("PYTHONPATH"))]
            for table, src in sides[::-1] if k % 2 else sides:
                table[name] = _child(src, name, repeats)
    return before, now


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--baseline", help="git revision to compare with (e.g. HEAD~1)")
    ap.add_argument("--only", help="comma-separated explorers; valid: " + ",".join(EXPLORERS))
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--json", action="store_true", help=argparse.SUPPRESS)  # baseline's child
    args = ap.parse_args()
    names = args.only.split(",") if args.only else list(EXPLORERS)
    bad = [n for n in names if n not in EXPLORERS]
    if bad:
        ap.error(f"--only {','.join(bad)}: unknown; valid choices: {', '.join(EXPLORERS)}")
    if args.json:
        print(json.dumps(measure(names, args.repeats)))
        return
    import precisionlab

    if args.baseline:
        before, now = compare(args.baseline, names, args.repeats)
    else:
        before, now = None, measure(names, args.repeats)
    print(f"static views, in-process wall and CPU seconds (median of {args.repeats}, after a "
          "warm-up build; CPU time, unlike wall time, barely moves with other load); "
          f"precisionlab at {Path(precisionlab.__file__).parent.parent}")
    head = f"{'explorer':<11}{'ch':>3}{'frames':>7}{'first':>8}{'s':>7}{'cpu s':>7}{'ms/frame':>9}"
    if before:
        head += f"{f'{args.baseline} cpu s':>18}{'speed-up':>9}  same HTML"
    print(head)
    print("-" * len(head))
    for name in names:
        r = now[name]
        row = (f"{name:<11}{EXPLORERS[name][0]:>3}{r['frames']:>7}{r['first']:>8.2f}"
               f"{r['seconds']:>7.2f}{r['cpu']:>7.2f}{1e3 * r['cpu'] / r['frames']:>9.1f}")
        if before:
            b = before[name]
            row += (f"{b['cpu']:>18.2f}{b['cpu'] / r['cpu']:>8.1f}x  "
                    + ("yes" if b["sha"] == r["sha"] else "NO"))
        print(row)
    total = sum(r["cpu"] for r in now.values())
    tail = f"{'all (cpu s)':<21}{'':>15}{total:>7.2f}"
    if before:
        was = sum(b["cpu"] for b in before.values())
        tail += f"{'':>9}{was:>18.2f}{was / total:>8.1f}x"
    print(tail)


if __name__ == "__main__":
    main()
