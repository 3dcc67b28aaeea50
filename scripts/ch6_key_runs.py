"""Chapter 6's key runs on seed 0, stored whole so that the chapter replays them.

The matched (bf16 trainer) and mismatched (fp32 trainer) runs at eps = 0.2 are the input of
most of chapter 6's tables and figures: every step's per-token alpha, beta and advantage
(`record`), the gradient reports of steps 3 and 20 and the two trained policies. The third,
the matched run at eps = 10, is the one run the chapter's explorer would otherwise train
(the matched partner of the eps = 10 fix). Training them took a third of the chapter's cold
run; they are trained here once and stored with
everything the chapter reads from them (per-step logs, snapshots, gradient reports and the
final weights, `rl.save_runs(with_state=True)`) in data/ch6_key_runs.json and .npz, with the
command and the versions. The arithmetic is precisionlab.emulate's, so the stored bits are
the same on every machine and thread count: a hidden cell of chapter 6 and
tests/test_rl_stored.py re-run the first steps and compare every number, and the chapter
checks the file against seed 0 of data/ch6_seeds.json (scripts/ch6_seeds.py) step for step.

Run (from the repository root):

    python3 scripts/ch6_key_runs.py            # writes data/ch6_key_runs.json + .npz
"""

from __future__ import annotations

import argparse
import time
from dataclasses import asdict
from pathlib import Path

import torch

from precisionlab import rl
from precisionlab.rl import with_changes

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "data" / "ch6_key_runs.json"

POLICY = rl.PolicyConfig()  # the chapter's policy
SEED = 0
STEPS = 30
GRADIENT_STEPS = (3, 20)


def runs() -> dict[str, rl.RunConfig]:
    """The key runs by the names chapter 6 gives them (run name -> config)."""
    base = rl.RunConfig(trainer="fp32", engine="bf16", lr=1.5e-4, steps=STEPS)
    return {"bf16 trainer (matched)": with_changes(base, trainer="bf16"),
            "fp32 trainer (mismatched)": base,
            "matched, eps 10": with_changes(base, trainer="bf16", eps_low=10.0,
                                            eps_high=10.0)}


def train(steps: int | None = None) -> dict[str, rl.RunLog]:
    """The key runs as chapter 6 trains them (every step recorded, gradient reports)."""
    configs = {k: v if steps is None else with_changes(v, steps=steps)
               for k, v in runs().items()}
    n = min(c.steps for c in configs.values())
    return rl.train_many(POLICY, configs, seed=SEED, record=range(n),
                         gradients=[s for s in GRADIENT_STEPS if s < n], progress=False)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args()
    torch.set_num_threads(1)
    start = time.perf_counter()
    logs = train()
    runtime = time.perf_counter() - start
    meta = {
        "description": "Chapter 6's key runs on seed 0 with per-token snapshots of every "
                       "step, gradient reports and final weights, see scripts/ch6_key_runs.py",
        **rl.provenance(),
        "runtime_s": round(runtime, 1),
        "policy": asdict(POLICY),
        "gradient_steps": list(GRADIENT_STEPS),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    rl.save_runs(args.out, {SEED: logs}, meta, with_state=True)
    print(f"wrote {args.out} and {args.out.with_suffix('.npz').name} in {runtime:.0f} s")


if __name__ == "__main__":
    main()
