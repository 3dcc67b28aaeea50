"""Chapter 9's end-to-end runs: a small MLP trained with all three matrix products quantized.

Every linear layer of a 64-128-128-32 GELU network learns a teacher network's outputs
(inputs with two outlier channels at 20x) with Adam, its forward, input-gradient and
weight-gradient products quantized by one recipe (precisionlab.chapters.matrix_products:
BF16, per-tensor FP8 HYBRID, MXFP8, NVFP4 with 2D weight blocks, Hadamard transforms on
the weight-gradient inputs and stochastic rounding of the gradients, and NVFP4 with each of
those taken away or with the last layer in BF16), 600 steps each. Run from the repository
root:

    python3 scripts/ch9_three_products.py             # writes data/ch9_three_products.json + .npz
    python3 scripts/ch9_three_products.py --steps 40  # a quick look (prints, writes nothing)
    python3 scripts/ch9_three_products.py --seed 1
        # a second draw of data, teacher, initial weights and rounding streams, for the
        # chapter's seed-to-seed comparison: writes data/ch9_three_products_seed1.json + .npz
    python3 scripts/ch9_three_products.py --study wgrad [--seed 1]
        # the weight-gradient study (matrix_products.WGRAD_RECIPES: plain MXFP4, and MXFP4
        # and NVFP4 with the weight-gradient product's operands in BF16) on the same task:
        # writes data/ch9_wgrad.json (data/ch9_wgrad_seed1.json) + .npz

The arithmetic is precisionlab.emulate's, so the stored losses are the same on every
machine and thread count; the chapter re-runs the first steps of some runs in a hidden cell
and compares them exactly.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import asdict
from pathlib import Path

import numpy as np
import torch

from precisionlab.chapters import matrix_products as mp
from precisionlab.rl.stored import provenance

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "data" / "ch9_three_products.json"
STUDIES = {"ablations": (mp.THREE_PRODUCT_RECIPES, OUT),
           "wgrad": (mp.WGRAD_RECIPES, OUT.with_name("ch9_wgrad.json"))}
STEPS = 600
LR = 3e-3


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=STEPS)
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--study", choices=list(STUDIES), default="ablations",
                    help="which set of recipes (default: the recipes and NVFP4's ablations)")
    ap.add_argument("--recipes", nargs="+", default=None,
                    choices=mp.THREE_PRODUCT_RECIPES + mp.WGRAD_RECIPES)
    args = ap.parse_args(argv)
    names, out = STUDIES[args.study]
    if args.recipes is None:
        args.recipes = list(names)
    if args.out is None:
        args.out = out if args.seed == 0 else out.with_name(f"{out.stem}_seed{args.seed}.json")
    torch.set_num_threads(1)
    task = mp.ThreeProductTask(seed=args.seed)
    runs = {}
    for name in args.recipes:
        t = time.perf_counter()
        runs[name] = mp.train_three_products(task, name, args.steps, lr=LR).losses.tolist()
        print(f"{name:<32} {time.perf_counter() - t:6.1f} s  last loss {runs[name][-1]:.4g}",
              flush=True)
    if args.steps != STEPS:
        return 0
    # The losses, exact, in the .npz beside the JSON (meta data), as chapter 6 stores its runs.
    np.savez_compressed(args.out.with_suffix(".npz"),
                        **{f"run{i}": np.array(v) for i, v in enumerate(runs.values())})
    doc = {"provenance": provenance(argv if argv is not None else sys.argv),
           "task": asdict(task), "steps": args.steps, "lr": LR, "runs": list(runs),
           "arrays": args.out.with_suffix(".npz").name}
    args.out.write_text(json.dumps(doc, indent=1) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
