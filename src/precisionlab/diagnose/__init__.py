"""The book's lessons pointed at the reader's own torch.nn.Module: four diagnoses.

* `gradients(model, loss_fn, batch)` - will this train in float16 / bfloat16? Per gradient
  tensor the entries a cast would flush, leave subnormal or overflow, the loss-scale range
  that saves them, and the bfloat16 weights an optimizer step would not move; with
  `recipe=` the same shares and the SQNR under an FP8/MX/NVFP4 scaling recipe.
* `mismatch(model, batch)` - would PPO clip this from precision alone? beta per token between
  two precision settings.
* `triage(reference, target, inputs)` - round-off or bug? The target's torch operations,
  traced as they run, bounded op by op with `precisionlab.intervals`; Type-I or Type-II
  with the operation to blame, the likely culprit, and the smallest bug it could have seen.
* `determinism(fn, inputs)` - which outputs and gradients change with the thread count or
  the deterministic-algorithm flags, and by how many ulps.

Each returns a `Report`: plain data, printed as a table, drawn by `.plot(ax=None)`.
A batch is a tensor, a tuple of positional inputs, or a dict of keyword inputs (a tokenizer's
input_ids and attention_mask: model(**batch)); a model may return a tensor, a tuple, a dict
or a Hugging Face ModelOutput (triage compares its logits, or `output=`'s field).
Files: `batch` (that normalisation, shared by the four), `report`, `gradients` (the one backward and the counting) with `gradient_report`
(`TensorGradients`, `GradientReport` and the cast thresholds they read), `recipe_shares` (its
shares and table under a scaling recipe) and `scale_view` (the picture and alt text of its
loss-scale view), `mismatch`, `determinism`; triage's `triage` (tracing, verdict),
`triage_report` (`TriageReport`: summary, table, plot), `opcheck` (each paired operation's
check), `shown` (the tensor a check's element indexes), `pairing` (which operations
compare, and the bounds that pairing decides), `blame` (a failed check's suspects and culprit,
differing operation counts), `floors` (the smallest scaling of a module's output a check sees)
and `logic` (the second pass: a low-precision module's program at the reference's precision).
The interval rules triage bounds each operation with live in `precisionlab.intervals.torch_ops`,
imported by its public names.
"""

from ..intervals.torch_ops import supported
from .determinism import DeterminismReport, determinism, ulp_distance
from .gradient_report import GradientReport, TensorGradients, cast_thresholds
from .gradients import gradients
from .mismatch import SETTINGS, MismatchReport, logprobs, mismatch
from .recipe_shares import RecipeShares
from .report import Report
from .triage import OpCheck, UnsupportedOperation, triage
from .triage_report import TriageReport
from .watch import NonFiniteError, Watch, watch
from .watch_report import WatchReport

__all__ = [
    "SETTINGS",
    "DeterminismReport",
    "GradientReport",
    "MismatchReport",
    "NonFiniteError",
    "OpCheck",
    "RecipeShares",
    "Report",
    "TensorGradients",
    "TriageReport",
    "UnsupportedOperation",
    "Watch",
    "WatchReport",
    "cast_thresholds",
    "determinism",
    "gradients",
    "logprobs",
    "mismatch",
    "supported",
    "triage",
    "ulp_distance",
    "watch",
]
