#!/usr/bin/env bash
# Stages the CUDA backend for a GPU host that has a driver but no compiler: release builds of
# `niwaki` (feature cuda) and of the kernel harness, stripped, and the kernel cache compiled
# here by NVRTC (taken from PyPI) for each model given, with its device code, so that the host
# compiles nothing at start. Needs no GPU. Usage:
# crates/cuda/stage.sh DEST [MODEL.gguf ...]
#   Writes DEST/x/{niwaki,harness,cache/,BUILD} and DEST/stage.tar.xz (which unpacks to x/).
#   On the GPU host: `tar xJf stage.tar.xz -C /tmp`, then NIWAKI_CUDA_CACHE=/tmp/x/cache with
#   `bench-h200.sh /tmp/x OUT` or `ab-h200.sh /tmp/x OUT …`.
#   ARCH (default sm_90a: H100, H200) is the architecture the cache is compiled for;
#   NVRTC_VERSION (default 13.0.88) the nvidia-cuda-nvrtc wheel's; NVRTC_DIR, a folder that
#   already holds that wheel's files (`pip install --target`), skips the download.
set -euo pipefail
dest=${1:?usage: stage.sh DEST [MODEL.gguf ...]}
shift
arch=${ARCH:-sm_90a}
root=$(cd "$(dirname "$0")/../.." && pwd)
mkdir -p "$dest"
dest=$(cd "$dest" && pwd)
for m in "$@"; do [ -f "$m" ] || { echo "no model file $m" >&2; exit 2; }; done

cd "$root"
cargo build --release --features niwaki/cuda -p niwaki
cargo build --release -p niwaki-cuda --example harness
rm -rf "$dest/x"
mkdir -p "$dest/x/cache"
cp target/release/niwaki target/release/examples/harness "$dest/x/"
# Without their debug info: 15 MB in place of about 100.
command -v strip >/dev/null && strip "$dest/x/niwaki" "$dest/x/harness"
{
    git rev-parse --short HEAD
    git status --porcelain --untracked-files=no | sed 's/^/changed: /'
} > "$dest/x/BUILD"

if [ $# -gt 0 ]; then
    nvrtc=${NVRTC_DIR:-$dest/nvrtc}
    if ! ls "$nvrtc"/nvidia/cu*/lib/libnvrtc.so* >/dev/null 2>&1; then
        python3 -m pip install -q --no-deps --target "$nvrtc" "nvidia-cuda-nvrtc==${NVRTC_VERSION:-13.0.88}"
    fi
    lib=$(dirname "$(ls "$nvrtc"/nvidia/cu*/lib/libnvrtc.so* | head -1)")
    for m in "$@"; do
        LD_LIBRARY_PATH=$lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} NIWAKI_CUDA_CACHE=$dest/x/cache \
            "$dest/x/niwaki" kernels --model "$m" --arch "$arch"
    done
fi
tar cJf "$dest/stage.tar.xz" -C "$dest" x
echo "staged $(head -1 "$dest/x/BUILD") for $arch in $dest/stage.tar.xz ($(du -h "$dest/stage.tar.xz" | cut -f1))"
