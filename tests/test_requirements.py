"""What a fresh machine installs: every import declared, the lock true to pyproject's ranges.

A package left on a machine by hand hides a missing requirement (the test suite once imported
scipy, which no requirement named, and passed only where scipy happened to be installed). So:

- every third-party module that the package, tests, scripts, benchmarks or notebooks import
  belongs to a distribution that pyproject.toml names (a dependency or an extra), found with
  importlib.metadata's own module-to-distribution map, whatever else is installed;
- every test module imports in a fresh interpreter of this environment, which in CI is a new
  virtual environment built from the lock alone;
- the lock (requirements.txt) pins, for every Python from 3.10 to 3.13 on Linux, macOS and
  Windows, exactly one version of each requirement, inside pyproject's range; torch at
  requirements.in's pin; none of torch's CUDA libraries;
- and the lock is what `make lock` resolves today from requirements.in and pyproject.toml
  (uv, keeping the current pins where they still fit): a changed range without a new lock
  fails here. That one needs the package index and is skipped, with the reason, without it.
"""

from __future__ import annotations

import ast
import json
import os
import re
import shutil
import subprocess
import sys
from importlib.metadata import packages_distributions
from pathlib import Path

import pytest
from packaging.markers import Marker
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    tomllib = pytest.importorskip("tomli")

ROOT = Path(__file__).resolve().parent.parent
PYTHONS = ["3.10", "3.11", "3.12", "3.13"]
PLATFORMS = {"linux": ("Linux", "x86_64"), "darwin": ("Darwin", "arm64"),
             "win32": ("Windows", "AMD64")}


def project() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]


def declared() -> dict[str, list[Requirement]]:
    """pyproject's requirements by group: 'dependencies' and each optional extra."""
    proj = project()
    groups = {"dependencies": proj["dependencies"], **proj["optional-dependencies"]}
    return {group: [Requirement(spec) for spec in specs] for group, specs in groups.items()}


def repository_files(*patterns: str) -> list[Path]:
    """The tracked and unignored files matching the patterns (git), else a walk of the tree."""
    if shutil.which("git"):
        done = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", *patterns],
                              capture_output=True, text=True, cwd=ROOT)
        if done.returncode == 0:
            return [ROOT / name for name in done.stdout.split() if (ROOT / name).is_file()]
    suffixes = {p.rsplit(".", 1)[-1] for p in patterns}
    return [p for p in ROOT.rglob("*") if p.suffix.lstrip(".") in suffixes
            and "_build" not in p.parts and not any(s.startswith(".") for s in p.parts)]


def code_of(path: Path) -> str:
    """A file's Python source; a notebook's code cells without shell and magic lines."""
    text = path.read_text(encoding="utf-8")
    if path.suffix != ".ipynb":
        return text
    cells = json.loads(text)["cells"]
    lines = ("".join(c["source"]).splitlines() for c in cells if c["cell_type"] == "code")
    def magic(line: str) -> bool:  # a line that begins with != continues an expression
        s = line.lstrip()
        return s.startswith("%") or (s.startswith("!") and not s.startswith("!="))
    return "\n".join(line for cell in lines for line in cell if not magic(line))


def third_party_imports(files: list[Path] | None = None, root: Path = ROOT) -> dict[str, set[str]]:
    """Top-level modules imported in files (default: the repository's) that are neither the
    standard library nor the repository's own files, with the files that import each."""
    files = repository_files("*.py", "*.ipynb") if files is None else files
    local = {p.stem for p in files} | {"precisionlab"}
    found: dict[str, set[str]] = {}
    for path in files:
        for node in ast.walk(ast.parse(code_of(path), filename=str(path))):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            for name in names:
                top = name.split(".")[0]
                if top in sys.stdlib_module_names or top in local:
                    continue
                found.setdefault(top, set()).add(str(path.relative_to(root)))
    return found


def undeclared(imports: dict[str, set[str]]) -> list[str]:
    """The imported modules whose distribution pyproject.toml does not name. A module that no
    installed distribution provides counts as undeclared, unless it is a maintenance-only
    extra's (mutmut), which the lock does not install."""
    names = {canonicalize_name(r.name) for reqs in declared().values() for r in reqs}
    maintain = {canonicalize_name(r.name) for r in declared().get("maintain", [])}
    owners = packages_distributions()
    problems = []
    for module, where in sorted(imports.items()):
        dists = {canonicalize_name(d) for d in owners.get(module, [])}
        if not dists and canonicalize_name(module) in maintain:
            continue  # a maintenance script's own tool, not installed by the lock
        if not dists & names:
            problems.append(f"{module} (distribution {sorted(dists) or 'not installed'}) "
                            f"imported by {sorted(where)[:3]}: declared by no requirement")
    return problems


def test_every_third_party_import_is_a_declared_requirement():
    problems = undeclared(third_party_imports())
    assert not problems, ("add each to pyproject.toml (a dependency, or the test, book or "
                          "maintain extra), then `make lock`:\n" + "\n".join(problems))


