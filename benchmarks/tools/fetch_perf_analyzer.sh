#!/usr/bin/env bash
# Fetch Triton's perf_analyzer into DIR (default benchmarks/.perf_analyzer) for benchmarks/serve.py.
#
# PyPI's `perf-analyzer` is an empty placeholder; the binary last shipped inside the tritonclient
# 2.48.0 wheel (bin/perf_analyzer). It links libb64 (Debian's libb64-0d) and libcudart.so.12
# (PyPI's nvidia-cuda-runtime-cu12: loaded, never used without a GPU). Every file is pinned by
# its sha256; DIR/perf_analyzer is a wrapper that sets LD_LIBRARY_PATH to DIR/lib.
set -euo pipefail

DIR=${1:-benchmarks/.perf_analyzer}
PY=${PY:-.venv/bin/python}

TRITONCLIENT=tritonclient-2.48.0-py3-none-manylinux1_x86_64.whl
TRITONCLIENT_SHA=7074885798e8a711fedaf94d6dd77f310973fe2ebf29fb2837db350a43e2d6a5
CUDART=nvidia_cuda_runtime_cu12-12.9.79-py3-none-manylinux2014_x86_64.manylinux_2_17_x86_64.whl
CUDART_SHA=25bba2dfb01d48a9b59ca474a1ac43c6ebf7011f1b0b8cc44f54eb6ac48a96c3
LIBB64=libb64-0d_1.2-5+b1_amd64.deb
LIBB64_SHA=b0e1d6fde8bdccc18c3884144aede064dc82464dd4777275fa80e74c05583e82

mkdir -p "$DIR/download" "$DIR/lib"
cd "$DIR/download"
[ -f "$TRITONCLIENT" ] || "$OLDPWD/$PY" -m pip download --quiet --no-deps tritonclient==2.48.0 \
    --only-binary :all: --platform manylinux1_x86_64 -d .
[ -f "$CUDART" ] || "$OLDPWD/$PY" -m pip download --quiet --no-deps nvidia-cuda-runtime-cu12==12.9.79 \
    --only-binary :all: --platform manylinux2014_x86_64 -d .
# A fresh machine may have no package lists yet: read them once, then try again.
[ -f "$LIBB64" ] || apt-get download libb64-0d=1.2-5+b1 2>/dev/null \
    || { apt-get update -qq >/dev/null 2>&1 && apt-get download libb64-0d=1.2-5+b1 2>/dev/null; }
sha256sum --check --quiet - <<SUMS
$TRITONCLIENT_SHA  $TRITONCLIENT
$CUDART_SHA  $CUDART
$LIBB64_SHA  $LIBB64
SUMS

unzip -o -q -j "$TRITONCLIENT" 'tritonclient-2.48.0.data/data/bin/perf_analyzer' -d ..
unzip -o -q -j "$CUDART" 'nvidia/cuda_runtime/lib/libcudart.so.12' -d ../lib
dpkg-deb --fsys-tarfile "$LIBB64" | tar -x -O ./usr/lib/x86_64-linux-gnu/libb64.so.0d > ../lib/libb64.so.0d
cd ..
mv perf_analyzer perf_analyzer.bin && chmod +x perf_analyzer.bin
cat > perf_analyzer <<'WRAP'
#!/bin/sh
here=$(dirname "$(readlink -f "$0")")
LD_LIBRARY_PATH="$here/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" exec "$here/perf_analyzer.bin" "$@"
WRAP
chmod +x perf_analyzer
./perf_analyzer --version
echo "perf_analyzer: $(pwd)/perf_analyzer"
