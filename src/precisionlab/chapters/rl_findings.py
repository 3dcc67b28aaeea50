"""Chapter 6: judging the source's findings on the book's runs (the verdict rules, the
evidence, the tally)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from .. import emulate as E
from ..checks import check_choice, check_positive
from ..rl.grpo import token_weights
from ..rl.runs import RunLog
from ..rl.source import SOURCE, reproduces
from ..rl.stats import fmean, fstd

__all__ = ["CONVERGE_KEYS", "VERDICTS", "Evidence", "evidence_from_runs", "grows",
           "normal_outside", "source_findings", "steps_to_target", "tally", "weight_mean",
           "weight_means"]

VERDICTS: tuple[str, ...] = ("yes", "partly", "mixed", "no", "set", "untestable")


def normal_outside(mean: float, std: float, lo: float, hi: float) -> float:
    """P(X < lo) + P(X > hi) for X ~ N(mean, std^2) (math.erfc): a Gaussian estimate of a tail share."""
    check_positive(std, "std")
    if not lo <= hi:
        raise ValueError(f"lo must not exceed hi; got lo={lo!r}, hi={hi!r}")
    z = math.sqrt(2.0) * std
    return 0.5 * math.erfc((mean - lo) / z) + 0.5 * math.erfc((hi - mean) / z)


def grows(early, late, z: float = 2.0) -> bool:
    """mean(late) - mean(early) > z sqrt(var(early)/n_e + var(late)/n_l): a rise beyond z standard errors."""
    e = np.asarray(early, dtype=np.float64).reshape(-1)
    lt = np.asarray(late, dtype=np.float64).reshape(-1)
    if e.size < 2 or lt.size < 2 or not (np.all(np.isfinite(e)) and np.all(np.isfinite(lt))):
        raise ValueError(f"early and late need >= 2 finite values each; got {e.size} and {lt.size}")
    se = math.sqrt(fstd(e) ** 2 / e.size + fstd(lt) ** 2 / lt.size)
    return fmean(lt) - fmean(e) > z * se


def weight_mean(snapshot: Mapping[str, np.ndarray], eps_low: float = 0.2,
                eps_high: float = 0.2) -> float:
    """mu_W = mean_t min(r_t A_t, clip(r_t) A_t), r_t = e^(alpha_t + beta_t), over a recorded step's tokens."""
    alpha, beta, adv = (torch.as_tensor(snapshot[k], dtype=torch.float64)
                        for k in ("alpha", "beta", "adv"))
    return fmean(token_weights(E.exp64(alpha + beta), adv, eps_low, eps_high))


def weight_means(log: RunLog, eps_low: float = 0.2, eps_high: float = 0.2) -> list[float]:
    """mu_W of every recorded step of a run (`weight_mean` of each snapshot), in step order."""
    return [weight_mean(log.snapshots[k], eps_low, eps_high) for k in sorted(log.snapshots)]


def steps_to_target(by_seed: Mapping[int, Mapping[str, RunLog]], name: str,
                    target: float = -2.0) -> list[int | None]:
    """RunLog.steps_to(target) of run `name` on every seed, in seed order (None: never)."""
    return [by_seed[s][name].steps_to(target) for s in sorted(by_seed)]


@dataclass
class Evidence:
    """One configuration's measurements for `source_findings`, per seed (dicts keyed by seed)."""
    # matched / mismatched: the bf16- and fp32-trainer RunLogs (bf16 engine). converge: steps to
    # -2 per seed (lists in seed order) for "lr10", "bf16_weights", "bf16_weights_lr10",
    # "fix_baseline" (the unfixed run the fixes are tried on), "eps10" and "shadow". window: the
    # steps that match the source's 100-step runs; late: the steps standing for "later in
    # training" (the source's step 50). gradients / matched_gradients: gradient_report dicts per
    # seed and step (any seeds). rare: (rare, common) median |beta| on one seed's final policy,
    # or None where the vocabulary has no rare entries; mu_w: per seed (matched, mismatched) mu_W,
    # each a run's mean over its steps as the source reports it; calibrated: SOURCE keys whose
    # value the configuration was chosen to give.

    matched: Mapping[int, RunLog]
    mismatched: Mapping[int, RunLog]
    converge: Mapping[str, Sequence[int | None]]
    window: slice = field(default_factory=lambda: slice(None))
    late: slice = field(default_factory=lambda: slice(-10, None))
    gradients: Mapping[int, Mapping] = field(default_factory=dict)
    matched_gradients: Mapping[int, Mapping] = field(default_factory=dict)
    rare: tuple[float, float] | None = None
    mu_w: Mapping[int, tuple[float, float]] = field(default_factory=dict)
    calibrated: frozenset = frozenset()


