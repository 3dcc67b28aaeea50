"""Tests for precisionlab.mixed_precision (the precision policy): device-type selection, the
fp16-needs-CUDA rule, and the weight policy comparison, checked against torch's own behaviour (autocast, dtype errors, float64 JVPs)."""

from __future__ import annotations

import pytest
import torch

from precisionlab.mixed_precision import (
    DEVICE_TYPES,
    PRECISIONS,
    WEIGHT_POLICIES,
    GroupNorm32,
    PrecisionPolicy,
    autocast_device_type,
    autocast_output_dtypes,
    autocast_rounded_once,
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


@pytest.mark.parametrize("precision, device, capability, dtype, scaler", [
    ("fp32", "cpu", None, None, False), ("float32", "mps", None, None, False),
    ("bf16", "cpu", None, torch.bfloat16, False), ("bfloat16", "mps", None, torch.bfloat16, False),
    ("bf16", "cuda:0", (8, 0), torch.bfloat16, False), ("fp16", "cuda", None, torch.float16, True),
    ("fp16", "cuda", (7, 5), torch.float16, True),
    ("half", torch.device("cuda", 2), None, torch.float16, True),
])
def test_precision_policy(precision, device, capability, dtype, scaler):
    p = precision_policy(precision, device, capability=capability)
    assert p.autocast_dtype == dtype and p.use_loss_scaler == scaler
    assert p.precision in PRECISIONS and p.device_type in DEVICE_TYPES
    assert p.capability == capability
    s = p.loss_scaler(kind="book")
    assert isinstance(s, DynamicLossScaler) and s.is_enabled() == scaler


@pytest.mark.parametrize("capability", [(7, 0), (7, 5), (6, 1), (3, 7)])
def test_bf16_on_cuda_below_compute_capability_8_is_refused(capability):
    """V100 (7.0), T4 and RTX 20xx (7.5), Pascal (6.x): no bfloat16 units."""
    with pytest.raises(ValueError, match=rf"compute capability >= 8\.0.*has "
                                         rf"{capability[0]}\.{capability[1]}.*Valid choices "
                                         r"there: fp16 \(with the loss scaler\), fp32"):
        precision_policy("bf16", "cuda:0", capability=capability)
    # fp16 and fp32 stay available on the same card.
    assert precision_policy("fp16", "cuda:0", capability=capability).use_loss_scaler
    assert precision_policy("fp32", "cuda:0", capability=capability).autocast_dtype is None


@pytest.mark.parametrize("capability", [(8, 0), (8, 6), (8, 9), (9, 0), (10, 0), (12, 0)])
def test_bf16_on_cuda_from_compute_capability_8_is_accepted(capability):
    p = precision_policy("bf16", "cuda", capability=capability)
    assert p.autocast_dtype == torch.bfloat16 and not p.use_loss_scaler
    assert f"compute capability {capability[0]}.{capability[1]}" in str(p)


@pytest.mark.parametrize("reported, ok", [((7, 5), False), ((8, 0), True), ((9, 0), True)])
def test_bf16_asks_the_device_for_its_capability(monkeypatch, reported, ok):
    """With no capability given, the policy asks torch.cuda for the named device's own."""
    asked = []

    def fake_capability(device=None):
        asked.append(device)
        return reported

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", fake_capability)
    if ok:
        assert precision_policy("bf16", "cuda:1").capability == reported
    else:
        with pytest.raises(ValueError, match=r"has 7\.5"):
            precision_policy("bf16", "cuda:1")
    assert asked == ["cuda:1"]
    # Only bf16 on CUDA needs it.
    precision_policy("fp16", "cuda:1")
    precision_policy("bf16", "cpu")
    assert asked == ["cuda:1"]


def test_bf16_on_cuda_without_a_visible_device_asks_for_the_capability(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ValueError, match=r"no CUDA device is visible.*capability=\(major, minor\)"):
        precision_policy("bf16", "cuda")


@pytest.mark.parametrize("capability", [(8,), (8, 0, 1), "8.0", (8.0, 0), (True, 0), (-1, 0), 8])
def test_bad_capability_is_named(capability):
    with pytest.raises(ValueError, match=r"capability must be \(major, minor\).*got capability="):
        precision_policy("bf16", "cuda", capability=capability)


@pytest.mark.parametrize("device", ["cpu", "mps"])
def test_capability_belongs_to_cuda_devices(device):
    with pytest.raises(ValueError, match=r"is a CUDA compute capability.*valid choices"):
        precision_policy("bf16", device, capability=(8, 0))


def test_is_bf16_supported_counts_emulation_by_default():
    """Why the policy does not use torch.cuda.is_bf16_supported(): its default counts emulation."""
    import inspect

    sig = inspect.signature(torch.cuda.is_bf16_supported).parameters
    assert sig["including_emulation"].default is True


def test_loss_scaler_hands_out_torchs_gradscaler():
    off = precision_policy("bf16", "cpu").loss_scaler()
    assert isinstance(off, torch.amp.GradScaler) and not off.is_enabled()
    # An enabled policy's scaler is GradScaler on the policy's device, with the kwargs given.
    on = PrecisionPolicy("fp16", "cpu", torch.float16, True).loss_scaler(init_scale=2.0**10,
                                                                       growth_interval=3)
    assert isinstance(on, torch.amp.GradScaler) and on.is_enabled()
    assert on.get_scale() == 2.0**10 and on.get_growth_interval() == 3
    book = PrecisionPolicy("fp16", "cpu", torch.float16, True).loss_scaler(
        kind="book", init_scale=2.0**10, growth_interval=3)
    assert isinstance(book, DynamicLossScaler) and book.get_scale() == 2.0**10
    # Both follow one rule: the same steps skipped and the same scales, step by step.
    for scaler in (on, book):
        p = torch.nn.Parameter(torch.zeros(3))
        opt = torch.optim.SGD([p], lr=0.1)
        seen = []
        for g in [1.0, 1.0, float("inf"), 1.0, 1.0, 1.0, 1.0, float("nan")]:
            p.grad = scaler.scale(torch.full((3,), g))
            scaler.step(opt)
            scaler.update()
            seen.append(scaler.get_scale())
        if scaler is on:
            want = seen
        else:
            assert seen == want == [2.0**10, 2.0**10, 2.0**9, 2.0**9, 2.0**9, 2.0**10, 2.0**10,
                                    2.0**9]
    with pytest.raises(ValueError, match=r"kind.*valid choices: torch, book"):
        precision_policy("bf16", "cpu").loss_scaler(kind="apex")


@pytest.mark.parametrize("device", ["cpu", "mps", torch.device("cpu")])
def test_fp16_without_cuda_is_refused_with_the_valid_choices(device):
    with pytest.raises(ValueError, match=r"only supported on CUDA.*Valid choices on (cpu|mps): "
                                         r"fp32, bf16"):
        precision_policy("fp16", device)


def test_unknown_precision_is_named():
    with pytest.raises(ValueError, match="unknown precision 'fp8'; valid choices: fp32, bf16, fp16 "
                                         r"\(aliases: bfloat16, float16, float32, half, single\)"):
        precision_policy("fp8", "cuda")
    for bad in ("tf32", "float64", "fp8_e4m3", 16):
        with pytest.raises(ValueError, match="unknown precision"):
            precision_policy(bad, "cpu")


@pytest.mark.parametrize("name, key", [
    ("FP32", "fp32"), ("single", "fp32"), ("BFloat16", "bf16"), ("half", "fp16"),
    (torch.float16, "fp16"), (torch.bfloat16, "bf16"), (torch.float32, "fp32"),
])
def test_precision_names_come_from_the_format_table(name, key):
    assert precision_policy(name, "cuda", capability=(8, 0)).precision == key


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
    f = torch.nn.functional
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert table["linear"][0] == str(f.linear(x, x).dtype)[6:]
        assert table["mse_loss"] == ("float32", "float32")
        ln_lo = f.layer_norm(x.bfloat16(), (8,)).dtype
        direct = {"prod": torch.prod(x.bfloat16(), 1), "cdist": torch.cdist(x.bfloat16(), x.bfloat16()),
                  "cross_entropy": f.cross_entropy(x.bfloat16(), torch.tensor([0, 3, 7]))}
    assert table["layer_norm"][1] == str(ln_lo)[6:]
    for name, out in direct.items():
        assert table[name][1] == str(out.dtype)[6:]


def _pinned_torch() -> str:
    from pathlib import Path

    req = Path(__file__).resolve().parents[1] / "requirements.txt"
    return next(line.split("==")[1].strip() for line in req.read_text().splitlines()
                if line.startswith("torch=="))


def test_the_cpu_autocast_table_chapter_5_describes():
    """Chapter 5's sentences describe the pinned torch's CPU autocast; the test command installs it."""
    pinned = _pinned_torch()
    if torch.__version__.split("+")[0] != pinned:
        pytest.skip(f"chapter 5 describes torch {pinned}; this is torch {torch.__version__}")
    lo, hi = ("bfloat16", "bfloat16"), ("float32", "float32")
    follow = ("float32", "bfloat16")
    assert autocast_output_dtypes("cpu", torch.bfloat16) == {
        "linear": lo, "matmul": lo, "layer_norm": follow, "group_norm": follow, "softmax": follow,
        "exp": follow, "sum": follow, "prod": hi, "vector_norm": follow, "cdist": hi,
        "mse_loss": hi, "cross_entropy": hi}
    once = autocast_rounded_once("cpu", torch.bfloat16)
    assert set(once) == {"linear", "matmul", "layer_norm", "group_norm", "softmax", "exp", "sum",
                         "vector_norm"}
    assert min(once[k] for k in ("layer_norm", "group_norm", "softmax")) > 0.99


def test_autocast_rounded_once_against_a_float64_oracle():
    """The share for exp, recomputed with NumPy's float64 exp rounded by ml_dtypes."""
    import ml_dtypes
    import numpy as np

    once = autocast_rounded_once("cpu", torch.bfloat16, shape=(16, 16), seed=3)
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(16, 16, generator=gen).to(torch.bfloat16)
    want = np.exp(x.double().numpy()).astype(ml_dtypes.bfloat16).astype(np.float64)
    got = torch.exp(x).double().numpy()
    assert once["exp"] == float(np.mean(got == want))
    assert all(0.0 <= v <= 1.0 for v in once.values())


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
    from precisionlab.mixed_precision import _emulated_block, _reference

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


@pytest.mark.parametrize("version", ["2.3.0", "2.4.1", "2.5.1"])
def test_bf16_on_mps_is_refused_where_torch_has_no_mps_bfloat16_autocast(monkeypatch, version):
    """torch 2.3 and 2.4 have no MPS autocast and 2.5's turns itself off for bfloat16 (with a
    warning): the policy says so instead of running fp32 under a bf16 name."""
    monkeypatch.setattr(torch, "__version__", torch.torch_version.TorchVersion(version))
    with pytest.raises(ValueError, match=r"needs torch >= 2\.6.*Valid choices on this torch: fp32"):
        precision_policy("bf16", "mps")
    assert precision_policy("fp32", "mps").autocast_dtype is None
    assert precision_policy("bf16", "cpu").autocast_dtype == torch.bfloat16
