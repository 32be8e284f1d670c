#!/usr/bin/env bash
# Configures and builds specula with ggml's CUDA backend into build-cuda/: the `specula` binary
# only, for one GPU architecture (CUDA_ARCH, default 90) to keep ggml's CUDA kernels' build short.
# Not part of CI: compiling them takes long on a small machine. Needs nvcc (the CUDA toolkit).
# Extra arguments go to cmake's configure step, e.g. -DSPECULA_LLAMA_CPP_DIR=/path/to/llama.cpp.
# On a machine with a GPU: `build-cuda/bin/specula generate --device CUDA0 -m MODEL.gguf ...`; a
# non-CPU device runs ggml's kernels (--kernels ggml), never specula's CPU kernels.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/progress.sh
arch="${CUDA_ARCH:-90}"
if ! command -v nvcc >/dev/null 2>&1; then
  echo "build_cuda: nvcc not found: install the CUDA toolkit (or put its bin/ on PATH)" >&2
  exit 1
fi
# The toolkit (CUDA_HOME, else /usr/local/cuda) must hold cuBLAS, which ggml's CUDA backend links:
# a toolkit assembled from the nvcc and runtime packages alone lacks it, and cmake's generate step
# then fails on the missing CUDA::cublas target.
cuda_home="${CUDA_HOME:-/usr/local/cuda}"
if [ -z "$(find -L "$cuda_home" -name cublas_v2.h -print -quit 2>/dev/null)" ]; then
  echo "build_cuda: the CUDA toolkit at $cuda_home has no cuBLAS (cublas_v2.h), which ggml's CUDA backend links: install cuBLAS into it, or set CUDA_HOME to a toolkit that has it" >&2
  exit 1
fi
cmake -S . -B build-cuda -DCMAKE_BUILD_TYPE=Release -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES="$arch" \
  -DCUDAToolkit_ROOT="$cuda_home" -DSPECULA_BUILD_TESTS=OFF "$@"
cmake --build build-cuda -j"${JOBS:-$(nproc)}" --target specula 2>&1 | progress_cmake build-cuda
echo "build_cuda: built build-cuda/bin/specula with ggml's CUDA backend for sm_$arch" >&2