CONVERGE_KEYS: tuple[str, ...] = ("lr10", "bf16_weights", "bf16_weights_lr10", "fix_baseline",
                                  "eps10", "shadow")


def evidence_from_runs(by_seed: Mapping[int, Mapping[str, RunLog]], names: Mapping[str, str],
                       gradients: Mapping[int, Mapping] | None = None, **fields) -> Evidence:
    """Evidence from runs by seed (seed -> run name -> RunLog); `names` maps matched, mismatched and each CONVERGE_KEYS entry to a run name."""
    # gradients: by default the mismatched runs' own reports (seeds that have any), and the
    # matched runs' reports as matched_gradients; fields: the other Evidence fields.
    missing = [k for k in ("matched", "mismatched", *CONVERGE_KEYS) if k not in names]
    if missing:
        raise ValueError(f"names must name a run for {', '.join(missing)}; got {dict(names)!r}")
    seeds = sorted(by_seed)
    m, mm = ({s: by_seed[s][names[k]] for s in seeds} for k in ("matched", "mismatched"))
    if gradients is None:
        gradients = {s: mm[s].gradients for s in seeds if mm[s].gradients}
        fields.setdefault("matched_gradients",
                          {s: m[s].gradients for s in seeds if m[s].gradients})
    return Evidence(matched=m, mismatched=mm, gradients=gradients,
                    converge={k: steps_to_target(by_seed, names[k]) for k in CONVERGE_KEYS},
                    **fields)


def _both(verdicts: Sequence[str]) -> str:
    """Within one seed: yes if every part says yes; partly if every part says at least partly; else no."""
    if all(v == "yes" for v in verdicts):
        return "yes"
    return "partly" if all(v in ("yes", "partly") for v in verdicts) else "no"


def _across(verdicts: Sequence[str]) -> str:
    """Over seeds: yes if every seed says yes, partly if every seed at least partly, no if every seed no, else mixed."""
    if not verdicts:
        return "untestable"
    if all(v == "no" for v in verdicts):
        return "no"
    return _both(verdicts) if all(v in ("yes", "partly") for v in verdicts) else "mixed"


def _cap(verdict: str, measured: int, seeds: int) -> str:
    """A row measured on fewer seeds than the configuration has: yes becomes partly, no becomes mixed."""
    if measured >= seeds:
        return verdict
    return {"yes": "partly", "no": "mixed"}.get(verdict, verdict)


def _first(a: int | None, b: int | None) -> str:
    """One seed: yes if a reaches -2 and b never does (None); partly if b does, later than a; else no."""
    if a is None:
        return "no"
    if b is None:
        return "yes"
    return "partly" if b > a else "no"


def _show(xs: Sequence) -> str:
    """Steps to -2 per seed as "a,b,c", "-" for never."""
    return ",".join("-" if x is None else str(x) for x in xs)


def _ratio(a: float, b: float) -> float:
    """a / b, inf (a > 0) or nan where b = 0."""
    return a / b if b else (math.inf if a > 0 else math.nan)


def _finite_mean(reports: Mapping, key: str, steps=None) -> float:
    """Mean of reports[step][key] over `steps` (default all) where it is finite; nan if none is."""
    vals = [r[key] for step, r in reports.items()
            if (steps is None or step in steps) and math.isfinite(r[key])]
    return fmean(vals) if vals else math.nan


