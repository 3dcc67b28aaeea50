"""The fast nearest-even paths against the generic recipe, bit for bit, on float32 bit patterns.

Three computations of fl(x) for float32 x, rounded to nearest even, must give the same 32
bits for every pattern, NaNs included (the quiet NaN with x's sign):

* ``native``: torch's cast there and back (round_to's backend="native"), where torch has the
  format: float16, bfloat16, float8_e5m2, float8_e4m3fn (with torch's own overflow rule);
* ``float32 kernel``: what backend="auto"/"emulated" runs from 4096 values on: for formats
  whose emin is above float32's, the fused `_nearest_f32_loop` (integer add-then-clear for
  normals, float32 addition onto the subnormal grid below), else the uniform recipe;
* ``float64 recipe``: the generic `_round_word` (variable shift, tiny case) on the same
  values widened to float64 words, a different container and a different route;
* ``integer float32 loop``: for float16 on a CPU where the float32 kernel is the hardware
  round trip (`rounding_kernel.hardware_half`: F16C), the integer loop the kernel is
  otherwise, built directly; under both overflow rules (inf, and saturating at 65504).

torch's casts are checked under every ATEN_CPU_CAPABILITY this CPU runs (a subprocess each),
since each dispatch level has its own vectorised conversion code. The suite checks a sample
(every exponent with the mantissas at every rounding boundary, plus random patterns);
``python tests/test_rounding_native.py --exhaustive`` checks all 2^32 patterns in chunks.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time

import numpy as np
import pytest
import torch

from precisionlab import rounding_kernel as rk
from precisionlab.formats import get_format
from precisionlab.rounding import round_to

NATIVE = ["float16", "bfloat16", "float8_e5m2", "float8_e4m3fn"]
KERNEL_ONLY = ["float6_e3m2fn", "float6_e2m3fn", "float4_e2m1fn"]  # no torch dtype to compare
CAPABILITIES = ["default", "avx2", "avx512"]
CHUNK = 1 << 24


def boundary_patterns() -> np.ndarray:
    """uint32 patterns: both signs, every exponent field, mantissas at each shift's boundaries.

    For every number of dropped bits s (1..23): a tie (half), one either side of it, the
    last dropped pattern, with the kept lsb even and odd; plus 0, 1 and all-ones mantissas
    (zeros, the smallest subnormals, inf, NaN payloads, the largest values of each binade).
    """
    mant = {0, 1, 2, (1 << 23) - 1, (1 << 22), (1 << 22) + 1}
    for s in range(1, 24):
        half = 1 << (s - 1)
        for kept in (0, 1 << s, 3 << s, ((1 << 23) - 1) & ~((1 << s) - 1)):
            for d in (half - 1, half, half + 1, (1 << s) - 1, 1):
                mant.add((kept + d) & ((1 << 23) - 1))
    m = np.array(sorted(mant), dtype=np.uint32)
    e = np.arange(256, dtype=np.uint32) << np.uint32(23)
    p = (e[:, None] | m[None, :]).ravel()
    return np.concatenate([p, p | np.uint32(1 << 31)])


def sample_patterns(n_random: int = 1 << 18, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    rand = rng.integers(0, 2**32, size=n_random, dtype=np.uint64).astype(np.uint32)
    return np.concatenate([boundary_patterns(), rand])


def native_saturates(name: str) -> bool | None:
    """The overflow rule of torch's cast into name (False: inf/NaN), None if it has no exact one."""
    for sat in (False, True):
        try:
            round_to(np.ones(8, np.float32), name, backend="native", saturate=sat)
            return sat
        except ValueError:
            pass
    return None


def integer_nearest_loop(x: np.ndarray, name: str, saturate: bool) -> np.ndarray:
    """fl(x) to nearest even by the integer float32 loop (`_nearest_f32_loop`), as uint32."""
    out = np.empty(x.size, dtype=np.uint32)
    kernel = rk.numba_kernel(rk.NEAREST_EVEN, False, False, rk.F32, half=False)
    kernel(x, x.view(np.int32), out.view(np.int32), *rk.nearest_params(get_format(name), saturate))
    return out


