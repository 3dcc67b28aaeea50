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
