#!/usr/bin/env bash
# The Python clients the server's end-to-end tests drive (tests/server/): the real `openai` package
# and pytest, pinned, from PyPI into a git-ignored venv (.venv-server/). Idempotent.
set -euo pipefail
cd "$(dirname "$0")/.."
OPENAI_VERSION=3.54.0
PYTEST_VERSION=9.2.0
venv=.venv-server
if [ -x "$venv/bin/python" ] && "$venv/bin/python" - "$OPENAI_VERSION" "$PYTEST_VERSION" <<'PY' 2>/dev/null; then exit 0; fi
import sys, openai, pytest
sys.exit(0 if (openai.__version__, pytest.__version__) == (sys.argv[1], sys.argv[2]) else 1)
PY
python3 -m venv "$venv"
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check "openai==$OPENAI_VERSION" "pytest==$PYTEST_VERSION"
