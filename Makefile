# One Makefile for set-up, the service, tests, lint and benchmarks.
# Every target installs what it needs into .venv first, so each works on a fresh clone.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
INDEX ?= .index/samples

.PHONY: setup quickstart test lint format bench clean

setup: $(STAMP)

$(STAMP): pyproject.toml
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info[:2] == (3, 11) else "ragchains needs Python 3.11 (set PYTHON=python3.11)")'
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	# torch first, pinned: 2.13.0 is a CPU build; a looser pin pulls a multi-GB CUDA build.
	$(BIN)/pip install --quiet torch==2.13.0
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $(STAMP)

# The main job on the embedded defaults: no network, no API key.
quickstart: setup
	$(BIN)/ragchains ingest samples --index $(INDEX)
	$(BIN)/ragchains retrieve --index $(INDEX) "what does the standard plan cost" --k 3

test: setup
	$(BIN)/pytest

lint: setup
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

format: setup
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

bench: setup
	$(BIN)/pip install --quiet -e '.[dev,bench]'
	$(BIN)/python -m bench.retrieval_latency
	$(BIN)/python -m bench.scifact_quality
	$(BIN)/python -m bench.ingest_throughput

clean:
	rm -rf .index .pytest_cache .ruff_cache .mypy_cache
