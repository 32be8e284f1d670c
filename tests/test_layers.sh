#!/usr/bin/env bash
# The layers of src/ (src/CMakeLists.txt links each library only to the ones below it):
#   specula_runtime      common, runtime (the forward pass, its kernels and the KV cache), tokenizer
#   specula_speculation  sample, tree, verify, policy, draft, trace
#   specula_engine       engine (and the public API of include/specula/specula.h)
#   specula_server       server
# The include root is src/ for every library, so the compiler alone would accept an upward include;
# this check fails on any `#include "folder/..."` that the table below does not allow, naming the
# file and line. Usage: test_layers.sh [src dir] (default: the src/ next to this script).
set -euo pipefail
src=${1:-"$(dirname "$0")/../src"}

# folder -> the folders its files may include (its own included). specula/ is the public API: its
# leaf headers (error, options, sampling, report) are allowed everywhere, specula.h only above.
declare -A allowed=(
  [common]="common"
  [runtime]="common runtime"
  [tokenizer]="common runtime tokenizer"
  [sample]="common sample"
  [tree]="common tree"
  [verify]="common sample tree verify"
  [policy]="common tree policy"
  [draft]="common runtime sample tree draft"
  [trace]="common sample tree verify trace"
  [engine]="common runtime tokenizer sample tree verify policy draft trace engine"
  [server]="common runtime tokenizer sample tree verify policy draft trace engine server"
)
public_leaves="specula/error.h specula/options.h specula/sampling.h specula/report.h"

status=0
for dir in "$src"/*/; do
  folder=$(basename "$dir")
  if [[ -z ${allowed[$folder]+x} ]]; then
    echo "test_layers.sh: src/$folder is in no layer: add it to the table in $0" >&2
    status=1
    continue
  fi
  while IFS=: read -r file line text; do
    target=$(sed -E 's/^[[:space:]]*#[[:space:]]*include[[:space:]]*"([^"]+)".*/\1/' <<<"$text")
    top=${target%%/*}
    [[ $target == */* ]] || continue  # same-folder and library headers ("ggml.h")
    if [[ $top == specula ]]; then
      [[ " $public_leaves " == *" $target "* ]] && continue
      [[ $folder == engine || $folder == server ]] && continue
    else
      [[ -n ${allowed[$top]+x} ]] || continue  # not a folder of src/
      [[ " ${allowed[$folder]} " == *" $top "* ]] && continue
    fi
    echo "${file#"$src"/}:$line: src/$folder may not include \"$target\" (a higher layer)" >&2
    status=1
  done < <(grep -rnE '^[[:space:]]*#[[:space:]]*include[[:space:]]*"' "$dir" || true)
done
exit $status
