"""Precision policy: which autocast device type and dtype a run uses, whether it needs a loss
scaler, and what breaks when the weights themselves are stored in low precision.

`precision_policy(precision, device)` is the decision a training script makes once, at
start-up. float16 autocast is accepted only on CUDA: that is where float16 tensor cores pay
for the loss scaler it needs; on CPU and Apple's MPS, bfloat16 (or float32) is the choice.
That rule is a policy, not a torch limitation (torch 2.13 runs float16 autocast and
GradScaler on the CPU, and this book does so to teach), so the error says what to pick.

`compare_weight_policies` runs one small block (Linear -> GroupNorm computed in float32 ->
SiLU -> Linear) under the ways of mixing precisions that projects try, and reports what
fails and how far the outputs and Jacobian-vector products drift from a float64 reference.
"""

from __future__ import annotations

import contextlib
import copy
from dataclasses import dataclass

import torch

from .scaling import DynamicLossScaler

__all__ = [
    "DEVICE_TYPES",
    "PRECISIONS",
    "WEIGHT_POLICIES",
    "GroupNorm32",
    "PolicyOutcome",
    "PrecisionPolicy",
    "autocast_device_type",
    "autocast_output_dtypes",
    "compare_weight_policies",
    "make_block",
    "precision_policy",
]

PRECISIONS: tuple[str, ...] = ("fp32", "bf16", "fp16")
DEVICE_TYPES: tuple[str, ...] = ("cuda", "mps", "cpu")
_ALIASES = {
    "fp32": "fp32", "float32": "fp32", "32": "fp32",
    "bf16": "bf16", "bfloat16": "bf16",
    "fp16": "fp16", "float16": "fp16", "half": "fp16", "16": "fp16",
}
_DTYPE = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}


def autocast_device_type(device) -> str:
    """The device_type torch.autocast expects for `device`: 'cuda', 'mps' or 'cpu' (an index is dropped)."""
    try:
        dev = device if isinstance(device, torch.device) else torch.device(str(device))
    except (RuntimeError, TypeError):
        raise ValueError(
            f"cannot read device {device!r}; valid choices: {', '.join(DEVICE_TYPES)} "
            "(optionally with an index, e.g. 'cuda:1')"
        ) from None
    if dev.type not in DEVICE_TYPES:
        # Silently falling back to 'cpu' would run autocast on the wrong device (or not at all).
        raise ValueError(
            f"unsupported device type {dev.type!r} (from {device!r}); valid choices: "
            f"{', '.join(DEVICE_TYPES)}"
        )
    return dev.type


@dataclass(frozen=True)
class PrecisionPolicy:
    """precision, autocast device type, autocast dtype (None = no autocast) and whether to scale the loss."""

    precision: str
    device_type: str
    autocast_dtype: torch.dtype | None
    use_loss_scaler: bool

    def autocast(self):
        """The autocast context for this policy (a no-op context for fp32)."""
        if self.autocast_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device_type, dtype=self.autocast_dtype)

    def loss_scaler(self, **kwargs) -> DynamicLossScaler:
        """A GradScaler-compatible scaler, enabled only when the policy needs one (fp16)."""
        return DynamicLossScaler(enabled=self.use_loss_scaler, **kwargs)

    def __str__(self) -> str:
        dtype = str(self.autocast_dtype).removeprefix("torch.") if self.autocast_dtype else "off"
        return (f"{self.precision} on {self.device_type}: autocast {dtype}, "
                f"loss scaler {'on' if self.use_loss_scaler else 'off'}")


def precision_policy(precision: str, device) -> PrecisionPolicy:
    """fp32: no autocast; bf16: autocast to bfloat16, no scaler; fp16: autocast to float16 + scaler, CUDA only."""
    key = _ALIASES.get(str(precision).lower())
    if key is None:
        raise ValueError(
            f"unknown precision {precision!r}; valid choices: {', '.join(PRECISIONS)} "
            f"(aliases: {', '.join(sorted(k for k in _ALIASES if k not in PRECISIONS))})"
        )
    device_type = autocast_device_type(device)
    if key == "fp16" and device_type != "cuda":
        raise ValueError(
            f"precision={precision!r} (float16 autocast with loss scaling) is only supported on "
            f"CUDA devices; got device {str(device)!r} (type {device_type!r}). Valid choices "
            f"on {device_type}: fp32, bf16"
        )
    return PrecisionPolicy(key, device_type, _DTYPE[key], key == "fp16")


# --------------------------------------------------------------------------- what autocast does


def autocast_output_dtypes(device_type: str = "cpu",
                           dtype: torch.dtype = torch.bfloat16) -> dict[str, tuple[str, str]]:
    """Per op, the output dtype under torch.autocast(device_type, dtype) for (float32 inputs, dtype inputs).

    (dtype, dtype): autocast runs the op in low precision; (float32, float32): it runs it in
    float32; (float32, dtype): autocast leaves it alone and it follows its inputs.
    """
    gen = torch.Generator().manual_seed(0)
    base = [torch.randn(4, 8, generator=gen) for _ in range(3)]
    f = torch.nn.functional
    ops = {
        "linear": lambda x, w, y: f.linear(x, w),
        "matmul": lambda x, w, y: x @ w.T,
        "layer_norm": lambda x, w, y: f.layer_norm(x, (8,)),
        "group_norm": lambda x, w, y: f.group_norm(x, 2),
        "softmax": lambda x, w, y: torch.softmax(x, dim=-1),
        "exp": lambda x, w, y: torch.exp(x),
        "sum": lambda x, w, y: x.sum(),
        "vector_norm": lambda x, w, y: torch.linalg.vector_norm(x),
        "mse_loss": lambda x, w, y: f.mse_loss(x, y),
    }
    out = {}
    with torch.autocast(autocast_device_type(device_type), dtype=dtype):
        for name, op in ops.items():
            hi = op(*base).dtype
            lo = op(*(t.to(dtype) for t in base)).dtype
            out[name] = tuple(str(d).removeprefix("torch.") for d in (hi, lo))
    return out


