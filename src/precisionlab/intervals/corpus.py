"""The labelled corpus: mismatches that fail allclose, with the true cause, built with the simulator.

Each case holds a target and a reference program (lists of layers), an input, allclose's
tolerances and the truth: "Type-I" when the difference is round-off the target may make,
"Type-II" when it is a bug. `evaluate_case` runs the three methods the chapter compares.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..checks import check_choice
from ..gpu import Kernel, as_float64, promote, round_float64
from ..rounding import seed_generator
from ..tables import Table, show
from .bounds import matmul, sum_
from .interval import Interval, parts_of, rule_of
from .masking import mask_after_softmax, masked_softmax
from .ops import add, amax, div, exp, mul, relu, sub
from .softmax import cross_entropy, softmax
from .verdicts import (
    ASSERT_CLOSE_TOLERANCES,
    Layer,
    Verdict,
    abs_diff,
    allclose,
    analyse,
    as_layers,
    high_precision_verdict,
    run_layers,
)


@dataclass(frozen=True)
class MismatchCase:
    """A target and a reference that fail allclose on an input, with the true cause."""

    name: str
    level: str  # "kernel" or "network"
    truth: str  # "Type-I" (round-off) or "Type-II" (bug)
    story: str
    x: np.ndarray
    target: tuple[Layer, ...]
    reference: tuple[Layer, ...]
    target_high: tuple[Layer, ...] | None
    rtol: float
    atol: float
    start: int = 0
    source: str = ""  # the issue in the source's evaluation it resembles, if any


# The three methods the chapter compares, in the order of CaseResult.correct.
METHODS: tuple[str, ...] = ("structure", "oblivious", "high_precision")

# The source's label (its Table III) of each issue a case imitates; #34191 is the
# Transformers bug of its introduction.
SOURCE_LABELS: dict[str, str] = {"#1808": "Type-I", "#4551": "Type-I", "#1937": "Type-I",
                                 "#2680": "Type-I", "#1666": "Type-II", "#34191": "Type-II"}


def source_issue(case: MismatchCase) -> str:
    """The source's issue the case imitates when SOURCE_LABELS gives it the case's truth, else "".

    Parameters
    ----------
    case : MismatchCase
        A corpus case (`build_case`); its `source` names the issue last ("... #1808").

    Returns
    -------
    str
        The issue ("#1808", ...), or "" when the case imitates none or the source labels it
        otherwise.

    Examples
    --------
    >>> from precisionlab.intervals import build_case, source_issue
    >>> source_issue(build_case("atomic split-K, fp16 C")), source_issue(build_case("split-K fp32"))
    ('#1808', '')
    """
    issue = case.source.split()[-1] if case.source else ""
    return issue if SOURCE_LABELS.get(issue) == case.truth else ""


@dataclass(frozen=True)
class CaseResult:
    """Verdicts of the three methods on one case, beside the truth."""

    case: MismatchCase
    max_diff: float
    passes_allclose: bool
    structure: Verdict
    oblivious: Verdict
    high_precision: str

    @property
    def correct(self) -> dict[str, bool]:
        """Per method: did it give the true verdict?"""
        t = self.case.truth
        got = (self.structure.verdict, self.oblivious.verdict, self.high_precision)
        return {m: v == t for m, v in zip(METHODS, got, strict=True)}


def evaluate_case(case: MismatchCase) -> CaseResult:
    """Run target and reference, then the structure-aware interval (both programs bounded, overlap
    test), the order-oblivious rule (reference as a point) and high-precision re-execution.

    Parameters
    ----------
    case : MismatchCase
        The case (`build_case`): both programs, the input, allclose's tolerances and the
        layer the analysis starts from.

    Returns
    -------
    CaseResult
        The largest |target - reference|, whether allclose passes, each method's verdict
        and, in `correct`, whether it is the case's truth.

    Raises
    ------
    ValueError
        If the two programs' outputs differ in shape or a layer's bound is no Interval.

    Examples
    --------
    >>> from precisionlab.intervals import build_case, evaluate_case
    >>> r = evaluate_case(build_case("split-K network"))  # Type-I: round-off
    >>> r.passes_allclose, r.structure.verdict, r.high_precision
    (False, 'Type-I', 'Type-II')
    >>> r.correct
    {'structure': True, 'oblivious': True, 'high_precision': False}
    """
    n = len(case.target)
    t_outs = run_layers(case.target, case.x)
    r_outs = run_layers(case.reference, case.x)
    t, r = t_outs[-1], r_outs[-1]
    diff = float(np.max(abs_diff(t, r)))  # equal infinities differ by 0, NaN against a number by inf
    tl, rl = as_layers(case.target), as_layers(case.reference)
    structure = analyse(tl, t_outs, rl, r_outs, case.x, "structure", "structure", case.start, n)
    oblivious = analyse(tl, t_outs, rl, r_outs, case.x, "oblivious", None, case.start, n)
    hp = high_precision_verdict(case.target_high, r, case.x, case.rtol, case.atol)
    return CaseResult(case, diff, allclose(t, r, case.rtol, case.atol), structure, oblivious, hp)


def corpus_table(results) -> Table:
    """One row per CaseResult: the source issue it is like, level, truth, max |diff|, each method's verdict.

    Parameters
    ----------
    results : list of CaseResult
        The evaluated cases (`evaluate_case`), in the order of the rows.

    Returns
    -------
    Table
        The comparison table, each verdict marked "ok" or "WRONG"; print it, or show it in a
        notebook.

    Examples
    --------
    >>> from precisionlab.intervals import build_case, corpus_table, evaluate_case
    >>> table = corpus_table([evaluate_case(build_case("split-K network"))])
    >>> list(table.headers)
    ['case', 'like', 'level', 'truth', 'max diff', 'interval', 'oblivious*', 'high prec.']
    >>> list(table.rows[0])
    ['split-K network', '', 'network', 'Type-I', '5.96e-08', 'Type-I ok', 'Type-I ok', 'Type-II WRONG']
    """
    mark = {True: "ok", False: "WRONG"}
    rows = [(r.case.name, source_issue(r.case), r.case.level, r.case.truth, r.max_diff,
             *(f"{v} {mark[ok]}" for v, ok in zip(
                 (r.structure.verdict, r.oblivious.verdict, r.high_precision),
                 r.correct.values(), strict=True)))
            for r in results]
    return show(rows, ["case", "like", "level", "truth", ("max diff", ".3g"), "interval",
                       "oblivious*", "high prec."],
                note="* order-oblivious rule: on every add, u of the coarsest format the kernel "
                     "adds in")


def uniform_data(shape, seed: int, fmt="float32", scale: float = 1.0) -> np.ndarray:
    """Uniform(-scale, scale) values from default_rng(seed), rounded to fmt (portable: no normal sampler).

    Parameters
    ----------
    shape : int or tuple of int
        The array's shape.
    seed : int
        The seed of np.random.default_rng (an integer >= 0).
    fmt : str or FloatFormat, default "float32"
        The format the values are rounded to (nearest even).
    scale : float, default 1.0
        The half-width of the range.

    Returns
    -------
    numpy.ndarray
        float64 values of fmt, in [-scale, scale]; the same for the same seed.

    Raises
    ------
    ValueError
        If seed is not an integer >= 0 or fmt is unknown.

    Examples
    --------
    >>> import numpy as np
    >>> from precisionlab.intervals import uniform_data
    >>> from precisionlab.rounding import round_to
    >>> x = uniform_data((2, 3), seed=0, fmt="bfloat16", scale=2.0)
    >>> x.shape, bool((np.abs(x) <= 2).all()), bool((round_to(x, "bfloat16") == x).all())
    ((2, 3), True, True)
    >>> bool((uniform_data((2, 3), seed=0, fmt="bfloat16", scale=2.0) == x).all())
    True
    """
    rng = seed_generator(seed)
    return round_float64(rng.uniform(-scale, scale, size=shape), fmt)


def _mm_layer(name, w, kernel, seed=None, transpose_x=False):
    """x -> x W under kernel (an atomic kernel redraws its orders from seed on every call)."""

    def f(x):
        xx = x.T if transpose_x else x
        return matmul(xx, w, kernel, seed=seed)

    return Layer(name, f)


def _case_matmul(name, truth, story, target_kernel, ref_kernel, m=8, k=4096, n=8, fmt="float32",
                 tol=None, seed=0, atomic_seed=None, source=""):
    a = uniform_data((m, k), seed, fmt)
    w = uniform_data((k, n), seed + 1, fmt)
    tgt = _mm_layer("matmul", w, target_kernel, atomic_seed)
    ref = _mm_layer("matmul", w, ref_kernel)
    high = _mm_layer("matmul", w, promote(target_kernel), atomic_seed)
    rtol, atol = tol if tol is not None else ASSERT_CLOSE_TOLERANCES[target_kernel.out_format.name]
    return MismatchCase(name, "kernel", truth, story, a, (tgt,), (ref,), (high,), rtol, atol,
                        source=source)


def _case_sum(name, truth, story, target_kernel, ref_kernel, n=32768, seed=0, atomic_seed=None,
              tol=None, source=""):
    rng = np.random.default_rng(seed)
    u = rng.uniform(-1, 1, size=(4, n))
    # centred rows: each exact sum is near zero, so every ordering's round-off shows in full
    x = round_float64(u - np.array([math.fsum(r) / n for r in u])[:, None], "float32")

    def target(v, kernel=target_kernel):
        return sum_(v, kernel, seed=atomic_seed)

    tgt = Layer("sum", target)
    ref = Layer("sum", lambda v: sum_(v, ref_kernel))
    hi = Layer("sum", lambda v: target(v, promote(target_kernel)))
    rtol, atol = tol if tol is not None else ASSERT_CLOSE_TOLERANCES["float32"]
    return MismatchCase(name, "kernel", truth, story, x, (tgt,), (ref,), (hi,), rtol, atol, source=source)


def _softmax_kernel(fmt, kernel, seed=None):
    """softmax from its pieces in fmt: z = x - max (rounded), e = fl(e^z), s = kernel sum of e, e / s."""

    def f(x):
        z = sub(x, amax(x)[..., None] if not isinstance(x, Interval) else _keep(amax(x)), fmt)
        e = exp(z, fmt)
        s = sum_(e, kernel, seed=seed)
        return div(e, s[..., None] if not isinstance(s, Interval) else _keep(s), fmt)

    return Layer("softmax kernel", f)


def _keep(iv: Interval) -> Interval:
    """Append a unit axis to an interval (broadcast over the last axis)."""
    return iv.reshape(*iv.shape, 1)


def _network(fmt, kernel, w1, b1, w2, b2, labels, groups=None, atomic_seed=None, bug=None,
             head="loss"):
    """x -> relu(x W1 + b1) -> h W2 + b2 -> per-row cross entropy -> loss; every op in fmt, matmuls by kernel.

    groups: micro-batches (lists of row indices). The correct loss is the mean over all rows;
    bug="normalise" averages each micro-batch's mean instead (the gradient-accumulation bug).
    """

    def lin(w, b, name):
        def f(h):
            y = matmul(h, w, kernel, seed=atomic_seed)
            return add(y, b, fmt)

        return Layer(name, f)

    def loss(c):
        n = c.shape[0]
        flat = Kernel("pairwise", acc=fmt if fmt != "bfloat16" else "float32", out=fmt)
        if bug == "normalise":
            means = []
            for g in groups:
                s = sum_(c[np.asarray(g)], flat)
                means.append(div(s, float(len(g)), fmt))
            stacked = _stack(means)
            return div(sum_(stacked, flat), float(len(groups)), fmt)
        return div(sum_(c, flat), float(n), fmt)

    layers = (
        Layer("linear 1 + relu", lambda h: relu(lin(w1, b1, "l1").run(h))),
        lin(w2, b2, "linear 2"),
        Layer("cross entropy", lambda z: cross_entropy(z, labels, fmt)),
        Layer("loss normalisation", loss),
    )
    return layers if head == "loss" else layers[:2]


def _stack(items):
    if not any(isinstance(i, Interval) for i in items):
        return np.stack([as_float64(i) for i in items])
    rule = rule_of(*[i for i in items if isinstance(i, Interval)])
    parts = [parts_of(i) for i in items]
    lo, hi, nan = (np.stack([p[j] for p in parts]) for j in range(3))
    vals = [p[3] for p in parts]
    v = None if any(v is None for v in vals) else np.stack(vals)
    return Interval(lo, hi, v, rule, nan)


def _attention(fmt, kernel, wq, wk, wrong_axis=False):
    """x -> softmax(x Wq (x Wk)^T) over rows (the bug: over columns)."""

    def scores(x):
        q = matmul(x, wq, kernel)
        kk = matmul(x, wk, kernel)
        return matmul(q, kk.T, kernel)

    def attn(s):
        if wrong_axis:
            return softmax(s.T, fmt).T
        return softmax(s, fmt)

    return (Layer("scores q k^T", scores), Layer("softmax", attn))


_BERT_MASK = -1e4  # the additive padding mask of BERT-style encoders


def _masked_attention(fmt, kernel, wq, wk, v, mask, fill=-math.inf, bug=None):
    """x -> s = (x Wq)(x Wk)^T / 4 -> softmax over keys of the masked scores -> P V.

    mask[i, j]: query i may attend to key j. The correct kernel masks the scores before the
    softmax: fill=-inf replaces masked scores (exactly 0 after the softmax), a finite fill is
    added as a bias (BERT's -1e4). bug="after": the softmax of the unmasked scores, masked
    entries then set to 0 (rows no longer sum to 1).
    """

    def scores(x):
        q = matmul(x, wq, kernel)
        k = matmul(x, wk, kernel)
        return mul(matmul(q, k.T, kernel), 0.25, fmt)  # 1 / sqrt(16), exact

    def attend(s):
        if bug == "after":
            return mask_after_softmax(s, mask, fmt)
        return masked_softmax(s, mask, fill, fmt)

    return (Layer("scores q k^T / 4", scores), Layer("masked softmax", attend),
            Layer("P V", lambda p: matmul(p, v, kernel)))


def _case_attention(name, truth, story, fmt_t, kernel_t, mask, fill, bug=None, tol=None):
    rows, d, dv = 16, 16, 8
    x = uniform_data((rows, d), 61, "float32")
    wq, wk = uniform_data((d, d), 62, "float32"), uniform_data((d, d), 63, "float32")
    v = uniform_data((rows, dv), 64, "float32")
    fp32 = Kernel("sequential", acc="float32")
    tgt = _masked_attention(fmt_t, kernel_t, wq, wk, v, mask, fill, bug)
    ref = _masked_attention("float32", fp32, wq, wk, v, mask, fill)
    high = _masked_attention("float64", promote(kernel_t), wq, wk, v, mask, fill, bug)
    rtol, atol = tol if tol is not None else ASSERT_CLOSE_TOLERANCES[fmt_t]
    return MismatchCase(name, "network", truth, story, x, tgt, ref, high, rtol, atol)


def _case_network(name, truth, story, fmt_t, kernel_t, fmt_r, kernel_r, bug=None, start=0,
                  seed=0, atomic_seed=None, tol=None, source="", head="loss"):
    rows, d_in, d_h, classes = 24, 64, 32, 10
    x = uniform_data((rows, d_in), seed, "float32")
    w1 = uniform_data((d_in, d_h), seed + 1, "float32", 1 / math.sqrt(d_in))
    b1 = uniform_data((d_h,), seed + 2, "float32", 0.1)
    w2 = uniform_data((d_h, classes), seed + 3, "float32", 1 / math.sqrt(d_h))
    b2 = uniform_data((classes,), seed + 4, "float32", 0.1)
    labels = np.random.default_rng(seed + 5).integers(0, classes, size=rows)
    groups = [list(range(0, 4)), list(range(4, 20)), list(range(20, 24))]  # 4, 16 and 4 tokens
    tgt = _network(fmt_t, kernel_t, w1, b1, w2, b2, labels, groups, atomic_seed, bug, head)
    ref = _network(fmt_r, kernel_r, w1, b1, w2, b2, labels, groups, head=head)
    high = _network("float64", promote(kernel_t), w1, b1, w2, b2, labels, groups, atomic_seed, bug,
                    head)
    rtol, atol = tol if tol is not None else ASSERT_CLOSE_TOLERANCES[fmt_t]
    return MismatchCase(name, "network", truth, story, x, tgt, ref, high, rtol, atol, start=start,
                        source=source)


def build_case(name: str) -> MismatchCase:
    """The corpus case of that name (see CORPUS, and EXTRA_CASES beside it), built from fixed seeds.

    Parameters
    ----------
    name : str
        One of CORPUS ("split-K fp32", "tf32 tensor cores", "transposed strides", ...) or
        EXTRA_CASES.

    Returns
    -------
    MismatchCase
        The target and reference programs, the input, allclose's tolerances and the truth.

    Raises
    ------
    ValueError
        If name is no case, naming the valid ones.

    Examples
    --------
    >>> from precisionlab.intervals import build_case
    >>> case = build_case("transposed strides")
    >>> case.level, case.truth, case.x.shape, (case.rtol, case.atol)
    ('kernel', 'Type-II', (16, 16), (1.3e-06, 1e-05))
    """
    check_choice(name, "case", CORPUS + EXTRA_CASES)
    fp32_seq = Kernel("sequential", acc="float32")
    f64_seq = Kernel("sequential", acc="float64")
    if name == "split-K fp32":
        return _case_matmul(
            name, "Type-I", "fp32 matmul with 4-way split-K vs a one-pass fp32 reference",
            Kernel.from_profile("fp32", splits=4), fp32_seq, tol=(1e-5, 1e-8))
    if name == "atomic split-K, fp16 C":
        return _case_matmul(
            name, "Type-I", "fp16 matmul, fp32 tiles of 256 added into fp16 C by atomics in a random "
            "order, vs fp16 matmul with one fp32 pass", Kernel("atomic", acc="float32", inputs="float16",
                                                          block=256, partial="float16",
                                                          combine="float16", out="float16"),
            Kernel("sequential", acc="float32", inputs="float16", out="float16"), k=2048,
            fmt="float16", atomic_seed=7, source="#1808")
    if name == "tf32 tensor cores":
        return _case_matmul(
            name, "Type-I", "fp32 tensors on A100 tensor cores with TF32 vs an fp32 reference",
            Kernel("tensor_core", inputs="tf32", model="A100"), fp32_seq, k=1024, source="#4551")
    if name == "bf16 autocast":
        return _case_matmul(
            name, "Type-I", "bf16 autocast matmul (fp32 accumulation, bf16 result) checked with fp32 "
            "tolerances", Kernel.from_profile("bf16"), fp32_seq, k=1024,
            tol=ASSERT_CLOSE_TOLERANCES["float32"])
    if name == "fp16 accumulator":
        return _case_matmul(
            name, "Type-I", "fp16 operands summed in an fp16 accumulator vs fp32 accumulation",
            Kernel.from_profile("fp16-acc16"), Kernel("sequential", inputs="float16", out="float16"),
            k=512, fmt="float16")
    if name == "atomic sum":
        return _case_sum(
            name, "Type-I", "sum of 32768 values: fp32 tiles of 256 added by atomics in a random "
            "order, vs a pairwise fp32 sum", Kernel("atomic", acc="float32", block=256),
            Kernel("pairwise", acc="float32"), atomic_seed=3)
    if name == "fp16 softmax kernel":
        rng = np.random.default_rng(11)
        x = round_float64(rng.uniform(-8, 8, size=(16, 256)), "float16")
        tgt = _softmax_kernel("float16", Kernel("warp", acc="float16", threads=128))
        ref = _softmax_kernel("float32", Kernel("pairwise", acc="float32"))
        high = _softmax_kernel("float64", Kernel("warp", acc="float64", threads=128))
        return MismatchCase(name, "kernel", "Type-I", "softmax in fp16 with a warp-shuffle fp16 sum "
                            "vs fp32, checked with fp32 tolerances", x, (tgt,), (ref,), (high,),
                            *ASSERT_CLOSE_TOLERANCES["float32"])
    if name == "transposed strides":
        m = 16
        a = uniform_data((m, m), 21, "float32")
        w = uniform_data((m, m), 22, "float32")
        tgt = _mm_layer("A^T B (swapped strides)", w, fp32_seq)  # reads A, not A^T
        ref = _mm_layer("A^T B", w, fp32_seq, transpose_x=True)
        high = _mm_layer("A^T B (swapped strides)", w, f64_seq)
        return MismatchCase(name, "kernel", "Type-II", "A^T B whose kernel swaps A's two strides, so it "
                            "computes A B", a, (tgt,), (ref,), (high,), 1.3e-6, 1e-5, source="#1666")
    if name == "fused bias dropped":
        return _fused_case(name)
    if name == "bf16 reference":
        return _case_matmul(
            name, "Type-I", "fp32 split-K kernel checked against the library's bf16 autocast matmul "
            "with fp32 tolerances", Kernel.from_profile("fp32", splits=8), Kernel.from_profile("bf16"),
            k=2048, tol=ASSERT_CLOSE_TOLERANCES["float32"], source="#1937")
    if name == "fp16 fast-path tail":
        return _tail_case(name)
    if name == "fp64 build differs":
        return _build_differs_case(name)
    if name == "gradient accumulation":
        return _case_network(
            name, "Type-II", "loss = mean of micro-batch means (4, 16, 4 tokens) instead of the mean "
            "over all tokens", "float32", fp32_seq, "float32", fp32_seq, bug="normalise", start=3,
            source="transformers #34191")
    if name == "bf16 network":
        return _case_network(
            name, "Type-I", "the same network in bf16 (fp32 accumulation) vs fp32, checked with fp32 "
            "tolerances", "bfloat16", Kernel("sequential", acc="float32", inputs="bfloat16",
                                             out="bfloat16"), "float32", fp32_seq,
            tol=ASSERT_CLOSE_TOLERANCES["float32"])
    if name == "split-K network":
        return _case_network(
            name, "Type-I", "logits of the network with atomic split-K fp32 matmuls vs one-pass fp32, "
            "in a bitwise determinism test", "float32", Kernel("atomic", acc="float32", block=16),
            "float32", fp32_seq, atomic_seed=5, tol=(0.0, 0.0), head="logits")
    if name == "softmax over the wrong axis":
        rows, d = 16, 32
        x = uniform_data((rows, d), 41, "float32")
        wq = uniform_data((d, d), 42, "float32", 1 / math.sqrt(d))
        wk = uniform_data((d, d), 43, "float32", 1 / math.sqrt(d))
        tgt = _attention("float32", fp32_seq, wq, wk, wrong_axis=True)
        ref = _attention("float32", fp32_seq, wq, wk)
        high = _attention("float64", f64_seq, wq, wk, wrong_axis=True)
        return MismatchCase(name, "network", "Type-II", "attention scores normalised over the key "
                            "axis of the transposed layout", x, tgt, ref, high, 1.3e-6, 1e-5)
    if name == "masked attention, bf16":
        keys = np.arange(16) < 11  # the last 5 of 16 tokens are padding
        return _case_attention(
            name, "Type-I", "attention in bf16 autocast (fp32 accumulation) with BERT's additive "
            "-1e4 padding mask vs fp32, checked with fp32 tolerances", "bfloat16",
            Kernel("sequential", acc="float32", inputs="bfloat16", out="bfloat16"),
            np.broadcast_to(keys, (16, 16)), _BERT_MASK, tol=ASSERT_CLOSE_TOLERANCES["float32"])
    if name == "causal mask after softmax":
        causal = np.tril(np.ones((16, 16), dtype=bool))
        return _case_attention(
            name, "Type-II", "causal attention whose kernel zeroes the future keys after the "
            "softmax instead of masking the scores with -inf before it", "float32",
            Kernel("sequential", acc="float32"), causal, -math.inf, bug="after")
    raise AssertionError(name)  # pragma: no cover - check_choice covers every name


def _fused_case(name):
    m, k, n = 8, 4096, 16
    bias = uniform_data((n,), 32, "float32", 0.02)
    a = uniform_data((m, k), 30, "float32")
    w = uniform_data((k, n), 31, "float32")
    blocked = Kernel("blocked", acc="float32", block=32)
    keep = np.arange(n) < n - 4
    b_bug = np.where(keep, bias, 0.0)

    def target(x, kernel=blocked, fmt="float32"):
        return add(matmul(x, w, kernel), b_bug, fmt)

    def reference(x):
        return add(matmul(x, w, Kernel("sequential", acc="float64")), bias, "float64")

    return MismatchCase(
        name, "kernel", "Type-II", "fused matmul + bias (blocked fp32) whose epilogue forgets the "
        "bias in the last 4 columns, vs a float64 reference", a,
        (Layer("matmul + bias (fused)", target),), (Layer("matmul + bias", reference),),
        (Layer("matmul + bias (fused)", lambda x: target(x, promote(blocked), "float64")),),
        1.3e-6, 1e-5)


def _dropped_tail(w, kernel, vector: int):
    """x -> x W by kernel with vector loads of `vector`: the last k mod vector products are never loaded."""
    keep = w.shape[0] // vector * vector
    return lambda x: matmul(x[:, :keep], w[:keep], kernel)


def _build_differs_case(name):
    """Like the source's #2680: round-off in the fp16 build, while the float64 build is other code."""
    k = 1027
    rng = np.random.default_rng(60)
    a = round_float64(rng.uniform(-1, 1, (8, k)), "float16")
    w = round_float64(rng.uniform(-1, 1, (k, 8)), "float16")
    tree16 = Kernel("pairwise", acc="float16", inputs="float16")
    lib16 = Kernel("sequential", acc="float32", inputs="float16", out="float16")
    return MismatchCase(
        name, "kernel", "Type-I", "the fp16 build sums in a float16 tree; the float64 build is other "
        "code that drops the last k mod 16 products", a,
        (Layer("matmul (fp16 build)", lambda x: matmul(x, w, tree16)),),
        (Layer("matmul", lambda x: matmul(x, w, lib16)),),
        (Layer("matmul (fp64 build)", _dropped_tail(w, promote(tree16), 16)),),
        *ASSERT_CLOSE_TOLERANCES["float16"], source="#2680")


def _tail_case(name):
    m, k, n = 8, 1027, 8
    a = uniform_data((m, k), 50, "float16")
    w = uniform_data((k, n), 51, "float16")
    fast = Kernel("sequential", acc="float32", inputs="float16", out="float16")
    fp16_path = _dropped_tail(w, fast, 8)  # the last k mod 8 = 3 products are never loaded

    def fp64_path(x):  # the float64 path is scalar code, and correct
        return matmul(x, w, promote(fast))

    ref = Kernel("sequential", acc="float32", inputs="float16", out="float16")
    return MismatchCase(
        name, "kernel", "Type-II", "the fp16 fast path drops the last k mod 8 products; the float64 "
        "path is separate scalar code", a, (Layer("matmul (fp16 path)", fp16_path),),
        (Layer("matmul", lambda x: matmul(x, w, ref)),), (Layer("matmul (fp64 path)", fp64_path),),
        *ASSERT_CLOSE_TOLERANCES["float16"], source="#2680")


CORPUS: tuple[str, ...] = (
    "split-K fp32",
    "atomic split-K, fp16 C",
    "tf32 tensor cores",
    "bf16 autocast",
    "fp16 accumulator",
    "atomic sum",
    "fp16 softmax kernel",
    "bf16 reference",
    "transposed strides",
    "fused bias dropped",
    "fp16 fast-path tail",
    "gradient accumulation",
    "bf16 network",
    "split-K network",
    "softmax over the wrong axis",
    "masked attention, bf16",
    "causal mask after softmax",
)
# Cases built beside the corpus (the chapter's examples of misleading re-execution).
EXTRA_CASES: tuple[str, ...] = ("fp64 build differs",)



