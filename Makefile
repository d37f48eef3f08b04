# The two commands of the quick start: `make demo` and `make test`.
# Each creates .venv when missing and installs crossrt into it (editable, with the dev extra).

PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed-stamp

# Real ONNX models shipped inside PyPI wheels, used by tests/realmodels. --no-deps: we need the
# model files only, not the packages' runtime dependencies (silero-vad would pull in torch).
MODEL_WHEELS := rapidocr-onnxruntime==1.4.4 silero-vad==6.2.3

.PHONY: demo test lint bench clean

$(STAMP): pyproject.toml Makefile
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	$(PY) -m pip install --quiet --no-deps $(MODEL_WHEELS)
	touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/crossrt ls
	$(PY) examples/digits/demo.py

lint: $(STAMP)
	$(VENV)/bin/ruff check src tests benchmarks examples
	$(VENV)/bin/ruff format --check src tests benchmarks examples
	$(VENV)/bin/mypy

test: lint
	$(PY) -m pytest

bench: $(STAMP)
	$(PY) benchmarks/overhead.py

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache build src/*.egg-info
