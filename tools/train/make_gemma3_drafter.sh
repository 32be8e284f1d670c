#!/usr/bin/env bash
# Train the EAGLE-3 head for Gemma 3 270M (the PyPI file is the *pretrained* model, so it is
# self-distilled on completions, not chat turns) from its own continuations.
#   tools/train/make_gemma3_drafter.sh [WORK_DIR] [TRAIN_MINUTES]   (defaults /tmp/gemma3_train, 30)
# THREADS (default 2) sets the threads of every step.
# Needs: pip install -r tools/train/requirements.txt; build/bin/specula and llama-tokenize
# (scripts/build.sh); the target in the model cache (scripts/fetch_models.sh).
# Output: models/gemma3-eagle3.gguf and its training log models/gemma3_train_log.jsonl (every 10th step;
#   a run from INIT appends its own).
# Steps: the SmolLM2 prompt set (models/smollm2_prompts.json), each prompt framed as
# "Question: ...\nAnswer:" -> the target's continuations, four sets (specula serve, 4 slots,
# /v1/completions; greedy, and sampled at T = 0.6, 0.8, 1.0) -> target features at layers 2, 9, 15
# and top-16 distributions over the 262144-token vocabulary (torch, gemma3.py) -> the head over a
# compact 4096-token draft vocabulary (d2t), 4 heads of 160 / 2 KV heads, FFN 1024 -> GGUF (2-D
# weights Q4_0 but the lm_head Q8_0, and without a copy of the 262144-token vocabulary: llama.cpp
# cannot run an EAGLE-3 head on gemma3 anyway, specula uses the target's). Finished continuations and features in
# WORK_DIR are reused. The defaults reproduce the shipped head; for more data:
# PROMPTS=FILE another prompt set, e.g. ShareGPT's (tools/train/sharegpt_prompts.py): its single-turn
#   prompts only (a frame takes one question; generate_responses.py --single-turn);
# FIRST=N the first N prompts of the set (default 352, the shipped head's; "" for all); LIMIT=N the
#   first N in reply order (categories round-robin); SETS the temperature:seed sets; CTX the context;
# HELDOUT=1 greedy continuations of the held-out prompts too, their features the training's held-out
#   agreement (--heldout);
# FEATURES=specula the features from `specula target-features` (the engine's kernels, several times
#   faster than the torch port the shipped head's came from);
# REPLIES=models/gemma3_sharegpt_replies.jsonl.gz starts from the committed continuations of
#   ShareGPT's prompts (sharegpt_replies.py unpack, into a WORK_DIR without continuations; PROMPTS
#   the set they index): the continuation step then adds only what a larger LIMIT or new SETS ask for;
# EXTRA_FEATS='FILE[:N] ...' trains on these features files too (another work directory's, e.g. the
#   template sets' beside ShareGPT's), N the file's weight (train_eagle.py --feats FILE:N);
# INIT=HEAD.gguf|CKPT.pt extends a head (train_eagle.py --init; LR sets the peak, default 2e-3);
# STOP=replies or STOP=features ends the run after that step (training later, by hand or by a rerun).
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
WORK="${1:-/tmp/gemma3_train}"
MINUTES="${2:-30}"
THREADS="${THREADS:-2}"
MODEL="${SPECULA_MODEL_CACHE:-$HOME/.cache/specula/models}/gemma-3-270m-q4_k_m.gguf"
BIN="$ROOT/build/bin"
TOKENIZE="$BIN/llama-tokenize"
PROMPTS="${PROMPTS:-$ROOT/models/smollm2_prompts.json}"
FIRST="${FIRST-352}"  # the 352 prompts the shipped head was trained on
LIMIT="${LIMIT:-}"
SETS="${SETS:-0:1 0.8:1000 1.0:2000 0.6:5000}"  # temperature:seed of each set (prompt i uses seed + i)
CTX="${CTX:-1024}"
HELDOUT="${HELDOUT:-}"
REPLIES="${REPLIES:-}"
FEATURES="${FEATURES:-torch}"
EXTRA_FEATS="${EXTRA_FEATS:-}"
INIT="${INIT:-}"
LR="${LR:-2e-3}"
STOP="${STOP:-}"
case "$FEATURES" in torch|specula) ;; *) echo "make_gemma3_drafter.sh: FEATURES is torch or specula, not '$FEATURES'" >&2; exit 2 ;; esac
case "$STOP" in ""|replies|features) ;; *) echo "make_gemma3_drafter.sh: STOP is replies or features, not '$STOP'" >&2; exit 2 ;; esac
FRAME=$'Question: {}\nAnswer:'
N=160
cmake --build "$ROOT/build" --target llama-tokenize llama-server >/dev/null
mkdir -p "$WORK"
if [ -n "$REPLIES" ] && ! ls "$WORK"/gen_*.jsonl >/dev/null 2>&1; then
  python3 "$HERE/sharegpt_replies.py" unpack --replies "$REPLIES" --prompts "$PROMPTS" --work "$WORK"
