"""Soundness of triage's interval rules and pairing: no correct program is ever called Type-II.

Oracles: mpmath (40 digits) for the exact value of each function at the input, torch itself
re-executing the operation in float32, bfloat16 and float16 (on the vectorised path and on the
strided, scalar path, which rounds differently), and float64 references. Inputs are the cases
where fixed ulp budgets break: underflow of 1/(1 + e^-x), cancellation, near-constant rows,
-inf and -1e4 masks, large gaps, fully masked rows, reductions over thousands of terms,
division by tiny numbers, and rewrites that reorder or rename operations.
"""

from __future__ import annotations

import copy
import math
import types

import mpmath
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from box_oracles import rule_bound
from diagnose_models import MaskedEncoder, encoder_batch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from precisionlab import diagnose
from precisionlab.intervals.torch_ops import arith as B
from precisionlab.intervals.torch_ops import rules as R

mpmath.mp.dps = 40
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def derandomised(n: int):
    return settings(max_examples=n, deadline=None, derandomize=True, database=None,
                    suppress_health_check=list(HealthCheck))


def point_bound(name, func, args, kwargs, fmt):
    """The rule's bound when every float input is known exactly (a point)."""
    rec = types.SimpleNamespace(name=name, func=func, args=args, kwargs=kwargs)
    return R.bound(rec, lambda t: B.mk(B._np(t), B._np(t)), fmt)[0]


def inside(b, y) -> np.ndarray:
    """y in the bound; NaN only where the bound is the whole line (no information)."""
    y = np.asarray(y, dtype=np.float64)
    free = (b.lo == -np.inf) & (b.hi == np.inf)
    with np.errstate(invalid="ignore"):
        return ((b.lo <= y) & (y <= b.hi)) | (free & np.isnan(y))


def strided(x: torch.Tensor) -> torch.Tensor:
    """x in a strided buffer: torch's elementwise kernels take their scalar path on it."""
    out = torch.empty(2 * x.numel(), dtype=x.dtype)[::2]
    out.copy_(x.reshape(-1))
    return out.reshape(x.shape)


def _mp_sigmoid(x):
    return 1 / (1 + mpmath.exp(-x))


UNARY = {  # name: (torch function, mpmath oracle)
    "exp": (torch.exp, mpmath.exp),
    "log": (torch.log, lambda x: mpmath.log(x) if x > 0 else (-mpmath.inf if x == 0 else None)),
    "tanh": (torch.tanh, mpmath.tanh),
    "sigmoid": (torch.sigmoid, _mp_sigmoid),
    "silu": (F.silu, lambda x: x * _mp_sigmoid(x)),
    "gelu": (F.gelu, lambda x: x / 2 * (1 + mpmath.erf(x / mpmath.sqrt(2)))),
    "sqrt": (torch.sqrt, lambda x: mpmath.sqrt(x) if x >= 0 else None),
    "rsqrt": (torch.rsqrt, lambda x: 1 / mpmath.sqrt(x) if x > 0 else None),
}


@pytest.mark.parametrize("fmt", ["bfloat16", "float16"])
@pytest.mark.parametrize("name", sorted(UNARY))
def test_unary_rules_hold_for_every_16_bit_input(name, fmt):
    """Every finite bfloat16/float16 value: torch's result on both kernel paths and the float64
    value lie in the rule's bound (sigmoid and SiLU flush to 0 below -88.7, rsqrt's scalar path
    rounds twice)."""
    fn = UNARY[name][0]
    dt = DTYPES[fmt]
    x = torch.arange(-32768, 32768, dtype=torch.int32).to(torch.int16).view(dt)
    x = x[torch.isfinite(x)]
    b = point_bound(name, fn, (x,), {}, fmt)
    for y in (fn(x), fn(strided(x)), fn(x.double())):
        ok = inside(b, y.double().numpy())
        assert ok.all(), (name, fmt, x[~torch.from_numpy(ok)][:4], y[~torch.from_numpy(ok)][:4])
    # and the bound is not vacuous: a few ulps of the format wide in the normal range
    normal = (np.abs(B._np(fn(x.double()))) > 1e-3) & np.isfinite(b.lo) & np.isfinite(b.hi)
    width = (b.hi - b.lo)[normal] / np.abs(B._np(fn(x.double())))[normal]
    assert width.max() < 64 * torch.finfo(dt).eps


