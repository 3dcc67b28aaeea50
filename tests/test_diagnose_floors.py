"""diagnose.floors: the detection floor of a check at a module's output, its definition on hand
values, and its soundness on real models: a bug that scales a module's output by a little more
than the floor is Type-II, blamed at that module; one far below it passes (Type-I)."""

from __future__ import annotations

import copy
import math
import os

import numpy as np
import pytest
import torch
from torch import nn

from precisionlab import diagnose
from precisionlab.diagnose.floors import detection_floor

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def test_floor_by_hand():
    lo, hi, r = np.array([0.99]), np.array([1.01]), np.array([1.0])
    # up: the near end 0.99 passes 1.0 at 1/0.99 - 1; down: the far end at 1 - 1/1.01
    assert detection_floor(lo, hi, r, "float64") == pytest.approx(1 / 0.99 - 1, rel=1e-12)
    # a negative value mirrors; the floor takes the worse direction of the best entries
    lo, hi = np.array([-1.01, 1.9]), np.array([-0.99, 2.1])
    r = np.array([-1.0, 2.0])
    up, down = min(1 / 0.99, 2 / 1.9) - 1, 1 - max(1 / 1.01, 2 / 2.1)
    assert detection_floor(lo, hi, r, "float64") == pytest.approx(max(up, down), rel=1e-12)
    # float32's rounding of the scaled bound: 2u at each end
    u = 2.0**-24
    got = detection_floor(np.array([0.99]), np.array([1.01]), np.array([1.0]), "float32")
    assert got == pytest.approx(1 / (0.99 * (1 - 2 * u)) - 1, rel=1e-12)


_EDGES = [0.0, -0.0, 1.0, -1.0, 1e-310, -1e-310, 1.2e-38, 3e38, -3e38, math.inf, -math.inf,
          math.nan, 0.99, 1.01, 2.0**-126, 2.0**-149]


@pytest.mark.parametrize("ref_dtype", [np.float32, np.float64])
def test_the_numpy_floor_gives_the_compiled_loops_value(ref_dtype):
    """Small checks take NumPy's twin of the loop (no numba); both give the same float on
    bounds and references drawn from the edges (zeros, subnormals, infinities, NaN, bounds
    through zero, references outside), one entry or many, every format's constants."""
    from precisionlab.diagnose import floors

    rng = np.random.default_rng(0)
    kernel = floors._floor_kernel()

    def pick(n):
        return np.where(rng.random(n) < 0.5, rng.choice(_EDGES, n),
                        rng.standard_normal(n) * 10.0 ** rng.integers(-40, 5, n))

    for trial in range(3000):
        n = int(rng.integers(1, 9)) if trial % 3 else int(rng.integers(1, 200))
        a, b, r = pick(n), pick(n), pick(n).astype(ref_dtype)
        lo, hi = (a, b) if trial % 5 == 0 else (np.minimum(a, b), np.maximum(a, b))  # lo > hi, NaN ends
        if trial % 2:  # mostly inside: the floor is then a minimum over terms, not 0
            r = np.clip(r, lo, hi).astype(ref_dtype)
        for fmt in ("float32", "bfloat16", "float16", "float64"):
            w, tiny = floors._constants(fmt)
            want = kernel(lo, hi, r, w, tiny)
            got = floors._floor_numpy(lo, hi, r, w, tiny)
            assert (math.isnan(got) and math.isnan(want)) or got == want, (lo, hi, r, fmt)


def test_floor_edge_cases():
    z = np.zeros(3)
    assert math.isnan(detection_floor(z - 1, z + 1, z, "float32"))  # nothing a scaling changes
    assert detection_floor(np.array([0.0]), np.array([1.0]), np.array([2.0]), "float32") == 0.0
    # a bound reaching zero: scaling up is never seen, scaling down is
    f = detection_floor(np.array([-1.0]), np.array([1.0]), np.array([0.5]), "float32")
    assert f == math.inf
    tiny = np.array([1e-40])
    assert detection_floor(tiny / 2, tiny * 2, tiny, "float32") == math.inf
    assert math.isnan(detection_floor(np.array([]), np.array([]), np.array([]), "float32"))


