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
#
# scripts/test_aarch64.sh --kernels: the short pass scripts/test.sh runs. It builds test_kernels
# (and the CLI it depends on) and runs only the kernels' parity tests (matmul and attention, every
# NEON path against the portable one, bit for bit) on -cpu max (neon-dotprod and neon-i8mm) and on
# -cpu neoverse-n1 (neon-dotprod), checking on each which paths the tests compared.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/progress.sh
start=$(date +%s)
bin=build-aarch64
model=models/specula-target.gguf
kernels_only=0
case "${1:-}" in
  "") ;;
  --kernels) kernels_only=1 ;;
  *) echo "usage: scripts/test_aarch64.sh [--kernels]" >&2; exit 2 ;;
esac

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

# kernel_parity CPU FILTER PATHS: test_kernels under that CPU; the SIMD paths its parity tests
# compared with the portable one ("[kernels] paths compared on this CPU: ...") must be PATHS, so
# that a CPU feature left undetected cannot pass by comparing fewer paths.
kernel_parity() {
  local cpu="$1" filter="$2" want="$3" log="$bin/kernel_parity.log" line
  gtest "$cpu" "$filter" test_kernels | tee "$log"
  line=$(grep '^\[kernels\] paths compared on this CPU: ' "$log" || true)
  if [ "$line" != "[kernels] paths compared on this CPU: generic $want" ]; then
    echo "qemu-aarch64 -cpu $cpu: expected '[kernels] paths compared on this CPU: generic $want', got '$line'" >&2
    exit 1
  fi
  echo "qemu-aarch64 -cpu $cpu: NEON paths compared with the portable one, bit for bit: $want"
}

if [ "$kernels_only" = 1 ]; then
  scripts/build_aarch64.sh test_kernels
  progress_start test-aarch64-kernels 2 CPUs --lines
  progress_step 0 "qemu-aarch64 -cpu max (dotprod + i8mm): kernel parity"
  kernel_parity max 'PackedMatmul.*:MaskedAttention.*' "neon-dotprod neon-i8mm"
  progress_step 1 "qemu-aarch64 -cpu neoverse-n1 (dotprod, no i8mm): kernel parity"
  kernel_parity neoverse-n1 'PackedMatmul.*:MaskedAttention.*' "neon-dotprod"
  progress_step 2 "passed in $(($(date +%s) - start)) s"
  exit 0
fi

scripts/build_aarch64.sh specula test_kernels test_forward test_equivalence test_real_models
progress_start test-aarch64 3 CPUs --lines
progress_step 0 "qemu-aarch64 -cpu max (dotprod + i8mm)"
expect_kernels max "specula's, neon-i8mm path"
kernel_parity max '*' "neon-dotprod neon-i8mm"
gtest max '*' test_forward
gtest max 'Targets/KernelMatrix.*_specula_specula' test_equivalence  # the batch-invariant cases; all 19 take long under qemu
if [ "${SPECULA_AARCH64_REAL_MODELS:-0}" = 1 ]; then  # SmolLM2's prompt and 3 x 32 tokens: long under emulation
  gtest max 'Cached/RealModelOracle.GreedySpeculativeEqualsPlainDecoding/SmolLM2_135M_Instruct_Q4_1' test_real_models
fi

progress_step 1 "qemu-aarch64 -cpu neoverse-n1 (dotprod, no i8mm)"
expect_kernels neoverse-n1 "specula's, neon-dotprod path"
kernel_parity neoverse-n1 'PackedMatmul.*:MaskedAttention.*:PackedTypes/ForwardBatchInvariance.*/0' "neon-dotprod"

progress_step 2 "qemu-aarch64 -cpu max, SPECULA_CPU_PATH=generic"
expect_kernels max "ggml's: specula has no SIMD path for this CPU" SPECULA_CPU_PATH=generic
gtest max '*' test_forward SPECULA_CPU_PATH=generic
progress_step 3 "all passed in $(($(date +%s) - start)) s"