@pytest.mark.parametrize("fmt", ["float32", "float64"])
def test_sqrt_rule_holds_every_faithful_root(fmt):
    """torch's CPU sqrt is MKL's vector root on the x86 wheels, faithful but not IEEE's (on an
    AVX-512 Intel Xeon, MKL's AVX-512 path: 0.53 eps |y| off in float32, 0.64 in float64; its
    AVX2 and SSE4.2 paths others). Whatever path a CPU takes, the rule's bound must hold both
    neighbours of the exact root: for 2^20 values over 120 binades and 2^12 subnormals, the
    correctly rounded root, the format's value on the exact root's other side, and torch's own
    result on this machine."""
    g = np.random.default_rng(7)
    dt = getattr(torch, fmt)
    tiny = torch.finfo(dt).smallest_normal
    x = np.concatenate([g.random(1 << 20) * np.exp2(g.integers(-60, 60, 1 << 20)),
                        g.random(1 << 12) * tiny])
    t = torch.from_numpy(x).to(dt)
    b = point_bound("sqrt", torch.sqrt, (t,), {}, fmt)
    xs = t.numpy()
    r = np.sqrt(xs)  # IEEE's root in the format: one neighbour of the exact root
    if fmt == "float32":  # the float64 root (within 2^-53) says on which side the other lies
        r64 = np.sqrt(xs.astype(np.float64))
        other = np.where(r.astype(np.float64) < r64, np.nextafter(r, np.float32(np.inf)),
                         np.where(r.astype(np.float64) > r64, np.nextafter(r, np.float32(0)), r))
        others = [other]
    else:  # the float64 bound is far wider than an ulp (2^-44 slack): both neighbours
        others = [np.nextafter(r, np.inf), np.nextafter(r, 0)]
    for y in (r, *others, torch.sqrt(t).numpy()):
        assert inside(b, y.astype(np.float64)).all()


finite32 = st.floats(-200, 200, width=32, allow_nan=False) | st.sampled_from(
    [-104.0, -89.5, -88.8, -88.0, -1e-30, -0.0, 0.0, 1e-38, 1e-44, 88.5, 89.0])


@derandomised(150)
@given(x=finite32, fmt=st.sampled_from(list(DTYPES)), name=st.sampled_from(sorted(UNARY)))
def test_unary_rules_contain_the_exact_value(x, fmt, name):
    """mpmath's value at the input, and torch's in fmt, lie in the bound."""
    fn, exact = UNARY[name]
    t = torch.tensor([x], dtype=torch.float32).to(DTYPES[fmt])
    b = point_bound(name, fn, (t,), {}, fmt)
    e = exact(mpmath.mpf(float(t)))
    if e is not None:
        assert inside(b, float(e)).all(), (name, fmt, float(t), e, b.lo, b.hi)
    assert inside(b, fn(t).double().numpy()).all()


# ----------------------------------------------------------------------------- whole programs


def cross_precision(op, inputs, pairs=None):
    """(target dtype, reference dtype) pairs whose triage is not Type-I (should be none)."""
    pairs = pairs or [(t, r) for t in DTYPES for r in (t, "float32", "float64")]
    bad = []
    for t, r in pairs:
        td, rd = (getattr(torch, t), getattr(torch, r))
        tgt = lambda *a, td=td: op(*[x.to(td) if x.is_floating_point() else x for x in a])  # noqa: E731
        ref = lambda *a, rd=rd: op(*[x.to(rd) if x.is_floating_point() else x for x in a])  # noqa: E731
        rep = diagnose.triage(ref, tgt, inputs)
        if rep.verdict != "Type-I":
            bad.append((t, r, rep.summary()))
    return bad


def rows(draw, n_rows, n_cols):
    scale = 10.0 ** draw(st.integers(-3, 3))
    offset = draw(st.sampled_from([0.0, 0.0, 1.0, 1e3, -3e4]))
    seed = draw(st.integers(0, 2**31 - 1))
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n_rows, n_cols, generator=g) * scale + offset, g


