"""Precision mismatch in RL fine-tuning: a toy policy trained with GRPO against a low-precision
rollout engine, the alpha/beta split of the PPO log-ratio, phantom clipping and its fixes.

The policy's forward runs in fp32, bf16 or fp16 through `precisionlab.emulate`: every weight
is rounded to the format where it is used, matrix products accumulate in fp32 in a fixed
order and round once, norms and the log-softmax are evaluated in float64 and rounded once.
That arithmetic is the same on every CPU and thread count, which a chaotic closed loop
(sampling, then training on the samples) needs: one differing bit anywhere changes the sampled
tokens and the whole run. Matched precisions give bit-identical log-probabilities; without
gradients a fused numba kernel computes exactly the same bits, fast; `backend="native"` runs
torch's own kernels instead (what this machine's hardware gives). Every statistic the book
prints is taken in float64 with fixed-order sums.

Files, one concept each (lowest first):

* `policy`: `PolicyConfig`, `Policy` (the model), the precision names;
* `forward`: the policy's log-probabilities, autograd path and fused kernel (built from
  `emulate.kernels`);
* `engine`: `Rollout`, `Engine` (the low-precision sampler), `sample_tokens`,
  `sequence_logprobs`, `vocabulary_logprobs`;
* `stats`: portable statistics (`fmean`, `fstd`, `fcorr`, ...);
* `grpo`: group advantages, the clipped surrogate and its variants, the alpha/beta split,
  phantom-versus-legitimate clipping;
* `runs`: `RunConfig` and `RunLog`;
* `gradients`: the four-pass gradient decomposition and `gradient_report`;
* `beta`: where beta comes from (`beta_table`, `beta_by_band`, `band_report`, `beta_by_offset`, ...);
* `trainer`: `train`, `train_many`, `train_seeds` (generate, sync, score, update);
* `native_adam`: `TorchAdam`, torch's Adam step for the native back end (no Optimizer built);
* `gathered`: `gathered_log_softmax`, the trainer's log-probability of the sampled token,
  compiled (the same bits as emulate.log_softmax and a gather);
* `serving`: `ServingEngine`, an engine whose serving kernel differs from the shadow forward;
* `stored`: `save_runs`, `load_runs`, `find_stored`, `provenance` for runs too long for a
  chapter;
* `stall`: `stall_summary`, `stall_table`, `progress`: does the mismatched run stall, lag or
  keep level, how much slower, and how far it has got when the matched run arrives;
* `source`: the source study's figures (`SOURCE`), `reproduces`, `comparison_table`.

Chapter 6's verdicts on the source's findings live with the chapter, in
`precisionlab.chapters.rl_findings`.

Randomness: `Policy` and the trainers take a `seed`; `Engine.generate` and `sample_tokens`
continue the stream of a `torch.Generator`.
"""

from .beta import band_report, beta_by_band, beta_by_offset, beta_table, logit_rounding_beta
from .engine import Engine, Rollout, sample_tokens, sequence_logprobs, vocabulary_logprobs
from .forward import policy_logprobs
from .gathered import gathered_log_softmax
from .gradients import GradientDecomposition, four_pass_gradients, gradient_report, policy_gradient
from .grpo import (
    CLIP_CLASSES,
    RATIO_MODES,
    WEIGHT_MODES,
    classify_clipping,
    clipped,
    group_advantages,
    log_ratio_split,
    surrogate_loss,
    token_weights,
)
from .policy import BACKENDS, EOS, MASTER_PRECISIONS, PRECISIONS, Policy, PolicyConfig
from .runs import STEP_FIELDS, RunConfig, RunLog, with_changes
from .serving import KERNELS, ORDERS, ServingEngine, make_engine, permuted_weights
from .source import COMPARISON_HEADERS, SOURCE, SourceFigure, comparison_table, reproduces
from .stall import (
    SOURCE_REWARDS,
    STALL_HEADERS,
    STALL_VERDICTS,
    StallSeed,
    StallSummary,
    progress,
    source_stall_row,
    stall_summary,
    stall_table,
    target_reward,
)
from .stats import fcorr, fmean, fstd
from .stored import find_stored, load_runs, provenance, save_runs
from .trainer import train, train_many, train_seeds

__all__ = [
    "BACKENDS",
    "CLIP_CLASSES",
    "COMPARISON_HEADERS",
    "EOS",
    "KERNELS",
    "MASTER_PRECISIONS",
    "ORDERS",
    "PRECISIONS",
    "RATIO_MODES",
    "SOURCE",
    "SOURCE_REWARDS",
    "STALL_HEADERS",
    "STALL_VERDICTS",
    "STEP_FIELDS",
    "WEIGHT_MODES",
    "Engine",
    "GradientDecomposition",
    "Policy",
    "PolicyConfig",
    "Rollout",
    "RunConfig",
    "RunLog",
    "ServingEngine",
    "SourceFigure",
    "StallSeed",
    "StallSummary",
    "band_report",
    "beta_by_band",
    "beta_by_offset",
    "beta_table",
    "classify_clipping",
    "clipped",
    "comparison_table",
    "fcorr",
    "find_stored",
    "fmean",
    "four_pass_gradients",
    "fstd",
    "gathered_log_softmax",
    "gradient_report",
    "group_advantages",
    "load_runs",
    "log_ratio_split",
    "logit_rounding_beta",
    "make_engine",
    "permuted_weights",
    "policy_gradient",
    "policy_logprobs",
    "progress",
    "provenance",
    "reproduces",
    "sample_tokens",
    "save_runs",
    "sequence_logprobs",
    "source_stall_row",
    "stall_summary",
    "stall_table",
    "surrogate_loss",
    "target_reward",
    "token_weights",
    "train",
    "train_many",
    "train_seeds",
    "vocabulary_logprobs",
    "with_changes",
]
