"""Chapter 6's phantom-clipping explorer: a short GRPO run and its matched partner, eps moving."""

from __future__ import annotations

import pickle
from collections import OrderedDict
from collections.abc import Mapping
from functools import lru_cache, partial, update_wrapper

from matplotlib.figure import Figure

from ..checks import check_real
from ..plotting import plot_run_metric, rc_snapshot
from ..rl import PolicyConfig, RunConfig, RunLog, train, with_changes
from .frames import interactive
from .view import TextPanel

__all__ = ["PHANTOM_GRID", "phantom_explorer", "phantom_view", "trained"]

# Each eps trains two runs; the step slider (phantom_explorer adds it, 0..steps-1) re-reads them.
PHANTOM_GRID: dict[str, tuple] = {"eps": (0.05, 0.2, 10.0)}


@lru_cache(maxsize=8)
def trained(cfg: PolicyConfig, run: RunConfig, seed: int):
    """rl.train(cfg, run, seed=seed), computed once per argument set (views of one run share it)."""
    return train(cfg, run, seed=seed, progress=False)


def _run(runs: Mapping | None, cfg: PolicyConfig, run: RunConfig, seed: int) -> RunLog:
    """runs[(trainer, eps)] if given (its config must be `run`), else trained(cfg, run, seed)."""
    key = (run.trainer, run.eps_low)
    if not runs or key not in runs:
        return trained(cfg, run, seed)
    log = runs[key]
    if not isinstance(log, RunLog) or log.config != run:
        got = log.config if isinstance(log, RunLog) else log
        raise ValueError(f"runs[{key!r}] must be the RunLog of {run!r} (seed {seed}); got {got!r}")
    return log


def phantom_view(engine: str = "bf16", trainer: str = "fp32", eps: float = 0.2,
                 lr: float = 5e-5, steps: int = 25, seed: int = 0,
                 step: int | None = None, runs: Mapping | None = None) -> tuple[TextPanel, Figure]:
    """A short GRPO run (rl.train) and its matched partner (trainer = engine): reward and clipping per step."""
    # runs: optional {(trainer, eps): RunLog} of runs already trained with this seed and
    # PolicyConfig() (a chapter's own); each is used where its config is the one asked for,
    # the others are trained. Only time changes: rl.train is deterministic.
    run = RunConfig(trainer=trainer, engine=engine, lr=check_real(lr, "lr"),
                    eps_low=check_real(eps, "eps"), eps_high=check_real(eps, "eps"),
                    steps=int(steps))  # RunConfig names the valid choices on bad input
    if step is not None and (isinstance(step, bool) or step != int(step) or not 0 <= step < steps):
        raise ValueError(f"step must be a whole number in [0, steps={steps}); got step={step!r}")
    cfg = PolicyConfig()
    log = _run(runs, cfg, run, int(seed))
    # The matched partner (trainer = engine, same seed and eps): the convergence contrast.
    ref = log if trainer == engine else _run(runs, cfg, with_changes(run, trainer=engine),
                                             int(seed))
    early = slice(0, min(5, steps))
    lines = [
        f"{trainer} trainer, {engine} engine, eps {eps:g}, lr {lr:g}, {steps} steps",
        f"reaches -2 at step: {log.steps_to(-2.0)} (matched {engine} trainer: "
        f"{ref.steps_to(-2.0)}; None = not within {steps} steps)",
        f"first 5 steps: mean |beta| {log.beta_abs[early].mean():.3f}, "
        f"clipped {log.clip[early].mean():.1%}",
        f"               (phantom {log.phantom[early].mean():.1%}, "
        f"legitimate {log.legitimate[early].mean():.1%})",
        f"mean reward  : {log.reward[early].mean():.2f} in the first 5 steps, "
        f"{log.reward[-5:].mean():.2f} in the last 5",
    ]
    if step is not None:
        k = int(step)
        lines.append(f"step {step}: reward {log.reward[k]:.2f} (matched {ref.reward[k]:.2f}), "
                     f"clipped {log.clip[k]:.1%}, phantom {log.phantom[k]:.1%}")
    fig = _runs_figure(log, ref, trainer, engine, cfg.max_len, step is not None)
    if step is not None:  # the step the slider points at: each Axes' last line
        for ax in fig.axes:
            ax.lines[-1].set_xdata([int(step)] * 2)
    return TextPanel("\n".join(lines)), fig


