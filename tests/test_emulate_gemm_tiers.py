"""emulate's matrix product has two tiers, NumPy's below GEMM_COMPILED_MIN products and the
compiled loop (kernels.gemm) from it: both give the bits of one sequential sum from 0.

The oracle is the definition itself, written out in scalar NumPy arithmetic: acc = 0, then
acc = acc + a[i, p] * b[p, j] for p in order, each operation rounded to the dtype. The inputs
are drawn where the tiers could part: signed zeros (a product of -0 first), subnormals,
products that overflow, +-inf and NaN.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from precisionlab import emulate as em
from precisionlab import plan
from precisionlab.emulate import kernels, products

EDGES32 = [0.0, -0.0, 1e-45, -1e-45, 1.1754942e-38, 3.4e38, -3.4e38, float("inf"),
           float("-inf"), float("nan"), 1.0, -1.0, 2.0**-75]


def _loop_oracle(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """The definition, one scalar operation at a time in a's dtype."""
    t = a.dtype.type
    out = np.empty((a.shape[0], b.shape[1]), dtype=a.dtype)
    with np.errstate(all="ignore"):
        for i in range(a.shape[0]):
            for j in range(b.shape[1]):
                acc = t(0.0)
                for p in range(a.shape[1]):
                    acc = t(acc + t(a[i, p] * b[p, j]))
                out[i, j] = acc
    return out


def _same_bits(x: np.ndarray, y: np.ndarray) -> bool:
    """Equal bit for bit, NaN with NaN (its payload is not part of the contract)."""
    nan = np.isnan(x)
    if not np.array_equal(nan, np.isnan(y)):
        return False
    word = np.uint64 if x.dtype == np.float64 else np.uint32
    return np.array_equal(x[~nan].view(word), y[~nan].view(word))


def _operands(dtype, wide: bool = False):
    """(a, b) with edge values; wide: 256+ outputs (sequential_gemm's row-block route)."""
    width = 64 if dtype == np.float64 else 32
    values = st.one_of(st.sampled_from(EDGES32).map(dtype),
                       st.floats(width=width, allow_nan=True, allow_infinity=True,
                                 allow_subnormal=True))
    side = st.integers(16, 20) if wide else st.integers(0, 5)
    dims = st.tuples(side, st.integers(0, 6), side)
    return dims.flatmap(lambda d: st.tuples(
        hnp.arrays(dtype, (d[0], d[1]), elements=values),
        hnp.arrays(dtype, (d[1], d[2]), elements=values)))


@pytest.mark.parametrize("wide", [False, True])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_numpy_tier_and_compiled_loop_both_give_the_sequential_sum(dtype, wide):
    @settings(max_examples=300 if not wide else 60, deadline=None)
    @given(_operands(dtype, wide))
    def check(ab):
        a, b = ab
        want = _loop_oracle(a, b)
        got = products.sequential_gemm(a, b)
        assert got.dtype == dtype and got.shape == want.shape
        assert _same_bits(got, want)
        compiled = np.empty(want.shape, dtype=dtype)
        if a.shape[1]:
            kernels.gemm(np.ascontiguousarray(a), np.ascontiguousarray(b), compiled)
        else:
            compiled[:] = 0
        assert _same_bits(compiled, want)

    check()


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("shape", [(1, 32767, 1), (2, 8000, 2), (3, 1000, 1)])
def test_long_sums_stay_sequential_where_numpy_could_vectorise(dtype, shape):
    # Long k, where a pairwise or unrolled sum would part from the loop: the NumPy tier (all
    # these are below the threshold) matches the compiled loop, and the data are chosen so that
    # a pairwise sum (np.sum) gives other bits.
    m, k, n = shape
    rng = np.random.default_rng(k)
    a = (rng.standard_normal((m, k)) * 10.0 ** rng.integers(-4, 5, (m, k))).astype(dtype)
    b = rng.standard_normal((k, n)).astype(dtype)
    assert m * k * n < products.GEMM_COMPILED_MIN
    compiled = np.empty((m, n), dtype=dtype)
    kernels.gemm(a, b, compiled)
    got = products.sequential_gemm(a, b)
    assert _same_bits(got, compiled)
    prods = np.ascontiguousarray(np.moveaxis(a[:, :, None] * b[None, :, :], 1, -1))
    assert not _same_bits(got, np.sum(prods, axis=-1))  # over a contiguous axis: pairwise


def test_a_first_product_of_minus_zero_sums_to_plus_zero_as_the_loop():
    a = np.array([[-0.0, -0.0]], dtype=np.float32)
    b = np.array([[1.0], [1.0]], dtype=np.float32)
    got = products.sequential_gemm(a, b)
    assert np.signbit(got).tolist() == [[False]]  # 0 + (-0) = +0, then +0 + (-0) = +0


