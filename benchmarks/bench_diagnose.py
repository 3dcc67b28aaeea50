#!/usr/bin/env python3
"""Each diagnose function's time and peak memory as a multiple of one forward (triage) or one
training step (gradients, mismatch, determinism), on four models readers have: a tiny GPT-2 and
a tiny BERT (transformers configs, random weights, a tokenizer-like dict batch with padding), a
CNN with batch norm and pooling on images, and an MLP of about 10^7 parameters.

Goals (issue 35): triage <= 30x a forward in time and <= 3x in memory; gradients and mismatch
within 3x a training step at 10^7 parameters. A training step is forward, backward and an AdamW
step; triage compares the model with its bfloat16 copy (cast_inputs=True for the float inputs),
mismatch float32 with bfloat16, determinism 1 and 2 threads with the gradients.

Method. One thread (torch.set_num_threads(1)); each (model, job) in a fresh subprocess, with the
model, batch, optimizer and bfloat16 copy built before anything is measured. Time: the process's
CPU time (time.process_time, which a machine shared with other work disturbs less than the wall
clock) of the best of at least 3 runs, after a cold run (which pays the one-time imports,
numba's cache and thread pools). Memory: what the call holds, the bytes of the model's
parameters and buffers, the batch and what the job keeps besides (the optimizer's state for a
training step, the bfloat16 copy for triage), plus the peak resident memory of one warm call
beyond the resident memory just before it, read from /proc/self/status (VmHWM after writing 5
to /proc/self/clear_refs, which resets the peak: Linux only), so torch's own allocations
count, which tracemalloc does not see. "x" columns divide by the same numbers for the base job
(forward or training step) of the same model.

    python3 benchmarks/bench_diagnose.py              # all four models
    python3 benchmarks/bench_diagnose.py --models mlp cnn
"""

from __future__ import annotations

import argparse
import copy
import gc
import inspect
import json
import os
import subprocess
import sys
import time

MODELS = ("gpt2", "bert", "cnn", "mlp")
JOBS = ("forward", "train_step", "gradients", "mismatch", "triage", "determinism")
BASE = {"triage": "forward", "gradients": "train_step", "mismatch": "train_step",
        "determinism": "train_step"}


