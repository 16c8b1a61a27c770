# One Makefile for set-up, the service, tests, lint and benchmarks.
# Every target installs what it needs into .venv first, so each works on a fresh clone.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
INDEX ?= .index/samples
# llama.cpp must not target the build machine's CPU: a native build crashes on CPUs that
# advertise AMX. pip caches the built wheel, so only the first set-up compiles (~15 min).
LLAMA_CPP_VERSION := 0.3.36
LLAMA_CMAKE_ARGS := -DLLAVA_BUILD=OFF -DGGML_NATIVE=OFF -DGGML_AVX2=ON -DGGML_FMA=ON \
	-DGGML_F16C=ON -DGGML_AVX512=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_TILE=OFF -DGGML_AMX_BF16=OFF

# The browser tests drive Debian's Chromium (Playwright's own browser download does not work
# on these machines); installed with apt, through sudo when not root.
CHROMIUM := /usr/bin/chromium
# Scanned PDFs and images are read by Debian's tesseract (English data), installed the same way.
TESSERACT := /usr/bin/tesseract
# The offline test runs a server and the CLI in a network namespace with only loopback up:
# util-linux's unshare and iproute2's ip.
IPROUTE := /usr/sbin/ip
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
# The chat page's libraries (PDF.js, marked, DOMPurify): from the npm registry, pinned by
# package-lock.json, copied with their licences where the page serves them (/ui/vendor/).
VENDOR := ragchains/web/vendor
VENDOR_STAMP := $(VENDOR)/.installed
# npm wherever it is installed; where it is not, Debian's (with Node.js), through apt.
NPM := $(shell command -v npm || echo /usr/bin/npm)

.PHONY: setup quickstart test test-long eval lint format bench clean

setup: $(TESSERACT) $(STAMP) $(VENDOR_STAMP)

$(STAMP): pyproject.toml setup.py
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info[:2] == (3, 11) else "ragchains needs Python 3.11 (set PYTHON=python3.11)")'
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	# torch first, pinned: 2.13.0 is a CPU build; a looser pin pulls a multi-GB CUDA build.
	$(BIN)/pip install --quiet torch==2.13.0
	@echo "installing llama-cpp-python $(LLAMA_CPP_VERSION) (compiles on a new machine: ~15 min)"
	CMAKE_ARGS="$(LLAMA_CMAKE_ARGS)" $(BIN)/pip install --quiet llama-cpp-python==$(LLAMA_CPP_VERSION)
	$(BIN)/pip install --quiet -e '.[dev]'
	@echo "exporting the embedder to int8 OpenVINO (once, about a minute; kept in ~/.cache/ragchains)"
	$(BIN)/python -m ragchains.retrievers.openvinoembedder
	touch $(STAMP)

# The main job on the embedded defaults: no network, no API key. Serves until Ctrl-C.
quickstart: setup
	$(BIN)/ragchains ingest samples --index $(INDEX)
	$(BIN)/ragchains serve --index $(INDEX)

$(VENDOR_STAMP): package.json package-lock.json | $(NPM)
	$(NPM) ci --ignore-scripts --omit=optional --no-audit --no-fund --loglevel=error
	rm -rf $(VENDOR) && mkdir -p $(VENDOR)/pdfjs $(VENDOR)/marked $(VENDOR)/dompurify
	cp node_modules/pdfjs-dist/build/pdf.min.mjs node_modules/pdfjs-dist/build/pdf.worker.min.mjs \
		node_modules/pdfjs-dist/LICENSE $(VENDOR)/pdfjs/
	cp -r node_modules/pdfjs-dist/standard_fonts node_modules/pdfjs-dist/cmaps \
		node_modules/pdfjs-dist/wasm node_modules/pdfjs-dist/iccs $(VENDOR)/pdfjs/
	cp node_modules/marked/lib/marked.esm.js node_modules/marked/LICENSE $(VENDOR)/marked/
	cp node_modules/dompurify/dist/purify.es.mjs node_modules/dompurify/LICENSE $(VENDOR)/dompurify/
	touch $@

$(NPM):
	@echo "installing Debian's npm (and Node.js) for the chat page's libraries"
	$(SUDO) apt-get update -qq
	DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq npm

$(TESSERACT):
	@echo "installing Debian's tesseract for OCR of scanned PDFs and images"
	$(SUDO) apt-get update -qq
	DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq tesseract-ocr tesseract-ocr-eng

$(IPROUTE):
	@echo "installing Debian's iproute2 for the networking-disabled test"
	$(SUDO) apt-get update -qq
	DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq iproute2

$(CHROMIUM):
	@echo "installing Debian's chromium for the browser tests"
	$(SUDO) apt-get update -qq
	DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq chromium

# One worker per core, a test file to a worker (a file's fixtures and servers stay in one
# process); most tests wait on a server, a browser or a subprocess, so two workers on two
# cores take 9.5 minutes where one took 16.
test: setup $(CHROMIUM) $(IPROUTE)
	$(BIN)/pytest -n auto --dist loadfile --durations=25 -m "not long and not eval"

# The tests marked long: full-strength runs of what the suite checks with a representative
# (a client leaving at ten points of each route rather than once mid-answer: about 10 minutes).
test-long: setup $(CHROMIUM) $(IPROUTE)
	$(BIN)/pytest -n auto --dist loadfile --durations=10 -m long

# Evaluation runs kept out of the suite (each has a representative there): whole question
# sets asked of a real model through the served routes, with the suite's assertions.
eval: setup
	$(BIN)/pytest -n auto --dist loadfile --durations=10 -m eval

# mypy cannot follow the editable install's import hook (package-dir maps ragchains.chains to
# chains/, ...): scripts/typecheck.py runs it on links laid out as the wheel is.
lint: setup
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/python scripts/typecheck.py

format: setup
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

bench: setup
	$(BIN)/pip install --quiet -e '.[dev,bench]'
	$(BIN)/python -m bench.retrieval_latency
	$(BIN)/python -m bench.ingest_throughput
	$(BIN)/python -m bench.server_overhead
	$(BIN)/python -m bench.postgres_store
	$(BIN)/python -m bench.hostile_filters
	$(BIN)/python -m bench.soak
	$(BIN)/python -m bench.turn_latency
	$(BIN)/python -m bench.access_scoring
	$(BIN)/python -m bench.ocr_quality
	$(BIN)/python -m bench.office_formats
	$(BIN)/python -m bench.parse_workers
	$(BIN)/python -m bench.upload_answerable

clean:
	rm -rf .index .pytest_cache .ruff_cache .mypy_cache build node_modules $(VENDOR)
