"""Interval bounds that tell round-off from a bug when two implementations disagree.

When a kernel's output fails `allclose` against a reference, the question is whether the
difference is round-off the kernel is allowed to make (Type-I) or a bug (Type-II). This package
answers it the way Zhan et al. (RENDER) do, and tightens their bounds where the kernel's
structure is known:

* `Interval` (`interval`): lower and upper float64 bounds per element and a may-be-NaN flag.
  Every bound is rounded *outward* (`outward`: one ulp of float64 after each round-to-nearest
  step, or directed rounding into a format with `precisionlab.rounding.round_to`), so a
  bound is rigorous, not merely close.
* Per-operation rules (`ops`, `softmax`) that take arrays *or* intervals: on arrays they execute
  the operation (the simulated kernel), on intervals they bound every result it could give.
  Correctly rounded operations (+, -, *, /, sqrt, casts to a narrower format) round the exact
  interval outward into the format; operations with an error budget of more than half an ulp
  (fast division 2 ulps, exp 1 ulp, softmax 1 ulp, ...) widen it by that many ulps first.
  reshape, transpose and gathers are exact; relu and max are monotone. softmax, log_softmax
  and cross_entropy subtract the row's maximum, as attention kernels do, and are bounded for
  any finite logits and for -inf masks.
* `Kernel` (`precisionlab.gpu.kernel`, re-exported here): how a sum or a matmul is executed,
  in the GPU simulator's own terms (order, block, splits, threads, accumulator format per
  stage, operand format, tensor-core model); every field is honoured or rejected by name.
  `sum_` and `matmul` (`bounds`) run it with `precisionlab.gpu` and bound it two ways:

  - ``rule="oblivious"`` - the order-oblivious rule: every summand passes through n - 1
    accumulations, |error| <= ((1 + u)^(n-1) - 1) sum |x_i| (about (n - 1) u sum |x_i|),
    whatever the order; this is RENDER's rule, here rounded outward;
  - ``rule="structure"`` - the structure-aware rule: each summand's factor uses the number of
    roundings on *its* path through the kernel's summation tree (within its tile, its
    partial's rounding, the adds that combine the tiles), stage by stage, so a blocked sum
    costs about (block + n / block) u instead of n u.

  Both rules bound every partial sum a stage forms, so overflow anywhere inside a kernel (a
  running sum, a partial or combine format, an accumulator narrower than the output, a
  tensor core's float16 output) shows in the result's bound.
* `Layer`, `propagate`, `classify` (`verdicts`): a program is a list of layers; each layer is
  bounded starting from the union (hull) of the target's and the reference's previous
  outputs, from a chosen start layer to a chosen end layer; the verdict is Type-II when some
  layer's reference output cannot be explained by the target's round-off.
* `high_precision_verdict`: the baseline that re-executes the target in float64 and asks
  `allclose` again.
* `masked_softmax`, `mask_after_softmax` (`masking`): attention masks by -inf or an additive
  bias before the softmax, and the bug that masks after it.
* `CORPUS` and `build_case` (`corpus`): a labelled set of mismatches (round-off and bugs,
  kernels and small networks, masked attention among them) built with the simulator, on
  which the three methods are compared, with the source's labels and the comparison table;
  `source_charge` (`source_rules`): the source's own first-order charge for a tiled matmul
  with atomic adds. Chapter 7's walk-through (`dot_by_hand`, `every_order`,
  `injected_bug`) lives with the chapter, in `precisionlab.chapters.allclose_demos`.
* `torch_ops/`: the same bounds for torch operations whose kernel is not known - the rules
  `precisionlab.diagnose.triage` bounds a traced program with (elementwise and shape
  operations, matrix products, softmax, norms, cross entropy, convolutions, attention), under
  one kernel model (float32 inside, an ulp budget per operation, any summation order), with
  compiled (numba) passes that give the NumPy steps' values bit for bit. Its names stay in
  their own namespace (`intervals.torch_ops.bound`, `.RULES`, `.leaf`, ...); its files are
  listed in its docstring.

Non-finite values, one convention for every rule:

* An element of an Interval stands for [lo, hi] U N: [lo, hi] is a closed range of the
  extended reals (hi = +inf: +inf itself may be the result, and so may every large finite
  value), N = {NaN} where the flag `nan` is set. The range may be empty (lo = +inf,
  hi = -inf): then the result can only be NaN.
* Where the executed result can be +-inf (overflow in any rounding, an infinite input, a
  masked logit), the bound reaches it; where it can be NaN (inf - inf, 0 * inf, 0 / 0,
  inf / inf, sqrt of a negative, a softmax row holding +inf or only -inf), the flag says so.
  Rounding modes that saturate instead of overflowing (toward zero, a tensor core's float32
  truncation) leave the relative-error model, so such a result is bounded by [-inf, +inf].
* The exact result (when it exists) lies in [lo, hi], beyond the format's range included.
* Verdicts compare non-finite outputs by identity: the same infinity in both programs, or NaN
  in both where the bound allows NaN, is no difference; an infinity or NaN the bound does not
  allow is outside (Type-II; with reference_rule, when the two bounds do not meet); elements
  non-finite in one program only are reported in the layer's check (`LayerCheck.nonfinite`),
  also when the bound explains them.
"""

from ..gpu import KERNEL_ORDERS, Kernel, leaf_depths, promote
from . import torch_ops
from .bounds import matmul, sum_
from .corpus import (
    CORPUS,
    EXTRA_CASES,
    METHODS,
    SOURCE_LABELS,
    CaseResult,
    MismatchCase,
    build_case,
    corpus_table,
    evaluate_case,
    source_issue,
    uniform_data,
)
from .interval import RULES, Interval, concrete, hull, point
from .masking import mask_after_softmax, masked_scores, masked_softmax
from .ops import (
    SOURCE_ULP_TABLE,
    ULP_BUDGETS,
    add,
    amax,
    cast,
    div,
    exp,
    maximum,
    mul,
    relu,
    sqrt,
    sub,
    where,
)
from .softmax import cross_entropy, log_softmax, softmax
from .source_rules import source_charge
from .verdicts import (
    ASSERT_CLOSE_TOLERANCES,
    Layer,
    LayerCheck,
    Verdict,
    allclose,
    classify,
    high_precision_verdict,
    propagate,
    run_layers,
)

__all__ = [
    "ASSERT_CLOSE_TOLERANCES",
    "CORPUS",
    "EXTRA_CASES",
    "KERNEL_ORDERS",
    "METHODS",
    "RULES",
    "SOURCE_LABELS",
    "SOURCE_ULP_TABLE",
    "ULP_BUDGETS",
    "CaseResult",
    "Interval",
    "Kernel",
    "Layer",
    "LayerCheck",
    "MismatchCase",
    "Verdict",
    "add",
    "allclose",
    "amax",
    "build_case",
    "cast",
    "classify",
    "concrete",
    "corpus_table",
    "cross_entropy",
    "div",
    "evaluate_case",
    "exp",
    "high_precision_verdict",
    "hull",
    "leaf_depths",
    "log_softmax",
    "mask_after_softmax",
    "masked_scores",
    "masked_softmax",
    "matmul",
    "maximum",
    "mul",
    "point",
    "promote",
    "propagate",
    "relu",
    "run_layers",
    "softmax",
    "source_charge",
    "source_issue",
    "sqrt",
    "sub",
    "sum_",
    "torch_ops",
    "uniform_data",
    "where",
]
