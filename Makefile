# Everyday commands. The tests read real data and models from ../shared (see README, "Tests").
export RAYSENT_DATA_DIR ?= ../shared/data
export RAYSENT_MODEL_DIR ?= ../shared/models
export HF_HUB_OFFLINE ?= 1
export RAY_AUTH_MODE ?= disabled

.PHONY: install check lint typecheck test test-all

install:  ## the package with its test and dev tools (CPU torch first: a bare `torch` pulls a CUDA build)
	pip install torch==2.13.0
	pip install -e ".[test,dev]"

check: lint typecheck test  ## what to run before a commit

lint:
	ruff check raysent tests

typecheck:  ## the whole package (pyproject.toml, [tool.mypy]; tests/test_types.py runs it too)
	python -m mypy

test:  ## the fast tier: trains nothing, imports no Ray (tests/conftest.py fails a test that does); 75-78 s on 2 cores
	python -m pytest -q -m "not slow" tests

test-all:  ## the whole suite, as CI runs it (.ci/run); 18-19 min on 2 cores (docs/testing.md)
	python -m pytest -q tests
