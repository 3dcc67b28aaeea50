"""A training run's settings (`RunConfig`) and its per-step record (`RunLog`)."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np

from ..checks import check_choice, check_count, check_positive
from .grpo import RATIO_MODES, WEIGHT_MODES
from .policy import BACKENDS, MASTER_PRECISIONS, PRECISIONS, Policy
from .serving import KERNELS
from .stats import fmean

__all__ = ["STEP_FIELDS", "RunConfig", "RunLog", "with_changes"]


@dataclass(frozen=True)
class RunConfig:
    """One training run: precisions, learning rate, clip range and loss variant."""

    trainer: str = "fp32"  # forward/backward precision of the trainer
    engine: str = "bf16"  # precision of the rollout engine (and of the shadow forward)
    master: str = "fp32"  # storage of the trainable weights (optimizer updates land here)
    lr: float = 5e-5
    steps: int = 50
    group_size: int = 8
    eps_low: float = 0.2
    eps_high: float = 0.2
    ratio_mode: str = "actual"
    weight_mode: str = "ppo"
    staleness: int = 1  # optimizer steps between the engine's weights and the trainer's
    backend: str = "emulated"  # "native": torch's own kernels for the forwards and Adam
    kernel: str = "shadow"  # "serving": the engine samples with a serving kernel (rl.serving)

    def __post_init__(self):
        check_choice(self.trainer, "trainer precision", PRECISIONS)
        check_choice(self.engine, "engine precision", PRECISIONS)
        check_choice(self.master, "master precision", MASTER_PRECISIONS)
        check_choice(self.ratio_mode, "ratio_mode", RATIO_MODES)
        check_choice(self.weight_mode, "weight_mode", WEIGHT_MODES)
        check_choice(self.backend, "backend", BACKENDS)
        check_choice(self.kernel, "kernel", KERNELS)
        if self.kernel != "shadow" and self.backend != "emulated":
            raise ValueError(f"kernel={self.kernel!r} needs backend='emulated'; got "
                             f"backend={self.backend!r}")
        check_positive(self.lr, "lr")
        check_positive(self.eps_low, "eps_low")
        check_positive(self.eps_high, "eps_high")
        check_count(self.steps, "steps")
        if self.staleness not in (0, 1) or isinstance(self.staleness, bool):
            raise ValueError(f"staleness must be 0 (on-policy) or 1 (the engine one step behind, "
                             f"as in asynchronous GRPO); got staleness={self.staleness!r}")

    @property
    def label(self) -> str:
        """Short description: master/trainer/engine precisions, lr and any intervention."""
        parts = [f"{self.master} master, {self.trainer} trainer, {self.engine} engine, "
                 f"lr {self.lr:g}"]
        if self.ratio_mode != "actual":
            parts.append(f"ratio {self.ratio_mode}")
        if self.weight_mode != "ppo":
            parts.append(self.weight_mode.replace("_", " "))
        if (self.eps_low, self.eps_high) != (0.2, 0.2):
            parts.append(f"eps {self.eps_low:g}/{self.eps_high:g}")
        if self.backend != "emulated":
            parts.append(f"{self.backend} kernels")
        if self.kernel != "shadow":
            parts.append(f"{self.kernel} kernel")
        return ", ".join(parts)


STEP_FIELDS: tuple[str, ...] = (
    "reward", "clip", "phantom", "legitimate", "alpha_abs", "beta_abs", "beta_mean", "beta_std",
    "changed", "deployed", "moved", "kl", "beta_beyond", "beta_adv_corr",
)


@dataclass
class RunLog:
    """Per-step measurements of one training run (numpy arrays of length `steps`)."""

    config: RunConfig
    reward: np.ndarray  # mean reward of the batch (= -mean completion length)
    clip: np.ndarray  # fraction of completion tokens in a dead zone of the loss actually used
    phantom: np.ndarray  # fraction clipped by exp(alpha + beta) but not by exp(alpha)
    legitimate: np.ndarray  # fraction clipped by both
    alpha_abs: np.ndarray  # mean |alpha|
    beta_abs: np.ndarray  # mean |beta|
    beta_mean: np.ndarray  # mean beta (signed)
    beta_std: np.ndarray
    changed: np.ndarray  # fraction of weights whose engine copy changed at the step's sync
    deployed: np.ndarray  # mean over tokens of sign(A) (f_low(W_k+1) - f_low(W_k))
    moved: np.ndarray  # mean over tokens of |f_low(W_k+1) - f_low(W_k)|
    kl: np.ndarray  # k3 estimate of KL(engine policy || deployed policy) on the batch
    beta_beyond: np.ndarray  # fraction of tokens with |beta| > 0.2
    beta_adv_corr: np.ndarray  # Pearson correlation of beta_t and A_t over the tokens (nan if beta = 0)
    snapshots: dict = field(default_factory=dict)  # step -> per-token arrays (`record`)
    gradients: dict = field(default_factory=dict)  # step -> gradient_report (`gradients`)
    policy: Policy | None = None  # the trained policy

    def snr(self) -> np.ndarray:
        """Per step mean|alpha| / mean|beta| (the source's signal-to-noise ratio; inf where beta = 0)."""
        a, b = np.asarray(self.alpha_abs, np.float64), np.asarray(self.beta_abs, np.float64)
        out = np.full(a.shape, np.inf)
        np.divide(a, b, out=out, where=b > 0)
        return out

    def arrays(self) -> dict[str, np.ndarray]:
        """The per-step fields (STEP_FIELDS) as float64 arrays, e.g. to store a run."""
        return {k: np.asarray(getattr(self, k), dtype=np.float64) for k in STEP_FIELDS}

    def final_reward(self, last: int = 10) -> float:
        """Mean batch reward over the last `last` steps (float64, fixed-order sum)."""
        return fmean(self.reward[-last:])

    def steps_to(self, reward: float, window: int = 5) -> int | None:
        """First step at which the `window`-step moving average of the reward reaches `reward` (None: never)."""
        # Window sums by explicit adds in a fixed order (np.convolve may vectorise them).
        r = np.asarray(self.reward, dtype=np.float64)
        n = len(r) - window + 1
        if n < 1:
            return None
        total = np.zeros(n)
        for k in range(window):
            total = total + r[k:k + n]
        hit = np.nonzero(total >= reward * window)[0]
        return int(hit[0]) + window - 1 if hit.size else None


def with_changes(run: RunConfig, **changes) -> RunConfig:
    """A copy of `run` with the given fields changed (validated again)."""
    return replace(run, **changes)
