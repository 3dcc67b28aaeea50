#!/usr/bin/env python3
"""Cost of each diagnose function as a multiple of one training step (or one forward), and its
peak memory beside the model's own, for a ~10^5- and a ~10^7-parameter transformer on CPU.

Goals (issue 19): gradients and mismatch within 3x a training step, triage within 30x one
forward, memory within 2x the model's own. Each job runs in a fresh subprocess. Memory is the
peak resident memory of one call beyond the resident memory just before it (Linux: the peak is
reset through /proc/self/clear_refs), with the model, the batch, the optimizer and triage's
bfloat16 copy already built: "cold" is the first call, which also pays one-time imports and JIT
compilation (numba in precisionlab.rounding, intervals.torch_ops.fused and .kernels), "warm" a
later call. Times: the best of 3 to 50 runs after those two, on the wall clock and in the
process's CPU time (which a loaded machine disturbs less).

    python3 benchmarks/bench_diagnose.py            # both sizes
    python3 benchmarks/bench_diagnose.py --small    # the 10^5 model only
"""

from __future__ import annotations

import argparse
import copy
import gc
import json
import math
import subprocess
import sys
import time

SIZES = {"1e5": dict(vocab=96, d=48, layers=2, context=64, batch=8),
         "1e7": dict(vocab=256, d=512, layers=3, context=64, batch=8)}
JOBS = ("train_step", "forward", "gradients", "mismatch", "triage", "determinism")


def build(vocab, d, layers, context, batch):
    import torch
    import torch.nn.functional as F
    from torch import nn

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
            self.qkv, self.out = nn.Linear(d, 3 * d), nn.Linear(d, d)
            self.fc, self.proj = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

        def forward(self, x):
            b, t, _ = x.shape
            q, k, v = (z.view(b, t, 4, -1).transpose(1, 2)
                       for z in self.qkv(self.ln1(x)).chunk(3, -1))
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + self.out(y.transpose(1, 2).reshape(b, t, d))
            return x + self.proj(F.gelu(self.fc(self.ln2(x))))

    class LM(nn.Module):
        def __init__(self):
            super().__init__()
            self.tok, self.pos = nn.Embedding(vocab, d), nn.Embedding(context, d)
            self.blocks = nn.ModuleList(Block() for _ in range(layers))
            self.norm, self.head = nn.LayerNorm(d), nn.Linear(d, vocab)

        def forward(self, idx):
            x = self.tok(idx) + self.pos(torch.arange(idx.shape[1]))
            for blk in self.blocks:
                x = blk(x)
            return self.head(self.norm(x))

    torch.manual_seed(0)
    model = LM().eval()
    x = torch.randint(0, vocab, (batch, context))

    def loss_fn(out):
        return F.cross_entropy(out[:, :-1].reshape(-1, vocab), x[:, 1:].reshape(-1))
    return model, x, loss_fn


def _status(key: str) -> float:
    """VmRSS or VmHWM (peak) of this process in MiB."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) / 1024
    raise RuntimeError(f"/proc/self/status has no {key}")


def _peak_extra(fn) -> float:
    """Peak resident memory of fn() beyond the resident memory before it, in MiB."""
    gc.collect()
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # resets VmHWM to the current resident memory
    before = _status("VmRSS")
    fn()
    return _status("VmHWM") - before


def one(size: str, job: str) -> dict:
    """Time one job (best of 3 to 50 runs after a warm-up) and its peak memory (cold and warm)."""
    import torch

    from precisionlab import diagnose

    torch.set_num_threads(1)
    model, x, loss_fn = build(**SIZES[size])
    n = sum(p.numel() for p in model.parameters())
    model_mib = n * 4 / 2**20
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)

    def train_step():
        loss = loss_fn(model(x))
        opt.zero_grad()
        loss.backward()
        opt.step()

    small = x[:2, :32]
    low = copy.deepcopy(model).to(torch.bfloat16) if job == "triage" else None
    runs = {
        "train_step": train_step,
        "forward": lambda: model(small) if job == "forward" else None,
        "gradients": lambda: diagnose.gradients(model, loss_fn, x),
        "mismatch": lambda: diagnose.mismatch(model, x),
        "triage": lambda: diagnose.triage(model, low, small),
        "determinism": lambda: diagnose.determinism(model, x, threads=(1, 2)),
    }
    fn = runs[job]
    with torch.no_grad() if job == "forward" else torch.enable_grad():
        cold = _peak_extra(fn)
        warm = _peak_extra(fn)
        times, cpus = [], []  # at least 3 runs, up to 50 while they take under a second in all
        while len(times) < 3 or (sum(times) < 1.0 and len(times) < 50):
            t, c = time.perf_counter(), time.process_time()
            fn()
            times.append(time.perf_counter() - t)
            cpus.append(time.process_time() - c)
    return {"params": n, "seconds": min(times), "cpu": min(cpus), "model_mib": model_mib,
            "cold_mib": cold, "warm_mib": warm}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--small", action="store_true", help="only the 10^5-parameter model")
    ap.add_argument("--one", nargs=2, metavar=("SIZE", "JOB"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one:
        print(json.dumps(one(*args.one)))
        return
    sizes = ["1e5"] if args.small else list(SIZES)
    print("one thread; triage and forward on a 2 x 32 batch, the rest on 8 x 64 tokens;")
    print("memory: peak MiB of one call beyond the resident memory before it, and / model;")
    print("cpu: the process's CPU seconds (best run) and their multiple, steadier than the")
    print("wall clock on a loaded machine (determinism runs 2 threads: its CPU time adds both)")
    print(f"{'model':>5} {'params':>8} {'job':>11} {'seconds':>8} {'multiple':>14} "
          f"{'cpu s':>7} {'cpu x':>6} {'cold MiB':>8} {'/ model':>7} {'warm MiB':>8} {'/ model':>7}")
    for size in sizes:
        res = {}
        for job in JOBS:
            out = subprocess.run([sys.executable, __file__, "--one", size, job],
                                 capture_output=True, text=True, check=True)
            res[job] = json.loads(out.stdout.strip().splitlines()[-1])
        for job in JOBS:
            r = res[job]
            base = res["forward" if job == "triage" else "train_step"]
            if job in ("train_step", "forward"):
                mult, cpu_x = "-", "-"
            else:
                mult = f"{r['seconds'] / base['seconds']:.1f} x " + (
                    "forward" if job == "triage" else "step")
                cpu_x = f"{r['cpu'] / base['cpu']:.1f}"
            mm = r["model_mib"] or math.nan
            print(f"{size:>5} {r['params']:>8} {job:>11} {r['seconds']:>8.4f} {mult:>14} "
                  f"{r['cpu']:>7.4f} {cpu_x:>6} {r['cold_mib']:>8.1f} {r['cold_mib'] / mm:>7.2f} "
                  f"{r['warm_mib']:>8.1f} {r['warm_mib'] / mm:>7.2f}")


if __name__ == "__main__":
    main()
