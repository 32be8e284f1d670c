#!/usr/bin/env bash
# Installs the Debian packages specula builds with, when missing. Idempotent; needs root (or sudo).
#   scripts/setup.sh          what building the `specula` command needs (scripts/demo.sh)
#   scripts/setup.sh --tests  also the test suite's tools: GoogleTest, clang-format, Chromium,
#                             python3-venv (scripts/test.sh, scripts/build.sh)
#   scripts/setup.sh --fuzz   also clang + libFuzzer (scripts/fuzz.sh)
set -euo pipefail
. "$(dirname "$0")/progress.sh"
packages=(g++ cmake make ninja-build git ca-certificates npm ccache libbenchmark-dev
          nlohmann-json3-dev libcli11-dev python3-pip unzip)
case "${1:-}" in
  "") ;;
  --tests|--fuzz)
    packages+=(libgtest-dev
               python3-venv                  # scripts/setup_server_tests.sh: the openai clients' venv
               clang-format-14               # scripts/check_format.sh: the sources follow .clang-format
               chromium)                     # headless browser: test_report renders the HTML report
    if [ "$1" = --fuzz ]; then
      packages+=(clang-14 libclang-rt-14-dev)  # clang + libFuzzer
    fi
    ;;
  *) echo "setup: error: unknown argument '$1' (expected nothing, --tests or --fuzz)" >&2; exit 1 ;;
esac
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
# npm may come from outside Debian (e.g. a node install); any working npm will do.
if command -v npm >/dev/null 2>&1; then
  missing=("${missing[@]/npm}")
fi
# The same for pip (scripts/fetch_models.sh downloads the real models with it).
if command -v pip3 >/dev/null 2>&1 || command -v pip >/dev/null 2>&1; then
  missing=("${missing[@]/python3-pip}")
fi
# And for venv (scripts/setup_server_tests.sh): a python3 that has it needs no Debian package.
if python3 -c 'import ensurepip, venv' >/dev/null 2>&1; then
  missing=("${missing[@]/python3-venv}")
fi
missing=($(printf '%s\n' "${missing[@]}" | grep -v '^$' || true))
if [ ${#missing[@]} -gt 0 ]; then
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  progress_start setup 2 steps --lines
  progress_step 0 "apt-get update"
  $SUDO apt-get update -qq
  progress_step 1 "apt-get install ${missing[*]}"
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
  progress_step 2 "installed ${#missing[@]} packages"
fi
