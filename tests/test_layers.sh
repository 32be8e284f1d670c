#!/usr/bin/env bash
# The layers of src/ (src/CMakeLists.txt links each library only to the ones below it):
#   specula_runtime      common, runtime (the forward pass, its kernels and the KV cache), tokenizer
#   specula_speculation  sample, tree, verify, policy, draft, trace, constrain
#   specula_engine       engine (and the public API of include/specula/specula.h)
#   specula_server       server
# The include root is src/ for every library, so the compiler alone would accept an upward include;
# this check fails on any `#include "folder/..."` that the table below does not allow, naming the
# file and line. It also fails where a header is implemented above a folder that includes it (a
# .cpp implements the header it includes first; specula/'s leaves have their .cpp in src/ too):
# that folder's library would need a higher one to link. Usage: test_layers.sh [src dir].
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
  [draft]="common runtime sample tree constrain draft"  # constrain: a grammar limit met while drafting (GrammarError)
  [trace]="common sample tree verify trace"
  [constrain]="common runtime tokenizer sample constrain"
  [engine]="common runtime tokenizer sample tree verify policy draft trace constrain engine"
  [server]="common runtime tokenizer sample tree verify policy draft trace constrain engine server"
)
public_leaves="specula/error.h specula/options.h specula/sampling.h specula/report.h"

# header -> the folder of the .cpp that implements it (includes it first)
declare -A implemented_in=()
while IFS= read -r cpp; do
  first=$(grep -m1 -E '^[[:space:]]*#[[:space:]]*include' "$cpp" || true)
  [[ $first =~ \"([^\"]+/[^\"]+)\" ]] || continue
  rel=${cpp#"$src"/}
  implemented_in[${BASH_REMATCH[1]}]=${rel%%/*}
done < <(find "$src" -name '*.cpp')

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
      included=$([[ " $public_leaves " == *" $target "* || $folder == engine || $folder == server ]] && echo y || true)
    else
      [[ -n ${allowed[$top]+x} ]] || continue  # not a folder of src/
      included=$([[ " ${allowed[$folder]} " == *" $top "* ]] && echo y || true)
    fi
    home=${implemented_in[$target]:-}
    if [[ -z $included ]]; then
      echo "${file#"$src"/}:$line: src/$folder may not include \"$target\" (a higher layer)" >&2
      status=1
    elif [[ -n $home && " ${allowed[$folder]} " != *" $home "* ]]; then
      echo "${file#"$src"/}:$line: \"$target\" is implemented in src/$home, above src/$folder: move its .cpp down" >&2
      status=1
    fi
  done < <(grep -rnE '^[[:space:]]*#[[:space:]]*include[[:space:]]*"' "$dir" || true)
done
exit $status
