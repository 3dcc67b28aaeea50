"""Mutation testing with mutmut 3: the kill rate per module against the unit tests that cover it.

Needs mutmut, which is not a dependency of the package: ``pip install mutmut==3.8.1``.

Each module (a file or a folder package under src/precisionlab, named by path or short
name: ``scaling``, ``intervals/ops``, ``src/precisionlab/emulate/``) is mutated by mutmut
and tested with the unit test files listed for it in ``TESTS``. Modules that share their
test files are run in one mutmut session. Every session runs in a temporary copy of src/,
tests/ and pyproject.toml (the working tree is never touched); the ``[tool.mutmut]`` table
is written into the copy's pyproject.toml only. In the copy, a conftest.py addition keeps
rounding's numba tier on the NumPy path, because mutmut wraps every function in a Python
trampoline that numba cannot compile (see ``EXCLUDED``), and the same-bits subprocess tests
and figure smoke tests are deselected (they cannot tell a deterministic bug from the truth).

mutmut makes several thousand mutants of these modules (rounding.py alone about 1400), about
1-3 s each on a loaded two-core machine, so by default each module is tested on a simple
random sample (``--sample``, fixed ``--seed``) and the table gives a 95% Wilson interval
for the whole module's kill rate; ``--sample 0`` runs every mutant.

Killed counts mutants whose tests failed or timed out; a mutant whose function no listed
test calls ("no tests") and a survivor both count against the rate. ``EQUIVALENT`` lists
survivors argued to change nothing observable; the adjusted rate leaves them out.

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

_INTERVALS = ("tests/test_intervals.py", "tests/test_intervals_fields.py", "tests/test_intervals_masks.py",
              "tests/test_intervals_overflow.py", "tests/test_intervals_review.py",
              "tests/test_intervals_mutation.py")
# module (path under src/precisionlab without .py; a folder package keeps its name) -> unit tests
TESTS: dict[str, tuple[str, ...]] = {
    "scaling": ("tests/test_scaling.py", "tests/test_scaling_mutants.py", "tests/test_scaling_mutation.py"),
    "rounding": ("tests/test_rounding.py", "tests/test_rounding_mutation.py"),
    "intervals/interval": _INTERVALS,
    "intervals/outward": _INTERVALS,
    "intervals/ops": _INTERVALS,
    "intervals/softmax": _INTERVALS,
    "intervals/bounds": _INTERVALS,
    "emulate": ("tests/test_emulate.py", "tests/test_emulate_values.py", "tests/test_emulate_mutation.py"),
    "world": ("tests/test_world.py", "tests/test_world_ch3.py", "tests/test_world_mutants.py",
              "tests/test_world_mutation.py"),
}
DESELECT = "not same_bits and not figures and not numba_tiers and not tier_depends"
# Functions left out of the mutants, per module, with the reason.
EXCLUDED: dict[str, dict[str, str]] = {
    "rounding": {
        name: "numba-only build code: mutmut's trampolines cannot be compiled by numba, so the "
              "numba tier is kept off in the copy (its _round_word source is mutated and run "
              "through the Python tier)"
        for name in ("x__deterministic_loop", "x__stochastic_loop", "x__numba_kernel", "x__twin")
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
_NUMBA_OFF = ("only the numba tier runs this line, and the copy keeps that tier off; "
              "tests/test_rounding.py::test_python_numpy_and_numba_tiers_agree_bit_for_bit "
              "fails on this mutant in a normal run (checked by hand)")
_SAME_BITS = "picks another tier or back end of the same recipe: the same bits, only speed differs"
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
    ("rounding", "x__python_words",
     "dst[:] = [word(v, rnd, *params, mode) for v, rnd in zip(src.tolist(), rnds, strict=False)]"):
        "both lists always have src.size entries, so strict never fires",
    ("rounding", "x__to_numpy",
     'elif a.dtype.itemsize <= 3 and (a.dtype.kind == "f" or a.dtype.name in FORMATS):'):
        "no float dtype or ml_dtypes format is 3 bytes wide",
    ("rounding", "x__native_cast",
     'if a.dtype != np.float32 or fmt.torch_dtype is None or fmt.name == "FLOAT32":'):
        "round_to copies float32 input to float32 before asking for a native cast, so "
        "fmt.name == 'float32' is never true here",
    ("rounding", "x__emulate",
     "uniform = fmt.emin + c.bias < 1  # fmt's normal range reaches down to the container's"):
        _SAME_BITS + " (the general word kernel for bfloat16/tf32, whose shift is then constant)",
    ("rounding", "x__emulate", "_python_words(src, dst, params, code, seed, None)"):
        _SAME_BITS + " (the general word kernel instead of the uniform one)",
    ("rounding", "x__emulate", "kernel = _numba_kernel(code == _STOCHASTIC, parallel)"): _NUMBA_OFF,
    ("rounding", "x__emulate", "kernel(src, dst, *params, )"): _NUMBA_OFF,
    ("rounding", "x_round_to",
     'if native is not None and (backend == "native" or (backend == "AUTO" and fmt.name in _AUTO_NATIVE)):'):
        _SAME_BITS + " (the kernel instead of the exact library cast)",
    ("rounding", "x_round_to",
     'if native is not None and (backend == "native" or (backend == "auto" and fmt.name not in _AUTO_NATIVE)):'):
        _SAME_BITS + " (the exact library cast instead of the kernel)",
    ("rounding", "x__as_float64",
     "lambda r: torch.from_numpy(np.asarray(r, dtype=np.float64)).to(None))"):
        "on a CPU-only machine .to(device) and .to(None) are the same (a CUDA input would "
        "come back on the CPU)",
    ("rounding", "x__round_word", "thr = (sig << max(63 - sh, 0)) >> min(max(sh - 63, 0), 64)"):
        "the cap matters only for sh > 126, where sig < 2^53 shifted right by 63 or 64 is 0 either way",
}

CONFTEST = '''

# --- added by scripts/mutation_run.py in the temporary copy only ---
@pytest.fixture(autouse=True)
def _mutation_run_no_numba_tier(monkeypatch):
    """Keep rounding off its numba tier: numba cannot compile mutmut's trampolines."""
    import precisionlab.rounding as _r
    knobs = [k for k in ("_NUMBA_MIN_SIZE", "_COMPILE_AFTER_S") if hasattr(_r, k)]
    if not knobs:
        raise RuntimeError("scripts/mutation_run.py: rounding's numba switch is gone; update CONFTEST")
    for k in knobs:
        monkeypatch.setattr(_r, k, float("inf"))


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
             "use_git_change_detection = false\n")
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
        why = next((EQUIVALENT[(key, func, x.strip())] for x in new if (key, func, x.strip()) in EQUIVALENT),
                   None)
        survivors.append({"mutant": n, "status": s, "function": func, "file": f,
                          "line": _line_of(f, func, old), "old": [o.strip() for o in old],
                          "new": [x.strip() for x in new], "equivalent": why})
    n = len(statuses)
    killed = count["killed"] + count["timeout"] + count["other"]
    equiv = sum(1 for s in survivors if s["equivalent"])
    lo, hi = wilson(killed, n)
    return {**{k: v for k, v in info.items() if k != "names"}, "counts": count, "killed": killed,
            "rate": killed / n if n else float("nan"),
            "rate_adjusted": killed / (n - equiv) if n - equiv else float("nan"),
            "equivalent": equiv, "rate_95ci": [lo, hi], "wall_s_share": round(wall, 1),
            "survivors": survivors}


def _module_name(path: str) -> str:
    return str(Path(path).with_suffix("")).removeprefix("src/").replace("/", ".").replace(".__init__", "")


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
              f"{c['timeout']:4} {c['no tests']:4} {r['rate']:6.1%} {r['rate_adjusted']:6.1%}  "
              f"[{r['rate_95ci'][0]:.1%}, {r['rate_95ci'][1]:.1%}]")
    for key, r in results.items():
        if not r["survivors"]:
            continue
        print(f"\nsurvivors in {key}:")
        for s in r["survivors"]:
            tag = f"  [equivalent: {s['equivalent']}]" if s["equivalent"] else ""
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
    low = [k for k, r in results.items() if r["rate" if args.rate == "raw" else "rate_adjusted"] < args.min_rate]
    if low:
        print(f"below --min-rate {args.min_rate:.0%} ({args.rate}): {', '.join(low)}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
