#!/usr/bin/env bash
# ctest entry for the server's end-to-end tests: pytest from the venv that
# scripts/setup_server_tests.sh makes (scripts/test.sh runs it), against the given specula binary.
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
if [ ! -x "$root/.venv-server/bin/python" ]; then
  echo "server tests: no .venv-server; run scripts/setup_server_tests.sh" >&2
  exit 1
fi
SPECULA_CLI="$1" exec "$root/.venv-server/bin/python" -m pytest -q -p no:cacheprovider "$root/tests/server"
