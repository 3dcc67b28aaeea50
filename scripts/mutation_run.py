"""Mutation testing with mutmut 3: the kill rate per module against the unit tests that cover it.

Needs mutmut, which is not a dependency of the package: ``pip install mutmut==3.8.1``.

Each module (a file or a folder package under src/precisionlab, named by path or short
name: ``scaling``, ``intervals/ops``, ``src/precisionlab/emulate/``) is mutated by mutmut
and tested with the unit test files listed for it in ``TESTS``. Modules that share their
test files are run in one mutmut session. Every session runs in a temporary copy of src/,
tests/ and pyproject.toml (the working tree is never touched); the ``[tool.mutmut]`` table
is written into the copy's pyproject.toml only. In the copy, a conftest.py addition keeps
rounding's numba tier on the NumPy path, because mutmut wraps every function in a Python
trampoline that numba cannot compile (see ``EXCLUDED``), and empties the package's functools
caches at the start of every mutant's run (mutmut forks each run from a process that has
already run the tests, so a cached result would hide a mutant). The same-bits subprocess
tests and figure smoke tests are deselected (they cannot tell a deterministic bug from the
truth), and so are the two tests that drive the numba tier. A mutant whose tests take more
than 6 times their measured CPU time counts as a timeout (killed: it loops).

mutmut makes several thousand mutants of these modules (rounding.py and rounding_kernel.py
about 1400 together), about 1-3 s each on a loaded two-core machine, so by default each
module is tested on a simple random sample (``--sample``, fixed ``--seed``) and the table
gives a 95% Wilson interval for the whole module's kill rate; ``--sample 0`` runs every mutant.

Killed counts mutants whose tests failed or timed out; a mutant whose function no listed
test calls ("no tests") and a survivor both count against the rate. ``EQUIVALENT`` lists
survivors argued to change nothing observable; the adjusted rate leaves them out. ``HARMLESS``
lists survivors that change a bound within a margin that keeps it sound; they stay counted.

Run from the repository root:

    python3 scripts/mutation_run.py scaling rounding intervals/interval intervals/outward \\
        intervals/ops intervals/softmax intervals/bounds
    python3 scripts/mutation_run.py src/precisionlab/emulate/ --sample 300
    python3 scripts/mutation_run.py --list        # the modules and their test files

It prints a table per module, every survivor (function, line, diff), writes
data/mutation_run.json (unless --no-save) and exits 1 if a module's rate (``--rate``,
adjusted by default) is below ``--min-rate``.
"""

from __future__ import annotations

import argparse
import ast
import json
import math
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = "src/precisionlab"
OUT = ROOT / "data" / "mutation_run.json"
INSTALL = "pip install mutmut==3.8.1"

_INTERVALS = ("tests/test_intervals.py", "tests/test_intervals_fields.py", "tests/test_intervals_masking.py",
              "tests/test_intervals_overflow.py", "tests/test_intervals_verdicts.py",
              "tests/test_intervals_interval.py", "tests/test_intervals_ops.py",
              "tests/test_intervals_outward.py", "tests/test_intervals_softmax.py",
              "tests/test_intervals_bounds.py")
# module (path under src/precisionlab without .py; a folder package keeps its name) -> unit tests
TESTS: dict[str, tuple[str, ...]] = {
    "scaling": ("tests/test_scaling.py", "tests/test_scaling_scalers.py"),
    "rounding": ("tests/test_rounding.py", "tests/test_rounding_stochastic.py", "tests/test_rounding_display.py",
                 "tests/test_rounding_native.py"),
    "intervals/interval": _INTERVALS,
    "intervals/outward": _INTERVALS,
    "intervals/ops": _INTERVALS,
    "intervals/softmax": _INTERVALS,
    "intervals/bounds": _INTERVALS,
    "emulate": ("tests/test_emulate.py", "tests/test_emulate_values.py"),
    "world": ("tests/test_world.py", "tests/test_world_ch3.py", "tests/test_world_rollout.py"),
}
TESTS["rounding_kernel"] = TESTS["rounding"]  # rounding's emulated recipe: the same tests
TESTS["rounding_native"] = TESTS["rounding"]  # rounding's library casts: the same tests
DESELECT = ("not same_bits and not figures and not numba_tiers and not tier_depends "
            "and not every_dispatch_level")
