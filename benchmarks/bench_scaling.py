"""Loss scaling and underflow probes: our DynamicLossScaler beside torch.amp.GradScaler, and the
cost of the chapter 4 and 5 experiments.

Run: python benchmarks/bench_scaling.py [--steps 10000] [--repeats 3] [--threads 1]
Each timing is the median of `repeats` runs after one warm-up run. The scaler rows time one
iteration of scale -> step -> update on an 8-element parameter (gradients set directly), so
they measure bookkeeping, not arithmetic. Goal: our scaler within 2x of GradScaler per step
(it is written for clarity, in Python, and keeps a history); every experiment row well under
a second, so that each chapter stays inside its 20 s budget on two shared CPU cores.
"""

from __future__ import annotations

import argparse

import torch
from bench_rounding import median_seconds  # same timing rule as the rounding benchmark

from precisionlab import scaling, underflow


def scaler_loop(make, steps: int):
    """A function running `steps` iterations of scale/step/update with a fresh scaler."""
    raw = torch.randn(steps, 8, generator=torch.Generator().manual_seed(0))
    raw[::97, 3] = float("inf")  # an overflow now and then, so backoff is exercised

    def run():
        scaler = make()
        p = torch.nn.Parameter(torch.ones(8))
        opt = torch.optim.SGD([p], lr=1e-3)
        for i in range(steps):
            p.grad = scaler.scale(raw[i])
            scaler.step(opt)
            scaler.update()

    return run


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=10_000)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1,
                    help="torch threads (the notebooks use 1; tiny tensors gain nothing from more)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, threads {torch.get_num_threads()}, "
          f"{args.steps:,} scaler steps, median of {args.repeats}")

    ours = median_seconds(scaler_loop(lambda: scaling.DynamicLossScaler(growth_interval=50),
                                      args.steps), args.repeats)
    theirs = median_seconds(scaler_loop(lambda: torch.amp.GradScaler("cpu", growth_interval=50),
                                        args.steps), args.repeats)
    print(f"\n{'scaler':<34} {'us/step':>8}")
    print(f"{'DynamicLossScaler (ours)':<34} {1e6 * ours / args.steps:>8.1f}")
    print(f"{'torch.amp.GradScaler(cpu)':<34} {1e6 * theirs / args.steps:>8.1f}")
    print(f"{'ratio ours / GradScaler':<34} {ours / theirs:>8.2f}   (goal <= 2)")

    factory, x, y = scaling.make_regression_task()
    rows = []
    for fmt in underflow.NETWORK_FORMATS:
        net = underflow.AttenuatingNet(96, 64, 0.82, fmt)
        batch = underflow.make_batch(64, 16, fmt)
        rows.append((f"probe_gradients, 96 layers, {fmt}",
                     median_seconds(lambda n=net, b=batch: underflow.probe_gradients(n, *b),
                                    args.repeats)))
    for compute, scaler in [("float32", None), ("float16", None),
                            ("float16", scaling.DynamicLossScaler), ("bfloat16", None)]:
        label = f"train_scaled 200 steps, {compute}" + (" + scaler" if scaler else "")
        rows.append((label, median_seconds(
            lambda c=compute, s=scaler: scaling.train_scaled(factory(), x, y, 200, c,
                                                             s() if s else None),
            args.repeats)))
    rows.append(("trace_dynamic_scaling, 10,000 steps", median_seconds(
        lambda: scaling.trace_dynamic_scaling(scaling.gradient_stream(10_000)), args.repeats)))
    print(f"\n{'experiment':<46} {'seconds':>8}")
    for label, sec in rows:
        print(f"{label:<46} {sec:>8.3f}")


if __name__ == "__main__":
    main()
