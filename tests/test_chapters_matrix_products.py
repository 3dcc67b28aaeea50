"""chapters.matrix_products: the stored three-product runs are this code's runs, bit for bit."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from precisionlab.chapters import matrix_products as mp

STORED = Path(__file__).resolve().parents[1] / "data" / "ch9_three_products.json"
STORED_SEED1 = STORED.with_name("ch9_three_products_seed1.json")


@pytest.mark.parametrize("name", ["fp8_hybrid", "mxfp8", "nvfp4, last layer bf16",
                                  "nvfp4, 1x16 weight blocks"])
def test_stored_runs_replay_bit_for_bit(name):
    task, lr, runs = mp.load_three_products(STORED)
    assert list(runs) == list(mp.THREE_PRODUCT_RECIPES)
    again = mp.train_three_products(task, name, 3, lr=lr)
    assert np.array_equal(again.losses, runs[name][:3])


@pytest.mark.parametrize("name", ["bf16", "nvfp4, no stochastic rounding"])
def test_second_seed_runs_replay_bit_for_bit(name):
    task, lr, runs = mp.load_three_products(STORED_SEED1)
    assert task.seed == 1 and list(runs) == list(mp.THREE_PRODUCT_RECIPES)
    again = mp.train_three_products(task, name, 3, lr=lr)
    assert np.array_equal(again.losses, runs[name][:3])
    first, _, runs0 = mp.load_three_products(STORED)
    assert first.seed == 0 and not np.array_equal(runs0[name][:3], runs[name][:3])


def test_unknown_recipe_is_refused():
    with pytest.raises(ValueError, match="recipe"):
        mp.train_three_products(mp.ThreeProductTask(), "fp7", 1)


@pytest.mark.parametrize("seed", [0, 1])
def test_weight_gradient_study_replays_bit_for_bit(seed):
    name = "ch9_wgrad.json" if seed == 0 else "ch9_wgrad_seed1.json"
    task, lr, runs = mp.load_three_products(STORED.with_name(name))
    base, base_lr, _ = mp.load_three_products(STORED if seed == 0 else STORED_SEED1)
    assert (task, lr) == (base, base_lr) and list(runs) == list(mp.WGRAD_RECIPES)
    for recipe in ("mxfp4", "nvfp4, wgrad bf16"):
        again = mp.train_three_products(task, recipe, 2, lr=lr)
        assert np.array_equal(again.losses, runs[recipe][:2]), recipe


def test_wgrad_bf16_changes_only_the_weight_gradient():
    # Step 0's loss is the forward product's alone: the same with dW in BF16; the update
    # it makes, from a different dW, is not.
    _, _, runs = mp.load_three_products(STORED.with_name("ch9_wgrad.json"))
    _, _, base = mp.load_three_products(STORED)
    for recipe in ("nvfp4", "mxfp4"):
        full = base[recipe] if recipe in base else runs[recipe]
        kept = runs[recipe + ", wgrad bf16"]
        assert full[0] == kept[0] and full[1] != kept[1]


def test_exact_fp8_matmul_checks_its_bound_at_the_edge():
    # 448^2 = 200704 per product: K = 171196 keeps the sum below 2^35, 171197 reaches it.
    for k, fits in ((171196, True), (171197, False)):
        a, b = np.full((1, k), 448.0), np.full((k, 1), 448.0)
        assert (200704 * k < 2**35) == fits
        if fits:
            assert mp.exact_fp8_matmul(a, b)[0, 0] == 200704 * k
        else:
            with pytest.raises(ValueError, match="2\\^35"):
                mp.exact_fp8_matmul(a, b)


def test_exact_fp8_matmul_on_wide_multiples_of_the_grain():
    from fractions import Fraction

    gen = np.random.default_rng(0)  # 21-bit multiples of 2^-9: far more bits than E4M3
    a = gen.integers(-2**20, 2**20, (3, 257)) * 2.0**-9
    b = gen.integers(-2**20, 2**20, (257, 2)) * 2.0**-9
    c = mp.exact_fp8_matmul(a, b)
    for i in range(3):
        for j in range(2):
            assert c[i, j] == sum(Fraction(x) * Fraction(y)
                                  for x, y in zip(a[i], b[:, j], strict=True))


@pytest.mark.parametrize("a, b, match", [
    (np.ones((2, 3)), np.ones((4, 2)), "shapes"),
    (np.ones(3), np.ones(3), "shapes"),
    (np.array([[np.nan]]), np.ones((1, 1)), "E4M3"),
    (np.ones((1, 1)), np.array([[np.inf]]), "E4M3"),
])
def test_exact_fp8_matmul_refuses_bad_operands(a, b, match):
    with pytest.raises(ValueError, match=match):
        mp.exact_fp8_matmul(a, b)


def test_a_short_run_stays_on_the_numpy_tier_and_a_long_one_compiles(monkeypatch):
    """A replay of a few steps (the chapter's claim checks) pays no cold numba compile; the
    replay tests above hold its bits to the stored runs, which ran compiled (600 steps)."""
    from precisionlab.emulate import recipe_linear

    class Built(Exception):
        pass

    made = []

    def spy(*args, **kwargs):
        made.append(kwargs["compiled"])
        return recipe_linear.RecipeLinear(*args, **kwargs)

    monkeypatch.setattr(mp, "RecipeLinear", spy)
    task = mp.ThreeProductTask()
    mp.train_three_products(task, "nvfp4", 2)
    assert made == [False] * (len(task.widths) - 1)

    def built(*args, **kwargs):  # record the long run's layers, then stop before training
        made.append(kwargs["compiled"])
        raise Built

    made.clear()
    monkeypatch.setattr(mp, "RecipeLinear", built)
    with pytest.raises(Built):
        mp.train_three_products(task, "nvfp4", 600)
    assert made == [True]
