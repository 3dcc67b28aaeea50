"""The cost of diagnose.watch: a plain training step beside the same step watched.

Run: python benchmarks/bench_watch.py [--steps 100] [--repeats 5] [--threads 1]
Each row trains a fresh copy of a model (same seed) for `steps` AdamW steps: plain; watched
with every=50 (statistics on 2 of 100 steps; on the others the guard checks the model's
outputs and the gradients, and replays a step only when one is not finite); with every=50 and
check="modules" (every module's output and gradient checked every step, one aminmax each);
and with every=1 (statistics on every step). Runs are interleaved and each time is the
smallest of `repeats`, per step. Goal: every=50 within 1.2x of the plain step.
"""

from __future__ import annotations

import argparse
import copy
import time

import torch
from torch import nn

from precisionlab import diagnose


def tiny_mlp():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 64), nn.GELU(), nn.Linear(64, 64), nn.GELU(),
                          nn.Linear(64, 10))
    x = torch.randn(16, 64)
    return model, lambda m: m(x).pow(2).mean()


def mlp():
    torch.manual_seed(0)
    layers = []
    for _ in range(4):
        layers += [nn.Linear(512, 512), nn.GELU()]
    model = nn.Sequential(*layers, nn.Linear(512, 10))
    x = torch.randn(64, 512)
    return model, lambda m: m(x).pow(2).mean()


def transformer():
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(128, 4, 256, dropout=0.0, batch_first=True)
    model = nn.Sequential(nn.TransformerEncoder(layer, 2, enable_nested_tensor=False),
                          nn.Linear(128, 64))
    x = torch.randn(8, 32, 128)
    return model, lambda m: m(x).pow(2).mean()


def run(make, steps: int, every: int | None, check: str = "outputs") -> float:
    """Seconds per step of `steps` AdamW steps, watched with `every` (None: plain)."""
    model, loss_fn = make()
    model = copy.deepcopy(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)

    def loop(w=None):
        for _ in range(steps):
            opt.zero_grad()
            loss = loss_fn(model)
            loss.backward()
            opt.step()
            if w is not None:
                w.step(loss)
    t = time.perf_counter()
    if every is None:
        loop()
    else:
        with diagnose.watch(model, every=every, check=check) as w:
            loop(w)
    return (time.perf_counter() - t) / steps


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, threads {torch.get_num_threads()}, {args.steps} steps, "
          f"best of {args.repeats}; formats float16, bfloat16, float8_e4m3fn, float8_e5m2")
    print(f"\n{'model':<30} {'params':>7} {'plain ms':>8} {'every=50':>9} {'modules':>8} "
          f"{'every=1':>8}")
    rows = (("MLP 2x64, batch 16", tiny_mlp), ("MLP 4x512, batch 64", mlp),
            ("transformer 2x128, batch 8x32", transformer))
    for name, make in rows:
        n = sum(p.numel() for p in make()[0].parameters())
        run(make, 5, None)
        run(make, 5, 50)  # warm-up
        kinds = ((None, "outputs"), (50, "outputs"), (50, "modules"), (1, "outputs"))
        best = {k: [] for k in kinds}
        for _ in range(args.repeats):
            for every, check in kinds:
                best[(every, check)].append(run(make, args.steps, every, check))
        p, w50, mod, w1 = (min(best[k]) for k in kinds)
        print(f"{name:<30} {n:>7} {1e3 * p:>8.2f} {w50 / p:>8.2f}x {mod / p:>7.2f}x "
              f"{w1 / p:>7.2f}x")
    print("\nevery=50, modules, every=1: the watched step as a multiple of the plain one;"
          "\ngoal: every=50 within 1.2x of the plain step")


if __name__ == "__main__":
    main()
