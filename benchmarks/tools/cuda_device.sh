#!/usr/bin/env bash
# The CUDA checks (tests/gpu and benchmarks/cuda.py) on a session's device machine, which
# cannot download anything and takes at most 64 MiB of files per call: onnxruntime-gpu's wheel
# (about 250 MB) travels in parts, one per call, and the last call puts it together. The
# machine's own Python 3.12 has numpy, onnx, torch, cupy and NVIDIA's CUDA 13 wheels already.
#
#   here:  bash benchmarks/tools/cuda_device.sh prepare
#          -> .cuda/part-00 ... part-NN, .cuda/name, .cuda/wheels/ (git-ignored)
#   there: one call per part, carrying it (and, with the first, .cuda/name and .cuda/wheels);
#          the last call also runs:  bash benchmarks/tools/cuda_device.sh check
#          -> $OUT/gpu-tests.log, $OUT/cuda.json, $OUT/cuda.md, $OUT/cuda-bench.log
#
# docs/drivers.md ("Checking the CUDA path") has the calls written out. PYVER=3.11 prepares
# wheels for this machine's Python instead (to try the steps here, where tests/gpu skips).
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PYTHON:-python3}
pinned() { grep -E "^$1==" "$2" | head -1 | cut -d= -f3; }

case "${1:-}" in
prepare)
    ort=$(pinned onnxruntime-gpu requirements/cuda-lock.txt)
    converter=$(pinned onnxconverter-common requirements/lock.txt)
    rm -rf .cuda
    mkdir -p .cuda/wheels
    "$PY" -m pip download --quiet --no-deps --only-binary=:all: --python-version "${PYVER:-3.12}" \
        --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
        --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d .cuda/wheels \
        "onnxruntime-gpu==$ort" "onnxconverter-common==$converter"
    wheel=$(ls .cuda/wheels/onnxruntime_gpu-*.whl)
    basename "$wheel" >.cuda/name
    split -b 56m -d "$wheel" .cuda/part-  # under the 64 MiB a call carries, with the tree
    rm "$wheel"
    ls -l .cuda .cuda/wheels
    ;;
check)
    wheel=/tmp/$(cat .cuda/name)
    cat .cuda/part-* >"$wheel"
    "$PY" -m pip install --quiet --no-index --no-deps --no-compile --upgrade --target /tmp/site \
        "$wheel" .cuda/wheels/*.whl
    export PYTHONPATH=/tmp/site:$PWD/src PYTHONUNBUFFERED=1
    out=${OUT:-/tmp/cuda-out}
    mkdir -p "$out"
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv || true
    "$PY" -c "import onnxruntime as o; print('onnxruntime', o.__version__, o.get_available_providers())"
    status=0
    "$PY" -m pytest tests/gpu -q -p no:cacheprovider 2>&1 | tee "$out/gpu-tests.log" || status=1
    "$PY" benchmarks/cuda.py --out "$out/cuda.json" 2>&1 | tee "$out/cuda-bench.log" || status=1
    exit $status
    ;;
*)
    echo "usage: $0 prepare | check" >&2
    exit 2
    ;;
esac
