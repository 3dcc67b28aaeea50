"""Bounds on a kernel's sum or matmul, stage by stage, with overflow tracked through every partial sum.

A stage sums leaves x_i whose paths carry factors in [1 - theta_i, 1 + theta_i]: theta_i from
the number of roundings on leaf i's path (structure-aware rule) or n - 1 for all (order-
oblivious rule). The relative-error model holds only while no partial sum overflows, so each
stage also bounds every partial sum it forms (prefixes for sequential tiles, tree nodes for
pairwise, any subset where the order is unknown: atomics, warps' shuffle trees, the
oblivious rule) from the same per-leaf bounds. Where a partial sum may pass the stage
format's largest value:

* rounding to nearest (and up/down on their side) gives +-inf, which later adds keep: the
  bound reaches that infinity, and may be NaN where both signs can overflow (inf - inf);
* rounding that saturates (toward zero, up/down on the other side) breaks the model: the bound
  becomes [-inf, +inf].

Leaves that may be +-inf or NaN follow the same algebra (inf + finite = inf, inf - inf = NaN).
"""

from __future__ import annotations

import numpy as np

from ..formats import FloatFormat, get_format
from ._outward import _INF, _dn, _f64, _growth, _mul_box, _sum_dn, _sum_up, _up
from .interval import Interval, _any_iv, _parts, _rule_of, _value2
from .kernels import Kernel, _rng_for, _run_matmul, _run_sum, _seq_depths, _tile, leaf_depths
from .ops import _round_out, _unit

_INF_POS_MODES = ("nearest_even", "nearest_away", "up")  # positive overflow gives +inf
_INF_NEG_MODES = ("nearest_even", "nearest_away", "down")  # negative overflow gives -inf
_ERR = 2.0**-52
_DEFAULT = Kernel()  # sequential, float32


def _extremes(tlo: np.ndarray, thi: np.ndarray, how: str) -> tuple[np.ndarray, np.ndarray]:
    """(pmin, pmax): bounds on every partial sum a stage forms over the last axis, from per-leaf bounds.

    how: "prefix" (a sequential sum: its running sums), "tree" (reduce_sum's pairwise tree:
    its nodes), "any" (any order: every subset, so the sums of the positive / negative parts).
    """
    with np.errstate(invalid="ignore", over="ignore"):
        if how == "prefix":
            k = np.arange(1, tlo.shape[-1] + 1)
            err = (k + 2) * _ERR  # float64 running sums err by at most (k + 1) 2^-53 sum |t|
            pmax = np.max(np.cumsum(thi, axis=-1) + err * np.cumsum(np.abs(thi), axis=-1), axis=-1)
            pmin = np.min(np.cumsum(tlo, axis=-1) - err * np.cumsum(np.abs(tlo), axis=-1), axis=-1)
            return _dn(pmin), _up(pmax)
        if how == "tree":
            return _tree_extreme(tlo, -1), _tree_extreme(thi, +1)
        return _sum_dn(np.minimum(tlo, 0.0)), _sum_up(np.maximum(thi, 0.0))


def _tree_extreme(v: np.ndarray, sign: int) -> np.ndarray:
    """The largest (sign +1) or smallest node of reduce_sum's pairwise tree on v, each add rounded outward."""
    pick = np.maximum if sign > 0 else np.minimum
    best = np.max(v, axis=-1) if sign > 0 else np.min(v, axis=-1)
    while v.shape[-1] > 1:
        m = v.shape[-1]
        h = m // 2
        s = v[..., 0:2 * h:2] + v[..., 1:2 * h:2]
        pairs = _up(s) if sign > 0 else _dn(s)
        best = pick(best, np.max(pairs, axis=-1) if sign > 0 else np.min(pairs, axis=-1))
        v = pairs if m % 2 == 0 else np.concatenate([pairs, v[..., m - 1:m]], axis=-1)
    return best


