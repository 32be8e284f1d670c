#!/usr/bin/env bash
# llama.cpp's own server tests (the pinned sources' tools/server/tests, pytest) against
# `specula serve`, started through tests/server/llama_server_shim.sh. The suite's Python packages
# come from scripts/setup_server_tests.sh. Usage:
#   tests/server/llama_server_suite.sh SPECULA [unit/test_X.py ...] [-- pytest arguments]
# Without files: those that apply to specula (docs/server.md, "llama.cpp's server tests").
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
suite="$root/.deps/llama.cpp/tools/server/tests"
export SPECULA_CLI="$(cd "$(dirname "${1:?usage: llama_server_suite.sh SPECULA [files] [-- pytest args]}")" && pwd)/$(basename "$1")"
shift
files=()
while [ $# -gt 0 ] && [ "$1" != -- ]; do files+=("$1"); shift; done
[ "${1:-}" = -- ] && shift
[ ${#files[@]} -gt 0 ] || files=(unit/test_tokenize.py unit/test_template.py)
export LLAMA_SERVER_BIN_PATH="$root/tests/server/llama_server_shim.sh"
# A free port (the suite's default is 8080, which another server may hold), the suite's cache and
# Python's byte code outside the pinned sources.
export PORT="$("$root/.venv-server/bin/python" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
LLAMA_CACHE="$(mktemp -d)"
export LLAMA_CACHE PYTHONDONTWRITEBYTECODE=1
trap 'rm -rf "$LLAMA_CACHE"' EXIT
cd "$suite"
"$root/.venv-server/bin/python" -m pytest -q -p no:cacheprovider "${files[@]}" "$@"