# The last few runs figures: {n: (log, ref, trainer, engine, max_len, marked, rcParams, pickled
# Figure)}. The explorer draws one pair of runs once per step; a copy of the drawn pair takes
# a third of the time of drawing it again, and the step's marker is all that differs. An entry
# holds its logs (compared by identity), so no other log can take their place.
_DRAWN: OrderedDict[int, tuple] = OrderedDict()
_DRAWN_MAX = 4


def _runs_figure(log: RunLog, ref: RunLog, trainer: str, engine: str, max_len: int,
                 marked: bool) -> Figure:
    """A new Figure of the two runs' reward and clipping per step; marked: a step marker at 0."""
    # The marker, a vertical line, is each Axes' last artist; moving it within the runs'
    # steps changes neither Axes' data limits, so a copy with it moved is the marked figure.
    rc = rc_snapshot()
    for key, (a, b, *rest, pickled) in _DRAWN.items():
        if a is log and b is ref and rest == [trainer, engine, max_len, marked, rc]:
            _DRAWN.move_to_end(key)
            return pickle.loads(pickled)
    fig = Figure(figsize=(9.0, 3.4))
    ax_r, ax_c = fig.subplots(1, 2)
    plot_run_metric({f"{trainer} trainer": log, f"{engine} trainer (matched)": ref}, "reward",
                    ax=ax_r, ylabel="mean reward (-length)",
                    styles={f"{engine} trainer (matched)": {"color": "#999999", "ls": "--"}})
    ax_r.axhline(-2, color="#999999", lw=1, ls=":")
    ax_r.set_ylim(-max_len - 0.5, 0)
    ax_r.legend(loc="lower right", fontsize=8.5)
    ax_c.plot(log.clip, label="all clipped", color="#555555")
    ax_c.plot(log.phantom, label="phantom", color="#D55E00")
    ax_c.set_ylim(bottom=0)
    ax_c.set_xlabel("optimizer step")
    ax_c.set_ylabel("fraction of tokens")
    ax_c.set_title("Tokens in a dead zone")
    ax_c.legend()
    if marked:
        for ax in (ax_r, ax_c):
            ax.axvline(0, color="#555555", lw=1, ls="--")
    fig.set_layout_engine("tight")  # laid out when drawn (live widget, PNG), not per view
    _DRAWN[max(_DRAWN, default=-1) + 1] = (log, ref, trainer, engine, max_len, marked, rc,
                                           pickle.dumps(fig))
    while len(_DRAWN) > _DRAWN_MAX:
        _DRAWN.popitem(last=False)
    return fig


def phantom_explorer(engine: str = "bf16", trainer: str = "fp32", eps: float = 0.2,
                     lr: float = 5e-5, steps: int = 25, seed: int = 0,
                     runs: Mapping | None = None):
    """interactive(phantom_view, PHANTOM_GRID + step 0..steps-1, ...): eps and the step inspected move."""
    # runs: as in phantom_view; bound to the view, so the control's id and frames are those
    # of the explorer without it.
    grid = {**PHANTOM_GRID, "step": tuple(range(int(steps)))}
    view = phantom_view
    if runs:
        runs = dict(runs)
        for trainer_, eps_ in runs:  # a wrong log raises here, not in one frame's panel
            _run(runs, PolicyConfig(), RunConfig(
                trainer=trainer_, engine=engine, lr=lr, eps_low=eps_, eps_high=eps_,
                steps=int(steps)), int(seed))
        view = update_wrapper(partial(phantom_view, runs=runs), phantom_view)
    return interactive(view, grid, engine=engine, trainer=trainer, eps=eps,
                       lr=lr, steps=steps, seed=seed, step=int(steps) - 1)