def _stage(lo, hi, nan, theta, fmt: FloatFormat, mode: str, how: str, extra=None):
    """(lo, hi, nan) of one summation stage over the last axis, in fmt by mode (see the module docstring).

    extra: an absolute error added to the sum and to every partial sum (tensor-core blocks).
    """
    fin_lo, fin_hi = np.isfinite(lo), np.isfinite(hi)
    if fin_lo.all() and fin_hi.all():  # the common case: no infinity, no empty range
        L, H = lo, hi
        pinf_may = ninf_may = pinf_must = ninf_must = some_empty = np.zeros(lo.shape[:-1], dtype=bool)
    else:
        empty = lo > hi
        pinf_may = np.any(~empty & (hi == _INF), axis=-1)
        ninf_may = np.any(~empty & (lo == -_INF), axis=-1)
        pinf_must = np.any(~empty & (lo == _INF), axis=-1)
        ninf_must = np.any(~empty & (hi == -_INF), axis=-1)
        some_empty = np.any(empty, axis=-1)
        L, H = np.where(fin_lo, lo, 0.0), np.where(fin_hi, hi, 0.0)  # finite stand-ins
    with np.errstate(invalid="ignore", over="ignore"):
        tlo = _dn(L - _up(theta * np.abs(L)))
        thi = _up(H + _up(theta * np.abs(H)))
    slo, shi = _sum_dn(tlo), _sum_up(thi)
    with np.errstate(invalid="ignore", over="ignore"):  # no partial sum can come near fmt's range?
        reach = np.max(np.sum(np.abs(thi), axis=-1) + np.sum(np.abs(tlo), axis=-1), initial=0.0)
    if np.isfinite(reach) and reach * 1.001 + 4 * (0.0 if extra is None else float(np.max(extra))) < fmt.max_finite:
        pmin = pmax = np.zeros(slo.shape)
    else:
        pmin, pmax = _extremes(tlo, thi, how)
    if extra is not None:
        with np.errstate(invalid="ignore", over="ignore"):
            slo, shi = _dn(slo - extra), _up(shi + extra)
            pmin, pmax = _dn(pmin - extra), _up(pmax + extra)
    pos_over = (pmax >= fmt.max_finite) | pinf_may  # a summand that may be huge: so may its partial sums
    neg_over = (pmin <= -fmt.max_finite) | ninf_may
    pos_inf = pinf_may | (pos_over & (mode in _INF_POS_MODES))
    neg_inf = ninf_may | (neg_over & (mode in _INF_NEG_MODES))
    saturates = (pos_over & (mode not in _INF_POS_MODES)) | (neg_over & (mode not in _INF_NEG_MODES))
    rlo = np.where(neg_inf | saturates, -_INF, slo)
    rhi = np.where(pos_inf | saturates, _INF, shi)
    rlo = np.where(pinf_must, _INF, rlo)  # a summand that is +inf: the sum is +inf (or NaN)
    rhi = np.where(ninf_must, -_INF, rhi)
    gone = some_empty | (pinf_must & ninf_must) | (rlo > rhi)
    rnan = (np.any(nan, axis=-1) if nan.any() else False) | gone | (pos_inf & neg_inf)
    return np.where(gone, _INF, rlo), np.where(gone, -_INF, rhi), rnan


