#!/usr/bin/env bash
# Decode settings compared in one GPU call: `niwaki bench --device cuda -p 0 -n 128 -r 3` on
# synthetic 27B files, every setting run once per round and file, in turn, so that the device's
# drift over the call falls on all of them alike. Usage:
# ab-h200.sh BIN_DIR OUT_DIR FORMATS ROUNDS SETTING...
#   BIN_DIR holds a release build of `niwaki` (feature cuda); FORMATS is a comma list (Q2_0,Q1_0);
#   a SETTING is a label, optionally `@` and another build's folder (its `niwaki`, and its kernel
#   cache in its `cache` subfolder where it has one), then optionally `:` and the environment it
#   runs with, as VAR=value pairs separated by commas: `default`,
#   `cluster:NIWAKI_CUDA_FOLD_CLUSTER=1`, `previous@/tmp/old`, `previous16@/tmp/old:NIWAKI_CUDA_B1_TILE_ROWS=16`.
#   BENCH_ARGS replaces `-p 0 -n 128 -r 3` (with `-d`, each test first prefills the depth, untimed;
#   `--depth-fill zeros` there skips that fill, for the zeroed cache).
# Writes OUT_DIR/ab.txt (a line a run: round, label, format, median (min-max) tok/s, fraction of
# the decode floor, the picked tokens' digest: settings that give the same bits pick the same
# tokens; where BENCH_ARGS has a prompt, its prefill's median (min-max) tok/s after `pp`) and
# OUT_DIR/ab.jsonl (niwaki bench --json), then the decode medians by setting.
set -uo pipefail
bin=${1:?bin dir}
out=${2:?out dir}
formats=${3:?formats}
rounds=${4:?rounds}
shift 4
[ $# -gt 0 ] || { echo "no settings given" >&2; exit 2; }
# A line a run: one test each (the bench's comma lists make a test a value).
case "${BENCH_ARGS:-}" in *,*) echo "BENCH_ARGS takes one value a flag, not lists: $BENCH_ARGS" >&2; exit 2 ;; esac
export NIWAKI_CUDA_CACHE=${NIWAKI_CUDA_CACHE:-/tmp/niwaki-cuda-cache}
mkdir -p "$out"
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.max.mem,temperature.gpu --format=csv,noheader | tee "$out/gpu.txt"
for f in ${formats//,/ }; do
    [ -f "/tmp/$f.gguf" ] || "$bin/niwaki" synth --preset 27b --format "$f" --model "/tmp/$f.gguf" >/dev/null || exit 1
done
for round in $(seq 1 "$rounds"); do
    for f in ${formats//,/ }; do
        for setting in "$@"; do
            head=${setting%%:*}
            vars=()
            [ "$setting" = "$head" ] || IFS=, read -ra vars <<<"${setting#*:}"
            label=${head%%@*}
            run_bin=$bin
            if [ "$head" != "$label" ]; then
                run_bin=${head#*@}
                [ -d "$run_bin/cache" ] && vars=("NIWAKI_CUDA_CACHE=$run_bin/cache" "${vars[@]}")
            fi
            line=$(env "${vars[@]}" "$run_bin/niwaki" bench --model "/tmp/$f.gguf" --device cuda ${BENCH_ARGS:--p 0 -n 128 -r 3} --json 2>>"$out/err.log" |
                tail -1 | tee -a "$out/ab.jsonl" |
                python3 -c 'import sys, json; d = json.load(sys.stdin); print("%.2f (%.2f-%.2f) %.1f%% tokens %s%s%s" % (d["tg_tok_s"], d["tg_min"], d["tg_max"], 100 * d["floor_fraction"], d.get("tg_tokens_fnv64", "-")[:8], "" if d.get("tg_tokens_agree", True) else " (runs differ)", " pp %.1f (%.1f-%.1f)" % (d["pp_tok_s"], d["pp_min"], d["pp_max"]) if d.get("n_prompt", 0) > 0 else ""))') ||
                line="failed (see err.log)"
            echo "$round $label $f $line" | tee -a "$out/ab.txt"
        done
    done
done
echo "medians by setting and file:"
awk '$4 != "failed" { m[$2 " " $3] = m[$2 " " $3] " " $4 } END { for (k in m) print k ":" m[k] }' "$out/ab.txt" | sort
# Settings that give the same bits pick the same tokens: a file whose runs show more than one
# digest had a setting change the results (or a run that was not deterministic).
awk '$7 == "tokens" { d[$3] = d[$3] (index(d[$3], $8) ? "" : " " $8) } END { for (f in d) print f " token digests:" d[f] (split(d[f], x, " ") > 1 ? "  DIFFER" : "  the same") }' "$out/ab.txt" | sort
