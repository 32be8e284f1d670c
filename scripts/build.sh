#!/usr/bin/env bash
# Configures and builds specula (and the pinned llama.cpp it stands on) into build/.
# Extra arguments go to cmake's configure step, e.g. -DSPECULA_LLAMA_CPP_DIR=/path/to/llama.cpp
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release "$@"
cmake --build build -j"$(nproc)"