# Functions left out of the mutants, per module, with the reason.
EXCLUDED: dict[str, dict[str, str]] = {
    "rounding_kernel": {
        name: "numba-only build code: mutmut's trampolines cannot be compiled by numba, so the "
              "numba tier is kept off in the copy (its _round_word source is mutated and run "
              "through the Python tier)"
        for name in ("x__deterministic_loop", "x__mode_loop", "x__stochastic_loop", "x__nearest_f32_loop",
                     "x_numba_kernel", "x_numba_into", "x__twin")
    },
    # mutmut leaves decorated functions alone, so these make no mutants anyway; kernels.exp64 and
    # log64 are not listed: names are matched without the file, and elementary's twins must be mutated
    "emulate": {
        f"x_{name}": f"numba @njit kernel (mutmut skips decorated functions; numba could not compile a "
                     f"trampoline): {twin}"
        for name, twin in (
            ("gemm", "the tests hold matmul/linear against exact fractions sums"),
            ("scatter_rows", "the tests hold embedding's gradient against a hand-summed oracle"),
            ("inverse_cdf", "rl's sampler, tested with rl"),
            *((k, "its Python twin rounding.round_to is mutated; test_emulate holds the pair equal")
              for k in ("round_scalar", "round_buffer", "round_into")),
            *((k, f"its Python twin {t} is mutated; test_emulate holds the pair equal bit for bit")
              for k, t in (("pairwise_sum", "summation.fixed_sum"), ("rms_rows", "norms.rms_norm"))))
    },
}
# Survivors argued equivalent (no observable change) or not runnable under mutmut, with the
# reason: (module, mutmut's function name, the mutated source line as mutmut writes it).
_SAME_BITS = "picks another tier or back end of the same recipe: the same bits, only speed differs"
_CASE = "format names are case-insensitive (formats.get_format lower-cases them)"
_F64_IN = "every caller passes float64 arrays, which np.asarray keeps as they are"
_KERNEL_QUIET = ("round_out rounds only 'down' and 'up', which run rounding's integer kernel: no "
                 "floating-point exception to silence")
_F64_CLAMP = "for float64 the clamps compare with max64: only infinities pass it, and they are kept"
_EMPTY_KEPT = ("an empty element's ends are already +inf / -inf here, and canonical() empties any "
               "lo > hi: the same Interval")
