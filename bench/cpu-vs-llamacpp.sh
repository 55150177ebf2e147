#!/usr/bin/env bash
# Side-by-side CPU benchmark: niwaki and llama.cpp's llama-bench on the same synthetic Bonsai-27B
# files, same thread count, interleaved, and a markdown table of both and their ratios.
#
# usage: bench/cpu-vs-llamacpp.sh [OUT.md]
# env:   THREADS (default: all cores)  PP (512)  TG (128)  REPS (3)
#        FORMATS ("Q1_0 Q2_0 Q2_0_g128 PQ2_0 PTQ1_0")  WORK (bench/work: files and peer build)
#        KERNELS (niwaki's --kernels: int8 (default) or exact)
#        PEER (where bench/llama-peer.sh builds llama-bench; default: bench/work/peer)
#        LLAMA_BENCH (use this llama-bench binary instead of building one)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
out=${1:-bench/results/cpu-$(date +%Y-%m-%d).md}
threads=${THREADS:-$(nproc)}
pp=${PP:-512}; tg=${TG:-128}; reps=${REPS:-3}; kernels=${KERNELS:-int8}
formats=${FORMATS:-"Q1_0 Q2_0 Q2_0_g128 PQ2_0 PTQ1_0"}
work=${WORK:-bench/work}
peer=${PEER:-$work/peer}
mkdir -p "$work" "$(dirname "$out")"

# The binary is built from the working tree: name uncommitted source changes in the table.
rev=$(git rev-parse --short HEAD)
[ -z "$(git status --porcelain --untracked-files=no -- crates Cargo.toml Cargo.lock)" ] || rev="$rev with uncommitted changes"
cargo build --release -p niwaki >/dev/null
nw=target/release/niwaki

# llama.cpp's llama-bench, built from pinned source (bench/llama-peer.sh).
lb=${LLAMA_BENCH:-$(bash bench/llama-peer.sh "$peer" cpu | tail -1)}

row() { printf '| %s | %s | %s | %s | %s | %s |\n' "$@"; }
{
  echo "# niwaki vs llama.cpp, CPU, synthetic Bonsai-27B files"
  echo
  echo "- date: $(date -u +%Y-%m-%dT%H:%MZ); machine: $(lscpu | sed -n 's/^Model name: *//p' | head -1), $(nproc) cores; threads: $threads"
  echo "- niwaki $rev (--kernels $kernels, NIWAKI_SIMD=${NIWAKI_SIMD:-unset}); llama-bench: ${lb#"$root"/}"
  echo "- command: PP=$pp TG=$tg REPS=$reps KERNELS=$kernels FORMATS=\"$formats\" bench/cpu-vs-llamacpp.sh"
  echo
  echo "| file | test | llama.cpp tok/s | niwaki tok/s | ratio | niwaki decode / bandwidth floor |"
  echo "|---|---|---|---|---|---|"
} > "$out"

for f in $formats; do
  file="$work/bonsai-27b-$f.gguf"
  [ -f "$file" ] || "$nw" synth --preset 27b --format "$f" --model "$file"
  # Interleave: llama.cpp, niwaki, for each test; llama.cpp does not load PQ2_0/PTQ1_0/g128.
  lj=""
  case $f in Q1_0|Q2_0)
    lj=$("$lb" -m "$file" -t "$threads" -p "$pp" -n "$tg" -r "$reps" -o json 2>/dev/null || true) ;;
  esac
  nj=$("$nw" bench --model "$file" -t "$threads" -p "$pp" -n "$tg" -r "$reps" --kernels "$kernels" --json)
  python3 - "$f" "$pp" "$tg" "$lj" "$nj" >> "$out" <<'PY'
import json, sys
f, pp, tg, lj, nj = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5]
n = json.loads(nj)
peer = {}
if lj.strip():
    for r in json.loads(lj):
        key = "pp" if r.get("n_prompt", 0) > 0 and r.get("n_gen", 0) == 0 else "tg"
        peer[key] = r["avg_ts"]
for key, label, mine in (("pp", f"pp{pp}", n["pp_tok_s"]), ("tg", f"tg{tg}", n["tg_tok_s"])):
    p = peer.get(key)
    ratio = f"{mine / p:.2f}x" if p else "-"
    floor = f"{100 * n['floor_fraction']:.0f}% of {n['floor_tok_s']:.2f} ({n['read_bw_gbs']:.1f} GB/s)" if key == "tg" else ""
    print(f"| {f} | {label} | {p:.2f} |" if p else f"| {f} | {label} | not supported |", end="")
    print(f" {mine:.2f} | {ratio} | {floor} |")
PY
done
echo >> "$out"
echo "Peak RSS and the full JSON of each niwaki run: rerun \`niwaki bench --json\` on the files in $work." >> "$out"
cat "$out"
