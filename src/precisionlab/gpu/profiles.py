"""Named device profiles: what one GPU execution path does to the numbers of a matmul.

A profile bundles the choices a matmul silently makes: the format its operands are rounded
into (and how), the accumulator format and rounding, whether partial sums are promoted into
a wider accumulator every few products, and the output format. `describe(name)` spells a
profile out; `get_profile` raises on unknown names, listing the valid ones.
"""

from __future__ import annotations

import textwrap
from dataclasses import dataclass

from ..checks import check_choice
from ..formats import FloatFormat, get_format
from ..rounding import MODES

__all__ = [
    "FP8_GEMM_ACCUMULATOR",
    "PROFILES",
    "PROFILE_NAMES",
    "DeviceProfile",
    "describe",
    "get_profile",
]

# The fp8 tensor-core accumulator as DeepSeek-AI (2024) describe it on Hopper: about 14 bits of
# significand instead of float32's 24. We keep float32's exponent range and truncate (round
# toward zero), as tensor cores do when they align and normalise (Fasi et al. 2021); the
# truncation is our assumption, the 14-bit width is theirs.
FP8_GEMM_ACCUMULATOR = FloatFormat(
    name="fp8_gemm_acc",
    exponent_bits=8,
    mantissa_bits=13,
    bias=127,
    has_inf=True,
    max_finite=float.fromhex("0x1.fff8p+127"),
    min_normal=float.fromhex("0x1p-126"),
    min_subnormal=float.fromhex("0x1p-139"),
    eps=2.0**-13,
    description="fp8 GEMM accumulator: float32 range, 14-bit significand (DeepSeek-V3 report)",
)


@dataclass(frozen=True)
class DeviceProfile:
    """C = fl_out(sum_k fl_in(a_ik) fl_in(b_kj)), accumulated in `accumulator` by `acc_mode`."""

    name: str
    description: str
    inputs: str  # format the operands are rounded into
    input_mode: str  # rounding of that conversion (tf32: nearest_away, like cvt.rna.tf32.f32)
    accumulator: str | FloatFormat
    acc_mode: str
    output: str
    saturate: bool = False  # inputs beyond the input format's range clamp to +-max (fp8 casts)
    promote_every: int | None = None  # products per partial before it joins `promote_to`
    promote_to: str = "float32"
    sources: str = ""  # bibliography keys
    stored_as: str | None = None  # operands first stored in this format (nearest-even), e.g. float32 tensors

    def __post_init__(self):
        for mode in (self.input_mode, self.acc_mode):
            check_choice(mode, "rounding mode", MODES)
        if self.promote_every is not None and self.promote_every < 1:
            raise ValueError(f"promote_every must be a positive integer or None; got {self.promote_every!r}")

    @property
    def accumulator_format(self) -> FloatFormat:
        """The accumulator as a FloatFormat (fp8 profiles use the 14-bit FP8_GEMM_ACCUMULATOR)."""
        return get_format(self.accumulator)


PROFILES: dict[str, DeviceProfile] = {
    p.name: p
    for p in (
        DeviceProfile("fp32", "float32 fused multiply-adds on CUDA cores (TF32 disabled)",
                      "float32", "nearest_even", "float32", "nearest_even", "float32",
                      sources="higham2002accuracy"),
        DeviceProfile("tf32", "float32 tensors on tensor cores with TF32 enabled, operands "
                      "converted by software (cvt.rna: nearest, ties away) to tf32 (10-bit "
                      "fraction), float32 accumulation",
                      "tf32", "nearest_away", "float32", "nearest_even", "float32",
                      sources="nvidia_ptx_isa,fasi2021tensorcores"),
        DeviceProfile("tf32-raw", "raw float32 words fed to tf32 tensor cores: the hardware "
                      "reads their top 19 bits (truncation, as in Fasi et al.'s A100 test), "
                      "float32 accumulation",
                      "tf32", "toward_zero", "float32", "nearest_even", "float32",
                      sources="fasi2021tensorcores", stored_as="float32"),
        DeviceProfile("bf16", "bfloat16 autocast: bfloat16 operands, float32 accumulation, "
                      "bfloat16 result", "bfloat16", "nearest_even", "float32", "nearest_even",
                      "bfloat16", sources="kalamkar2019bfloat16"),
        DeviceProfile("fp16", "float16 autocast: float16 operands, float32 accumulation, "
                      "float16 result", "float16", "nearest_even", "float32", "nearest_even",
                      "float16", sources="micikevicius2018mixed"),
        DeviceProfile("fp16-acc16", "float16 operands accumulated in float16 (half-precision "
                      "compute type)", "float16", "nearest_even", "float16", "nearest_even",
                      "float16", sources="micikevicius2018mixed"),
        DeviceProfile("fp8", "fp8 E4M3 operands on Hopper tensor cores: 14-bit truncating "
                      "accumulator, promoted into float32 every 128 products",
                      "float8_e4m3fn", "nearest_even", FP8_GEMM_ACCUMULATOR, "toward_zero",
                      "float32", saturate=True, promote_every=128,
                      sources="deepseek2024v3,micikevicius2022fp8"),
        DeviceProfile("fp8-no-promotion", "fp8 E4M3 operands, the whole dot product in the "
                      "14-bit truncating accumulator", "float8_e4m3fn", "nearest_even",
                      FP8_GEMM_ACCUMULATOR, "toward_zero", "float32", saturate=True,
                      sources="deepseek2024v3,micikevicius2022fp8"),
    )
}
PROFILE_NAMES: tuple[str, ...] = tuple(PROFILES)


def lookup(registry: dict, key, kind: str, cls: type):
    """registry[key], or key itself when it is already a `cls`; unknown keys raise ValueError listing the valid ones."""
    if isinstance(key, cls):
        return key
    try:
        return registry[key]
    except (KeyError, TypeError):
        raise ValueError(f"unknown {kind} {key!r}; valid choices: {', '.join(registry)}") from None


def get_profile(profile: str | DeviceProfile) -> DeviceProfile:
    """The registered profile of that name (a DeviceProfile passes through unchanged)."""
    return lookup(PROFILES, profile, "device profile", DeviceProfile)


def describe(profile: str | DeviceProfile) -> str:
    """A few lines that say exactly what the profile does to a matmul."""
    p = get_profile(profile)
    acc = p.accumulator_format
    lines = [
        *textwrap.wrap(f"{p.name}: {p.description}", width=72, subsequent_indent="  "),
        *([f"  stored as  {p.stored_as}"] if p.stored_as else []),
        f"  operands   -> {p.inputs} ({p.input_mode}{', saturating' if p.saturate else ''})",
        "  products   exact",
        f"  accumulate in {acc.name} ({acc.precision}-bit significand, {p.acc_mode})",
    ]
    if p.promote_every is not None:
        lines.append(f"  promote    partial sum added into {p.promote_to} every {p.promote_every} products")
    lines.append(f"  output     -> {p.output}")
    return "\n".join(lines)