_ANY = "'any' is the fall-through case of _extremes: any other name means 'any'"
EQUIVALENT: dict[tuple[str, str, str], str] = {
    ("scaling", "x_smallest_surviving_gradient",
     'def smallest_surviving_gradient(scale: float, fmt="FLOAT16", floor: str = "zero") -> float:'):
        "format names are case-insensitive (formats.get_format lower-cases them)",
    ("scaling", "x_forward_loss_split", 'out[what] = float(emulate.mse_loss(h, y, "FLOAT32"))'):
        "format names are case-insensitive (formats.get_format lower-cases them)",
    ("scaling", "x_compare_with_gradscaler", "raw[bad, rng.integers(0, width, bad.size)] = None"):
        "plants NaN instead of a random +-inf/NaN: either makes both scalers skip the step, and "
        "no output records the planted value",
    ("scaling", "x_compare_with_gradscaler",
     "raw[bad, rng.integers(0, width, )] = rng.choice([np.inf, -np.inf, np.nan], bad.size)"):
        "plants the non-finite value in one column for every bad step instead of a random one: "
        "the step is skipped either way and no output records where",
    ("scaling", "x_train_scaled", "opt.zero_grad(set_to_none=False)"):
        "zeroed instead of dropped gradients: backward then stores 0 + g = g (only a -0.0 "
        "gradient would read +0.0, which no update, check or record tells apart)",
    ("rounding_kernel", "x_python_words",
     "dst[:] = [word(v, rnd, *params, mode) for v, rnd in zip(src.tolist(), rnds, strict=False)]"):
        "both lists always have src.size entries, so strict never fires",
    ("rounding", "x__to_numpy",
     'elif a.dtype.itemsize <= 3 and (a.dtype.kind == "f" or a.dtype.name in FORMATS):'):
        "no float dtype or ml_dtypes format is 3 bytes wide",
    ("rounding_native", "x_native_dtype",
     'if fmt.torch_dtype is None or fmt.name in ("FLOAT32", "float64") or not fmt.signed:'):
        "a float32 target from a float32 input: torch's float32 -> float32 cast is the identity, "
        "the bits round_to's copy gives",
    ("rounding_kernel", "x_emulate_into",
     "uniform = fmt.emin + c.bias < 1  # fmt's normal range reaches down to the container's"):
        _SAME_BITS + " (the general word kernel for bfloat16/tf32, whose shift is then constant)",
    ("rounding_kernel", "x_emulate_into", "python_words(src, dst, params, code, seed, None)"):
        _SAME_BITS + " (the general word kernel instead of the uniform one)",
    ("rounding", "x_round_to", 'or (backend == "AUTO" and auto_takes_native(a, fmt))):'):
        _SAME_BITS + " (the kernel instead of the exact library cast)",
    ("rounding", "x_round_to", 'or (backend == "auto" and not auto_takes_native(a, fmt))):'):
        _SAME_BITS + " (the kernel and the exact library cast trade places)",
    ("rounding", "x__as_float64",
     "lambda r: torch.from_numpy(np.asarray(r, dtype=np.float64)).to(None))"):
        "on a CPU-only machine .to(device) and .to(None) are the same (a CUDA input would "
        "come back on the CPU)",
    ("rounding_kernel", "x__round_word_uniform", "r = (mag + _increment(None, rnd, mask, lsb, neg, mode)) & ~mask"):
        "_increment never reads its first argument (mag)",
    ("rounding_kernel", "x__round_word", "r = (mag + _increment(None, rnd, mask, lsb, neg, mode)) & ~mask"):
        "_increment never reads its first argument (mag)",
    ("rounding_kernel", "x__round_word", "thr = (sig << max(63 - sh, 0)) >> min(max(sh - 63, 0), 64)"):
        "the cap matters only for sh > 126, where sig < 2^53 shifted right by 63 or 64 is 0 either way",
    # ------------------------------------------------------------------ the interval rules
    ("intervals/interval", "xǁIntervalǁ__init__",
     "flag = np.zeros(lo.shape, dtype=bool) if (nan is None) and False else np.broadcast_to("):
        "np.asarray(None, dtype=bool) is False: broadcasting it gives the same all-False flags",
    ("intervals/interval", "x_canonical",
     "lo, hi, nan = np.where(empty, INF, lo), np.where(None, -INF, hi), np.asarray(nan) | empty"):
        "every caller already sets hi = -inf on the elements canonical finds empty",
    ("intervals/outward", "x_down", "x = np.asarray(x, )"): _F64_IN,
    ("intervals/outward", "x_up", "x = np.asarray(x, dtype=None)"): _F64_IN,
    ("intervals/outward", "x__tree_slack", "return s, np.zeros_like(None)"):
        "np.zeros_like(None) is an object 0, and s - 0, s + 0 are s",
    ("intervals/outward", "x__tree_slack", 'with np.errstate(invalid=None, over="ignore"):'):
        "the second tree sums |t|: nonnegative finite terms never meet inf - inf, so no invalid "
        "operation is left to silence",
    ("intervals/outward", "x__sum_bound", "t = np.asarray(t, dtype=None)"): _F64_IN,
    ("intervals/outward", "x__sum_bound", "if sign <= 0:"): "sign is -1 or +1",
    ("intervals/outward", "x_sum_up", "return _sum_bound(t, +2)"): "_sum_bound only tests sign < 0",
    ("intervals/outward", "x_round_out", 'with np.errstate(over=None, invalid="ignore"):'): _KERNEL_QUIET,
    ("intervals/outward", "x_round_out", 'with np.errstate(over="ignore", invalid=None):'): _KERNEL_QUIET,
    ("intervals/outward", "x_round_out", 'with np.errstate(invalid="ignore"):'): _KERNEL_QUIET,
    ("intervals/outward", "x_round_out",
     'return (np.asarray(round_to(lo, f, "down"), dtype=None).reshape(shape),'):
        "round_to returns float64 for the float64 arrays round_out passes",
    ("intervals/outward", "x_widen", 'if f.name != "XXfloat64XX":'): _F64_CLAMP,
    ("intervals/outward", "x_widen", 'if f.name != "FLOAT64":'): _F64_CLAMP,
    ("intervals/outward", "x_widen",
     "hi2 = np.where(np.isfinite(hi2) & (hi2 <= -f.max_finite), -f.max_finite, hi2)"):
        "where hi2 == -max_finite the replacement is -max_finite itself",
    ("intervals/ops", "x_add", 'def add(a, b, fmt="FLOAT32", ulps=None):'): _CASE,
    ("intervals/ops", "x_mul", 'def mul(a, b, fmt="FLOAT32", ulps=None):'): _CASE,
    ("intervals/ops", "x_sqrt", 'def sqrt(x, fmt="FLOAT32", ulps=None):'): _CASE,
    ("intervals/softmax", "x_softmax", 'def softmax(x, fmt="FLOAT32", ulps=None):'): _CASE,
    ("intervals/ops", "x_mul", "empty = None"): _EMPTY_KEPT,
    ("intervals/ops", "x_mul",
     "return canonical(np.where(None, INF, lo), np.where(empty, -INF, hi), anan | bnan | pnan,"): _EMPTY_KEPT,
    ("intervals/ops", "x_div", "rlo = np.where(None, 1.0, 1.0 / np.where(straddles, 1.0, bhi))"):
        "where b straddles 0 both branches are 1.0 (1 / 1.0)",
    ("intervals/ops", "x_div", "rhi = np.where(straddles, 2.0, 1.0 / np.where(straddles, 1.0, blo))"):
        "where b straddles 0 the corner products are overwritten by [-inf, inf] and the NaN rule",
    ("intervals/ops", "x_sqrt", "lo = np.where(None, INF, np.maximum(lo, 0.0))"): _EMPTY_KEPT,
    ("intervals/ops", "x_exp",
     "lo, hi = widen(exp_down(np.where(None, 0.0, x.lo)), exp_up(np.where(empty, 0.0, x.hi)), fmt, u)"):
        "an empty element's lo is +inf, exp_down(+inf) = +inf, and it is replaced by +inf anyway",
    ("intervals/ops", "x_relu",
     "return canonical(np.where(None, INF, np.maximum(x.lo, 0.0)), np.where(e, -INF, np.maximum(x.hi, 0.0)),"):
        _EMPTY_KEPT,
    ("intervals/ops", "x_where", "c = np.asarray(cond, dtype=None)"):
        "np.where reads any array as truth values, the same ones dtype=bool gives",
    ("intervals/softmax", "x__rows", "empty = None"):
        "an empty element has lo = +inf, which the next test (np.any(lo == INF)) catches",
    ("intervals/softmax", "x__excl_max", "return np.max(np.where(_off(n), v[..., None, :], -INF), axis=-2)"):
        "the shift M cancels in num / (num + rest); M = the entry's own end only overflows a term "
        "when another logit is 709 above it, where softmax_i < e^-709 and the 2^-1000 slack already "
        "takes the lower bound to 0",
    ("intervals/softmax", "x__softmax_range_shifted",
     "rest2 = sum_down(np.where(off, exp_down(down(L[..., None, :] - m2[..., None])), None))"):
        "None becomes NaN in the float64 sum, which treats non-finite terms as 0, the value replaced",
    ("intervals/softmax", "x_softmax", "return canonical(np.where(None, INF, lo), np.where(e, -INF, hi),"):
        _EMPTY_KEPT,
    ("intervals/bounds", "x__stage",
     "if fin_lo.all() or fin_hi.all():  # the common case: no infinity, no empty range"):
        "with one side all finite no element can be +inf for sure or empty, and the infinite ends "
        "then flow through down/up and the partial-sum extremes to the same infinities",
    ("intervals/bounds", "x__stage",
     "if np.isfinite(reach) and reach * 1.001 + 4 * (1.0 if extra is None else float(np.max(extra))) < fmt.max_finite:"):
        "computes the partial-sum extremes in a few more cases, where they stay below reach < max",
    ("intervals/softmax", "x__gap_bounds", 'with np.errstate(invalid="ignore", ):'):
        "the only NumPy arithmetic in that block is 1 + d with d >= 0 (perhaps inf): it cannot overflow",
    ("intervals/bounds", "x__stage", 'with np.errstate(invalid="ignore", over=None):'):
        "slo - extra, shi + extra with a tiny extra cannot overflow (or give inf - inf)",
    ("intervals/bounds", "x__bound_sum", 'slo, shi, snan = _stage(lo, hi, nan, theta, acc, k.mode, "ANY")'):
        _ANY,
    ("intervals/bounds", "x__bound_sum",
     'slo, shi, snan = _stage(plo, phi, pnan, theta, comb, k.mode, "XXanyXX" if k.order == "atomic" else "prefix")'):
        _ANY,
    ("emulate", "x_exp", 'def exp(x: torch.Tensor, prec="FLOAT32") -> torch.Tensor:'):
        "format names are case-insensitive (formats.get_format lower-cases them)",
    ("emulate", "x_mse_loss", 'def mse_loss(x: torch.Tensor, t: torch.Tensor, prec="FLOAT32") -> torch.Tensor:'):
        "format names are case-insensitive (formats.get_format lower-cases them)",
    ("emulate", "x_exp64", "y = torch.where(x >= 709.8, torch.inf, y)"):
        "differs only at x = 709.8, where e^x > max float64 and the formula itself gives inf",
    ("emulate", "x_exp64", "y = torch.where(x <= -745.2, 0.0, y)"):
        "differs only at x = -745.2, where the formula itself gives 0 (e^x < 2^-1075)",
    ("emulate", "x_exp64", "y = torch.where(x < -746.2, 0.0, y)"):
        "on [-746.2, -745.2) e^x < 2^-1075 and the formula itself gives 0 (checked on a 2e5-point grid)",
    ("emulate", "x_log64", "p = torch.full_like(s, LOG_COEF[-2])"):
        "harmless: moves the s^24 term (|s| <= 0.172) by < 6e-22, under 1e-5 ulp; no bit changed "
        "on 10^6 random inputs",
    ("emulate", "xǁ_GroupNormǁforward", "y = y + _channel_view(prec.round(b).to(None), xr)"):
        "the float32 bias is promoted to float64 by the addition: the same values",
    ("emulate", "xǁ_Linearǁforward", "acc = acc + prec.round(b).to(None)"):
        "the bias is promoted to the accumulator's dtype by the addition: the same values",
    ("emulate", "xǁ_GroupNormǁbackward", "if ctx.has[0] or ctx.needs_input_grad[2]:"):
        "has[0] is False only when weight is None, where needs_input_grad[2] is False too; "
        "otherwise it only adds a gradient for a weight that needs none, which autograd drops",
    ("emulate", "xǁ_LogSoftmaxǁbackward", "return prec.round(g - exp64(y) * fixed_sum(g, keepdim=True)), None"):
        "fixed_sum's default dim is -1",
    ("world", "x_autocast_batch", 'mids = (bs + np.asarray(next_up(bs, "BFLOAT16"))) / 2'):
        "format names are case-insensitive (formats.get_format lower-cases them)",
    ("world", "x_autocast_batch", 'p = np.asarray(next_down(mids, "FLOAT32"))'):
        "format names are case-insensitive (formats.get_format lower-cases them)",
    ("world", "x_boundary_rollout",
     'def boundary_rollout(fmt="BFLOAT16", policy: str = "low_precision", low="bfloat16", T: int = 4,'):
        "format names are case-insensitive (formats.get_format lower-cases them)",
    ("world", "x_boundary_rollout", "return rollout(world, y0, k, T, )"):
        "rollout's default loss is 'penetration'",
    ("world", "x_torch_autocast_rollout", "kk = torch.tensor(float(k), dtype=None, requires_grad=True)"):
        "torch's default dtype is float32 and the package never changes it",
    ("world", "x_torch_autocast_rollout", 'with torch.autocast("cpu", enabled=bool(autocast)):'):
        "CPU autocast's default dtype is bfloat16",
    ("world", "x_torch_autocast_rollout", "grad = 0.0 if (g is None) and False else float(g)"):
        "g is never None: the gradient is taken only when the loss requires grad, which only k gives it",
    ("world", "x_contact_boundary", "if not a <= mid < b:"):
        "mid == a cannot happen: the loop runs while next_up(a) < b, so (a + b)/2 rounds to >= next_up(a)",
    ("world", "x_rollout", "k_leaf = torch.tensor(k_np, dtype=None, requires_grad=True)"):
        "k_np is float64 (from _lanes), and torch.tensor keeps a NumPy array's dtype",
    ("world", "x_rollout", "first_contact = np.full(lanes, -1, dtype=None)"):
        "NumPy's default integer is int64 (NumPy 2, every platform)",
    ("world", "x_exact_decision",
     "bound = 2 * (n + 2) * 2.0**-f.precision * np.maximum(s, thr) + n * f.min_subnormal"):
        "a wider bound only sends more lanes to the exact sum, whose decision equals the rounded "
        "one outside the true bound: only cost changes",
    ("world", "x_solve", "last_m = np.full(lanes, None)"):
        "every lane is active at the first test, so last_m is overwritten with floats before any use",
    ("world", "x_stiffness_map", 'with np.errstate(over="ignore", invalid=None):'):
        "harmless: only whether NumPy warns about an invalid value in a diverged rollout; no value changes",
}
# Survivors that change an output but not its soundness (a bound a little looser or tighter
# where a margin covers it): listed with the reason, and counted against both rates.
HARMLESS: dict[tuple[str, str, str], str] = {
    ("intervals/outward", "x__tree_slack", "return s, a * ((depth + 2) * 2.0**-53) + TINY"):
        "halves a float64 sum's error allowance, which carries a factor-2 margin over gamma_depth",
    ("intervals/softmax", "x__gap_bounds",
     "slack = up(np.max(mag, axis=-1) * 2.0**-46 + 2.0**-1001)[..., None]"):
        "halves an absolute 2^-1000 allowance for float64 errors of 2^-1074 size",
    ("intervals/softmax", "x__f64_slack", "return (down(lo - np.abs(lo) * 2.0**-40 - 3.0**-1000),"):
        "drops an absolute 2^-1000 allowance; down() still moves the bound by a float64 step",
    ("intervals/softmax", "x_softmax", "s_lo = np.where(None, s_lo, t_lo)"):
        "takes the shifted form's lower bound on every row: as rigorous, different by float64 steps",
    ("intervals/softmax", "x_cross_entropy", "lo, hi = _f64_slack(lo, hi, None)"):
        "drops the float64 result's 2^-40 allowance; log_down/log_up already allow 2^-44 relative, "
        "more than the few float64 steps the execution errs by",
    ("intervals/bounds", "x__extremes", "k = np.arange(1, None)"):
        "the float64 running sums' error allowance shrinks to 2 steps; partial sums of values in the "
        "format are exact in float64 unless the sum is huge",
    ("intervals/bounds", "x__stage", "neg_over = (pmin < -fmt.max_finite) | ninf_may"):
        "pmin is rounded down, so it equals -max_finite only for a partial sum one float64 step above it",
    ("intervals/bounds", "x__bound_sum",
     'tiles = -(-n / k.tile(n)) if k.order in ("split_k", "atomic", "blocked") else 1'):
        "a fractional tile count when the tile does not divide n: the absolute allowance shrinks by "
        "less than one tile's, inside its factor-2 margin",
}

