#!/usr/bin/env bash
# README command 2: set up, build, run the whole test suite under ASan + UBSan; then the scheduler
# and the server under ThreadSanitizer; then the server's memory under load in the uninstrumented
# build users run. The suite replays every fuzz target's seed corpus and fuzz/regressions/
# (fuzz/replay_main.cpp), and under ASan + UBSan mutates the inputs of the targets that take a
# client's input (grammar, openai_request, http_request) for 25 s each (fuzz_mutate_<target>,
# findings in build-asan/fuzz/findings/). Longer runs: scripts/fuzz.sh (libFuzzer, clang, coverage
# guided), or docs/validation.md's command for the ASan tree's binaries. Last, specula's ARM kernels
# under qemu-aarch64: a cross build of test_kernels and its NEON parity tests
# (scripts/test_aarch64.sh --kernels; the whole ARM run is scripts/test_aarch64.sh).
# The suite runs once, sanitized: on a 2-core machine a second, uninstrumented run (its build and
# its tests) would cost CI many minutes for what the sanitized run already checks (the SIMD matmul
# bodies run fully optimised there too). `scripts/build.sh` then `ctest --test-dir build` runs it
# uninstrumented.
# Each phase is a step of scripts/progress.sh (SPECULA_QUIET=1 silences the step lines).
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/progress.sh
progress_start test 11 phases --lines
# phase N LABEL: the running phase ended (its wall time is printed and kept for the summary);
# phase N, LABEL, starts.
phase_label="" phase_t0=$(date +%s) phase_times=""
phase() {
  local now
  now=$(date +%s)
  if [ -n "$phase_label" ]; then
    echo "test: $phase_label took $((now - phase_t0)) s" >&2
    phase_times+="$(printf '%6d s  %s' $((now - phase_t0)) "$phase_label")"$'\n'
  fi
  phase_label="$2" phase_t0=$now
  progress_step "$1" "$2"
}
phase 0 "set-up"
scripts/setup.sh --tests
phase 1 "source format"
scripts/check_format.sh
phase 2 "fetch the real models"
# The real pretrained models for the tests that run them: SmolLM2-135M-Instruct, Gemma 3 270M and
# Qwen2.5-Coder-0.5B-Instruct (491 MB: the server's code tests and the real-model identity tests
# run it). Not the 1.5B Qwen (1.1 GB, seconds per token under the sanitizers on 2 cores, where the
# suite has 45 minutes): its tests run when `scripts/fetch_models.sh qwen-coder` has fetched it and
# skip, saying so, otherwise.
scripts/fetch_models.sh smollm2 gemma3 qwen-coder-0.5b
phase 3 "server test clients"
# The openai Python client and pytest, pinned, for the server's end-to-end tests.
scripts/setup_server_tests.sh

# The build users run: `specula` (scripts/build.sh builds every target), and test_real_models and
# test_grammar_mask for phase 9. It compiles ggml and libllama first; the sanitized trees below take
# those objects from ccache (CMakeLists.txt).
phase 4 "build"
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release -DSPECULA_BUILD_TESTS=ON -DSPECULA_FAST_BUILD=OFF -DSPECULA_ALL_COMMANDS=ON
cmake --build build -j"$(nproc)" --target specula test_real_models test_grammar_mask 2>&1 | progress_cmake build

# The test suite: specula's own code instrumented, ggml/llama.cpp built normally beside it. As many
# tests at once as there are CPUs; a test on two threads claims two (tests/CMakeLists.txt).
phase 5 "ASan + UBSan build"
cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=Release -DSPECULA_SANITIZE=ON
cmake --build build-asan -j"$(nproc)" 2>&1 | progress_cmake build-asan
# Not here: the real pretrained models' numerics (test_real_models: their logits against libllama's,
# greedy speculation equal to plain decoding, sampled speculation keeping the target's distribution,
# with the drafters trained for them and the Qwen2.5-Coder pair). The code they run (the forward,
# the kernels, the drafters, verification, sampling) the suite runs under the sanitizers on the
# bundled and generated models (test_models.cpp: the same architectures, gemma3 sliding windows,
# qwen2 biases, every packed type, EAGLE-3 heads with a d2t map, draft models with a trimmed
# vocabulary); on the real models they took a third of the suite's time there, and phase 9 runs them
# uninstrumented. The real models' tests of the CLI's default run and of chat templates stay here.
# The grammar mask's walks against libllama's masks on the SmolLM2 and Qwen2 vocabularies run here
# shortened (each grammar's first walk, half its steps: test_grammar_mask.cpp), and whole in phase 9.
real_model_numerics='^(Cached/RealModelOracle|QwenCoderPair|Gemma3Drafter|SmolLM2Drafters\.(GreedySpeculative|SampledOutput))'
phase 6 "test suite under ASan + UBSan"
ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
  ctest --test-dir build-asan --output-on-failure --timeout 1800 -j"$(nproc)" -E "$real_model_numerics"

