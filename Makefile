# The two commands of the quickstart, and their friends.
#   make run    the main job: `harness ci` (pull-request mode: only the tests and benchmarks the
#               change since main reaches; make run CI_ARGS=--full for every one)
#   make test   lint, format and type checks, then the full CPU test run (what .ci/run calls),
#               on one xdist worker per core
#   make test-under-load   make test with LOAD busy loops beside it (default 2)
# Each builds .venv from requirements/cpu.lock first when it is missing or older than the lock
# or pyproject.toml, so on a fresh machine either is the only command needed.
SHELL := /bin/bash
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV ?= .venv
PY := $(VENV)/bin/python
LOCK := requirements/cpu.lock
STAMP := $(VENV)/.harness-installed
# Extra pytest arguments for `make test`, e.g. make test ARGS="-x -k quarantine".
ARGS ?=
# Extra arguments for `harness ci` in `make run`, e.g. make run CI_ARGS="--full --no-perf".
CI_ARGS ?=
# xdist workers for `make test`: one per core this machine has (WORKERS=0: one process, no
# xdist). harness.xdist_groups keeps the distributed tier on one worker, and an integration
# module with a module-scoped fixture on one (docs/harness.md, "Parallel runs").
WORKERS ?= $(shell nproc 2>/dev/null || echo 2)
# Busy loops `make test-under-load` runs beside the tests.
LOAD ?= 2

.PHONY: run test test-under-load lint venv lock clean help

help:
	@echo "make run     the main job: harness ci, what the change reaches (CI_ARGS=--full: all)"
	@echo "make test    make lint, then the full CPU test run (what .ci/run calls); ARGS='...' adds pytest args"
	@echo "make test-under-load   make test beside LOAD busy loops (default 2): no test may need a quiet machine"
	@echo "make lint    ruff (lint and format check) and mypy, as make test runs them"
	@echo "make venv    build .venv from $(LOCK) if it is missing or stale"
	@echo "make lock    regenerate requirements/*.lock from requirements/cpu.in"
	@echo "make clean   remove .venv, reports and caches"

venv: $(STAMP)

# A stale venv is rebuilt from scratch rather than patched: only then does it match the lock
# exactly (pip install -r never removes what the lock dropped).
$(STAMP): $(LOCK) pyproject.toml
	@echo ">> building $(VENV) from $(LOCK) with $(PYTHON)"
	rm -rf $(VENV)
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check -r $(LOCK)
	$(PY) -m pip install --quiet --disable-pip-version-check --no-deps -e .
	touch $(STAMP)

run: $(STAMP)
	$(VENV)/bin/harness ci $(CI_ARGS)

# Lint, format and types gate the tests: a style or type error fails `make test` (and so
# .ci/run) before any test runs. pytest's exit code 5 means nothing was collected: a test run
# that ran nothing must not pass (under xdist too: the controller exits 5 when no worker
# collected anything). The seed is drawn once by the controller and handed to every worker, so
# one seed replays the whole run, printed in the header.
XDIST_ARGS := $(if $(filter 0,$(WORKERS)),,-p harness.xdist_groups --numprocesses=$(WORKERS))
test: $(STAMP) lint
	@rc=0; $(PY) -m pytest $(XDIST_ARGS) $(ARGS) || rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "!! pytest collected no tests (exit 5): failing the run" >&2; fi; \
	exit $$rc

# make test with LOAD busy loops running beside it, as on a shared runner whose other jobs
# keep the cores busy: no test may depend on the machine being quiet. The loops are started
# here and ended here by their process ids, whatever the outcome.
test-under-load: $(STAMP)
	@pids=(); for _ in $$(seq $(LOAD)); do bash -c 'while :; do :; done' & pids+=($$!); done; \
	trap 'kill $${pids[*]} 2>/dev/null' EXIT; \
	echo ">> $(LOAD) busy loop(s) running beside the tests (PIDs $${pids[*]})"; \
	$(MAKE) --no-print-directory test

# Lint, format and types: the configuration is in pyproject.toml ([tool.ruff], [tool.mypy]).
lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy

lock:
	PYTHON=$(PYTHON) requirements/lock.sh

clean:
	rm -rf $(VENV) reports .pytest_cache .hypothesis .asv

# The GPU runner profile (the gpu job of .github/workflows/ci.yml): the image's Python already
# carries CUDA builds of torch and triton that pip must not replace, so the venv sees the
# system site-packages and installs requirements/gpu.lock without those two.
# `harness env check --lock requirements/gpu.lock` then checks the image's torch and triton
# against the lock's ranges. GPU_PYTHON is the image's interpreter.
GPU_PYTHON ?= python3
GPU_LOCK := requirements/gpu.lock
GPU_STAMP := $(VENV)/.harness-gpu-installed

.PHONY: venv-gpu

venv-gpu: $(GPU_STAMP)

$(GPU_STAMP): $(GPU_LOCK) pyproject.toml
	@echo ">> building $(VENV) on $(GPU_PYTHON)'s torch and triton from $(GPU_LOCK)"
	$(GPU_PYTHON) -c "import torch, triton; print('image: torch', torch.__version__, 'triton', triton.__version__)"
	rm -rf $(VENV)
	$(GPU_PYTHON) -m venv --system-site-packages $(VENV)
	@# When the image's Python is itself a venv (the H200 image's python3 is
	@# /opt/torch/.venv/bin/python3), --system-site-packages reaches only its base interpreter's
	@# packages, without torch. A .pth file then adds the image venv's site-packages after
	@# .venv's own: the order --system-site-packages gives. Empty (a no-op) otherwise.
	$(GPU_PYTHON) -c "import site, sys; sys.prefix != sys.base_prefix and print('import site; ' + '; '.join('site.addsitedir(%r)' % p for p in site.getsitepackages()))" \
	  > "$$($(PY) -c 'import sysconfig; print(sysconfig.get_path("purelib"))')/_image_site_packages.pth"
	$(PY) -c "import torch, triton" || { echo "!! $(VENV) does not see $(GPU_PYTHON)'s torch and triton" >&2; exit 1; }
	grep -v -E '^(torch|triton)([<>=!~ ;]|$$)' $(GPU_LOCK) > $(VENV)/gpu-requirements.txt
	$(PY) -m pip install --quiet --disable-pip-version-check -r $(VENV)/gpu-requirements.txt
	$(PY) -m pip install --quiet --disable-pip-version-check --no-deps -e .
	touch $(GPU_STAMP)
