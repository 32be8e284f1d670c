#!/usr/bin/env bash
# Configures and builds specula (and the pinned llama.cpp it stands on) into build/: every target,
# the test suite included. Extra arguments go to cmake's configure step, e.g.
# -DSPECULA_LLAMA_CPP_DIR=/path/to/llama.cpp
# Progress: scripts/progress.sh (a bar on a terminal, cmake's own lines otherwise; SPECULA_QUIET=1).
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/progress.sh
scripts/setup.sh --tests
# The tests, llama.cpp's tools (the benchmark peers) and every command of the CLI explicitly:
# scripts/demo.sh configures the same build/ without them.
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release -DSPECULA_BUILD_TESTS=ON -DSPECULA_LLAMA_TOOLS=ON -DSPECULA_FAST_BUILD=OFF -DSPECULA_ALL_COMMANDS=ON "$@"
cmake --build build -j"$(nproc)" 2>&1 | progress_cmake build
