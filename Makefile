# The project's commands; the README and .ci/run call these targets. `make` alone lists them.
# Every tool is reached through the interpreter (python3 -m ...), so nothing depends on pip's
# script directory being on PATH. Override the interpreter with `make test PYTHON=python3.11`.

PYTHON ?= python3
PYTEST := $(PYTHON) -m pytest
# the unit and notebook tests on every core (pytest-xdist); each notebook stays on one worker
PARALLEL ?= -n auto --dist loadfile
NB ?= notebooks/*.ipynb
# torch's CPU kernels forced down to their scalar versions: checked outputs must not change.
SCALAR := ATEN_CPU_CAPABILITY=default

.PHONY: help test lint notebooks execute book browser versions lock bench ci
# ci's steps run in the order listed, also under `make -j`: the browser test reads the book.
.NOTPARALLEL:

help:  ## list the targets
	@grep -E '^[a-z]+:.*## ' $(MAKEFILE_LIST) | sed -E 's/:.*## /\t/'

test: lint  ## ruff and the nbval-tag check, unit and notebook tests (nbval), docstring examples
	$(PYTEST) $(PARALLEL) $(PYTEST_ARGS)
	$(PYTEST) -p no:cacheprovider --doctest-modules src/precisionlab -q

lint:  ## ruff (package, tests, scripts, benchmarks, notebooks) and nbval marker comments
	$(PYTHON) -m ruff check .
	$(PYTHON) scripts/nbval_tags.py --check notebooks/*.ipynb

notebooks:  ## notebook tests again with scalar CPU kernels: same stored outputs
	$(SCALAR) $(PYTEST) $(PARALLEL) $(PYTEST_ARGS) notebooks

execute:  ## re-execute notebooks in place and time them (one: make execute NB=notebooks/01-*)
	$(PYTHON) scripts/execute_notebooks.py $(NB)

book:  ## build the HTML book into _build/html, warnings as errors
	$(PYTHON) -m jupyter book build . -W -n --keep-going

browser:  ## the built book in headless Chromium with the network blocked
	$(PYTEST) -p no:cacheprovider -m browser tests/test_browser.py

# the two run side by side (-n 2): one installs while the other runs its notebooks
versions:  ## both ends of pyproject's ranges, each in a fresh venv: minimum (Colab path), newest
	$(PYTEST) -p no:cacheprovider -n 2 -m "colab or newest" tests/test_colab_path.py \
	    tests/test_newest_versions.py

# The lock: requirements.txt from requirements.in (pyproject.toml's ranges, torch pinned) for
# Python 3.10-3.13, at the newest releases that fit. Needs uv (in the test extra).
NO_EMIT = $(foreach name,$(shell sed -n 's/ ;.*//p' requirements-overrides.txt),--no-emit-package $(name))
LOCK = uv pip compile requirements.in --universal --python-version 3.10 --prerelease disallow \
	--override requirements-overrides.txt $(NO_EMIT) --custom-compile-command "make lock" \
	-o $(LOCK_OUT)
# where the lock is written, and --upgrade: `make lock` takes the newest releases that fit
LOCK_OUT ?= requirements.txt
LOCK_FLAGS ?= --upgrade

lock:  ## regenerate requirements.txt, the lock, from pyproject.toml's ranges (uv pip compile)
	$(PYTHON) -m $(LOCK) $(LOCK_FLAGS) --quiet

bench:  ## every benchmark script (speed goals, printed as tables; not part of ci)
	@set -e; for script in benchmarks/*.py; do echo "== $$script"; $(PYTHON) $$script; done

ci: PYTEST_ARGS += --durations=15
ci: test notebooks book browser versions  ## everything CI runs (.ci/run), in this order
