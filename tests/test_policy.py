"""Tests for precisionlab.policy: device-type selection, the fp16-needs-CUDA rule, and the weight
policy comparison, checked against torch's own behaviour (autocast, dtype errors, float64 JVPs)."""

from __future__ import annotations

import pytest
import torch

from precisionlab.policy import (
    DEVICE_TYPES,
    PRECISIONS,
    WEIGHT_POLICIES,
    GroupNorm32,
    autocast_device_type,
    autocast_output_dtypes,
    compare_weight_policies,
    make_block,
    precision_policy,
)
from precisionlab.scaling import DynamicLossScaler

# torch.func.jvp loads decompositions through torch.jit.script, which warns in torch 2.13.
pytestmark = pytest.mark.filterwarnings("ignore:`torch.jit.script` is deprecated:DeprecationWarning")


@pytest.mark.parametrize(
    "device, expected",
    [("cuda", "cuda"), ("cuda:1", "cuda"), ("mps", "mps"), ("cpu", "cpu"),
     (torch.device("cuda", 0), "cuda"), (torch.device("cpu"), "cpu")],
)
def test_autocast_device_type(device, expected):
    assert autocast_device_type(device) == expected
    # torch.autocast accepts the answer as its device_type.
    torch.autocast(expected, enabled=False)


@pytest.mark.parametrize("device", ["xpu", "meta", "gpu", "", 3.5])
def test_unsupported_devices_are_named(device):
    with pytest.raises(ValueError, match="valid choices: cuda, mps, cpu"):
        autocast_device_type(device)


@pytest.mark.parametrize("precision, device, dtype, scaler", [
    ("fp32", "cpu", None, False), ("float32", "mps", None, False),
    ("bf16", "cpu", torch.bfloat16, False), ("bfloat16", "mps", torch.bfloat16, False),
    ("bf16", "cuda:0", torch.bfloat16, False), ("fp16", "cuda", torch.float16, True),
    ("half", torch.device("cuda", 2), torch.float16, True),
])
def test_precision_policy(precision, device, dtype, scaler):
    p = precision_policy(precision, device)
    assert p.autocast_dtype == dtype and p.use_loss_scaler == scaler
    assert p.precision in PRECISIONS and p.device_type in DEVICE_TYPES
    s = p.loss_scaler()
    assert isinstance(s, DynamicLossScaler) and s.is_enabled() == scaler


@pytest.mark.parametrize("device", ["cpu", "mps", torch.device("cpu")])
def test_fp16_without_cuda_is_refused_with_the_valid_choices(device):
    with pytest.raises(ValueError, match=r"only supported on CUDA.*Valid choices on (cpu|mps): "
                                         r"fp32, bf16"):
        precision_policy("fp16", device)


def test_unknown_precision_is_named():
    with pytest.raises(ValueError, match="unknown precision 'fp8'; valid choices: fp32, bf16, fp16"):
        precision_policy("fp8", "cuda")


def test_policy_autocast_context_matches_torch_autocast():
    x, w = torch.randn(2, 4), torch.randn(4, 4)
    with precision_policy("bf16", "cpu").autocast():
        assert (x @ w).dtype == torch.bfloat16
    with precision_policy("fp32", "cpu").autocast():
        assert (x @ w).dtype == torch.float32
    assert "autocast bfloat16, loss scaler off" in str(precision_policy("bf16", "cpu"))


def test_autocast_output_dtypes_agree_with_direct_calls():
    table = autocast_output_dtypes("cpu", torch.bfloat16)
    x = torch.randn(3, 8)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert table["linear"][0] == str(torch.nn.functional.linear(x, x).dtype)[6:]
        assert table["mse_loss"] == ("float32", "float32")
        ln_lo = torch.nn.functional.layer_norm(x.bfloat16(), (8,)).dtype
    assert table["layer_norm"][1] == str(ln_lo)[6:]


def test_groupnorm32_pattern_breaks_with_low_precision_parameters():
    gn = GroupNorm32(2, 8)
    x = torch.randn(4, 8, dtype=torch.bfloat16)
    assert gn(x).dtype == torch.bfloat16  # float32 parameters: fine
    with pytest.raises(RuntimeError, match="mixed dtype"):
        gn.to(torch.bfloat16)(x)