def mismatches(words: np.ndarray, results: dict, ref: np.ndarray, what: str) -> list[str]:
    """One line per result that differs from ref: how many patterns, and the first of them."""
    bad = []
    for label, r in results.items():
        diff = np.flatnonzero(r != ref)
        if diff.size:
            i = diff[0]
            bad.append(f"{what}: {label} differs from the reference on {diff.size} patterns,"
                       f" first {words[i]:#010x}: {r[i]:#010x} vs {ref[i]:#010x}")
    return bad


def compare(words: np.ndarray, name: str, saturate: bool | None = None) -> list[str]:
    """The computations on float32 patterns `words`; a description of each mismatch.

    saturate: the overflow rule (None: torch's own for its formats, else inf/NaN; float4 and
    float6 always saturate); the native cast is compared only under torch's own rule.
    """
    fmt = get_format(name)
    x = words.view(np.float32)
    sat = native_saturates(name) if name in NATIVE else None
    if saturate is None:
        saturate = bool(sat)
    saturate = saturate or not fmt.has_nan
    assert x.size >= 4096  # the numba tier, where the fused loop runs
    with np.errstate(invalid="ignore", over="ignore"):
        kernel = round_to(x, fmt, backend="emulated", saturate=saturate).view(np.uint32)
        auto = round_to(x, fmt, saturate=saturate).view(np.uint32)
        wide = round_to(x.astype(np.float64), fmt, backend="emulated", saturate=saturate)
        wide = wide.astype(np.float32).view(np.uint32)  # exact: fmt's values are float32s
    results = {"auto": auto, "float64 recipe": wide}
    if rk.is_binary16(fmt) and rk.hardware_half():
        results["integer float32 loop"] = integer_nearest_loop(x, name, saturate)
    if sat is not None and name in NATIVE and bool(sat) == saturate:
        results["native"] = round_to(x, fmt, backend="native", saturate=saturate).view(np.uint32)
    return mismatches(words, results, kernel, f"{name} (reference: the float32 kernel)")


@pytest.mark.filterwarnings("ignore:.*encountered in:RuntimeWarning")
@pytest.mark.parametrize("name", NATIVE + KERNEL_ONLY)
def test_fast_nearest_even_paths_agree_bit_for_bit_on_boundary_patterns(name):
    assert compare(sample_patterns(), name) == []


@pytest.mark.filterwarnings("ignore:.*encountered in:RuntimeWarning")
@pytest.mark.parametrize("saturate", [False, True])
def test_float16_overflow_rules_agree_bit_for_bit_on_boundary_patterns(saturate):
    """float16 both ways: overflow to inf (IEEE, torch's cast) and saturating at 65504."""
    assert compare(sample_patterns(), "float16", saturate) == []


def test_float16_takes_the_hardware_round_trip_where_the_cpu_has_f16c(monkeypatch):
    """On an x86-64 host with F16C (and numba compiling for it) float16 nearest-even builds
    the hardware loop; the bits are the suites' above. Elsewhere the integer loop."""
    import platform

    from llvmlite import binding
    from numba.core import config

    f16c = bool(binding.get_host_cpu_features().get("f16c", False))
    host = config.CPU_NAME is None and config.CPU_FEATURES is None
    x86 = platform.machine().lower() in ("x86_64", "amd64")
    assert rk.hardware_half() == (f16c and host and x86)
    built = []
    real = rk.numba_kernel
    monkeypatch.setattr(rk, "numba_kernel", lambda *a: built.append(a) or real(*a))
    round_to(np.linspace(-7e4, 7e4, 5000, dtype=np.float32), "float16")
    round_to(np.linspace(-7e4, 7e4, 5000, dtype=np.float32), "bfloat16")
    assert [a[-1] for a in built] == [rk.hardware_half(), False]


_GENERIC_CPU_PROGRAM = """
import hashlib, sys, numpy as np
sys.path.insert(0, {tests!r})
from test_rounding_native import sample_patterns
from precisionlab.rounding import round_to
x = sample_patterns(1 << 16).view(np.float32)
with np.errstate(all="ignore"):
    r = [round_to(x, "float16", saturate=s) for s in (False, True)]
    r += [round_to(x, n, "stochastic", generator=np.random.default_rng(3))  # 32-bit lanes
          for n in ("float16", "float8_e5m2")]
print(hashlib.sha256(b"".join(a.tobytes() for a in r)).hexdigest())
"""


