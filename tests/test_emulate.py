"""precisionlab.emulate against oracles: sequential NumPy sums, math.exp/log, float64 gradcheck,
torch's optimizers; and the same bits under every kernel dispatch level and thread count.

Also the defaults (float32), the native back end against torch's own op in the same dtype,
optional operands (no bias, no weight, a bias that needs no gradient), inputs of more than two
dimensions, the float32 format (where a float32 intermediate rounds twice and float64 does
not), and the parameter names in error messages. Oracles there: float64 arithmetic followed
by one cast to float32 (exact for one +, -, *, / since 53 >= 2 * 24 + 2), exact sums
(math.fsum), mpmath, torch.
"""

from __future__ import annotations

import math
import textwrap
from fractions import Fraction

import mpmath as mp
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from precisionlab import emulate as em
from precisionlab.emulate import kernels
from precisionlab.emulate.elementary import cos2pi64
from precisionlab.emulate.summation import sum_over, sum_to
from precisionlab.formats import get_format
from precisionlab.rounding import round_to

F64 = em.Precision("float64", "float64")
BF16_NATIVE = em.Precision("bfloat16", backend="native")


def _randn(*shape, seed=0, dtype=torch.float32):
    return em.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=dtype)


def _x(*shape, seed=0, lo=-2.0, hi=2.0):
    """float32 values uniform in [lo, hi) (torch.rand in float64, cast once)."""
    u = torch.rand(*shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    return (lo + (hi - lo) * u).float()


def _bits_equal(a, b):
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)


def _sequential_oracle(a: np.ndarray, b: np.ndarray, dtype) -> np.ndarray:
    """acc <- acc + a[:, k] b[k, :], k = 0..K-1, each product and sum rounded to dtype (NumPy, no FMA)."""
    a, b = a.astype(dtype), b.astype(dtype)
    acc = np.zeros((a.shape[0], b.shape[1]), dtype=dtype)
    for k in range(a.shape[1]):
        acc = acc + (a[:, k:k + 1] * b[k:k + 1, :]).astype(dtype)
    return acc


# --------------------------------------------------------------------------- the precision


def test_precision_rejects_bad_input():
    with pytest.raises(ValueError, match="accumulate"):
        em.Precision("bfloat16", accumulate="float16")
    with pytest.raises(ValueError, match="backend"):
        em.Precision("bfloat16", backend="gpu")
    with pytest.raises(ValueError, match="narrower"):
        em.Precision("float64", accumulate="float32")
    with pytest.raises(ValueError, match="torch dtype"):
        em.Precision("tf32", backend="native")
    with pytest.raises(ValueError, match="float8_e4m3fn"):
        em.Precision("fp4")
    with pytest.raises(TypeError, match="prec"):
        em.exp(torch.ones(2), prec=3)


def test_precision_accepts_aliases():
    assert em.Precision("bf16").fmt == "bfloat16"
    assert em.Precision("float64", "float64").container == torch.float64


@pytest.mark.parametrize("name", ["exp", "log", "tanh", "sigmoid", "gelu", "silu", "log_softmax",
                                  "rms_norm", "sum", "mean"])
def test_the_default_precision_is_float32(name):
    x = _x(3, 5, lo=0.25)
    f = getattr(em, name)
    assert _bits_equal(f(x), f(x, prec=em.Precision("float32")))


def test_the_default_precision_of_products_losses_norms_and_adam_is_float32():
    a, b, t = _x(3, 4, seed=1), _x(4, 2, seed=2), _x(3, 4, seed=3)
    f32 = em.Precision("float32")
    assert _bits_equal(em.matmul(a, b), em.matmul(a, b, f32))
    assert _bits_equal(em.linear(a, b.T), em.linear(a, b.T, prec=f32))
    assert _bits_equal(em.mse_loss(a, t), em.mse_loss(a, t, f32))
    x = _x(2, 4, 3, seed=4)
    assert _bits_equal(em.group_norm(x, 2), em.group_norm(x, 2, prec=f32))
    # Adam's default: one step, w - lr g/(|g| + eps) in float64 (m_hat = g, v_hat = g^2), then float32
    w, g = _x(5, seed=5), _x(5, seed=6)
    p = torch.nn.Parameter(w.clone())
    p.grad = g.clone()
    em.Adam([p]).step()
    w64, g64 = w.double(), g.double()
    m = (0.1 * g64).float().double() / 0.1
    v = (0.001 * g64 * g64).float().double() / (1 - 0.999)
    want = (w64 - 1e-3 * m / (torch.from_numpy(np.sqrt(v.numpy())) + 1e-8)).float()  # IEEE's root
    assert torch.equal(p.detach(), want)


# --------------------------------------------------------------------------- the matmul


