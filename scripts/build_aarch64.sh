#!/usr/bin/env bash
# Cross-compiles specula (ggml, libllama, specula, the tests) for 64-bit ARM Linux into
# build-aarch64/, with cmake/aarch64-linux-gnu.cmake. ggml is built for ARMv8.2-A with dot
# products and FP16 arithmetic (every Apple Silicon, Graviton 2+, Ampere Altra/One core has them);
# specula's own NEON kernels pick their dot-product instructions at run time.
# Arguments are the targets to build (default: the CLI and the tests scripts/test_aarch64.sh runs).
# Extra cmake configure arguments: SPECULA_AARCH64_CMAKE_ARGS="-D..."; for ARMv8.0 cores (Cortex-A53/
# A57/A72, Raspberry Pi 3/4), which have no dot product, -DGGML_CPU_ARM_ARCH=armv8-a (specula then
# runs ggml's kernels there, as `--kernels auto` does on every CPU without a specula SIMD path).
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/progress.sh
scripts/setup_aarch64.sh
targets=("$@")
[ ${#targets[@]} -eq 0 ] && targets=(specula test_kernels test_forward test_equivalence test_real_models)
# shellcheck disable=SC2086
# llama.cpp's tools (the benchmark peers) stay out: nothing here runs them.
cmake -S . -B build-aarch64 -DCMAKE_BUILD_TYPE=Release -DCMAKE_TOOLCHAIN_FILE=cmake/aarch64-linux-gnu.cmake \
  -DGGML_NATIVE=OFF -DGGML_CPU_ARM_ARCH=armv8.2-a+dotprod+fp16 -DSPECULA_LLAMA_TOOLS=OFF ${SPECULA_AARCH64_CMAKE_ARGS:-}
cmake --build build-aarch64 -j"${SPECULA_JOBS:-$(nproc)}" --target "${targets[@]}" 2>&1 | progress_cmake build-aarch64