@st.composite
def row_programs(draw):
    kind = draw(st.sampled_from(["softmax", "log_softmax", "softmax0", "layer_norm", "rms_norm",
                                 "ce_mean", "ce_sum", "ce_none", "masked", "additive"]))
    n = draw(st.sampled_from([3, 17, 300]))
    x, g = rows(draw, 6, n)
    if kind == "softmax":
        return kind, (lambda z: torch.softmax(z, -1)), (x,)
    if kind == "log_softmax":
        return kind, (lambda z: torch.log_softmax(z, -1)), (x,)
    if kind == "softmax0":
        return kind, (lambda z: torch.softmax(z, 0)), (x.T.contiguous(),)
    if kind == "layer_norm":
        w, b = torch.randn(n, generator=g), torch.randn(n, generator=g)
        return kind, (lambda z, w, b: F.layer_norm(z, (n,), w, b)), (x, w, b)
    if kind == "rms_norm":
        w = torch.randn(n, generator=g)
        return kind, (lambda z, w: F.rms_norm(z, (n,), w)), (x, w)
    if kind.startswith("ce"):
        lab = torch.randint(0, n, (6,), generator=g)
        red = kind[3:]
        return kind, (lambda z, y: F.cross_entropy(z, y, reduction=red)), (x, lab)
    mask = torch.rand(6, n, generator=g) > 0.5
    mask[0] = True  # one fully masked row
    if kind == "masked":
        return kind, (lambda z, m: torch.softmax(z.masked_fill(m, float("-inf")), -1)), (x, mask)
    return kind, (lambda z, m: torch.log_softmax(z + m.to(z.dtype) * -1e4, -1)), (x, mask)


@derandomised(40)
@given(prog=row_programs())
def test_row_operations_are_round_off_in_every_precision(prog):
    """softmax, log-softmax, layer/RMS norm and cross entropy, run in float32, bfloat16 and
    float16 against themselves and against float32/float64 references: always Type-I."""
    kind, op, inputs = prog
    assert cross_precision(op, inputs) == [], kind


def test_reductions_of_thousands_of_terms():
    """bfloat16/float16 cross entropy over a large batch (torch keeps partial sums in the dtype;
    float16 overflows to inf), sums along a strided axis, matmuls with k = 4000."""
    g = torch.Generator().manual_seed(0)
    z, lab = torch.randn(3000, 8, generator=g) * 30, torch.randint(0, 8, (3000,), generator=g)
    for red in ("mean", "sum"):
        assert cross_precision(lambda a, y, red=red: F.cross_entropy(a, y, reduction=red),
                               (z, lab)) == []
    a, b = torch.randn(3, 4000, generator=g) + 5, torch.randn(4000, 2, generator=g)
    assert cross_precision(lambda p, q: (p @ q) + p.sum(-1, keepdim=True), (a, b)) == []
    assert cross_precision(lambda p: p.sum(0) / 7.0 - 1.0 / p[0], (a.T.contiguous(),)) == []


def test_infinities_and_nan_from_round_off_are_round_off():
    """A cancellation that goes negative in one program only (sqrt -> NaN there), division by
    numbers that flush to zero in float16, layer norm of a constant row with eps = 0."""
    x = torch.tensor([1.0, 1.0 + 2.0**-20, 3.0, 1e-30])

    def spread(dt):
        def f(v):
            v = v.to(dt)
            return torch.sqrt((v * v).mean() - v.mean() ** 2 - 0.0) + 1.0 / v
        return f
    for t in ("float32", "bfloat16", "float16"):
        assert diagnose.triage(spread(torch.float64), spread(DTYPES[t]), (x,)).verdict == "Type-I"
    c = torch.full((2, 8), 1e4)
    assert cross_precision(lambda v: F.layer_norm(v, (8,), eps=0.0), (c,)) == []


# ----------------------------------------------------------------------------- pairing


def test_correct_rewrites_are_not_paired_op_by_op():
    """Rewrites that reorder operations, move a scale across a matmul, or keep a bfloat16
    reference beside a float32 target: the same names and shapes no longer mean the same
    quantity, and none of them is Type-II."""
    g = torch.Generator().manual_seed(1)
    q, k = torch.randn(2, 5, 8, generator=g), torch.randn(2, 5, 8, generator=g)
    r = diagnose.triage(lambda a, b: (a @ b.transpose(-1, -2)) * 0.125,
                        lambda a, b: (a * 0.125) @ b.transpose(-1, -2), (q, k))
    assert r.verdict == "Type-I", r.summary()
    x = torch.randn(10, generator=g)
    r = diagnose.triage(lambda v: torch.exp(v) + torch.exp(-v),
                        lambda v: torch.exp(-v) + torch.exp(v), (x,))
    assert r.verdict == "Type-I", r.summary()
    torch.manual_seed(0)
    m = MaskedEncoder().eval()
    low = copy.deepcopy(m).to(torch.bfloat16)
    batch = encoder_batch(0)
    for ref, tgt in ((low, m), (m, low)):
        r = diagnose.triage(ref, tgt, batch)
        assert r.verdict == "Type-I" and r.paired > 20, r.summary()


