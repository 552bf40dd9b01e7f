#!/usr/bin/env bash
# Build llama-cpp-python for CUDA on a machine without a GPU, so that a lent GPU machine (no network,
# minutes of time) only installs the wheel and measures. NVIDIA's toolkit comes from the Python
# registry's wheels, pinned to CUDA 13.0 (the runtime the GPU machines carry); the build targets one
# architecture (CUDA_ARCH, default 90: H100 and H200), keeps the CPU backend to AVX2 (any x86-64 server
# CPU runs it), and leaves out mtmd, tests and tools. The wheel lands in .gpu/wheels (git-ignored),
# where run.sh finds it.
#
#     benchmarks/gpu/prepare.sh && benchmarks/gpu/cuda_wheel.sh    # then carry .gpu; run.sh installs it
#
# It prints the build's time and the wheel's size. The toolkit (about 1 GiB) stays in .gpu/cuda-toolkit
# for the next build.
set -euo pipefail
cd "$(dirname "$0")/../.."
LLAMA_CPP_PYTHON_VERSION="${LLAMA_CPP_PYTHON_VERSION:-0.3.36}"
PYTHON="${PYTHON:-python3}"
arch="${CUDA_ARCH:-90}"
out=.gpu
toolkit="$out/cuda-toolkit"
mkdir -p "$out/wheels" "$toolkit"
grep -qx '/.gpu/' .git/info/exclude 2>/dev/null || echo '/.gpu/' >> .git/info/exclude
started=$SECONDS
stamp() { echo "[cuda_wheel.sh $((SECONDS - started)) s] $*"; }

# The compiler, the runtime's headers and libraries, the C++ libraries nvcc's headers include, and
# cuBLAS, which ggml-cuda links.
packages=(nvidia-cuda-nvcc==13.0.88 nvidia-cuda-crt==13.0.88 nvidia-nvvm==13.0.88
    nvidia-cuda-runtime==13.0.96 nvidia-cuda-cccl==13.0.85 nvidia-cublas==13.0.2.14)
root="$PWD/$toolkit/site/nvidia/cu13"
if [[ ! -x $root/bin/nvcc ]]; then
    stamp "installing NVIDIA's CUDA 13.0 toolkit wheels into $toolkit"
    "$PYTHON" -m pip install -q --no-deps --target "$toolkit/site" "${packages[@]}"
fi
# The layout CMake's FindCUDAToolkit looks for: lib64 beside lib, and unversioned library names.
ln -sfn lib "$root/lib64"
for name in cudart cublas cublasLt; do
    [[ -e $root/lib/lib$name.so ]] || ln -s "lib$name.so.13" "$root/lib/lib$name.so"
done
export PATH="$root/bin:$PATH" CUDACXX="$root/bin/nvcc" CUDAToolkit_ROOT="$root"
export LIBRARY_PATH="$root/lib${LIBRARY_PATH:+:$LIBRARY_PATH}"
"$CUDACXX" --version | tail -1

cpu="-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON"
cpu+=" -DGGML_AVX512=OFF -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF"
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
stamp "building llama-cpp-python $LLAMA_CPP_PYTHON_VERSION for CUDA sm_$arch on $(nproc) cores"
CMAKE_ARGS="-DGGML_CUDA=on -DCMAKE_CUDA_ARCHITECTURES=$arch -DGGML_CUDA_NO_VMM=on -DLLAVA_BUILD=off \
-DLLAMA_BUILD_TESTS=off -DLLAMA_BUILD_EXAMPLES=off -DLLAMA_BUILD_TOOLS=off $cpu" \
CMAKE_BUILD_PARALLEL_LEVEL="$(nproc)" \
    "$PYTHON" -m pip wheel -q --no-deps --no-cache-dir -w "$scratch" \
    "llama-cpp-python==$LLAMA_CPP_PYTHON_VERSION" > "$out/cuda-build.log" 2>&1 \
    || { tail -40 "$out/cuda-build.log"; exit 1; }
wheel=$(ls "$scratch"/llama_cpp_python-*.whl)
stamp "built $(basename "$wheel"): $(du -h "$wheel" | cut -f1)"
# A wheel holds no symbolic links: each library comes in three copies (libX.so, .so.0, .so.0.M.m),
# twice over (llama.cpp's own install writes lib/ and include/ at the wheel's root as well), and
# libggml-cuda is 57 MiB. Kept: llama_cpp/lib's libraries under the names something loads them by
# (the soname, libX.so.0, for the dynamic linker; libX.so for those ctypes opens by name).
rm -f "$out"/wheels/llama_cpp_python-*.whl
"$PYTHON" - "$wheel" "$out/wheels/$(basename "$wheel")" <<'PY'
import re, sys, zipfile
source, target = sys.argv[1:]
by_name = {"libllama.so", "libggml.so", "libggml-base.so", "libmtmd.so"}  # opened with ctypes

def kept(name: str) -> bool:
    if name.endswith(".dist-info/RECORD"):
        return True
    if not name.startswith(("llama_cpp/", "llama_cpp_python-")):
        return False  # the root's lib/, include/, bin/: llama.cpp's own install, never imported
    file = name.rsplit("/", 1)[-1]
    if name.startswith("llama_cpp/lib/") and ".so" in file:
        return re.fullmatch(r"lib[\w.-]+?\.so\.0", file) is not None or file in by_name
    return True

with zipfile.ZipFile(source) as old, zipfile.ZipFile(target, "w", zipfile.ZIP_DEFLATED, compresslevel=9) as new:
    names = {info.filename for info in old.infolist() if kept(info.filename)}
    for info in old.infolist():
        if info.filename not in names:
            continue
        data = old.read(info)
        if info.filename.endswith(".dist-info/RECORD"):
            lines = data.decode().splitlines()
            data = ("\n".join(line for line in lines if line.split(",", 1)[0] in names or line.endswith(",,")) + "\n").encode()
        new.writestr(info, data, compress_type=zipfile.ZIP_DEFLATED, compresslevel=9)
PY
stamp "slimmed to $(du -h "$out/wheels/$(basename "$wheel")" | cut -f1): $(basename "$wheel")"
du -ch "$out"/wheels/*.whl | tail -1