CONFTEST = '''

# --- added by scripts/mutation_run.py in the temporary copy only ---
@pytest.fixture(autouse=True)
def _mutation_run_no_numba_tier(monkeypatch):
    """Keep rounding off its numba tier: numba cannot compile mutmut's trampolines."""
    import precisionlab.rounding_kernel as _k
    if not hasattr(_k, "NUMBA_MIN_SIZE"):
        raise RuntimeError("scripts/mutation_run.py: rounding_kernel.NUMBA_MIN_SIZE is gone; "
                           "update CONFTEST")
    monkeypatch.setattr(_k, "NUMBA_MIN_SIZE", float("inf"))


@pytest.fixture(autouse=True, scope="session")
def _mutation_run_fresh_caches():
    """Each mutant's run is forked from a process that ran the tests: empty its functools caches."""
    import sys
    for name, mod in list(sys.modules.items()):
        if name.startswith("precisionlab"):
            for v in list(vars(mod).values()):
                if callable(getattr(v, "cache_clear", None)):
                    v.cache_clear()
'''


def _check_choice(value, name, choices):
    if value not in choices:
        raise SystemExit(f"{name}={value!r} is not known; valid choices: {', '.join(choices)}")
    return value


def resolve(arg: str) -> tuple[str, list[str]]:
    """(module key, source files relative to the root) for a path or short name."""
    key = arg.strip().rstrip("/")
    for prefix in (PACKAGE + "/", "precisionlab/"):
        key = key.removeprefix(prefix)
    key = key.removesuffix(".py").replace(".", "/")
    _check_choice(key, "module", sorted(TESTS))
    folder, file = ROOT / PACKAGE / key, ROOT / PACKAGE / f"{key}.py"
    if folder.is_dir():
        files = sorted(str(p.relative_to(ROOT)) for p in folder.rglob("*.py"))
    elif file.is_file():
        files = [str(file.relative_to(ROOT))]
    else:
        raise SystemExit(f"module={arg!r}: neither {file} nor the folder {folder} exists")
    return key, files