@pytest.mark.parametrize("fmt", ["float32", "bfloat16", "float16"])
@pytest.mark.parametrize("acc", ["float32", "float64"])
def test_matmul_is_the_sequential_sum(fmt, acc):
    prec = em.Precision(fmt, acc)
    a, b = _randn(23, 150, seed=1), _randn(150, 17, seed=2)
    got = em.matmul(a, b, prec)
    ar, br = round_to(a, fmt).numpy(), round_to(b, fmt).numpy()
    want = round_to(_sequential_oracle(ar, br, np.dtype(acc)), fmt).astype(np.float32)
    assert got.dtype == torch.float32
    np.testing.assert_array_equal(got.numpy(), want)


def test_matmul_float64_accumulation_of_exact_products_matches_fractions():
    # bf16 operands of one binade: every partial sum is exact in float64, so it equals the rational sum.
    a = round_to(1 + torch.rand(4, 64, generator=torch.Generator().manual_seed(3)), "bfloat16")
    b = round_to(1 + torch.rand(64, 3, generator=torch.Generator().manual_seed(4)), "bfloat16")
    got = np.empty((4, 3))  # the accumulator loop of emulate.matmul, in float64
    kernels.gemm(a.double().numpy(), b.double().numpy(), got)
    from fractions import Fraction
    for i in range(4):
        for j in range(3):
            exact = sum(Fraction(float(a[i, k])) * Fraction(float(b[k, j])) for k in range(64))
            assert Fraction(float(got[i, j])) == exact


def test_linear_bias_joins_the_accumulator_before_one_rounding():
    prec = em.Precision("bfloat16")
    x, w, b = _randn(5, 40, seed=5), _randn(7, 40, seed=6), _randn(7, seed=7)
    got = em.linear(x, w, b, prec).numpy()
    acc = _sequential_oracle(round_to(x, prec.fmt).numpy(), round_to(w, prec.fmt).numpy().T, np.float32)
    want = round_to(acc + round_to(b, prec.fmt).numpy(), prec.fmt)
    np.testing.assert_array_equal(got, want)


def test_linear_backward_uses_the_same_matmul():
    prec = em.Precision("float16")
    x = _randn(6, 30, seed=8).requires_grad_()
    w = _randn(4, 30, seed=9).requires_grad_()
    b = _randn(4, seed=10).requires_grad_()
    g = _randn(6, 4, seed=11)
    em.linear(x, w, b, prec).backward(g)
    gr = round_to(g, "float16").numpy()
    wr, xr = round_to(w, "float16").numpy(), round_to(x, "float16").numpy()
    np.testing.assert_array_equal(x.grad.numpy(), round_to(_sequential_oracle(gr, wr, np.float32), "float16"))
    np.testing.assert_array_equal(w.grad.numpy(), round_to(_sequential_oracle(gr.T, xr, np.float32), "float16"))
    want_b = np.array([math.fsum(col) for col in gr.T.astype(np.float64)])
    np.testing.assert_array_equal(b.grad.numpy(), round_to(want_b, "float16").astype(np.float32))


def test_linear_handles_leading_dimensions_and_checks_shapes():
    x, w = _randn(2, 3, 8, seed=12), _randn(5, 8, seed=13)
    y = em.linear(x, w, prec="bfloat16")
    assert y.shape == (2, 3, 5)
    np.testing.assert_array_equal(y.reshape(6, 5).numpy(), em.linear(x.reshape(6, 8), w, prec="bfloat16").numpy())
    with pytest.raises(ValueError, match="linear needs"):
        em.linear(x, _randn(5, 7), prec="bfloat16")
    with pytest.raises(ValueError, match="matmul needs"):
        em.matmul(x, w, "bfloat16")


@pytest.mark.parametrize("fn", ["matmul", "linear"])
def test_gradcheck_float64(fn):
    a = _randn(5, 7, seed=14, dtype=torch.float64).requires_grad_()
    b = _randn(7, 3, seed=15, dtype=torch.float64).requires_grad_()
    c = _randn(5, seed=16, dtype=torch.float64).requires_grad_()
    if fn == "matmul":
        assert torch.autograd.gradcheck(lambda p, q: em.matmul(p, q, F64), (a, b))
    else:
        assert torch.autograd.gradcheck(lambda p, q, r: em.linear(q.T, p, r, F64), (a, b, c))


# --------------------------------------------------------------------------- shapes and optional operands


def test_sum_keeps_the_dimension_when_asked():
    x = _x(3, 4)
    assert em.sum(x, 1, keepdim=True).shape == (3, 1) and em.sum(x, 1).shape == (3,)
    assert em.mean(x, 0, keepdim=True).shape == (1, 4)