def _pad_tiles(v: np.ndarray, t: int, fill) -> np.ndarray:
    """Pad the last axis to a multiple of t with `fill` and split it into (..., tiles, t)."""
    n = v.shape[-1]
    nb = -(-n // t)
    pad = np.full((*v.shape[:-1], nb * t - n), fill, dtype=v.dtype)
    return np.concatenate([v, pad], axis=-1).reshape(*v.shape[:-1], nb, t)


def _check_abs(fmt: FloatFormat) -> None:
    if not fmt.has_inf:
        raise ValueError(f"bounds support formats with infinities; got {fmt.name}")


def _bound_sum(lo, hi, nan, kernel: Kernel, rule: str):
    """(lo, hi, nan): bounds on kernel's sum over the last axis of any x in the box, and on the exact sum."""
    k = kernel
    acc, comb, out = get_format(k.acc), k.combine_format, k.out_format
    for f in (acc, comb, out):
        _check_abs(f)
    n = lo.shape[-1]
    nan = np.broadcast_to(nan, lo.shape)
    lo, hi = _round_out(lo, hi, acc)  # loading into the accumulator (exact for its own values)
    u_acc = _unit(acc, k.mode)
    if rule == "oblivious":
        fmts = [acc, comb] + ([get_format(k.partial)] if k.partial else [])
        u = max(_unit(f, k.mode) for f in fmts)
        casts = (k.partial is not None) + (k.combine is not None)
        theta = _growth(u, np.array(max(n - 1, 0) + casts))
        extra = None
        if casts:  # a cast in the subnormal range errs by up to q absolutely, once per tile
            q = max(f.min_subnormal for f in fmts)
            tiles = -(-n // _tile(k, n)) if k.order in ("split_k", "atomic", "blocked") else 1
            extra = _up(2 * casts * tiles * q * (1 + float(theta)))
        narrowest = min(fmts, key=lambda f: f.max_finite)  # any partial may sit in any stage format
        slo, shi, snan = _stage(lo, hi, nan, theta, narrowest, k.mode, "any", extra)
        return (*_round_out(slo, shi, out), snan)
    if k.order in ("sequential", "pairwise"):
        theta = _growth(u_acc, leaf_depths(n, k)["tile"])
        how = "prefix" if k.order == "sequential" else "tree"
        slo, shi, snan = _stage(lo, hi, nan, theta, acc, k.mode, how)
        return (*_round_out(slo, shi, out), snan)
    if k.order == "warp":
        T = k.threads
        rows = -(-n // T)
        per_thread = np.array([len(range(t, n, T)) for t in range(T)])
        # thread t sums elements t, t + T, ...: regroup them as consecutive tiles of `rows`
        L, H, N = (np.swapaxes(_pad_tiles(v, T, fill).reshape(*v.shape[:-1], rows, T), -1, -2)
                   for v, fill in ((lo, 0.0), (hi, 0.0), (nan, False)))
        theta1 = _growth(u_acc, _seq_depths(per_thread, rows))
        tlo, thi, tnan = _stage(L, H, N, theta1, acc, k.mode, "prefix")  # (..., T)
        theta2 = _growth(u_acc, np.full(T, 10))  # 5 shuffle levels in the warp, 5 across warps
        slo, shi, snan = _stage(tlo, thi, tnan, theta2, acc, k.mode, "any")
        return (*_round_out(slo, shi, out), snan)
    # blocked, split_k, atomic
    if k.order == "atomic" and k.block == 1 and k.combine is None and k.partial is None:
        theta = _growth(u_acc, np.full(n, n - 1))
        slo, shi, snan = _stage(lo, hi, nan, theta, acc, k.mode, "any")
        return (*_round_out(slo, shi, out), snan)
    t = _tile(k, n)
    nb = -(-n // t)
    lengths = np.minimum(t, n - np.arange(nb) * t)
    theta = _growth(u_acc, _seq_depths(lengths, t))
    plo, phi, pnan = _stage(_pad_tiles(lo, t, 0.0), _pad_tiles(hi, t, 0.0), _pad_tiles(nan, t, False),
                            theta, acc, k.mode, "prefix")
    if k.partial is not None:
        plo, phi = _round_out(plo, phi, k.partial)
        plo, phi = _round_out(plo, phi, acc)
    plo, phi = _round_out(plo, phi, comb)
    u_c = _unit(comb, k.mode)
    if k.order == "atomic":
        theta = _growth(u_c, np.full(nb, nb - 1))
    else:
        theta = _growth(u_c, _seq_depths(np.array(nb), nb))
    slo, shi, snan = _stage(plo, phi, pnan, theta, comb, k.mode, "any" if k.order == "atomic" else "prefix")
    return (*_round_out(slo, shi, out), snan)


def _tc_step(kernel: Kernel) -> tuple[float, float]:
    """(relative, absolute) error one tensor-core block FMA may add, upper bounds.

    Terms are cut to multiples of 2^(e_max - 23 - g) (each error below that, and below
    2^(-23-g) |largest term|), summed exactly, then truncated to float32 (below 2^-23 of the
    sum, or 2^-149 below float32's normal range): |d - sum t| <= ((B + 1) 2^(-23-g) (1 + 2^-23)
    + 2^-23) sum |t| + 2^-149. With a float16 output every block's result is also rounded to
    float16 (gpu.tensorcore.block_fma), one more factor (1 + 2^-11) and 2^-25 absolute.
    """
    from ..gpu import get_tensor_core_model

    m = get_tensor_core_model(kernel.model)
    rel = float(_up((m.block + 1) * 2.0 ** (-23 - m.align_bits) * (1 + 2.0**-23) + 2.0**-23))
    absolute = 2.0**-149
    if kernel.out_format.name == "float16":
        rel = float(_up(_up((1 + rel) * (1 + 2.0**-11)) - 1))
        absolute = float(_up(absolute * (1 + 2.0**-11) + 2.0**-25))
    return rel, absolute


def _bound_tensor_core(plo, phi, pnan, kernel: Kernel, rule: str):
    """(lo, hi, nan) of a tensor-core matmul: blocks in order, each result truncated to float32
    (saturating at its largest value) and, with a float16 output, rounded to nearest float16."""
    from ..gpu import get_tensor_core_model

    k = plo.shape[-1]
    nblk = len(range(0, k, get_tensor_core_model(kernel.model).block))
    c, absolute = _tc_step(kernel)
    if rule == "oblivious":
        d = np.full(k, max(k - 1, 1))
    else:
        d = leaf_depths(k, kernel)["block_fma"]
    theta = _growth(c, d)
    extra = _up(nblk * absolute * (1 + float(np.max(theta))))  # each block's absolute error, grown
    out = kernel.out_format
    mode = "nearest_even" if out.name == "float16" else "toward_zero"
    slo, shi, snan = _stage(plo, phi, pnan, theta, out, mode, "any" if rule == "oblivious" else "prefix",
                            extra)
    slo, shi = _round_out(slo, shi, "float32")
    return (*_round_out(slo, shi, out), snan)


def _check_kernel(kernel) -> Kernel:
    if not isinstance(kernel, Kernel):
        raise ValueError(f"kernel must be a precisionlab.intervals.Kernel; got kernel={kernel!r}")
    return kernel


def sum_(x, kernel: Kernel = _DEFAULT, rng: np.random.Generator | None = None):
    """sum over the last axis as `kernel` runs it; on intervals the kernel's bound under the interval's rule."""
    kernel = _check_kernel(kernel)
    if kernel.order == "tensor_core":
        raise ValueError("order='tensor_core' is a matmul kernel; use another order for sums")
    for name in ("inputs", "stored_as"):
        if getattr(kernel, name) is not None:
            raise ValueError(f"{name} describes matmul operands; sum_ needs a kernel without it; got "
                             f"{name}={getattr(kernel, name)!r}")
    if kernel.fused:
        raise ValueError("fused=True describes a matmul (gpu.matmul); sum_ needs fused=False")
    if not isinstance(x, Interval):
        xa = _f64(x)
        if xa.ndim == 0 or xa.shape[-1] == 0:
            raise ValueError(f"x must have a non-empty last axis to sum over; got shape {xa.shape}")
        return _run_sum(xa, kernel, _rng_for(kernel, rng))
    if x.ndim == 0 or x.shape[-1] == 0:
        raise ValueError(f"x must have a non-empty last axis to sum over; got shape {x.shape}")
    lo, hi, nan = _bound_sum(x.lo, x.hi, x.nan, kernel, x.rule)
    v = None if x.value is None or (kernel.order == "atomic" and rng is None) else sum_(x.value, kernel, rng)
    return Interval(lo, hi, v, x.rule, nan)


def matmul(a, b, kernel: Kernel = _DEFAULT, rng: np.random.Generator | None = None):
    """C = A B as `kernel` runs it; on intervals: operands rounded outward, corner products, the kernel's sum bound."""
    kernel = _check_kernel(kernel)
    sa = a.shape if isinstance(a, Interval) else np.shape(_f64(a))
    sb = b.shape if isinstance(b, Interval) else np.shape(_f64(b))
    if len(sa) != 2 or len(sb) != 2 or sa[1] != sb[0]:
        raise ValueError(f"matmul needs a (m, k) and b (k, n); got shapes {sa} and {sb}")
    if sa[1] == 0:
        raise ValueError(f"matmul needs k >= 1; got shapes {sa} and {sb}")
    if not _any_iv(a, b):
        return _run_matmul(_f64(a), _f64(b), kernel, _rng_for(kernel, rng))
    alo, ahi, anan, _, _ = _parts(a)
    blo, bhi, bnan, _, _ = _parts(b)
    rule = _rule_of(a, b)
    for fmt in (kernel.stored_as, kernel.inputs):  # operand casts: rounded outward, any mode
        if fmt is not None:
            alo, ahi = _round_out(alo, ahi, fmt)
            blo, bhi = _round_out(blo, bhi, fmt)
    plo, phi, pnan = _mul_box(alo[:, None, :], ahi[:, None, :], blo.T[None, :, :], bhi.T[None, :, :])
    pnan = pnan | anan[:, None, :] | bnan.T[None, :, :]
    if kernel.order == "tensor_core":
        lo, hi, nan = _bound_tensor_core(plo, phi, pnan, kernel, rule)
    else:
        lo, hi, nan = _bound_sum(plo, phi, pnan, kernel, rule)
    v = None if (kernel.order == "atomic" and rng is None) else _value2(
        lambda p, q: matmul(p, q, kernel, rng), a, b)
    return Interval(lo, hi, v, rule, nan)

