"""round_to's native back end: torch's (and NumPy's) own casts where they are exactly fl(x).

Where a library casts exactly -- round-to-nearest-even from float32 into float16, bfloat16
and float8_e5m2 with torch, into float8_e4m3fn with the overflow rule this torch has
(saturating from torch 2.13, NaN before; probed), float64 into float32 with NumPy -- round_to
may cast there and back instead of running `rounding_kernel`. NaNs come back as the quiet
NaN with the input's sign, the kernel's pattern (a library cast keeps payload bits), so
every back end gives the same bits (tests/test_rounding_native.py). `auto_takes_native`
is where backend="auto" prefers the cast: float32 inputs below the kernel's numba tier,
and float64 -> float32 always.
"""

from __future__ import annotations

import functools

import numpy as np
import torch

from . import rounding_kernel
from .formats import FloatFormat

__all__ = ["auto_takes_native", "native_cast", "native_dtype", "native_tensor"]


@functools.cache
def _torch_e4m3fn_saturates() -> bool | None:
    """True if torch's float32 -> float8_e4m3fn cast takes overflow and inf to +-448; False: NaN."""
    # torch 2.13 made the cast saturate (2.13 to 2.15 measured); 2.3 to 2.12 give NaN there,
    # as ml_dtypes does.
    # 67 values: long enough for the vectorised kernel, with a scalar tail.
    x = torch.tensor([464.0, 465.0, 1e6, float("inf"), -float("inf")] * 13 + [448.0, -500.0])
    y = x.to(torch.float8_e4m3fn).float()
    if torch.equal(y, x.clamp(-448.0, 448.0)):
        return True
    fits = x.abs() <= 464  # 464 ties to 448 under either rule
    if torch.equal(y[fits], x[fits].clamp(-448.0, 448.0)) and bool(y[~fits].isnan().all()):
        return False
    return None  # some other rule: no native cast for e4m3fn


def _canonical_nans(a: np.ndarray, out: np.ndarray) -> None:
    """Give every NaN of out the emulated back end's bits: the quiet NaN with a's sign.

    A library cast keeps some of a NaN input's payload bits; the integer kernel writes the
    quiet NaN (payload 0) with the input's sign, and so, after this, does the native path.
    """
    nan = np.isnan(out)
    if nan.any():
        out[nan] = np.copysign(np.array(np.nan, dtype=out.dtype), a[nan])


def native_dtype(fmt: FloatFormat, saturate: bool) -> torch.dtype | None:
    """The torch dtype whose cast from float32 is exactly fl(x) into fmt (nearest even), or None."""
    # torch 2.13's e8m0fnu cast takes 0 to 2^-127 and drops the sign; ml_dtypes (followed
    # here) gives NaN: unsigned formats never go native.
    if fmt.torch_dtype is None or fmt.name in ("float32", "float64") or not fmt.signed:
        return None
    # torch (2.3 to 2.15 measured) takes overflow to inf in the formats that have one, as IEEE 754
    # conversion does (tests/test_rounding.py checks the native casts against fractions); its
    # e4m3fn overflow rule changed in 2.13 and is probed.
    torch_saturates = _torch_e4m3fn_saturates() if fmt.name == "float8_e4m3fn" else False
    if torch_saturates is None or torch_saturates != bool(saturate):
        return None
    return fmt.torch_dtype


def native_cast(a: np.ndarray, fmt: FloatFormat, saturate: bool):
    """A function out -> None that writes the library's exact fl(a) into out, or None."""
    if a.dtype == np.float64 and fmt.name == "float32" and not saturate:
        def cast64(out):
            np.copyto(out, a.astype(np.float32))  # C double->float is RNE
            _canonical_nans(a, out)
        return cast64
    # torch 2.13 casts float64 through float32 (double rounding), so only float32 inputs go
    # native, whatever the version.
    dtype = native_dtype(fmt, saturate) if a.dtype == np.float32 else None
    if dtype is None:
        return None

    def cast(out):
        torch.from_numpy(out).copy_(torch.from_numpy(a).to(dtype))
        _canonical_nans(a, out)
    return cast


def auto_takes_native(a: np.ndarray, fmt: FloatFormat) -> bool:
    """Whether backend="auto" takes an exact native cast (given one) rather than the kernel."""
    if a.dtype == np.float32 and fmt.name != "float32":
        # Below NUMBA_MIN_SIZE values torch's round trip (two casts and a temporary) beats the
        # NumPy tier 2-4x in every format; from there on the kernel's one fused pass
        # (_nearest_f32_loop, _round_word_uniform: the same bits on every float32 pattern,
        # tests/test_rounding_native.py) is faster.
        return a.size < rounding_kernel.NUMBA_MIN_SIZE
    return True  # float64 -> float32: NumPy's one C cast


def native_tensor(t: torch.Tensor, fmt: FloatFormat, saturate: bool, backend: str):
    """fl(t) by torch's own cast for a float32 (or float64 -> float32) CPU tensor, or None.

    The same casts as native_cast's, without the trip through NumPy: a short tensor (a
    layer's activations, rounded thousands of times per training run) costs a few
    microseconds instead of some twenty. float64 -> float32 is torch's C double -> float
    conversion, the one NumPy makes (nearest even, subnormals kept, overflow to inf). None
    means round_to decides.
    """
    if t.device.type != "cpu" or backend == "emulated":
        return None
    if t.dtype == torch.float64 and fmt.name == "float32" and not saturate:
        dtype, wide = torch.float32, torch.float64  # auto_takes_native: always
    elif t.dtype == torch.float32 and not (
            backend == "auto" and t.numel() >= rounding_kernel.NUMBA_MIN_SIZE):
        dtype, wide = native_dtype(fmt, saturate), torch.float32
    else:
        return None
    if dtype is None:
        return None
    t = t.contiguous()
    y = t.to(dtype).to(wide)
    nan = torch.isnan(y)
    if bool(nan.any()):  # the kernel's NaN: quiet, payload 0, the input's sign
        y[nan] = torch.copysign(torch.tensor(float("nan"), dtype=wide), t[nan])
    return y
