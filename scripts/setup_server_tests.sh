#!/usr/bin/env bash
# The clients the server's end-to-end tests drive (tests/server/): the real `openai` Python package
# and pytest, pinned, from PyPI into a git-ignored venv (.venv-server/), and the real `openai` npm
# package, pinned, into .venv-server/node/; and the packages llama.cpp's own server tests import
# (tests/server/llama_server_suite.sh), pinned. Idempotent.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/progress.sh
progress_start setup_server_tests 2 steps --lines
OPENAI_VERSION=3.54.0
PYTEST_VERSION=9.2.0
SUITE_PACKAGES=(requests==2.32.3 wget==3.2 filelock==3.16.1)
OPENAI_NPM_VERSION=7.55.0
venv=.venv-server
if ! { [ -x "$venv/bin/python" ] && "$venv/bin/python" - "$OPENAI_VERSION" "$PYTEST_VERSION" <<'PY' 2>/dev/null; }; then
import sys, openai, pytest
sys.exit(0 if (openai.__version__, pytest.__version__) == (sys.argv[1], sys.argv[2]) else 1)
PY
  progress_step 0 "openai==$OPENAI_VERSION and pytest==$PYTEST_VERSION from PyPI into $venv"
  python3 -m venv "$venv"
  "$venv/bin/python" -m pip install --quiet --disable-pip-version-check "openai==$OPENAI_VERSION" "pytest==$PYTEST_VERSION"
fi
if ! "$venv/bin/python" -c 'import requests, wget, filelock; assert (requests.__version__, filelock.__version__) == ("2.32.3", "3.16.1")' 2>/dev/null; then
  "$venv/bin/python" -m pip install --quiet --disable-pip-version-check "${SUITE_PACKAGES[@]}"
fi
installed=$(node -p "require('./$venv/node/node_modules/openai/package.json').version" 2>/dev/null || true)
if [ "$installed" != "$OPENAI_NPM_VERSION" ]; then
  progress_step 1 "openai@$OPENAI_NPM_VERSION from npm into $venv/node"
  mkdir -p "$venv/node"
  npm install --prefix "$venv/node" --no-audit --no-fund --silent "openai@$OPENAI_NPM_VERSION"
fi
