"""Cost of the chapter-6 RL simulation: rollouts, forwards, trainer steps and whole runs.

Run: python benchmarks/bench_rl.py [--repeats 5] [--threads 1]
Every timing is the median of `repeats` calls after one warm-up call, on one torch thread by
default (the setting chapter 6 uses). Rows: one rollout of the engine (8 prompts x 8
completions, sampled token by token) on the emulated arithmetic (the fused numba kernel)
and on torch's own kernels (backend="native"); one scoring forward of that batch without
gradients (fused kernel) and with them (the emulate ops that autograd records); one
trainer forward + backward; and a whole 30-step training run (which also syncs, scores the
shadow forward, takes emulate.Adam steps and logs).
Goal: chapter 6 trains about 28 such runs (plus 3 seeds where results are chaotic) and must
execute in < 60 s on 2 CPU cores, so a 30-step run should take about 1.5 s or less.
"""

from __future__ import annotations

import argparse

import torch
from bench_rounding import median_seconds  # same timing rule as the other benchmarks

from precisionlab import rl


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
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
