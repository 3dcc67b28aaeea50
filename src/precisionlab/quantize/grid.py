"""Block grids: the block's size along each dimension, a view giving each block its own axes, its amax."""

from __future__ import annotations

import numbers

import torch

from ..checks import check_count

__all__ = ["as_float32", "block_amax", "block_shape", "blocked"]


def _divisors(n: int) -> str:
    return ", ".join(str(d) for d in range(1, n + 1) if n % d == 0)


def block_shape(shape: tuple[int, ...], block, axis: int = -1) -> tuple[int, ...]:
    """(b_0, ..., b_{d-1}): `block` along `axis` and 1 elsewhere, or `block` itself as a tile; each b_i divides n_i."""
    shape = tuple(shape)
    if isinstance(block, (tuple, list)):
        if len(block) != len(shape):
            raise ValueError(f"a tile block needs one size per dimension of x {shape}; "
                             f"got block={tuple(block)!r}")
        sizes = tuple(check_count(b, "block") for b in block)
    else:
        size = check_count(block, "block")
        if isinstance(axis, bool) or not isinstance(axis, numbers.Integral) or \
                not -len(shape) <= axis < len(shape):
            raise ValueError(f"axis must be an integer in [{-len(shape)}, {len(shape) - 1}] for x "
                             f"of shape {shape}; got axis={axis!r}")
        sizes = tuple(size if d == axis % len(shape) else 1 for d in range(len(shape)))
    for d, (n, b) in enumerate(zip(shape, sizes, strict=True)):
        if n % b:
            raise ValueError(f"block={block!r} does not divide x's size {n} along axis {d}; valid "
                             f"block sizes along that axis: {_divisors(n)}")
    return sizes


def blocked(x: torch.Tensor, block: tuple[int, ...]) -> torch.Tensor:
    """x viewed as (n_0/b_0, b_0, n_1/b_1, b_1, ...): block (i_0, i_1, ...) is x[i_0, :, i_1, :, ...]."""
    return x.reshape([v for n, b in zip(x.shape, block, strict=True) for v in (n // b, b)])


def block_amax(xb: torch.Tensor, name: str = "x") -> torch.Tensor:
    """amax_k = max |x| over block k (exact in any order), shape (n_0/b_0, 1, n_1/b_1, 1, ...), float64.

    An inf or NaN entry makes some amax non-finite: no scale exists, and ValueError says how
    many entries of `name` are to blame.
    """
    keep = [1 if i % 2 else n for i, n in enumerate(xb.shape)]
    if xb.numel() == 0:
        return torch.zeros(keep, dtype=torch.float64)
    if xb.dim() and all(n == 1 for n in keep):  # one block: one pass, no |x| copy
        lo, hi = torch.aminmax(xb)  # NaN and inf propagate into amax, as below
        amax = torch.maximum(hi, -lo).to(torch.float64).reshape(keep)
        return _finite(amax, xb, name)
    a = xb.abs()  # NaN and inf propagate through abs, maximum and amax into amax
    dims = tuple(d for d in range(1, a.dim(), 2) if a.shape[d] > 1)
    last = a.dim() - 1
    # torch reduces rows shorter than 32 slowly (3x for 16): halve them elementwise first.
    while last in dims and a.shape[last] % 2 == 0 and 1 < a.shape[last] < 32:
        half = a.shape[last] // 2
        a = torch.maximum(a[..., :half], a[..., half:])
    amax = (a.amax(dim=dims, keepdim=True) if dims else a).to(torch.float64)
    return _finite(amax, xb, name)


def _finite(amax: torch.Tensor, xb: torch.Tensor, name: str) -> torch.Tensor:
    """amax if every entry is finite, else ValueError counting the inf/NaN entries of x."""
    if not bool(torch.isfinite(amax).all()):
        bad = int((~torch.isfinite(xb)).sum())
        raise ValueError(
            f"{name} has {bad} inf/NaN entries, so its amax is not finite and no scale exists; "
            f"the quantizers take finite tensors only (skip the step or clip {name} first, as "
            f"a loss scaler skips steps with inf/NaN gradients)")
    return amax


def as_float32(x, name: str = "x") -> torch.Tensor:
    """x as a contiguous float32 tensor (float64 rounded to nearest even once); TypeError for non-floats."""
    t = torch.as_tensor(x)
    if not t.is_floating_point():
        raise TypeError(f"{name} must hold floating-point numbers; got dtype {t.dtype}")
    return t.detach().to(torch.float32).contiguous()
