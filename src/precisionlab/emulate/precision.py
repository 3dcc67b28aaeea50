"""The precision of an emulated op: storage format F, matmul accumulator, back end."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..checks import check_choice
from ..formats import get_format
from ..rounding import round_to

__all__ = ["ACCUMULATORS", "BACKENDS", "Precision", "as_precision"]

ACCUMULATORS: tuple[str, ...] = ("float32", "float64")
BACKENDS: tuple[str, ...] = ("emulated", "native")


@dataclass(frozen=True)
class Precision:
    """Storage format F of operands and results, the matmul accumulator, and the back end."""

    fmt: str = "float32"
    accumulate: str = "float32"
    backend: str = "emulated"

    def __post_init__(self):
        object.__setattr__(self, "fmt", get_format(self.fmt).name)
        check_choice(self.accumulate, "accumulate", ACCUMULATORS)
        check_choice(self.backend, "backend", BACKENDS)
        f, acc = get_format(self.fmt), get_format(self.accumulate)
        if f.mantissa_bits > acc.mantissa_bits:
            raise ValueError(
                f"accumulate={self.accumulate!r} is narrower than fmt={self.fmt!r}; valid "
                f"accumulators for it: {', '.join(a for a in ACCUMULATORS if get_format(a).mantissa_bits >= f.mantissa_bits)}"
            )
        if self.backend == "native" and f.torch_dtype is None:
            raise ValueError(f"backend='native' needs a torch dtype; fmt={self.fmt!r} has none")

    @property
    def container(self) -> torch.dtype:
        """The torch dtype that stores values of F: float64 for float64, float32 otherwise."""
        return torch.float64 if self.fmt == "float64" else torch.float32

    @property
    def native(self) -> bool:
        """True when torch's own kernels run the ops."""
        return self.backend == "native"

    @property
    def dtype(self) -> torch.dtype:
        """F's own torch dtype, which backend='native' computes in."""
        return get_format(self.fmt).torch_dtype

    def round(self, x: torch.Tensor) -> torch.Tensor:
        """fl_F(x) (round to nearest even), in the container dtype, without gradient."""
        return round_to(x.detach(), self.fmt).to(self.container)


def as_precision(prec) -> Precision:
    """prec itself if it is a Precision, Precision(prec) for a format name, else TypeError."""
    if isinstance(prec, Precision):
        return prec
    if isinstance(prec, str):
        return Precision(prec)
    raise TypeError(f"prec must be a Precision or a format name; got prec={prec!r}")
