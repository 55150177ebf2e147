#!/usr/bin/env bash
# What a kernel's device code issues, read without a GPU: for each kernel named, its registers,
# shared memory and stack, the instructions of the whole function by opcode, and those of each
# innermost loop that multiplies (MMA or dp4a), by opcode and per pass: the static count a
# change to a hot loop moves, to compare two builds' caches before a device measures them.
# Usage: crates/cuda/sass.sh CACHE_DIR KERNEL...
#   CACHE_DIR: a kernel cache holding device code, best of one model's program (a fresh
#   NIWAKI_CUDA_CACHE for `niwaki kernels --model F`). cuobjdump and nvdisasm are taken from
#   PATH, else from the nvidia-cuda-cuobjdump 13.2.86 and nvidia-cuda-nvdisasm 13.2.78 wheels on
#   PyPI, unpacked once into CUDA_TOOLS_DIR (default ~/.cache/niwaki/cuda-tools).
set -euo pipefail
cache=${1:?usage: sass.sh CACHE_DIR KERNEL...}
shift
[ $# -gt 0 ] || { echo "usage: sass.sh CACHE_DIR KERNEL..." >&2; exit 2; }
if ! command -v cuobjdump >/dev/null || ! command -v nvdisasm >/dev/null; then
    tools=${CUDA_TOOLS_DIR:-$HOME/.cache/niwaki/cuda-tools}
    if ! ls "$tools"/nvidia/cu*/bin/nvdisasm >/dev/null 2>&1; then
        wheels=$(mktemp -d)
        python3 -m pip download -q --no-deps -d "$wheels" \
            "nvidia-cuda-cuobjdump==13.2.86" "nvidia-cuda-nvdisasm==13.2.78"
        mkdir -p "$tools"
        # Unzipped rather than installed: the two wheels share their `nvidia/` folder.
        for w in "$wheels"/*.whl; do python3 -m zipfile -e "$w" "$tools"; done
        chmod +x "$tools"/nvidia/cu*/bin/*
        rm -rf "$wheels"
    fi
    PATH=$(dirname "$(ls "$tools"/nvidia/cu*/bin/nvdisasm | head -1)"):$PATH
fi
shopt -s nullglob
cubins=("$cache"/*.cubin)
[ ${#cubins[@]} -gt 0 ] || { echo "no device code (.cubin) in $cache" >&2; exit 2; }
for k in "$@"; do
    holders=()
    sass=
    for c in "${cubins[@]}"; do
        s=$(cuobjdump -sass -fun "$k" "$c" 2>/dev/null)
        grep -q "Function : $k\$" <<<"$s" || continue
        holders+=("$c")
        [ -n "$sass" ] || sass=$s
    done
    [ ${#holders[@]} -gt 0 ] || { echo "$k: in none of the device code in $cache" >&2; continue; }
    found=${holders[0]}
    echo "== $k ($(basename "$found"))"
    # Programs of several models' shapes each hold the kernel: a cache of one model's program
    # (a fresh NIWAKI_CUDA_CACHE for `niwaki kernels --model F`) says which is which.
    [ ${#holders[@]} -eq 1 ] || echo "   (in ${#holders[@]} parts of $cache: the first is shown)"
    cuobjdump -res-usage "$found" 2>/dev/null | grep -A1 "Function $k:" | tail -1 | sed 's/^ */   /'
    python3 -c '
import re, sys, collections
ins = []  # (address, opcode, branch target or None)
for line in sys.stdin:
    m = re.match(r"\s+/\*([0-9a-f]{4,})\*/\s+(@!?U?P\S+\s+)?([A-Z0-9_]+)(\.[A-Z0-9_.]+)?\s*([^;]*);", line)
    if not m:
        continue
    addr, op, rest = int(m.group(1), 16), m.group(3), m.group(5)
    t = re.match(r"(0x[0-9a-f]+)", rest.strip()) if op == "BRA" else None
    ins.append((addr, op, int(t.group(1), 16) if t else None))
def census(seq):
    c = collections.Counter(op for _, op, _ in seq)
    return " ".join("%s %d" % kv for kv in c.most_common())
print("   function: %d instructions: %s" % (len(ins), census(ins)))
mult = {"BMMA", "IMMA", "HMMA", "HGMMA", "IGMMA", "IDP", "IDP4A"}
loops = [(t, a) for a, op, t in ins if op == "BRA" and t is not None and t <= a]
inner = [l for l in loops if not any(o != l and l[0] <= o[0] and o[1] <= l[1] for o in loops)]
for lo, hi in sorted(inner):
    body = [i for i in ins if lo <= i[0] <= hi]
    if not any(op in mult for _, op, _ in body):
        continue
    print("   loop %04x-%04x: %d instructions a pass: %s" % (lo, hi, len(body), census(body)))
' <<<"$sass"
done
