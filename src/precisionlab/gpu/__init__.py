"""A CPU simulator of how GPUs add numbers: reduction orders, matmuls and tensor cores.

Submodules, one concept each:

* `arith`: fl(a + b) rounded once from the exact sum, the step every simulation is made of;
* `reductions`: sums in the orders GPU kernels use (trees, warps, split-K, atomics, Kahan);
* `bias`: each add's rounding error booked by the binade of the running sum;
* `decisions`: when a rounded sum flips a threshold test S < tol;
* `profiles`: named device settings (fp32 CUDA cores, tf32/bf16/fp16 tensor cores, fp8);
* `matmul`: matrix products under a profile (idealised: every add rounded once);
* `tensorcore`: the bit-level block fused multiply-add measured by Fasi et al. (2021);
* `solvers`: a small iterative solver whose matmuls run under a profile;
* `kernel`: `Kernel`, one description of how a sum or matmul is executed (order, tiles, the
  format of every stage), validated field by field, and `run_sum` / `run_matmul` to run it;
* `collectives`: all-reduce orders across W ranks (ring, gloo's ring, NCCL's trees);
* `leaf_depths`: the roundings on each summand's path through a kernel's summation tree.
"""

from ..exact import as_float64
from .arith import RoundedAdder, round_float64, rounded_add
from .bias import BinadeSplit, add_errors_by_binade
from .collectives import COLLECTIVE_ORDERS, REDUCE_FORMATS, allreduce
from .decisions import boundary_terms, decision_margin, flip_probability
from .kernel import KERNEL_ORDERS, Kernel, promote, run_matmul, run_sum
from .leaf_depths import leaf_depths
from .matmul import matmul, round_operands
from .profiles import PROFILE_NAMES, PROFILES, DeviceProfile, describe, get_profile
from .reductions import DETERMINISTIC_ORDERS, ORDERS, atomic_orders, exact_sum, reduce_sum
from .solvers import SolveResult, iterations_to_reach, jacobi_solve
from .tensorcore import (
    OPERAND_FEEDS,
    TENSOR_CORE_MODELS,
    TensorCoreModel,
    block_fma,
    get_tensor_core_model,
    tensor_core_matmul,
)

__all__ = [
    "COLLECTIVE_ORDERS",
    "DETERMINISTIC_ORDERS",
    "KERNEL_ORDERS",
    "OPERAND_FEEDS",
    "ORDERS",
    "PROFILES",
    "PROFILE_NAMES",
    "REDUCE_FORMATS",
    "TENSOR_CORE_MODELS",
    "BinadeSplit",
    "DeviceProfile",
    "Kernel",
    "RoundedAdder",
    "SolveResult",
    "TensorCoreModel",
    "add_errors_by_binade",
    "allreduce",
    "as_float64",
    "atomic_orders",
    "block_fma",
    "boundary_terms",
    "decision_margin",
    "describe",
    "exact_sum",
    "flip_probability",
    "get_profile",
    "get_tensor_core_model",
    "iterations_to_reach",
    "jacobi_solve",
    "leaf_depths",
    "matmul",
    "promote",
    "reduce_sum",
    "round_float64",
    "round_operands",
    "rounded_add",
    "run_matmul",
    "run_sum",
    "tensor_core_matmul",
]