def source_findings(ev: Evidence) -> dict[str, tuple[str, str]]:
    """(text, verdict) for every SOURCE finding, judged on every seed of one configuration."""
    # Each seed compares the book's value with the source's by `reproduces`; a row is yes if every
    # seed reproduces it, partly if on every seed at least the source's direction holds, no if no
    # seed shows even the direction, and mixed if the seeds disagree. A seed where the quantity
    # is undefined (every advantage 0 once a run has converged) is left out; a row measured on
    # fewer seeds than the configuration has (gradient reports, the rare-token bands) is at most
    # partly and never no. Rows in ev.calibrated read "set", rows the configuration cannot
    # measure "untestable". Contrasts compare the right baseline: the cosine with the matched
    # run's, a fix with the unfixed run it is tried on; a correlation must rise beyond two
    # standard errors.
    seeds = sorted(ev.mismatched)
    M, Mt = [ev.mismatched[s] for s in seeds], [ev.matched[s] for s in seeds]
    w, late = ev.window, ev.late
    out: dict[str, tuple[str, str]] = {}

    def per_seed(key, vals, fmt, source, dirs=None):
        dirs = dirs if dirs is not None else [False] * len(vals)
        verdict = _across([reproduces(v, source, d) for v, d in zip(vals, dirs, strict=True)])
        out[key] = (", ".join(format(v, fmt) for v in vals), verdict)

    per_seed("beta_std", [fmean(m.beta_std[w]) for m in M], ".3f", 0.149)
    per_seed("beta_beyond", [fmean(m.beta_beyond[w]) for m in M], ".1%", 0.18)
    c3 = [(m.clip[3], t.clip[3]) for m, t in zip(M, Mt, strict=True)]
    out["clip_step3"] = ("; ".join(f"{a:.1%}/{b:.1%}" for a, b in c3), _across(
        [reproduces(_ratio(a, b), 13.5, direction=a > b) for a, b in c3]))
    p5 = [(m.phantom[5], m.legitimate[5]) for m in M]
    out["phantom_step5"] = ("; ".join(f"{a:.1%}/{b:.1%}" for a, b in p5), _across(
        [reproduces(_ratio(a, b), 17.2 / 0.4, direction=a > b) for a, b in p5]))
    per_seed("first_sync", [m.changed[1] for m in M], ".2%", 0.0096)
    per_seed("sync_mean", [fmean(m.changed[w][1:]) for m in M], ".2%", (0.0024, 0.0029))
    growth = [(m.beta_std[0], fmean(m.beta_std[late])) for m in M]
    out["beta_growth"] = ("; ".join(f"{a:.3f}>{b:.3f}" for a, b in growth), _across(
        [reproduces(_ratio(b, a), 0.244 / 0.043, direction=b > a) for a, b in growth]))
    per_seed("snr", [fmean(m.snr()[w][1:]) for m in M], ".2f", 2.82)
    # corr(beta, A) is undefined (nan) at a step whose advantages are all 0: a seed with
    # such a step in either window cannot say whether the correlation rises.
    corr = [(m.beta_adv_corr[slice(0, 10)], m.beta_adv_corr[late]) for m in M]
    defined = [bool(np.all(np.isfinite(a)) and np.all(np.isfinite(b))) for a, b in corr]
    cv = [reproduces(fmean(b), 0.069, direction=True) if grows(a, b) else "no"
          for (a, b), d in zip(corr, defined, strict=True) if d]
    out["corr"] = ("; ".join(f"{fmean(a):+.3f}>{fmean(b):+.3f}" if d else
                             f"{fmean(a):+.3f}>nan" for (a, b), d in zip(corr, defined, strict=True)),
                   _across(cv))
    dep = [_ratio(fmean(t.deployed[w]), fmean(m.deployed[w])) for m, t in zip(M, Mt, strict=True)]
    per_seed("deployed", dep, ".2f", 0.00128 / 0.00023, [d > 1 for d in dep])
    out["deployed"] = (", ".join(f"{d:.2f}x" for d in dep), out["deployed"][1])
    eff = [(_ratio(fmean(t.deployed[w]), fmean(t.moved[w])),
            _ratio(fmean(m.deployed[w]), fmean(m.moved[w]))) for m, t in zip(M, Mt, strict=True)]
    out["efficiency"] = ("; ".join(f"{a:.1%}/{b:.1%}" for a, b in eff), _across(
        [reproduces(_ratio(a, b), 8.2 / 1.3, direction=a > b) for a, b in eff]))
    early_alpha = slice(1, 6)
    al = [(fmean(t.alpha_abs[early_alpha]), fmean(m.alpha_abs[early_alpha]))
          for m, t in zip(M, Mt, strict=True)]
    out["alpha_early"] = ("; ".join(f"{a:.3f}/{b:.3f}" for a, b in al), _across(
        [_both([reproduces(a, 0.035), reproduces(b, 0.035)]) for a, b in al]))
    zero = [float(np.max(np.abs(t.beta_abs))) for t in Mt]
    out["beta_zero"] = (", ".join(f"{z:g}" for z in zero),
                        _across(["yes" if z == 0 else "no" for z in zero]))

    # gradient reports: per seed, the mean over its reported steps where the value is defined
    g = {s: ev.gradients[s] for s in seeds if s in ev.gradients}
    crs = {s: _finite_mean(g[s], "cos_ratio_score") for s in g}
    crs = {s: c for s, c in crs.items() if math.isfinite(c)}
    out["cos_ratio_score"] = (", ".join(f"{c:+.2f}" for c in crs.values()) or "-", _cap(_across(
        [reproduces(c, -0.58, direction=c < 0) for c in crs.values()]), len(g), len(seeds)))
    nc = {s: _finite_mean(g[s], "cos_clean_actual") for s in g}
    nc = {s: c for s, c in nc.items() if math.isfinite(c)}
    out["cos_no_clip"] = (", ".join(f"{c:.3f}" for c in nc.values()) or "-", _cap(_across(
        ["yes" if c > 0.95 else "no" for c in nc.values()]), len(g), len(seeds)))
    # The cosine with the clean REINFORCE gradient, matched against mismatched, over the steps
    # reported for both where both are defined. The size of the effect is the drop below the
    # matched run's cosine, against the source's 1 - cos (its matched run is its clean
    # reference); a drop under a tenth of the source's smallest is no evidence of the direction.
    pairs, reported = {}, [s for s in g if s in ev.matched_gradients]
    for s in reported:
        mg = ev.matched_gradients[s]
        both = [k for k in g[s] if k in mg and math.isfinite(g[s][k]["cos_reinforce"])
                and math.isfinite(mg[k]["cos_reinforce"])]
        if both:
            pairs[s] = (_finite_mean(mg, "cos_reinforce", both),
                        _finite_mean(g[s], "cos_reinforce", both))
    out["cos_reinforce"] = ("; ".join(f"{a:.3f}/{b:.3f}" for a, b in pairs.values()) or "-",
                            _cap(_across([reproduces(a - b, (0.27, 0.45), direction=a - b > 0.027)
                                          for a, b in pairs.values()]), len(reported), len(seeds)))
    # mu_W: the source's claim is that it is the same with and without beta (within 10%, its
    # own gap), near -0.24; the same but at another level is partly.
    mu = [ev.mu_w[s] for s in seeds if s in ev.mu_w]
    out["mu_w"] = ("; ".join(f"{a:+.3f}/{b:+.3f}" for a, b in mu) or "-", _cap(_across(
        [("yes" if _both([reproduces(a, -0.258), reproduces(b, -0.238)]) == "yes" else "partly")
         if abs(b - a) <= 0.1 * abs(a) else "no" for a, b in mu]), len(mu), len(seeds)))

    # convergence, per seed; a fix must rescue (or at least speed up) its unfixed run
    m = [t.steps_to(-2.0) for t in Mt]
    mm = [t.steps_to(-2.0) for t in M]
    c = ev.converge
    out["converge_low"] = (f"{_show(m)} / {_show(mm)}",
                           _across([_first(x, y) for x, y in zip(m, mm, strict=True)]))
    out["converge_high"] = (_show(c["lr10"]),
                            _across(["no" if x is None else "yes" for x in c["lr10"]]))
    bw, bw10 = c["bf16_weights"], c["bf16_weights_lr10"]
    out["bf16_weights"] = (f"{_show(bw)} / {_show(bw10)}",
                           _across([_first(x10, x) for x, x10 in zip(bw, bw10, strict=True)]))
    base = c["fix_baseline"]
    out["fixes"] = (f"{_show(c['eps10'])} / {_show(c['shadow'])} (unfixed {_show(base)})",
                    _across([_both([_first(e, b), _first(sh, b)])
                             for e, sh, b in zip(c["eps10"], c["shadow"], base, strict=True)]))
    # rare tokens: bands measured on one seed's final policy
    if ev.rare is None or not all(math.isfinite(x) for x in ev.rare):
        out["rare"] = ("no entries" if ev.rare is None else
                       " / ".join("-" if not math.isfinite(x) else f"{x:.3f}" for x in ev.rare),
                       "untestable")
    else:
        r, cm = ev.rare
        out["rare"] = (f"{r:.3f} / {cm:.3f}", _cap(
            reproduces(_ratio(r, cm), (25.0, 50.0), direction=r > cm), 1, len(seeds)))
    for key in ev.calibrated:
        check_choice(key, "source finding", SOURCE)
        out[key] = (out[key][0], "set")
    return {k: out[k] for k in SOURCE}


def tally(rows: Mapping[str, tuple[str, str]]) -> dict[str, int]:
    """How many rows got each verdict; 'set' and 'untestable' rows are counted apart, not as evidence."""
    return {v: sum(r[1] == v for r in rows.values()) for v in VERDICTS}
