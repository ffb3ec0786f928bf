# Two entry points for a fresh machine: `make demo` and `make test` (README.md).
# Each step leaves a stamp or a verified cache entry, so a second run redoes nothing.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.spekula-installed
# llama.cpp is built for this CPU's instruction sets (GGML_NATIVE=OFF, AMX off; src/spekula/llamacpp_build.py),
# and its stamp carries the build key: a checkout that moves to another CPU gets the wheel for that CPU.
LLAMA_KEY   := $(shell $(PYTHON) src/spekula/llamacpp_build.py key)
LLAMA_STAMP := $(VENV)/.llamacpp-$(LLAMA_KEY)
# The models the demo and the tests use; `spekula models fetch` skips what is already verified.
MODELS := smollm2-135m qwen2.5-coder-0.5b qwen2.5-coder-1.5b

.PHONY: setup models demo lint test test-fast llama-server

$(STAMP): pyproject.toml requirements/base.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check -r requirements/base.txt
	$(PY) -m pip install --quiet --disable-pip-version-check --no-deps -e .
	touch $(STAMP)

$(LLAMA_STAMP): $(STAMP) requirements/llamacpp.txt $(wildcard patches/llamacpp/*.patch)
	$(PY) -m spekula.llamacpp_build install
	rm -f $(VENV)/.llamacpp-*
	touch $@

setup: $(STAMP) $(LLAMA_STAMP)

# llama.cpp's own server, from the same llama.cpp source, for benchmarks only (~10 minutes on 2 cores; never
# part of demo or test): scripts/llama_server_compare.py and scripts/server_compare.sh start it as a baseline;
# `spekula bench --endpoint URL` measures one already running.
llama-server: $(VENV)/bin/llama-server

$(VENV)/bin/llama-server: $(LLAMA_STAMP)
	$(PY) -m spekula.llamacpp_build server --out $@

models: setup
	$(PY) -m spekula models fetch $(MODELS)

# A code edit whose answer re-emits the prompt, drafted from the context by suffix lookup, on the default
# runtime, then the same prompt decoded plainly on that runtime: the speedup and whether the outputs match.
demo: models
	$(PY) -m spekula generate --draft suffix --compare

# ruff first: style and lint (pyproject.toml, [tool.ruff]), and mypy's types over src/spekula ([tool.mypy];
# its .mypy_cache makes a second run quick), then every test
lint: setup
	$(PY) -m ruff check src tests scripts
	$(PY) -m ruff format --check src tests scripts
	$(PY) -m mypy

test: models lint
	$(PY) -m pytest

# Every test that needs no model weights (tests that load them are marked `model`).
test-fast: lint
	$(PY) -m pytest -m "not model"
