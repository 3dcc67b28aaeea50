"""Chapter 6 at the source's scale: a configuration chosen to make the mismatched run stall, if it can.

The source's conditions, each set here on purpose:

* long completions: the untrained policy stops rarely (completions of about 50 tokens on
  average over the three seeds, cut at 64);
* a vocabulary of 2048 entries whose logits spread over many binades (token-dependent
  std 12, no common offset), so that rare entries sit on other parts of the bf16 grid
  than the likely ones;
* four residual blocks in bf16 arithmetic, the initial weights on the bf16 grid (a
  checkpoint released in bf16), so beta starts from activation rounding alone;
* an engine that samples with a *serving kernel* (`rl.ServingEngine`): the same bf16 weights,
  but products summed in another fixed order and log-probabilities returned in bf16, so that
  alpha carries an inference-kernel term as in the source (whose vLLM differs from its
  trainer's bf16 forward);
* a learning rate by the source's rule: about 1% of the engine's bf16 weights change at the
  first sync (0.94% on seed 0);
* small groups (4 prompts x 8 completions), so that updates are dominated by noise.

Seven runs (the matched and mismatched runs and every fix chapter 6 shows) and three more at
eps = 0.05 (matched, mismatched and the shadow-ratio fix: the same beta against a clip range
four times narrower, a larger dose of phantom clipping) are each repeated for three seeds,
300 steps each. Run (from the repository root):

    python3 scripts/rl_stall.py                 # writes data/rl_stall.json + .npz (2 processes)
    python3 scripts/rl_stall.py --jobs 1        # one process (same results, bit for bit)
    python3 scripts/rl_stall.py --probe         # 40 steps, seed 0, matched and mismatched only
    python3 scripts/rl_stall.py --runs fp16 --out a.json  # some runs; --merge joins such files

The eps = 0.05 runs again, four times longer (their first 300 steps are the stored ones, bit
for bit), and seed 2's mismatched run, whose matched run arrives late, longer still:

    python3 scripts/rl_stall.py --runs matched_narrow mismatched_narrow shadow_ratio_narrow \\
        --steps 1200 --out data/rl_stall_long.json --jobs 2        # about 25 min on 2 cores
    python3 scripts/rl_stall.py --runs mismatched_narrow --seeds 2 --steps 2400 \\
        --out data/rl_stall_seed2.json --jobs 1                   # about 10 min on 1 core

The arithmetic is precisionlab.emulate's, so the stored numbers are the same on every
machine, thread count and process layout; tests/test_rl_stall.py re-runs the first steps and
compares them exactly (and that the long runs continue the stored ones).
`rl.stall_summary("data/rl_stall.json")` reads the verdict.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import sys
import time
from dataclasses import asdict
from pathlib import Path

import torch

from precisionlab import rl
from precisionlab.rl import with_changes

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "data" / "rl_stall.json"

POLICY = rl.PolicyConfig(vocab=2048, n_prompts=4, max_len=64, width=64, hidden=128, depth=4,
                         logit_offset=0.0, logit_spread=12.0, eos_logit=11.0, checkpoint="bf16")
LR = 1.5e-5  # 0.94% of the bf16 weights change at the first sync (seed 0; stored per seed)
STEPS = 300
SEEDS = (0, 1, 2)
GRADIENT_STEPS = (3, 50, 100)  # gradient_report of the matched and mismatched runs, first seed
BANDS = ((-5.0, 0.0), (-10.0, -5.0), (-20.0, -10.0), (-400.0, -20.0))  # log-prob bands


def runs(steps: int = STEPS) -> dict[str, rl.RunConfig]:
    """The matched and mismatched runs and chapter 6's fixes, all against the bf16 serving engine."""
    base = rl.RunConfig(trainer="fp32", engine="bf16", lr=LR, steps=steps, kernel="serving")
    return {
        "matched": with_changes(base, trainer="bf16"),
        "mismatched": base,
        "eps10": with_changes(base, eps_low=10.0, eps_high=10.0),
        "shadow_ratio": with_changes(base, ratio_mode="shadow"),
        "fp16": with_changes(base, trainer="fp16", engine="fp16"),
        "detached": with_changes(base, weight_mode="detached"),
        "detached_centered": with_changes(base, weight_mode="detached_centered"),
        # eps = 0.05: the same beta against a clip range four times narrower (the dose)
        "matched_narrow": with_changes(base, trainer="bf16", eps_low=0.05, eps_high=0.05),
        "mismatched_narrow": with_changes(base, eps_low=0.05, eps_high=0.05),
        "shadow_ratio_narrow": with_changes(base, ratio_mode="shadow", eps_low=0.05,
                                            eps_high=0.05),
    }


