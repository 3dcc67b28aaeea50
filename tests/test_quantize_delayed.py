"""DelayedScaling against a step-by-step re-implementation of Transformer Engine's documented recipe.

The oracle keeps the amax history in a Python list and computes each scale in numpy float32 as
the documentation writes it: scale = (fp8_max / amax) / 2^margin, amax the max (or the most
recent) of the last amax_history_len amaxes, the old scale kept while that amax is 0.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
import torch

from precisionlab.quantize import DelayedScaling, quantize_per_tensor

MAX = {"float8_e4m3fn": 448.0, "float8_e5m2": 57344.0}
ML = {"float8_e4m3fn": ml_dtypes.float8_e4m3fn, "float8_e5m2": ml_dtypes.float8_e5m2}


class Recipe:
    """Transformer Engine's delayed scaling for one tensor, written out with lists."""

    def __init__(self, elem, length, algo, margin):
        self.elem, self.length, self.algo, self.margin = elem, length, algo, margin
        self.history: list[float] = []
        self.scale = np.float32(1.0)

    def step(self, x: np.ndarray) -> np.ndarray:
        top = np.float32(MAX[self.elem])
        q = np.clip(x * self.scale, -top, top).astype(ML[self.elem]).astype(np.float32)
        self.history = [float(np.abs(x).max()), *self.history][: self.length]
        amax = max(self.history) if self.algo == "max" else self.history[0]
        if amax > 0:
            self.scale = top / np.float32(amax) / np.float32(2.0**self.margin)
        return q


@pytest.mark.parametrize("elem", list(MAX))
@pytest.mark.parametrize("length, algo, margin", [(1, "max", 0), (4, "max", 0), (4, "most_recent", 1),
                                                  (16, "max", 2)])
def test_delayed_scaling_follows_the_recipe_step_by_step(elem, length, algo, margin):
    rng = np.random.default_rng(length + margin)
    recipe = Recipe(elem, length, algo, margin)
    ds = DelayedScaling(elem, amax_history_len=length, amax_compute_algo=algo, margin=margin)
    sizes = 2.0 ** rng.integers(-12, 12, 30)
    sizes[[5, 6]] = 0.0  # all-zero steps: the scale must stay put
    for size in sizes:
        x = (rng.standard_normal((8, 16)) * size).astype(np.float32)
        used = recipe.scale
        want = recipe.step(x)
        r = ds(torch.from_numpy(x))
        assert np.array_equal(r.values.numpy(), want)
        assert ds.scale == float(recipe.scale)
        assert list(ds.history[: len(recipe.history)]) == recipe.history
        assert r.decode.item() == float(np.float32(1) / used)  # Transformer Engine's scale_inv


def test_a_spike_after_a_quiet_stretch_saturates_under_delayed_but_not_current_scaling():
    rng = np.random.default_rng(0)
    ds = DelayedScaling("float8_e4m3fn", amax_history_len=16)
    for _ in range(20):  # quiet: amax about 1
        ds(torch.from_numpy(rng.standard_normal(256).astype(np.float32) * 0.3))
    spike = torch.from_numpy(rng.standard_normal(256).astype(np.float32) * 30.0)
    late = ds(spike)
    now = quantize_per_tensor(spike)
    assert late.saturated > 0.5 and now.saturated == 0.0
    assert ds.history[0] == float(spike.abs().max())  # the next step's scale has caught up
    assert ds(spike).saturated == 0.0


def test_a_custom_amax_algorithm_sees_the_history_newest_first():
    seen = []
    ds = DelayedScaling(amax_history_len=3, amax_compute_algo=lambda h: seen.append(h) or h[-1])
    for a in (1.0, 2.0, 4.0, 8.0):
        ds.update(a)
    assert [list(h) for h in seen] == [[1, 0, 0], [2, 1, 0], [4, 2, 1], [8, 4, 2]]
    assert ds.scale == float(np.float32(448) / np.float32(2.0))


@pytest.mark.parametrize("kwargs, words", [
    (dict(amax_history_len=0), ["amax_history_len must be an integer >= 1", "=0"]),
    (dict(amax_history_len=2.5), ["amax_history_len=2.5"]),
    (dict(amax_history_len=True), ["amax_history_len=True"]),
    (dict(amax_compute_algo="mean"), ["amax_compute_algo 'mean'", "max, most_recent"]),
    (dict(margin="1"), ["margin='1'"]),
    (dict(elem="float4"), ["elem 'float4'", "float8_e4m3fn"]),
])
def test_bad_settings_name_themselves(kwargs, words):
    with pytest.raises(ValueError) as err:
        DelayedScaling(**kwargs)
    assert all(w in str(err.value) for w in words), str(err.value)


@pytest.mark.parametrize("amax", [float("inf"), float("nan"), -1.0])
def test_non_finite_amax_raises_and_leaves_the_state_alone(amax):
    ds = DelayedScaling(amax_history_len=2)
    ds.update(3.0)
    with pytest.raises(ValueError, match="amax must be a finite number >= 0"):
        ds.update(amax)
    if not np.isfinite(amax):
        x = torch.ones(4)
        x[0] = amax
        with pytest.raises(ValueError, match="inf/NaN"):
            ds(x)
    assert list(ds.history) == [3.0, 0.0] and ds.scale == float(np.float32(448) / np.float32(3))