def test_float16_falls_back_where_numba_targets_are_set_even_empty(tmp_path):
    """NUMBA_CPU_NAME= and NUMBA_CPU_FEATURES= (set, empty) make numba compile for a bare
    target without F16C: the integer loop must run there (the hardware one would crash)."""
    program = _GENERIC_CPU_PROGRAM.format(tests=os.path.dirname(os.path.abspath(__file__)))
    program += "from precisionlab.rounding_kernel import hardware_half\nprint(hardware_half())\n"
    env = {**os.environ, "NUMBA_CPU_NAME": "", "NUMBA_CPU_FEATURES": "",
           "NUMBA_CACHE_DIR": str(tmp_path)}
    run = subprocess.run([sys.executable, "-c", program], env=env, capture_output=True,
                         text=True, timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    digest, flag = run.stdout.split()[-2:]
    assert flag == "False"
    here = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True,
                          timeout=300, env={**os.environ, "NUMBA_CACHE_DIR": str(tmp_path / "h")})
    assert here.returncode == 0, here.stderr
    assert here.stdout.split()[-2] == digest


def test_float16_and_stochastic_rounding_give_the_same_bits_on_a_generic_numba_cpu(same_bits):
    """NUMBA_CPU_NAME=generic (no F16C: the integer loop; SSE2's 4 lanes for the stochastic
    loop's 32-bit steps) and every dispatch level: one digest."""
    program = _GENERIC_CPU_PROGRAM.format(tests=os.path.dirname(os.path.abspath(__file__)))
    same_bits(program, library_kernels=True)


