#!/usr/bin/env bash
# Create tools/oracle/.venv with everything make_fixtures.py needs:
#   - the pinned packages of requirements.txt (torch is the large PyPI build: ~3 GB download);
#   - llama-cpp-python 0.3.36 built from its sdist (~7+ min on 2 cores), whose vendored
#     llama.cpp source tree is unpacked to work/ (make_fixtures.py uses its
#     convert_hf_to_gguf.py and gguf-py from there).
# Idempotent: steps already done are skipped.
set -euo pipefail
cd "$(dirname "$0")"

LLAMA_CPP_PY_VERSION=0.3.36
SDIST_DIR=work/sdist
SDIST="$SDIST_DIR/llama_cpp_python-$LLAMA_CPP_PY_VERSION.tar.gz"

if [ ! -x .venv/bin/python ]; then
    "${PYTHON:-python3}" -m venv .venv
fi
.venv/bin/pip install -r requirements.txt

mkdir -p "$SDIST_DIR"
if [ ! -f "$SDIST" ]; then
    .venv/bin/pip download --no-deps --no-build-isolation --no-binary llama-cpp-python \
        "llama-cpp-python==$LLAMA_CPP_PY_VERSION" -d "$SDIST_DIR"
fi
if [ ! -d "work/llama_cpp_python-$LLAMA_CPP_PY_VERSION/vendor/llama.cpp" ]; then
    tar -xzf "$SDIST" -C work
fi
if ! .venv/bin/python -c "import llama_cpp, sys; sys.exit(llama_cpp.__version__ != '$LLAMA_CPP_PY_VERSION')" 2>/dev/null; then
    CMAKE_ARGS="-DGGML_NATIVE=ON" CMAKE_BUILD_PARALLEL_LEVEL="${JOBS:-2}" \
        nice -n 10 .venv/bin/pip install --no-deps --no-build-isolation "$SDIST"
fi
.venv/bin/python -c "import llama_cpp; print('llama-cpp-python', llama_cpp.__version__, 'OK')"
