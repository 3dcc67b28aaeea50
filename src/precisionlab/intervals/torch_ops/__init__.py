"""Interval bounds for torch operations: the rules `precisionlab.diagnose.triage` bounds a traced
program with, one operation at a time.

Each rule maps the bounds (`Interval`s, float64, order-oblivious) of an operation's tensor
inputs to a bound on every value the operation may return in a given format, under the kernel
model described in `rules` (float32 internally for float16/bfloat16/float32 results, an ulp
budget per operation, any summation order, flushing to zero allowed); `bound(rec, get, fmt)`
looks the rule up by the operation's name and `supported()` lists the names. Where the
package's other rules (`intervals.ops`, `intervals.bounds`) bound a kernel whose structure is
known, these bound whatever CPU or GPU kernel torch dispatches to.

Files, from the floor up:

* `fused` - compiled (numba) steps on one number (a float64 step toward an infinity, widening
  by ulps, directed rounding into a format by bit patterns) and passes over arrays built from
  them, each bit for bit the NumPy steps it replaces; `flat`, `inside_worst` (the check of
  values against a bound).
* `kernels` - compiled passes for whole rules built from `fused`'s steps: the operands and the
  closing of matrix products, layer / RMS norm rows, softmax rows, scaled scores, unary ends.
* `small` - the size tier: NumPy twins of the elementwise kernels (`step`, `widen_rel`,
  `round_out`, `add_out`, `leaf_box`, `scaled`, `unary_ends`, `inside_worst`) and of
  `kernels.softmax_in`, bit for bit, for inputs of up to `NUMPY_MAX_SIZE` values, where
  compiling on a cold cache would cost more than it saves.
* `arith` - the interval arithmetic the rules share: outward float64 steps (`down`, `up`),
  intervals built without copies (`mk`, `bare`), rounding and widening into a format
  (`round_into`, `widen_rel`, `widen_abs`, `finish`), elements without information (`whole`,
  `nan_where`), leaves (`leaf`, `leaf_pairs`), a rule's arguments (`arg`, `is_tensor`,
  `scalar`, `lazy`), `gamma`, `fmt_of`, `UnsupportedOperation`.
* `products` - matrix products in midpoint-radius form: `Leaf` (a weight or input as
  t +- (rho |t| + tau)), `mm` and the BLAS steps around it.
* `rows` - row-wise operations: softmax and log-softmax, layer and RMS norm, sums and means,
  cross entropy.
* `layers` - whole layers bounded as one operation: conv1d / conv2d, scaled dot-product
  attention (with grouped-query heads), nn.MultiheadAttention, dropout (refused in training
  mode).
* `trig` - cos and sin (rotary position embeddings), by monotone pieces.
* `pooling` - max, average and adaptive pooling in one and two dimensions.
* `channel_norms` - batch norm (running or batch statistics), group norm, instance norm.
* `recurrent` - torch.lstm, torch.gru, torch.rnn_tanh / rnn_relu, unrolled step by step.
* `rules` - the kernel model, elementwise and shape operations, and the table `RULES` that
  `bound` dispatches through (with `EXACT` shape operations and `FILLS`).

`precisionlab.intervals` imports it as `intervals.torch_ops` without flattening its names into
its own (`torch_ops.RULES`, the operations' rules, is not `intervals.RULES`, the bound rules'
names). It imports only from `intervals.interval`, `intervals.ops` and `precisionlab.formats`.
"""

from .arith import (
    ABS_SLACK,
    REL_SLACK,
    UnsupportedOperation,
    arg,
    as_numpy,
    bare,
    down,
    finish,
    fmt_of,
    gamma,
    internal,
    is_tensor,
    lazy,
    leaf,
    leaf_pairs,
    mk,
    nan_where,
    reduced,
    round_into,
    rounding,
    scalar,
    u_out,
    up,
    whole,
    widen_abs,
    widen_rel,
)
from .fused import flat
from .layers import LAYER_RULES, attention_bound, conv_bound
from .products import (
    Leaf,
    box_products,
    close_products,
    declared_mm,
    leaf_products,
    midrad,
    mm,
    upper_product,
)
from .rows import softmax_rule, sum_rule
from .rules import EXACT, FILLS, RULES, bound, supported, unary_bound
from .small import inside_worst

__all__ = [
    "ABS_SLACK",
    "EXACT",
    "FILLS",
    "LAYER_RULES",
    "REL_SLACK",
    "RULES",
    "Leaf",
    "UnsupportedOperation",
    "arg",
    "as_numpy",
    "attention_bound",
    "bare",
    "bound",
    "box_products",
    "close_products",
    "conv_bound",
    "declared_mm",
    "down",
    "finish",
    "flat",
    "fmt_of",
    "gamma",
    "inside_worst",
    "internal",
    "is_tensor",
    "lazy",
    "leaf",
    "leaf_pairs",
    "leaf_products",
    "midrad",
    "mk",
    "mm",
    "nan_where",
    "reduced",
    "round_into",
    "rounding",
    "scalar",
    "softmax_rule",
    "sum_rule",
    "supported",
    "u_out",
    "unary_bound",
    "up",
    "upper_product",
    "whole",
    "widen_abs",
    "widen_rel",
]
