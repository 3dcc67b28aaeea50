"""precisionlab.intervals: every Kernel field honoured or rejected by name; shapes checked; the NaN convention.

Honoured fields are checked against independent executions: tf32 operands cut or rounded
by masking float32 bit patterns (no precisionlab rounding), bfloat16 storage by ml_dtypes,
float32 sums by NumPy's own float32 additions in a fixed order, and the tensor-core model
fed pre-converted operands.
"""

from __future__ import annotations

import math

import ml_dtypes
import mpmath
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from oracles import sound

from precisionlab import intervals as iv
from precisionlab.gpu import matmul as gpu_matmul
from precisionlab.gpu import tensor_core_matmul

CHOICES = "float16, bfloat16, tf32, float32, float64"


def tf32_bits(x, mode: str) -> np.ndarray:
    """float32 values cut to tf32's 10 fraction bits by bit masks: truncation, or nearest with ties away."""
    w = np.asarray(x, dtype=np.float32).view(np.uint32)
    if mode == "nearest_away":
        w = w + np.uint32(0x1000)  # half a tf32 ulp on the magnitude, then cut: ties go away from 0
    return (w & np.uint32(0xFFFFE000)).view(np.float32).astype(np.float64)


def f32_dot_rows(a, b) -> np.ndarray:
    """C = A B with exact products of <= 12-bit operands and a sequential float32 sum (NumPy scalars)."""
    out = np.empty((a.shape[0], b.shape[1]))
    for i in range(a.shape[0]):
        for j in range(b.shape[1]):
            acc = np.float32(a[i, 0] * b[0, j])
            for k in range(1, a.shape[1]):
                acc = np.float32(acc + np.float32(a[i, k] * b[k, j]))
            out[i, j] = acc
    return out


# --------------------------------------------------------------------------- bad fields, by name


@pytest.mark.parametrize("field", ["acc", "out", "inputs", "partial", "combine", "stored_as"])
def test_an_unknown_format_names_the_field_the_value_and_the_choices(field):
    order = "atomic" if field in ("partial", "combine") else "sequential"
    with pytest.raises(ValueError, match=rf"unknown {field} 'fp12' .*valid choices: {CHOICES}"):
        iv.Kernel(order, **{field: "fp12"})


@pytest.mark.parametrize("field", ["acc", "out", "inputs", "partial", "combine", "stored_as"])
def test_formats_without_infinities_are_rejected_at_construction(field):
    order = "split_k" if field in ("partial", "combine") else "sequential"
    with pytest.raises(ValueError, match=rf"unsupported {field} 'float8_e4m3fn'"):
        iv.Kernel(order, **{field: "float8_e4m3fn"})


@pytest.mark.parametrize("kwargs, words", [
    (dict(order="sequential", block=8), "block applies to order blocked or atomic"),
    (dict(order="pairwise", splits=2), "splits applies to order split_k"),
    (dict(order="blocked", threads=64), "threads applies to order warp"),
    (dict(order="warp", model="V100"), "model applies to order tensor_core"),
    (dict(order="warp", threads=2048), "threads must be a multiple of 32, at most 1024"),
    (dict(order="sequential", input_mode="toward_zero"), "input_mode applies to operands"),
    (dict(inputs="float16", input_mode="stochastic"), "input_mode"),
    (dict(mode="stochastic"), "mode"),
    (dict(order="tensor_core", inputs="float16", mode="toward_zero"), "mode"),
    (dict(order="tensor_core", inputs="float16", model="H200"), "unknown model 'H200'"),
    (dict(order="tensor_core", inputs="float16", out="bfloat16"), "out"),
    (dict(fused="yes", inputs="float32"), "fused must be True or False"),
    (dict(acc=None), "acc"),
])
def test_fields_that_do_not_apply_are_rejected_by_name(kwargs, words):
    with pytest.raises(ValueError, match=words):
        iv.Kernel(**kwargs)


def test_sums_reject_matmul_only_fields():
    x = np.ones((2, 3))
    for kw in (dict(inputs="float16"), dict(stored_as="float32"), dict(inputs="float32", fused=True)):
        with pytest.raises(ValueError, match="sum_"):
            iv.sum_(x, iv.Kernel(**kw))


# --------------------------------------------------------------------------- honoured fields


