#!/usr/bin/env bash
# Checks the AArch64 build on an x86-64 Debian/Ubuntu machine: clippy for
# aarch64-unknown-linux-gnu, then the CPU crates' tests run under qemu-aarch64, once on a CPU
# with the dot-product extension (the NEON kernels) and the kernel tests again on one without
# (the scalar twins), and last the logits of synthetic models of every Bonsai format from the
# aarch64 binary against the x86-64 one's, byte for byte. Emulation checks results, not speed.
#
# Needs: rustup target add aarch64-unknown-linux-gnu
#        apt-get install qemu-user qemu-user-binfmt gcc-aarch64-linux-gnu libc6-dev-arm64-cross
# and, for the CLI tests (which start the aarch64 binary themselves), qemu registered with
# binfmt_misc (qemu-user-binfmt does it where systemd runs; elsewhere, as root:
#   mount -t binfmt_misc binfmt_misc /proc/sys/fs/binfmt_misc
#   grep -v '^#' /usr/lib/binfmt.d/qemu-aarch64.conf > /proc/sys/fs/binfmt_misc/register).
#
# Usage: [FULL=1] tools/arm-check.sh
set -euo pipefail
cd "$(dirname "$0")/.."

target=aarch64-unknown-linux-gnu
missing=()
rustup target list --installed 2>/dev/null | grep -qx "$target" || missing+=("rustup target $target")
command -v aarch64-linux-gnu-gcc >/dev/null || missing+=("aarch64-linux-gnu-gcc")
command -v qemu-aarch64 >/dev/null || missing+=("qemu-aarch64")
[ -d /usr/aarch64-linux-gnu/lib ] || missing+=("/usr/aarch64-linux-gnu (libc6-dev-arm64-cross)")
if [ ${#missing[@]} -gt 0 ]; then
    echo "arm-check: missing ${missing[*]} (see the head of this script)" >&2
    exit 2
fi
if [ ! -e /proc/sys/fs/binfmt_misc/qemu-aarch64 ]; then
    echo "arm-check: qemu-aarch64 is not registered with binfmt_misc; the CLI tests need it" >&2
    exit 2
fi

export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER=aarch64-linux-gnu-gcc
export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_RUNNER=qemu-aarch64
export QEMU_LD_PREFIX=/usr/aarch64-linux-gnu

echo "== clippy, $target"
cargo clippy --release --target "$target" --workspace --all-targets -- -D warnings

echo "== tests under qemu, a CPU with dot products (NEON kernels)"
# Drafting's long test (20 s natively, 15 minutes emulated) checks the generation loop, which
# has no architecture-specific code; FULL=1 runs it too.
skip=(--skip drafting_gives_the_same_tokens_text_and_state_in_fewer_passes)
[ "${FULL:-0}" = 1 ] && skip=()
QEMU_CPU=max cargo test --release --target "$target" -p quant -p model -p engine -p niwaki \
    -- "${skip[@]}"

echo "== kernel tests under qemu, a Cortex-A72 (no dot products: the scalar twins)"
QEMU_CPU=cortex-a72 cargo test --release --target "$target" -p quant

echo "== logits, aarch64 (emulated) against x86-64, byte for byte"
cargo build --release -p niwaki
cargo build --release --target "$target" -p niwaki
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
x86=target/release/niwaki
arm=target/$target/release/niwaki
tokens=5,17,3,99,42,7,250,1,64,128,33,2
differ=0
for f in Q1_0 Q2_0 Q2_0_g128 PQ2_0 PTQ1_0 Q1_0+hadamard; do
    m="$work/$f.gguf"
    flags=()
    [ "$f" = Q1_0+hadamard ] && flags=(--hadamard)
    "$x86" synth --preset small --format "${f%+hadamard}" "${flags[@]}" --model "$m" >/dev/null
    for mode in step prefill; do
        "$x86" logits --tokens "$tokens" --mode "$mode" --out "$work/x86.npy" --model "$m" 2>/dev/null
        QEMU_CPU=max "$arm" logits --tokens "$tokens" --mode "$mode" --out "$work/arm.npy" --model "$m" 2>/dev/null
        if cmp -s "$work/x86.npy" "$work/arm.npy"; then
            echo "$f $mode: the same bytes"
        else
            echo "$f $mode: DIFFER"
            differ=1
        fi
    done
done
exit $differ
