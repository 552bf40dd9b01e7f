#!/usr/bin/env bash
# The GPU check, in one call on a GPU machine with no network: install what prepare.sh made (and the
# CUDA wheel cuda_wheel.sh built ahead, where there is one; else build llama-cpp-python for this GPU
# alone), and print bench_gpu_restore.py's table (1K to 32K tokens; RAM and disk; f16 and q8_0 K/V;
# flash attention on and off; capture beside restore; exactness `auto` compared token for token with
# a cold run).
#
#     benchmarks/gpu/prepare.sh                 # first, where the package registry is reachable
#     benchmarks/gpu/cuda_wheel.sh              # then, on the same machine: the CUDA build, ahead
#     benchmarks/gpu/run.sh [--build-only | --bench-only] [--short]
#     benchmarks/gpu/run.sh --device-suite      # after the table: tests/device on the real GPU
#     benchmarks/gpu/run.sh --cpu-smoke         # the same steps on this CPU machine, in a minute
#
# Results (JSON per table, the build's log, the page) go to $OUT, or benchmarks/results/gpu.
# --build-only and --bench-only split the work over two calls on a machine that stays up between
# them (the build lives in $SITE, /tmp/snapcache-gpu-site by default). --cpu-smoke builds nothing:
# it runs every benchmark step on the tiny model with the llama-cpp-python installed here, so that a
# GPU machine's minutes never find a broken script.
set -euo pipefail
cd "$(dirname "$0")/../.."
root=$PWD
mode=all
quick=()
for arg in "$@"; do
    case "$arg" in
        --build-only) mode=build ;;
        --bench-only) mode=bench ;;
        --cpu-smoke) mode=smoke ;;
        --device-suite) mode=device ;;
        --short) quick=(--sizes 1024 4096) ;;
        *) echo "run.sh: unknown option $arg" >&2; exit 2 ;;
    esac
done
out="${OUT:-$root/benchmarks/results/gpu}"
site="${SITE:-/tmp/snapcache-gpu-site}"
mkdir -p "$out"
export PYTHONUNBUFFERED=1
started=$SECONDS
stamp() { echo "[run.sh $((SECONDS - started)) s] $*"; }

if [[ $mode == smoke ]]; then
    python="${PYTHON:-$root/.venv/bin/python}"
    stamp "CPU smoke: every step on the tiny model"
    "$python" benchmarks/bench_gpu_restore.py --quick --modes auto exact inexact --json "$out/smoke.json"
    stamp "smoke passed: $out/smoke.json"
    exit 0
fi

python="${PYTHON:-python3}"
built=$(ls .gpu/wheels/llama_cpp_python-*.whl 2>/dev/null | head -1)
# --device-suite installs only on a machine that has not installed yet (a fresh loan).
install=yes
if [[ $mode == bench || ( $mode == device && -d $site/llama_cpp ) ]]; then install=no; fi
if [[ $install == yes && -n $built ]]; then
    stamp "installing the carried wheels, $(basename "$built") among them, into $site"
    "$python" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$site" \
        .gpu/wheels/*.whl
elif [[ $install == yes ]]; then
    sdist=$(ls .gpu/src/llama_cpp_python-*.tar.gz 2>/dev/null | head -1)
    if [[ -z $sdist ]]; then
        echo "run.sh: no .gpu/src/llama_cpp_python-*.tar.gz: run benchmarks/gpu/prepare.sh and carry .gpu" >&2
        exit 2
    fi
    stamp "installing the carried wheels into $site"
    "$python" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$site" \
        .gpu/wheels/*.whl
    arch="${CUDA_ARCH:-$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader | head -1 | tr -d .)}"
    stamp "building llama-cpp-python for CUDA (sm_$arch) on $(nproc) cores"
    # Only this GPU's architecture, no VMM pool (the loans' sandboxes refuse it), no tests or tools.
    CMAKE_ARGS="-DGGML_CUDA=on -DCMAKE_CUDA_ARCHITECTURES=$arch -DGGML_CUDA_NO_VMM=on \
-DLLAMA_BUILD_TESTS=off -DLLAMA_BUILD_EXAMPLES=off -DLLAMA_BUILD_TOOLS=off -DGGML_NATIVE=on" \
    CMAKE_BUILD_PARALLEL_LEVEL="$(nproc)" \
        "$python" -m pip install --no-index --no-deps --no-build-isolation --no-cache-dir --upgrade \
        --target "$site" "$sdist" > "$out/build.log" 2>&1 || { tail -40 "$out/build.log"; exit 1; }
    stamp "built"
fi
if [[ $mode == build ]]; then
    exit 0
fi
if [[ $mode == device ]]; then
    export PYTHONPATH="$root:$site${PYTHONPATH:+:$PYTHONPATH}"
    if [[ -n $built ]]; then
        for lib in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib; do
            if [[ -d $lib ]]; then export LD_LIBRARY_PATH="$lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"; fi
        done
    fi
    if compgen -G ".gpu/suite-wheels/*.whl" >/dev/null; then
        "$python" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$site" \
            .gpu/suite-wheels/*.whl
    fi
    stamp "the device suite on $(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)"
    "$python" -m pytest -m device tests/device -p no:cacheprovider -q -rs --junitxml "$out/device.xml" \
        | tee "$out/device.log"
    exit "${PIPESTATUS[0]}"
fi

export PYTHONPATH="$root:$site${PYTHONPATH:+:$PYTHONPATH}"
if [[ -n $built ]]; then  # the wheel made ahead links the machine's CUDA runtime and cuBLAS
    for lib in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib; do
        if [[ -d $lib ]]; then export LD_LIBRARY_PATH="$lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"; fi
    done
fi
"$python" - <<'PY'
import llama_cpp
from snapcache.llama.state.host_memory import device_host_buffer_type
assert llama_cpp.llama_supports_gpu_offload(), "this llama-cpp-python has no GPU backend"
print("llama.cpp:", llama_cpp.llama_print_system_info().decode().strip())
print("pinned host memory:", device_host_buffer_type())
PY
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
bench=("$python" benchmarks/bench_gpu_restore.py --modes auto exact ${quick[@]+"${quick[@]}"})
stamp "8B shape, f16 K/V, flash attention on"
"${bench[@]}" --shapes 8b --json "$out/8b-f16.json"
stamp "8B shape, q8_0 K/V, flash attention on"
"${bench[@]}" --shapes 8b --kv-type q8_0 --sizes 1024 32768 --json "$out/8b-q8_0.json"
stamp "1B shape, f16 K/V, flash attention on"
"${bench[@]}" --shapes 1b --json "$out/1b-f16.json"
stamp "1B shape, f16 K/V, flash attention off"
"${bench[@]}" --shapes 1b --no-flash-attn --sizes 1024 4096 --json "$out/1b-f16-no-fa.json"
stamp "8B shape, f16 K/V, flash attention on, plain memory (SNAPCACHE_PINNED_MEMORY=0)"
SNAPCACHE_PINNED_MEMORY=0 "${bench[@]}" --modes auto --shapes 8b --sizes 4096 32768 --json "$out/8b-f16-plain.json"
stamp "done: $out"
