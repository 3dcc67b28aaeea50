"""Programs as layers, their bounds, and the verdict: Type-I (round-off) or Type-II (bug).

Each analysed layer is bounded from the union (hull) of the target's and the reference's
previous outputs; the verdict is Type-II when some layer's reference output cannot be
explained by the target's round-off. Non-finite outputs are compared by identity: the same
infinity (or NaN in both) is no difference; a reference value the bound does not allow
(NaN where the bound cannot be NaN, inf where it cannot reach inf) is outside; with
reference_rule the two bounds must meet instead (their ranges, or NaN allowed by both), so a
reference's own overflow is not a bug; and every element that is non-finite in only one
program is reported with the layer's check.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from ..checks import check_choice
from ..gpu import as_float64
from .interval import RULES, Interval, hull, point
from .outward import INF

# torch.testing.assert_close's default (rtol, atol) per dtype; tf32 results are float32 tensors.
ASSERT_CLOSE_TOLERANCES: dict[str, tuple[float, float]] = {
    "float16": (1e-3, 1e-5), "bfloat16": (1.6e-2, 1e-5), "float32": (1.3e-6, 1e-5),
    "tf32": (1.3e-6, 1e-5), "float64": (1e-7, 1e-7),
}


@dataclass(frozen=True)
class Layer:
    """One step of a program: `run` executes it on arrays; `bound` on intervals (default: run, written with this module's ops).

    A program is a list of layers; `classify` and `propagate` also accept bare callables,
    named after their __name__.

    Parameters
    ----------
    name : str
        The layer's name in the verdict.
    run : callable
        run(x) -> the layer's output for an array x. Written with the package's operations
        (add, mul, matmul, softmax, ...), the same function also bounds an Interval.
    bound : callable or None, default None
        bound(interval) -> Interval, where run cannot take an Interval; None uses run.

    Examples
    --------
    >>> import numpy as np
    >>> from precisionlab.intervals import Layer, mul, point
    >>> double = Layer("double", lambda v: mul(v, 2.0, "float16"))
    >>> double.execute(np.array([0.3])).tolist()
    [0.60009765625]
    >>> b = double.interval(point([0.3]))
    >>> b.lo.tolist(), b.hi.tolist()
    ([0.599609375], [0.60009765625])
    """

    name: str
    run: Callable
    bound: Callable | None = None

    def execute(self, x) -> np.ndarray:
        """The layer's output on an array (float64)."""
        return as_float64(self.run(x))

    def interval(self, x: Interval) -> Interval:
        """The layer's bound on an interval input."""
        out = (self.bound or self.run)(x)
        if not isinstance(out, Interval):
            raise ValueError(f"layer {self.name!r} returned {type(out).__name__} for an Interval input; "
                             "write it with precisionlab.intervals ops or give bound=")
        return out


def as_layers(program) -> list[Layer]:
    """A program (a Layer, a callable or a sequence of them) as a non-empty list of Layers."""
    if isinstance(program, Layer) or callable(program):
        program = [program]
    layers = []
    for i, p in enumerate(program):
        if isinstance(p, Layer):
            layers.append(p)
        elif callable(p):
            layers.append(Layer(getattr(p, "__name__", f"layer {i}"), p))
        else:
            raise ValueError(f"a program is a Layer, a callable or a sequence of them; item {i} is {p!r}")
    if not layers:
        raise ValueError("a program needs at least one layer")
    return layers


def run_layers(program, x) -> list[np.ndarray]:
    """Every layer's output, in order, executing the program on x.

    Parameters
    ----------
    program : Layer or callable or sequence
        The program: a Layer, a callable, or a sequence of them.
    x : float or array_like
        The program's input.

    Returns
    -------
    list of numpy.ndarray
        One float64 output per layer; the last is the program's output.

    Raises
    ------
    ValueError
        If program is empty or an item is neither a Layer nor a callable.

    Examples
    --------
    >>> import numpy as np
    >>> from precisionlab.intervals import add, mul, run_layers
    >>> program = [lambda v: mul(v, 3.0, "float16"), lambda v: add(v, 0.1, "float16")]
    >>> [out.tolist() for out in run_layers(program, np.array([0.1, 0.2]))]
    [[0.300048828125, 0.60009765625], [0.400146484375, 0.7001953125]]
    """
    outs, h = [], x
    for layer in as_layers(program):
        h = layer.execute(h)
        outs.append(h)
    return outs


def _span(n: int, start: int, end: int | None) -> tuple[int, int]:
    end = n if end is None else end
    if isinstance(start, bool) or not isinstance(start, (int, np.integer)) or not 0 <= start < n:
        raise ValueError(f"start must be a layer index in 0..{n - 1}; got start={start!r}")
    if isinstance(end, bool) or not isinstance(end, (int, np.integer)) or not start < end <= n:
        raise ValueError(f"end must be in {start + 1}..{n} (one past the last layer analysed); got end={end!r}")
    return int(start), int(end)


def _check_shapes(layers, t_outs, r_outs, start: int, end: int) -> None:
    """Every reference output the analysis reads has its target output's shape (no broadcasting)."""
    for j in range(max(start - 1, 0), end):
        t, r = np.shape(t_outs[j]), np.shape(r_outs[j])
        if t != r:
            raise ValueError(f"reference output of layer {j} ({layers[j].name!r}) has shape {r}; the "
                             f"target's has shape {t}: the two programs must produce the same shapes")


def propagate(target, x, reference_outputs: Sequence | None = None, rule: str = "structure",
              start: int = 0, end: int | None = None) -> list[Interval]:
    """Bounds of layers start..end-1 of target, each from hull(target's, reference's previous outputs).

    Parameters
    ----------
    target : Layer or callable or sequence
        The program: a Layer, a callable, or a sequence of them.
    x : float or array_like
        The program's input (layer 0 starts from point(x)).
    reference_outputs : sequence of array_like or None, default None
        The reference's output of each layer (at least the first end - 1); None bounds the
        target from its own outputs.
    rule : {"structure", "oblivious"}, default "structure"
        How sums and matmuls inside the layers are bounded.
    start : int, default 0
        The first layer bounded.
    end : int or None, default None
        One past the last layer bounded; None: every layer.

    Returns
    -------
    list of Interval
        One bound per layer start .. end - 1.

    Raises
    ------
    ValueError
        If rule is unknown, start or end is out of range, reference_outputs lists too few
        layers or one of another shape than the target's, or a layer returns no Interval.

    Examples
    --------
    >>> import numpy as np
    >>> from precisionlab.intervals import add, mul, propagate
    >>> program = [lambda v: mul(v, 2.0, "float16"),
    ...            lambda v: add(v, 0.1, "float16")]
    >>> bounds = propagate(program, np.array([0.3, 0.7]))
    >>> len(bounds), bounds[1].lo.tolist(), bounds[1].hi.tolist()
    (2, [0.69970703125, 1.5], [0.7001953125, 1.5009765625])
    """
    check_choice(rule, "rule", RULES)
    layers = as_layers(target)
    start, end = _span(len(layers), start, end)
    t_outs = run_layers(layers[:end], x)
    r_outs = t_outs if reference_outputs is None else [as_float64(r) for r in reference_outputs]
    if len(r_outs) < end - 1:
        raise ValueError(f"reference_outputs lists {len(r_outs)} layer outputs; bounding up to layer "
                         f"{end - 1} needs the first {end - 1}")
    _check_shapes(layers, t_outs, r_outs, start, min(end, len(r_outs)))
    bounds = []
    for i in range(start, end):
        bounds.append(layers[i].interval(_layer_input(i, x, t_outs, r_outs, rule)))
    return bounds


@dataclass(frozen=True)
class LayerCheck:
    """One layer's comparison: the reference against the target's bound."""

    name: str
    verdict: str
    rule: str
    index: tuple  # the worst element
    margin: float  # distance from the reference to the bound's nearer edge (negative: outside)
    score: float  # margin / half the width: 1 at the centre, 0 on an edge, negative outside
    width: float  # the bound's width at that element
    max_width: float  # the bound's largest width
    lo: float
    hi: float
    reference: float
    target: float
    nonfinite: int = 0  # elements where one program is inf/NaN and the other is not the same value
    nonfinite_index: tuple = ()  # the first such element
    nonfinite_target: float = 0.0
    nonfinite_reference: float = 0.0

    def __str__(self) -> str:
        where = "inside" if self.margin >= 0 else "OUTSIDE"
        text = (f"{self.name}: {self.verdict} ({self.rule} bound) at {self.index}: reference "
                f"{self.reference:.9g} {where} [{self.lo:.9g}, {self.hi:.9g}], margin {self.margin:.3g}, "
                f"width {self.width:.3g}")
        if self.nonfinite:
            text += (f"; non-finite in one program only at {self.nonfinite} element(s), first "
                     f"{self.nonfinite_index}: target {self.nonfinite_target:.9g}, reference "
                     f"{self.nonfinite_reference:.9g}")
        return text


@dataclass(frozen=True)
class Verdict:
    """Type-I (round-off) or Type-II (bug), the rule it used, and every analysed layer's check.

    Attributes
    ----------
    verdict : str
        "Type-I" or "Type-II".
    rule : str
        "structure" or "oblivious".
    layers : tuple of LayerCheck
        Per analysed layer: its name, verdict, the worst element's index, margin (negative:
        outside), bound and both programs' values there, and the elements non-finite in
        one program only. Printing a check gives one line.
    """

    verdict: str
    rule: str
    layers: tuple[LayerCheck, ...]

    @property
    def deciding(self) -> LayerCheck:
        """The first Type-II layer, else the layer with the smallest relative margin."""
        bad = [c for c in self.layers if c.verdict == "Type-II"]
        if bad:
            return bad[0]
        return min(self.layers, key=lambda c: c.score)

    @property
    def margin(self) -> float:
        """The deciding layer's margin (negative when the reference lies outside)."""
        return self.deciding.margin

    @property
    def width(self) -> float:
        """The deciding layer's bound width at its worst element."""
        return self.deciding.width

    @property
    def nonfinite(self) -> int:
        """Elements, over the analysed layers, that are inf or NaN in one program and not the same in the other."""
        return sum(c.nonfinite for c in self.layers)

    def __str__(self) -> str:
        return f"{self.verdict} by the {self.rule} bound; " + str(self.deciding)


def _same(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """a == b elementwise, NaN equal to NaN (identity of non-finite values)."""
    return (a == b) | (np.isnan(a) & np.isnan(b))


def _margins(bound: Interval, ref: np.ndarray, ref_bound: Interval | None) -> np.ndarray:
    """min(r_hi - lo, hi - r_lo): >= 0 iff the reference (or its bound's range) meets the target's bound.

    Infinite ends that meet count as touching (margin 0); a NaN reference is inside exactly
    where the bound may be NaN; an empty range (NaN only) meets no real value. With the
    reference's own bound, two bounds also meet where both may be NaN.
    """
    if ref_bound is None:
        rlo, rhi = ref, ref
    else:
        rlo, rhi = ref_bound.lo, ref_bound.hi
    with np.errstate(invalid="ignore"):
        m = np.minimum(rhi - bound.lo, bound.hi - rlo)
    m = np.where(np.isnan(m), 0.0, m)
    m = np.where((rlo > rhi) | bound.empty, -INF, m)
    point_nan = np.where(bound.nan, 0.0, -INF)  # a NaN reference against the target's bound
    if ref_bound is None:
        return np.where(np.isnan(ref), point_nan, m)
    # Two bounds [lo, hi] U N meet where their ranges do or both may be NaN; a NaN reference
    # its own bound allows (its own overflow, inf - inf) is judged by that overlap.
    m = np.where(bound.nan & ref_bound.nan, np.maximum(m, 0.0), m)
    return np.where(np.isnan(ref) & ~ref_bound.nan, point_nan, m)


def _check_layer(name, bound: Interval, ref, target, ref_bound: Interval | None, rule) -> LayerCheck:
    ref, target = as_float64(ref), as_float64(target)
    if ref.shape != bound.shape or target.shape != bound.shape:
        raise ValueError(f"layer {name!r}: the bound has shape {bound.shape}, the reference {ref.shape} "
                         f"and the target {target.shape}; they must match")
    margin = _margins(bound, ref, ref_bound)
    half = bound.width / 2
    scaled = np.isfinite(half) & (half > 0) & np.isfinite(margin)
    with np.errstate(invalid="ignore", divide="ignore"):
        score = np.where(scaled, margin / np.where(scaled, half, 1.0),
                         np.where(margin >= 0, 1.0, -INF))  # a zero-width bound hit exactly
    flat = int(np.argmin(score)) if score.size else 0
    idx = np.unravel_index(flat, bound.shape) if bound.shape else ()
    m = float(margin[idx])
    verdict = "Type-II" if np.any(margin < 0) else "Type-I"
    odd = (~np.isfinite(target) | ~np.isfinite(ref)) & ~_same(target, ref)
    extra = {}
    if odd.any():
        j = np.unravel_index(int(np.argmax(odd)), bound.shape) if bound.shape else ()
        extra = dict(nonfinite=int(odd.sum()), nonfinite_index=tuple(int(i) for i in j),
                     nonfinite_target=float(target[j]), nonfinite_reference=float(ref[j]))
    return LayerCheck(name, verdict, rule, tuple(int(i) for i in idx), m, float(score[idx]),
                      float(bound.width[idx]),
                      float(np.max(bound.width)) if bound.width.size else 0.0,
                      float(bound.lo[idx]), float(bound.hi[idx]), float(ref[idx]), float(target[idx]),
                      **extra)


def classify(target, reference, x, rule: str = "structure", reference_rule: str | None = None,
             start: int = 0, end: int | None = None) -> Verdict:
    """Type-I if every analysed layer's reference output lies in (or, with reference_rule, its bound
    overlaps) the target's bound from hull(previous target and reference outputs); else Type-II.

    target: a Layer, callable or sequence of them. reference: the same kind (run on x), a list
    of every layer's reference output, or one array (the last layer's; the earlier layers are
    then taken to agree with the target's). Every reference output must have its target
    output's shape. reference_rule: None compares the reference as a point (the source's
    test); "structure"/"oblivious" bounds the reference program too (its layers must accept
    intervals) and asks only that the two bounds overlap, which stays sound when the reference
    has round-off of its own. Non-finite values compare by identity (see the module docstring).

    Parameters
    ----------
    target : Layer or callable or sequence
        The program under suspicion, as layers.
    reference : Layer or callable or sequence or numpy.ndarray
        The reference program (run on x), a list of every layer's reference output, or the
        last layer's output alone.
    x : float or array_like
        The input both programs run on.
    rule : {"structure", "oblivious"}, default "structure"
        How sums and matmuls inside the target's layers are bounded.
    reference_rule : {"structure", "oblivious"} or None, default None
        None checks the reference's values as points; a rule bounds the reference program
        too and asks only that the two bounds overlap.
    start : int, default 0
        The first layer analysed.
    end : int or None, default None
        One past the last layer analysed; None: every layer.

    Returns
    -------
    Verdict
        The verdict, the rule, and every analysed layer's check; print it for one line on
        the deciding layer.

    Raises
    ------
    ValueError
        If a rule is unknown, start or end is out of range, the reference has too few
        layers or outputs, a reference output's shape differs from the target's, a single
        reference array is given with end before the last layer, or reference_rule is
        given without the reference as layers.

    Examples
    --------
    A float16 program, 2 x then + 0.1, against float64 outputs: 1.5 is float16 round-off
    of the second layer, 1.6 is not.

    >>> import numpy as np
    >>> from precisionlab.intervals import Layer, add, classify, mul
    >>> program = [Layer("double", lambda v: mul(v, 2.0, "float16")),
    ...            Layer("plus", lambda v: add(v, 0.1, "float16"))]
    >>> x = np.array([0.3, 0.7])
    >>> first = np.array([0.6, 1.4])
    >>> classify(program, [first, np.array([0.7, 1.5])], x).verdict
    'Type-I'
    >>> verdict = classify(program, [first, np.array([0.7, 1.6])], x)
    >>> verdict.verdict, verdict.deciding.name, verdict.deciding.index
    ('Type-II', 'plus', (1,))
    >>> check = verdict.deciding
    >>> check.reference, check.lo, check.hi
    (1.6, 1.4990234375, 1.5009765625)
    """
    check_choice(rule, "rule", RULES)
    if reference_rule is not None:
        check_choice(reference_rule, "reference_rule", RULES)
    layers = as_layers(target)
    start, end = _span(len(layers), start, end)
    t_outs = run_layers(layers[:end], x)
    ref_layers = None
    if isinstance(reference, Layer) or callable(reference) or (
            isinstance(reference, (list, tuple)) and reference and
            all(isinstance(r, Layer) or callable(r) for r in reference)):
        ref_layers = as_layers(reference)
        if len(ref_layers) < end:
            raise ValueError(f"the reference has {len(ref_layers)} layers; the analysis needs {end}")
        r_outs = run_layers(ref_layers[:end], x)
    elif isinstance(reference, (list, tuple)):
        r_outs = [as_float64(r) for r in reference]
        if len(r_outs) < end:
            raise ValueError(f"reference lists {len(r_outs)} layer outputs; the analysis needs {end}")
    else:
        if end != len(layers):
            raise ValueError("a single reference array is the last layer's output: analyse up to the last layer")
        r_outs = [*t_outs[:-1], as_float64(reference)]
    if reference_rule is not None and ref_layers is None:
        raise ValueError("reference_rule needs the reference as layers (it bounds them)")
    return analyse(layers, t_outs, ref_layers, r_outs, x, rule, reference_rule, start, end)


def _layer_input(i, x, t_outs, r_outs, rule):
    """Layer i's input interval: the point x for i = 0, else hull(target's, reference's outputs of layer i-1)."""
    if i == 0:
        return point(x, rule)
    return hull(t_outs[i - 1], r_outs[i - 1], value=t_outs[i - 1], rule=rule)


def analyse(layers, t_outs, ref_layers, r_outs, x, rule, reference_rule, start, end) -> Verdict:
    """classify's loop, on outputs already computed."""
    _check_shapes(layers, t_outs, r_outs, start, end)
    checks = []
    for i in range(start, end):
        inp = _layer_input(i, x, t_outs, r_outs, rule)
        bound = layers[i].interval(inp)
        ref_bound = None
        if reference_rule is not None:
            rinp = Interval(inp.lo, inp.hi, r_outs[i - 1] if i else as_float64(x), reference_rule, inp.nan)
            ref_bound = ref_layers[i].interval(rinp)
        checks.append(_check_layer(layers[i].name, bound, r_outs[i], t_outs[i], ref_bound, rule))
    verdict = "Type-II" if any(c.verdict == "Type-II" for c in checks) else "Type-I"
    return Verdict(verdict, rule, tuple(checks))


def abs_diff(a, b) -> np.ndarray:
    """|a - b| elementwise, 0 where the two are the same value (equal infinities, NaN and NaN), inf where one is NaN."""
    a, b = as_float64(a), as_float64(b)
    with np.errstate(invalid="ignore"):
        d = np.abs(a - b)
    return np.where(_same(a, b), 0.0, np.where(np.isnan(d), INF, d))


def allclose(a, b, rtol: float, atol: float) -> bool:
    """a == b or |a - b| <= atol + rtol |b| everywhere (torch.allclose's test: equal infinities are close, NaN never is).

    Parameters
    ----------
    a, b : float or array_like
        The output checked and the reference; broadcast to one shape. The test is not
        symmetric: rtol scales |b|.
    rtol, atol : float
        The relative and absolute tolerances (`ASSERT_CLOSE_TOLERANCES` has torch's per
        dtype).

    Returns
    -------
    bool
        Whether every element passes.

    Examples
    --------
    >>> import numpy as np
    >>> from precisionlab.intervals import allclose
    >>> allclose([1.0, np.inf], [1.0 + 1e-6, np.inf], rtol=1e-5, atol=1e-8)
    True
    >>> allclose([1.0], [1.1], rtol=1e-5, atol=1e-8), allclose([np.nan], [np.nan], 1e-5, 1e-8)
    (False, False)
    """
    a, b = as_float64(a), as_float64(b)
    with np.errstate(invalid="ignore"):
        return bool(np.all((a == b) | (np.abs(a - b) <= atol + rtol * np.abs(b))))


def high_precision_verdict(target_high, reference, x, rtol: float, atol: float) -> str:
    """The baseline: re-execute the target in high precision; Type-I if it now passes allclose with the reference.

    Parameters
    ----------
    target_high : Layer or callable or sequence or None
        The target program written in high precision (float64); None: not supported.
    reference : Layer or callable or sequence or numpy.ndarray
        The reference program, or its final output.
    x : float or array_like
        The input.
    rtol, atol : float
        allclose's tolerances (`ASSERT_CLOSE_TOLERANCES` has torch's per dtype).

    Returns
    -------
    str
        "Type-I", "Type-II", or "not supported" when target_high is None.

    Examples
    --------
    >>> import numpy as np
    >>> from precisionlab.intervals import high_precision_verdict
    >>> program = [lambda v: v * 2, lambda v: v + 0.1]  # float64
    >>> x = np.array([0.3, 0.7])
    >>> tolerances = {"rtol": 1e-3, "atol": 1e-5}
    >>> high_precision_verdict(program, np.array([0.7, 1.5]), x, **tolerances)
    'Type-I'
    >>> high_precision_verdict(program, np.array([0.7, 1.6]), x, **tolerances)
    'Type-II'
    """
    if target_high is None:
        return "not supported"
    out = run_layers(target_high, x)[-1]
    ref = run_layers(reference, x)[-1] if not isinstance(reference, np.ndarray) else reference
    return "Type-I" if allclose(out, ref, rtol, atol) else "Type-II"
