"""Interval bounds: how tight, how sound, how costly (precisionlab.intervals, issue #11).

Run: python benchmarks/bench_intervals.py [--runs 100] [--iv-outputs 4] [--repeats 3]

For each case (a sum, dot, matmul or softmax kernel from the GPU simulator) the table prints,
as error bounds (half the interval's width, the largest over the outputs) and errors against
the exact result (math.fsum, or mpmath at 200 bits for softmax):

  structure   the structure-aware bound for this kernel
  err kernel  the largest error observed over `runs` executions of this kernel (random
              atomic orders; a deterministic kernel has one)
  oblivious   the order-oblivious rule ((1 + u)^(n-1) - 1) sum |x|, rounded outward
  err any     the largest error observed over `runs` executions of kernels with the same
              formats in every order the simulator has (what the oblivious rule must cover)
  ratio       oblivious / structure
  mpmath.iv   naive interval arithmetic with mpmath.iv at the accumulator's precision, in
              order k = 0, 1, ..., on the exact products (no operand or output rounding), on
              the first `iv-outputs` outputs (it is slow)
  iv holds    whether every observed execution of this kernel lies in the mpmath.iv interval
              (it encloses the exact result, not the executions: a kernel that rounds its
              operands or its output, or sums in another order, can fall outside)
  overhead    time of the structure-aware analysis / time of one simulated run, and / time
              of numpy's float64 product (native speed)

Every bound is checked to contain the exact result and every observed execution; a line
says so at the end.

A second table shows what the bounds say where values leave the format (issue #16): a running
sum past float16's largest value, a tensor core's float16 output, a float16 split-K partial,
softmax and cross entropy across a 1000-wide logit gap and a BERT mask, and an infinite
input. For each: the executed value, the exact value (fractions or mpmath), the bound and its
may-be-NaN flag, and whether both values lie inside.
"""

from __future__ import annotations

import argparse
import math
import time

import mpmath
import numpy as np

from precisionlab import intervals as iv
from precisionlab.formats import get_format
from precisionlab.rounding import round_to


def rn(x, fmt):
    return np.asarray(round_to(np.ascontiguousarray(x, dtype=np.float64), fmt), dtype=np.float64)


def median_time(fn, repeats: int) -> float:
    fn()
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return float(np.median(times))


def same_formats(kernel: iv.Kernel) -> list[iv.Kernel]:
    """Kernels with this one's formats in every order (what the order-oblivious rule bounds)."""
    base = dict(acc=kernel.acc, out=kernel.out, inputs=kernel.inputs, mode=kernel.mode)
    return [iv.Kernel("sequential", **base), iv.Kernel("pairwise", **base),
            iv.Kernel("blocked", block=8, **base), iv.Kernel("blocked", block=128, **base),
            iv.Kernel("warp", threads=256, **base), iv.Kernel("split_k", splits=16, **base),
            iv.Kernel("atomic", block=1, **base), iv.Kernel("atomic", block=64, **base)]


def iv_sum(terms, prec: int):
    """Sequential sum of floats in mpmath.iv at `prec` bits (each add rounded outward)."""
    saved, mpmath.iv.prec = mpmath.iv.prec, prec
    try:
        acc = mpmath.iv.mpf(0)
        for t in terms:
            acc = acc + mpmath.iv.mpf(float(t))
        return acc
    finally:
        mpmath.iv.prec = saved


