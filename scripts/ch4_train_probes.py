"""Chapter 4's training probes: 8 SGD steps of the attenuating network, three ways, stored.

precisionlab.chapters.underflow_runs.CHAPTER_RUNS lists them (float32, float16, float16 with
float32 master weights; a = 0.82, 96 layers, lr 0.1, seed 0). They are the chapter's
evidence of which layers stop learning, and took about 2 s of its cold start; computed here
once, they are stored whole (the losses and each step's per-layer gradient statistics) in
data/ch4_train_probes.json and .npz with the command and the versions. The arithmetic is
precisionlab.emulate's, so the stored bits are the same on every machine: chapter 4's hidden
cell re-runs the first step of each (the pass on the initial weights),
tests/test_chapters_underflow_runs.py all eight steps, the updates included.

Run (from the repository root):

    python3 scripts/ch4_train_probes.py            # writes data/ch4_train_probes.json + .npz
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch

from precisionlab.chapters import underflow_runs
from precisionlab.rl import provenance
from precisionlab.underflow import train_probe

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "data" / underflow_runs.STORED_TRAIN_PROBES


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args()
    torch.set_num_threads(1)
    start = time.perf_counter()
    runs = [(kw, train_probe(**kw)) for kw in underflow_runs.CHAPTER_RUNS]
    runtime = time.perf_counter() - start
    meta = {"description": "Chapter 4's training probes, see scripts/ch4_train_probes.py",
            **provenance(), "runtime_s": round(runtime, 1)}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    underflow_runs.save_train_probes(args.out, runs, meta)
    print(f"wrote {args.out} and {args.out.with_suffix('.npz').name} ({len(runs)} runs) in "
          f"{runtime:.0f} s")


if __name__ == "__main__":
    main()
