#!/usr/bin/env bash
# llama-server's command line, as llama.cpp's server tests build it (tools/server/tests/utils.py),
# run as `specula serve`: the flags specula has are passed on under its names, the model is a
# local one ($SHIM_MODEL, default the bundled target) whatever file or repository is named, and
# the flags of features specula does not have are dropped (the suite's tests of those fail or are
# not applicable: docs/server.md, "llama.cpp's server tests").
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
specula="${SPECULA_CLI:-$root/build/bin/specula}"
# llama-server answers whatever model a request names (the suite names OpenAI's): --any-model.
args=(serve -m "${SHIM_MODEL:-$root/models/specula-target.gguf}" --any-model)
threads=1
ctx=""
slots=1
while [ $# -gt 0 ]; do
  flag="$1"
  shift
  case "$flag" in
    --port | --host | --alias | --api-key | --reasoning-format | --reasoning) args+=("$flag" "$1"); shift ;;
    -rea) args+=(--reasoning "$1"); shift ;;
    # The server-wide request defaults (a request that omits the field gets them).
    --temp | --seed | --top-k | --top-p | --min-p | --repeat-penalty | --presence-penalty | --frequency-penalty | --n-predict) args+=("$flag" "$1"); shift ;;
    --repeat-last-n) args+=(--penalty-last-n "$1"); shift ;;
    --parallel) slots="$1"; args+=(--parallel "$1"); shift ;;
    --ctx-size) ctx="$1"; shift ;;  # llama-server's is all the slots' together, specula's -c each slot's
    # The most prompt tokens a step computes (llama-server's logical batch), capped at 512.
    --batch-size) args+=(--prefill-chunk "$(( $1 < 512 ? $1 : 512 ))"); shift ;;
    --embedding | --embeddings) args+=(--embeddings) ;;
    --verbose | -v | --log-verbose) args+=(--verbose) ;;
    --pooling) case "$1" in mean | last | cls) args+=(--pooling "$1") ;; esac; shift ;;  # none and rank: not specula's
    --threads) threads="$1"; shift ;;
    --chat-template-file | --chat-template) args+=(--chat-template "$1"); shift ;;  # a file, or a built-in template's name
    --cors-origins) IFS=, read -ra origins <<<"$1"; for o in "${origins[@]}"; do args+=(--cors-origin "$o"); done; shift ;;
    # Flags with a value that specula has no counterpart for (the model's file or repository is
    # replaced by the local model above).
    --model | --model-url | --hf-repo | --hf-file | --model-draft | --models-dir | --models-max | --models-preset | \
      --ubatch-size | --n-gpu-layers | --tags | -ctk | -ctv | -fa | --slot-save-path | \
      --grp-attn-n | --grp-attn-w | --lora | --spec-type | --spec-draft-n-max | --spec-draft-n-min | --spec-synth-len | \
      --spec-synth-rates | --mmproj-url | --media-path | --sleep-idle-seconds | --cache-ram | \
      --tools | --tools-runtime | --mcp-servers-config | --mcp-servers-json) shift ;;
    *) ;;  # switches: --offline, --jinja (always on), --metrics, --slots (always served), --embedding, ...
  esac
done
[ -z "$ctx" ] || args+=(-c "$((ctx / slots))")
exec "$specula" "${args[@]}" -t "$threads"
