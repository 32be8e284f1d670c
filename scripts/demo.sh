#!/usr/bin/env bash
# README command 1: set up, build, and generate from the bundled default model.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/build.sh
./build/bin/specula generate -m models/specula-target.gguf -n 128 \
  -p "${1:-def fibonacci(n):
    \"\"\"Return the n-th Fibonacci number.\"\"\"
}"
