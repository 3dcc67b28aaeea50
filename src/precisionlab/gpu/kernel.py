"""Kernel: how a sum or matmul is executed, every field honoured or rejected by name; run_sum and run_matmul run it."""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from ..checks import check_choice, check_positive_int
from ..formats import FloatFormat, get_format
from ..rounding import MODES, seed_generator
from .arith import round_float64
from .matmul import matmul as profile_matmul
from .profiles import DeviceProfile, get_profile
from .reductions import reduce_sum
from .tensorcore import TENSOR_CORE_MODELS, get_tensor_core_model, tensor_core_matmul

__all__ = ["KERNEL_ORDERS", "Kernel", "promote", "run_matmul", "run_sum"]

KERNEL_ORDERS: tuple[str, ...] = ("sequential", "pairwise", "blocked", "warp", "split_k", "atomic",
                                  "tensor_core")
_ACC_FORMATS = ("float16", "bfloat16", "tf32", "float32", "float64")
_STAGE_FORMATS = _ACC_FORMATS  # formats every stage field takes (each has infinities)
_FORMAT_FIELDS = {
    "acc": "accumulator format", "out": "output format", "inputs": "operand format",
    "partial": "format tile results are rounded to", "combine": "format tiles are combined in",
    "stored_as": "format operands are stored in",
}
_ACC_MODES = tuple(m for m in MODES if m != "stochastic")
_SHAPE_FIELDS = {  # field: (orders that use it, default there)
    "block": (("blocked", "atomic"), 32),
    "splits": (("split_k",), 4),
    "threads": (("warp",), 256),
    "model": (("tensor_core",), "A100"),
}


def _format_field(name: str, value) -> str:
    """The format's registry name, if `value` names one the field takes; else an error naming the field."""
    desc = _FORMAT_FIELDS[name]
    try:
        fname = get_format(value).name
    except ValueError:
        fname = None
    if fname not in _STAGE_FORMATS:
        what = "unknown" if fname is None else "unsupported"
        raise ValueError(f"{what} {name} {value!r} ({desc}); valid choices: {', '.join(_STAGE_FORMATS)}")
    return fname


def _conversion_mode(inputs: str) -> str:
    """How software converts into `inputs`: nearest, ties away for tf32 (cvt.rna.tf32.f32), else ties to even."""
    return "nearest_away" if inputs == "tf32" else "nearest_even"