def test_a_raw_tf32_tensor_core_truncates_its_float32_words():
    rng = np.random.default_rng(0)
    a, b = rng.uniform(-1, 1, (4, 40)), rng.uniform(-1, 1, (40, 3))
    raw = iv.Kernel("tensor_core", inputs="tf32", input_mode="toward_zero", stored_as="float32")
    conv = iv.Kernel("tensor_core", inputs="tf32")
    assert conv.input_mode == "nearest_away"  # the software conversion, cvt.rna
    a32, b32 = np.float32(a).astype(np.float64), np.float32(b).astype(np.float64)
    for kernel, mode in ((raw, "toward_zero"), (conv, "nearest_away")):
        want = tensor_core_matmul(tf32_bits(a32 if kernel is raw else a, mode),
                                  tf32_bits(b32 if kernel is raw else b, mode),
                                  model="A100", inputs="tf32", operands="exact")
        if kernel is conv:  # software conversion of float64 data: no float32 store first
            want = tensor_core_matmul(a, b, model="A100", inputs="tf32", operands="converted")
        got = iv.matmul(a, b, kernel)
        assert np.array_equal(got, want), kernel
        for rule in iv.RULES:
            assert iv.matmul(iv.point(a, rule), b, kernel).contains(got).all()
    assert not np.array_equal(iv.matmul(a, b, raw), iv.matmul(a, b, conv))  # the field changes the result
    assert "tf32 (toward_zero)" in raw.describe() and "stored float32" in raw.describe()


@pytest.mark.parametrize("mode", ["toward_zero", "nearest_away"])
def test_operand_rounding_modes_are_executed(mode):
    rng = np.random.default_rng(1)
    a = np.float32(rng.uniform(-1, 1, (3, 30))).astype(np.float64)
    b = np.float32(rng.uniform(-1, 1, (30, 2))).astype(np.float64)
    k = iv.Kernel("sequential", acc="float32", inputs="tf32", input_mode=mode)
    want = f32_dot_rows(tf32_bits(a, mode), tf32_bits(b, mode))
    assert np.array_equal(iv.matmul(a, b, k), want)
    assert iv.matmul(iv.point(a), b, k).contains(want).all()


def test_stored_as_is_executed_before_the_operand_format():
    rng = np.random.default_rng(2)
    a, b = rng.uniform(-1, 1, (3, 20)), rng.uniform(-1, 1, (20, 2))
    k = iv.Kernel("sequential", acc="float32", stored_as="bfloat16")
    bf = [np.asarray(v, dtype=ml_dtypes.bfloat16).astype(np.float64) for v in (a, b)]
    assert np.array_equal(iv.matmul(a, b, k), f32_dot_rows(*bf))
    assert iv.matmul(iv.point(a), b, k).contains(f32_dot_rows(*bf)).all()


def test_tensor_core_models_and_profiles_are_the_simulators():
    rng = np.random.default_rng(3)
    a = np.asarray(rng.uniform(-1, 1, (4, 33)), dtype=np.float16).astype(np.float64)
    b = np.asarray(rng.uniform(-1, 1, (33, 4)), dtype=np.float16).astype(np.float64)
    for model in ("V100", "T4", "A100"):
        k = iv.Kernel("tensor_core", inputs="float16", model=model)
        assert np.array_equal(iv.matmul(a, b, k), tensor_core_matmul(a, b, model=model, inputs="float16"))
    for profile in ("fp32", "tf32", "tf32-raw", "bf16", "fp16", "fp16-acc16"):
        k = iv.Kernel.from_profile(profile, splits=2)
        got = iv.matmul(a, b, k)
        assert np.array_equal(got, gpu_matmul(a, b, profile, splits=2)), profile
        assert iv.matmul(iv.point(a), b, k).contains(got).all()
    with pytest.raises(ValueError, match="promotes or saturates"):
        iv.Kernel.from_profile("fp8")


def test_promote_keeps_every_field_valid():
    for k in (iv.Kernel("tensor_core", inputs="tf32", input_mode="toward_zero", stored_as="float32"),
              iv.Kernel.from_profile("tf32-raw", 4), iv.Kernel("atomic", partial="float16", block=8),
              iv.Kernel("warp", acc="float16", threads=64)):
        p = iv.promote(k)
        assert p.acc == "float64" and p.inputs is None and p.input_mode is None and p.order != "tensor_core"


# --------------------------------------------------------------------------- shapes in classify and propagate


def test_classify_and_propagate_reject_reference_shapes_that_differ():
    x = np.ones((3, 4))
    w = np.ones((4, 2))
    prog = [iv.Layer("matmul", lambda v: iv.matmul(v, w)), iv.Layer("relu", iv.relu)]
    good = iv.run_layers(prog, x)
    with pytest.raises(ValueError, match=r"shape \(2,\); the target's has shape \(3, 2\)"):
        iv.classify(prog, np.ones(2), x)  # one array, the last layer's: would have broadcast
    with pytest.raises(ValueError, match="layer 0"):
        iv.classify(prog, [np.ones((1, 2)), good[1]], x)
    other = [iv.Layer("matmul", lambda v: iv.matmul(v, np.ones((4, 1)))), iv.Layer("relu", iv.relu)]
    with pytest.raises(ValueError, match="same shapes"):
        iv.classify(prog, other, x)
    with pytest.raises(ValueError, match="shape"):
        iv.propagate(prog, x, [np.ones((3, 1)), good[1]])
    with pytest.raises(ValueError, match="reference_outputs lists 0"):
        iv.propagate(prog, x, [], start=1)
    assert iv.classify(prog, good, x).verdict == "Type-I"
    assert len(iv.propagate(prog, x, good)) == 2


