"""Mixed precision: which autocast device type and dtype a run uses (its precision policy), whether
it needs a loss scaler, and what breaks when the weights themselves are stored in low precision.

`precision_policy(precision, device)` is the decision a training script makes once, at
start-up. float16 autocast is accepted only on CUDA: that is where float16 tensor cores pay
for the loss scaler it needs; on CPU and Apple's MPS, bfloat16 (or float32) is the choice.
That rule is this book's policy, not a torch limitation (torch 2.13 runs float16 autocast
and GradScaler on the CPU and on MPS, whose autocast even defaults to float16), so the error
says what to pick. bfloat16 on CUDA needs bfloat16 units, compute capability 8.0 or higher
(Turing cards such as the T4 have none); the capability is asked of the device, or given.
`PrecisionPolicy.loss_scaler()` hands out torch's GradScaler, the one to train with; the
book's `DynamicLossScaler` (same rule, with a record of every step) on request.

`compare_weight_policies` runs one small block (Linear -> GroupNorm computed in float32 ->
SiLU -> Linear) under the ways of mixing precisions that projects try, and reports what
fails and how far the outputs and Jacobian-vector products drift from a float64 reference.
Whether a policy fails is torch's dtype rules, so torch decides it; the errors of the
policies that run are computed with `emulate` (the same bits on every CPU), or with torch's
own kernels when backend='native'.
"""

from __future__ import annotations

import contextlib
import copy
import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from . import emulate
from .checks import check_choice
from .formats import ALIASES, get_format, short_name
from .scaling import DynamicLossScaler

__all__ = [
    "DEVICE_TYPES",
    "PRECISIONS",
    "SCALER_KINDS",
    "WEIGHT_POLICIES",
    "GroupNorm32",
    "PolicyOutcome",
    "PrecisionPolicy",
    "autocast_device_type",
    "autocast_output_dtypes",
    "autocast_rounded_once",
    "compare_weight_policies",
    "make_block",
    "precision_policy",
]

PRECISIONS: tuple[str, ...] = ("fp32", "bf16", "fp16")
DEVICE_TYPES: tuple[str, ...] = ("cuda", "mps", "cpu")
# the first torch whose MPS autocast takes bfloat16 (2.5 disables itself with a warning)
MPS_BF16_TORCH = (2, 6)
SCALER_KINDS: tuple[str, ...] = ("torch", "book")
# NVIDIA GPUs have bfloat16 units from compute capability 8.0 (Ampere) on; Volta (7.0) and
# Turing (7.5, e.g. the T4) do not, although torch can emulate bfloat16 there.
BF16_MIN_CAPABILITY: tuple[int, int] = (8, 0)


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
    """precision, autocast device type, autocast dtype (None = no autocast), whether to scale the loss,
    and the CUDA compute capability that was checked (None when none was needed)."""

    precision: str
    device_type: str
    autocast_dtype: torch.dtype | None
    use_loss_scaler: bool
    capability: tuple[int, int] | None = None

    def autocast(self):
        """The autocast context for this policy (a no-op context for fp32)."""
        if self.autocast_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device_type, dtype=self.autocast_dtype)

    def loss_scaler(self, kind: str = "torch", **kwargs):
        """A loss scaler enabled only when the policy needs one (fp16): torch.amp.GradScaler for
        training (kind='torch'), or the book's DynamicLossScaler, which records every step (kind='book')."""
        check_choice(kind, "kind", SCALER_KINDS)
        if kind == "book":
            return DynamicLossScaler(enabled=self.use_loss_scaler, **kwargs)
        return torch.amp.GradScaler(self.device_type, enabled=self.use_loss_scaler, **kwargs)

    def __str__(self) -> str:
        dtype = str(self.autocast_dtype).removeprefix("torch.") if self.autocast_dtype else "off"
        where = self.device_type
        if self.capability is not None:
            where += f" (compute capability {self.capability[0]}.{self.capability[1]})"
        return (f"{self.precision} on {where}: autocast {dtype}, "
                f"loss scaler {'on' if self.use_loss_scaler else 'off'}")


def _check_capability(capability) -> tuple[int, int]:
    """(major, minor) as two integers >= 0, e.g. (8, 0) for an A100 or (7, 5) for a T4."""
    ok = (isinstance(capability, Sequence) and not isinstance(capability, str)
          and len(capability) == 2
          and all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in capability))
    if not ok:
        raise ValueError(
            f"capability must be (major, minor), two integers >= 0 such as (8, 0); "
            f"got capability={capability!r}"
        )
    return int(capability[0]), int(capability[1])


