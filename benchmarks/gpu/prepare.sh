#!/usr/bin/env bash
# Make what a GPU machine without network needs to measure snapcache there, on a machine with the
# package registry: a slimmed source distribution of llama-cpp-python (its vendored llama.cpp without
# the models, docs and other parts its build never reads: under the 64 MiB a loan carries) and
# wheels of snapcache's dependencies that the GPU machine's Python lacks. Everything lands in
# .gpu/ at the repository's root, which git ignores.
#
#     benchmarks/gpu/prepare.sh            # then, on the GPU machine: benchmarks/gpu/run.sh
#
# Python 3.12 on manylinux x86-64 is what the GPU machine runs (see run.sh).
set -euo pipefail
cd "$(dirname "$0")/../.."
LLAMA_CPP_PYTHON_VERSION="${LLAMA_CPP_PYTHON_VERSION:-0.3.36}"
PYTHON="${PYTHON:-python3}"
out=.gpu
mkdir -p "$out/wheels" "$out/src"
grep -qx '/.gpu/' .git/info/exclude 2>/dev/null || echo '/.gpu/' >> .git/info/exclude

# What snapcache, its benchmarks and the test models need, beyond what the GPU image holds.
# (blosc2 imports pydantic only for features snapcache does not use.)
wheels=(blosc2 ndindex numexpr blake3 zstandard platformdirs gguf diskcache xxhash)
# The device suite (run.sh --device-suite): pytest, the command line, `snapcache serve` and the
# openai client, should the GPU machine's Python lack them. Apart from the table's wheels, so that
# each call carries less than 64 MiB: the table's (with cuda_wheel.sh's 43 MiB build) first, then
# these to the same machine while it is up.
suite=(pytest pluggy iniconfig typer click shellingham prometheus-client fastapi starlette uvicorn h11
    sse-starlette starlette-context pydantic-settings python-dotenv openai httpx httpcore anyio sniffio
    distro jiter certifi idna pydantic pydantic-core typing-extensions annotated-types typing-inspection
    rich pygments markdown-it-py mdurl)
platforms=()
for n in 17 24 27 28 31 34 35; do platforms+=(--platform "manylinux_2_${n}_x86_64"); done
download=("$PYTHON" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp
    "${platforms[@]}" --platform manylinux2014_x86_64 --platform any)
"${download[@]}" -d "$out/wheels" "${wheels[@]}"
mkdir -p "$out/suite-wheels"
"${download[@]}" -d "$out/suite-wheels" "${suite[@]}"

sdist="$out/src/llama_cpp_python-$LLAMA_CPP_PYTHON_VERSION.tar.gz"
if [[ ! -f "$sdist" ]]; then
    scratch=$(mktemp -d)
    trap 'rm -rf "$scratch"' EXIT
    "$PYTHON" -m pip download -q --no-deps --no-binary=:all: -d "$scratch" \
        "llama-cpp-python==$LLAMA_CPP_PYTHON_VERSION"
    tar -xzf "$scratch"/llama_cpp_python-*.tar.gz -C "$scratch"
    root="$scratch/llama_cpp_python-$LLAMA_CPP_PYTHON_VERSION"
    # Parts of the vendored llama.cpp that a library build never reads (LLAMA_BUILD_TESTS, _EXAMPLES
    # and _SERVER are off where it is a subproject); tools/mtmd stays, which llama-cpp-python builds.
    for part in models docs media benches gguf-py conversion tests examples scripts .github .devops app \
        pocs skills; do
        rm -rf "$root/vendor/llama.cpp/$part"
    done
    # ggml's backends other than the CPU's and CUDA's: each is built only when switched on.
    find "$root/vendor/llama.cpp/ggml/src" -mindepth 1 -maxdepth 1 -type d -name 'ggml-*' \
        ! -name ggml-cpu ! -name ggml-cuda -exec rm -rf {} +
    find "$root/vendor/llama.cpp/tools" -mindepth 1 -maxdepth 1 ! -name mtmd ! -name CMakeLists.txt \
        -exec rm -rf {} +
    tar -czf "$sdist" -C "$scratch" "llama_cpp_python-$LLAMA_CPP_PYTHON_VERSION"
fi
du -ch "$out"/wheels/*.whl "$sdist" | tail -1
du -ch "$out"/suite-wheels/*.whl | tail -1
echo "ready: carry .gpu/wheels (and .gpu/src without a CUDA wheel) to the GPU machine and run"
echo "benchmarks/gpu/run.sh there; then carry .gpu/suite-wheels for run.sh --device-suite"
