#!/usr/bin/env bash
# The CUDA backend's GPU run in one go: the kernel harness (checks against the CPU reference,
# GEMV bandwidth, whole-model checks, 27B decode/prefill/depth) and `niwaki bench` on synthetic
# 27B files (and llama.cpp's llama-bench on the same files when LLAMA_BENCH is set). Usage:
# bench-h200.sh BIN_DIR OUT_DIR [FORMATS]
#   BIN_DIR holds release builds of `niwaki` (feature cuda) and the harness example (as
#   `harness` or `examples/harness`, e.g. target/release).
set -uo pipefail
bin=${1:?bin dir}
out=${2:?out dir}
formats=${3:-Q2_0,Q1_0,PQ2_0,PTQ1_0}
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export NIWAKI_CUDA_CACHE=${NIWAKI_CUDA_CACHE:-/tmp/niwaki-cuda-cache}
harness=$bin/harness
[ -x "$harness" ] || harness=$bin/examples/harness
mkdir -p "$out"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv | tee "$out/gpu.txt"
NIWAKI_HARNESS_27B=$formats "$harness" "$out" 2>&1 | tee "$out/harness.log"
for f in ${CLI_FORMATS:-Q2_0 Q1_0}; do
    "$bin/niwaki" synth --preset 27b --format "$f" --model "/tmp/$f.gguf" >/dev/null 2>&1 || exit 1
    # The peer on the same file in the same run, when LLAMA_BENCH points at a CUDA llama-bench
    # (`bench/llama-peer.sh <dir> cuda` builds one on the GPU machine).
    if [ -n "${LLAMA_BENCH:-}" ]; then
        "$LLAMA_BENCH" -m "/tmp/$f.gguf" -ngl 99 -fa 1 -p 512 -n 128 -r 3 2>&1 | tee -a "$out/peer.log"
    fi
    "$bin/niwaki" bench --model "/tmp/$f.gguf" --device cuda -p 512 -n 128 -r 3 2>&1 | tee -a "$out/cli.log"
    rm -f "/tmp/$f.gguf"
done