def _precision_key(precision) -> str:
    """'fp32', 'bf16' or 'fp16' for any name of those formats in formats.ALIASES (or a torch dtype)."""
    try:
        key = short_name(precision)
    except ValueError:
        key = None
    if key not in PRECISIONS:
        names = {get_format(p).name for p in PRECISIONS}
        aliases = sorted(names | ({a for a, n in ALIASES.items() if n in names} - set(PRECISIONS)))
        raise ValueError(f"unknown precision {precision!r}; valid choices: {', '.join(PRECISIONS)} "
                         f"(aliases: {', '.join(aliases)})")
    return key


def precision_policy(precision: str, device, capability=None) -> PrecisionPolicy:
    """fp32: no autocast; bf16: autocast to bfloat16, no scaler (on CUDA: compute capability >= 8.0);
    fp16: autocast to float16 + scaler, CUDA only.

    capability, (major, minor), is the CUDA device's compute capability: given, or asked of
    the device with torch.cuda.get_device_capability when bf16 on CUDA needs it. (Not
    torch.cuda.is_bf16_supported(), which by default also counts emulation and says True on a
    V100 or T4.) Only CUDA devices have one. bf16 on MPS needs torch >= 2.6 (MPS_BF16_TORCH).
    """
    key = _precision_key(precision)
    device_type = autocast_device_type(device)
    if capability is not None:
        capability = _check_capability(capability)
        if device_type != "cuda":
            raise ValueError(
                f"capability={capability!r} is a CUDA compute capability, but device "
                f"{str(device)!r} has type {device_type!r}; valid choices: omit it, or a cuda device"
            )
    if key == "fp16" and device_type != "cuda":
        raise ValueError(
            f"precision={precision!r} (float16 autocast with loss scaling) is only supported on "
            f"CUDA devices by this book's policy; got device {str(device)!r} (type "
            f"{device_type!r}). Valid choices on {device_type}: fp32, bf16"
        )
    if key == "bf16" and device_type == "mps" and torch.__version__ < MPS_BF16_TORCH:
        # measured: torch 2.3 and 2.4 have no MPS autocast; 2.5's refuses bfloat16 with a
        # warning and turns itself off, the silent fallback this policy exists to prevent
        raise ValueError(
            f"precision={precision!r} on {str(device)!r} needs torch >= 2.6, whose MPS autocast "
            f"has bfloat16 (on macOS 14 and later); this is torch {torch.__version__}, where "
            "autocast('mps', dtype=torch.bfloat16) runs nothing in bfloat16. Valid choices on "
            "this torch: fp32, or upgrade torch"
        )
    if key == "bf16" and device_type == "cuda":
        if capability is None:
            if not torch.cuda.is_available():
                raise ValueError(
                    f"precision={precision!r} on {str(device)!r} needs compute capability >= "
                    f"{BF16_MIN_CAPABILITY[0]}.{BF16_MIN_CAPABILITY[1]}, and no CUDA device is "
                    "visible to ask; pass capability=(major, minor)"
                )
            capability = _check_capability(tuple(torch.cuda.get_device_capability(device)))
        if capability < BF16_MIN_CAPABILITY:
            raise ValueError(
                f"precision={precision!r} needs bfloat16 units, compute capability >= "
                f"{BF16_MIN_CAPABILITY[0]}.{BF16_MIN_CAPABILITY[1]} (A100, H100, RTX 30xx and "
                f"newer); device {str(device)!r} has {capability[0]}.{capability[1]} (7.0: V100; "
                "7.5: T4, RTX 20xx). Valid choices there: fp16 (with the loss scaler), fp32"
            )
    dtype = None if key == "fp32" else get_format(key).torch_dtype  # fp32: no autocast
    return PrecisionPolicy(key, device_type, dtype, key == "fp16", capability)


# --------------------------------------------------------------------------- what autocast does