@pytest.mark.parametrize("acc", ["float32", "float64"])
@pytest.mark.parametrize("fmt", ["float16", "bfloat16", "float32"])
def test_matmul_and_linear_give_the_same_bits_on_both_sides_of_the_threshold(fmt, acc,
                                                                            monkeypatch):
    # Forward and backward (the gradients are products too), with zeros of both signs,
    # subnormals of fmt and an overflowing row among normal values.
    prec = em.Precision(fmt, acc)
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(6, 20, generator=gen)
    w = torch.randn(5, 20, generator=gen)
    x[0, :4] = torch.tensor([-0.0, 0.0, 1e-7, -6e-8])
    x[1] = 6e4
    w[2, :3] = torch.tensor([-0.0, float("inf"), float("nan")])
    bias = torch.randn(5, generator=gen)

    def run():
        xi, wi, bi = (t.clone().requires_grad_(True) for t in (x, w, bias))
        y = em.linear(xi, wi, bi, prec)
        z = em.matmul(xi, wi.T, prec)
        (y.nan_to_num().sum() + z.nan_to_num().square().sum()).backward()
        return [t.detach().numpy() for t in (y, z, xi.grad, wi.grad, bi.grad)]

    monkeypatch.setattr(products, "GEMM_COMPILED_MIN", 10**9)  # NumPy's tier throughout
    small = run()
    monkeypatch.setattr(products, "GEMM_COMPILED_MIN", 0)  # the compiled loop throughout
    large = run()
    for s, big in zip(small, large, strict=True):
        assert _same_bits(s, big)


def _spy_gemm(monkeypatch) -> list:
    """Record each call of the compiled loop (kernels.gemm, imported by _gemm when it runs)."""
    calls = []
    real = kernels.gemm
    monkeypatch.setattr(kernels, "gemm", lambda a, b, out: calls.append(a.shape) or real(a, b, out))
    return calls


def test_a_planned_short_computation_runs_large_products_on_numpy(monkeypatch):
    """Inside planned_products(work <= PRODUCTS_NUMPY_MAX) a product above GEMM_COMPILED_MIN
    takes NumPy's tier with the loop's bits; an enclosing plan decides; none is left behind."""
    gen = torch.Generator().manual_seed(4)
    x, w = torch.randn(16, 64, generator=gen), torch.randn(64, 64, generator=gen)
    assert 16 * 64 * 64 >= products.GEMM_COMPILED_MIN
    calls = _spy_gemm(monkeypatch)
    want = em.linear(x, w, None, "float16")
    assert len(calls) == 1  # no plan: the product's own size decides
    with em.planned_products(16 * 64 * 64):
        got = em.linear(x, w, None, "float16")
    assert len(calls) == 1 and torch.equal(got, want)
    with em.planned_products(plan.PRODUCTS_NUMPY_MAX + 1):  # a long run around a short one
        with em.planned_products(1):
            assert torch.equal(em.linear(x, w, None, "float16"), want)
    assert len(calls) == 2
    em.linear(x, w, None, "float16")  # the plans are gone
    assert len(calls) == 3


def test_one_probe_pass_pays_no_compile_and_a_training_run_keeps_the_loop(monkeypatch):
    from precisionlab import underflow

    calls = _spy_gemm(monkeypatch)
    probe = underflow.probe_network(0.82, "float16", 24, 64, 16)
    assert calls == []
    underflow.train_probe(0.82, 24, "float16", steps=40)  # 40 passes: beyond the plan's limit
    net = underflow.AttenuatingNet(24, 64, 0.82, "float16")
    x, _ = underflow.make_batch(64, 16, "float16")
    assert 40 * underflow.pass_products(net, x) > plan.PRODUCTS_NUMPY_MAX
    per_pass = 3 * 24 - 1  # the first layer's input gradient is not computed
    assert len(calls) == 40 * per_pass
    assert underflow.pass_products(net, x) == per_pass * 16 * 64 * 64
    monkeypatch.setattr(plan, "PRODUCTS_NUMPY_MAX", 0)  # the same probe on the loop
    assert underflow.probe_network(0.82, "float16", 24, 64, 16).same_bits(probe)
    assert len(calls) == 41 * per_pass


def test_a_chapter_that_plots_and_scales_loads_no_numba():
    """Chapter 5's imports and explorer: the widgets load their own file only, and emulate,
    rl and plotting import numba when a compiled kernel first runs (0.7 s saved)."""
    import subprocess
    import sys

    program = ("import sys\n"
               "from precisionlab import emulate, mixed_precision, plotting, scaling, tables, "
               "underflow, widgets\n"
               "from precisionlab.chapters import scaling_runs\n"
               "widgets.scaling_explorer\n"
               "print(sorted(m for m in ('numba', 'llvmlite') if m in sys.modules))\n")
    run = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True,
                         timeout=120)
    assert run.returncode == 0, run.stderr
    assert run.stdout.split("\n")[-2] == "[]", run.stdout
