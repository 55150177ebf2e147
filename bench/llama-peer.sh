#!/usr/bin/env bash
# Builds llama.cpp's llama-bench, the speed peer, from the source that the llama-cpp-python sdist
# on PyPI vendors (so nothing but PyPI is needed), pinned to one version.
# usage: bench/llama-peer.sh DEST [cpu|cuda]   -> DEST/build-<kind>/bin/llama-bench
set -euo pipefail
dest=${1:?usage: llama-peer.sh DEST [cpu|cuda]}; kind=${2:-cpu}
version=${LLAMA_CPP_PYTHON_VERSION:-0.3.36}   # vendors llama.cpp 0c1e570 (knows Q1_0 and Q2_0)
mkdir -p "$dest"; dest=$(cd "$dest" && pwd)
bench="$dest/build-$kind/bin/llama-bench"
if [ -x "$bench" ]; then echo "$bench"; exit 0; fi
src="$dest/llama.cpp"
if [ ! -f "$src/CMakeLists.txt" ]; then
  tmp=$(mktemp -d)
  python3 -m pip download -q --no-deps --no-binary llama-cpp-python "llama-cpp-python==$version" -d "$tmp"
  tar xzf "$tmp"/llama_cpp_python-*.tar.gz -C "$tmp"
  rm -rf "$src"; mv "$tmp"/llama_cpp_python-*/vendor/llama.cpp "$src"; rm -rf "$tmp"
fi
command -v cmake >/dev/null && command -v ninja >/dev/null || python3 -m pip install -q cmake ninja
flags=(-G Ninja -DCMAKE_BUILD_TYPE=Release -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF
       -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_APP=OFF)
if [ "$kind" = cuda ]; then flags+=(-DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90); else flags+=(-DGGML_NATIVE=ON); fi
cmake -S "$src" -B "$dest/build-$kind" "${flags[@]}" > "$dest/build-$kind.log" 2>&1
cmake --build "$dest/build-$kind" -j"$(nproc)" --target llama-bench >> "$dest/build-$kind.log" 2>&1
echo "$bench"