_F = torch.nn.functional
# op(x, w, y) for three (n, m) float tensors; the ops a training step is made of.
_AUTOCAST_OPS = {
    "linear": lambda x, w, y: _F.linear(x, w),
    "matmul": lambda x, w, y: x @ w.T,
    "layer_norm": lambda x, w, y: _F.layer_norm(x, x.shape[-1:]),
    "group_norm": lambda x, w, y: _F.group_norm(x, 2),
    "softmax": lambda x, w, y: torch.softmax(x, dim=-1),
    "exp": lambda x, w, y: torch.exp(x),
    "sum": lambda x, w, y: x.sum(-1),
    "prod": lambda x, w, y: x[:, :4].prod(-1),
    "vector_norm": lambda x, w, y: torch.linalg.vector_norm(x, dim=-1),
    "cdist": lambda x, w, y: torch.cdist(x, w),
    "mse_loss": lambda x, w, y: _F.mse_loss(x, y),
    "cross_entropy": lambda x, w, y: _F.cross_entropy(
        x, torch.arange(x.shape[0], device=x.device) % x.shape[1]),
}


def autocast_output_dtypes(device_type: str = "cpu",
                           dtype: torch.dtype = torch.bfloat16) -> dict[str, tuple[str, str]]:
    """Per op, the output dtype under torch.autocast(device_type, dtype) for (float32 inputs, dtype inputs).

    (dtype, dtype): autocast runs the op in low precision; (float32, float32): it runs it in
    float32; (float32, dtype): autocast leaves it alone and it follows its inputs.
    """
    gen = torch.Generator().manual_seed(0)
    base = [torch.randn(4, 8, generator=gen) for _ in range(3)]
    out = {}
    with torch.autocast(autocast_device_type(device_type), dtype=dtype):
        for name, op in _AUTOCAST_OPS.items():
            hi = op(*base).dtype
            lo = op(*(t.to(dtype) for t in base)).dtype
            out[name] = tuple(str(d).removeprefix("torch.") for d in (hi, lo))
    return out


def autocast_rounded_once(device_type: str = "cpu", dtype: torch.dtype = torch.bfloat16,
                          shape: tuple[int, int] = (64, 64), seed: int = 0) -> dict[str, float]:
    """Per op that returns `dtype` for `dtype` inputs under autocast: the share of its output entries
    equal to fl_dtype(the op in float64 on the same inputs), the exact result rounded once.

    A share of 1 (or within a few entries of it) means the kernel computes in a wider format and
    rounds only its output; a kernel that rounds its intermediates too lands off it often.
    """
    gen = torch.Generator().manual_seed(int(seed))
    base = [torch.randn(*shape, generator=gen).to(dtype) for _ in range(3)]
    out = {}
    with torch.autocast(autocast_device_type(device_type), dtype=dtype):
        for name, op in _AUTOCAST_OPS.items():
            low = op(*base)
            if low.dtype != dtype:
                continue
            with torch.autocast(autocast_device_type(device_type), enabled=False):
                exact = op(*(t.double() for t in base)).to(dtype)
            out[name] = float((low == exact).double().mean())
    return out


# --------------------------------------------------------------------------- weight policies