LABELS = {
    "matched": "bf16 trainer (matched)",
    "mismatched": "fp32 trainer (mismatched)",
    "eps10": "fp32 trainer, eps = 10",
    "shadow_ratio": "fp32 trainer, ratio from shadow",
    "fp16": "fp16 trainer, fp16 engine",
    "detached": "fp32 trainer, detached weights",
    "detached_centered": "fp32 trainer, detached centred weights",
    "matched_narrow": "bf16 trainer (matched), eps = 0.05",
    "mismatched_narrow": "fp32 trainer (mismatched), eps = 0.05",
    "shadow_ratio_narrow": "fp32 trainer, ratio from shadow, eps = 0.05",
}


def _one(task):
    """Train one (seed, run id); for the first seed also gradient reports and beta by band."""
    seed, name, run, first = task
    torch.set_num_threads(1)
    key = first and name in ("matched", "mismatched")
    extra = {"bands_init": rl.band_report(rl.Policy(POLICY, seed), BANDS, seed)} if key else {}
    log = rl.train(POLICY, run, seed=seed, progress=False,
                   gradients=GRADIENT_STEPS if key else ())
    if key:
        extra["gradients"] = {str(k): v for k, v in log.gradients.items()}
        extra["bands_final"] = rl.band_report(log.policy, BANDS, seed)
    log.policy = None  # not stored
    return seed, name, log, extra


def _probe(steps: int) -> None:
    """Print the probe numbers: a few steps of the matched and mismatched runs, seed 0."""
    torch.set_num_threads(1)
    for name in ("matched", "mismatched"):
        start = time.process_time()
        log = rl.train(POLICY, runs(steps)[name], seed=SEEDS[0], progress=False)
        cpu = (time.process_time() - start) / steps
        eff = rl.fmean(log.deployed) / rl.fmean(log.moved)
        print(f"{name:>10}: {cpu:.2f} CPU s/step, reward {log.reward[0]:.1f} -> "
              f"{log.final_reward(5):.1f}, first sync {log.changed[1]:.2%}, "
              f"std beta {rl.fmean(log.beta_std):.3f}, |beta|>0.2 {rl.fmean(log.beta_beyond):.1%}, "
              f"phantom {rl.fmean(log.phantom):.2%}, legit. {rl.fmean(log.legitimate):.2%}, "
              f"efficiency {eff:.1%}, deployed {rl.fmean(log.deployed):+.5f}, "
              f"SNR {rl.fmean(log.snr()[1:]):.2f}")


