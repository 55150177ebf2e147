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
#   `--depth-fill zeros` there skips that fill, for the zeroed cache); comma lists make several
#   tests a run (`-p 2,4,6 -n 0`: short passes).
# Writes OUT_DIR/ab.txt (a line a test: round, label, format, the test as p<prompt>,n<gen>,d<depth>,
# its median (min-max) tok/s and what that is (`tg` where it decodes, else `pp`), the fraction of
# the decode floor, the picked tokens' digest (settings that give the same bits pick the same
# tokens); where it decodes after a prompt, the prefill's median (min-max) tok/s after `pp`) and
# OUT_DIR/ab.jsonl (niwaki bench --json), then the medians by setting, format and test.
set -uo pipefail
bin=${1:?bin dir}
out=${2:?out dir}
formats=${3:?formats}
rounds=${4:?rounds}
shift 4
[ $# -gt 0 ] || { echo "no settings given" >&2; exit 2; }
export NIWAKI_CUDA_CACHE=${NIWAKI_CUDA_CACHE:-/tmp/niwaki-cuda-cache}
mkdir -p "$out"
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.max.mem,temperature.gpu --format=csv,noheader | tee "$out/gpu.txt"
for f in ${formats//,/ }; do
    [ -f "/tmp/$f.gguf" ] || "$bin/niwaki" synth --preset 27b --format "$f" --model "/tmp/$f.gguf" >/dev/null || exit 1
done
# A test's JSON line (niwaki bench --json) as the part of an ab.txt line after the format.
summary_line='
import sys, json
for raw in sys.stdin:
    d = json.loads(raw)
    dec = d["n_gen"] > 0
    k = "tg" if dec else "pp"
    print("p%d,n%d,d%d %.2f (%.2f-%.2f) %s %s tokens %s%s%s" % (
        d["n_prompt"], d["n_gen"], d.get("n_depth", 0), d[k + "_tok_s"], d[k + "_min"], d[k + "_max"], k,
        "%.1f%%" % (100 * d["floor_fraction"]) if dec else "-", d.get("tg_tokens_fnv64", "-")[:8] if dec else "-",
        "" if d.get("tg_tokens_agree", True) else " (runs differ)",
        " pp %.1f (%.1f-%.1f)" % (d["pp_tok_s"], d["pp_min"], d["pp_max"]) if dec and d["n_prompt"] > 0 else ""))
'
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
            lines=$(env "${vars[@]}" "$run_bin/niwaki" bench --model "/tmp/$f.gguf" --device cuda ${BENCH_ARGS:--p 0 -n 128 -r 3} --json 2>>"$out/err.log" |
                tee -a "$out/ab.jsonl" | python3 -c "$summary_line") && [ -n "$lines" ] ||
                lines="failed (see err.log)"
            while IFS= read -r line; do echo "$round $label $f $line" | tee -a "$out/ab.txt"; done <<<"$lines"
        done
    done
done
echo "medians by setting, file and test:"
awk '$4 != "failed" { m[$2 " " $3 " " $4 " " $7] = m[$2 " " $3 " " $4 " " $7] " " $5 } END { for (k in m) print k ":" m[k] }' "$out/ab.txt" | sort
# Settings that give the same bits pick the same tokens: a file and test whose runs show more
# than one digest had a setting change the results (or a run that was not deterministic).
awk '$9 == "tokens" && $10 != "-" { k = $3 " " $4; d[k] = d[k] (index(d[k], $10) ? "" : " " $10) } END { for (k in d) print k " token digests:" d[k] (split(d[k], x, " ") > 1 ? "  DIFFER" : "  the same") }' "$out/ab.txt" | sort
