"""Would PPO clip this from precision alone? Per-token log-probabilities of a language model under
two precision settings, and beta = log p_reference - log p_other per token (chapter 6).

A setting is a name: "float32" or "float64" (the model as it is, or cast up), "bfloat16" or
"float16" (a copy of the model with every weight and floating input cast, as an inference
engine stores them), "autocast_bfloat16" or "autocast_float16" (float32 weights under
torch.autocast, as a mixed-precision trainer runs them); or a callable inputs -> logits. The
log-softmax is taken in float32 from each setting's logits; beta in float64. A dict batch's
attention_mask, when shaped like the scored positions, marks the padded ones: they are left
out of every statistic (NaN in the arrays) and the summary says how many.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import numpy as np
import torch

from ..checks import check_positive_int
from ..formats import get_format
from ..plotting import plot_beta_vs_logprob
from ..tables import Table
from .batch import as_inputs, call, cast, for_program, output_tensors
from .report import Report, check_module, fmt_share, new_axes

__all__ = ["SETTINGS", "MismatchReport", "logprobs", "mismatch"]

SETTINGS: tuple[str, ...] = ("float32", "float64", "bfloat16", "float16", "autocast_bfloat16",
                             "autocast_float16")


def _logits_of(out, name: str) -> torch.Tensor:
    """The logits in a model's output: a tensor, or an object with .logits (Hugging Face)."""
    if isinstance(out, Mapping):  # a dict or ModelOutput: its logits, else its only tensor
        ts = output_tensors(out, None, name)
        out = ts[0] if len(ts) == 1 else out
    elif not isinstance(out, torch.Tensor) and hasattr(out, "logits"):
        out = out.logits
    if not isinstance(out, torch.Tensor) or not out.is_floating_point() or out.ndim < 2 \
            or out.shape[-1] < 2:
        what = (f"a tensor of shape {tuple(out.shape)} and dtype {out.dtype}"
                if isinstance(out, torch.Tensor) else type(out).__name__)
        raise ValueError(f"{name} must return logits (a floating tensor (..., vocabulary) with "
                         f"vocabulary >= 2); got {what}")
    return out


def _runner(model, setting, cast_inputs: bool = False) -> Callable:
    """A function inputs -> logits that runs model under setting (cast_inputs: the autocast
    settings get the batch's floating tensors in the model's parameter dtype)."""
    if callable(setting) and not isinstance(setting, str):
        return lambda inputs: _logits_of(call(setting, inputs, "the setting callable"),
                                         "the setting callable")
    if setting not in SETTINGS:
        raise ValueError(f"unknown precision setting {setting!r}; valid choices: "
                         f"{', '.join(SETTINGS)}, or a callable inputs -> logits")
    if setting.startswith("autocast_"):
        dtype = get_format(setting.removeprefix("autocast_")).torch_dtype
        dev = next(model.parameters()).device.type

        def run(inputs):
            with torch.autocast(dev, dtype=dtype):
                return _logits_of(call(model, for_program(model, inputs, cast_inputs), "model"),
                                  "model")
        return run
    dtype = get_format(setting).torch_dtype
    m = model if all(p.dtype == dtype for p in model.parameters()) else cast_copy(model, dtype)

    def run(inputs):
        return _logits_of(call(m, cast(inputs, dtype), "model"), "model")
    return run


def cast_copy(model: torch.nn.Module, dtype: torch.dtype) -> torch.nn.Module:
    """A deep copy of model with its floating parameters and buffers in dtype, each cast once
    from the original (no float32 copy made first); tied parameters stay tied."""
    memo: dict = {}
    for t in (*model.parameters(), *model.buffers()):
        if t.is_floating_point() and id(t) not in memo:
            c = t.detach().to(dtype)
            memo[id(t)] = (torch.nn.Parameter(c, requires_grad=t.requires_grad)
                           if isinstance(t, torch.nn.Parameter) else c)
    return copy.deepcopy(model, memo).to(dtype)