class GroupNorm32(torch.nn.GroupNorm):
    """GroupNorm that normalises in float32 and returns the input's dtype (assumes float32 parameters)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """group_norm(float32(x)) cast back to x.dtype."""
        return super().forward(x.float()).type(x.dtype)


def make_block(width: int = 32, hidden: int = 64, groups: int = 8, seed: int = 0) -> torch.nn.Module:
    """Linear(width, hidden) -> GroupNorm32(groups, hidden) -> SiLU -> Linear(hidden, width), float32.

    Weights and biases are drawn like nn.Linear's default, U(-1/sqrt(fan_in), 1/sqrt(fan_in)),
    but from float64 uniforms (torch.rand in float64 is integer bits times 2^-53), scaled with
    one multiply and one subtraction: nn.Linear's own float32 sampler gives different bits on
    different CPUs.
    """
    gen = torch.Generator().manual_seed(int(seed))
    block = torch.nn.Sequential(
        torch.nn.Linear(width, hidden), GroupNorm32(groups, hidden), torch.nn.SiLU(),
        torch.nn.Linear(hidden, width),
    )
    with torch.no_grad():
        for lin in (block[0], block[3]):
            bound = 1.0 / math.sqrt(lin.in_features)
            for p in (lin.weight, lin.bias):
                u = torch.rand(tuple(p.shape), generator=gen, dtype=torch.float64)
                p.copy_((2.0 * u - 1.0) * bound)
    return block


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
    """One weight policy: for the forward pass and the JVP, the output dtype and relative error, or the error torch raised."""

    policy: str
    forward_dtype: str | None
    forward_error: float | None  # |y - y64| / |y64|; None when torch raised
    forward_raised: str | None  # "RuntimeError: <first line>" when torch raised
    jvp_dtype: str | None
    jvp_error: float | None
    jvp_raised: str | None

    @staticmethod
    def _text(dtype, error, raised, short):
        if raised is not None:
            return f"fails: {raised.split(':', 1)[0]}" if short else raised
        return f"ok ({dtype}), rel. error {error:.1e}"

    @property
    def forward(self) -> str:
        """'ok (dtype), rel. error e' or torch's error, 'Type: first line of the message'."""
        return self._text(self.forward_dtype, self.forward_error, self.forward_raised, False)

    @property
    def jvp(self) -> str:
        """As `forward`, for the Jacobian-vector product."""
        return self._text(self.jvp_dtype, self.jvp_error, self.jvp_raised, False)

    def summary(self, which: str = "forward") -> str:
        """`forward` or `jvp` with a raised error shortened to 'fails: <type>' (its wording varies by torch version)."""
        check_choice(which, "which", ("forward", "jvp"))
        if which == "forward":
            return self._text(self.forward_dtype, self.forward_error, self.forward_raised, True)
        return self._text(self.jvp_dtype, self.jvp_error, self.jvp_raised, True)


WEIGHT_POLICIES: tuple[str, ...] = (
    "fp32 weights + autocast, JVP in fp32",
    "fp32 weights + autocast, JVP under autocast",
    "low-precision weights, fp32 inputs",
    "low-precision weights and inputs",
    "low-precision weights, fp32 norms + autocast",
)


def _gn_tangent64(z: torch.Tensor, dz: torch.Tensor, groups: int, weight, eps: float) -> torch.Tensor:
    """d/dt group_norm(z + t dz) at t = 0, in float64: gamma r (dz - mean(dz) - x_hat mean(x_hat (dz - mean(dz))))."""
    n = z.shape[0]
    zg, dg = z.double().reshape(n, groups, -1), dz.double().reshape(n, groups, -1)
    m = zg.shape[-1]
    d = zg - emulate.fixed_sum(zg, -1, keepdim=True) / m
    r = 1.0 / emulate.sqrt64(emulate.fixed_sum(d * d, -1, keepdim=True) / m + eps)
    xhat = d * r
    dd = dg - emulate.fixed_sum(dg, -1, keepdim=True) / m
    t = (r * (dd - xhat * (emulate.fixed_sum(xhat * dd, -1, keepdim=True) / m))).reshape(z.shape)
    return t if weight is None else t * weight.double()


def _emulated_block(block: torch.nn.Module, x: torch.Tensor, v: torch.Tensor, lin: emulate.Precision,
                    norm: emulate.Precision):
    """(y, J v) of make_block's block, every op through emulate: the Linears and SiLU in lin's format
    (float32 accumulation), the group norm computed in norm's format and its output rounded to lin's."""
    l1, gn, l2 = block[0], block[1], block[3]
    f64 = emulate.Precision("float64", "float64")
    z = emulate.linear(x, l1.weight, l1.bias, lin)
    dz = emulate.linear(v, l1.weight, None, lin)
    h = lin.round(emulate.group_norm(z, gn.num_groups, gn.weight, gn.bias, norm, gn.eps))
    dh = lin.round(norm.round(_gn_tangent64(z, dz, gn.num_groups, norm.round(gn.weight), gn.eps)))
    a = emulate.silu(h, lin)
    s = emulate.sigmoid(h, f64).double()
    hd = h.double()
    da = lin.round(dh.double() * (s * (1.0 + hd * (1.0 - s))))  # silu'(h) = s (1 + h (1 - s))
    y = emulate.linear(a, l2.weight, l2.bias, lin)
    dy = emulate.linear(da, l2.weight, None, lin)
    return y.detach(), dy.detach()


def _rel(out: torch.Tensor, exact: torch.Tensor) -> float:
    """|out - exact| / |exact| (Frobenius norms), with float64 sums in a fixed order."""
    d = (out.detach().double() - exact.double()).reshape(-1)
    e = exact.double().reshape(-1)
    return float(emulate.sqrt64(emulate.fixed_sum(d * d, 0)) / emulate.sqrt64(emulate.fixed_sum(e * e, 0)))


