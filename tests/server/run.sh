#!/usr/bin/env bash
# End-to-end tests of `niwaki serve` with real clients: the official openai Python client
# (pytest), headless Chromium on the web page, and a bounded load test on loopback.
# Installs what it needs (idempotently), builds the release binary, synthesizes a tiny model.
set -euo pipefail
cd "$(dirname "$0")"
HERE=$(pwd)
ROOT=$(cd ../.. && pwd)
WORK=$(mktemp -d)
SERVER_PID=""
cleanup() {
  if [ -n "$SERVER_PID" ]; then kill "$SERVER_PID" 2>/dev/null || true; wait "$SERVER_PID" 2>/dev/null || true; fi
  rm -rf "$WORK"
}
trap cleanup EXIT

need_apt=()
command -v chromium >/dev/null 2>&1 || need_apt+=(chromium)
command -v curl >/dev/null 2>&1 || need_apt+=(curl)
python3 -m venv --help >/dev/null 2>&1 || need_apt+=(python3-venv)
if [ ${#need_apt[@]} -gt 0 ] && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need_apt[@]}" >/dev/null
fi
if [ ! -x .venv/bin/python ]; then python3 -m venv .venv; fi
.venv/bin/python -m pip install -q --disable-pip-version-check -r requirements.txt
if [ ! -d node_modules/playwright-core ]; then npm install --silent --no-audit --no-fund >/dev/null; fi

(cd "$ROOT" && cargo build --release -q -p niwaki)
BIN="${CARGO_TARGET_DIR:-$ROOT/target}/release/niwaki"
"$BIN" synth --preset tiny --format Q1_0 --model "$WORK/tiny.gguf" 2>/dev/null

start_server() {
  local log="$WORK/server.log"
  "$BIN" serve --model "$WORK/tiny.gguf" --model-name tiny --port 0 --ctx 1024 \
    --parallel "$1" --queue "$2" --script-responses "$HERE/script.json" >"$log" 2>&1 &
  SERVER_PID=$!
  for _ in $(seq 1 300); do
    PORT=$(sed -n 's|.*on http://127.0.0.1:\([0-9]*\).*|\1|p' "$log" | head -1)
    if [ -n "$PORT" ] && curl -fs "http://127.0.0.1:$PORT/health" >/dev/null 2>&1; then
      export NIWAKI_BASE_URL="http://127.0.0.1:$PORT"; return 0
    fi
    sleep 0.1
  done
  cat "$log"; echo "server did not start"; return 1
}
stop_server() {
  kill -TERM "$SERVER_PID"; wait "$SERVER_PID" || { echo "server exited badly on SIGTERM"; return 1; }
  SERVER_PID=""
}

status=0
start_server 2 2
NIWAKI_BIN="$BIN" .venv/bin/python -m pytest -q -p no:cacheprovider . || status=1
node browser.mjs "$NIWAKI_BASE_URL" || status=1
stop_server || status=1

start_server 4 8
.venv/bin/python load.py "$NIWAKI_BASE_URL" --clients 32 --seconds "${LOAD_SECONDS:-20}" || status=1
stop_server || status=1
exit $status