# ThreadSanitizer run of the code whose threads share state: the scheduler's worker, the HTTP
# handlers, the tests' clients. Only test_server (the scheduler and the in-process HTTP server) and
# the CLI for the end-to-end tests are built. ggml stays uninstrumented and computes on one thread
# (OMP_THREAD_LIMIT=1), so that every report is about specula's own threads (SPECULA_SANITIZE_THREAD
# in CMakeLists.txt). A report fails the run: test_server exits non-zero at the first one; a served
# process writes its reports to build-tsan/tsan-reports/, which must stay empty.
phase 7 "TSan build"
cmake -S . -B build-tsan -DCMAKE_BUILD_TYPE=Release -DSPECULA_SANITIZE_THREAD=ON
cmake --build build-tsan -j"$(nproc)" --target test_server specula 2>&1 | progress_cmake build-tsan
phase 8 "scheduler and server under TSan"
# As many jobs at once as there are CPUs: ggml computes on one thread here, so one job at a time
# would leave the second CPU idle for the whole phase. The jobs are test_server and each file of
# tests/server/ (a pytest run whose servers take ports of their own), the longest first; each job's
# output is printed whole when it ends. Not under TSan: 2000 SmolLM2 tokens (minutes there; phase 9
# runs it) and the SmolLM2 chat template (one thread).
export tsan_options=halt_on_error=1:second_deadlock_stack=1
rm -rf build-tsan/tsan-reports build-tsan/tsan-logs && mkdir build-tsan/tsan-reports build-tsan/tsan-logs
tsan_job() {
  local job="$1" log status=0
  log="build-tsan/tsan-logs/$(basename "$job").log"
  if [ "$job" = test_server ]; then
    OMP_THREAD_LIMIT=1 TSAN_OPTIONS=$tsan_options build-tsan/tests/test_server >"$log" 2>&1 || status=$?
  else
    OMP_THREAD_LIMIT=1 TSAN_OPTIONS=$tsan_options:log_path=$PWD/build-tsan/tsan-reports/report \
      SPECULA_CLI="$PWD/build-tsan/bin/specula" .venv-server/bin/python -m pytest -q -p no:cacheprovider "$job" \
      -k "not test_a_long_non_streamed_answer_is_one_json_object_with_its_length and not test_real_chat_template_smollm2" \
      >"$log" 2>&1 || status=$?
  fi
  cat "$log"
  echo "test: $job under TSan: exit status $status" >&2
  [ "$status" = 0 ]
}
export -f tsan_job
tsan_jobs=(test_server tests/server/test_infill.py tests/server/test_http_limits.py tests/server/test_tools.py
           tests/server/test_openai_client.py tests/server/test_shutdown.py)
for file in tests/server/test_*.py; do
  [[ " ${tsan_jobs[*]} " == *" $file "* ]] || tsan_jobs+=("$file")
done
tsan_status=0
printf '%s\n' "${tsan_jobs[@]}" | xargs -P "$(nproc)" -I{} bash -c 'tsan_job "$1"' _ {} || tsan_status=$?
if [ -n "$(ls -A build-tsan/tsan-reports)" ]; then
  cat build-tsan/tsan-reports/* >&2
  echo "test: ThreadSanitizer reported on specula serve (above)" >&2
  exit 1
fi
[ "$tsan_status" = 0 ] || { echo "test: a job under TSan failed (its output above)" >&2; exit 1; }

# The server's memory under 32 streaming clients, in the build users run: its RSS must stay flat.
# (The sanitized run's load test checks for leaks instead: ASan's quarantine grows the RSS by design.)
# And a 2000-token non-streamed answer, one JSON object: seconds here, minutes under the sanitizers.
# And the real models' numerics (phase 6 says why here), one thread each, and the grammar mask's
# whole walks against libllama's.
phase 9 "server load, a long answer and the real models, uninstrumented"
ctest --test-dir build --output-on-failure -j"$(nproc)" -R "^server_(load|long_answer)\$|$real_model_numerics|^GrammarMask\.EqualsLibllama"
# specula's ARM64 kernels, which no x86 test runs: test_kernels cross-compiled (scripts/build_aarch64.sh,
# Debian's aarch64 tool chain, ggml and libllama for ARMv8.2-A) and its matmul and attention parity
# tests under qemu-aarch64: -cpu max (neon-dotprod and neon-i8mm against the portable path, bit for
# bit) and -cpu neoverse-n1 (neon-dotprod alone); each run checks which NEON paths it compared.
phase 10 "ARM kernels under qemu-aarch64"
scripts/test_aarch64.sh --kernels
phase 11 "all passed"
printf 'test: wall time per phase\n%s' "$phase_times" >&2