@pytest.mark.filterwarnings("ignore:.*encountered in:RuntimeWarning")
@pytest.mark.parametrize("name", NATIVE)
def test_short_float32_tensors_take_torch_casts_with_the_kernels_bits(name):
    """Below 4096 values a float32 tensor is cast in torch (no NumPy trip): the NumPy tier's bits."""
    sat = bool(native_saturates(name))
    words = sample_patterns(1 << 14)
    for chunk in np.array_split(words, -(-words.size // 4000)):
        x = chunk.view(np.float32).reshape(-1, 8) if chunk.size % 8 == 0 else chunk.view(np.float32)
        t = torch.from_numpy(x.copy())
        got = round_to(t, name, saturate=sat)
        assert isinstance(got, torch.Tensor) and got.dtype == torch.float32 and got.shape == t.shape
        with np.errstate(invalid="ignore", over="ignore"):
            want = round_to(x, name, backend="emulated", saturate=sat)
        assert np.array_equal(got.numpy().view(np.uint32), want.view(np.uint32)), name


def float64_patterns_around_float32(n_random: int = 1 << 14, seed: int = 1) -> np.ndarray:
    """float64 values at float32's hard places: ties, a double ulp either side, subnormals,
    overflow's edge, +-inf, NaNs with payloads and both signs, and random words."""
    rng = np.random.default_rng(seed)
    f32 = boundary_patterns().view(np.float32)
    f32 = f32[np.isfinite(f32)].astype(np.float64)
    up = np.nextafter(f32.astype(np.float32), np.float32(np.inf)).astype(np.float64)
    ties = (f32 + up) / 2  # exact: float32 neighbours' midpoint fits in float64
    ties = ties[np.isfinite(ties)]
    near = np.concatenate([np.nextafter(ties, np.inf), np.nextafter(ties, -np.inf)])
    big = float(np.finfo(np.float32).max)
    edge = np.array([big, big * (1 + 2.0**-25), np.nextafter(big * (1 + 2.0**-25), 0), 2.0**128,
                     2.0**-150, np.nextafter(2.0**-150, 1), 2.0**-149 * 1.5, np.inf, -np.inf, 0.0, -0.0])
    nan_words = np.array([0x7FF8000000000000, 0xFFF8000000000000, 0x7FF0000000000001,
                          0xFFF4000000000123], dtype=np.uint64)
    words = rng.integers(0, 2**64, n_random, dtype=np.uint64, endpoint=False)
    x = np.concatenate([f32, ties, near, edge, -edge, nan_words.view(np.float64), words.view(np.float64)])
    return x


@pytest.mark.filterwarnings("ignore:.*encountered in:RuntimeWarning")
def test_float64_tensors_round_to_float32_in_torch_with_the_kernels_bits():
    """A float64 CPU tensor rounds to float32 by torch's cast, with the integer kernel's bits
    (NaN included) and NumPy's C conversion's values, on ties and at the overflow edge."""
    x = float64_patterns_around_float32()
    got = round_to(torch.from_numpy(x.copy()), "float32")
    assert isinstance(got, torch.Tensor) and got.dtype == torch.float64
    want = round_to(x, "float32", backend="emulated")
    assert np.array_equal(got.numpy().view(np.uint64), want.view(np.uint64))
    finite = ~np.isnan(x)
    assert np.array_equal(got.numpy()[finite], x[finite].astype(np.float32).astype(np.float64))
    assert np.isnan(got.numpy()[~finite]).all() and (np.signbit(got.numpy()) == np.signbit(want)).all()
    strided = torch.from_numpy(x.copy())[::3]  # not contiguous
    assert np.array_equal(round_to(strided, "float32").numpy().view(np.uint64), want[::3].view(np.uint64))


@pytest.mark.filterwarnings("ignore:.*encountered in:RuntimeWarning")
def test_the_fused_loop_ignores_flush_to_zero():
    """torch.set_flush_denormal(True) sets FTZ/DAZ: float32 subnormal inputs read as zero.

    They round to zero in every narrow format anyway, and the fused loop's sums are normal,
    so its bits do not change (serial, so that this thread, whose flags are set, runs it).
    """
    threads = torch.get_num_threads()
    if not torch.set_flush_denormal(True):
        pytest.skip("this CPU has no flush-to-zero mode")
    try:
        torch.set_num_threads(1)
        assert np.float32(1e-45) * np.float32(1) == 0  # DAZ really on in this thread
        assert compare(sample_patterns(1 << 14), "float16") == []
        assert compare(sample_patterns(1 << 14), "float8_e4m3fn") == []
    finally:
        torch.set_flush_denormal(False)
        torch.set_num_threads(threads)


def test_the_boundary_sample_reaches_every_exponent_sign_and_special():
    p = boundary_patterns()
    assert np.unique(p >> np.uint32(23)).size == 512  # 256 exponents, both signs
    x = p.view(np.float32)
    assert np.isnan(x).sum() > 100 and np.isinf(x).sum() == 2
    assert (p == np.uint32(1 << 31)).any() and (p == 0).any()  # -0.0 and +0.0


@pytest.mark.parametrize("capability", CAPABILITIES)
def test_torch_casts_agree_under_every_dispatch_level(capability):
    """A subprocess per ATEN_CPU_CAPABILITY: torch picks its vectorised casts at start-up."""
    env = {**os.environ, "ATEN_CPU_CAPABILITY": capability}
    run = subprocess.run([sys.executable, __file__, "--capability", capability],
                         env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "ok" in run.stdout.splitlines()[-1], run.stdout


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--exhaustive", action="store_true", help="all 2^32 float32 patterns")
    ap.add_argument("--capability", help="the ATEN_CPU_CAPABILITY this process was started with")
    ap.add_argument("--formats", default=",".join(NATIVE + KERNEL_ONLY))
    args = ap.parse_args()
    got = torch.backends.cpu.get_cpu_capability()
    print(f"torch {torch.__version__}, cpu capability {got}", flush=True)
    bad: list[str] = []
    for name in args.formats.split(","):
        t0 = time.perf_counter()
        rules = [None, True] if name == "float16" else [None]  # float16: inf and saturating
        for saturate in rules:
            if args.exhaustive:
                for lo in range(0, 1 << 32, CHUNK):
                    words = np.arange(lo, lo + CHUNK, dtype=np.uint64).astype(np.uint32)
                    bad += compare(words, name, saturate)
            else:
                bad += compare(sample_patterns(), name, saturate)
        print(f"{name}: {'all 2^32' if args.exhaustive else 'sampled'} patterns, "
              f"{time.perf_counter() - t0:.0f} s", flush=True)
    print("\n".join(bad) if bad else f"ok ({got})")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