def test_the_import_check_reports_an_undeclared_module(tmp_path):
    """The check above is not vacuous: scipy is reported whether or not it is installed."""
    probe = tmp_path / "probe.py"
    probe.write_text("import os\nimport scipy.stats\nfrom numpy import linalg\nfrom . import x\n")
    found = third_party_imports([probe], tmp_path)
    assert found == {"scipy": {"probe.py"}, "numpy": {"probe.py"}}
    (problem,) = undeclared(found)
    assert problem.startswith("scipy (distribution") and "declared by no requirement" in problem


def test_every_test_module_imports_in_a_fresh_interpreter():
    modules = sorted(p.stem for p in (ROOT / "tests").glob("*.py"))
    program = ("import importlib, sys\nsys.path.insert(0, sys.argv[1])\n"
               "for name in sys.argv[2:]:\n    importlib.import_module(name)\n")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = subprocess.run([sys.executable, "-c", program, str(ROOT / "tests"), *modules],
                          capture_output=True, text=True, env={**env, "PYTHONNOUSERSITE": "1"},
                          cwd=ROOT, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]


# ----------------------------------------------------------------------------- the lock


def lock_pins() -> list[Requirement]:
    """requirements.txt's pinned lines (name==version ; marker), comments and -e dropped."""
    pins = []
    for line in (ROOT / "requirements.txt").read_text(encoding="utf-8").splitlines():
        line = line.split(" #")[0].strip()
        if line and not line.startswith(("#", "-")):
            pins.append(Requirement(line))
    return pins


def environments():
    """Marker environments for each supported Python on each platform."""
    for python in PYTHONS:
        for platform, (system, machine) in PLATFORMS.items():
            yield f"Python {python} on {platform}", {
                "python_version": python, "python_full_version": f"{python}.0",
                "sys_platform": platform, "platform_system": system,
                "platform_machine": machine, "os_name": "nt" if platform == "win32" else "posix",
                "implementation_name": "cpython", "platform_python_implementation": "CPython",
                "extra": ""}


def pinned_version(pin: Requirement) -> Version:
    (spec,) = pin.specifier
    assert spec.operator == "==", f"the lock must pin exactly: {pin}"
    return Version(spec.version)


def test_the_lock_pins_every_requirement_inside_its_range_on_every_python():
    pins = lock_pins()
    wanted = [r for group in ("dependencies", "test", "book") for r in declared()[group]]
    for where, env in environments():
        active = {}
        for pin in pins:
            if pin.marker is None or pin.marker.evaluate(env):
                name = canonicalize_name(pin.name)
                assert name not in active, f"{where}: two pins of {name}"
                active[name] = pinned_version(pin)
        for req in wanted:
            if req.marker is not None and not req.marker.evaluate(env):
                continue
            got = active.get(canonicalize_name(req.name))
            assert got is not None, f"{where}: the lock pins no {req.name}"
            assert req.specifier.contains(got, prereleases=True), \
                f"{where}: the lock pins {req.name}=={got}, outside pyproject's {req}"


def test_the_lock_pins_torch_as_requirements_in_and_none_of_its_cuda_libraries():
    text = (ROOT / "requirements.in").read_text(encoding="utf-8")
    torch_in = re.search(r"^torch==(\S+)", text, re.M)
    assert torch_in, "requirements.in must pin torch"
    pins = {canonicalize_name(p.name): p for p in lock_pins()}
    assert pinned_version(pins["torch"]) == Version(torch_in.group(1))
    assert pins["torch"].marker is None  # the same torch on every Python and platform
    left_out = [Requirement(line) for line in
                (ROOT / "requirements-overrides.txt").read_text(encoding="utf-8").splitlines()
                if line.strip() and not line.startswith("#")]
    assert left_out and all(r.marker == Marker("sys_platform == 'never'") for r in left_out)
    assert not {canonicalize_name(r.name) for r in left_out} & set(pins)
    assert not [n for n in pins if n.startswith(("nvidia-", "cuda-")) or n == "triton"]


def test_make_lock_writes_requirements_txt_from_requirements_in():
    if shutil.which("make") is None:
        pytest.skip("GNU make is not installed")
    done = subprocess.run(["make", "-n", "lock"], capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    command = done.stdout.split()
    assert command[command.index("compile") + 1] == "requirements.in"
    assert command[command.index("-o") + 1] == "requirements.txt" and "--upgrade" in command
    for name in ("--universal", "--override", "requirements-overrides.txt"):
        assert name in command


def test_the_lock_is_what_make_lock_resolves_today(tmp_path):
    if shutil.which("make") is None:
        pytest.skip("GNU make is not installed")
    out = tmp_path / "requirements.txt"
    shutil.copy2(ROOT / "requirements.txt", out)  # the current pins, kept where they fit
    done = subprocess.run(["make", "-s", "lock", f"PYTHON={sys.executable}",
                           f"LOCK_OUT={out}", "LOCK_FLAGS="],
                          capture_output=True, text=True, cwd=ROOT, timeout=600)
    if done.returncode != 0 and re.search(r"(?i)dns|connect|network|timed out|resolve host|"
                                          r"lookup address", done.stderr):
        pytest.skip(f"the package index cannot be reached: {done.stderr.strip()[-300:]}")
    assert done.returncode == 0, done.stderr[-3000:]
    assert out.read_text(encoding="utf-8") == \
        (ROOT / "requirements.txt").read_text(encoding="utf-8"), \
        "requirements.txt is not what pyproject.toml's ranges resolve to: run `make lock`"
