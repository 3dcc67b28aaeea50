"""Rounding throughput: precisionlab.round_to beside torch's and ml_dtypes' native casts.

Run: python benchmarks/bench_rounding.py [--n 10000000] [--repeats 7]
Every timing is the median of `repeats` runs on the same float32 array, after one warm-up
run (which also loads numba's compiled kernel). Ratios > 1 mean precisionlab is faster.
round_to returns float32, twice or four times the bytes of a one-way cast into a 16- or
8-bit dtype, and a fresh 40 MB result costs page faults on first touch; so both are shown:
"fresh" allocates a result each call, "out=" writes into a reused array. The goals are
judged on "out=", the like-for-like comparison of the rounding work itself.
Goals (issue #2): native-capable format+mode >= 0.5x the library cast; emulated modes
(tf32, directed, stochastic) >= 1/3 of the native nearest-even cast of the same format.
"""

from __future__ import annotations

import argparse
import os
import time

import ml_dtypes
import numba
import numpy as np
import torch

from precisionlab.formats import FORMATS
from precisionlab.rounding import round_to


def median_seconds(fn, repeats: int) -> float:
    """Median wall time of fn() over `repeats` calls after one warm-up call."""
    fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return float(np.median(times))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=10_000_000)
    ap.add_argument("--repeats", type=int, default=7)
    args = ap.parse_args()
    n, reps = args.n, args.repeats

    rng = np.random.default_rng(0)
    # Normal values spread over many binades, so every code path (subnormal, overflow) is hit.
    x = (rng.standard_normal(n) * np.exp2(rng.integers(-20, 20, n))).astype(np.float32)
    t = torch.from_numpy(x)
    print(f"n = {n:,} float32 values; cores = {os.cpu_count()}, torch threads = "
          f"{torch.get_num_threads()}, numba threads = {numba.get_num_threads()}")

    ml = {"float16": np.float16, "bfloat16": ml_dtypes.bfloat16,
          "float8_e4m3fn": ml_dtypes.float8_e4m3fn, "float8_e5m2": ml_dtypes.float8_e5m2}
    rows, native_rate = [], {}
    buf = np.empty_like(x)
    with np.errstate(over="ignore", invalid="ignore"):
        for name, ml_dtype in ml.items():
            td = FORMATS[name].torch_dtype
            sat = name == "float8_e4m3fn"  # torch's e4m3fn cast saturates; match it
            t_torch = median_seconds(lambda: t.to(td), reps)
            t_ml = median_seconds(lambda: x.astype(ml_dtype), reps)
            t_fresh = median_seconds(lambda: round_to(x, name, saturate=sat), reps)
            t_ours = median_seconds(lambda: round_to(x, name, saturate=sat, out=buf), reps)
            native_rate[name] = n / t_torch
            rows.append((name, "nearest_even" + (" sat" if sat else ""), n / t_fresh, n / t_ours,
                         n / t_torch, n / t_ml, t_torch / t_ours, 0.5))
        # Emulated: compare with the native nearest-even torch cast of the same format;
        # tf32 has no native dtype, so its reference is the float32 -> bfloat16 cast.
        emulated = [("tf32", "nearest_even"), ("tf32", "nearest_away"), ("bfloat16", "toward_zero"),
                    ("bfloat16", "up"), ("bfloat16", "down"), ("bfloat16", "stochastic"),
                    ("float16", "stochastic"), ("float8_e4m3fn", "nearest_even"),
                    ("float8_e5m2", "stochastic")]
        for name, mode in emulated:
            g = np.random.default_rng(1)
            t_fresh = median_seconds(lambda: round_to(x, name, mode, rng=g), reps)
            t_ours = median_seconds(lambda: round_to(x, name, mode, rng=g, out=buf), reps)
            ref = native_rate["bfloat16" if name == "tf32" else name]
            label = mode + (" (NaN overflow)" if name == "float8_e4m3fn" else "")
            rows.append((name, label, n / t_fresh, n / t_ours, ref, float("nan"), (n / t_ours) / ref, 1 / 3))

    print("throughput in million elements per second")
    head = (f"{'format':<14} {'mode':<28} {'ours fresh':>10} {'ours out=':>9} {'torch':>8} "
            f"{'ml_dtypes':>9} {'ratio':>6} {'goal':>5}  ok")
    print(head)
    print("-" * len(head))
    for name, mode, fresh, ours, torch_rate, ml_rate, ratio, goal in rows:
        ml_txt = f"{ml_rate / 1e6:9.0f}" if np.isfinite(ml_rate) else f"{'-':>9}"
        print(f"{name:<14} {mode:<28} {fresh / 1e6:10.0f} {ours / 1e6:9.0f} {torch_rate / 1e6:8.0f} {ml_txt} "
              f"{ratio:6.2f} {goal:5.2f}  {'yes' if ratio >= goal else 'NO'}")
    print("ratio = ours (out=) / torch cast throughput (emulated rows: / torch nearest-even cast of the format;"
          " tf32 uses the bfloat16 cast)")


if __name__ == "__main__":
    main()
