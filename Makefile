# trainctl — `make demo` trains the example on 2 local nodes; `make test` runs the suite
# (`make test-fast`: the unit tier and a smoke run, for the edit-test loop; `make test-gpu`:
# the GPU tier, where CUDA exists; `make test-deps` installs the real parts the tests use:
# sshd, podman, a registry, dockerd, mpirun, chromium, Slurm);
# `make bench` measures the performance table (bench/results.json; see docs/benchmarks.md);
# `make docs` builds the documentation site into site/.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
PIP    := $(VENV)/bin/pip
STAMP  := $(VENV)/.installed
# Test files run side by side (pytest-xdist, a file per worker: its fixtures are made once).
# The tests mostly wait on real processes, so 3 workers beat 2 on a 2-core machine.
TEST_WORKERS ?= 3

.PHONY: venv demo test test-fast test-gpu test-deps test-bare docs lint format bench clean

venv: $(STAMP)

# pip's own progress (a line a package, a bar a download) shows while it works, and
# tools/pip-progress.py counts the packages into place during its silent install step: a
# fresh venv takes minutes.
$(STAMP): pyproject.toml plugins/trainctl-slurm/pyproject.toml
	@echo "[1/3] a virtual environment in $(VENV), with a current pip"
	$(PYTHON) -m venv $(VENV)
	$(PIP) install --quiet --upgrade pip
	@echo "[2/3] torch 2.13.0 (pinned: an unpinned torch pulls several GB of CUDA wheels)"
	$(PY) tools/pip-progress.py install --progress-bar on "torch==2.13.0"
	@echo "[3/3] trainctl, its Slurm provider plug-in, and what its tests, docs and examples use"
	$(PY) tools/pip-progress.py install --progress-bar on -e ".[dev]" -e plugins/trainctl-slurm
	touch $(STAMP)
	@echo "done: $(VENV)/bin/trainctl; make demo trains the example"

# Into the user's own store ($TRAINCTL_HOME, default ~/.trainctl): `trainctl jobs` then
# finds the demo, as it finds every job the user runs.
demo: venv
	$(VENV)/bin/trainctl submit train.py --source-dir examples/digits \
		--instance-count 2 --distribution torch_distributed \
		-p epochs=12 -p lr=0.1 -p seed=0
	@echo "See it again: trainctl jobs (then status, logs, artifacts JOB), after . $(VENV)/bin/activate"

test: venv
	$(VENV)/bin/ruff check .
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --quiet
	@# The site is self-contained: no page loads a font, style or script from elsewhere.
	@if grep -rlE '<(link|script)[^>]+(href|src)="(https?:)?//' site --include='*.html'; then \
		echo "the pages above load something from elsewhere"; exit 1; fi
	@# Bytecode for the package and the tests' scripts, written once: the suite starts ~1,500
	@# Python processes, and where PYTHONDONTWRITEBYTECODE is set (CI) each one would compile
	@# every trainctl module it imports again (0.02-0.05 CPU-s a process).
	$(PY) -m compileall -q src/trainctl tests examples bench > /dev/null
	$(VENV)/bin/pytest -q -n $(TEST_WORKERS) --dist loadfile
	@test -f .pytest_cache/session-finished || { echo "pytest did not finish its session"; exit 1; }

# tests/unit (no process, no connection) and the few end-to-end checks marked smoke.
test-fast: venv
	$(VENV)/bin/ruff check .
	$(VENV)/bin/pytest -q -m "unit or smoke"

# The GPU tier (tests/gpu: NCCL, CUDA memory, CUDA's generators) and the library tests that
# differ where CUDA exists. Without CUDA every GPU test skips with its reason (-rs lists it).
test-gpu: venv
	$(VENV)/bin/pytest -q -rs tests/gpu tests/train/test_train_lib.py tests/e2e/test_gpus.py

test-deps:
	tools/test-deps.sh

# The tests that look at the machine's parts, with those parts hidden (no engine, a docker
# CLI without its daemon, no sshd, no Slurm) and a CPU hog beside them: a newcomer's busy
# machine. Needs root or unprivileged user namespaces (see the script).
test-bare: venv
	VENV=$(VENV) tools/bare-machine.sh

# Not part of `test`: timings, not assertions. Exits non-zero naming any missed goal.
# BENCH_ARGS="--quick" or "--only upload" for a partial run.
bench: venv
	$(PY) -m bench.run $(BENCH_ARGS)

# strict: a broken link, a missing page or API reference fails the build
docs: venv
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict

lint: venv
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

format: venv
	$(VENV)/bin/ruff format .
	$(VENV)/bin/ruff check --fix .

clean:
	rm -rf $(VENV) site .pytest_cache .ruff_cache
