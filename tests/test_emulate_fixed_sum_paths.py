"""emulate.fixed_sum's NumPy tree gives torch's loop's bits: float32 and float64, any axis, inf, NaN, subnormals."""

from __future__ import annotations

import hypothesis.extra.numpy as hnp
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from precisionlab import emulate


def _torch_loop(x: torch.Tensor, dim: int, keepdim: bool) -> torch.Tensor:
    """fixed_sum through its torch loop (a tensor that requires grad takes it)."""
    return emulate.fixed_sum(x.clone().requires_grad_(True), dim, keepdim).detach()


def _bits(t: torch.Tensor) -> np.ndarray:
    a = t.contiguous().numpy()
    return a.view(np.int32 if a.dtype == np.float32 else np.int64)


@settings(max_examples=200, deadline=None)
@given(data=st.data(), dtype=st.sampled_from([np.float32, np.float64]),
       keepdim=st.booleans())
def test_numpy_tree_is_torch_loop_bit_for_bit(data, dtype, keepdim):
    shape = data.draw(hnp.array_shapes(min_dims=1, max_dims=3, min_side=0, max_side=37))
    a = data.draw(hnp.arrays(dtype, shape, elements=st.floats(
        width=32 if dtype == np.float32 else 64, allow_nan=True, allow_infinity=True,
        allow_subnormal=True)))
    dim = data.draw(st.integers(-len(shape), len(shape) - 1))
    x = torch.from_numpy(a)
    ours, loop = emulate.fixed_sum(x, dim, keepdim), _torch_loop(x, dim, keepdim)
    assert ours.shape == loop.shape and ours.dtype == loop.dtype
    assert np.array_equal(_bits(ours), _bits(loop))  # NaN's sign and payload included


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_hard_regions(dtype):
    f = torch.finfo(dtype)
    x = torch.tensor([f.max, f.max, -f.max, f.tiny / 4, -f.tiny / 8, 0.0, -0.0,
                      float("inf"), 1.0, -1.0, f.eps / 2], dtype=dtype)
    for row in (x, x[:7], x[3:7], -x[:2], x[[5, 6]], x[[7, 2]]):
        assert np.array_equal(_bits(emulate.fixed_sum(row, 0)), _bits(_torch_loop(row, 0, False)))
    assert float(emulate.fixed_sum(x[:2], 0)) == float("inf")  # overflow, no warning raised
    assert torch.isnan(emulate.fixed_sum(torch.tensor([float("inf"), -float("inf")],
                                                      dtype=dtype), 0))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16])
def test_bad_dim_is_refused_alike_on_every_path(dtype):
    x = torch.zeros(2, 3, dtype=dtype)
    for dim in (2, -3):
        with pytest.raises(IndexError, match=rf"dim must lie in \[-2, 1\].*got dim={dim}"):
            emulate.fixed_sum(x, dim)
    with pytest.raises(IndexError, match="0-d"):
        emulate.fixed_sum(torch.tensor(1.0, dtype=dtype))