def logprobs(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """log softmax(logits)[target] per position, the log-softmax taken in float32.

    Parameters
    ----------
    logits : torch.Tensor
        Floating-point logits (..., vocabulary), of any float dtype (cast to float32).
    targets : torch.Tensor
        Integer token ids of the logits' shape without the last axis.

    Returns
    -------
    torch.Tensor
        float32 log-probabilities of the targets' shape.

    Examples
    --------
    >>> import torch
    >>> from precisionlab.diagnose import logprobs
    >>> logits = torch.tensor([[0.0, 0.0, 0.0, 0.0],
    ...                        [0.0, float("-inf"), 0.0, 0.0]])
    >>> lp = logprobs(logits, torch.tensor([2, 1]))
    >>> f"{lp[0].item():.4f}", lp[1].item()  # log(1/4); a masked token
    ('-1.3863', -inf)
    """
    lp = torch.log_softmax(logits.to(torch.float32), dim=-1)
    return lp.gather(-1, targets.unsqueeze(-1).to(torch.int64)).squeeze(-1)


@dataclass(frozen=True)
class MismatchReport(Report):
    """mismatch()'s result: per-token log-probabilities under both settings and beta.

    Attributes
    ----------
    reference : str
        The reference setting's name (a callable's __name__, or "custom").
    other : str
        The other setting's name.
    eps : float
        PPO's clip range.
    logp_reference : numpy.ndarray
        log p of each target token under the reference (float64, the targets' shape; NaN
        at the positions `counted` leaves out).
    logp_other : numpy.ndarray
        log p under the other setting.
    beta : numpy.ndarray
        logp_reference - logp_other.
    targets : numpy.ndarray
        The token ids scored.
    top : int
        How many tokens the table lists.
    counted : numpy.ndarray or None
        True at the positions the statistics count, False at the padded ones (from the
        batch's attention_mask); None counts every position.
    """

    reference: str
    other: str
    eps: float
    logp_reference: np.ndarray  # float64, shape of the targets
    logp_other: np.ndarray
    beta: np.ndarray  # logp_reference - logp_other
    targets: np.ndarray
    top: int = 5
    title: str = "per-token precision mismatch"
    counted: np.ndarray | None = field(default=None, repr=False)  # False: a padded position

    @property
    def padded(self) -> int:
        """How many positions the attention mask left out."""
        return 0 if self.counted is None else int(self.counted.size - self.counted.sum())

    @property
    def tokens(self) -> int:
        """How many positions the statistics count."""
        return self.beta.size - self.padded

    def _counted(self, a: np.ndarray) -> np.ndarray:
        """a's entries at the counted positions, flat."""
        return a.ravel() if self.counted is None else a[self.counted]

    @property
    def ratio(self) -> np.ndarray:
        """exp(beta): the PPO ratio precision alone contributes."""
        return np.exp(self.beta)

    @property
    def outside(self) -> np.ndarray:
        """True where exp(beta) lies outside [1 - eps, 1 + eps]."""
        r = self.ratio
        out = (r < 1 - self.eps) | (r > 1 + self.eps)
        return out if self.counted is None else out & self.counted

    @property
    def share_outside(self) -> float:
        """Share of the counted tokens whose precision ratio alone leaves 1 +- eps."""
        return float(self.outside.sum()) / self.tokens if self.tokens else 0.0

    @property
    def mean(self) -> float:
        """Mean beta over the counted tokens (math.fsum; NaN when none is counted)."""
        b = self._counted(self.beta)
        return math.fsum(b) / b.size if b.size else math.nan

    @property
    def std(self) -> float:
        """Standard deviation of beta over the counted tokens (population)."""
        b = self._counted(self.beta)
        m = self.mean
        return math.sqrt(math.fsum((b - m) ** 2) / b.size) if b.size else math.nan

    @property
    def max_abs(self) -> float:
        """Largest |beta| over the counted tokens (0.0 when none is counted)."""
        b = self._counted(self.beta)
        return float(np.max(np.abs(b))) if b.size else 0.0

    def worst(self, k: int | None = None) -> list[tuple]:
        """The k positions with the largest |beta|: (index tuple, target token, logp_reference, beta).

        Parameters
        ----------
        k : int or None, default None
            How many positions; None takes the report's `top`.

        Returns
        -------
        list of tuple
            (index into the targets, target token id, log p under the reference, beta), the
            largest |beta| first (ties in position order); padded positions never.
        """
        k = self.top if k is None else k
        key = -np.abs(self.beta).ravel()
        if self.counted is not None:
            key = np.where(self.counted.ravel(), key, np.inf)
        flat = np.argsort(key, kind="stable")[:min(k, self.tokens)]
        out = []
        for f in flat:
            idx = np.unravel_index(f, self.beta.shape)
            out.append((tuple(int(i) for i in idx), int(self.targets[idx]),
                        float(self.logp_reference[idx]), float(self.beta[idx])))
        return out

    def summary(self) -> str:
        """beta's spread and the share of tokens outside 1 +- eps.

        Returns
        -------
        str
            Three lines: the settings and the token count (and the padded positions left
            out); mean, std and max |beta|; the share of tokens whose exp(beta) leaves
            1 +- eps.
        """
        pad = f" ({self.padded} padded positions excluded)" if self.padded else ""
        return (f"beta = log p[{self.reference}] - log p[{self.other}], {self.tokens} "
                f"tokens{pad}\nmean {self.mean:.2e}, std {self.std:.2e}, max |beta| "
                f"{self.max_abs:.3g}\nexp(beta) outside 1 +- {self.eps:g}: "
                f"{fmt_share(self.share_outside)} of tokens")

    def table(self) -> Table:
        """The tokens most affected: position, token, log p under the reference, beta, exp(beta).

        Returns
        -------
        Table
            One row for each of the `top` positions of `worst`.
        """
        rows = [[str(idx), str(tok), f"{lp:.3f}", f"{b:+.3e}", f"{math.exp(b):.4f}"]
                for idx, tok, lp, b in self.worst()]
        return Table(["position", "token", f"log p {self.reference}", "beta", "exp(beta)"], rows)

    def plot(self, ax=None):
        """|beta| against the reference log-probability, median per bin.

        Parameters
        ----------
        ax : matplotlib.axes.Axes or None, default None
            The Axes to draw on; None draws on a new figure.

        Returns
        -------
        matplotlib.axes.Axes
            The Axes drawn on.
        """
        ax = new_axes(ax)
        plot_beta_vs_logprob(self._counted(self.logp_reference), self._counted(self.beta),
                             ax=ax)
        ax.set_ylabel(f"|beta| = |log p {self.reference} - log p {self.other}|")
        return ax


def _targets(inputs, logits, targets):
    """(logits, targets) aligned: given targets must match logits.shape[:-1]; by default the next tokens of inputs[0]."""
    if targets is None:  # a dict batch's input_ids, else the first input
        x = inputs.kwargs.get("input_ids", inputs[0])
        if x.is_floating_point() or tuple(x.shape) != tuple(logits.shape[:-1]):
            raise ValueError("targets=None takes the next token of the first input as target, "
                             "which needs integer token ids shaped like the logits without their "
                             f"last axis {tuple(logits.shape[:-1])}; got {x.dtype} "
                             f"{tuple(x.shape)}: pass targets=")
        return logits[..., :-1, :], x[..., 1:]
    if not isinstance(targets, torch.Tensor) or targets.is_floating_point() or \
            tuple(targets.shape) != tuple(logits.shape[:-1]):
        got = (f"{targets.dtype} {tuple(targets.shape)}" if isinstance(targets, torch.Tensor)
               else type(targets).__name__)
        raise ValueError(f"targets must be integer token ids of shape {tuple(logits.shape[:-1])}"
                         f" (the logits without their last axis); got {got}")
    if targets.numel() and (int(targets.min()) < 0 or int(targets.max()) >= logits.shape[-1]):
        raise ValueError(f"targets must lie in 0..{logits.shape[-1] - 1}; got "
                         f"{int(targets.min())}..{int(targets.max())}")
    return logits, targets


def _counted(inputs, shape: tuple, next_token: bool) -> np.ndarray | None:
    """True at the positions scored on real tokens, from a dict batch's attention_mask (0 at a
    padded token): next_token scores token t + 1 at position t, which counts when both tokens
    are real. None without a mask, or with one not shaped like the tokens (a classifier's
    per-sequence logits, a 4-d mask)."""
    mask = inputs.kwargs.get("attention_mask")
    if not isinstance(mask, torch.Tensor):
        return None
    real = (mask != 0).cpu().numpy()
    if next_token:
        if real.shape[:-1] != shape[:-1] or real.shape[-1] != shape[-1] + 1:
            return None
        return real[..., :-1] & real[..., 1:]
    return real if real.shape == shape else None


def mismatch(model, batch, targets=None, reference="float32", other="bfloat16",
             eps: float = 0.2, top: int = 5, cast_inputs: bool = False) -> MismatchReport:
    """beta_t = log p_reference(y_t) - log p_other(y_t) per token, from one forward per setting.

    model returns logits (..., vocabulary); batch is a tensor or tuple of inputs; targets the
    token ids scored (default: the next token of batch's token ids). eps: PPO's clip range.

    Parameters
    ----------
    model : torch.nn.Module
        A language model: model(*batch) returns logits (..., vocabulary), or a dict or an
        object with .logits (Hugging Face). It runs in eval mode under torch.no_grad (each
        submodule's own mode is put back afterwards); the cast settings run on a copy.
    batch : torch.Tensor, tuple or dict
        The model's input: a tensor, a non-empty tuple or list of positional inputs, or a
        dict of keyword inputs (a tokenizer's input_ids and attention_mask), passed as
        model(**batch); integer tensors are never cast. With targets=None a dict's
        input_ids (else the first input) give the targets. A dict's attention_mask shaped
        like the tokens marks padded positions (0): they are excluded from beta's statistics
        (NaN in the report's arrays) and the summary says how many.
    targets : torch.Tensor or None, default None
        Integer token ids of the logits' shape without the last axis, each in
        0 .. vocabulary - 1. None scores the next token of batch's first input (integer
        ids): position t scores token t + 1, so there is one position fewer.
    reference : str or callable, default "float32"
        A setting from `SETTINGS` ("float32", "float64", "bfloat16", "float16",
        "autocast_bfloat16", "autocast_float16") or a callable inputs -> logits.
    other : str or callable, default "bfloat16"
        The setting compared with the reference, of the same kinds.
    eps : float, default 0.2
        PPO's clip range, in (0, 1): the report counts the tokens whose exp(beta) lies
        outside [1 - eps, 1 + eps].
    top : int, default 5
        How many of the most affected tokens `MismatchReport.table` lists (>= 1).
    cast_inputs : bool, default False
        Cast the batch's floating tensors (inputs_embeds, images) to the model's parameter
        dtype for the settings that run the model as it is ("autocast_*"); the cast settings
        always cast them to their own dtype.

    Returns
    -------
    MismatchReport
        log p per token under both settings, beta = log p_reference - log p_other
        (float64 arrays of the targets' shape), and the share of tokens outside 1 +- eps.

    Raises
    ------
    ValueError
        If model is not a Module with parameters, batch is not a tensor, tuple or dict, a
        setting is unknown or returns no logits, the two settings' logits differ in shape,
        targets do not fit the logits, eps lies outside (0, 1) or top is not a positive
        integer.

    Examples
    --------
    >>> import torch
    >>> from torch import nn
    >>> from precisionlab.diagnose import mismatch
    >>> _ = torch.manual_seed(0)
    >>> model = nn.Sequential(nn.Embedding(16, 8), nn.Linear(8, 16))
    >>> tokens = torch.tensor([[1, 5, 2, 7, 3, 9]])
    >>> report = mismatch(model, tokens)  # float32 against a bfloat16 copy
    >>> report.beta.shape, report.share_outside
    ((1, 5), 0.0)
    >>> print(report.summary().splitlines()[-1])
    exp(beta) outside 1 +- 0.2: 0 of tokens

    The same setting twice gives beta = 0 exactly: the forward is repeatable.

    >>> mismatch(model, tokens, other="float32").max_abs
    0.0
    """
    check_module(model)
    inputs = as_inputs(batch)
    if not (isinstance(eps, (int, float)) and 0 < eps < 1):
        raise ValueError(f"eps must be a number in (0, 1); got eps={eps!r}")
    check_positive_int(top, "top")
    for_program(model, inputs, cast_inputs)  # checks cast_inputs
    modes = [(m, m.training) for m in model.modules()]  # each submodule's own mode
    model.eval()
    try:
        with torch.no_grad():
            lr_ = _runner(model, reference, cast_inputs)(inputs)
            lo_ = _runner(model, other, cast_inputs)(inputs)
    finally:
        for m, was_training in modes:
            m.training = was_training
    if lr_.shape != lo_.shape:
        raise ValueError(f"the two settings return logits of different shapes {tuple(lr_.shape)} "
                         f"and {tuple(lo_.shape)}")
    a, t = _targets(inputs, lr_, targets)
    b, _ = _targets(inputs, lo_, targets)
    pa = logprobs(a, t).to(torch.float64).cpu().numpy()
    pb = logprobs(b, t).to(torch.float64).cpu().numpy()
    counted = _counted(inputs, tuple(t.shape), targets is None)
    if counted is not None:
        pa[~counted] = pb[~counted] = np.nan
    name = lambda s: s if isinstance(s, str) else getattr(s, "__name__", "custom")  # noqa: E731
    return MismatchReport(name(reference), name(other), float(eps), pa, pb, pa - pb,
                          t.cpu().numpy(), top, counted=counted)