# --------------------------------------------------------------------------- the convention


def test_interval_convention_for_inf_nan_and_empty_ranges():
    b = iv.Interval([1.0, -math.inf, math.nan, 0.0], [math.inf, 2.0, math.nan, 0.0], nan=[False, True, False, False])
    assert list(b.contains(math.inf)) == [True, False, False, False]
    assert list(b.contains(math.nan)) == [False, True, True, False]
    assert list(b.empty) == [False, False, True, False] and list(b.nan) == [False, True, True, False]
    assert list(b.width[:3]) == [math.inf, math.inf, 0.0] and b.width[3] <= 5e-324  # hi - lo rounded up
    p = iv.point([math.inf, math.nan, 1.0])
    assert p.contains([math.inf, math.nan, 1.0]).all() and p.width[0] == 0.0
    h = iv.hull([math.nan, 1.0], [2.0, math.inf])
    assert list(h.lo) == [2.0, 1.0] and list(h.hi) == [2.0, math.inf] and list(h.nan) == [True, False]
    with pytest.raises(ValueError, match="lower bounds must not exceed upper bounds"):
        iv.Interval([2.0], [1.0])
    assert iv.allclose([math.inf, 1.0], [math.inf, 1.0], 0.0, 0.0)
    assert not iv.allclose([math.nan], [math.nan], 1.0, 1.0)


@pytest.mark.parametrize("op, a, b, lo, hi, nan", [
    ("add", [math.inf], [-math.inf], math.inf, -math.inf, True),  # NaN only
    ("add", [(1.0, math.inf)], [(-math.inf, 0.0)], -math.inf, math.inf, True),
    ("mul", [0.0], [(1.0, math.inf)], 0.0, 0.0, True),  # 0 * inf = NaN, 0 * 1 = 0
    ("mul", [(0.0, 2.0)], [math.inf], math.inf, math.inf, True),
    ("div", [(0.0, 1.0)], [(-1.0, 1.0)], -math.inf, math.inf, True),  # 0 / 0
    ("div", [math.inf], [(1.0, math.inf)], 0.0, math.inf, True),  # inf / inf
    ("div", [(1.0, 2.0)], [(2.0, 4.0)], 0.25, 1.0, False),
])
def test_elementwise_rules_follow_ieee_on_non_finite_operands(op, a, b, lo, hi, nan):
    def box(v):
        v = v[0]
        return iv.Interval(*(v if isinstance(v, tuple) else (v, v)))

    r = getattr(iv, op)(box(a), box(b), "float64")
    assert (r.lo[()] <= lo) and (r.hi[()] >= hi) and bool(r.nan) == nan, (r.lo, r.hi, r.nan)
    if lo == math.inf and hi == -math.inf:
        assert r.empty[()]
    for x in (box(a).lo, box(a).hi):  # the operation on the box's ends lies inside
        for y in (box(b).lo, box(b).hi):
            assert r.contains(getattr(iv, op)(x, y, "float64")).all()


@pytest.mark.parametrize("fmt", ["float16", "bfloat16", "float32"])
def test_unary_rules_hold_infinities_nan_and_overflow(fmt):
    x = np.array([-math.inf, -800.0, -1.0, 0.0, 12.0, 89.0, 800.0, math.inf, math.nan])
    p = iv.point(x)
    with np.errstate(invalid="ignore"):
        for op in (lambda v: iv.exp(v, fmt), lambda v: iv.sqrt(v, fmt), iv.relu,
                   lambda v: iv.cast(v, fmt), lambda v: iv.maximum(v, np.zeros(x.shape))):
            b, run = op(p), op(x)
            assert b.contains(run).all()
            assert (b.nan == np.isnan(run)).all()  # the flag is exact on points
        e = iv.exp(p, fmt)
    with mpmath.workprec(80):  # the exact e^x, where it is a number
        for v, lo, hi in zip(x[1:-2], e.lo[1:-2], e.hi[1:-2], strict=True):
            t = mpmath.exp(mpmath.mpf(float(v)))
            assert (lo == 0 or mpmath.mpf(float(lo)) <= t) and (hi == math.inf or t <= mpmath.mpf(float(hi)))
    assert e.lo[0] == 0 and e.hi[-2] == math.inf and e.lo[-2] == math.inf
    m = iv.amax(iv.point(np.array([[1.0, math.nan], [1.0, -math.inf]])))
    assert list(m.nan) == [True, False] and m.empty[0] and m.lo[1] == m.hi[1] == 1.0