def build(name: str):
    """(model, batch, loss_fn, targets for mismatch) of one model, seeded."""
    import torch
    import torch.nn.functional as F
    from torch import nn

    torch.manual_seed(0)
    g = torch.Generator().manual_seed(1)
    if name in ("gpt2", "bert"):
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        import transformers
        transformers.logging.set_verbosity_error()
        ids = torch.randint(1, 100, (4, 32), generator=g)
        mask = torch.ones_like(ids)
        mask[1, 20:] = 0
        batch = {"input_ids": ids.masked_fill(mask == 0, 0), "attention_mask": mask}
        if name == "gpt2":
            model = transformers.GPT2LMHeadModel(transformers.GPT2Config(
                n_layer=2, n_embd=32, n_head=4, vocab_size=100, n_positions=32,
                bos_token_id=0, eos_token_id=0))

            def loss_fn(out):
                return F.cross_entropy(out.logits[:, :-1].reshape(-1, 100),
                                       ids[:, 1:].reshape(-1))
            return model.eval(), batch, loss_fn, None
        model = transformers.BertForSequenceClassification(transformers.BertConfig(
            num_hidden_layers=2, hidden_size=32, num_attention_heads=4, intermediate_size=64,
            vocab_size=100, num_labels=3, max_position_embeddings=32))
        labels = torch.randint(0, 3, (4,), generator=g)
        return model.eval(), batch, lambda out: F.cross_entropy(out.logits, labels), labels
    if name == "cnn":
        model = nn.Sequential(
            nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(16, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(),
            nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(32, 10))
        x = torch.randn(8, 3, 32, 32, generator=g)
    else:  # an MLP of 10.5M parameters
        model = nn.Sequential(nn.Linear(1024, 2048), nn.ReLU(), nn.Linear(2048, 2048),
                              nn.ReLU(), nn.Linear(2048, 2048), nn.ReLU(), nn.Linear(2048, 10))
        x = torch.randn(32, 1024, generator=g)
    labels = torch.randint(0, 10, (x.shape[0],), generator=g)
    return model.eval(), x, lambda out: F.cross_entropy(out, labels), labels


def _status(key: str) -> float:
    """VmRSS or VmHWM (peak) of this process in MiB."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) / 1024
    raise RuntimeError(f"/proc/self/status has no {key}")


def _peak(fn) -> float:
    """Peak resident memory of this process while fn() runs, in MiB."""
    gc.collect()
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # resets VmHWM to the current resident memory
    fn()
    return _status("VmHWM")


def one(name: str, job: str) -> dict:
    """One job on one model: CPU seconds of the best run, peak MiB of a warm call."""
    import torch

    from precisionlab import diagnose
    from precisionlab.diagnose.batch import as_inputs, call

    torch.set_num_threads(1)
    model, batch, loss_fn, targets = build(name)
    inputs = as_inputs(batch)
    n = sum(p.numel() for p in model.parameters())
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)

    def train_step():
        loss = loss_fn(call(model, inputs))
        opt.zero_grad()
        loss.backward()
        opt.step()

    def forward():
        with torch.no_grad():
            call(model, inputs)

    cast = ({"cast_inputs": True}
            if "cast_inputs" in inspect.signature(diagnose.triage).parameters else {})
    low = copy.deepcopy(model).to(torch.bfloat16) if job == "triage" else None
    runs = {
        "forward": forward,
        "train_step": train_step,
        "gradients": lambda: diagnose.gradients(model, loss_fn, batch),
        "mismatch": lambda: diagnose.mismatch(model, batch, targets=targets),
        "triage": lambda: diagnose.triage(model, low, batch, **cast),
        "determinism": lambda: diagnose.determinism(model, batch, threads=(1, 2),
                                                    loss_fn=loss_fn),
    }
    fn = runs[job]
    try:
        fn()  # cold: imports, numba's cache, first-touch allocations
    except Exception as e:  # reported in the table
        return {"params": n, "error": f"{type(e).__name__}: {str(e).splitlines()[0][:60]}"}
    gc.collect()
    before = _status("VmRSS")
    held = [*model.parameters(), *model.buffers(), *(x for x in inputs if torch.is_tensor(x))]
    if low is not None:
        held += [*low.parameters(), *low.buffers()]
    if job == "train_step":
        held += [v for st in opt.state.values() for v in st.values() if torch.is_tensor(v)]
    mib = _peak(fn) - before + sum(t.numel() * t.element_size() for t in held) / 2**20
    cpus = []
    while len(cpus) < 3 or (sum(cpus) < 1.0 and len(cpus) < 20):
        c = time.process_time()
        fn()
        cpus.append(time.process_time() - c)
    return {"params": n, "cpu": min(cpus), "mib": mib}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", choices=MODELS, default=list(MODELS))
    ap.add_argument("--one", nargs=2, metavar=("MODEL", "JOB"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one:
        print(json.dumps(one(*args.one)))
        return
    print("one thread; CPU seconds of the best run; MiB: the model, batch and state the job")
    print("holds plus the peak of one warm call beyond the resident memory before it; x:")
    print("divided by the forward (triage) or the training step (the others) of that model")
    print(f"{'model':>5} {'params':>9} {'job':>11} {'cpu s':>8} {'x':>6} {'peak MiB':>8} "
          f"{'x':>6}")
    for name in args.models:
        res = {}
        for job in JOBS:
            out = subprocess.run([sys.executable, __file__, "--one", name, job],
                                 capture_output=True, text=True, check=True)
            res[job] = json.loads(out.stdout.strip().splitlines()[-1])
        for job in JOBS:
            r = res[job]
            if "error" in r:
                print(f"{name:>5} {r['params']:>9} {job:>11}  {r['error']}")
                continue
            base = res.get(BASE.get(job, ""), {})
            tx = f"{r['cpu'] / base['cpu']:.1f}" if "cpu" in base else "-"
            mx = (f"{r['mib'] / base['mib']:.1f}" if base.get("mib", 0) > 0.5 else "-")
            print(f"{name:>5} {r['params']:>9} {job:>11} {r['cpu']:>8.4f} {tx:>6} "
                  f"{r['mib']:>8.1f} {mx:>6}")


if __name__ == "__main__":
    main()