def test_rms_norm_and_log_softmax_work_row_by_row_in_three_dimensions():
    # each (last-dim) row is normalised on its own: the batched result equals the rows one at a time
    x = _x(2, 3, 4, seed=7)
    x[1, 2] *= 300.0  # a row far larger than the others (log_softmax's shift must be per row)
    for f in (em.rms_norm, em.log_softmax):
        rows = torch.stack([f(r, "bfloat16") for r in x.reshape(-1, 4)]).reshape(2, 3, 4)
        assert _bits_equal(f(x, "bfloat16"), rows)
    xs = torch.tensor([[0.0, 1.0], [0.0, 1000.0]])
    want = torch.tensor([-math.log1p(math.e), -math.log1p(math.exp(-1))], dtype=torch.float64).float()
    assert torch.equal(em.log_softmax(xs)[0], want)


def _grads(fn, *ts):
    leaves = [None if t is None else t.clone().requires_grad_() for t in ts]
    out = fn(*leaves)
    out.backward(_x(*out.shape, seed=11))
    return out, [None if t is None else t.grad for t in leaves]


@pytest.mark.parametrize("fmt", ["bfloat16", "float32"])
def test_group_norm_with_only_a_weight_or_only_a_bias(fmt):
    # weight 1 and bias 0 are exact: leaving either out must give the same bits and gradients
    x, w, b = _x(2, 4, 3, seed=1), _x(4, seed=2), _x(4, seed=3)
    ones, zeros = torch.ones(4), torch.zeros(4)
    y1, (gx1, gw1, _) = _grads(lambda x, w, z: em.group_norm(x, 2, w, z, fmt), x, w, zeros)
    y2, (gx2, gw2) = _grads(lambda x, w: em.group_norm(x, 2, w, None, fmt), x, w)
    assert _bits_equal(y1, y2) and _bits_equal(gx1, gx2) and _bits_equal(gw1, gw2)
    y3, (gx3, _, gb3) = _grads(lambda x, o, b: em.group_norm(x, 2, o, b, fmt), x, ones, b)
    y4, (gx4, gb4) = _grads(lambda x, b: em.group_norm(x, 2, None, b, fmt), x, b)
    assert _bits_equal(y3, y4) and _bits_equal(gx3, gx4) and _bits_equal(gb3, gb4)


def test_linear_weight_gradient_without_a_bias_or_with_a_constant_one():
    x, w, b = _x(5, 3, seed=1), _x(2, 3, seed=2), _x(2, seed=3)
    _, (gx1, gw1) = _grads(lambda x, w: em.linear(x, w, None, "bfloat16"), x, w)
    _, (gx2, gw2, _) = _grads(lambda x, w, z: em.linear(x, w, z, "bfloat16"), x, w, torch.zeros(2))
    assert _bits_equal(gx1, gx2) and _bits_equal(gw1, gw2)
    xl, wl = x.clone().requires_grad_(), w.clone().requires_grad_()
    em.linear(xl, wl, b, "bfloat16").backward(_x(5, 2, seed=11))  # b needs no gradient
    assert _bits_equal(wl.grad, gw1)


def test_linear_bias_gradient_in_float32_is_one_rounding_of_the_exact_sum():
    # 64 rows of float32 values in [2^-8, 2^8): their float64 sum is exact, a float32 one is not
    n = 64
    g = (_x(n, 2, seed=21, lo=-8.0, hi=8.0).double().exp2() * torch.sign(_x(n, 2, seed=22))).float()
    b = torch.zeros(2, requires_grad=True)
    em.linear(torch.zeros(n, 3), torch.zeros(2, 3), b, "float32").backward(g)
    want = [float(np.float32(math.fsum(g[:, j].tolist()))) for j in range(2)]
    assert b.grad.tolist() == want


# --------------------------------------------------------------------------- float64 building blocks


@settings(max_examples=300, deadline=None)
@given(st.floats(min_value=-745.0, max_value=709.7, allow_nan=False))
def test_exp64_within_one_ulp_of_libm(x):
    got = float(em.exp64(torch.tensor([x], dtype=torch.float64)))
    want = math.exp(x)
    assert abs(got - want) <= 1.01 * math.ulp(want) if want > 0 else got == 0


@settings(max_examples=300, deadline=None)
@given(st.floats(min_value=5e-324, max_value=1.7e308, allow_nan=False))
def test_log64_within_two_ulp_of_libm(x):
    got = float(em.log64(torch.tensor([x], dtype=torch.float64)))
    want = math.log(x)
    assert abs(got - want) <= 2 * math.ulp(want) + 1e-300


def test_exp_log_special_values():
    inf, nan = math.inf, math.nan
    e = em.exp64(torch.tensor([0.0, inf, -inf, nan, 710.0, -746.0], dtype=torch.float64))
    assert e[:3].tolist() == [1.0, inf, 0.0] and math.isnan(e[3]) and e[4] == inf and e[5] == 0
    lg = em.log64(torch.tensor([0.0, 1.0, inf, -1.0, nan], dtype=torch.float64))
    assert lg[:3].tolist() == [-inf, 0.0, inf] and lg[3:].isnan().all()


