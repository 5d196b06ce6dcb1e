# Two entry points: `make run` (the pipeline on the embedded default) and `make test`.
# Both create .venv on first use and reinstall only when pyproject.toml changes.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

# Quiet, offline Prefect with its state inside the project.
export PREFECT_HOME := $(CURDIR)/.prefect
export PREFECT_SERVER_ANALYTICS_ENABLED := false
export DVC_NO_ANALYTICS := 1
# dvc.yaml stage commands call `python`: the project environment's.
export PATH := $(CURDIR)/$(VENV)/bin:$(PATH)

.PHONY: setup run test lint clean

setup: $(STAMP)

$(STAMP): pyproject.toml Makefile
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q -e '.[test]'
	$(BIN)/python -m pip install -q --no-deps torchrec==1.8.0
	touch $(STAMP)

# up to date: nothing to start (1 s); otherwise one local Prefect server for every stage that runs
run: setup
	test -d .dvc || $(BIN)/dvc init -q $$(git rev-parse --git-dir >/dev/null 2>&1 || echo --no-scm)
	$(BIN)/dvc config core.analytics false
	$(BIN)/dvc status -q || $(BIN)/python -m pipeline.serve -- $(BIN)/dvc repro

# lint and types first: seconds, and they fail before the suite's minutes
# two workers, a test file each at a time (its module fixtures built once); the longest files start first (conftest)
test: lint
	$(BIN)/python -m pytest -n 2 --dist loadfile --no-loadscope-reorder

lint: setup
	$(BIN)/ruff check dreamshard stages pipeline benchmarks experiments tools tests
	$(BIN)/mypy

clean:
	rm -rf $(VENV) .prefect
