#!/usr/bin/env bash
# README command 1: set up, build, fetch SmolLM2-135M-Instruct (scripts/fetch_models.sh, into the
# model cache, once) and chat with it, drafting with its EAGLE-3 head from models/ (greedy: the
# output is identical to plain decoding; the run ends with the acceptance statistics).
# The bundled 15.7M family (models/specula-*.gguf) stays the tests' fixture.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/build.sh
scripts/fetch_models.sh
./build/bin/specula generate -n 128 -p "${1:-Give me three interesting facts about black holes.}"
