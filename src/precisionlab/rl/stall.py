"""Does the mismatched run stall? Steps to a target set relative to the start, and the row that says so.

The source's headline (seed 001, section 1 and 7.7) is that at a low learning rate the fp32
trainer against a bf16 engine never converges while the matched run does, that its deployed
improvement per step is several times smaller, and that the fixes rescue it. `stall_summary`
measures exactly that on stored runs (or on logs in memory), seed by seed: a run reaches its
target when the 5-step moving average of its reward has covered `fraction` of the way from
its start (the mean of its first 5 rewards) to the optimum -1 (an immediate EOS). A seed
*stalls* if the matched run reaches its target and the mismatched run never does within its
log (which must run past that step), *lags* if the mismatched run gets there later, and is
*level* otherwise; it is *undecided* if the matched run never gets there either.

Two figures do not depend on where a log ends, once the runs they compare have arrived: the
*slowdown* (the mismatched run's steps to target over the matched run's; until it arrives, only
a lower bound, its log's length over the matched run's steps) and the *progress at the matched
target* (how much of its own way to -1 the mismatched run has covered at the step where the
matched run reaches its target). Each run is measured on its
own log, so a run may be logged longer than the others (a run extended to see if it arrives).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from ..checks import check_choice, check_count, check_positive
from ..tables import Table, show
from .runs import RunLog
from .source import SOURCE
from .stats import fmean
from .stored import load_runs

__all__ = ["SOURCE_REWARDS", "STALL_HEADERS", "STALL_VERDICTS", "StallSeed", "StallSummary",
           "progress", "source_stall_row", "stall_summary", "stall_table", "target_reward"]

STALL_VERDICTS: tuple[str, ...] = ("stall", "lag", "level", "undecided")
STALL_HEADERS: tuple[str, ...] = (
    "configuration", "steps to target, matched / mismatched",
    "mismatched (x matched's steps)", "mismatched's progress at matched's target",
    "deployed per step, matched / mismatched", "efficiency, matched / mismatched",
    "early phantom / legit.", "SNR", "rescued by")
OPTIMUM = -1.0  # reward of an immediate EOS
WINDOW = 5  # steps of the moving average (RunLog.steps_to's default)
# The source's reward trajectories (seed 001, section 7.7), (from, to) over its 100 steps: the
# matched run converged from -109 to -20, the mismatched one stayed between -101 and -96.
SOURCE_REWARDS: dict[str, tuple[float, float]] = {"matched": (-109.0, -20.0),
                                                  "mismatched": (-101.0, -96.0)}


def target_reward(log: RunLog, fraction: float = 0.5, start: int = 5) -> float:
    """R_0 + fraction (-1 - R_0), R_0 = the mean reward of the first `start` steps."""
    if not 0 < fraction <= 1:
        raise ValueError(f"fraction must lie in (0, 1]; got fraction={fraction!r}")
    r0 = _start_reward(log, start)
    return r0 + fraction * (OPTIMUM - r0)


def _start_reward(log: RunLog, start: int) -> float:
    """R_0, the mean reward of the first `start` steps."""
    if isinstance(start, bool) or not isinstance(start, int) or not 1 <= start <= len(log.reward):
        raise ValueError(f"start must be an integer in [1, {len(log.reward)}]; got start={start!r}")
    return fmean(log.reward[:start])


def progress(log: RunLog, step: int, start: int = 5) -> float | None:
    """(A_step - R_0) / (-1 - R_0): A_step the 5-step moving average ending at `step`, R_0 the mean of the first `start` rewards (None: step not logged)."""
    check_count(step, "step", WINDOW - 1)
    r0 = _start_reward(log, start)
    if step >= len(log.reward):
        return None
    return (fmean(log.reward[step - WINDOW + 1:step + 1]) - r0) / (OPTIMUM - r0)


def _steps(log: RunLog, fraction: float) -> int | None:
    """First step whose 5-step moving average reaches the run's own target (None: never)."""
    return log.steps_to(target_reward(log, fraction))


def _verdict(matched: int | None, mismatched: int | None, logged: int) -> str:
    """stall: matched arrives, mismatched never in its `logged` steps (> matched's); lag: later; level: not later; else undecided."""
    if matched is None or (mismatched is None and logged <= matched):
        return "undecided"
    return "stall" if mismatched is None else "lag" if mismatched > matched else "level"


