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
from ..gpu import Kernel, as_float64, get_tensor_core_model, leaf_depths, run_matmul, run_sum
from ..gpu.leaf_depths import sequential_depths
from .interval import Interval, any_interval, paired_value, parts_of, rule_of
from .outward import INF, down, growth, mul_box, round_out, rounding_unit, sum_down, sum_up, up

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
            return down(pmin), up(pmax)
        if how == "tree":
            return _tree_extreme(tlo, -1), _tree_extreme(thi, +1)
        return sum_down(np.minimum(tlo, 0.0)), sum_up(np.maximum(thi, 0.0))


def _tree_extreme(v: np.ndarray, sign: int) -> np.ndarray:
    """The largest (sign +1) or smallest node of reduce_sum's pairwise tree on v, each add rounded outward."""
    pick = np.maximum if sign > 0 else np.minimum
    best = np.max(v, axis=-1) if sign > 0 else np.min(v, axis=-1)
    while v.shape[-1] > 1:
        m = v.shape[-1]
        h = m // 2
        s = v[..., 0:2 * h:2] + v[..., 1:2 * h:2]
        pairs = up(s) if sign > 0 else down(s)
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
        pinf_may = np.any(~empty & (hi == INF), axis=-1)
        ninf_may = np.any(~empty & (lo == -INF), axis=-1)
        pinf_must = np.any(~empty & (lo == INF), axis=-1)
        ninf_must = np.any(~empty & (hi == -INF), axis=-1)
        some_empty = np.any(empty, axis=-1)
        L, H = np.where(fin_lo, lo, 0.0), np.where(fin_hi, hi, 0.0)  # finite stand-ins
    with np.errstate(invalid="ignore", over="ignore"):
        tlo = down(L - up(theta * np.abs(L)))
        thi = up(H + up(theta * np.abs(H)))
    slo, shi = sum_down(tlo), sum_up(thi)
    with np.errstate(invalid="ignore", over="ignore"):  # no partial sum can come near fmt's range?
        reach = np.max(np.sum(np.abs(thi), axis=-1) + np.sum(np.abs(tlo), axis=-1), initial=0.0)
    if np.isfinite(reach) and reach * 1.001 + 4 * (0.0 if extra is None else float(np.max(extra))) < fmt.max_finite:
        pmin = pmax = np.zeros(slo.shape)
    else:
        pmin, pmax = _extremes(tlo, thi, how)
    if extra is not None:
        with np.errstate(invalid="ignore", over="ignore"):
            slo, shi = down(slo - extra), up(shi + extra)
            pmin, pmax = down(pmin - extra), up(pmax + extra)
    pos_over = (pmax >= fmt.max_finite) | pinf_may  # a summand that may be huge: so may its partial sums
    neg_over = (pmin <= -fmt.max_finite) | ninf_may
    pos_inf = pinf_may | (pos_over & (mode in _INF_POS_MODES))
    neg_inf = ninf_may | (neg_over & (mode in _INF_NEG_MODES))
    saturates = (pos_over & (mode not in _INF_POS_MODES)) | (neg_over & (mode not in _INF_NEG_MODES))
    rlo = np.where(neg_inf | saturates, -INF, slo)
    rhi = np.where(pos_inf | saturates, INF, shi)
    rlo = np.where(pinf_must, INF, rlo)  # a summand that is +inf: the sum is +inf (or NaN)
    rhi = np.where(ninf_must, -INF, rhi)
    gone = some_empty | (pinf_must & ninf_must) | (rlo > rhi)
    rnan = (np.any(nan, axis=-1) if nan.any() else False) | gone | (pos_inf & neg_inf)
    return np.where(gone, INF, rlo), np.where(gone, -INF, rhi), rnan


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
    lo, hi = round_out(lo, hi, acc)  # loading into the accumulator (exact for its own values)
    u_acc = rounding_unit(acc, k.mode)
    if rule == "oblivious":
        fmts = [acc, comb] + ([get_format(k.partial)] if k.partial else [])
        u = max(rounding_unit(f, k.mode) for f in fmts)
        casts = (k.partial is not None) + (k.combine is not None)
        theta = growth(u, np.array(max(n - 1, 0) + casts))
        extra = None
        if casts:  # a cast in the subnormal range errs by up to q absolutely, once per tile
            q = max(f.min_subnormal for f in fmts)
            tiles = -(-n // k.tile(n)) if k.order in ("split_k", "atomic", "blocked") else 1
            extra = up(2 * casts * tiles * q * (1 + float(theta)))
        narrowest = min(fmts, key=lambda f: f.max_finite)  # any partial may sit in any stage format
        slo, shi, snan = _stage(lo, hi, nan, theta, narrowest, k.mode, "any", extra)
        return (*round_out(slo, shi, out), snan)
    if k.order in ("sequential", "pairwise"):
        theta = growth(u_acc, leaf_depths(n, k)["tile"])
        how = "prefix" if k.order == "sequential" else "tree"
        slo, shi, snan = _stage(lo, hi, nan, theta, acc, k.mode, how)
        return (*round_out(slo, shi, out), snan)
    if k.order == "warp":
        T = k.threads
        rows = -(-n // T)
        per_thread = np.array([len(range(t, n, T)) for t in range(T)])
        # thread t sums elements t, t + T, ...: regroup them as consecutive tiles of `rows`
        L, H, N = (np.swapaxes(_pad_tiles(v, T, fill).reshape(*v.shape[:-1], rows, T), -1, -2)
                   for v, fill in ((lo, 0.0), (hi, 0.0), (nan, False)))
        theta1 = growth(u_acc, sequential_depths(per_thread, rows))
        tlo, thi, tnan = _stage(L, H, N, theta1, acc, k.mode, "prefix")  # (..., T)
        theta2 = growth(u_acc, np.full(T, 10))  # 5 shuffle levels in the warp, 5 across warps
        slo, shi, snan = _stage(tlo, thi, tnan, theta2, acc, k.mode, "any")
        return (*round_out(slo, shi, out), snan)
    # blocked, split_k, atomic
    if k.order == "atomic" and k.block == 1 and k.combine is None and k.partial is None:
        theta = growth(u_acc, np.full(n, n - 1))
        slo, shi, snan = _stage(lo, hi, nan, theta, acc, k.mode, "any")
        return (*round_out(slo, shi, out), snan)
    t = k.tile(n)
    nb = -(-n // t)
    lengths = np.minimum(t, n - np.arange(nb) * t)
    theta = growth(u_acc, sequential_depths(lengths, t))
    plo, phi, pnan = _stage(_pad_tiles(lo, t, 0.0), _pad_tiles(hi, t, 0.0), _pad_tiles(nan, t, False),
                            theta, acc, k.mode, "prefix")
    if k.partial is not None:
        plo, phi = round_out(plo, phi, k.partial)
        plo, phi = round_out(plo, phi, acc)
    plo, phi = round_out(plo, phi, comb)
    u_c = rounding_unit(comb, k.mode)
    if k.order == "atomic":
        theta = growth(u_c, np.full(nb, nb - 1))
    else:
        theta = growth(u_c, sequential_depths(np.array(nb), nb))
    slo, shi, snan = _stage(plo, phi, pnan, theta, comb, k.mode, "any" if k.order == "atomic" else "prefix")
    return (*round_out(slo, shi, out), snan)


def _tc_step(kernel: Kernel) -> tuple[float, float]:
    """(relative, absolute) error one tensor-core block FMA may add, upper bounds.

    Terms are cut to multiples of 2^(e_max - 23 - g) (each error below that, and below
    2^(-23-g) |largest term|), summed exactly, then truncated to float32 (below 2^-23 of the
    sum, or 2^-149 below float32's normal range): |d - sum t| <= ((B + 1) 2^(-23-g) (1 + 2^-23)
    + 2^-23) sum |t| + 2^-149. With a float16 output every block's result is also rounded to
    float16 (gpu.tensorcore.block_fma), one more factor (1 + 2^-11) and 2^-25 absolute.
    """
    m = get_tensor_core_model(kernel.model)
    rel = float(up((m.block + 1) * 2.0 ** (-23 - m.align_bits) * (1 + 2.0**-23) + 2.0**-23))
    absolute = 2.0**-149
    if kernel.out_format.name == "float16":
        rel = float(up(up((1 + rel) * (1 + 2.0**-11)) - 1))
        absolute = float(up(absolute * (1 + 2.0**-11) + 2.0**-25))
    return rel, absolute


def _bound_tensor_core(plo, phi, pnan, kernel: Kernel, rule: str):
    """(lo, hi, nan) of a tensor-core matmul: blocks in order, each result truncated to float32
    (saturating at its largest value) and, with a float16 output, rounded to nearest float16."""
    k = plo.shape[-1]
    nblk = len(range(0, k, get_tensor_core_model(kernel.model).block))
    c, absolute = _tc_step(kernel)
    if rule == "oblivious":
        d = np.full(k, max(k - 1, 1))
    else:
        d = leaf_depths(k, kernel)["block_fma"]
    theta = growth(c, d)
    extra = up(nblk * absolute * (1 + float(np.max(theta))))  # each block's absolute error, grown
    out = kernel.out_format
    mode = "nearest_even" if out.name == "float16" else "toward_zero"
    slo, shi, snan = _stage(plo, phi, pnan, theta, out, mode, "any" if rule == "oblivious" else "prefix",
                            extra)
    slo, shi = round_out(slo, shi, "float32")
    return (*round_out(slo, shi, out), snan)


def _check_kernel(kernel) -> Kernel:
    if not isinstance(kernel, Kernel):
        raise ValueError(f"kernel must be a precisionlab.intervals.Kernel; got kernel={kernel!r}")
    return kernel


def sum_(x, kernel: Kernel = _DEFAULT, *, seed: int | None = None):
    """sum over the last axis as `kernel` runs it; on intervals the kernel's bound under the interval's rule.

    seed: the seed of np.random.default_rng an atomic kernel draws its orders from (required to
    execute one; an interval's executed value is left out without it).

    Parameters
    ----------
    x : array_like or Interval
        The summands, along the last axis (non-empty).
    kernel : Kernel, default Kernel()
        How the sum runs: order ("sequential", "pairwise", "blocked", "split_k",
        "atomic", "warp", ...), block size, accumulator and partial formats, rounding mode.
        The default adds sequentially in float32. Matmul-only fields (inputs, stored_as,
        fused, order "tensor_core") are refused.
    seed : int or None, default None
        Keyword only: the seed an atomic kernel draws its orders from.

    Returns
    -------
    numpy.ndarray or Interval
        The sums (float64, x's shape without the last axis); for an Interval, their
        bound under the interval's rule, "structure" (the kernel's summation tree) or
        "oblivious" (any order, RENDER's rule).

    Raises
    ------
    ValueError
        If kernel is not a Kernel or describes a matmul, or x has no last axis to sum.

    Examples
    --------
    A thousand 0.1s added in float16: sequentially the running sum's roundings pile up
    (past 64, where float16's spacing is 0.0625, every add of 0.1 rounds to a step of
    0.125) and it ends at 105.1875; in blocks of 32 the partial sums stay short and it
    ends at 99.6875. The structure-aware bound follows each kernel; the order-oblivious one
    is the same wide interval for both.

    >>> import numpy as np
    >>> from precisionlab.intervals import Kernel, point, sum_
    >>> x = np.full(1000, 0.1)
    >>> sequential = Kernel(acc="float16")
    >>> blocked = Kernel(order="blocked", block=32, acc="float16")
    >>> float(sum_(x, sequential)), float(sum_(x, blocked))
    (105.1875, 99.6875)
    >>> b = sum_(point(x), sequential)
    >>> float(b.lo), float(b.hi)
    (71.0, 129.0)
    >>> b = sum_(point(x), blocked)
    >>> float(b.lo), float(b.hi)
    (98.25, 101.75)
    >>> b = sum_(point(x, rule="oblivious"), blocked)
    >>> float(b.lo), float(b.hi)
    (37.125, 163.0)
    """
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
        xa = as_float64(x)
        if xa.ndim == 0 or xa.shape[-1] == 0:
            raise ValueError(f"x must have a non-empty last axis to sum over; got shape {xa.shape}")
        return run_sum(xa, kernel, seed)
    if x.ndim == 0 or x.shape[-1] == 0:
        raise ValueError(f"x must have a non-empty last axis to sum over; got shape {x.shape}")
    lo, hi, nan = _bound_sum(x.lo, x.hi, x.nan, kernel, x.rule)
    v = None if x.value is None or (kernel.order == "atomic" and seed is None) else sum_(
        x.value, kernel, seed=seed)
    return Interval(lo, hi, v, x.rule, nan)


def matmul(a, b, kernel: Kernel = _DEFAULT, *, seed: int | None = None):
    """C = A B as `kernel` runs it; on intervals: operands rounded outward, corner products, the kernel's sum bound.

    seed: as for sum_ (the atomic orders).

    Parameters
    ----------
    a, b : array_like or Interval
        The operands, (m, k) and (k, n) with k >= 1.
    kernel : Kernel, default Kernel()
        How the matmul runs: the summation order, accumulator, operand formats (inputs,
        stored_as), fused multiply-adds, or a tensor core (order "tensor_core"). The
        default adds each dot product sequentially in float32.
    seed : int or None, default None
        Keyword only: the seed an atomic kernel draws its orders from.

    Returns
    -------
    numpy.ndarray or Interval
        C (float64, (m, n)) when neither operand is an Interval, else the bound of every C
        the kernel may produce.

    Raises
    ------
    ValueError
        If kernel is not a Kernel, the shapes do not match, or k is 0.

    Examples
    --------
    >>> import numpy as np
    >>> from precisionlab.intervals import Kernel, matmul, point
    >>> a, b = np.full((2, 3), 0.1), np.full((3, 2), 0.5)
    >>> c = matmul(point(a), point(b), Kernel(acc="float16"))
    >>> c.shape, bool(c.contains(matmul(a, b, Kernel(acc="float16"))).all())
    ((2, 2), True)
    """
    kernel = _check_kernel(kernel)
    sa = a.shape if isinstance(a, Interval) else np.shape(as_float64(a))
    sb = b.shape if isinstance(b, Interval) else np.shape(as_float64(b))
    if len(sa) != 2 or len(sb) != 2 or sa[1] != sb[0]:
        raise ValueError(f"matmul needs a (m, k) and b (k, n); got shapes {sa} and {sb}")
    if sa[1] == 0:
        raise ValueError(f"matmul needs k >= 1; got shapes {sa} and {sb}")
    if not any_interval(a, b):
        return run_matmul(as_float64(a), as_float64(b), kernel, seed)
    alo, ahi, anan, _, _ = parts_of(a)
    blo, bhi, bnan, _, _ = parts_of(b)
    rule = rule_of(a, b)
    for fmt in (kernel.stored_as, kernel.inputs):  # operand casts: rounded outward, any mode
        if fmt is not None:
            alo, ahi = round_out(alo, ahi, fmt)
            blo, bhi = round_out(blo, bhi, fmt)
    plo, phi, pnan = mul_box(alo[:, None, :], ahi[:, None, :], blo.T[None, :, :], bhi.T[None, :, :])
    pnan = pnan | anan[:, None, :] | bnan.T[None, :, :]
    if kernel.order == "tensor_core":
        lo, hi, nan = _bound_tensor_core(plo, phi, pnan, kernel, rule)
    else:
        lo, hi, nan = _bound_sum(plo, phi, pnan, kernel, rule)
    v = None if (kernel.order == "atomic" and seed is None) else paired_value(
        lambda p, q: matmul(p, q, kernel, seed=seed), a, b)
    return Interval(lo, hi, v, rule, nan)