def _merge(paths: list[Path], out: Path) -> None:
    """One stored file from several of this script's (runs of the same policy, seeds and steps)."""
    parts = [rl.load_runs(p) for p in paths]
    for m, _ in parts:  # the steps of every run (files from before "steps" was stored)
        m.setdefault("steps", next(iter(m["runs"].values()))["steps"])
    meta = dict(parts[0][0])
    for m, _ in parts[1:]:
        for key in ("policy", "seeds", "steps", "precisionlab_version", "torch_version",
                    "numpy_version", "numba_version", "python_version"):
            if m[key] != meta[key]:
                raise ValueError(f"--merge needs files with the same {key}; got {meta[key]!r} "
                                 f"and {m[key]!r}")
    logs = {s: {k: v for _, lg in parts for k, v in lg[s].items()} for s in meta["seeds"]}
    meta["labels"] = {k: v for m, _ in parts for k, v in m["labels"].items()}
    meta["extras"] = {k: v for m, _ in parts for k, v in m["extras"].items()}
    meta["runtime_s"] = round(sum(m["runtime_s"] for m, _ in parts), 1)
    meta["command"] = " && ".join([*(m["command"] for m, _ in parts), "python3 " + " ".join(
        [Path(sys.argv[0]).as_posix(), *sys.argv[1:]])])
    meta.pop("seeds"), meta.pop("fields"), meta.pop("runs"), meta.pop("arrays")
    rl.save_runs(out, logs, meta)
    print(f"wrote {out} from {', '.join(map(str, paths))}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=STEPS)
    ap.add_argument("--seeds", type=int, nargs="+", default=list(SEEDS))
    ap.add_argument("--runs", nargs="+", default=list(LABELS), choices=list(LABELS))
    ap.add_argument("--jobs", type=int, default=2, help="worker processes (results do not depend on it)")
    ap.add_argument("--out", type=Path, default=OUT)
    ap.add_argument("--probe", action="store_true", help="only print 40 steps of seed 0")
    ap.add_argument("--merge", type=Path, nargs="+", metavar="JSON",
                    help="write --out from files this script stored (same policy, seeds and "
                         "steps; their runs in order) instead of training")
    args = ap.parse_args()
    if args.probe:
        _probe(40 if args.steps == STEPS else args.steps)
        return
    if args.merge:
        _merge(args.merge, args.out)
        return
    from tqdm import tqdm

    configs = {k: v for k, v in runs(args.steps).items() if k in args.runs}
    tasks = [(seed, name, run, seed == args.seeds[0])
             for seed in args.seeds for name, run in configs.items()]
    logs: dict[int, dict[str, rl.RunLog]] = {seed: {} for seed in args.seeds}
    extras: dict[str, dict] = {}
    start = time.perf_counter()
    with tqdm(total=len(tasks) * args.steps, desc="stall", unit="step") as bar:
        def done(result):
            seed, name, log, extra = result
            logs[seed][name] = log
            extras.update({f"{name}.{k}": v for k, v in extra.items()})
            bar.update(args.steps)

        if args.jobs > 1:
            with mp.get_context("spawn").Pool(args.jobs) as pool:
                for result in pool.imap_unordered(_one, tasks):
                    done(result)
        else:
            for task in tasks:
                done(_one(task))
    runtime = time.perf_counter() - start
    logs = {seed: {name: logs[seed][name] for name in configs} for seed in args.seeds}
    command = "python3 " + " ".join([Path(sys.argv[0]).as_posix(), *sys.argv[1:]])
    meta = {
        "description": "Chapter 6 at the source's scale (long completions, 2048-entry "
                       "vocabulary, serving kernel, 1%-first-sync learning rate): per-step "
                       "logs of every run and seed, see scripts/rl_stall.py",
        **rl.provenance(),
        "command": command,
        "runtime_s": round(runtime, 1),
        "jobs": args.jobs,
        "steps": args.steps,
        "policy": asdict(POLICY),
        "labels": {k: LABELS[k] for k in configs},
        "gradient_steps": list(GRADIENT_STEPS),
        "bands": [list(b) for b in BANDS],
        "extras": extras,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    rl.save_runs(args.out, logs, meta)
    print(f"wrote {args.out} and {args.out.with_suffix('.npz').name} in {runtime:.0f} s")
    if {"matched", "mismatched"} <= set(configs) and args.steps >= 10:
        print(rl.stall_table([rl.stall_summary(logs)]).to_text())


if __name__ == "__main__":
    main()
