# The two commands of the quickstart, and their friends.
#   make run    the main job: `harness ci` on the default tiers (what the GitHub workflow runs)
#   make test   the full CPU test run (what .ci/run calls)
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

.PHONY: run test venv lock clean help

help:
	@echo "make run     the main job: harness ci on the default tiers (reports in reports/)"
	@echo "make test    the full CPU test run (what .ci/run calls); ARGS='...' adds pytest args"
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
	$(VENV)/bin/harness ci

# pytest's exit code 5 means nothing was collected: a test run that ran nothing must not pass.
test: $(STAMP)
	@rc=0; $(PY) -m pytest $(ARGS) || rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "!! pytest collected no tests (exit 5): failing the run" >&2; fi; \
	exit $$rc

lock:
	PYTHON=$(PYTHON) requirements/lock.sh

clean:
	rm -rf $(VENV) reports .pytest_cache .hypothesis .asv