# --------------------------------------------------------------------------- any box, any member


@st.composite
def boxes(draw, shape=(3, 4)):
    """Intervals of a format's values with infinite ends, points, NaN flags and NaN-only elements."""
    fmt = draw(st.sampled_from(("float16", "bfloat16", "float32")))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    scale = draw(st.sampled_from((1.0, 3e4, 1e30)))
    a, b = (np.float64(np.asarray(rng.uniform(-scale, scale, shape), dtype=np.float32)) for _ in "ab")
    a, b = iv.cast(a, fmt), iv.cast(b, fmt)
    lo = np.where(rng.random(shape) < 0.1, -math.inf, np.minimum(a, b))
    hi = np.where(rng.random(shape) < 0.1, math.inf, np.maximum(a, b))
    hi = np.where(rng.random(shape) < 0.3, lo, hi)
    empty = rng.random(shape) < 0.04
    box = iv.Interval(np.where(empty, math.inf, lo), np.where(empty, -math.inf, hi), None, "structure",
                      (rng.random(shape) < 0.08) | empty)
    return fmt, box, rng


def members(box: iv.Interval, rng) -> list[np.ndarray]:
    """Arrays of members of the box: its ends, inner points (finite ones for infinite ends), NaN where allowed."""
    lo, hi = box.lo, box.hi
    u, far = rng.random(lo.shape), 1e5 * rng.random(lo.shape)
    with np.errstate(invalid="ignore", over="ignore"):
        inner = np.where(np.isfinite(lo) & np.isfinite(hi), lo + u * (hi - lo),
                         np.where((lo == -math.inf) & np.isfinite(hi), hi - far,
                                  np.where(np.isfinite(lo) & (hi == math.inf), lo + far,
                                           np.where((lo == -math.inf) & (hi == math.inf), far - 5e4, lo))))
    out = []
    for pick in (lo, hi, inner):
        pick = np.where(box.empty, math.nan, pick)
        out.append(np.where(box.nan & (rng.random(lo.shape) < 0.3), math.nan, pick))
    return out


def _sum(kernel):
    return lambda v: iv.sum_(v, kernel, seed=0)


UNARY = {
    "exp": lambda f: lambda v: iv.exp(v, f), "sqrt": lambda f: lambda v: iv.sqrt(v, f),
    "relu": lambda f: iv.relu, "cast": lambda f: lambda v: iv.cast(v, f), "amax": lambda f: iv.amax,
    "softmax": lambda f: lambda v: iv.softmax(v, f), "log_softmax": lambda f: lambda v: iv.log_softmax(v, f),
    "cross_entropy": lambda f: lambda v: iv.cross_entropy(v, np.array([0, 3, 1]), f),
    "sequential sum, toward zero": lambda f: _sum(iv.Kernel(acc=f, mode="toward_zero")),
    "float16 sum, toward zero": lambda f: _sum(iv.Kernel(acc="float16", mode="toward_zero")),
    "pairwise sum": lambda f: _sum(iv.Kernel("pairwise", acc=f)),
    "atomic sum": lambda f: _sum(iv.Kernel("atomic", acc="float16", block=1)),
    "split-K sum, float16 partial": lambda f: _sum(iv.Kernel("split_k", acc=f, splits=2, partial="float16")),
}


@sound(60)
@given(first=boxes(), second=boxes())
def test_every_rule_holds_every_member_of_any_box(first, second):
    fmt, a, rng = first
    _, b, _ = second
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        for name in ("add", "sub", "mul", "div"):
            bound = getattr(iv, name)(a, b, fmt)
            for x in members(a, rng):
                for y in members(b, rng):
                    r = getattr(iv, name)(x, y, fmt)
                    assert bound.contains(r).all(), (name, x, y, r)
        for name, make in UNARY.items():
            op = make(fmt)
            bound = op(a)
            for x in members(a, rng):
                r = op(x)
                assert bound.contains(r).all(), (name, x, r, bound.lo, bound.hi, bound.nan)
        w = iv.Interval(np.minimum(b.lo, b.hi).T[:, :2], np.maximum(b.lo, b.hi).T[:, :2])
        for k in (iv.Kernel("tensor_core", inputs="float16", model="V100", out="float16"),
                  iv.Kernel.from_profile("fp16-acc16")):
            bound = iv.matmul(a, w, k)
            for x in members(a, rng):
                for y in members(w, rng):
                    r = iv.matmul(x, y, k)
                    assert bound.contains(r).all(), (k.describe(), x, y, r)
