"""Chapter 6's repeated runs, stored so that the chapter replays them instead of training them.

Chapter 6's two key runs on seed 0 (the matched and mismatched runs at eps = 0.2, which a
reader follows step by step) are stored whole by scripts/ch6_key_runs.py. Everything else it
shows is stored here, trained once on seeds 0, 1 and 2, because a training run is chaotic in
its seed and the chapter repeats its central contrasts on three seeds: the matched and
mismatched runs at eps = 0.2 (every step recorded, gradient reports at steps 3 and 20), the
same pair at eps = 0.05 (gradient reports at steps 3 and 20), the convergence table's other
rows (fp32 engine, fp16 on both sides, lr x10, bf16-stored weights at both rates), the
interventions at eps = 0.2 (ratio = 1, ratio from the shadow forward, eps = 10, detached and
detached-centred weights) and the two fixes at eps = 0.05 (ratio from the shadow forward,
detached weights). The file holds every run's per-step log, its gradient reports and the
recorded runs' per-step mean token weight mu_W, in data/ch6_seeds.json and .npz, with the
command, the versions and the seeds. Seed 0 of the key runs is stored here too, so that the
chapter can check the two files against each other, step for step; hidden cells re-run the
first steps of the others.

Run (from the repository root):

    python3 scripts/ch6_seeds.py            # writes data/ch6_seeds.json + .npz

The arithmetic is precisionlab.emulate's, so the stored numbers are the same on every
machine and thread count; tests/test_rl_stored.py and hidden cells of chapter 6 re-run stored runs
and compare them bit for bit, and the chapter checks that its run configurations are the
stored ones.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import asdict
from pathlib import Path

import torch

from precisionlab import rl
from precisionlab.chapters import rl_findings as findings
from precisionlab.rl import with_changes

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "data" / "ch6_seeds.json"

POLICY = rl.PolicyConfig()  # the chapter's policy
LR_LOW, LR_HIGH = 1.5e-4, 1.5e-3
STEPS = 30
SEEDS = (0, 1, 2)
RECORDED = ("bf16 trainer (matched)", "fp32 trainer (mismatched)")  # every step recorded
GRADIENT_STEPS = (3, 20)  # gradient reports of the recorded runs and the eps = 0.05 pair
REPORTED = (*RECORDED, "matched, eps 0.05", "mismatched, eps 0.05")  # gradient reports


def runs() -> dict[str, rl.RunConfig]:
    """The chapter's runs by the names its cells give them (run name -> config)."""
    base = rl.RunConfig(trainer="fp32", engine="bf16", lr=LR_LOW, steps=STEPS)
    bf16_weights = with_changes(base, master="bf16", trainer="bf16")
    return {
        "bf16 trainer (matched)": with_changes(base, trainer="bf16"),
        "fp32 trainer (mismatched)": base,
        "matched, eps 0.05": with_changes(base, trainer="bf16", eps_low=0.05,
                                          eps_high=0.05),
        "mismatched, eps 0.05": with_changes(base, eps_low=0.05, eps_high=0.05),
        "fp32 trainer, fp32 engine": with_changes(base, engine="fp32"),
        "fp32 trainer, lr x10": with_changes(base, lr=LR_HIGH),
        "bf16 weights": bf16_weights,
        "bf16 weights, lr x10": with_changes(bf16_weights, lr=LR_HIGH),
        "fp16 trainer, fp16 engine": with_changes(base, trainer="fp16", engine="fp16"),
        "ratio = 1": with_changes(base, ratio_mode="one"),
        "ratio from shadow": with_changes(base, ratio_mode="shadow"),
        "eps = 10": with_changes(base, eps_low=10.0, eps_high=10.0),
        "detached weights": with_changes(base, weight_mode="detached"),
        "detached, centred": with_changes(base, weight_mode="detached_centered"),
        "ratio from shadow, eps 0.05": with_changes(base, eps_low=0.05, eps_high=0.05,
                                                    ratio_mode="shadow"),
        "detached weights, eps 0.05": with_changes(base, eps_low=0.05, eps_high=0.05,
                                                   weight_mode="detached"),
    }


def train_seed(seed: int, configs: dict[str, rl.RunConfig],
               steps: int | None = None) -> dict[str, rl.RunLog]:
    """Every run on one seed; the recorded runs keep every step, the reported ones gradients."""
    out = {}
    for name, run in configs.items():
        run = run if steps is None else with_changes(run, steps=steps)
        out[name] = rl.train(POLICY, run, seed=seed, progress=False,
                             record=range(run.steps) if name in RECORDED else (),
                             gradients=GRADIENT_STEPS if name in REPORTED else ())
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args()
    torch.set_num_threads(1)
    configs = runs()
    start = time.perf_counter()
    logs = {seed: train_seed(seed, configs) for seed in SEEDS}
    runtime = time.perf_counter() - start
    weight_means = {f"{seed}.{name}": findings.weight_means(logs[seed][name])
                    for seed in SEEDS for name in RECORDED}
    for seed in SEEDS:
        for log in logs[seed].values():
            log.policy, log.snapshots = None, {}  # not stored
    meta = {
        "description": "Chapter 6's repeated runs on seeds 0, 1 and 2: per-step logs, "
                       "gradient reports and per-step mu_W, see scripts/ch6_seeds.py",
        **rl.provenance(),
        "runtime_s": round(runtime, 1),
        "policy": asdict(POLICY),
        "recorded": list(RECORDED),
        "gradient_steps": list(GRADIENT_STEPS),
        "reported": list(REPORTED),
        "weight_means": weight_means,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    rl.save_runs(args.out, logs, meta)
    print(f"wrote {args.out} and {args.out.with_suffix('.npz').name} in {runtime:.0f} s")
    for name in configs:
        print(f"{name:>28}: steps to -2 {findings.steps_to_target(logs, name)}, final "
              f"{[round(logs[s][name].final_reward(), 2) for s in SEEDS]}")


if __name__ == "__main__":
    main()
