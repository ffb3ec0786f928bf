# Two entry points for a fresh machine: `make demo` and `make test` (README.md).
# Each step leaves a stamp or a verified cache entry, so a second run redoes nothing.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.spekula-installed
# The models the demo and the tests use; `spekula models fetch` skips what is already verified.
MODELS := smollm2-135m qwen2.5-coder-0.5b qwen2.5-coder-1.5b

.PHONY: setup models demo test test-fast

$(STAMP): pyproject.toml requirements/base.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	CMAKE_BUILD_PARALLEL_LEVEL=2 $(PY) -m pip install --quiet --disable-pip-version-check -r requirements/base.txt
	$(PY) -m pip install --quiet --disable-pip-version-check --no-deps -e .
	touch $(STAMP)

setup: $(STAMP)

models: setup
	$(PY) -m spekula models fetch $(MODELS)

demo: models
	$(PY) -m spekula generate --compare

test: models
	$(PY) -m pytest

# Every test that needs no model weights (tests that load them are marked `model`).
test-fast: setup
	$(PY) -m pytest -m "not model"
