"""Shared test fixtures: the same-bits harness across CPU dispatch levels, and figure hygiene.

`same_bits(program)` runs a Python program that prints one SHA-256 hex digest of its results
in fresh interpreters, one per environment in `DISPATCH` (torch's ATen kernels forced to
their scalar `default` level, capped at AVX2 with MKL and oneDNN capped too, one thread),
and asserts that every run prints the same digest. `library_kernels=True` adds `LIBRARY`:
OpenBLAS's oldest x86-64 kernels, and numba compiling for a generic CPU into an empty cache.
The runs go one after another: side by side, threaded programs oversubscribe the cores
(measured: the emulate program took 2.4 times the CPU time when run two at a time on 2 cores).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys

import matplotlib
import pytest

matplotlib.use("Agg")  # tests draw figures headless; notebooks run in their own kernels

DISPATCH = {
    "as is": {},
    "ATEN default": {"ATEN_CPU_CAPABILITY": "default"},
    "AVX2 caps": {"ATEN_CPU_CAPABILITY": "avx2", "MKL_ENABLE_INSTRUCTIONS": "AVX2",
                  "ONEDNN_MAX_CPU_ISA": "AVX2"},
    "1 thread": {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1"},
}
LIBRARY = {
    "old OpenBLAS kernels": {"OPENBLAS_CORETYPE": "Prescott"},
    "generic numba CPU, cold cache": {"NUMBA_CPU_NAME": "generic", "NUMBA_CACHE_DIR": "{tmp}"},
}
SHA256_HEX = re.compile(r"[0-9a-f]{64}")


def run_program(program: str, env: dict[str, str], timeout: float = 300) -> str:
    """The last line a fresh interpreter prints for `program` under os.environ updated by env."""
    done = subprocess.run([sys.executable, "-c", program], env={**os.environ, **env},
                          capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, f"{env}: exit {done.returncode}\n{done.stderr[-3000:]}"
    lines = done.stdout.strip().splitlines()
    return lines[-1] if lines else ""


@pytest.fixture
def same_bits(tmp_path):
    """Check that a digest-printing program gives one SHA-256 digest in every environment."""

    def check(program: str, *, library_kernels: bool = False) -> str:
        configs = {**DISPATCH, **(LIBRARY if library_kernels else {})}
        envs = {name: {k: v.format(tmp=tmp_path) for k, v in env.items()}
                for name, env in configs.items()}
        digests = {name: run_program(program, env) for name, env in envs.items()}
        assert all(SHA256_HEX.fullmatch(d) for d in digests.values()), digests
        assert len(set(digests.values())) == 1, digests
        return digests["as is"]

    return check


@pytest.fixture(autouse=True)
def _close_figures():
    """Close every matplotlib figure a test left open (pyplot is not imported for this)."""
    yield
    pyplot = sys.modules.get("matplotlib.pyplot")
    if pyplot is not None:
        pyplot.close("all")


@pytest.fixture
def one_torch_thread():
    """torch on one thread for the test (the emulated arithmetic does not depend on it; native
    kernels then add in one order), the old count restored after."""
    import torch  # only the tests that ask for this fixture pay for the import

    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)