fi
continuations() {  # $1: output, then generate_responses.py's selection and sampling arguments
  local out="$1"
  shift
  python3 "$HERE/generate_responses.py" --specula "$BIN/specula" --model "$MODEL" --prompts "$PROMPTS" --out "$out" --n "$N" \
    --parallel 4 --ctx "$CTX" --threads "$THREADS" --frame "$FRAME" --single-turn "$@"
}
for set in $SETS; do
  continuations "$WORK/gen_${set/:/_}.jsonl" --temp "${set%%:*}" --seed "${set##*:}" --split train ${FIRST:+--first "$FIRST"} ${LIMIT:+--limit "$LIMIT"}
done
if [ -n "$HELDOUT" ]; then continuations "$WORK/heldout_0_1.jsonl" --temp 0 --seed 1 --split heldout; fi
[ "$STOP" = replies ] && exit 0
python3 "$HERE/chat_data.py" --model "$MODEL" --tokenize "$TOKENIZE" --gen "$WORK/gen_0_1.jsonl" --limit 10 --frame "$FRAME"
features() {  # $1: continuation file stem, $2: split
  local f="$WORK/feats_${1#gen_}.pt"
  [ -f "$f" ] && return
  local engine=()
  if [ "$FEATURES" = specula ]; then engine=(--specula "$BIN/specula"); fi
  python3 "$HERE/target_features.py" --model "$MODEL" --tokenize "$TOKENIZE" --gen "$WORK/$1.jsonl" --n "$N" \
    --out "$f.tmp" --threads "$THREADS" --split "$2" --layers 2,9,15 --frame "$FRAME" "${engine[@]}"
  mv "$f.tmp" "$f"
}
feats=()
for set in $SETS; do
  features "gen_${set/:/_}" train
  feats+=(--feats "$WORK/feats_${set/:/_}.pt")
done
for f in $EXTRA_FEATS; do feats+=(--feats "$f"); done
heldout=()
if [ -n "$HELDOUT" ]; then
  features heldout_0_1 heldout
  heldout=(--heldout "$WORK/feats_heldout_0_1.pt" --eval_every 500)
fi
[ "$STOP" = features ] && exit 0
init=()
if [ -n "$INIT" ]; then init=(--init "$INIT"); fi
bf16=()
if grep -qwE 'amx_bf16|avx512_bf16' /proc/cpuinfo; then bf16=(--bf16); fi
python3 "$HERE/train_eagle.py" --kind eagle3 "${feats[@]}" --model "$MODEL" --out "$WORK/eagle3.pt" --name gemma3-eagle3 \
  --log "$WORK/train_log.jsonl" --minutes "$MINUTES" --threads "$THREADS" --vocab 4096 --heads 4 --kv_heads 2 --ffn 1024 \
  --batch 4 --lr "$LR" --warmup 20 --save_every 50 "${heldout[@]}" "${init[@]}" "${bf16[@]}"
python3 "$HERE/export_gguf.py" --kind eagle3 --ckpt "$WORK/eagle3.pt" --target "$MODEL" --omit-vocab --out "$ROOT/models/gemma3-eagle3.gguf" \
  --name gemma3-eagle3 --type q4_0
# The committed log keeps every 10th step and the start/done events (the models/ budget); a run
# from INIT extends the head, so its log follows the earlier runs'.
python3 -c 'import json, sys
for line in open(sys.argv[1]):
    r = json.loads(line)
    if "event" in r or r["step"] % 10 == 0: sys.stdout.write(line)' "$WORK/train_log.jsonl" > "$WORK/train_log_every10.jsonl"
if [ -n "$INIT" ]; then cat "$WORK/train_log_every10.jsonl" >>"$ROOT/models/gemma3_train_log.jsonl"
else cp "$WORK/train_log_every10.jsonl" "$ROOT/models/gemma3_train_log.jsonl"; fi