# --------------------------------------------------------------------------- weight policies


class GroupNorm32(torch.nn.GroupNorm):
    """GroupNorm that normalises in float32 and returns the input's dtype (assumes float32 parameters)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """group_norm(float32(x)) cast back to x.dtype."""
        return super().forward(x.float()).type(x.dtype)


def make_block(width: int = 32, hidden: int = 64, groups: int = 8, seed: int = 0) -> torch.nn.Module:
    """Linear(width, hidden) -> GroupNorm32(groups, hidden) -> SiLU -> Linear(hidden, width), float32."""
    torch.manual_seed(seed)  # nn.Linear draws from the global generator; fix it for repeatability
    return torch.nn.Sequential(
        torch.nn.Linear(width, hidden), GroupNorm32(groups, hidden), torch.nn.SiLU(),
        torch.nn.Linear(hidden, width),
    )


def _reference(block: torch.nn.Module) -> torch.nn.Module:
    """The same block in float64, with a plain GroupNorm (GroupNorm32 would force float32)."""
    ref = copy.deepcopy(block).double()
    for name, mod in list(ref.named_children()):
        if isinstance(mod, GroupNorm32):
            plain = torch.nn.GroupNorm(mod.num_groups, mod.num_channels, mod.eps).double()
            plain.load_state_dict(mod.state_dict())
            setattr(ref, name, plain)
    return ref


def _cast_weights(block: torch.nn.Module, dtype: torch.dtype, keep_norms: bool) -> torch.nn.Module:
    out = copy.deepcopy(block)
    for mod in out.modules():
        if isinstance(mod, torch.nn.GroupNorm) and keep_norms:
            continue
        for p in mod.parameters(recurse=False):
            p.data = p.data.to(dtype)
    return out


@dataclass(frozen=True)
class PolicyOutcome:
    """One weight policy: what the forward pass and the JVP did (error text or relative error)."""

    policy: str
    forward: str
    jvp: str


WEIGHT_POLICIES: tuple[str, ...] = (
    "fp32 weights + autocast, JVP in fp32",
    "fp32 weights + autocast, JVP under autocast",
    "low-precision weights, fp32 inputs",
    "low-precision weights and inputs",
    "low-precision weights, fp32 norms + autocast",
)


def compare_weight_policies(dtype: torch.dtype = torch.bfloat16, batch: int = 16,
                            seed: int = 0) -> list[PolicyOutcome]:
    """Run make_block under each of WEIGHT_POLICIES: relative error |y - y64|/|y64| of output and JVP, or the error raised."""
    block = make_block(seed=seed)
    gen = torch.Generator().manual_seed(seed + 1)
    x = torch.randn(batch, 32, generator=gen)
    v = torch.randn(batch, 32, generator=gen)
    ref = _reference(block)
    y64 = ref(x.double()).detach()
    j64 = torch.func.jvp(ref, (x.double(),), (v.double(),))[1].detach()

    def rel(out: torch.Tensor, exact: torch.Tensor) -> str:
        err = float((out.detach().double() - exact).norm() / exact.norm())
        return f"ok ({str(out.dtype).removeprefix('torch.')}), rel. error {err:.1e}"

    def attempt(fn, exact) -> str:
        try:
            return rel(fn(), exact)
        except RuntimeError as err:  # the dtype errors are what this comparison is about
            return f"{type(err).__name__}: {str(err).splitlines()[0]}"

    def autocast():
        return torch.autocast("cpu", dtype=dtype)

    def no_autocast():
        return torch.autocast("cpu", enabled=False)

    low = _cast_weights(block, dtype, keep_norms=False)
    mixed = _cast_weights(block, dtype, keep_norms=True)

    def run(model, inputs, ctx, jvp_ctx):
        def fwd():
            with ctx():
                return model(inputs[0])

        def jvp():
            with ctx(), jvp_ctx():
                return torch.func.jvp(model, (inputs[0],), (inputs[1],))[1]

        return attempt(fwd, y64), attempt(jvp, j64)

    xl, vl = x.to(dtype), v.to(dtype)
    cases = [
        (block, (x, v), autocast, no_autocast),
        (block, (x, v), autocast, contextlib.nullcontext),
        (low, (x, v), contextlib.nullcontext, contextlib.nullcontext),
        (low, (xl, vl), contextlib.nullcontext, contextlib.nullcontext),
        (mixed, (x, v), autocast, contextlib.nullcontext),
    ]
    return [PolicyOutcome(name, *run(*case)) for name, case in zip(WEIGHT_POLICIES, cases, strict=True)]
