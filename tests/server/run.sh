#!/usr/bin/env bash
# ctest entry for the server's end-to-end tests: pytest from the venv that
# scripts/setup_server_tests.sh makes (scripts/test.sh runs it), against the given specula binary,
# with any further arguments passed to pytest;
# with a second argument `load`, the 20-second load test (load_test.py) on the bundled family,
# failing when the RSS peak grows by more than the third argument (a fraction; inf: no bound).
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
if [ ! -x "$root/.venv-server/bin/python" ]; then
  echo "server tests: no .venv-server; run scripts/setup_server_tests.sh" >&2
  exit 1
fi
if [ "${2:-}" = load ]; then
  exec "$root/.venv-server/bin/python" "$root/tests/server/load_test.py" --clients 32 --seconds 20 --rss-growth "${3:?RSS growth bound}" -- "$1" serve \
    -m "$root/models/specula-target.gguf" --draft "$root/models/specula-draft.gguf" --parallel 8 -t 1
fi
SPECULA_CLI="$1" exec "$root/.venv-server/bin/python" -m pytest -q -p no:cacheprovider "$root/tests/server" "${@:2}"
