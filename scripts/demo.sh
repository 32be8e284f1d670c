#!/usr/bin/env bash
# README command 1: install what building the `specula` command needs, build that one target, fetch
# SmolLM2-135M-Instruct (scripts/fetch_models.sh smollm2, into the model cache, once), then answer
# one chat prompt twice, greedily: plain decoding, and the default speculative run (its EAGLE-3
# head from models/). Prints the answer, whether both texts are identical (they must be), both
# speeds and the speedup, and writes the HTML report of the speculative run (scripts/demo.sh "PROMPT"
# asks another prompt). The test suite's packages, targets and second model are scripts/test.sh's.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/progress.sh
progress_start demo 5 steps --lines
progress_step 0 "install the build's Debian packages (scripts/setup.sh)"
scripts/setup.sh
progress_step 1 "build the specula command (the first build also fetches and compiles ggml, libllama and llama.cpp's common library)"
# A fresh build/ leaves out the test suite (GoogleTest is scripts/test.sh's), llama.cpp's tools
# (the benchmark peers, scripts/build.sh's) and the commands the demo does not run (serve, bench,
# the converters: SPECULA_ALL_COMMANDS, which scripts/build.sh turns on), and compiles the code off
# the decode path at -O0, libllama's and llama.cpp's common library's in unity batches
# (SPECULA_FAST_BUILD without the rest: CMakeLists.txt), with Ninja, which keeps both cores busy
# across the libraries where Make finishes one before the next; an existing configuration is kept
# as it is.
fresh=()
[ -f build/CMakeCache.txt ] || fresh=(-G Ninja -DSPECULA_BUILD_TESTS=OFF -DSPECULA_LLAMA_TOOLS=OFF -DSPECULA_FAST_BUILD=ON -DSPECULA_ALL_COMMANDS=OFF)
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release "${fresh[@]}"
cmake --build build -j"$(nproc)" --target specula 2>&1 | progress_cmake build
progress_step 2 "fetch SmolLM2-135M-Instruct"
scripts/fetch_models.sh smollm2
S=./build/bin/specula
model="${SPECULA_MODEL_CACHE:-$HOME/.cache/specula/models}/SmolLM2-135M-Instruct.Q4_1.gguf"
prompt="${1:-Give me three interesting facts about black holes.}"
out=out/demo
mkdir -p "$out"

progress_step 3 "plain decoding"
"$S" generate -m "$model" --chat -n 128 -p "$prompt" >"$out/plain.txt" 2>"$out/plain.log"
progress_step 4 "speculative decoding (EAGLE-3 head models/smollm2-eagle3.gguf)"
"$S" generate -n 128 -p "$prompt" --trace "$out/speculative.jsonl" >"$out/speculative.txt" 2>"$out/speculative.log"
"$S" report "$out/speculative.jsonl" -o "$out/report.html" >/dev/null
progress_step 5 "done"

rate() { sed -n 's/.*generated [0-9]* tok, \([0-9.]*\) tok\/s.*/\1/p' "$1" | tail -1; }
plain_rate=$(rate "$out/plain.log")
spec_rate=$(rate "$out/speculative.log")
cat "$out/speculative.txt"
echo
grep '^\[specula\]' "$out/speculative.log" | tail -3  # speed, acceptance, the verify-cost curve the policies used
if cmp -s "$out/plain.txt" "$out/speculative.txt"; then
  echo "demo: speculative text identical to plain decoding"
else
  echo "demo: ERROR: speculative text differs from plain decoding ($out/plain.txt vs $out/speculative.txt)" >&2
  exit 1
fi
awk -v p="$plain_rate" -v s="$spec_rate" 'BEGIN {
  printf "demo: plain %.1f tok/s, speculative %.1f tok/s: %.2fx\n", p, s, s / p
  if (s < p * 1.05) print "demo: speculation does not pay here: drafts are accepted (the acceptance line above), but verifying n tokens costs the multiples of one step on the verify-cost line above, so the cost policy keeps its drafts small (docs/benchmarks.md)"
}'
echo "demo: HTML report of the speculative run: $out/report.html"
