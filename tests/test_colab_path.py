"""The Colab path, end to end: minimum versions, the first cell's install, every notebook.

A learner on Colab gets a runtime with its own numpy, torch, matplotlib and ipywidgets
already imported, then runs the chapter's first cell, which pip-installs precisionlab from
the repository. That works only if (1) pyproject.toml's lower bounds are met by what the
runtime has, so pip upgrades nothing that is already imported (an upgrade needs a runtime
restart), and (2) the chapters run on those oldest admitted versions. This test rebuilds
that situation from scratch:

1. a fresh virtual environment outside the repository, with exactly the declared minimum
   versions of every dependency (torch as pinned in requirements.txt: any other torch
   downloads gigabytes) and ipykernel at the test extra's minimum;
2. a git clone of the working tree, and the first cell of a chapter with its URL pointed
   at that clone, run in a kernel of that environment: the install the learner gets;
3. pip's view of the environment before and after: only precisionlab is new, no version
   changed;
4. every notebook copied to a temporary directory and run there top to bottom in that
   kernel, and the live widgets (ipywidgets at its minimum) driven once.

It needs the package registry (the minimum versions are not what the machine has). When
the registry cannot be reached the test is skipped with the reason. It takes a few minutes
(pip's cache makes later runs faster), so it runs only when asked: `pytest -m colab`, or
with PRECISIONLAB_COLAB_TEST=1 in the environment; `.ci/run` does the former.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import nbformat
import pytest
import yaml

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    tomllib = pytest.importorskip("tomli")

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
KERNEL = "precisionlab-colab-path"
GIT_URL = re.compile(r"git\+(https?://[^\s\"'@#]+)")

pytestmark = pytest.mark.colab


def asked_for(config) -> bool:
    """Run only on request: -m colab, this file named on the command line, or the variable."""
    named = any("test_colab_path" in str(arg) for arg in config.args)
    return ("colab" in (config.option.markexpr or "") or named
            or os.environ.get("PRECISIONLAB_COLAB_TEST") == "1")


def minimum_requirements() -> list[str]:
    """pyproject's dependencies at their lower bounds (name==bound); torch as requirements.txt
    pins it; ipykernel at the test extra's lower bound."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    pins = []
    for spec in project["dependencies"]:
        name, op, bound = re.match(r"([A-Za-z0-9_.\-]+)\s*(>=|==|~=)?\s*([^,;\s]*)", spec).groups()
        if name == "torch":
            continue
        if op not in (">=", "==", "~="):
            raise AssertionError(f"dependency without a lower bound: {spec!r}")
        pins.append(f"{name}=={bound}")
    reqs = (ROOT / "requirements.txt").read_text(encoding="utf-8")
    torch_pin = re.search(r"^torch==\S+", reqs, re.M)
    assert torch_pin, "requirements.txt must pin torch"
    kernel = next(s for s in project["optional-dependencies"]["test"] if s.startswith("ipykernel"))
    return [torch_pin.group(0), *pins, kernel.replace(">=", "==")]


def run(cmd, timeout=900, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, **kw)


def installed(python: Path) -> dict[str, str]:
    out = run([str(python), "-m", "pip", "list", "--format=json", "--disable-pip-version-check"])
    assert out.returncode == 0, out.stderr
    return {p["name"].lower().replace("_", "-"): p["version"] for p in json.loads(out.stdout)}


def clone_working_tree(dest: Path) -> Path:
    """A git repository holding the working tree's tracked and unignored files, committed."""
    if shutil.which("git") is None:
        pytest.skip("git is not installed: the first cell installs from a git URL")
    files = run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=ROOT)
    if files.returncode != 0:
        pytest.skip(f"{ROOT} is not a git checkout: {files.stderr.strip()}")
    for name in filter(None, files.stdout.split("\0")):
        src = ROOT / name
        if src.is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / name)
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@localhost",
           "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@localhost"}
    for cmd in (["git", "init", "-q"], ["git", "add", "-A"], ["git", "commit", "-qm", "snapshot"]):
        done = run(cmd, cwd=dest, env=env)
        assert done.returncode == 0, done.stderr
    return dest


def point_at(source: str, url: str) -> str:
    """The first cell's source with its git+<repository URL> replaced by git+<url> (a
    file://localhost/... URL: pip's requirement parser wants a host in git+file URLs)."""
    repo = yaml.safe_load((ROOT / "_config.yml").read_text(encoding="utf-8"))["repository"]["url"]
    found = GIT_URL.findall(source)
    assert found and {u.rstrip("/").removesuffix(".git") for u in found} == {repo.rstrip("/")}
    return source.replace(f"git+{found[0]}", f"git+{url}")


def execute(nb, cwd: Path, timeout: int = 600):
    from nbclient import NotebookClient

    NotebookClient(nb, kernel_name=KERNEL, timeout=timeout,
                   resources={"metadata": {"path": str(cwd)}}).execute()
    return nb


