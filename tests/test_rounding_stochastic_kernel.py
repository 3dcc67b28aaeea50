"""Stochastic rounding's 32-bit-lane float32 loop against the generic recipe, bit for bit.

From 4096 values on, float32 inputs rounded stochastically into a format whose emin is above
float32's (float16, the FP8, FP6 and FP4 formats) run `_stochastic_f32_loop`: the recipe cut
to int32 steps, with the tiny case's threshold computed another way. Three computations of
the same draws must give the same 32 bits on every pattern, NaNs, infinities, subnormals and
values far below the format's smallest subnormal included, under both overflow rules:

* ``32-bit lanes``: what round_to runs (`_stochastic_f32_loop`);
* ``generic loop``: `_stochastic_loop`, the recipe with 64-bit lanes, built directly;
* ``numpy``: the recipe as whole-array NumPy operations (`numpy_words`), a different code.

Every element draws SplitMix64(seed + i), so the same seed drives all three; the loops' draws
are held to an independent oracle in test_rounding_stochastic.py. The suite checks a sample
(every exponent with mantissas at each boundary, plus random patterns) for a few seeds;
``python tests/test_rounding_stochastic_kernel.py --exhaustive`` checks all 2^32 patterns
against the generic loop (about 25 s per format).
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np
import pytest
from test_rounding_native import CHUNK, KERNEL_ONLY, mismatches, sample_patterns

from precisionlab import rounding_kernel as rk
from precisionlab.formats import get_format
from precisionlab.rounding import round_to

NARROW = ["float16", "float8_e5m2", "float8_e4m3fn", *KERNEL_ONLY]  # emin above float32's
SEEDS = [0, 1, 2**63 - 5]  # round_to draws seeds below 2^63; the last sets seed + i's top bit


def compare(words: np.ndarray, name: str, seed: int, saturate: bool = False,
            numpy: bool = True) -> list[str]:
    """The computations on float32 patterns `words` (numpy=False: the two loops alone, 6x
    quicker, for the exhaustive run); a description of each mismatch."""
    fmt = get_format(name)
    saturate = saturate or not fmt.has_nan  # float4/float6: no inf, no NaN
    params = tuple(np.int32(p) for p in rk.word_params(fmt, rk.F32, saturate))
    src = words.view(np.int32)
    results = {}
    for label, narrow in (("32-bit lanes", True), ("generic loop", False)):
        out = np.empty_like(src)
        rk.numba_kernel(rk.STOCHASTIC, False, False, rk.F32, narrow=narrow)(src, out, *params,
                                                                            seed)
        results[label] = out
    if numpy:
        results["numpy"] = np.empty_like(src)
        rk.numpy_words(src, results["numpy"], *params, rk.STOCHASTIC, seed, False)
    ref = results.pop("32-bit lanes")
    return mismatches(words, results, ref, f"{name} seed {seed} (reference: the 32-bit lanes)")


@pytest.mark.parametrize("name", NARROW)
@pytest.mark.parametrize("seed", SEEDS)
def test_stochastic_float32_lanes_agree_with_the_recipe_bit_for_bit(name, seed):
    assert compare(sample_patterns(n_random=1 << 16, seed=seed % 7), name, seed) == []


@pytest.mark.parametrize("name", ["float16", "float8_e5m2"])
def test_stochastic_float32_lanes_agree_when_saturating(name):
    assert compare(sample_patterns(n_random=1 << 16), name, 3, saturate=True) == []


def test_round_to_takes_the_32_bit_lanes_for_long_float32_inputs(monkeypatch):
    """round_to's numba tier asks for the narrow build, and returns its bits."""
    asked = []
    build = rk.numba_kernel
    monkeypatch.setattr(rk, "numba_kernel", lambda *a, **k: asked.append((a, k)) or build(*a, **k))
    x = sample_patterns(n_random=1 << 12).view(np.float32)
    with np.errstate(invalid="ignore", over="ignore"):
        got = round_to(x, "float16", "stochastic", generator=np.random.default_rng(4))
    (args, kwargs), = asked
    assert args[0] == rk.STOCHASTIC and args[3] is rk.F32 and kwargs.get("narrow", True)
    seed = int(np.random.default_rng(4).integers(0, 2**63))
    want = np.empty(x.size, np.int32)
    params = rk.word_params(get_format("float16"), rk.F32, False)
    rk.numpy_words(x.view(np.int32), want, *params, rk.STOCHASTIC, seed, False)
    assert (got.view(np.int32) == want).all()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--exhaustive", action="store_true", help="all 2^32 float32 patterns")
    ap.add_argument("--formats", default=",".join(NARROW))
    ap.add_argument("--seed", type=int, default=SEEDS[-1])
    args = ap.parse_args()
    bad: list[str] = []
    for name in args.formats.split(","):
        t0 = time.perf_counter()
        if args.exhaustive:
            for lo in range(0, 1 << 32, CHUNK):
                words = np.arange(lo, lo + CHUNK, dtype=np.uint64).astype(np.uint32)
                # chunk k draws from seed + lo: every pattern meets a fresh 63-bit draw
                bad += compare(words, name, (args.seed + lo) % 2**63, numpy=False)
        else:
            bad += compare(sample_patterns(), name, args.seed)
        print(f"{name}: {'all 2^32' if args.exhaustive else 'sampled'} patterns, "
              f"{time.perf_counter() - t0:.0f} s", flush=True)
    print("\n".join(bad) if bad else "ok")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
