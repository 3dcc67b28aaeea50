"""intervals.torch_ops.products on a CUDA GEMM's own terms: TF32 operands (torch's
allow_tf32 / set_float32_matmul_precision("high")) and cuBLAS's reduced-precision split-K
reductions for float16/bfloat16, which triage refuses with what to do. No GPU is needed: the
bound is checked against exact products of TF32-rounded operands, and the switches against a
tensor whose device reads as CUDA."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from precisionlab.intervals.torch_ops import arith as B
from precisionlab.intervals.torch_ops import products as P
from precisionlab.rounding import round_to


def test_tf32_operands_are_inside_the_widened_bound_only():
    g = torch.Generator().manual_seed(3)
    a = torch.randn(16, 256, generator=g)
    b = torch.randn(256, 8, generator=g)
    plain = P.mm(B.leaf(a), B.leaf(b), None, "float32")
    wide = P.mm(B.leaf(a), B.leaf(b), None, "float32", operand_rel=P.TF32_OPERANDS)
    outside = 0
    for mode in ("nearest_away", "toward_zero", "up", "down"):
        at, bt = (torch.from_numpy(np.asarray(round_to(t.numpy(), "tf32", mode))).double()
                  for t in (a, b))
        exact = (at @ bt).numpy()  # float64: within the bound's float64 slack
        assert ((wide.lo <= exact) & (exact <= wide.hi)).all(), mode
        outside += int(((exact < plain.lo) | (exact > plain.hi)).sum())
    assert outside > 0  # the widening is needed


class _OnCuda(torch.Tensor):
    """A CPU tensor whose device reads as CUDA: the switches' logic without a GPU."""

    @property
    def device(self):
        return torch.device("cuda")


def _cuda_like(dtype) -> torch.Tensor:
    return torch.Tensor._make_subclass(_OnCuda, torch.zeros(2, 2, dtype=dtype))


@pytest.fixture
def matmul_flags():
    m = torch.backends.cuda.matmul
    saved = (m.allow_tf32, m.allow_fp16_reduced_precision_reduction,
             m.allow_bf16_reduced_precision_reduction)
    yield m
    (m.allow_tf32, m.allow_fp16_reduced_precision_reduction,
     m.allow_bf16_reduced_precision_reduction) = saved


def test_cuda_switches_set_the_products_extra_error(matmul_flags):
    assert P.cuda_operand_rel(torch.zeros(2), "float32") == 0.0  # the CPU: IEEE products
    matmul_flags.allow_tf32 = False
    assert P.cuda_operand_rel(_cuda_like(torch.float32), "float32") == 0.0
    matmul_flags.allow_tf32 = True
    assert P.cuda_operand_rel(_cuda_like(torch.float32), "float32") == P.TF32_OPERANDS
    for fmt, dtype, flag in (("float16", torch.float16, "allow_fp16_reduced_precision_reduction"),
                             ("bfloat16", torch.bfloat16,
                              "allow_bf16_reduced_precision_reduction")):
        setattr(matmul_flags, flag, True)
        with pytest.raises(B.UnsupportedOperation, match=f"{flag} = True.*set it to False"):
            P.cuda_operand_rel(_cuda_like(dtype), fmt)
        setattr(matmul_flags, flag, False)
        assert P.cuda_operand_rel(_cuda_like(dtype), fmt) == 0.0
