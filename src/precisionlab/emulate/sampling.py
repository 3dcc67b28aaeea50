"""The package's one portable normal sampler: Box-Muller on float64 uniforms."""

from __future__ import annotations

import math

import torch

from .elementary import cos2pi64, log64, sqrt64

__all__ = ["randn"]


def randn(*shape: int, generator: torch.Generator, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """N(0, 1) samples sqrt(-2 ln U1) cos(2 pi U2), U1, U2 ~ U(0, 1] from torch.rand in float64."""
    # Exactly two uniforms per sample (no rejection), so a draw's place in the stream never
    # depends on earlier draws. torch.randn's float32 path uses vectorised approximations of log
    # and cos whose bits depend on the CPU's instruction set; this one uses log64, cos2pi64 and
    # sqrt64 only (torch.sqrt is MKL's, see elementary), so a seed gives the same samples on
    # every machine.
    if not isinstance(generator, torch.Generator):
        raise TypeError(f"generator must be a torch.Generator; got generator={generator!r}")
    if dtype not in (torch.float32, torch.float64):
        raise ValueError(f"dtype must be torch.float32 or torch.float64; got dtype={dtype!r}")
    n = math.prod(shape)
    u = torch.rand(2, n, generator=generator, dtype=torch.float64)
    z = sqrt64(-2.0 * log64(1.0 - u[0])) * cos2pi64(u[1])
    return z.reshape(shape).to(dtype)
