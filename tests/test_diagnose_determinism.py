"""diagnose.determinism and ulp_distance against numpy's nextafter."""

import subprocess
import sys

import numpy as np
import pytest
import torch
from diagnose_models import SmallCNN

from precisionlab import diagnose


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
def test_ulp_distance_counts_nextafter_steps(dtype):
    rng = np.random.default_rng(0)
    a = (rng.standard_normal(200) * 10.0 ** rng.integers(-3, 3, 200)).astype(dtype)
    a[:3] = [0.0, -0.0, np.finfo(dtype).smallest_subnormal]
    k = rng.integers(0, 6, 200)
    b = a.copy()
    for i in range(200):
        for _ in range(k[i]):
            b[i] = np.nextafter(b[i], dtype(np.inf))
    d = diagnose.ulp_distance(torch.from_numpy(b), torch.from_numpy(a))
    want = k.copy()
    want[1] = k[1]  # -0.0 and 0.0 are the same position
    assert d.tolist() == want.tolist()
    tiny = np.finfo(dtype).smallest_subnormal
    pm = diagnose.ulp_distance(torch.tensor([tiny], dtype=torch.float64 if dtype == np.float64
                                            else torch.from_numpy(a).dtype),
                               torch.tensor([-tiny]).to(torch.from_numpy(a).dtype))
    assert pm.tolist() == [2]


def test_bfloat16_distance_and_nan():
    a = torch.tensor([1.0, float("nan"), 2.0], dtype=torch.bfloat16)
    b = torch.tensor([1.0078125, float("nan"), float("nan")], dtype=torch.bfloat16)
    assert diagnose.ulp_distance(b, a).tolist() == [1, 0, -1]


def test_a_thread_dependent_function_is_caught():
    def fn(x):  # moves its result by (threads - 1) ulps
        y = x.clone()
        for _ in range(torch.get_num_threads() - 1):
            y = torch.nextafter(y, torch.full_like(y, float("inf")))
        return y, x * 2
    before = torch.get_num_threads()
    r = diagnose.determinism(fn, torch.randn(5), threads=(1, 3), deterministic=True)
    assert torch.get_num_threads() == before
    ch = {(c.tensor, c.setting): c for c in r.changes}
    assert ch[("output[0]", "3 threads")].changed == 5 and ch[("output[0]", "3 threads")].max_ulps == 2
    assert ch[("output[0]", "repeat 1")].changed == 0
    assert ch[("output[1]", "3 threads")].changed == 0
    assert r.sensitive == ("output[0]",)


def test_model_gradients_are_compared():
    torch.manual_seed(0)
    m = SmallCNN()
    r = diagnose.determinism(m, torch.randn(2, 1, 6, 6), threads=(1, 2),
                             loss_fn=lambda out: out.square().mean())
    assert [t for t in r.tensors if t.startswith("grad ")] == [
        "grad " + n for n, _ in m.named_parameters()]
    assert all(len(line) <= 80 for line in str(r).splitlines())


def test_bad_input_names_the_argument():
    with pytest.raises(ValueError, match="threads must be"):
        diagnose.determinism(torch.sin, torch.ones(2), threads=(0,))
    with pytest.raises(ValueError, match="fn must be callable"):
        diagnose.determinism(3, torch.ones(2))
    with pytest.raises(ValueError, match=r"loss_fn needs fn to be a torch\.nn\.Module"):
        diagnose.determinism(torch.sin, torch.ones(2), loss_fn=lambda o: o.sum())


def test_random_draws_are_the_same_in_every_run():
    """Dropout in training mode draws the same mask in each run: only the order of additions
    is compared, and the global random state and deterministic flags are left as they were."""
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Dropout(0.5)).train()
    x = torch.randn(4, 8)
    state = torch.get_rng_state()
    torch.use_deterministic_algorithms(False)
    r = diagnose.determinism(m, x, threads=(1, 2), repeats=2)
    assert all(c.changed == 0 for c in r.changes if c.setting.startswith("repeat"))
    assert torch.equal(torch.get_rng_state(), state)
    assert not torch.are_deterministic_algorithms_enabled()
    assert not torch.is_deterministic_algorithms_warn_only_enabled()


_FLAG_CASES = [(False, False), (True, True), (True, False)]  # off, warn only, error


@pytest.mark.parametrize("compiled", [False, True])
def test_the_deterministic_run_sets_torchs_flags_and_restores_them(compiled):
    # In a fresh interpreter: inside the run, the deterministic flags are on with warn_only,
    # as torch.use_deterministic_algorithms(True, warn_only=True) sets them; after it, each
    # earlier state (off, warn only, error) is back. Without a compiler loaded, torch._dynamo
    # is never imported; with one (torch.compile imports torch._dynamo), the compiler's own
    # flag torch._inductor.config.deterministic is set inside the run too.
    code = f"""
import sys, torch
from precisionlab import diagnose
if {compiled}:
    import torch._dynamo
seen = []
def fn(x):
    seen.append((torch.are_deterministic_algorithms_enabled(),
                 torch.is_deterministic_algorithms_warn_only_enabled()))
    if {compiled}:
        import torch._inductor.config as c
        seen.append(c.deterministic)
    return x * 2
for mode, warn in {_FLAG_CASES!r}:
    # the same flags as torch.use_deterministic_algorithms(mode, warn_only=warn), which
    # would import the compiler itself
    torch.set_deterministic_debug_mode("default" if not mode else "warn" if warn else "error")
    seen.clear()
    diagnose.determinism(fn, torch.ones(3), threads=(1,), deterministic=True)
    assert seen[-2:] == [(True, True), True] if {compiled} else seen[-1] == (True, True), seen
    after = (torch.are_deterministic_algorithms_enabled(),
             torch.is_deterministic_algorithms_warn_only_enabled())
    assert after == (mode, warn), (after, mode, warn)
print("torch._dynamo" in sys.modules)
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == str(compiled)