def compare_weight_policies(dtype: torch.dtype = torch.bfloat16, batch: int = 16,
                            seed: int = 0, backend: str = "emulated") -> list[PolicyOutcome]:
    """Run make_block under each of WEIGHT_POLICIES: relative error |y - y64|/|y64| of output and JVP, or the error raised.

    torch's dtype rules decide which policies raise (torch runs each policy natively and the
    error it raises is reported). backend='emulated' computes the errors of the policies that
    run with `emulate` (autocast's plan: Linear and SiLU in `dtype` with float32 accumulation,
    GroupNorm32 in float32 then rounded to `dtype`; or everything in float32), against a
    float64 evaluation of the same block; backend='native' reports torch's own numbers.
    """
    check_choice(backend, "backend", emulate.BACKENDS)
    dtype_name = str(dtype).removeprefix("torch.")
    block = make_block(seed=seed)
    gen = torch.Generator().manual_seed(int(seed) + 1)
    x = emulate.randn(int(batch), 32, generator=gen)
    v = emulate.randn(int(batch), 32, generator=gen)
    f64 = emulate.Precision("float64", "float64")
    # The emulated blocks (the float64 reference, two per policy) come to a few hundred
    # thousand multiply-adds: NumPy's tier, no cold compile of the product loop.
    per_block = 2 * int(batch) * (block[0].weight.numel() + block[3].weight.numel())
    with emulate.planned_products((1 + 2 * len(WEIGHT_POLICIES)) * per_block):
        y64, j64 = _emulated_block(block, x, v, f64, f64)

        def attempt(fn):
            """(dtype, None, error) if fn raises torch's dtype RuntimeError, else (dtype, value, None)."""
            try:
                out = fn()
            except RuntimeError as err:  # the dtype errors are what this comparison is about
                return None, None, f"{type(err).__name__}: {str(err).splitlines()[0]}"
            return str(out.dtype).removeprefix("torch."), out.detach(), None

        def autocast():
            return torch.autocast("cpu", dtype=dtype)

        def no_autocast():
            return torch.autocast("cpu", enabled=False)

        low = _cast_weights(block, dtype, keep_norms=False)
        mixed = _cast_weights(block, dtype, keep_norms=True)

        def run_native(model, inputs, ctx, jvp_ctx):
            def fwd():
                with ctx():
                    return model(inputs[0])

            def jvp():
                with ctx(), jvp_ctx():
                    return torch.func.jvp(model, (inputs[0],), (inputs[1],))[1]

            return attempt(fwd), attempt(jvp)

        xl, vl = x.to(dtype), v.to(dtype)
        cases = [
            (block, (x, v), autocast, no_autocast),
            (block, (x, v), autocast, contextlib.nullcontext),
            (low, (x, v), contextlib.nullcontext, contextlib.nullcontext),
            (low, (xl, vl), contextlib.nullcontext, contextlib.nullcontext),
            (mixed, (x, v), autocast, contextlib.nullcontext),
        ]
        # The emulated plan of each policy for (forward, JVP): the block whose weights it uses, and
        # whether the op runs under autocast (low precision) or in float32.
        low_p, f32 = emulate.Precision(dtype_name), emulate.Precision("float32")
        plans = [(block, (low_p, low_p), (f32, f32)), (block, (low_p, low_p), (low_p, low_p)),
                 None, None, (mixed, (low_p, low_p), (low_p, low_p))]
        out = []
        for name, case, plan in zip(WEIGHT_POLICIES, cases, plans, strict=True):
            (fd, fy, fr), (jd, jy, jr) = run_native(*case)
            if backend == "emulated" and plan is not None:
                model, fwd_plan, jvp_plan = plan
                ye, _ = _emulated_block(model, x, v, fwd_plan[0], f32)
                _, je = _emulated_block(model, x, v, jvp_plan[0], f32)
                fy = ye if fr is None else None
                jy = je if jr is None else None
                fd = fwd_plan[0].fmt if fr is None else None
                jd = jvp_plan[0].fmt if jr is None else None
            out.append(PolicyOutcome(name, fd, None if fy is None else _rel(fy, y64), fr,
                                     jd, None if jy is None else _rel(jy, j64), jr))
        return out