def test_compare_weight_policies_reports_failures_and_errors():
    out = {o.policy: o for o in compare_weight_policies(torch.bfloat16)}
    assert list(out) == list(WEIGHT_POLICIES)
    master = out["fp32 weights + autocast, JVP in fp32"]
    under = out["fp32 weights + autocast, JVP under autocast"]
    # The fp32 JVP is as accurate as float32 allows; under autocast it is bfloat16-accurate.
    assert master.jvp_error < 1e-5 < 1e-3 < under.jvp_error < 5e-2
    assert float(master.jvp.rsplit(" ", 1)[1]) == float(f"{master.jvp_error:.1e}")
    # The failures are torch's dtype errors (the wording varies by torch version).
    for name in ("low-precision weights, fp32 inputs", "low-precision weights and inputs"):
        o = out[name]
        assert o.forward_raised.startswith("RuntimeError") and "dtype" in o.forward_raised
        assert o.forward_error is None and o.summary("forward") == "fails: RuntimeError"
    assert out["low-precision weights, fp32 norms + autocast"].forward.startswith("ok")
    with pytest.raises(ValueError, match="valid choices: forward, jvp"):
        master.summary("backward")


def test_emulated_policies_agree_with_torchs_kernels():
    """Emulated and native errors are of the same size: the emulation follows autocast's plan."""
    emu = compare_weight_policies(torch.bfloat16, seed=1)
    nat = compare_weight_policies(torch.bfloat16, seed=1, backend="native")
    for e, n in zip(emu, nat, strict=True):
        assert (e.forward_raised is None) == (n.forward_raised is None)
        assert e.forward_dtype == n.forward_dtype and e.jvp_dtype == n.jvp_dtype
        for a, b in ((e.forward_error, n.forward_error), (e.jvp_error, n.jvp_error)):
            assert (a is None) == (b is None)
            if a is not None:
                assert 0.5 < a / b < 2


def test_emulated_block_float64_matches_torch_float64_and_its_jvp():
    from precisionlab import emulate
    from precisionlab.policy import _emulated_block, _reference

    block = make_block(seed=2)
    g = torch.Generator().manual_seed(0)
    x, v = torch.randn(6, 32, generator=g), torch.randn(6, 32, generator=g)
    f64 = emulate.Precision("float64", "float64")
    y, j = _emulated_block(block, x, v, f64, f64)
    ref = _reference(block)
    y_ref = ref(x.double())
    j_ref = torch.func.jvp(ref, (x.double(),), (v.double(),))[1]
    assert torch.allclose(y, y_ref, rtol=1e-12, atol=1e-13)
    assert torch.allclose(j, j_ref, rtol=1e-12, atol=1e-13)


def test_emulated_group_norm_against_torch_in_float64():
    from precisionlab import emulate

    f64 = emulate.Precision("float64", "float64")
    g = torch.Generator().manual_seed(1)
    x = torch.randn(5, 8, 3, generator=g, dtype=torch.float64, requires_grad=True)
    w = torch.randn(8, generator=g, dtype=torch.float64, requires_grad=True)
    b = torch.randn(8, generator=g, dtype=torch.float64, requires_grad=True)
    ref = torch.nn.functional.group_norm(x, 4, w, b)
    assert torch.allclose(emulate.group_norm(x, 4, w, b, f64), ref, rtol=1e-12, atol=1e-13)
    assert torch.autograd.gradcheck(lambda x, w, b: emulate.group_norm(x, 4, w, b, f64), (x, w, b))
    assert torch.autograd.gradcheck(lambda x: emulate.group_norm(x, 2, None, None, f64), (x,))
    # In bfloat16: one rounding of the float64 result.
    y16 = emulate.group_norm(x.detach().float(), 4, w.detach().float(), b.detach().float(), "bfloat16")
    xr = x.detach().float().bfloat16().double()  # operands rounded to the format first
    exact = torch.nn.functional.group_norm(xr, 4, w.detach().bfloat16().double(), b.detach().bfloat16().double())
    from precisionlab.rounding import round_to
    assert torch.equal(y16, torch.as_tensor(round_to(exact, "bfloat16")).float())
    with pytest.raises(ValueError, match="groups"):
        emulate.group_norm(x, 3)


def test_make_block_is_reproducible():
    a, b = make_block(seed=3), make_block(seed=3)
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters(), strict=True))
    c = make_block(seed=4)
    assert not torch.equal(a[0].weight, c[0].weight)
    for lin in (a[0], a[3]):  # nn.Linear's default range, U(-1/sqrt(fan_in), 1/sqrt(fan_in))
        bound = lin.in_features ** -0.5
        assert lin.weight.abs().max() <= bound and lin.weight.abs().max() > 0.9 * bound
