"""precisionlab.plan: a short planned computation rounds on NumPy's tier, with the same bits.

round_to's tier is a matter of speed only; these tests check that a plan within
PRODUCTS_NUMPY_MAX keeps every rounding off the compiled loop (no cold compile), that the
bits are those of the compiled loop, and that a long plan, or none, leaves the choice to the
input's length as before.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from precisionlab import plan, rounding_kernel, underflow
from precisionlab.rounding import round_to


@pytest.fixture
def compiled_calls(monkeypatch):
    """Each call of round_to's compiled tier (rounding_kernel.numba_into), by input length."""
    calls = []
    real = rounding_kernel.numba_into
    monkeypatch.setattr(rounding_kernel, "numba_into",
                        lambda a, *rest: calls.append(a.size) or real(a, *rest))
    return calls


def _hard_values(n: int) -> np.ndarray:
    """n float64 values over float16's whole range: subnormals, ties, overflow, inf and NaN."""
    rng = np.random.default_rng(7)
    x = rng.standard_normal(n) * 2.0 ** rng.integers(-30, 20, n)
    x[:8] = [np.inf, -np.inf, np.nan, 0.0, -0.0, 65520.0, 2.0**-25, 3 * 2.0**-25]
    return x


@pytest.mark.parametrize("fmt", ["float16", "bfloat16", "float8_e4m3fn"])
@pytest.mark.parametrize("mode", ["nearest_even", "toward_zero", "stochastic"])
def test_a_short_plan_rounds_on_numpy_with_the_compiled_bits(compiled_calls, fmt, mode):
    x = _hard_values(rounding_kernel.NUMBA_MIN_SIZE * 2)
    gen = (lambda: np.random.default_rng(3)) if mode == "stochastic" else (lambda: None)
    want = round_to(x, fmt, mode, gen(), backend="emulated")
    assert compiled_calls == [x.size]  # no plan: its length takes the compiled loop
    with plan.planned_products(1000):
        got = round_to(x, fmt, mode, gen(), backend="emulated")
    assert compiled_calls == [x.size]
    np.testing.assert_array_equal(got.view(np.int64), want.view(np.int64))  # NaN bits too


def test_a_long_plan_keeps_the_compiled_loop_and_no_plan_is_left_behind(compiled_calls):
    x = _hard_values(rounding_kernel.NUMBA_MIN_SIZE)
    with plan.planned_products(plan.PRODUCTS_NUMPY_MAX + 1):
        with plan.planned_products(1):  # the outermost plan decides
            assert not plan.numpy_planned()
            round_to(x, "float16", backend="emulated")
    assert len(compiled_calls) == 1
    with plan.planned_products(plan.PRODUCTS_NUMPY_MAX):
        assert plan.numpy_planned()
    assert not plan.numpy_planned()
    round_to(x, "float16", backend="emulated")
    assert len(compiled_calls) == 2


def test_building_chapter_4s_network_compiles_no_rounding_loop(compiled_calls, monkeypatch):
    """96 layers of 64 x 64 weights, each rounded once: NumPy's tier, the compiled loop's bits."""
    net = underflow.AttenuatingNet(96, 64, 0.82, "float16")
    assert compiled_calls == []
    monkeypatch.setattr(plan, "PRODUCTS_NUMPY_MAX", 0)  # the same network, built on the loop
    loop = underflow.AttenuatingNet(96, 64, 0.82, "float16")
    assert len(compiled_calls) == 96
    for a, b in zip(net.parameters(), loop.parameters(), strict=True):
        assert torch.equal(a, b)
