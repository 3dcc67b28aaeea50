"""Chapter 4's explorer input: one backward pass of the attenuating network at each grid point.

With `network` ticked, chapter 4's underflow explorer (precisionlab.widgets.underflow) draws
the real network's median |dL/dh| beside the attenuation model and fits g0 to the float32
pass: 36 passes of a 96-layer AttenuatingNet (width 64, batch 16, seed 0), one for every
attenuation of UNDERFLOW_GRID in float16, bfloat16 and float32. They are the explorer's
input, not its lesson, and took most of its cell's cold run; they are computed here once
and stored whole (loss, and norm, median, largest entry, share of zeros and finiteness of
dL/dW and dL/dh per layer) in data/ch4_network_probes.json and .npz, with the command and
the versions. The arithmetic is precisionlab.emulate's, so the stored bits are the same on
every machine and thread count: a hidden cell of chapter 4 compares the three passes at
a = 0.82 with the ones it runs, chapter 5 the float32 one, and
tests/test_widgets_underflow.py recomputes others, bit for bit.

Run (from the repository root):

    python3 scripts/ch4_network_probes.py            # writes data/ch4_network_probes.json + .npz
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch

from precisionlab.rl import provenance
from precisionlab.widgets import underflow as explorer

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "data" / explorer.STORED_PROBES
DEPTH, SEED = 96, 0  # the explorer's defaults


def keys() -> list[tuple[int, float, str, int]]:
    """(depth, attenuation, format, seed) of every pass the explorer's grid draws."""
    return [(DEPTH, a, fmt, SEED) for a in explorer.UNDERFLOW_GRID["attenuation"]
            for fmt in explorer.UNDERFLOW_GRID["fmt"]]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args()
    torch.set_num_threads(1)
    start = time.perf_counter()
    probes = {k: explorer.compute_network_probe(*k) for k in keys()}
    runtime = time.perf_counter() - start
    meta = {"description": "Chapter 4's explorer input: one backward pass of AttenuatingNet "
                           "per grid point, see scripts/ch4_network_probes.py",
            **provenance(), "runtime_s": round(runtime, 1)}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    explorer.save_network_probes(args.out, probes, meta)
    print(f"wrote {args.out} and {args.out.with_suffix('.npz').name} ({len(probes)} passes)"
          f" in {runtime:.0f} s")


if __name__ == "__main__":
    main()