@dataclass(frozen=True)
class Kernel:
    """A sum or matmul as the GPU simulator runs it: order, tile sizes and the format of every stage.

    order: one of KERNEL_ORDERS (reduce_sum's orders; "tensor_core" is the bit-level block FMA
    of gpu.tensorcore, matmul only). acc: the accumulator; out: the result's format (default
    acc). inputs/input_mode: matmul operands are rounded to this format first (None: used as
    given; input_mode defaults to the software conversion, nearest-away for tf32 and
    nearest-even otherwise). mode: rounding of every accumulation. block (blocked, atomic;
    default 32), splits (split_k; 4), threads (warp; 256) shape the order. partial: tile
    results are rounded to this format (split_k, atomic; the workspace, or C's dtype when tiles
    land in C by atomic adds); combine: the format tiles are added in (atomic, split_k,
    blocked; default acc). fused: run the matmul with gpu.matmul (fused multiply-adds of exact
    products; sequential or split_k only). model: the gpu.tensorcore model for
    order="tensor_core" (default A100). stored_as: operands are first stored in this format
    (nearest), then rounded to inputs; with inputs="tf32", input_mode="toward_zero" and
    stored_as="float32" a tensor core reads the raw float32 words (truncation).
    """

    order: str = "sequential"
    acc: str = "float32"
    out: str | None = None
    inputs: str | None = None
    input_mode: str | None = None
    mode: str = "nearest_even"
    block: int | None = None
    splits: int | None = None
    threads: int | None = None
    partial: str | None = None
    combine: str | None = None
    fused: bool = False
    model: str | None = None
    stored_as: str | None = None

    def __post_init__(self):
        check_choice(self.order, "order", KERNEL_ORDERS)
        if self.acc is None:
            raise ValueError(f"acc (accumulator format) is required; valid choices: {', '.join(_ACC_FORMATS)}")
        for name in _FORMAT_FIELDS:
            v = getattr(self, name)
            if v is not None:
                object.__setattr__(self, name, _format_field(name, v))
        check_choice(self.mode, "mode (accumulation rounding mode)", _ACC_MODES)
        if self.inputs is None:
            if self.input_mode is not None:
                raise ValueError(f"input_mode applies to operands rounded to inputs=; got "
                                 f"input_mode={self.input_mode!r} with inputs=None")
        elif self.input_mode is None:
            object.__setattr__(self, "input_mode", _conversion_mode(self.inputs))
        else:
            check_choice(self.input_mode, "input_mode (operand rounding mode)", _ACC_MODES)
        for name, (orders, default) in _SHAPE_FIELDS.items():
            v = getattr(self, name)
            if v is None:
                if self.order in orders:
                    object.__setattr__(self, name, default)
            elif self.order not in orders:
                raise ValueError(f"{name} applies to order {' or '.join(orders)}; got {name}={v!r} "
                                 f"with order={self.order!r}")
            elif name != "model":
                check_positive_int(v, name)
        if self.threads is not None and (self.threads % 32 or self.threads > 1024):
            raise ValueError(f"threads must be a multiple of 32, at most 1024; got threads={self.threads}")
        if not isinstance(self.fused, (bool, np.bool_)):
            raise ValueError(f"fused must be True or False; got fused={self.fused!r}")
        if self.acc == "float64" and self.mode != "nearest_even":
            raise ValueError(f"a float64 accumulator rounds to nearest only; got mode={self.mode!r}")
        if self.combine is not None and self.order not in ("blocked", "split_k", "atomic"):
            raise ValueError(f"combine applies to orders blocked, split_k, atomic; got order={self.order!r}")
        if self.partial is not None and self.order not in ("split_k", "atomic"):
            raise ValueError(f"partial applies to orders split_k, atomic; got order={self.order!r}")
        if self.fused and (self.order not in ("sequential", "split_k") or self.partial or self.combine
                           or self.inputs is None):
            raise ValueError("fused=True runs gpu.matmul: order 'sequential' or 'split_k', operands "
                             "rounded to inputs=, no partial or combine; got "
                             f"order={self.order!r}, inputs={self.inputs!r}, partial={self.partial!r}, "
                             f"combine={self.combine!r}")
        if self.order == "tensor_core":
            self._check_tensor_core()

    def _check_tensor_core(self) -> None:
        try:
            m = get_tensor_core_model(self.model)
        except ValueError:
            raise ValueError(f"unknown model {self.model!r} (tensor-core model); valid choices: "
                             f"{', '.join(TENSOR_CORE_MODELS)}") from None
        takes = m.inputs
        if self.inputs not in takes:
            raise ValueError(f"the {m.name} tensor_core kernel needs inputs= one of "
                             f"{', '.join(takes)}; got inputs={self.inputs!r}")
        if (self.out or "float32") not in ("float32", "float16") or self.acc != "float32":
            raise ValueError("a tensor_core kernel accumulates in float32 and returns float32 or "
                             f"float16; got acc={self.acc!r}, out={self.out!r}; valid choices for "
                             "out: float32, float16")
        if self.mode != "nearest_even":
            raise ValueError("a tensor_core kernel's additions truncate as its model says; leave mode "
                             f"at its default 'nearest_even'; got mode={self.mode!r}")

    @property
    def out_format(self) -> FloatFormat:
        """The format of the result."""
        return get_format(self.out or self.acc)

    @property
    def combine_format(self) -> FloatFormat:
        """The format tiles are combined in."""
        return get_format(self.combine or self.acc)

    def tile(self, n: int) -> int | None:
        """Elements per tile of the first stage of an n-term sum (split_k: ceil(n / splits); else block)."""
        if self.order == "split_k":
            return -(-n // self.splits)
        return self.block

    def describe(self) -> str:
        """One line: what the kernel does."""
        parts = [self.order]
        if self.order in ("blocked", "atomic"):
            parts.append(f"block={self.block}")
        if self.order == "split_k":
            parts.append(f"splits={self.splits}")
        if self.order == "warp":
            parts.append(f"threads={self.threads}")
        if self.order == "tensor_core":
            parts.append(f"model={getattr(self.model, 'name', self.model)}")
        if self.stored_as:
            parts.append(f"stored {self.stored_as}")
        if self.inputs:
            conv = self.input_mode != _conversion_mode(self.inputs)
            parts.append(f"operands {self.inputs}" + (f" ({self.input_mode})" if conv else ""))
        parts.append(f"acc {self.acc}")
        if self.partial:
            parts.append(f"partials {self.partial}")
        if self.combine:
            parts.append(f"combine in {self.combine}")
        parts.append(f"out {self.out_format.name}")
        if self.fused:
            parts.append("fused")
        return ", ".join(parts)

    @classmethod
    def from_profile(cls, profile, splits: int = 1) -> Kernel:
        """The kernel gpu.matmul runs for a device profile with `splits` k-chunks (fused, no promotion)."""
        p = get_profile(profile)
        if p.promote_every is not None or p.saturate:
            raise ValueError(f"profile {p.name!r} promotes or saturates; bounds cover profiles without "
                             "either (fp32, tf32, tf32-raw, bf16, fp16, fp16-acc16)")
        splits = check_positive_int(splits, "splits")
        return cls(order="split_k" if splits > 1 else "sequential", acc=p.accumulator_format.name,
                   out=p.output, inputs=p.inputs, input_mode=p.input_mode, mode=p.acc_mode,
                   splits=splits if splits > 1 else None, fused=True,
                   stored_as=getattr(p, "stored_as", None))


def promote(kernel: Kernel) -> Kernel:
    """The same order in float64 everywhere: the kernel as high-precision re-execution runs it.

    A tensor-core kernel becomes a sequential one (its block FMAs have no float64 form);
    operand conversion, partial and combine formats and fusion are dropped.

    Parameters
    ----------
    kernel : Kernel
        The kernel to re-execute.

    Returns
    -------
    Kernel
        A new kernel: the same order, block, splits and threads, accumulating and returning
        float64, rounding to nearest even.

    Examples
    --------
    >>> from precisionlab.intervals import Kernel, promote
    >>> promote(Kernel.from_profile("bf16")).describe()
    'sequential, acc float64, out float64'
    >>> promote(Kernel("blocked", acc="float16", block=4)).describe()
    'blocked, block=4, acc float64, out float64'
    """
    tc = kernel.order == "tensor_core"
    return replace(kernel, order="sequential" if tc else kernel.order, acc="float64", out="float64",
                   inputs=None, input_mode=None, partial=None, combine=None, mode="nearest_even",
                   fused=False, model=None if tc else kernel.model)


def _check_seed(kernel: Kernel, seed) -> None:
    """An atomic kernel needs a seed; any seed given must be one np.random.default_rng takes."""
    if seed is not None:
        seed_generator(seed)
    elif kernel.order == "atomic":
        raise ValueError("an atomic kernel draws its orders at random: pass seed=<int>; got seed=None")


def run_sum(x: np.ndarray, kernel: Kernel, seed: int | None = None) -> np.ndarray:
    """The kernel's sum over the last axis of float64 x, executed with reduce_sum (seed: atomic orders)."""
    _check_seed(kernel, seed)
    with np.errstate(over="ignore", invalid="ignore"):  # overflow and inf - inf are executed as IEEE says
        return _run_sum_stages(x, kernel, seed)


def _run_sum_stages(x: np.ndarray, kernel: Kernel, seed) -> np.ndarray:
    n = x.shape[-1]
    k = kernel
    if k.combine is None and not (k.order == "atomic" and k.partial is not None):
        order = "sequential" if k.order == "tensor_core" else k.order
        r = reduce_sum(x, order, k.acc, k.out_format, mode=k.mode, seed=seed, block=k.block or 32,
                       splits=k.splits or 4, threads=k.threads or 256, partial=k.partial)
        return np.asarray(r, dtype=np.float64)
    # Two stages: tiles summed in acc, rounded to `partial`, added in `combine` (in order, or
    # in a random order for atomics), as a split-K kernel whose tiles land in C by atomic adds.
    t = k.tile(n)
    nb = -(-n // t)
    pad = np.zeros((*x.shape[:-1], nb * t - n))
    tiles = np.concatenate([x, pad], axis=-1).reshape(*x.shape[:-1], nb, t)
    parts = np.asarray(reduce_sum(tiles, "sequential", k.acc, mode=k.mode), dtype=np.float64)
    if k.partial is not None:
        parts = round_float64(parts, k.partial, k.mode)
    order = "atomic" if k.order == "atomic" else "sequential"
    r = reduce_sum(parts, order, k.combine_format, k.out_format, mode=k.mode, seed=seed, block=1)
    return np.asarray(r, dtype=np.float64)


def _operands(a: np.ndarray, kernel: Kernel) -> np.ndarray:
    """fl_inputs(fl_stored_as(a)), each by its field's rounding."""
    if kernel.stored_as is not None:
        a = round_float64(a, kernel.stored_as)
    if kernel.inputs is None:
        return a
    return round_float64(a, kernel.inputs, kernel.input_mode)


def _tc_feed(a: np.ndarray, kernel: Kernel) -> tuple[np.ndarray, str]:
    """(operand, feed) for gpu.tensorcore: the software conversion, raw float32 words, or pre-rounded values."""
    k = kernel
    if k.stored_as is not None:
        a = round_float64(a, k.stored_as)
    if k.input_mode == _conversion_mode(k.inputs):
        return a, "converted"
    if k.inputs == "tf32" and k.input_mode == "toward_zero" and k.stored_as == "float32":
        return a, "raw"
    return round_float64(a, k.inputs, k.input_mode), "exact"


def _run_tensor_core(a: np.ndarray, b: np.ndarray, k: Kernel) -> np.ndarray:
    """gpu.tensorcore's bit-level matmul; entries whose operands include inf or NaN get IEEE's
    result instead (the sum of the products: +-inf, or NaN for inf - inf, 0 * inf, NaN), as
    the model covers finite operands only."""
    with np.errstate(invalid="ignore", over="ignore"):
        fa, fb = _operands(a, k), _operands(b, k)  # what the tensor core multiplies
        bad_a, bad_b = ~np.isfinite(fa), ~np.isfinite(fb)
        (A, feed), (B, _) = _tc_feed(np.where(bad_a, 0.0, a), k), _tc_feed(np.where(bad_b, 0.0, b), k)
        d = np.asarray(tensor_core_matmul(A, B, model=k.model, inputs=k.inputs,
                                          out=k.out_format.name, operands=feed), dtype=np.float64)
        if bad_a.any() or bad_b.any():
            special = bad_a.any(axis=1)[:, None] | bad_b.any(axis=0)[None, :]
            ieee = (fa[:, None, :] * fb.T[None, :, :]).sum(axis=-1)
            d = np.where(special, ieee, d)
    return d


def run_matmul(a: np.ndarray, b: np.ndarray, kernel: Kernel, seed: int | None = None) -> np.ndarray:
    """C = A B of float64 matrices under the kernel, executed with this simulator (seed: atomic orders)."""
    k = kernel
    _check_seed(k, seed)
    if k.order == "tensor_core":
        return _run_tensor_core(a, b, k)
    if k.fused:
        extra = {"stored_as": k.stored_as} if k.stored_as is not None else {}
        profile = DeviceProfile("kernel", k.describe(), k.inputs, k.input_mode, k.acc, k.mode,
                                k.out_format.name, **extra)
        with np.errstate(invalid="ignore", over="ignore"):
            return np.asarray(profile_matmul(a, b, profile,
                                             splits=k.splits if k.order == "split_k" else 1),
                              dtype=np.float64)
    A, B = _operands(a, k), _operands(b, k)
    with np.errstate(invalid="ignore", over="ignore"):
        products = A[:, None, :] * B.T[None, :, :]  # (m, n, k): exact for operands of <= 26 bits
        return _run_sum_stages(products, k, seed)
