"""The closed loop: generate, sync, score, update (GRPO with Adam), logged step by step."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import torch
from tqdm.auto import tqdm

from .. import emulate as E
from ..formats import get_format
from .engine import Engine, sequence_logprobs
from .gradients import gradient_report
from .grpo import classify_clipping, clipped, group_advantages, log_ratio_split, surrogate_loss
from .native_adam import TorchAdam
from .policy import EOS, Policy, PolicyConfig
from .runs import STEP_FIELDS, RunConfig, RunLog
from .serving import make_engine
from .stats import fcorr, fexp, fmean, fstd

__all__ = ["train", "train_many", "train_seeds"]


def _start(policy_cfg: PolicyConfig, run: RunConfig, seed: int):
    """(policy, optimizer, engine) at step 0: weights stored in the master format, the engine synced."""
    policy = Policy(policy_cfg, seed)
    if run.backend == "native":
        if run.master != "fp32":
            # True low-precision weights: Adam's updates are computed and added in bf16.
            for p in policy.parameters():
                p.data = p.data.to(get_format(run.master).torch_dtype)
        # torch.optim.Adam's single-tensor step (foreach=False, the CPU default): bf16
        # weights keep bf16 moments and are updated in bf16.
        opt = TorchAdam(policy.parameters(), lr=run.lr)
        return policy, opt, Engine(policy, run.engine, "native")
    master = E.Precision(run.master)
    with torch.no_grad():
        for p in policy.parameters():  # weights stored in the master format (float32 tensors)
            p.copy_(master.round(p))
    # Adam's step is about lr per weight whatever the gradient's size, so chapter 1's
    # boundary-crossing arithmetic applies. emulate.Adam: float64 inside, m, v and the
    # weights stored in the master format, the same bits on every machine.
    opt = E.Adam(policy.parameters(), lr=run.lr, prec=master)
    return policy, opt, make_engine(policy, run.engine, run.kernel)


def _train(policy_cfg: PolicyConfig, run: RunConfig, seed: int, tick, record=(),
           gradients=()) -> RunLog:
    """One run of `train`; tick(reward) is called after every step."""
    policy, opt, engine = _start(policy_cfg, run, seed)
    g_sample = torch.Generator().manual_seed(seed + 1)
    log = {k: np.zeros(run.steps) for k in STEP_FIELDS}
    snapshots, reports = {}, {}
    for step in range(run.steps):
        rollout = engine.generate(run.group_size, g_sample)
        if run.staleness:  # the next batch comes from these weights: one step behind
            log["changed"][step] = engine.sync(policy)
        if step in gradients:
            reports[step] = gradient_report(policy, rollout, run)
        adv = group_advantages(rollout.rewards, run.group_size)
        logp = sequence_logprobs(policy, rollout, run.trainer, run.backend)
        with torch.no_grad():
            if run.staleness and run.backend == "emulated":
                # The engine was just synced to fl(W_k): its weights are the shadow's.
                lp = engine.logprobs(*rollout.token_inputs(policy.bos))
                shadow = rollout.scatter(
                    lp.gather(-1, rollout.tokens[rollout.mask][:, None]).squeeze(-1))
            else:
                shadow = sequence_logprobs(policy, rollout, run.engine, run.backend)
        alpha, beta = log_ratio_split(logp.detach(), shadow, rollout.old_logp)
        loss = surrogate_loss(logp, rollout.old_logp, adv, rollout.mask, run.eps_low,
                              run.eps_high, run.ratio_mode, run.weight_mode, shadow)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if not run.staleness:
            log["changed"][step] = engine.sync(policy)
        with torch.no_grad():
            after = sequence_logprobs(policy, rollout, run.engine, run.backend)
        m = rollout.mask
        a_tok = adv[:, None].expand_as(m)
        used = {"actual": alpha + beta, "shadow": alpha, "one": torch.zeros_like(alpha)}
        dead = clipped(fexp(used[run.ratio_mode]), a_tok, run.eps_low, run.eps_high)
        if run.weight_mode != "ppo":
            dead = torch.zeros_like(dead)  # detached weights have no zero-gradient branch
        cls = classify_clipping(alpha, beta, a_tok, run.eps_low, run.eps_high)[m]
        delta = (after - shadow)[m]
        log["reward"][step] = fmean(rollout.rewards)
        log["clip"][step] = fmean(dead[m])
        log["phantom"][step] = fmean(cls == 1)
        log["legitimate"][step] = fmean(cls == 2)
        log["alpha_abs"][step] = fmean(alpha[m].abs())
        log["beta_abs"][step] = fmean(beta[m].abs())
        log["beta_mean"][step] = fmean(beta[m])
        log["beta_std"][step] = fstd(beta[m])
        log["deployed"][step] = fmean(delta * torch.sign(a_tok[m]))
        log["moved"][step] = fmean(delta.abs())
        a = alpha[m].to(torch.float64)
        log["kl"][step] = fmean(E.exp64(a) - 1 - a)
        log["beta_beyond"][step] = fmean(beta[m].abs() > 0.2)
        log["beta_adv_corr"][step] = fcorr(beta[m], a_tok[m])
        if step in record:
            snapshots[step] = {
                "alpha": alpha[m].numpy().copy(), "beta": beta[m].numpy().copy(),
                "adv": a_tok[m].numpy().copy(), "logp": shadow[m].numpy().copy(),
                "eos": (rollout.tokens[m] == EOS).numpy().copy(),
            }
        tick(log["reward"][step])
    return RunLog(config=run, snapshots=snapshots, gradients=reports, policy=policy, **log)


def train(policy_cfg: PolicyConfig, run: RunConfig, seed: int = 0, progress: bool = True,
          record: Sequence[int] = (), gradients: Sequence[int] = ()) -> RunLog:
    """GRPO on the immediate-EOS task (reward = -length), one optimizer step per generated batch."""
    # Per step: the engine samples group_size completions per prompt, syncs to fl(W) (before the
    # update when run.staleness = 1, so the next batch is one step stale), the trainer scores the
    # batch in run.trainer precision and the shadow forward in run.engine precision, and Adam
    # takes one step on the clipped surrogate. `record`: steps whose per-token alpha, beta,
    # advantage, log-prob and EOS flag are kept; `gradients`: steps with a `gradient_report`.
    # Policy weights come from `seed`, the sampling stream from seed + 1.
    with tqdm(total=run.steps, desc=run.label, disable=not progress) as bar:
        def tick(reward):
            bar.update()
            bar.set_postfix(reward=f"{reward:.2f}", refresh=False)

        return _train(policy_cfg, run, seed, tick, record, gradients)


def train_many(policy_cfg: PolicyConfig, runs: Mapping[str, RunConfig], seed: int = 0,
               progress: bool = True, desc: str = "training",
               record: Sequence[int] = (), gradients: Sequence[int] = ()) -> dict[str, RunLog]:
    """`train` for each named run, same seed (same initial policy and sampling stream), one progress bar."""
    out = {}
    with tqdm(total=sum(r.steps for r in runs.values()), desc=desc, disable=not progress) as bar:
        for name, run in runs.items():
            bar.set_postfix_str(name, refresh=False)
            out[name] = _train(policy_cfg, run, seed, lambda _r: bar.update(), record, gradients)
    return out


def train_seeds(policy_cfg: PolicyConfig, runs: Mapping[str, RunConfig], seeds: Sequence[int],
                progress: bool = True, desc: str = "seeds", record: Sequence[int] = (),
                gradients: Sequence[int] = (),
                gradient_seeds: Sequence[int] | None = None) -> dict[int, dict[str, RunLog]]:
    """`train_many` for each seed (seed -> name -> RunLog), one progress bar: for results that are chaotic in the seed."""
    # record: as in `train`, for every seed (snapshots cost nothing); gradients: as in `train`,
    # for the seeds in gradient_seeds only (default: the first seed; each report costs several
    # backward passes).
    chosen = seeds[:1] if gradient_seeds is None else list(gradient_seeds)
    if not set(chosen) <= set(seeds):
        raise ValueError(f"gradient_seeds must be among seeds; got gradient_seeds={chosen!r}, "
                         f"valid choices: {list(seeds)!r}")

    out: dict[int, dict[str, RunLog]] = {}
    total = len(seeds) * sum(r.steps for r in runs.values())
    with tqdm(total=total, desc=desc, disable=not progress) as bar:
        for seed in seeds:
            out[seed] = {}
            for name, run in runs.items():
                bar.set_postfix_str(f"seed {seed}, {name}", refresh=False)
                out[seed][name] = _train(policy_cfg, run, seed, lambda _r: bar.update(),
                                         record, gradients if seed in chosen else ())
    return out
