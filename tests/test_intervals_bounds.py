"""precisionlab.intervals.bounds: sum_ and matmul bounds against their documented factors and executions.

Every summation order's bound as tight as the documented factor prod_stage (1 + u)^depth (and
the lower one), partial sums that cancel not counted as overflow, overflow in a narrow
accumulator reaching a wide output, one infinite end, subnormal and truncated partials,
atomic float16 additions, executed values carried, and the tensor-core model with tiny,
cancelling and saturating products. Oracles: math.fsum of the summands times their factors,
the leaf depths of iv.leaf_depths, and the executed sums and matmuls over several seeds.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from oracles import equal_with_nan

from precisionlab import intervals as iv
from precisionlab.formats import get_format

INF = math.inf
K = iv.Kernel


def _factors(n: int, kernel, rule: str) -> tuple[np.ndarray, np.ndarray]:
    """Per summand: the documented upper factor prod_stage (1 + u)^depth and lower prod (1 - theta)."""
    u = {"tile": kernel.acc, "warp": kernel.acc, "combine": kernel.combine_format.name,
         "partial": kernel.partial}
    if rule == "oblivious":
        fmts = [kernel.acc, kernel.combine_format.name] + ([kernel.partial] if kernel.partial else [])
        uu = max(get_format(f).eps / 2 for f in fmts)
        d = n - 1 + (kernel.partial is not None) + (kernel.combine is not None)
        g = (1 + uu) ** d
        return np.full(n, g), np.full(n, 2 - g)
    up_f, lo_f = np.ones(n), np.ones(n)
    for stage, depths in iv.leaf_depths(n, kernel).items():
        g = (1 + get_format(u[stage]).eps / 2) ** depths.astype(float)
        up_f, lo_f = up_f * g, lo_f * (2 - g)
    return up_f, lo_f


TIGHT_KERNELS = [
    K("sequential"), K("pairwise"), K("blocked", block=32), K("blocked", block=16, combine="bfloat16"),
    K("split_k", splits=4), K("split_k", splits=3, partial="float16"), K("atomic", block=8),
    K("atomic", block=1), K("warp", threads=32),
]


@pytest.mark.parametrize("rule", ["structure", "oblivious"])
@pytest.mark.parametrize("kernel", TIGHT_KERNELS, ids=lambda k: f"{k.order}-{k.block}-{k.partial}-{k.combine}")
def test_sum_bounds_are_as_tight_as_the_documented_factors(kernel, rule):
    # positive summands, the large ones last: a short last tile, padding and wrong depths all show
    x = np.concatenate([np.full(32, 1e-3), np.linspace(1.0, 2.0, 8)])
    b = iv.sum_(iv.point(x, rule=rule), kernel)
    up_f, lo_f = _factors(x.size, kernel, rule)
    exact = math.fsum(x.tolist())
    hi_doc, lo_doc = math.fsum((x * up_f).tolist()), math.fsum((x * lo_f).tolist())
    names = [kernel.acc, kernel.combine_format.name, kernel.out_format.name, kernel.partial or kernel.acc]
    slack = (x.size // 8 + 3) * max(get_format(f).eps for f in names) * hi_doc  # outward casts
    assert lo_doc - slack <= float(b.lo) <= exact <= float(b.hi) <= hi_doc + slack, \
        (float(b.lo), lo_doc, exact, hi_doc, float(b.hi))


@pytest.mark.parametrize("kernel", [K("sequential", acc="float16"), K("pairwise", acc="float16"),
                                    K("blocked", acc="float16", block=2)])
def test_partial_sums_that_cancel_do_not_count_as_overflow(kernel):
    # every ordered partial sum stays within float16's 65504; the positive terms alone do not
    b = iv.sum_(iv.point([6e4, -6e4, 6e4, -6e4]), kernel)
    assert np.isfinite(b.lo) and np.isfinite(b.hi) and not b.nan
    x = np.zeros(96)
    x[[0, 32, 64]] = [6e4, -6e4, 6e4]  # one warp thread sums 6e4, -6e4, 6e4 in order
    w = iv.sum_(iv.point(x), K("warp", acc="float16", threads=32))
    assert 59000 < float(w.lo) <= 6e4 <= float(w.hi) < 61000


def test_overflow_in_a_narrow_accumulator_reaches_a_wide_output():
    k = K("pairwise", acc="float16", out="float32")
    assert iv.sum_(np.array([3e4, 3e4, 3e4]), k) == INF  # the root 9e4 overflows float16
    assert iv.sum_(iv.point([3e4, 3e4, 3e4]), k).hi == INF
    k = K("sequential", acc="float16", out="float32")  # 32752 + 32768 = 65520 ties to inf
    assert iv.sum_(np.array([32752.0, 32768.0]), k) == INF
    assert iv.sum_(iv.Interval([0.0, 0.0], [32752.0, 32768.0]), k).hi == INF
    rows = iv.sum_(iv.point([[65504.0, 0.0], [1.0, 2.0]]), K("pairwise", acc="float16"))
    assert rows.hi[0] == INF and 3 <= rows.hi[1] < 3.01  # one row's overflow stays in its row
    rows = iv.sum_(iv.Interval([[0.0, 0.0], [1.0, 2.0]], [[1.0, INF], [1.0, 2.0]]), K("sequential"))
    assert rows.hi[0] == INF and 3 <= rows.hi[1] < 3.01 and not rows.nan.any()


def test_a_range_with_one_infinite_end_sums_to_that_infinity():
    b = iv.sum_(iv.Interval([-INF, 1.0], [1.0, 2.0]), K("sequential"))
    assert b.lo == -INF and 3 <= b.hi < 3.001 and not b.nan


def test_subnormal_partials_are_bounded_absolutely():
    # tiles of 2 summing to 9e-8, 1.5 of float16's smallest subnormal: the partial rounds by 33%
    x = np.full(8, 4.5e-8)
    for rule in ("structure", "oblivious"):
        for kernel in (K("split_k", splits=4, partial="float16"), K("atomic", block=2, partial="float16")):
            b = iv.sum_(iv.point(x, rule=rule), kernel)
            for seed in range(4):
                v = iv.sum_(x, kernel, seed=seed)
                assert b.lo <= v <= b.hi, (rule, kernel.order, float(b.lo), v, float(b.hi))


def test_truncated_subnormal_partials_lose_up_to_q_each():
    # four tiles of 2 x 0.995 q: each tile sums to 1.99 q and is truncated to q in float16
    q = get_format("float16").min_subnormal
    x = np.full(8, 0.995 * q)
    k = K("split_k", splits=4, partial="float16", mode="toward_zero")
    v = iv.sum_(x, k)
    assert v == 4 * q
    for rule in ("structure", "oblivious"):
        b = iv.sum_(iv.point(x, rule=rule), k)
        assert b.lo <= v <= b.hi, (rule, float(b.lo) / q, float(b.hi) / q)


def test_an_atomic_kernel_adding_in_float16_is_bounded_in_float16():
    x = np.full(16, 1 + 2.0**-12)  # float16 additions of these lose their low bits
    k = K("atomic", block=1, combine="float16")
    b = iv.sum_(iv.point(x), k)
    for seed in range(4):
        v = iv.sum_(x, k, seed=seed)
        assert b.lo <= v <= b.hi
    assert b.hi - b.lo > 2.0**-6  # float16 steps, not float32 ones


def test_sums_and_matmuls_carry_executed_values():
    x = np.array([[0.1, 0.2, 0.3], [1.0, -2.0, 4.0]])
    assert equal_with_nan(iv.sum_(iv.point(x)).value, iv.sum_(x))
    assert iv.sum_(iv.point(x), K("atomic", block=1)).value is None  # no seed: no execution
    assert equal_with_nan(iv.sum_(iv.point(x), K("atomic", block=1), seed=3).value, iv.sum_(x, K("atomic", block=1), seed=3))
    a, b = x, x.T
    m = iv.matmul(a, iv.point(b))
    assert isinstance(m, iv.Interval) and equal_with_nan(m.value, iv.matmul(a, b)) and np.all(m.contains(iv.matmul(a, b)))
    assert equal_with_nan(iv.matmul(iv.point(a), iv.point(b)).value, iv.matmul(a, b))


def test_the_oblivious_rule_is_wider_for_tensor_cores_too():
    g = np.random.default_rng(0)
    a, b = g.uniform(0.5, 1, (2, 64)), g.uniform(0.5, 1, (64, 2))
    k = K("tensor_core", inputs="float16")
    s = iv.matmul(iv.point(a), iv.point(b), k)
    o = iv.matmul(iv.point(a, rule="oblivious"), iv.point(b, rule="oblivious"), k)
    assert np.all(o.hi > s.hi) and np.all(o.lo < s.lo)
    ex = iv.matmul(a, b, k)
    assert np.all(s.contains(ex)) and np.all(o.contains(ex))


def test_tensor_core_bounds_with_tiny_and_cancelling_products():
    k16 = K("tensor_core", inputs="float16", out="float16")
    B = 4  # the A100 model's block of products
    # one product of 1.5 q per block: each block's float16 result rounds 1.5 q to 2 q, and the
    # four blocks give 8 q for the exact 6 q
    a = np.zeros((1, 4 * B))
    a[0, ::B] = 1.5 * 2.0**-12
    b = np.full((4 * B, 1), 2.0**-12)
    m = iv.matmul(iv.point(a), iv.point(b), k16)
    assert iv.matmul(a, b, k16)[0, 0] == 8 * 2.0**-24 and m.contains(iv.matmul(a, b, k16)).all()
    # block sums 6e4, -6e4, 6e4: no float16 overflow in order, though the positive terms reach 1.2e5
    a = np.array([[15000.0] * B + [-15000.0] * B + [15000.0] * B])
    m = iv.matmul(iv.point(a), iv.point(np.ones((3 * B, 1))), k16)
    assert np.isfinite(m.lo).all() and np.isfinite(m.hi).all()


def test_a_saturating_tensor_core_block_gives_up_the_relative_model():
    # bfloat16 products of 3e38: the first block's sum saturates at float32's largest value,
    # the next subtracts 3e38: the executed result 4e37 is far below the exact 2.1e39
    B = 4
    a = np.zeros((1, 2 * B))
    a[0, :B], a[0, B] = 3e38, -3e38
    k = K("tensor_core", inputs="bfloat16")
    v = iv.matmul(a, np.ones((2 * B, 1)), k)
    m = iv.matmul(iv.point(a), iv.point(np.ones((2 * B, 1))), k)
    assert 3e37 < v[0, 0] < 5e37 and m.contains(v).all()
