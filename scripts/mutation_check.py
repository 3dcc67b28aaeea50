"""Mutation check: plausible one-line bugs in emulate, world and scaling, one at a time, against the unit tests.

Each mutant replaces one exact source fragment (it must occur exactly once) in a COPY of the
package (src/ and tests/ copied to a temporary directory; the working tree is never touched),
then runs the module's unit test files there with ``pytest -x`` and PYTHONPATH pointing at the
copy. A mutant is killed when a test fails. Two test sets are run per mutant:

* ``before``: the module's original test file (tests/test_emulate.py, test_world.py,
  test_scaling.py);
* ``after``: the same file plus the mutation-driven one (tests/test_emulate_values.py,
  test_world_rollout.py, and for scaling the tests that were test_scaling_mutants.py).

Since issue 34 the test files are named for what they test, not how their tests were found:
test_scaling_mutants.py was merged into test_scaling.py and test_scaling_scalers.py (both
sets now run both files, so scaling's two rates no longer differ), test_world_mutants.py is
test_world_rollout.py, and the tests a later mutmut run added (scripts/mutation_run.py) sit
in test_emulate.py and test_world.py, so ``before`` includes them. data/mutation_check.json
keeps the split as it was run (its "tests" table names the old files).

The cross-machine same-bits tests (subprocesses comparing runs with each other; they cannot
see a deterministic bug) and the figure/widget smoke tests are deselected to keep the run
short. Hypothesis runs with a fixed seed.

Run (from the repository root; both sets took 47 minutes on a loaded two-core machine):

    python3 scripts/mutation_check.py                     # both sets, all mutants
    python3 scripts/mutation_check.py --sets after        # only old + new tests
    python3 scripts/mutation_check.py --only W1 W2        # some mutants
    python3 scripts/mutation_check.py --list              # print the mutants

It prints the kill rate per module and set, the survivors, and writes
data/mutation_check.json (unless --no-save).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "data" / "mutation_check.json"

TESTS = {
    "emulate": (["tests/test_emulate.py"], ["tests/test_emulate_values.py"]),
    "world": (["tests/test_world.py"], ["tests/test_world_rollout.py"]),
    "scaling": (["tests/test_scaling.py", "tests/test_scaling_scalers.py"], []),
}
DESELECT = "not same_bits and not figures"


@dataclass(frozen=True)
class Mutant:
    """One source fragment `old` of src/precisionlab/<module>.py replaced by `new`."""

    id: str
    module: str
    old: str
    new: str
    what: str


M = Mutant
MUTANTS: list[Mutant] = [
    # ----------------------------------------------------------------- emulate
    M("E1", "emulate", "        g = prec.round(g)\n        ga = prec.round(_gemm(g, br.T, prec))",
      "        ga = prec.round(_gemm(g, br.T, prec))",
      "matmul backward does not round the incoming gradient to F"),
    M("E2", "emulate", "gb = prec.round(_gemm(ar.T, g, prec))", "gb = _gemm(ar.T, g, prec)",
      "matmul backward leaves dB in the accumulator (no rounding to F)"),
    M("E3", "emulate", 'dt = np.float64 if prec.accumulate == "float64" else np.float32',
      "dt = np.float32", "the accumulator is always float32"),
    M("E4", "emulate", "        for p in range(k):\n            aip = a[i, p]",
      "        for p in range(k - 1, -1, -1):\n            aip = a[i, p]",
      "the matmul kernel sums k = K-1, ..., 0"),
    M("E5", "emulate", "acc = acc + prec.round(b).to(acc.dtype)", "acc = acc + b.detach().to(acc.dtype)",
      "linear adds the bias without rounding it to F"),
    M("E6", "emulate", "        g = prec.round(g)\n        gx = prec.round(_gemm(g, wr, prec))",
      "        gx = prec.round(_gemm(g, wr, prec))",
      "linear backward does not round the incoming gradient to F"),
    M("E7", "emulate", "    def forward(ctx, x, prec):\n        return prec.round(x)",
      "    def forward(ctx, x, prec):\n        return x.detach().to(prec.container)",
      "cast does not round"),
    M("E8", "emulate", "return prec.round(prec.round(g).to(torch.float64) * dy), None, None",
      "return prec.round(g.to(torch.float64) * dy), None, None",
      "elementwise backward does not round the incoming gradient"),
    M("E9", "emulate", "(1.0 + 3 * 0.044715 * x * x)", "(1.0 + 0.044715 * x * x)",
      "gelu derivative drops the factor 3 of the cubic term"),
    M("E10", "emulate", "gb = prec.round(sum_over(g, per_channel))",
      "gb = prec.round(sum_over(gy, per_channel))",
      "group_norm's bias gradient is multiplied by the weight"),
    M("E11", "emulate", "r = 1.0 / sqrt64(fixed_sum(d * d, -1, keepdim=True) / m + eps)",
      "r = 1.0 / sqrt64(fixed_sum(d * d, -1, keepdim=True) / (m - 1) + eps)",
      "group_norm uses the unbiased variance"),
    M("E12", "emulate", "        g = prec.round(g).to(torch.float64)\n        return prec.round(g - exp64(y)",
      "        g = g.to(torch.float64)\n        return prec.round(g - exp64(y)",
      "log_softmax backward does not round the incoming gradient"),
    M("E13", "emulate", "g = prec.round(g).to(torch.float64) / ctx.d", "g = g.to(torch.float64) / ctx.d",
      "sum/mean backward does not round the incoming gradient"),
    M("E14", "emulate", "return gx, None if not ctx.needs_input_grad[1] else -gx, None",
      "return gx, None if not ctx.needs_input_grad[1] else gx, None",
      "mse_loss's target gradient has the wrong sign"),
    M("E15", "emulate", "gx = prec.round(2.0 * diff * (prec.round(g).to(torch.float64) / diff.numel()))",
      "gx = prec.round(2.0 * diff * (g.to(torch.float64) / diff.numel()))",
      "mse_loss backward does not round the incoming gradient"),
    M("E16", "emulate", "diff = prec.round(x).to(torch.float64) - prec.round(t).to(torch.float64)",
      "diff = x.detach().to(torch.float64) - t.detach().to(torch.float64)",
      "mse_loss does not round its operands to F"),
    M("E17", "emulate", 'st["buf"] = p_.round(b)', 'st["buf"] = b.to(p.dtype)',
      "SGD keeps the momentum buffer in the container, not in F"),
    M("E18", "emulate", "p.copy_(p_.round(p.to(torch.float64) - lr * g))",
      "p.copy_(p.to(torch.float64) - lr * g)", "SGD stores the new weight without rounding to F"),
    M("E19", "emulate", 'm = p_.round(b1 * st["m"].to(torch.float64) + (1 - b1) * g)',
      'm = b1 * st["m"].to(torch.float64) + (1 - b1) * g',
      "Adam uses the first moment before rounding it to F"),
    M("E20", "emulate", "log64(1.0 - u[0])", "log64(u[0])",
      "randn draws U1 from [0, 1) instead of (0, 1] (same law, other samples)"),
    M("E21", "emulate", "torch.where(x > 709.8, torch.inf, y)", "torch.where(x > 709.0, torch.inf, y)",
      "exp64 overflows too early"),
    # ----------------------------------------------------------------- world
    M("W1", "world", "go_ball = pn >= share", "go_ball = pn > share",
      "per_instance stops at p_i == tol/N instead of continuing"),
    M("W2", "world", "v = torch.where(below, bounce, v1)", "v = torch.where(y < 0, bounce, v1)",
      "the bounce is decided from the height after the solve"),
    M("W3", "world", "go = s >= thr", "go = s > thr", "the solver stops at S == tol instead of continuing"),
    M("W4", "world", "thr = np.where(engaged, world.exit_tol, world.tol)",
      "thr = np.where(engaged, world.tol, world.exit_tol)", "hysteresis thresholds swapped"),
    M("W5", "world", "return self.tol / 2 if self.tol_exit is None", "return self.tol / 4 if self.tol_exit is None",
      "default exit tolerance tol/4 instead of the documented tol/2"),
    M("W6", "world", "c = r(world.alpha * kb)", "c = world.alpha * kb",
      "the projection gain alpha k is not rounded to the state format"),
    M("W7", "world",
      "        return float(round_to(self.h * self.g, self.fmt))",
      "        return self.h * self.g",
      "h g is not rounded to the state format in rollout"),
    M("W8", "world", "mask = go_ball & active[:, None]", "mask = np.repeat(active[:, None], n, axis=1)",
      "per_instance moves every ball of an active lane"),
    M("W9", "world", "loss_lanes = fixed_sum(per_ball, dim=-1) / n",
      "loss_lanes = fixed_sum(per_ball, dim=-1) / lanes", "the loss divides by the lane count"),
    M("W10", "world", "f = torch.where(p > 0, r(f - r(world.damping * v)), f)",
      "f = torch.where(p >= 0, r(f - r(world.damping * v)), f)", "damping acts in free flight"),
    M("W11", "world", "hit = (y < 0).numpy() & (out == T)", "hit = (y <= 0).numpy() & (out == T)",
      "first_contact_steps counts y == 0 as contact"),
    M("W12", "world", "    v = r(torch.from_numpy(v_np))", "    v = torch.from_numpy(v_np)",
      "the initial velocity is not rounded to the state format"),
    M("W13", "world", "bounce = -r(world.restitution * torch.minimum(v1, torch.zeros_like(v1)))",
      "bounce = -r(world.restitution * v1)", "a ball rising inside the floor is bounced downwards"),
    # ----------------------------------------------------------------- scaling
    M("S1", "scaling", "found_inf = any(checks)", "found_inf = all(checks)",
      "update skips only when every optimizer saw inf"),
    M("S2", "scaling", "found |= not bool(torch.isfinite(g).all())", "found = not bool(torch.isfinite(g).all())",
      "unscale_ keeps only the last parameter's inf check"),
    M("S3", "scaling", "self._scale = float(np.float32(init_scale))  # GradScaler",
      "self._scale = float(init_scale)  # GradScaler", "the initial scale is not a float32 value"),
    M("S4", "scaling", "skipped[i] = not math.isfinite(float(round_to(gi * s, f)))",
      "skipped[i] = abs(gi * s) > f.max_finite", "overflow decided before rounding (g S > max)"),
    M("S5", "scaling", "return (grown if math.isfinite(grown) else s32), 0",
      "return (grown if math.isfinite(grown) else s32), successful",
      "a growth blocked by overflow keeps the tracker"),
    M("S6", "scaling", "return _to_float32(s32 * backoff_factor), 0", "return s32 * backoff_factor, 0",
      "the backed-off scale is not rounded to float32"),
    M("S7", "scaling", "self._scale = float(np.float32(new_scale))", "self._scale = float(new_scale)",
      "update(new_scale) keeps a non-float32 scale"),
    M("S8", "scaling", "ops.append(lambda h, f=act: f(h, prec))", 'ops.append(lambda h, f=act: f(h, "float32"))',
      "emulated activations run in float32 instead of the compute format"),
    M("S9", "scaling", 'emulate.mse_loss(out, t, "float32"))', "emulate.mse_loss(out, t, compute))",
      "the emulated loss runs in the compute format"),
    M("S10", "scaling", "s, t = float(np.float32(init_scale)), 0\n    for i, f in enumerate(flags):",
      "s, t = float(init_scale), 0\n    for i, f in enumerate(flags):",
      "simulate_scale_history starts from a non-float32 scale"),
]


def _file_of(m: Mutant) -> Path:
    """The one file of the module (a file, or any file of its folder) holding m's fragment once."""
    base = ROOT / "src/precisionlab"
    files = [base / f"{m.module}.py"] if (base / f"{m.module}.py").exists() else sorted(
        (base / m.module).rglob("*.py"))
    hits = [(f, f.read_text().count(m.old)) for f in files]
    hits = [(f, c) for f, c in hits if c]
    if len(hits) != 1 or hits[0][1] != 1:
        raise SystemExit(f"{m.id}: fragment found {sum(c for _, c in hits)} times in {m.module}")
    return hits[0][0].relative_to(ROOT)