def _times(ratio: tuple[float, bool] | None) -> str:
    """'3.67x' for a ratio, '>1.77x' for a lower bound (shown rounded down), '?' for none."""
    if ratio is None:
        return "?"
    value, bound = ratio
    if not bound:
        return f"{value:.2f}x"
    shown = math.floor(value * 100) / 100
    return f">{shown:.2f}x" if shown < value else f">={shown:.2f}x"


def _ratio(a: float, b: float) -> float:
    """a / b (nan where b = 0)."""
    return a / b if b else math.nan


@dataclass(frozen=True)
class StallSeed:
    """One seed's measurements: steps to target per run, and the mismatched run's early clipping and noise."""

    seed: int
    start: float  # mean reward of the matched run's first 5 steps
    steps: dict  # run name -> steps to its target (None: never)
    final: dict  # run name -> mean reward of the last 10 steps
    deployed: tuple[float, float]  # mean deployed improvement per step, matched / mismatched
    efficiency: tuple[float, float]  # mean deployed / mean moved, matched / mismatched
    phantom: float  # mismatched: mean phantom-clipped share over the early steps
    legitimate: float  # mismatched: mean legitimately clipped share over the early steps
    snr: float  # mismatched: mean over the window (from step 1) of mean|alpha| / mean|beta|
    verdict: str  # one of STALL_VERDICTS
    logged: dict = field(default_factory=dict)  # run name -> steps in its log
    covered: dict = field(default_factory=dict)  # run name -> `progress` at matched's target

    @property
    def progress_at_matched(self) -> float | None:
        """The mismatched run's progress (fraction of its way to -1) when the matched run reaches its target (None: it never does)."""
        return self.covered.get("mismatched")

    def slowdown(self, run: str = "mismatched") -> tuple[float, bool] | None:
        """(steps of `run` / steps of matched, False), or (its logged steps / matched's, True): a lower bound, when `run` never arrives; None if matched never does or `run`'s log ends first."""
        m, x = self.steps["matched"], self.steps[run]
        if m is None:
            return None
        if x is not None:
            return x / m, False
        n = self.logged.get(run, 0)
        return (n / m, True) if n > m else None

    def slowdown_label(self, run: str = "mismatched") -> str:
        """`slowdown(run)` as text: '3.67x', '>1.77x' for a lower bound (rounded down), '?' for none."""
        return _times(self.slowdown(run))


@dataclass(frozen=True)
class StallSummary:
    """Every seed's `StallSeed`, the verdict over seeds and which fixes rescue or speed up the mismatched run."""

    name: str
    seeds: tuple[StallSeed, ...]
    fixes: tuple[str, ...]
    fraction: float
    steps: int
    labels: dict = field(default_factory=dict)  # fix run name -> its name in the row

    @property
    def verdict(self) -> str:
        """The seeds' common verdict, or "mixed" if they differ."""
        vs = {s.verdict for s in self.seeds}
        return vs.pop() if len(vs) == 1 else "mixed"

    def rescued(self) -> dict[str, str]:
        """Per fix: "rescues" (reaches target on every stalled seed, if any), "faster" (earlier than the mismatched run on every decided seed), else "no"."""
        decided = [s for s in self.seeds if s.verdict != "undecided"]
        stalled = [s for s in decided if s.verdict == "stall"]
        out = {}
        for fix in self.fixes:
            if stalled and all(s.steps[fix] is not None for s in stalled):
                out[fix] = "rescues"
            elif decided and all(s.steps[fix] is not None and (
                    s.steps["mismatched"] is None or s.steps[fix] < s.steps["mismatched"])
                    for s in decided):
                out[fix] = "faster"
            else:
                out[fix] = "no"
        return out

    def row(self) -> tuple[str, ...]:
        """The table row (STALL_HEADERS): per seed values separated by commas, '-' for never."""
        def show(x):
            return "-" if x is None else str(x)

        def part(x):
            return "?" if x is None else f"{x:.1%}"

        def pairs(key, fmt):
            return "; ".join(f"{format(getattr(s, key)[0], fmt)} / {format(getattr(s, key)[1], fmt)}"
                             for s in self.seeds)

        rescue = self.rescued()
        return (
            self.name,
            "; ".join(f"{show(s.steps['matched'])} / {show(s.steps['mismatched'])}"
                      for s in self.seeds),
            ", ".join(s.verdict if s.slowdown() is None
                      else f"{s.verdict} ({s.slowdown_label()})" for s in self.seeds),
            ", ".join("-" if s.steps["matched"] is None else part(s.progress_at_matched)
                      for s in self.seeds),
            pairs("deployed", "+.5f"),
            pairs("efficiency", ".1%"),
            "; ".join(f"{s.phantom:.1%} / {s.legitimate:.1%}" for s in self.seeds),
            ", ".join(f"{s.snr:.2f}" for s in self.seeds),
            ", ".join(f"{self.labels.get(f, f)} ({v})" for f, v in rescue.items()
                      if v != "no") or "-",
        )