def _is_correctly_rounded_root(y: float, x: float) -> bool:
    """y = RN(sqrt x) for finite x >= 0, in exact rationals: x within y's rounding interval squared."""
    if y == 0:
        return x == 0
    below, above = Fraction(math.ulp(math.nextafter(y, 0))) / 2, Fraction(math.ulp(y)) / 2
    return (Fraction(y) - below) ** 2 <= Fraction(x) <= (Fraction(y) + above) ** 2


def test_sqrt64_is_the_correctly_rounded_root_over_the_whole_range():
    """sqrt64 against Python's math.sqrt (C's sqrt: IEEE 754's correctly rounded root) on 2^17
    values from subnormals to the largest float64, on squares of doubles and their neighbours
    (the roots nearest a rounding tie), and on an exact-rational check of 3000 of them.
    torch.sqrt is not this oracle: on an AVX-512 Intel Xeon MKL's root (its AVX-512 path)
    differs from it in about 0.8% of these values."""
    g = np.random.default_rng(11)
    x = np.abs(g.standard_normal(1 << 17)) * np.exp2(g.integers(-1074, 1023, 1 << 17))
    y0 = g.random(4096) + 1.0  # roots in [1, 2): x = y^2 rounded, and the values beside it
    sq = y0 * y0
    x = np.concatenate([x, sq, np.nextafter(sq, 0), np.nextafter(sq, 4), [5e-324, 2.2250738585072014e-308,
                                                                             1.7976931348623157e308]])
    x = x[np.isfinite(x)]
    got = em.sqrt64(torch.from_numpy(x)).numpy()
    assert got.tolist() == [math.sqrt(v) for v in x.tolist()]
    assert all(_is_correctly_rounded_root(float(got[i]), float(x[i])) for i in range(0, x.size, x.size // 3000))
    special = em.sqrt64(torch.tensor([0.0, -0.0, math.inf, -1.0, math.nan], dtype=torch.float64))
    assert special[:3].tolist() == [0.0, 0.0, math.inf] and math.copysign(1, special[1]) == -1
    assert special[3:].isnan().all()


def test_sqrt64_gradient_is_torchs_formula_and_float32_input_is_widened():
    x = torch.tensor([0.25, 2.0, 1e-300, 7.0], dtype=torch.float64, requires_grad=True)
    y = em.sqrt64(x)
    g = torch.tensor([1.0, -3.0, 0.5, 2.0], dtype=torch.float64)
    y.backward(g)
    assert x.grad.tolist() == [gi / (2 * math.sqrt(v)) for gi, v in zip(g.tolist(), x.tolist(), strict=True)]
    y32 = em.sqrt64(torch.tensor([2.0], dtype=torch.float32))
    assert y32.dtype == torch.float64 and float(y32) == math.sqrt(2.0)
    y0 = em.sqrt64(torch.tensor(9.0, dtype=torch.float64))  # a 0-d tensor stays 0-d
    assert y0.shape == () and float(y0) == 3.0


def _pairwise_oracle(v: list[float]) -> float:
    """The documented tree: pad to even with 0, add x_i + x_(i+h), repeat."""
    while len(v) > 1:
        if len(v) % 2:
            v = [*v, 0.0]
        h = len(v) // 2
        v = [v[i] + v[i + h] for i in range(h)]
    return v[0] if v else 0.0


@settings(max_examples=100, deadline=None)
@given(st.lists(st.floats(-1e6, 1e6), min_size=0, max_size=70))
def test_fixed_sum_is_the_documented_tree(values):
    x = torch.tensor(values, dtype=torch.float64)
    assert float(em.fixed_sum(x, 0)) == _pairwise_oracle(list(values))


def test_fixed_sum_error_is_within_the_pairwise_bound():
    x = _randn(1000, seed=17, dtype=torch.float64).exp()
    exact = math.fsum(x.tolist())
    # pairwise summation: |error| <= ceil(log2 n) u sum|x| (plus second-order terms)
    assert abs(float(em.fixed_sum(x, 0)) - exact) <= 10 * 2**-53 * exact * 1.01


@pytest.mark.parametrize("name", ["exp", "tanh", "sigmoid", "gelu", "silu", "log"])
def test_unary_gradcheck_and_values(name):
    x = _randn(4, 6, seed=18, dtype=torch.float64)
    if name == "log":
        x = x.abs() + 0.5
    x.requires_grad_()
    f = getattr(em, name)
    assert torch.autograd.gradcheck(lambda z: f(z, F64), (x,))
    ref = {"exp": torch.exp, "log": torch.log, "tanh": torch.tanh, "sigmoid": torch.sigmoid,
           "silu": torch.nn.functional.silu,
           "gelu": lambda z: torch.nn.functional.gelu(z, approximate="tanh")}[name]
    torch.testing.assert_close(f(x, F64), ref(x), rtol=1e-14, atol=1e-15)


@pytest.mark.parametrize("fmt", ["bfloat16", "float16", "float32"])
def test_results_are_rounded_once_to_the_format(fmt):
    x = _randn(3, 50, seed=19)
    for y in (em.gelu(x, fmt), em.log_softmax(x, fmt), em.rms_norm(x, fmt), em.sum(x, 1, prec=fmt)):
        np.testing.assert_array_equal(y.numpy(), round_to(y, fmt).numpy())
    # one rounding of the float64 value, not two
    xr = round_to(x, fmt).double()  # the operand is stored in the format first
    want = round_to(torch.nn.functional.gelu(xr, approximate="tanh"), fmt).float()
    assert (em.gelu(x, fmt) != want).float().mean() < 1e-3


def test_norms_softmax_losses_gradcheck_and_values():
    x = _randn(5, 7, seed=20, dtype=torch.float64).requires_grad_()
    t = _randn(5, 7, seed=21, dtype=torch.float64)
    cases = [
        (lambda z: em.rms_norm(z, F64), lambda z: torch.nn.functional.rms_norm(z, (7,), eps=1e-6)),
        (lambda z: em.log_softmax(z, F64), lambda z: torch.log_softmax(z, -1)),
        (lambda z: em.sum(z, 1, prec=F64), lambda z: z.sum(1)),
        (lambda z: em.mean(z, 0, True, prec=F64), lambda z: z.mean(0, keepdim=True)),
        (lambda z: em.mean(z, prec=F64), lambda z: z.mean()),
        (lambda z: em.mse_loss(z, t, F64), lambda z: torch.nn.functional.mse_loss(z, t)),
    ]
    for f, ref in cases:
        assert torch.autograd.gradcheck(f, (x,))
        torch.testing.assert_close(f(x), ref(x), rtol=1e-13, atol=1e-14)
    with pytest.raises(ValueError, match="equal shapes"):
        em.mse_loss(x, t[:3], F64)


def test_randn_is_standard_normal_and_cos_is_accurate():
    z = em.randn(200_000, generator=torch.Generator().manual_seed(29), dtype=torch.float64)
    assert abs(float(z.mean())) < 0.01 and abs(float(z.std()) - 1) < 0.01
    # Kolmogorov-Smirnov distance to Phi, far below the 1% critical value 1.63/sqrt(n)
    zs = np.sort(z.numpy())
    phi = 0.5 * (1 + np.vectorize(math.erf)(zs / math.sqrt(2)))
    ks = np.max(np.abs(phi - np.arange(1, zs.size + 1) / zs.size))
    assert ks < 1.63 / math.sqrt(zs.size)
    u = torch.rand(10_000, generator=torch.Generator().manual_seed(30), dtype=torch.float64)
    want = torch.tensor([math.cos(2 * math.pi * v) for v in u.tolist()], dtype=torch.float64)
    assert float((cos2pi64(u) - want).abs().max()) < 8 * 2**-53  # both round 2 pi u
    with pytest.raises(TypeError, match="generator"):
        em.randn(3, generator=0)
    with pytest.raises(ValueError, match="dtype"):
        em.randn(3, generator=torch.Generator(), dtype=torch.float16)


def test_randn_is_box_muller_on_two_uniforms_per_sample():
    # Oracle: the formula in Python scalars (math.log, math.cos) on the same float64 uniforms,
    # U1 the first n of the stream, U2 the next n; then the stream has moved exactly 2n draws.
    g = torch.Generator().manual_seed(31)
    z = em.randn(4, 5, generator=g, dtype=torch.float64)
    u = torch.rand(2, 20, generator=torch.Generator().manual_seed(31), dtype=torch.float64)
    want = [math.sqrt(-2.0 * math.log(1.0 - a)) * math.cos(2.0 * math.pi * b)
            for a, b in zip(u[0].tolist(), u[1].tolist(), strict=True)]
    np.testing.assert_allclose(z.reshape(-1).numpy(), want, rtol=1e-14, atol=1e-15)
    fresh = torch.Generator().manual_seed(31)
    torch.rand(40, generator=fresh, dtype=torch.float64)
    assert torch.equal(torch.rand(3, generator=g, dtype=torch.float64),
                       torch.rand(3, generator=fresh, dtype=torch.float64))
    f32 = em.randn(4, 5, generator=torch.Generator().manual_seed(31))
    assert f32.dtype == torch.float32 and torch.equal(f32, z.float())


# --------------------------------------------------------------------------- float32: no double rounding


def test_log_and_gelu_gradients_in_float32_round_once():
    x = _x(4000, seed=31, lo=0.05, hi=3.0)
    g = torch.full_like(x, 3.0)
    xl = x.clone().requires_grad_()
    em.log(xl, "float32").backward(g)
    assert torch.equal(xl.grad, (3.0 / x.double()).float())  # one rounding of 3/x
    xs = _x(4000, seed=32, lo=-3.0, hi=3.0)
    xl = xs.clone().requires_grad_()
    em.gelu(xl, "float32").backward(torch.ones_like(xs))
    c, d = math.sqrt(2.0 / math.pi), xs.double()
    t = torch.tensor([math.tanh(v) for v in (c * (d + 0.044715 * d**3)).tolist()], dtype=torch.float64)
    dy = 0.5 * (1 + t) + 0.5 * d * (1 - t * t) * c * (1 + 3 * 0.044715 * d * d)
    assert (xl.grad != dy.float()).sum() <= 2  # float64 libm vs the package's tanh: ties only


def test_log64_of_float32_input_is_computed_in_float64():
    x = _x(2000, seed=41, lo=0.01, hi=50.0)
    y = em.log64(x)
    assert y.dtype == torch.float64
    assert max(abs(a - math.log(v)) / math.ulp(math.log(v)) for a, v in zip(y.tolist(), x.tolist(), strict=True)
               if abs(math.log(v)) > 1e-3) <= 2


# 2 pi u near +-pi/4 mod pi/2, where the series' last terms decide the last bit: correctly rounded here
_COS_POINTS = ["0x1.c035d14fe8555p-1", "0x1.c0e7c75d0204ap-1", "0x1.3f405ecef2abap-1",
               "0x1.40a7c1b9159ccp-1", "0x1.0094538b58f4cp-3", "0x1.bf1ccbd9a3625p-1"]


def test_cos2pi_is_correctly_rounded_at_the_octant_edges():
    mp.mp.prec = 200
    u = [float.fromhex(h) for h in _COS_POINTS]
    got = cos2pi64(torch.tensor(u, dtype=torch.float64)).tolist()
    assert got == [float(mp.cos(2 * mp.pi * mp.mpf(v))) for v in u]


# --------------------------------------------------------------------------- sums over several dims


def test_sum_to_and_sum_over_undo_broadcasting_like_torch():
    g = torch.tensor([[[1.0, 2.0, 4.0]], [[8.0, 16.0, 32.0]]]).expand(2, 2, 3)  # exact sums
    assert torch.equal(sum_to(g, torch.Size([1, 3])), g.sum(dim=(0, 1)).reshape(1, 3))
    assert torch.equal(sum_to(g, torch.Size([2, 1])), g.sum(dim=(0, 2)).reshape(2, 1))
    assert torch.equal(sum_to(g, torch.Size([2, 3])), g.sum(0))
    assert torch.equal(sum_over(g, (0, 2)), g.sum(dim=(0, 2)))


# --------------------------------------------------------------------------- numba twins


@pytest.mark.filterwarnings("ignore:overflow encountered in cast")
@settings(max_examples=300, deadline=None)
@given(st.floats(allow_nan=False, width=64), st.sampled_from(["float32", "bfloat16", "float16"]))
def test_kernel_rounding_matches_round_to(x, fmt):
    wp = kernels.format_params(fmt)
    p = get_format(fmt).precision
    ties = [1 + 2.0**-p, 1 + 3 * 2.0**-p, -(1 + 2.0**-p), np.nextafter(1 + 2.0**-p, 2.0)]
    for v in (x, x * 2.0**-140, x * 2.0**-20, x * 2.0**100, *ties):
        buf = np.array([v, 0.0])
        kernels.round_buffer(buf, 1, wp)
        expect = round_to(np.array([v]), fmt)[0]
        assert buf[0] == expect or (np.isnan(buf[0]) and np.isnan(expect)), (v, fmt)
        one = kernels.round_scalar(v, wp)
        assert one == expect or (np.isnan(one) and np.isnan(expect)), (v, fmt)


def test_kernel_exp_and_log_are_the_float64_functions_bit_for_bit():
    x = torch.cat([torch.linspace(-750, 720, 4001, dtype=torch.float64),
                   torch.tensor([0.0, -0.0, 1e-300, -1e-300, float("inf"), -float("inf")],
                                dtype=torch.float64)])
    got = np.array([kernels.exp64(float(v)) for v in x])
    np.testing.assert_array_equal(got, em.exp64(x).numpy())
    y = torch.logspace(-300, 300, 3001, dtype=torch.float64)
    got = np.array([kernels.log64(float(v)) for v in y])
    np.testing.assert_array_equal(got, em.log64(y).numpy())


@pytest.mark.parametrize("n", [1, 2, 7, 64, 129])
def test_kernel_sums_norms_and_roundings_equal_the_torch_ops(n):
    x = _randn(3, n, seed=40 + n, dtype=torch.float64) * 3
    for row in x:
        buf = np.zeros(n + 2)
        buf[:n] = row.numpy()
        assert kernels.pairwise_sum(buf, n) == float(em.fixed_sum(row, 0))
    x32 = x.float()
    for fmt in ("float32", "bfloat16", "float16"):
        params = kernels.format_params(fmt)
        out = np.empty((3, n), np.float32)
        xf = np.asarray(round_to(x32.numpy(), fmt))  # the kernel's input is already in F
        kernels.rms_rows(xf, out, np.empty(n + 2), params)
        np.testing.assert_array_equal(out, em.rms_norm(x32, fmt).numpy())
        kernels.round_into(x32.numpy() * 1.001, out, np.empty(n + 2), params)
        np.testing.assert_array_equal(out, round_to(x32.numpy() * 1.001, fmt))


def test_embedding_gradient_sums_repeated_rows():
    g = torch.Generator().manual_seed(4)
    table = torch.randn(7, 5, generator=g, requires_grad=True)
    idx = torch.tensor([3, 1, 3, 3, 0, 6, 1])
    up = torch.randn(7, 5, generator=g)
    (em.embedding(table, idx) * up).sum().backward()
    expect = np.zeros((7, 5))
    for i, r in enumerate(idx.tolist()):
        expect[r] += up[i].double().numpy()
    np.testing.assert_allclose(table.grad.numpy(), expect, rtol=1e-6, atol=1e-7)
    assert torch.equal(em.embedding(table.detach(), idx), table.detach()[idx])


# --------------------------------------------------------------------------- optimizers


@pytest.mark.parametrize("momentum", [0.0, 0.9])
def test_sgd_matches_torch_in_float64(momentum):
    w0 = _randn(20, seed=22, dtype=torch.float64)
    p1, p2 = torch.nn.Parameter(w0.clone()), torch.nn.Parameter(w0.clone())
    o1 = em.SGD([p1], lr=0.1, momentum=momentum, prec=F64)
    o2 = torch.optim.SGD([p2], lr=0.1, momentum=momentum)
    for s in range(5):
        g = _randn(20, seed=100 + s, dtype=torch.float64)
        p1.grad, p2.grad = g.clone(), g.clone()
        o1.step()
        o2.step()
    torch.testing.assert_close(p1.detach(), p2.detach(), rtol=1e-14, atol=1e-15)


def test_adam_matches_torch_in_float64_and_stores_in_the_format():
    w0 = _randn(20, seed=23, dtype=torch.float64)
    p1, p2 = torch.nn.Parameter(w0.clone()), torch.nn.Parameter(w0.clone())
    o1 = em.Adam([p1], lr=1e-2, prec=F64)
    o2 = torch.optim.Adam([p2], lr=1e-2, foreach=False)
    for s in range(6):
        g = _randn(20, seed=200 + s, dtype=torch.float64)
        p1.grad, p2.grad = g.clone(), g.clone()
        o1.step()
        o2.step()
    torch.testing.assert_close(p1.detach(), p2.detach(), rtol=1e-12, atol=1e-14)
    p = torch.nn.Parameter(round_to(_randn(50, seed=24), "bfloat16"))
    opt = em.Adam([p], lr=1e-3, prec="bfloat16")
    p.grad = _randn(50, seed=25)
    opt.step()
    np.testing.assert_array_equal(p.detach().numpy(), round_to(p.detach(), "bfloat16").numpy())


def test_optimizers_reject_bad_input():
    p = torch.nn.Parameter(torch.ones(2))
    with pytest.raises(ValueError, match="lr"):
        em.SGD([p], lr=-1.0)
    with pytest.raises(ValueError, match="momentum"):
        em.SGD([p], lr=0.1, momentum=1.5)
    with pytest.raises(ValueError, match=r"betas\[1\]"):
        em.Adam([p], betas=(0.9, 1.0))
    with pytest.raises(ValueError, match="empty"):
        em.SGD([], lr=0.1)


# --------------------------------------------------------------------------- bad input names the parameter


def test_errors_name_the_parameter():
    with pytest.raises(ValueError, match="unknown accumulate "):
        em.Precision("float16", accumulate="float8")
    for name, kw in (("zero_point", {"zero_point": 1.5}), ("quant_min", {"quant_min": 0.5}),
                     ("quant_max", {"quant_max": "7"})):
        with pytest.raises(ValueError, match=f"{name}="):
            em.fake_quantize(torch.zeros(2), 1.0, **kw)
    p = [torch.nn.Parameter(torch.zeros(2))]
    for lr in (0.0, math.inf, -1e-3):
        with pytest.raises(ValueError, match="lr"):
            em.Adam(p, lr=lr)
    em.Adam(p, betas=(0.0, 0.0))  # beta = 0 is allowed, as in torch


# --------------------------------------------------------------------------- native back end


def test_native_backend_runs_torch_kernels_in_the_container():
    x, w = _randn(8, 32, seed=26), _randn(4, 32, seed=27)
    nat = em.Precision("bfloat16", backend="native")
    y = em.linear(x, w, prec=nat)
    assert y.dtype == torch.float32
    np.testing.assert_array_equal(y.numpy(), round_to(y, "bfloat16").numpy())
    # torch's bf16 kernel and the emulation agree to within a couple of bf16 ulps
    torch.testing.assert_close(y, em.linear(x, w, prec="bfloat16"), rtol=2 * 2**-8, atol=1e-2)


def test_emulated_linear_module():
    lin = torch.nn.Linear(6, 3)
    em_lin = em.Linear.from_torch(lin, "float16")
    x = _randn(2, 6, seed=28)
    np.testing.assert_array_equal(em_lin(x).detach().numpy(),
                                  em.linear(x, lin.weight, lin.bias, "float16").detach().numpy())
    assert get_format("float16").name == em_lin.prec.fmt


def test_native_ops_are_torchs_ops_in_the_format():
    a, b = _x(3, 4, seed=1), _x(4, 5, seed=2)
    bf = torch.bfloat16
    assert _bits_equal(em.matmul(a, b, BF16_NATIVE), (a.to(bf) @ b.to(bf)).float())
    x = _x(2, 3, 4, seed=3)
    assert _bits_equal(em.log_softmax(x, BF16_NATIVE), torch.log_softmax(x.to(bf), -1).float())
    assert _bits_equal(em.rms_norm(x, BF16_NATIVE),
                       torch.nn.functional.rms_norm(x.to(bf), (4,), eps=1e-6).float())
    assert _bits_equal(em.sum(x, 1, prec=BF16_NATIVE), torch.sum(x.to(bf), 1).float())
    assert _bits_equal(em.mean(x, 0, keepdim=True, prec=BF16_NATIVE),
                       torch.mean(x.to(bf), 0, keepdim=True).float())
    w, c = _x(4, seed=4), _x(4, seed=5)
    y = torch.nn.functional.group_norm(x.reshape(2, 4, 3).to(bf), 2, w.to(bf), c.to(bf), 1e-5).float()
    assert _bits_equal(em.group_norm(x.reshape(2, 4, 3), 2, w, c, BF16_NATIVE), y)


# --------------------------------------------------------------------------- the same bits everywhere

_PROGRAM = textwrap.dedent("""
    import hashlib, torch
    from precisionlab import emulate as em
    g = torch.Generator().manual_seed(0)
    out = []
    for fmt in ("bfloat16", "float16", "float32"):
        P = em.Precision(fmt)
        w1 = torch.nn.Parameter(em.randn(96, 64, generator=g) / 8)
        w2 = torch.nn.Parameter(em.randn(200, 96, generator=g) / 8)
        opt = em.Adam([w1, w2], lr=1e-2, prec="float32")
        x = em.randn(256, 64, generator=g)
        tgt = torch.randint(0, 200, (256,), generator=g)
        for step in range(4):
            h = em.gelu(em.linear(em.rms_norm(x, P), em.cast(w1, P), prec=P), P)
            lp = em.log_softmax(em.linear(h, em.cast(w2, P), prec=P), "float32")
            loss = -em.mean(lp.gather(1, tgt[:, None]), prec="float32")
            opt.zero_grad()
            loss.backward()
            opt.step()
            out += [loss.detach(), w1.detach().clone(), w2.detach().clone(), em.exp(lp, P).detach()]
    from precisionlab import updates  # chapter 1's least-squares training (NumPy, float64)
    for r in updates.train_master_vs_lowprec(steps=40, seed=0, policies=updates.POLICIES).values():
        out += [torch.from_numpy(r.loss), torch.from_numpy(r.changed)]
    # float64 results of the root's callers, before any rounding to float32 could hide a
    # 1-ulp difference (torch.sqrt's bits change with MKL's code path)
    from precisionlab import underflow
    out.append(em.randn(1 << 14, generator=g, dtype=torch.float64))
    out.append(underflow.orthonormal_columns(em.randn(2, 16, 16, generator=g, dtype=torch.float64)))
    out.append(torch.from_numpy(underflow.GradientStats.of(list(em.randn(8, 300, generator=g))).norm))
    out.append(em.sqrt64(torch.rand(1 << 16, generator=g, dtype=torch.float64) * 1e3))
    print(hashlib.sha256(b"".join(t.numpy().tobytes() for t in out)).hexdigest())
""")


def test_same_bits_under_every_dispatch_level_and_thread_count(same_bits):
    same_bits(_PROGRAM, library_kernels=True)  # + old OpenBLAS kernels, generic numba CPU
