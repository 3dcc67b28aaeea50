"""Exact float64 arithmetic: TwoSum and TwoProduct leave no error behind, as_float64 widens exactly."""

from fractions import Fraction

import numpy as np
import torch

from precisionlab.exact import as_float64, two_prod, two_sum


def _random_doubles(seed: int, n: int = 2000) -> tuple[np.ndarray, np.ndarray]:
    g = np.random.default_rng(seed)
    return tuple(g.standard_normal(n) * 2.0 ** g.integers(-60, 60, n) for _ in range(2))


def test_two_sum_and_two_prod_are_exact_against_fractions():
    a, b = _random_doubles(0)
    s, e = two_sum(a, b)
    p, f = two_prod(a, b)
    assert np.array_equal(s, a + b) and np.array_equal(p, a * b)
    for i in range(len(a)):
        x, y = Fraction(float(a[i])), Fraction(float(b[i]))
        assert Fraction(float(s[i])) + Fraction(float(e[i])) == x + y
        assert Fraction(float(p[i])) + Fraction(float(f[i])) == x * y


def test_two_sum_of_an_infinite_sum_gives_a_nan_error_without_an_invalid_warning():
    with np.errstate(over="ignore", invalid="raise"):
        s, e = two_sum(np.array([np.finfo(np.float64).max]), np.array([np.finfo(np.float64).max]))
    assert np.isinf(s[0]) and np.isnan(e[0])


def test_as_float64_widens_tensors_and_arrays_exactly():
    t = torch.tensor([0.1, -3.5e-8], dtype=torch.bfloat16, requires_grad=True)
    a = as_float64(t)
    assert a.dtype == np.float64 and np.array_equal(a, t.detach().double().numpy())
    assert as_float64([1, 2]).dtype == np.float64 and as_float64(np.float16(0.1)) == np.float16(0.1)