def stall_summary(source, name: str = "stall configuration",
                  fixes: Sequence[str] | Mapping[str, str] | None = None,
                  fraction: float = 0.5, window: int = 100, early: int = 10,
                  matched: str = "matched", mismatched: str = "mismatched") -> StallSummary:
    """Steps to target (fraction of the way from the start to -1), deployed improvement, early phantom share and SNR per seed."""
    # source: a path written by rl.save_runs, or logs seed -> run name -> RunLog holding
    # "matched" and "mismatched" runs. window: the first steps over which deployed improvement,
    # efficiency and SNR are averaged (the source's runs were 100 steps); early: the first steps
    # over which the phantom share is averaged. fixes: run names tried on the mismatched run
    # (default: every run but those two), or a mapping run name -> the label the row shows;
    # matched, mismatched: the names of those two runs.
    logs: Mapping[int, Mapping[str, RunLog]] = (
        load_runs(source)[1] if isinstance(source, str | Path) else source)
    check_positive(window, "window")
    check_positive(early, "early")
    seeds = sorted(logs)
    if not seeds:
        raise ValueError("source holds no seeds")
    names = list(logs[seeds[0]])
    pair = {"matched": check_choice(matched, "matched run name", names),
            "mismatched": check_choice(mismatched, "mismatched run name", names)}
    labels = dict(fixes) if isinstance(fixes, Mapping) else {}
    fixes = tuple(n for n in names if n not in pair.values()) if fixes is None \
        else tuple(check_choice(f, "fix run name", names) for f in fixes)
    w, e = slice(0, int(window)), slice(0, int(early))
    out = []
    for seed in seeds:
        runs = {**logs[seed], **{k: logs[seed][v] for k, v in pair.items()}}
        m, mm = runs["matched"], runs["mismatched"]
        steps = {n: _steps(runs[n], fraction) for n in ("matched", "mismatched", *fixes)}
        k = steps["matched"]
        out.append(StallSeed(
            seed=seed, start=fmean(m.reward[:5]), steps=steps,
            final={n: runs[n].final_reward() for n in steps},
            deployed=(fmean(m.deployed[w]), fmean(mm.deployed[w])),
            efficiency=(_ratio(fmean(m.deployed[w]), fmean(m.moved[w])),
                        _ratio(fmean(mm.deployed[w]), fmean(mm.moved[w]))),
            phantom=fmean(mm.phantom[e]), legitimate=fmean(mm.legitimate[e]),
            snr=fmean(mm.snr()[w][1:]),
            verdict=_verdict(k, steps["mismatched"], len(mm.reward)),
            logged={n: len(runs[n].reward) for n in steps},
            covered={} if k is None else {n: progress(runs[n], k) for n in steps
                                           if n != "matched"}))
    return StallSummary(name, tuple(out), fixes, fraction, len(m.reward), labels)


def source_stall_row() -> tuple[str, ...]:
    """The source's figures (rl.SOURCE, SOURCE_REWARDS, typed from its text) in the STALL_HEADERS columns."""
    s = SOURCE
    (m0, m1), (lo, hi) = SOURCE_REWARDS["matched"], SOURCE_REWARDS["mismatched"]
    most = (hi - lo) / (OPTIMUM - lo)  # the most a run kept in [lo, hi] can cover
    return ("source (Qwen3-0.6B, 100 steps)", f"converges / never ({lo:g} to {hi:g})",
            "stall", f"<= {most:.0%} (matched: {m0:g} to {m1:g})",
            s["deployed"].value, s["efficiency"].value,
            s["phantom_step5"].value + " (step 5)", s["snr"].value, s["fixes"].value)


def stall_table(summaries: Sequence[StallSummary], source: bool = True) -> Table:
    """A tables.Table of `StallSummary.row` per configuration, under the source's row if `source`."""
    rows = ([source_stall_row()] if source else []) + [s.row() for s in summaries]
    return show(rows, STALL_HEADERS, width=80, key=1)