def test_choices_made_on_float_values_may_differ():
    """torch.where on x > 0 and an embedding of an argmax: round-off can flip the choice, so the
    reference's other branch is round-off too."""
    x = torch.linspace(-1e-3, 1e-3, 2001)

    def leaky(dt):
        def f(v):
            y = v.to(dt) * 3.0 - 1e-3
            return torch.where(y > 0, y, y * 0.01)
        return f
    assert diagnose.triage(leaky(torch.float32), leaky(torch.bfloat16), (x,)).verdict == "Type-I"
    torch.manual_seed(0)
    emb, lin = torch.nn.Embedding(10, 4), torch.nn.Linear(4, 10)
    with torch.no_grad():  # two near-tied classes: bfloat16 rounding decides between them
        lin.weight[1] = lin.weight[0] + 1e-3 * torch.randn(4)
        lin.bias[:2] = 5.0

    def greedy(dt):
        e, li = copy.deepcopy(emb).to(dt), copy.deepcopy(lin).to(dt)
        return lambda tok: e(li(e(tok)).argmax(-1))
    tok = torch.randint(0, 10, (200,))
    with torch.no_grad():
        e16, l16 = copy.deepcopy(emb).to(torch.bfloat16), copy.deepcopy(lin).to(torch.bfloat16)
        flips = lin(emb(tok)).argmax(-1) != l16(e16(tok)).argmax(-1)
    assert flips.any()  # the choices really differ somewhere
    assert diagnose.triage(greedy(torch.float32), greedy(torch.bfloat16), (tok,)).verdict == \
        "Type-I"


def test_values_leaving_torch_and_aliased_writes_raise_naming_the_call():
    def f(v):
        return v * v.sum().item()
    with pytest.raises(diagnose.UnsupportedOperation, match=r"\(item\)"):
        diagnose.triage(f, f, torch.randn(3))

    def g(v):  # the view w sees the in-place update of h: its bound would be stale
        h = v * 2.0
        w = h[:2]
        h.mul_(3.0)
        return w + 1.0
    with pytest.raises(diagnose.UnsupportedOperation, match="in-place mul_"):
        diagnose.triage(g, g, torch.randn(3))

    def ok(v):  # in place on a fresh tensor nobody views: followed
        h = v * 2.0
        h += 1.0
        return torch.relu_(h)
    assert diagnose.triage(ok, ok, torch.randn(3)).verdict == "Type-I"


def test_planted_bugs_still_caught_after_the_fixes():
    """The soundness fixes do not blind the tool: a wrong softmax axis and a wrong scale are
    Type-II, blamed inside the function, the differing argument named."""
    g = torch.Generator().manual_seed(2)
    s = torch.randn(4, 6, 6, generator=g)
    r = diagnose.triage(lambda z: torch.softmax(z * 0.5, -1) @ z,
                        lambda z: torch.softmax(z * 0.5, -2) @ z, (s,))
    assert r.verdict == "Type-II"
    assert any("softmax" in x and "-2 vs -1" in x for x in r.suspects), r.suspects
    r = diagnose.triage(lambda z: torch.softmax(z * 0.5, -1), lambda z: torch.softmax(z * 0.25, -1),
                        (s,))
    assert r.verdict == "Type-II" and r.blamed.widths_outside > 1
    assert math.isfinite(r.blamed.widths_outside)


def test_abs_of_boxes_and_specials():
    """abs (T5's relative positions; torch.abs, Tensor.abs, abs()): the box folded at 0, exact;
    NaN only where the box is the whole line."""
    x = torch.tensor([-3.0, -0.5, 0.0, 2.0, float("inf"), -float("inf"), float("nan")])
    lo = np.array([-3.0, -0.5, -1.0, 2.0, 1.0, -np.inf, -np.inf])
    hi = np.array([-2.0, 0.25, 1.0, 2.5, np.inf, -1.0, np.inf])
    for name in ("abs", "__abs__"):
        b = rule_bound(name, torch.abs, (x,), {}, "float32", boxes={id(x): (lo, hi)})[0]
        np.testing.assert_array_equal(b.lo[:6], [2.0, 0.0, 0.0, 2.0, 1.0, 1.0])
        np.testing.assert_array_equal(b.hi[:6], [3.0, 0.5, 1.0, 2.5, np.inf, np.inf])
        assert inside(b, torch.abs(x)).all()
