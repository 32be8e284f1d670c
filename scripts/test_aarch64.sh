#!/usr/bin/env bash
# The aarch64 cross build (scripts/build_aarch64.sh) under qemu-aarch64, on three emulated CPUs:
#   -cpu max           dot product + i8mm: every NEON path against the portable one, bit for bit
#                      (test_kernels), the forward and equivalence tests on the neon-i8mm path, and
#                      with SPECULA_AARCH64_REAL_MODELS=1 SmolLM2's greedy speculative = plain
#                      identity (skipped, saying why, when scripts/fetch_models.sh has not put the
#                      model in the cache)
#   -cpu neoverse-n1   dot product without i8mm (Graviton 2, Ampere Altra): neon-dotprod is chosen
#   SPECULA_CPU_PATH=generic (SIMD paths off): `--kernels auto` falls back to ggml's kernels
# Each run first checks the path the CLI reports in its run summary. Prints the time it took.
# ggml is built for ARMv8.2-A + dot product, so CPUs below that (-cpu cortex-a57) stop at its first
# dot product (SIGILL); scripts/build_aarch64.sh says how to build for them.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/progress.sh
start=$(date +%s)
scripts/build_aarch64.sh specula test_kernels test_forward test_equivalence test_real_models
bin=build-aarch64
model=models/specula-target.gguf

# expect_kernels CPU EXPECTED [ENV...]: the CLI's "[specula] kernels:" line under that CPU.
expect_kernels() {
  local cpu="$1" want="$2" line
  shift 2
  line=$(env "$@" qemu-aarch64 -cpu "$cpu" "$bin/bin/specula" generate -m "$model" -p "the quick brown" -n 4 -t 2 -q \
         2>&1 >/dev/null | grep '^\[specula\] kernels: ' || true)
  if [[ "$line" != "[specula] kernels: $want"* ]]; then
    echo "qemu-aarch64 -cpu $cpu $*: expected '[specula] kernels: $want...', got '$line'" >&2
    exit 1
  fi
  echo "qemu-aarch64 -cpu $cpu $*: $line"
}

# gtest CPU FILTER BINARY [ENV...]
gtest() {
  local cpu="$1" filter="$2" test="$3"
  shift 3
  echo "== qemu-aarch64 -cpu $cpu $* $test --gtest_filter=$filter"
  env "$@" qemu-aarch64 -cpu "$cpu" "$bin/tests/$test" --gtest_filter="$filter" --gtest_brief=1
}

progress_start test-aarch64 3 CPUs --lines
progress_step 0 "qemu-aarch64 -cpu max (dotprod + i8mm)"
expect_kernels max "specula's, neon-i8mm path"
gtest max '-KernelsAuto.*' test_kernels  # KernelsAuto runs the CLI as a child: no binfmt_misc here
gtest max '*' test_forward
gtest max 'Targets/KernelMatrix.*_specula_specula' test_equivalence  # the batch-invariant cases; all 19 take long under qemu
if [ "${SPECULA_AARCH64_REAL_MODELS:-0}" = 1 ]; then  # SmolLM2's prompt and 3 x 32 tokens: long under emulation
  gtest max 'Cached/RealModelOracle.GreedySpeculativeEqualsPlainDecoding/SmolLM2_135M_Instruct_Q4_1' test_real_models
fi

progress_step 1 "qemu-aarch64 -cpu neoverse-n1 (dotprod, no i8mm)"
expect_kernels neoverse-n1 "specula's, neon-dotprod path"
gtest neoverse-n1 'PackedMatmul.*:MaskedAttention.*:PackedTypes/ForwardBatchInvariance.*/0' test_kernels

progress_step 2 "qemu-aarch64 -cpu max, SPECULA_CPU_PATH=generic"
expect_kernels max "ggml's: specula has no SIMD path for this CPU" SPECULA_CPU_PATH=generic
gtest max '*' test_forward SPECULA_CPU_PATH=generic
progress_step 3 "all passed in $(($(date +%s) - start)) s"