def _scaled(m, path, k):
    t = copy.deepcopy(m)

    def hook(_mod, _inp, out):
        return out * k if isinstance(out, torch.Tensor) else (out[0] * k, *out[1:])
    t.get_submodule(path).register_forward_hook(hook)
    return t


def _sweep(m, target, batch, paths=None, **kw):
    """Every module-output check with a floor below 0.9: scaled by 1 +- 1.05 floor, Type-II
    blamed at that module; by 1 +- 0.01 floor, Type-I."""
    r = diagnose.triage(m, target, batch, logic_pass=False, **kw)
    assert r.verdict == "Type-I"
    tested = 0
    for c in r.checks:
        path = c.op.split(":")[0]
        if math.isnan(c.floor) or c.floor >= 0.9 or ":" not in c.op:
            continue
        if paths is not None and path not in paths:
            continue
        for sign in (1, -1):
            caught = diagnose.triage(m, _scaled(target, path, 1 + sign * 1.05 * c.floor), batch,
                                     logic_pass=False, **kw)
            assert caught.verdict == "Type-II", (c.op, c.floor, sign)
            assert caught.blamed.op.startswith(path + ":"), (c.op, caught.blamed.op)
            missed = diagnose.triage(m, _scaled(target, path, 1 + sign * 0.01 * c.floor), batch,
                                     logic_pass=False, **kw)
            assert missed.verdict == "Type-I", (c.op, c.floor, sign)
        tested += 1
    return r, tested


@pytest.mark.parametrize("low", [None, torch.bfloat16, torch.float16])
def test_floor_is_sound_on_an_mlp(low):
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(8, 32), nn.GELU(), nn.LayerNorm(32), nn.Linear(32, 4)).eval()
    target = m if low is None else copy.deepcopy(m).to(low)
    r, tested = _sweep(m, target, torch.randn(5, 8), cast_inputs=True)
    assert tested == 4
    assert r.floor == max(c.floor for c in r.checks if not math.isnan(c.floor))
    assert r.floor_at.floor == r.floor
    if low is not None:
        assert r.floor > 2.0**-9  # a 16-bit target cannot see a scaling by 1 + 2^-10


def test_floor_is_sound_on_gpt2_in_bfloat16():
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(n_layer=2, n_embd=32, n_head=4, vocab_size=100,
                                  n_positions=32, bos_token_id=0, eos_token_id=0,
                                  attn_implementation="eager")
    m = transformers.GPT2LMHeadModel(cfg).eval()
    g = torch.Generator().manual_seed(1)
    batch = {"input_ids": torch.randint(1, 100, (2, 8), generator=g)}
    low = copy.deepcopy(m).to(torch.bfloat16)
    paths = {"transformer.h.0.ln_1", "transformer.h.0.attn.c_attn", "transformer.h.0.attn.c_proj",
             "transformer.h.1.mlp.c_fc", "lm_head"}
    r, tested = _sweep(m, low, batch, paths)
    assert tested == len(paths)
    text = r.summary()
    f = r.floor_at
    assert f"the largest floor is at #{f.index}" in text.replace("\n  ", " ")
    assert "floor" in r.table().to_text().splitlines()[0]


def test_floor_only_where_a_bug_would_be_checked():
    torch.manual_seed(0)
    lin = nn.Linear(4, 4).eval()
    r = diagnose.triage(lambda x: torch.relu(lin(x) * 2), lambda x: torch.relu(lin(x) * 2),
                        torch.randn(3, 4))
    floors = {c.op: c.floor for c in r.checks}
    assert not math.isnan(floors["relu#0"])  # the program's output
    assert math.isnan(floors["mul#0"])  # inside: a bug there is checked downstream only
