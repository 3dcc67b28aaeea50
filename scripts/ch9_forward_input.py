"""Chapter 9's forward-input runs: a linear layer trained with only its forward input quantized.

quantize_runs.forward_input_runs: 512 tokens of 128 channels (channels 17 and 90 at 100x),
targets from the ordinary channels, one linear layer learning W from zero with Adam
(learning rate 1e-2, 120 steps) through emulate.QuantizedLinear, its input x quantized once
by each recipe (float32, fp8_tensor, mxfp8, fp4_tensor, mxfp4, nvfp4) and dy per tensor in
E5M2. Run from the repository root:

    python3 scripts/ch9_forward_input.py   # writes data/ch9_forward_input.json + .npz

The arithmetic is precisionlab.emulate's, so the stored losses and weights are the same on
every machine and thread count; the chapter re-runs the first steps of every run in a
hidden cell and compares them exactly.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

from precisionlab.chapters import quantize_runs
from precisionlab.rl.stored import provenance

OUT = Path(__file__).resolve().parents[1] / "data" / "ch9_forward_input.json"
STEPS = 120


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    t = time.perf_counter()
    runs = quantize_runs.forward_input_runs(STEPS, seed=0)
    for name, run in runs.items():
        print(f"{name:<12} last loss {run.losses[-1]:.4g}")
    meta = {"provenance": provenance(argv if argv is not None else sys.argv),
            "steps": STEPS, "seed": 0, "lr": 1e-2}
    quantize_runs.save_quantized_runs(args.out, runs, meta)
    print(f"wrote {args.out} ({time.perf_counter() - t:.1f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
