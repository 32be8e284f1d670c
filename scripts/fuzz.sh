#!/usr/bin/env bash
# Builds the libFuzzer targets (clang-14; specula's code with ASan + UBSan) into build-fuzz/ and
# runs each for a fixed time on its seed corpus (written by fuzz_seeds) plus every input kept in
# fuzz/regressions/<target>/ (crashes found so far). Prints executions, time and findings per
# target; a finding (crash, sanitizer report, leak, timeout, allocation over the limit) is written to
# build-fuzz/findings/ and makes the script fail. A target with fuzz/dictionaries/<target>.dict gets
# its tokens. Without clang, the test suite's ASan + UBSan tree mutates the targets of client input
# for 25 s each (fuzz/replay_main.cpp's --mutate, no coverage feedback; docs/validation.md).
#   scripts/fuzz.sh [SECONDS_PER_TARGET] [cmake configure args...]    default 600 s; CI smoke: 20
set -euo pipefail
cd "$(dirname "$0")/.."
seconds="${1:-600}"
shift || true
scripts/setup.sh --fuzz
CC=clang-14 CXX=clang++-14 cmake -S . -B build-fuzz -DCMAKE_BUILD_TYPE=Release -DSPECULA_FUZZ=ON -DSPECULA_BUILD_TESTS=OFF "$@" >/dev/null
mapfile -t targets <fuzz/targets.txt
cmake --build build-fuzz -j"$(nproc)" --target "${targets[@]/#/fuzz_}" fuzz_seeds

out=build-fuzz/fuzz-run
rm -rf "$out"
mkdir -p "$out" build-fuzz/findings
build-fuzz/fuzz/fuzz_seeds "$out/seeds" "${targets[@]}"
export SPECULA_FUZZ_TARGET="$PWD/$out/seeds/target.gguf" SPECULA_FUZZ_HTTP_MODEL="$PWD/$out/seeds/server.gguf"
# Each execution writes its input to a file under TMPDIR for the loaders: in memory it runs ~10x faster.
if [ -z "${TMPDIR:-}" ] && [ -d /dev/shm ]; then export TMPDIR=/dev/shm; fi
export ASAN_OPTIONS=detect_leaks=1:abort_on_error=0
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1

status=0
for target in "${targets[@]}"; do
  corpus="$out/corpus-$target"
  mkdir -p "$corpus" "fuzz/regressions/$target"
  # Seeds: written by fuzz_seeds (model, vocabulary and predictor files; none for the request
  # targets), or kept in fuzz/regressions/<target>/ (request bodies, whole HTTP requests).
  cp -r "$out/seeds/$target/." "$corpus/"
  log="$out/$target.log"
  dict=()
  if [ -f "fuzz/dictionaries/$target.dict" ]; then dict=(-dict="fuzz/dictionaries/$target.dict"); fi
  # -malloc_limit_mb: inputs are at most -max_len bytes, so no single allocation may approach this.
  if ! "build-fuzz/fuzz/fuzz_$target" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -malloc_limit_mb=256 \
         -max_len=262144 -print_final_stats=1 -artifact_prefix="build-fuzz/findings/$target-" "${dict[@]}" \
         "$corpus" "fuzz/regressions/$target" >"$log" 2>&1; then
    status=1
  fi
  runs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$' || echo "?")
  cov=$(grep -o 'cov: [0-9]*' "$log" | tail -1 | grep -o '[0-9]*' || echo "?")
  findings=$(grep -c -E 'ERROR: (AddressSanitizer|LeakSanitizer|libFuzzer)|runtime error:|==ERROR' "$log" || true)
  echo "fuzz_$target: ${runs} executions in ${seconds} s, coverage ${cov} edges, ${findings} findings (log: $log)"
done
if [ "$status" -ne 0 ]; then
  echo "fuzz: findings in build-fuzz/findings/; keep each (after its fix) in fuzz/regressions/<target>/ as a regression input" >&2
fi
exit "$status"
