"""GPU-simulator throughput: precisionlab.gpu beside torch's native ops on the same data.

Run: python benchmarks/bench_gpu.py [--repeats 3] [--orders 10000] [--n 4096] [--size 256]
Each timing is the median of `repeats` runs after one warm-up run (which also loads numba's
compiled kernels). The torch column runs the closest native operation on the same data: for
reductions, torch's own float16 step-by-step loop over the same lanes (the same arithmetic,
one rounding per add) and torch.sum (one fused, float32-accumulated kernel); for matmuls,
torch's float32 matmul (which on a CPU has no TF32 mode). The simulator rounds every add
exactly and draws every atomic order, so it is slower by design; the goal (issue #3) is
10,000 random atomic orders of a 4,096-element vector with float16 accumulation in < 1 s
on 2 cores.
"""

from __future__ import annotations

import argparse
import os

import numba
import numpy as np
import torch
from bench_rounding import median_seconds  # same timing rule as the rounding benchmark

from precisionlab import gpu
from precisionlab.rounding import round_to


def torch_loop(t: torch.Tensor) -> torch.Tensor:
    """Sequential sum over the last axis, one rounded add per step in t's dtype."""
    acc = torch.zeros(t.shape[0], dtype=t.dtype)
    cols = t.T.contiguous()
    for i in range(cols.shape[0]):
        acc = acc + cols[i]
    return acc


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--orders", type=int, default=10_000)
    ap.add_argument("--n", type=int, default=4096)
    ap.add_argument("--size", type=int, default=256)
    args = ap.parse_args()
    reps, lanes, n, s = args.repeats, args.orders, args.n, args.size

    rng = np.random.default_rng(0)
    x = np.asarray(round_to(rng.uniform(0, 1, n), "float16"), dtype=np.float64)
    shared = np.broadcast_to(x, (lanes, n))
    t16 = torch.from_numpy(np.array(shared, dtype=np.float32)).half()
    print(f"cores = {os.cpu_count()}, torch threads = {torch.get_num_threads()}, "
          f"numba threads = {numba.get_num_threads()}")
    print(f"reductions: {lanes:,} lanes x {n:,} elements = {lanes * n / 1e6:.1f} M adds; "
          f"matmuls: {s} x {s} x {s}")

    rows = []
    loop16 = median_seconds(lambda: torch_loop(t16), reps)
    fused16 = median_seconds(lambda: t16.sum(dim=1), reps)
    for label, order, acc, kw in [
        ("atomic (block=1), float16 acc", "atomic", "float16", {"block": 1}),
        ("atomic (block=32), float16 acc", "atomic", "float16", {"block": 32}),
        ("atomic (block=1), float32 acc", "atomic", "float32", {"block": 1}),
        ("sequential, float16 acc", "sequential", "float16", {}),
        ("pairwise, float16 acc", "pairwise", "float16", {}),
        ("warp (256 threads), float16 acc", "warp", "float16", {}),
        ("kahan, float16 acc", "kahan", "float16", {}),
    ]:
        # Deterministic orders on broadcast lanes would be computed once: give them real lanes.
        data = shared if order == "atomic" else np.array(shared)
        t_sim = median_seconds(
            lambda data=data, order=order, acc=acc, kw=kw: gpu.reduce_sum(data, order, acc, seed=1, **kw),
            reps)
        rows.append((label, t_sim, loop16, fused16, lanes * n / t_sim))

    A = rng.standard_normal((s, s))
    B = rng.standard_normal((s, s))
    tA, tB = torch.from_numpy(A).float(), torch.from_numpy(B).float()
    t_mm = median_seconds(lambda: tA @ tB, reps)
    for label, fn in [
        ("matmul, profile tf32", lambda: gpu.matmul(A, B, "tf32")),
        ("matmul, profile fp32", lambda: gpu.matmul(A, B, "fp32")),
        ("matmul, profile bf16", lambda: gpu.matmul(A, B, "bf16")),
        ("matmul, profile fp8 (promotion)", lambda: gpu.matmul(A, B, "fp8")),
        ("tensor-core bit model, V100 fp16", lambda: gpu.tensor_core_matmul(A, B, model="V100")),
    ]:
        t_sim = median_seconds(fn, max(1, reps))
        rows.append((label, t_sim, t_mm, None, s**3 / t_sim))

    print()
    head = f"{'workload':<34}{'simulator s':>12}{'torch loop s':>14}{'torch native s':>16}{'ratio':>9}{'M adds/s':>10}"
    print(head)
    print("-" * len(head))
    for label, t_sim, t_ref, t_fused, rate in rows:
        if t_fused is None:  # matmul: torch's matmul is the native reference
            print(f"{label:<34}{t_sim:>12.3f}{'':>14}{t_ref:>16.4f}{t_sim / t_ref:>8.0f}x{rate / 1e6:>10.1f}")
        else:
            print(f"{label:<34}{t_sim:>12.3f}{t_ref:>14.3f}{t_fused:>16.4f}{t_sim / t_ref:>8.1f}x"
                  f"{rate / 1e6:>10.1f}")
    goal = rows[0][1]
    print(f"\ngoal: {lanes:,} atomic orders of {n:,} elements, float16 accumulation, < 1 s: "
          f"{goal:.2f} s -> {'met' if goal < 1 else 'NOT met'}")
    print("ratio: simulator time / torch loop time (reductions) or / torch float32 matmul (matmuls)")


if __name__ == "__main__":
    main()
