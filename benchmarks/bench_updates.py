"""Chapter 1's training comparison: train_master_vs_lowprec per storage policy.

Run: python benchmarks/bench_updates.py [--repeats 5]
Each timing is the median of `repeats` runs after one warm-up run. Goal: all four policies of
the chapter's 300-step run together well under a second (about 0.3 s on an idle core), so
chapter 1 stays inside its 20 s budget. The test suite no longer asserts a wall-clock time.
"""

from __future__ import annotations

import argparse

from bench_rounding import median_seconds  # same timing rule as the rounding benchmark

from precisionlab import updates


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    print(f"train_master_vs_lowprec, 300 steps, median of {args.repeats}")
    print(f"{'policies':<40} {'seconds':>8}")
    for policies in [(p,) for p in updates.POLICIES] + [updates.POLICIES]:
        t = median_seconds(lambda p=policies: updates.train_master_vs_lowprec(policies=p),
                           args.repeats)
        print(f"{', '.join(policies):<40} {t:>8.3f}")
    t = median_seconds(lambda: updates.train_master_vs_lowprec(optimizer="adam", lr=3e-3),
                       args.repeats)
    print(f"{'fp32, bf16, master (adam)':<40} {t:>8.3f}")


if __name__ == "__main__":
    main()
