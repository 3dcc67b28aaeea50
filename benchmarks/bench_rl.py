"""Cost of the chapter-6 RL simulation: rollouts, trainer steps and whole runs, per precision.

Run: python benchmarks/bench_rl.py [--repeats 5] [--threads 1]
Every timing is the median of `repeats` calls after one warm-up call, on one torch thread by
default (the setting chapter 6 uses). Rows: one rollout of the engine (8 prompts x 8
completions, sampled token by token), one trainer forward + backward on that batch, the
fp16 matrix product spelled out with fp32 accumulation next to torch's own CPU fp16 matmul,
and a whole 50-step training run (which also syncs, scores the shadow forward and logs).
Goal (issue #5): chapter 6 runs 15 such trainings and must execute in < 60 s on 2 CPU
cores, so a 50-step run should take about 2 s or less.
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F
from bench_rounding import median_seconds  # same timing rule as the other benchmarks

from precisionlab import rl


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    cfg = rl.PolicyConfig()
    policy = rl.Policy(cfg, torch.Generator().manual_seed(0))
    rows = []

    for precision in rl.PRECISIONS:
        engine = rl.Engine(policy, precision)
        g = torch.Generator().manual_seed(1)
        rows.append((f"rollout, {precision} engine",
                     median_seconds(lambda e=engine, g=g: e.generate(8, g), args.repeats)))
    batch = rl.Engine(policy, "bf16").generate(8, torch.Generator().manual_seed(1))
    for precision in rl.PRECISIONS:
        def step(p=precision):
            policy.zero_grad()
            rl.sequence_logprobs(policy, batch, p).sum().backward()
        rows.append((f"trainer fwd+bwd, {precision}", median_seconds(step, args.repeats)))

    gen = torch.Generator().manual_seed(2)
    x = torch.randn(700, 64, generator=gen).half()
    w = torch.randn(128, 64, generator=gen).half()
    rows.append(("fp16 linear, fp32 accumulation", median_seconds(
        lambda: rl._linear(x, w), 20 * args.repeats)))
    rows.append(("fp16 linear, torch CPU kernel", median_seconds(
        lambda: F.linear(x, w), 20 * args.repeats)))

    for trainer, engine in [("bf16", "bf16"), ("fp32", "bf16"), ("fp16", "fp16")]:
        run = rl.RunConfig(trainer=trainer, engine=engine, steps=50)
        rows.append((f"50-step run, {trainer} trainer / {engine} engine", median_seconds(
            lambda r=run: rl.train(cfg, r, progress=False), max(1, args.repeats // 2))))

    width = max(len(name) for name, _ in rows)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} thread(s)")
    print(f"{'what':<{width}}  {'median ms':>10}")
    print(f"{'-' * width}  {'-' * 10}")
    for name, seconds in rows:
        print(f"{name:<{width}}  {seconds * 1e3:>10.2f}")


if __name__ == "__main__":
    main()
