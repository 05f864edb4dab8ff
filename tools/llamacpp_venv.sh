#!/usr/bin/env bash
# The llama.cpp peer of tools/bench_generate.py: llama-cpp-python built from its sdist with CMake in
# a venv of its own (default /tmp/edge-runtime-llamacpp), the sdist unpacked under <venv>/src so that
# tools/llamacpp_worker.py finds llama.cpp's convert_hf_to_gguf.py and gguf-py there.
# Usage: bash tools/llamacpp_venv.sh [VENV]   then   EDGE_RUNTIME_LLAMACPP_PYTHON=VENV/bin/python
# Takes ~10 minutes on 2 cores (the C++ build). Never run by CI unless EDGE_RUNTIME_CI_LLAMACPP=1.
set -euo pipefail
VENV="${1:-/tmp/edge-runtime-llamacpp}"
VERSION=0.3.36
SRC="$VENV/src/llama_cpp_python-$VERSION"

python3 -m venv "$VENV"
if [ ! -f "$SRC/pyproject.toml" ]; then
    "$VENV/bin/pip" download -q --no-deps --no-binary :all: "llama-cpp-python==$VERSION" -d "$VENV/src"
    tar xzf "$VENV/src/llama_cpp_python-$VERSION.tar.gz" -C "$VENV/src"
fi

on_off() { if grep -qw "$1" /proc/cpuinfo; then echo ON; else echo OFF; fi; }
if [ "$(uname -m)" = x86_64 ]; then
    # GGML_NATIVE would enable AMX where the CPU lists it; inside a VM q4_0/q8_0 generation then
    # crashes. So: no native tuning, every x86 extension the CPU lists switched on by name, AMX off.
    CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_AVX=$(on_off avx) -DGGML_AVX2=$(on_off avx2) -DGGML_FMA=$(on_off fma)"
    CMAKE_ARGS+=" -DGGML_F16C=$(on_off f16c) -DGGML_AVX_VNNI=$(on_off avx_vnni) -DGGML_AVX512=$(on_off avx512f)"
    CMAKE_ARGS+=" -DGGML_AVX512_VBMI=$(on_off avx512vbmi) -DGGML_AVX512_VNNI=$(on_off avx512_vnni)"
    CMAKE_ARGS+=" -DGGML_AVX512_BF16=$(on_off avx512_bf16) -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF"
else
    CMAKE_ARGS="-DGGML_NATIVE=ON"
fi
export CMAKE_ARGS CMAKE_BUILD_PARALLEL_LEVEL="${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc)}"
"$VENV/bin/pip" install -q "$SRC" numpy
# The converter's own needs (torch CPU as the test extra pins it; transformers for the config and
# tokenizer; sentencepiece, which its Qwen2 path imports before it falls back to BPE) and the gguf
# package of the same llama.cpp commit.
"$VENV/bin/pip" install -q torch==2.13.0 transformers==4.57.6 sentencepiece "$SRC/vendor/llama.cpp/gguf-py"
"$VENV/bin/python" -c "import llama_cpp; print('llama-cpp-python', llama_cpp.__version__)"