def case_table(args):
    rng = np.random.default_rng(0)
    cases = []
    for name, n, kernel in [
        ("sum n=4096 fp32 blocked(32)", 4096, iv.Kernel("blocked", acc="float32", block=32)),
        ("sum n=4096 fp16 warp(256)", 4096, iv.Kernel("warp", acc="float16", threads=256)),
        ("sum n=4096 bf16 atomic(64)", 4096, iv.Kernel("atomic", acc="bfloat16", block=64)),
    ]:
        x = rn(rng.uniform(-1, 1, (8, n)), kernel.acc)
        cases.append((name, "sum", (x,), kernel))
    for name, (m, k, n), kernel in [
        ("dot k=4096 fp32 sequential", (1, 4096, 1), iv.Kernel("sequential", acc="float32")),
        ("matmul 8x4096x8 fp32 blocked(32)", (8, 4096, 8), iv.Kernel("blocked", acc="float32", block=32)),
        ("matmul 8x8192x8 fp32 blocked(64)", (8, 8192, 8), iv.Kernel("blocked", acc="float32", block=64)),
        ("matmul 8x4096x8 fp32 split-K 8 (fused)", (8, 4096, 8), iv.Kernel.from_profile("fp32", 8)),
        ("matmul 8x4096x8 fp32 atomic(256)", (8, 4096, 8), iv.Kernel("atomic", acc="float32", block=256)),
        ("matmul 8x4096x8 bf16 in/out, fp32 acc", (8, 4096, 8), iv.Kernel.from_profile("bf16")),
        ("matmul 8x1024x8 tf32 tensor cores", (8, 1024, 8), iv.Kernel("tensor_core", inputs="tf32")),
        ("matmul 8x1024x8 fp16 acc16", (8, 1024, 8), iv.Kernel.from_profile("fp16-acc16")),
    ]:
        fmt = kernel.inputs or "float32"
        a, b = rn(rng.uniform(-1, 1, (m, k)), fmt), rn(rng.uniform(-1, 1, (k, n)), fmt)
        cases.append((name, "matmul", (a, b), kernel))
    return cases


