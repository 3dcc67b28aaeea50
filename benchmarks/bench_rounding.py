"""Rounding throughput: precisionlab.round_to beside torch's and ml_dtypes' native casts.

Run: python benchmarks/bench_rounding.py [--n 10000000] [--repeats 7]
Every timing is the fastest of `repeats` runs on the same float32 array, after one warm-up
run (which also loads numba's compiled kernel): on a shared machine the median measures the
neighbours' load as much as the code, the fastest run what the code can do (--stat median
for the median). Ratios > 1 mean precisionlab is faster.
round_to returns float32, twice or four times the bytes of a one-way cast into a 16- or
8-bit dtype, and a fresh 40 MB result costs page faults on first touch; so both are shown:
"fresh" allocates a result each call, "out=" writes into a reused array. The goals are
judged on "out=", the like-for-like comparison of the rounding work itself.
float16 nearest-even runs the CPU's own conversion (F16C) inside the kernel's loop where the
CPU has it (rounding_kernel.hardware_half, printed below), the integer loop elsewhere.
Goals (issues #2, #39): native-capable format+mode >= 0.5x the library cast; emulated modes
(tf32, directed, stochastic) >= 1/3 of the native nearest-even cast of the same format.
--threads sets torch's (and so the kernel's) thread count; the default keeps torch's.
"""

from __future__ import annotations

import argparse
import os
import time
from functools import partial

import ml_dtypes
import numba
import numpy as np
import torch

from precisionlab.formats import FORMATS
from precisionlab.rounding import round_to
from precisionlab.rounding_kernel import hardware_half

STAT = {"min": np.min, "median": np.median}


def seconds(fn, repeats: int, stat: str = "min") -> float:
    """The fastest (or median) wall time of fn() over `repeats` calls after one warm-up call."""
    fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return float(STAT[stat](times))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=10_000_000)
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--stat", choices=sorted(STAT), default="min")
    ap.add_argument("--threads", type=int, default=None)
    args = ap.parse_args()
    n, reps = args.n, args.repeats
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    timed = partial(seconds, stat=args.stat)

    rng = np.random.default_rng(0)
    # Normal values spread over many binades, so every code path (subnormal, overflow) is hit.
    x = (rng.standard_normal(n) * np.exp2(rng.integers(-20, 20, n))).astype(np.float32)
    t = torch.from_numpy(x)
    print(f"n = {n:,} float32 values; cores = {os.cpu_count()}, torch threads = "
          f"{torch.get_num_threads()}, numba threads = {numba.get_num_threads()}; "
          f"{args.stat} of {reps} runs; load average {os.getloadavg()[0]:.1f}; float16 "
          f"in hardware (F16C): {hardware_half()}")

    ml = {"float16": np.float16, "bfloat16": ml_dtypes.bfloat16,
          "float8_e4m3fn": ml_dtypes.float8_e4m3fn, "float8_e5m2": ml_dtypes.float8_e5m2}
    rows, native_rate = [], {}
    buf = np.empty_like(x)
    with np.errstate(over="ignore", invalid="ignore"):
        for name, ml_dtype in ml.items():
            # The libraries cast into preallocated arrays too, so no row pays for page faults.
            t_dst = torch.empty(n, dtype=FORMATS[name].torch_dtype)
            ml_dst = np.empty(n, dtype=ml_dtype)
            sat = name == "float8_e4m3fn"  # torch's e4m3fn cast saturates; match it
            t_torch = timed(partial(t_dst.copy_, t), reps)
            t_ml = timed(partial(np.copyto, ml_dst, x, casting="unsafe"), reps)
            t_fresh = timed(partial(round_to, x, name, saturate=sat), reps)
            t_ours = timed(partial(round_to, x, name, saturate=sat, out=buf), reps)
            t_nat = timed(partial(round_to, x, name, saturate=sat, out=buf,
                                           backend="native"), reps)
            t_emu = timed(partial(round_to, x, name, saturate=sat, out=buf,
                                           backend="emulated"), reps)
            native_rate[name] = n / t_torch
            label = "nearest_even" + (" sat" if sat else "")
            rows.append((name, label, n / t_fresh, n / t_ours, n / t_torch, n / t_ml,
                         t_torch / t_ours, 0.5))
            rows.append((name, "  backend=native", float("nan"), n / t_nat, n / t_torch, n / t_ml,
                         t_torch / t_nat, float("nan")))
            rows.append((name, "  backend=emulated", float("nan"), n / t_emu, n / t_torch,
                         n / t_ml, t_torch / t_emu, float("nan")))
        # Emulated: compare with the native nearest-even torch cast of the same format;
        # tf32 has no native dtype, so its reference is the float32 -> bfloat16 cast.
        emulated = [("tf32", "nearest_even"), ("tf32", "nearest_away"), ("bfloat16", "toward_zero"),
                    ("bfloat16", "up"), ("bfloat16", "down"), ("bfloat16", "stochastic"),
                    ("float16", "nearest_away"), ("float16", "toward_zero"), ("float16", "up"),
                    ("float16", "down"), ("float16", "stochastic"),
                    ("float8_e4m3fn", "nearest_even"), ("float8_e5m2", "stochastic")]
        for name, mode in emulated:
            g = np.random.default_rng(1)
            t_fresh = timed(partial(round_to, x, name, mode, generator=g), reps)
            t_ours = timed(partial(round_to, x, name, mode, generator=g, out=buf), reps)
            ref = native_rate["bfloat16" if name == "tf32" else name]
            label = mode + (" (NaN overflow)" if name == "float8_e4m3fn" else "")
            rows.append((name, label, n / t_fresh, n / t_ours, ref, float("nan"),
                         (n / t_ours) / ref, 1 / 3))

    print("throughput in million elements per second")
    head = (f"{'format':<14} {'mode':<28} {'ours fresh':>10} {'ours out=':>9} {'torch':>8} "
            f"{'ml_dtypes':>9} {'ratio':>6} {'goal':>5}  ok")
    print(head)
    print("-" * len(head))
    def cell(v: float, width: int, scale: float = 1e-6, fmt: str = ".0f") -> str:
        return f"{v * scale:{width}{fmt}}" if np.isfinite(v) else f"{'-':>{width}}"

    for name, mode, fresh, ours, torch_rate, ml_rate, ratio, goal in rows:
        ok = "" if not np.isfinite(goal) else ("yes" if ratio >= goal else "NO")
        print(f"{name:<14} {mode:<28} {cell(fresh, 10)} {cell(ours, 9)} {cell(torch_rate, 8)} "
              f"{cell(ml_rate, 9)} {ratio:6.2f} {cell(goal, 5, 1, '.2f')}  {ok}")
    print("ratio = ours (out=) / torch cast throughput (emulated rows: / torch nearest-even cast of the format;"
          " tf32 uses the bfloat16 cast)")


if __name__ == "__main__":
    main()