LIVE_WIDGET_CHECK = """
import ipywidgets
from precisionlab import widgets
explorer = widgets.bit_explorer(0.1, "bfloat16", "nearest_even")
bundle = explorer._repr_mimebundle_()
assert "application/vnd.jupyter.widget-view+json" in bundle and "text/html" in bundle
box = explorer.widget()
before = box.children[1].value
explorer.controls["fmt"].value = "float16"
assert box.children[1].value != before and "float16" in box.children[1].value
print("ipywidgets", ipywidgets.__version__, "live controls recompute")
"""


def test_colab_path_from_minimum_versions(tmp_path_factory, monkeypatch, pytestconfig):
    if not asked_for(pytestconfig):
        pytest.skip("slow (a fresh venv, minimum versions, every notebook): run it with "
                    "`pytest -m colab` or PRECISIONLAB_COLAB_TEST=1")
    work = tmp_path_factory.mktemp("colab-path")
    assert ROOT not in work.parents, "the environment must live outside the repository"
    pins = minimum_requirements()
    timings = {}

    # 0. the registry: a quick look-up tells "unreachable" apart from a failing install
    probe = run([sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
                 "-d", str(work / "probe"), next(p for p in pins if p.startswith("tqdm"))],
                timeout=180)
    if probe.returncode != 0:
        pytest.skip("the package registry cannot be reached for the minimum versions: "
                    + (probe.stderr.strip().splitlines() or ["no output"])[-1])

    # 1. a fresh venv with the minimum versions and a kernel
    start = time.perf_counter()
    venv = work / "venv"
    done = run([sys.executable, "-m", "venv", str(venv)])
    assert done.returncode == 0, done.stderr
    python = venv / "bin" / "python"
    done = run([str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
                "--only-binary=:all:", *pins], timeout=1800)
    assert done.returncode == 0, f"installing {pins} failed:\n{done.stderr[-3000:]}"
    have = installed(python)
    for pin in pins:
        name, version = pin.split("==")
        got = have.get(name.lower().replace("_", "-"), "")
        assert got == version or got.startswith(version + ".") or got.startswith(version + "+"), \
            f"{name}: asked for {version}, got {got!r}"
    assert "precisionlab" not in have
    done = run([str(python), "-m", "ipykernel", "install", "--prefix", str(venv), "--name", KERNEL])
    assert done.returncode == 0, done.stderr
    monkeypatch.setenv("JUPYTER_PATH", str(venv / "share" / "jupyter"))
    monkeypatch.setenv("MPLBACKEND", "Agg")
    monkeypatch.setenv("NUMBA_CACHE_DIR", str(work / "numba-cache"))
    timings["venv with minimum versions"] = time.perf_counter() - start

    # 2. the first cell, URL pointed at a local clone, run in that kernel: it installs
    start = time.perf_counter()
    clone = clone_working_tree(work / "clone")
    first = nbformat.read(NOTEBOOKS[0], as_version=4)
    setup = nbformat.v4.new_notebook(metadata=first.metadata)
    setup.cells = [nbformat.v4.new_code_cell(point_at(first.cells[0].source, f"file://localhost{clone}"))]
    execute(setup, work)
    printed = "".join(o.get("text", "") for o in setup.cells[0].outputs if o.output_type == "stream")
    after = installed(python)
    timings["first cell's install"] = time.perf_counter() - start

    # 3. only precisionlab is new; nothing already installed was up- or downgraded
    assert set(after) - set(have) == {"precisionlab"}, (set(after) - set(have), printed[-2000:])
    changed = {n: (v, after.get(n)) for n, v in have.items() if after.get(n) != v}
    assert not changed, f"the first cell's pip install changed installed packages: {changed}"

    # 4. every chapter from a temporary directory, top to bottom, plus the live widgets
    run_dir = work / "run"
    run_dir.mkdir()
    for path in NOTEBOOKS:
        start = time.perf_counter()
        nb = nbformat.read(path, as_version=4)
        nb.cells[0].source = point_at(nb.cells[0].source, f"file://localhost{clone}")
        shutil.copy2(path, run_dir / path.name)
        try:
            execute(nb, run_dir)
        except Exception as exc:  # name the chapter and the versions in the failure
            pytest.fail(f"{path.name} failed with the minimum versions {pins}: {exc}")
        timings[path.name] = time.perf_counter() - start
    live = nbformat.v4.new_notebook(metadata=first.metadata)
    live.cells = [nbformat.v4.new_code_cell(LIVE_WIDGET_CHECK)]
    execute(live, run_dir)
    said = "".join(o.get("text", "") for o in live.cells[0].outputs if o.output_type == "stream")
    assert "live controls recompute" in said
    print("\n".join(f"{name:<40} {seconds:6.1f} s" for name, seconds in timings.items()))