def _copy_tree(dst: Path) -> None:
    """src/, tests/ and pyproject.toml into dst (no caches, no build outputs)."""
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", ".hypothesis", "*.egg-info")
    shutil.copytree(ROOT / "src", dst / "src", ignore=ignore)
    shutil.copytree(ROOT / "tests", dst / "tests", ignore=ignore)
    shutil.copy2(ROOT / "pyproject.toml", dst / "pyproject.toml")


def _pytest(dst: Path, files: list[str], env: dict, timeout: float) -> tuple[str, float, str]:
    """('pass' | 'fail' | 'timeout' | 'error', seconds, last line) for pytest -x over files in dst."""
    cmd = [sys.executable, "-m", "pytest", *files, "-x", "-q", "-p", "no:cacheprovider",
           "-k", DESELECT, "--hypothesis-seed=0", "-o", "addopts="]
    t0 = time.perf_counter()
    try:
        res = subprocess.run(cmd, cwd=dst, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return "timeout", time.perf_counter() - t0, ""
    lines = [ln for ln in res.stdout.strip().splitlines() if ln.strip()]
    last = lines[-1] if lines else res.stderr.strip()[-200:]
    status = {0: "pass", 1: "fail"}.get(res.returncode, "error")
    return status, time.perf_counter() - t0, last


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sets", nargs="+", default=["before", "after"], choices=["before", "after"])
    ap.add_argument("--only", nargs="+", help="mutant ids to run")
    ap.add_argument("--list", action="store_true", help="print the mutants and exit")
    ap.add_argument("--timeout", type=float, default=900.0, help="seconds per pytest run")
    ap.add_argument("--no-save", action="store_true")
    args = ap.parse_args(argv)

    mutants = [m for m in MUTANTS if not args.only or m.id in args.only]
    if args.list:
        for m in mutants:
            print(f"{m.id:4} {m.module:8} {m.what}")
        return 0
    where_of = {}
    for m in mutants:  # every fragment must exist once and the mutant must compile
        rel = _file_of(m)
        text = (ROOT / rel).read_text()
        compile(text.replace(m.old, m.new), str(rel), "exec")
        where_of[m.id] = rel

    with tempfile.TemporaryDirectory(prefix="mutation_") as tmp:
        dst = Path(tmp)
        _copy_tree(dst)
        env = {**os.environ, "PYTHONPATH": str(dst / "src"), "NUMBA_CACHE_DIR": str(dst / "numba"),
               "PYTHONDONTWRITEBYTECODE": "1"}
        where = subprocess.run([sys.executable, "-c", "import precisionlab; print(precisionlab.__file__)"],
                               cwd=dst, env=env, capture_output=True, text=True, check=True).stdout.strip()
        if not where.startswith(str(dst)):
            raise SystemExit(f"the copy is not the package imported: {where}")
        results: dict[str, dict] = {}
        for name in args.sets:  # the unmutated copy must pass every set first
            for module, (old, new) in TESTS.items():
                if not any(m.module == module for m in mutants):
                    continue
                files = old + (new if name == "after" else [])
                status, secs, last = _pytest(dst, files, env, args.timeout)
                print(f"baseline {name:6} {module:8} {status} ({secs:.0f} s) {last}", flush=True)
                if status != "pass":
                    raise SystemExit("the unmutated package must pass its tests")
        for m in mutants:
            path = dst / where_of[m.id]
            original = path.read_text()
            stat = path.stat()
            path.write_text(original.replace(m.old, m.new))
            try:
                row = {"module": m.module, "what": m.what}
                for name in args.sets:
                    old, new = TESTS[m.module]
                    files = old + (new if name == "after" else [])
                    status, secs, last = _pytest(dst, files, env, args.timeout)
                    row[name] = {"killed": status != "pass", "status": status, "seconds": round(secs, 1),
                                 "last": last}
                    print(f"{m.id:4} {name:6} {'killed' if status != 'pass' else 'SURVIVED':8} "
                          f"({status}, {secs:.0f} s) {m.what}", flush=True)
                results[m.id] = row
            finally:  # restore the text and the time stamp (numba's cache index checks it)
                path.write_text(original)
                os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))

    summary = {}
    print()
    for name in args.sets:
        for module in TESTS:
            rows = {k: r for k, r in results.items() if r["module"] == module and name in r}
            if not rows:
                continue
            killed = sum(r[name]["killed"] for r in rows.values())
            survivors = [k for k, r in rows.items() if not r[name]["killed"]]
            summary[f"{name}/{module}"] = {"killed": killed, "total": len(rows), "survivors": survivors}
            print(f"{name:6} {module:8} killed {killed}/{len(rows)} ({100 * killed / len(rows):.0f}%)"
                  + (f"; survivors: {', '.join(survivors)}" if survivors else ""))
        rows = [r for r in results.values() if name in r]
        if rows:
            killed = sum(r[name]["killed"] for r in rows)
            print(f"{name:6} all      killed {killed}/{len(rows)} ({100 * killed / len(rows):.0f}%)")
    if not args.no_save and not args.only:
        OUT.write_text(json.dumps({"tests": TESTS, "deselected": DESELECT, "summary": summary,
                                   "mutants": results}, indent=1) + "\n")
        print(f"wrote {OUT.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
