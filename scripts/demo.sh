#!/usr/bin/env bash
# README command 1: set up, build, and generate from the bundled default model, drafting with
# the bundled draft model (output identical to plain greedy decoding; the run ends with the
# acceptance statistics).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/build.sh
./build/bin/specula generate -m models/specula-target.gguf --draft models/specula-draft.gguf -n 128 \
  -p "${1:-import os
import sys


def main(argv):
    \"\"\"}"