def enumerate_mutants(files: list[str]) -> dict[str, list[str]]:
    """file -> mutmut's full mutant names, made by mutmut's own generator (cwd: the copy)."""
    from mutmut.mutation.file_mutation import mutate_file_contents
    from mutmut.utils.format_utils import get_mutant_name

    out = {}
    for f in files:
        made = mutate_file_contents(f, Path(f).read_text())
        out[f] = [get_mutant_name(Path(f), n) for n in made.mutant_names]
    return out


def function_of(name: str) -> str:
    """The mangled function of a mutant name: 'x_add' or 'xǁIntervalǁ__init__'."""
    return name.partition("__mutmut_")[0].rpartition(".")[2]


def wilson(k: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """95% Wilson score interval for a proportion k/n."""
    if n == 0:
        return (0.0, 1.0)
    p = k / n
    d = 1 + z * z / n
    c = (p + z * z / (2 * n)) / d
    h = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / d
    return (max(0.0, c - h), min(1.0, c + h))


def _copy(dst: Path, key_tests: tuple[str, ...], files: list[str]) -> list[str]:
    """Copy src/, tests/, pyproject.toml with a [tool.mutmut] table; the test files that exist."""
    shutil.copytree(ROOT / "src", dst / "src", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    shutil.copytree(ROOT / "tests", dst / "tests", ignore=shutil.ignore_patterns("__pycache__"))
    with open(dst / "tests" / "conftest.py", "a") as f:
        f.write(CONFTEST)
    tests = [t for t in key_tests if (ROOT / t).is_file()]
    text = (ROOT / "pyproject.toml").read_text()
    if "[tool.mutmut]" in text:
        raise SystemExit("pyproject.toml already has [tool.mutmut]; this script writes its own")
    cli = ["-p", "no:cacheprovider", "--hypothesis-seed=0", "-k", DESELECT]
    text += ("\n[tool.mutmut]\n"
             'source_paths = ["src"]\n'
             f"only_mutate = {json.dumps(files)}\n"
             f"pytest_add_cli_args_test_selection = {json.dumps(tests)}\n"
             f"pytest_add_cli_args = {json.dumps(cli)}\n"
             "use_git_change_detection = false\n"
             # a mutant whose tests take 6x their measured time (mutmut: 30x) is looping
             "timeout_multiplier = 3.0\n")
    (dst / "pyproject.toml").write_text(text)
    (dst / "mutants" / "src").mkdir(parents=True)  # on PYTHONPATH before the interpreter starts
    return tests


def _status_line(log: Path) -> str:
    """mutmut's last progress line ('n/N  killed ... survived ...') from its log."""
    try:
        tail = log.read_bytes()[-600:].decode("utf-8", "replace")
    except OSError:
        return ""
    parts = [p.strip() for p in tail.replace("\r", "\n").split("\n") if "/" in p and "🎉" in p]
    return parts[-1] if parts else ""


def run_group(modules: dict[str, list[str]], tests: tuple[str, ...], args, tmp: Path) -> dict:
    """One mutmut session over modules (key -> files) sharing the test files; per-module results."""
    from mutmut.configuration import reset_config
    from mutmut.stats import status_by_exit_code

    dst = tmp / "-".join(k.replace("/", "_") for k in modules)
    files = [f for fs in modules.values() for f in fs]
    used = _copy(dst, tests, files)
    here = os.getcwd()
    os.chdir(dst)
    try:
        reset_config()
        names_by_file = enumerate_mutants(files)
    finally:
        os.chdir(here)
    chosen, info = [], {}
    for key, fs in modules.items():
        excluded = EXCLUDED.get(key, {})
        every = [n for f in fs for n in names_by_file[f]]
        eligible = [n for n in every if function_of(n) not in excluded]
        k = len(eligible) if args.sample <= 0 else min(args.sample, len(eligible))
        pick = sorted(random.Random(f"{args.seed}:{key}").sample(eligible, k),
                      key=eligible.index)
        if args.rerun:  # only the survivors of an earlier run (same source: same names)
            earlier = json.loads(args.rerun.read_text())["modules"].get(key, {}).get("survivors", [])
            pick = [n for n in eligible if n in {s["mutant"] for s in earlier}]
        chosen += pick
        info[key] = {"files": fs, "tests": used, "mutants_total": len(every),
                     "excluded_functions": excluded,
                     "excluded_mutants": len(every) - len(eligible),
                     "sampled": len(pick), "names": pick}
    env = {**os.environ, "PYTHONPATH": str(dst / "mutants" / "src"), "OMP_NUM_THREADS": "1",
           "MKL_NUM_THREADS": "1", "NUMBA_NUM_THREADS": "1", "NUMBA_CACHE_DIR": str(dst / "numba"),
           "PYTHONDONTWRITEBYTECODE": "1"}
    if not chosen:  # mutmut run without names would run every mutant
        return {key: _summarise(key, fs, {}, info[key], 0.0) for key, fs in modules.items()}
    cmd = [shutil.which("mutmut") or "mutmut", "run", "--max-children", str(args.max_children), *chosen]
    print(f"== {', '.join(modules)}: {len(chosen)} mutants, tests {' '.join(used)}", flush=True)
    log = dst / "mutmut.log"
    t0 = time.monotonic()
    with open(log, "wb") as fh:
        proc = subprocess.Popen(cmd, cwd=dst, env=env, stdout=fh, stderr=subprocess.STDOUT)
        while proc.poll() is None:
            time.sleep(5)
            if int(time.monotonic() - t0) % args.progress < 5:
                print(f"   {time.monotonic() - t0:6.0f} s  {_status_line(log)}", flush=True)
    wall = time.monotonic() - t0
    if proc.returncode != 0:
        print(log.read_bytes()[-4000:].decode("utf-8", "replace").replace("\r", "\n"))
        raise SystemExit(f"mutmut exited {proc.returncode} for {', '.join(modules)} (log above)")
    os.chdir(dst)
    try:
        results = {}
        for key, fs in modules.items():
            codes = {}
            for f in fs:
                meta = json.loads((Path("mutants") / (f + ".meta")).read_text())
                codes.update(meta["exit_code_by_key"])
            statuses = {n: status_by_exit_code[codes.get(n)] for n in info[key]["names"]}
            results[key] = _summarise(key, fs, statuses, info[key], wall / len(modules))
    finally:
        os.chdir(here)
    return results


def _diff(name: str, path: str) -> tuple[list[str], list[str]]:
    """The removed and added source lines of one mutant (cwd: the copy)."""
    from mutmut.mutation.diff_apply import get_diff_for_mutant

    lines = get_diff_for_mutant(name, path=Path(path)).splitlines()[2:]
    old = [ln[1:] for ln in lines if ln.startswith("-")]
    new = [ln[1:] for ln in lines if ln.startswith("+")]
    return old, new


def _line_of(path: str, func: str, old: list[str]) -> int | None:
    """The line number of the first removed line, searched from the function's def."""
    src = Path(path).read_text().splitlines()
    bare = func.split("ǁ")[-1] if "ǁ" in func else func[2:]
    start = 0
    for node in ast.walk(ast.parse("\n".join(src))):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == bare:
            start = node.lineno - 1
            break
    if old:
        for i in range(start, len(src)):
            if src[i].strip() == old[0].strip():
                return i + 1
    return start + 1


def _summarise(key, files, statuses, info, wall) -> dict:
    """Counts, rates and the survivors of one module."""
    count = {s: sum(1 for v in statuses.values() if v == s)
             for s in ("killed", "survived", "timeout", "no tests")}
    count["other"] = len(statuses) - sum(count.values())
    file_of = {n: f for f in files for n in statuses if n.startswith(_module_name(f) + ".")}
    survivors = []
    for n, s in statuses.items():
        if s in ("killed", "timeout"):
            continue
        f = file_of.get(n, files[0])
        func = function_of(n)
        old, new = _diff(n, f)
        keys = [(key, func, x.strip()) for x in new]
        why = next((EQUIVALENT[k] for k in keys if k in EQUIVALENT), None)
        harm = next((HARMLESS[k] for k in keys if k in HARMLESS), None)
        survivors.append({"mutant": n, "status": s, "function": func, "file": f,
                          "line": _line_of(f, func, old), "old": [o.strip() for o in old],
                          "new": [x.strip() for x in new], "equivalent": why, "harmless": harm})
    n = len(statuses)
    killed = count["killed"] + count["timeout"] + count["other"]
    equiv = sum(1 for s in survivors if s["equivalent"])
    lo, hi = wilson(killed, n)
    return {**{k: v for k, v in info.items() if k != "names"}, "counts": count, "killed": killed,
            "rate": killed / n if n else None,
            "rate_adjusted": killed / (n - equiv) if n - equiv else None,
            "equivalent": equiv, "rate_95ci": [lo, hi], "wall_s_share": round(wall, 1),
            "survivors": survivors}


def _module_name(path: str) -> str:
    return str(Path(path).with_suffix("")).removeprefix("src/").replace("/", ".").replace(".__init__", "")


def _pct(rate) -> str:
    return "     -" if rate is None else f"{rate:6.1%}"


def report(results: dict) -> None:
    """The table per module and every survivor."""
    head = (f"{'module':20} {'mutants':>7} {'excl':>5} {'sampled':>7} {'killed':>6} {'surv':>5} {'t/o':>4} "
            f"{'no-t':>4} {'rate':>6} {'adj':>6}  95% CI (raw)")
    print()
    print(head)
    print("-" * len(head))
    for key, r in results.items():
        c = r["counts"]
        print(f"{key:20} {r['mutants_total']:7} {r['excluded_mutants']:5} {r['sampled']:7} {r['killed']:6} "
              f"{c['survived']:5} "
              f"{c['timeout']:4} {c['no tests']:4} {_pct(r['rate'])} {_pct(r['rate_adjusted'])}  "
              f"[{r['rate_95ci'][0]:.1%}, {r['rate_95ci'][1]:.1%}]")
    for key, r in results.items():
        if not r["survivors"]:
            continue
        print(f"\nsurvivors in {key}:")
        for s in r["survivors"]:
            tag = (f"  [equivalent: {s['equivalent']}]" if s["equivalent"]
                   else f"  [harmless: {s['harmless']}]" if s["harmless"] else "")
            print(f"  {s['mutant'].rpartition('.')[2]} ({s['status']}) {s['file']}:{s['line']}{tag}")
            for o in s["old"]:
                print(f"      - {o}")
            for x in s["new"]:
                print(f"      + {x}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("modules", nargs="*", help="paths or short names (see --list)")
    ap.add_argument("--list", action="store_true", help="print the modules and their tests")
    ap.add_argument("--sample", type=int, default=150, help="mutants per module (0: all)")
    ap.add_argument("--seed", type=int, default=0, help="seed of the sample")
    ap.add_argument("--max-children", type=int, default=1, help="parallel mutmut workers")
    ap.add_argument("--min-rate", type=float, default=0.90, help="exit 1 below this rate")
    ap.add_argument("--rate", default="adjusted", choices=["raw", "adjusted"],
                    help="which rate --min-rate checks")
    ap.add_argument("--progress", type=int, default=60, help="seconds between progress lines")
    ap.add_argument("--rerun", type=Path, help="test only the survivors listed in this result file")
    ap.add_argument("--out", type=Path, default=OUT, help="JSON result file")
    ap.add_argument("--no-save", action="store_true")
    args = ap.parse_args(argv)
    if args.list:
        for key, tests in TESTS.items():
            print(f"{key:20} {' '.join(tests)}")
        return 0
    if not args.modules:
        ap.error("name at least one module (see --list)")
    try:
        import mutmut
    except ImportError:
        raise SystemExit(f"mutmut is not installed: {INSTALL}") from None
    groups: dict[tuple[str, ...], dict[str, list[str]]] = {}
    for m in args.modules:
        key, files = resolve(m)
        groups.setdefault(TESTS[key], {})[key] = files
    t0 = time.monotonic()
    results = {}
    with tempfile.TemporaryDirectory(prefix="mutation_run_") as tmp:
        for tests, modules in groups.items():
            results.update(run_group(modules, tests, args, Path(tmp)))
    wall = time.monotonic() - t0
    report(results)
    print(f"\nwall time {wall / 60:.1f} min, mutmut {mutmut.__version__}, --max-children "
          f"{args.max_children}, sample {args.sample or 'all'} (seed {args.seed})")
    if not args.no_save:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({
            "tool": f"mutmut {mutmut.__version__}", "install": INSTALL,
            "command": "python3 scripts/mutation_run.py " + " ".join(argv if argv is not None else sys.argv[1:]),
            "python": sys.version.split()[0], "wall_s": round(wall, 1), "sample": args.sample,
            "seed": args.seed, "max_children": args.max_children, "deselect": DESELECT,
            "rate": "killed (failed or timed out) / mutants tested; no-tests and survivors count against",
            "modules": results}, indent=1, ensure_ascii=False) + "\n")
        print(f"wrote {args.out.relative_to(ROOT) if args.out.is_relative_to(ROOT) else args.out}")
    which = "rate" if args.rate == "raw" else "rate_adjusted"
    low = [k for k, r in results.items() if r[which] is not None and r[which] < args.min_rate]
    if low:
        print(f"below --min-rate {args.min_rate:.0%} ({args.rate}): {', '.join(low)}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