def measure(kind: str, data, kernel: iv.Kernel, args) -> tuple[str, bool]:
    """One table row (without the name) and whether every bound held."""
    if kind == "sum":
        (x,) = data
        terms = x

        def run(k, seed):
            return iv.sum_(x, k, seed=seed)

        def bound(rule):
            return iv.sum_(iv.point(x, rule), kernel)

        def native():
            return x.sum(axis=-1)
    else:
        a, b = data
        terms = (a[:, None, :] * b.T[None, :, :]).reshape(-1, a.shape[1])

        def run(k, seed):
            return iv.matmul(a, b, k, seed=seed)

        def bound(rule):
            return iv.matmul(iv.point(a, rule), b, kernel)

        def native():
            return a @ b
    first = run(kernel, 0)
    exact = np.array([math.fsum(t) for t in terms]).reshape(first.shape)
    s, o = bound("structure"), bound("oblivious")
    runs_k = [run(kernel, i)
              for i in range(args.runs if kernel.order == "atomic" else 1)]
    runs_any = runs_k + [run(kk, i) for i in range(max(1, args.runs // 10))
                         for kk in same_formats(kernel)]
    err_k = max(float(np.max(np.abs(r - exact))) for r in runs_k)
    err_any = max(float(np.max(np.abs(r - exact))) for r in runs_any)
    sound = (all(s.contains(r).all() for r in runs_k) and all(o.contains(r).all() for r in runs_any)
             and bool(s.contains(exact).all()) and bool(o.contains(exact).all()))
    # mpmath.iv at the accumulator's precision, in order, on the first outputs
    acc_prec = get_format(kernel.acc).precision
    flat_runs = [r.reshape(-1) for r in runs_k]
    iv_widths, iv_holds = [], True
    for j in range(min(args.iv_outputs, terms.shape[0])):
        enc = iv_sum(terms[j], acc_prec)
        iv_widths.append(float(enc.b - enc.a) / 2)
        iv_holds &= all(enc.a <= float(r[j]) <= enc.b for r in flat_runs)
    t_bound = median_time(lambda: bound("structure"), args.repeats)
    t_run = median_time(lambda: run(kernel, 0), args.repeats)
    t_native = median_time(native, args.repeats)
    hs, ho = float(np.max(s.width)) / 2, float(np.max(o.width)) / 2
    row = (f"{hs:>10.3g} {err_k:>10.3g} {ho:>10.3g} {err_any:>10.3g} {ho / hs:>6.3g} "
           f"{max(iv_widths):>10.3g} {'yes' if iv_holds else 'no':>8} "
           f"{t_bound / t_run:>6.1f}x sim {t_bound / t_native:>5.0f}x np")
    return row, sound


def nonfinite_table() -> bool:
    """Bounds where values overflow, logits spread past exp's range, or inputs are infinite."""
    from fractions import Fraction

    mpmath.mp.prec = 200
    seq16, pair16 = iv.Kernel("sequential", acc="float16"), iv.Kernel("pairwise", acc="float16")
    near = np.array([[60256.0, 60256.0, -60256.0, -60256.0]])
    a, b = np.full((1, 4), 200.0), np.full((4, 1), 200.0)
    gap = np.array([[0.0, 0.0, -1000.0]])
    bert = np.array([[1.5, -0.5, 2.0, 1.0 - 1e4]])
    rows = [
        ("fp16 sequential sum past 65504", lambda p: iv.sum_(p(near), seq16), 0.0),
        ("fp16 pairwise sum past 65504", lambda p: iv.sum_(p(near), pair16), 0.0),
        ("V100 tensor core, fp16 output", lambda p: iv.matmul(p(a), b, iv.Kernel(
            "tensor_core", inputs="float16", model="V100", out="float16")), 160000.0),
        ("split-K, float16 partials", lambda p: iv.matmul(p(a), b, iv.Kernel(
            "split_k", acc="float32", partial="float16", splits=2)), 160000.0),
        ("softmax fp32 [0, 0, -1000], entry 2", lambda p: iv.softmax(p(gap), "float32")[:, 2],
         mpmath.exp(-1000) / (2 + mpmath.exp(-1000))),
        ("softmax fp32, BERT -1e4 mask, entry 3", lambda p: iv.softmax(p(bert), "float32")[:, 3],
         mpmath.exp(1.0 - 1e4) / sum(mpmath.exp(v) for v in (1.5, -0.5, 2.0, 1.0 - 1e4))),
        ("cross entropy fp32 [0, 1000], label 0", lambda p: iv.cross_entropy(
            p(np.array([[0.0, 1000.0]])), np.array([0]), "float32"), 1000 + mpmath.log1p(mpmath.exp(-1000))),
        ("fp32 sum of [inf, 1, 2]", lambda p: iv.sum_(p(np.array([[np.inf, 1.0, 2.0]])), iv.Kernel()),
         math.inf),
    ]
    head = f"{'case':<40} {'executed':>10} {'exact':>10} {'bound lo':>10} {'bound hi':>10} {'NaN?':>5} {'holds':>6}"
    print(head)
    print("-" * len(head))
    ok = True
    for name, fn, exact in rows:
        run = float(np.ravel(fn(lambda v: v))[0])
        bnd = fn(iv.point)
        lo, hi, nan = float(np.ravel(bnd.lo)[0]), float(np.ravel(bnd.hi)[0]), bool(np.ravel(bnd.nan)[0])
        inside_run = bool(np.ravel(bnd.contains(run))[0])
        if isinstance(exact, float) and math.isinf(exact):
            inside_exact = lo <= exact <= hi
        else:
            e = mpmath.mpf(exact) if not isinstance(exact, Fraction) else mpmath.mpf(exact.numerator) / exact.denominator
            inside_exact = (lo == -math.inf or mpmath.mpf(lo) <= e) and (hi == math.inf or e <= mpmath.mpf(hi))
        ok &= inside_run and inside_exact
        print(f"{name:<40} {run:>10.4g} {float(exact):>10.4g} {lo:>10.4g} {hi:>10.4g} "
              f"{'yes' if nan else 'no':>5} {'yes' if inside_run and inside_exact else 'NO':>6}")
    return ok


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=100, help="executions per kernel")
    ap.add_argument("--iv-outputs", type=int, default=4, help="outputs checked with mpmath.iv")
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    head = (f"{'case':<40} {'structure':>10} {'err kernel':>10} {'oblivious':>10} {'err any':>10} "
            f"{'ratio':>6} {'mpmath.iv':>10} {'iv holds':>8} {'overhead':>16}")
    print(head)
    print("-" * len(head))
    all_sound = True
    for name, kind, data, kernel in case_table(args):
        row, sound = measure(kind, data, kernel, args)
        all_sound &= sound
        print(f"{name:<40} {row}" + ("" if sound else "   UNSOUND"))
    print("\nevery bound contains the exact result and every observed execution:", all_sound)
    print()
    print("where values leave the format: executed and exact values against the bounds")
    print("every bound holds both:", nonfinite_table())


if __name__ == "__main__":
    main()
