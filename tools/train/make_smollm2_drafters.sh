#!/usr/bin/env bash
# Train the drafters for SmolLM2-135M-Instruct (the default target) from its own replies.
#   tools/train/make_smollm2_drafters.sh [WORK_DIR] [TRAIN_MINUTES] [DRAFTERS]
#   (defaults /tmp/smollm2_train, 30, "eagle3"; DRAFTERS: any of eagle3, eagle1, draft-lm, e.g. "eagle3 draft-lm";
#   "" stops after the replies and features, for a training run started by hand)
# THREADS (default 2) sets the threads of every step: 1 leaves a core free for other work
# (libgomp collapses when more compute threads than CPUs are busy).
# Needs: pip install -r tools/train/requirements.txt; build/bin/specula and llama-tokenize
# (scripts/build.sh); the target in the model cache (scripts/fetch_models.sh).
# Outputs: models/smollm2-eagle3.gguf, models/smollm2-eagle1.gguf, models/smollm2-draft.gguf, with
# their training logs models/smollm2_train_log.jsonl, smollm2_eagle1_train_log.jsonl and
# smollm2_draft_train_log.jsonl.
# The shipped files are what these steps produce; models/README.md says how long each took.
# Steps: prompts (committed: models/smollm2_prompts.json) -> the target's chat replies to every
# train prompt, reply sets listed in SETS as temperature:seed (specula serve, 8 slots; default
# greedy, and sampled at T = 0.6, 0.7, 0.8 (two seeds), 0.9, 1.0 (two seeds)), and greedy replies
# to the held-out prompts -> target features and top-16 distributions (`specula target-features`:
# the engine's own kernels) -> each drafter (wall-clock budget, checkpoints as it goes, held-out
# agreement in the log; bf16 matmuls where the CPU has AMX or AVX-512 BF16) -> GGUF with the
# target's tokenizer. Finished replies and features in WORK_DIR are reused.
# PROMPTS=FILE takes another prompt set, e.g. ShareGPT's real conversations
# (tools/train/sharegpt_prompts.py --out FILE; later turns carry their earlier turns as context;
# CTX=1024 then, as its prompts run to 1,200 characters).
# FIRST=N takes only the first N prompts (the shipped EAGLE-3 head: FIRST=540).
# LIMIT=N replies to only the first N training prompts in reply order (the categories round-robin):
# a large set such as ShareGPT's is cut to what the reply budget allows, reproducibly.
# CHUNK=N extracts features per N replies into separate files (a large set's features do not fit
# in memory twice, as one extraction needs them).
# REPLIES=models/smollm2_sharegpt_replies.jsonl.gz starts from the committed replies to ShareGPT's
# prompts (sharegpt_replies.py unpack, into a WORK without replies; with LIMIT the replies to those
# LIMIT training prompts alone, however many more the file holds): the reply step then only adds
# what a larger LIMIT or new SETS ask for (the last feature chunk of a set that grew must be deleted).
# INIT=models/smollm2-eagle3.gguf extends the shipped EAGLE-3 head (train_eagle.py --init: its
# weights and draft vocabulary, a new optimizer and schedule; LR, default 2e-3, sets the peak).
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
WORK="${1:-/tmp/smollm2_train}"
MINUTES="${2:-30}"
DRAFTERS="${3-eagle3}"
THREADS="${THREADS:-2}"
SETS="${SETS:-0:1 0.8:1000 1.0:2000 0.8:3000 1.0:4000 0.6:5000 0.7:6000 0.9:7000}"
INIT="${INIT:-}"
FIRST="${FIRST:-}"
LIMIT="${LIMIT:-}"
REPLIES="${REPLIES:-}"
CHUNK="${CHUNK:-}"
PROMPTS="${PROMPTS:-$ROOT/models/smollm2_prompts.json}"
CTX="${CTX:-512}"
LR="${LR:-2e-3}"
MODEL="${SPECULA_MODEL_CACHE:-$HOME/.cache/specula/models}/SmolLM2-135M-Instruct.Q4_1.gguf"
BIN="$ROOT/build/bin"
TOKENIZE="$BIN/llama-tokenize"  # llama.cpp's, from the pinned source scripts/build.sh fetched
for d in $DRAFTERS; do
  case "$d" in eagle3|eagle1|draft-lm) ;; *) echo "make_smollm2_drafters.sh: unknown drafter '$d' (eagle3, eagle1, draft-lm)" >&2; exit 2 ;; esac
done
cmake --build "$ROOT/build" --target llama-tokenize llama-server >/dev/null
mkdir -p "$WORK"
if [ -n "$REPLIES" ] && ! ls "$WORK"/gen_*.jsonl >/dev/null 2>&1; then
  python3 "$HERE/sharegpt_replies.py" unpack --replies "$REPLIES" --prompts "$PROMPTS" --work "$WORK" ${LIMIT:+--limit "$LIMIT"}
fi
# temperature:seed of each reply set (prompt i uses seed + i)
for set in $SETS; do
  python3 "$HERE/generate_responses.py" --specula "$BIN/specula" --model "$MODEL" --prompts "$PROMPTS" \
    --out "$WORK/gen_${set/:/_}.jsonl" --n 192 --temp "${set%%:*}" --seed "${set##*:}" --split train --parallel 8 --ctx "$CTX" --threads "$THREADS" \
    ${FIRST:+--first "$FIRST"} ${LIMIT:+--limit "$LIMIT"}
done
python3 "$HERE/generate_responses.py" --specula "$BIN/specula" --model "$MODEL" --prompts "$PROMPTS" \
  --out "$WORK/heldout_0_1.jsonl" --n 192 --temp 0 --seed 1 --split heldout --parallel 8 --ctx "$CTX" --threads "$THREADS"
python3 "$HERE/chat_data.py" --model "$MODEL" --tokenize "$TOKENIZE" --gen "$WORK/gen_0_1.jsonl" --limit 10
features() {  # $1: reply file stem, $2: split
  [ -f "$WORK/feats_$1.pt" ] && return
  python3 "$HERE/target_features.py" --model "$MODEL" --tokenize "$TOKENIZE" --gen "$WORK/$1.jsonl" --n 192 \
    --out "$WORK/feats_$1.pt.tmp" --threads "$THREADS" --split "$2" --specula "$BIN/specula"
  mv "$WORK/feats_$1.pt.tmp" "$WORK/feats_$1.pt"
}
stems=()  # the reply files whose features train the drafters: one per set, or its CHUNK-line parts
for set in $SETS; do
  stem="gen_${set/:/_}"
  if [ -n "$CHUNK" ]; then
    split -l "$CHUNK" -d -a 2 --additional-suffix=.jsonl "$WORK/$stem.jsonl" "$WORK/$stem.part"
    for part in "$WORK/$stem".part??.jsonl; do stems+=("$(basename "$part" .jsonl)"); done
  else
    stems+=("$stem")
  fi
done
for stem in "${stems[@]}"; do features "$stem" train; done
features heldout_0_1 heldout
feats=()
for stem in "${stems[@]}"; do feats+=(--feats "$WORK/feats_$stem.pt"); done
init=()
if [ -n "$INIT" ]; then init=(--init "$INIT"); fi
bf16=()
if grep -qwE 'amx_bf16|avx512_bf16' /proc/cpuinfo; then bf16=(--bf16); fi
for d in $DRAFTERS; do
  if [ "$d" = eagle3 ]; then
    python3 "$HERE/train_eagle.py" --kind eagle3 "${feats[@]}" --model "$MODEL" --out "$WORK/eagle3.pt" --name smollm2-eagle3 \
      --log "$WORK/train_log.jsonl" --minutes "$MINUTES" --threads "$THREADS" --vocab 4096 --batch 4 --lr "$LR" --warmup 20 \
      --save_every 50 --eval_every 500 --heldout "$WORK/feats_heldout_0_1.pt" "${bf16[@]}" "${init[@]}"
    python3 "$HERE/export_gguf.py" --kind eagle3 --ckpt "$WORK/eagle3.pt" --target "$MODEL" --out "$WORK/smollm2-eagle3-q8_0.gguf" \
      --name smollm2-eagle3 --type q8_0
    # the layers requantized from that Q8_0 export to Q4_0, output.weight kept (models/README.md: why)
    python3 "$HERE/requantize_gguf.py" --input "$WORK/smollm2-eagle3-q8_0.gguf" --output "$ROOT/models/smollm2-eagle3.gguf"
    # every 10th step's record and the events: the whole log (a record a step) is ~1.7 MB of models/' 80 MB;
    # an extended head's log follows the log of the head it started from
    python3 -c 'import json, sys
for line in open(sys.argv[1]):
    if json.loads(line).get("step", 0) % 10 == 0: sys.stdout.write(line)' "$WORK/train_log.jsonl" >"$WORK/train_log_every10.jsonl"
    if [ -n "$INIT" ]; then cat "$WORK/train_log_every10.jsonl" >>"$ROOT/models/smollm2_train_log.jsonl"
    else mv "$WORK/train_log_every10.jsonl" "$ROOT/models/smollm2_train_log.jsonl"; fi
  elif [ "$d" = eagle1 ]; then
    python3 "$HERE/train_eagle.py" --kind eagle1 "${feats[@]}" --model "$MODEL" --out "$WORK/eagle1.pt" --name smollm2-eagle1 \
      --log "$WORK/eagle1_train_log.jsonl" --minutes "$MINUTES" --threads "$THREADS" --batch 4 --lr 2e-3 --warmup 20 \
      --save_every 50 "${bf16[@]}"
    python3 "$HERE/export_gguf.py" --kind eagle1 --ckpt "$WORK/eagle1.pt" --target "$MODEL" --out "$ROOT/models/smollm2-eagle1.gguf" \
      --name smollm2-eagle1 --type q8_0
    cp "$WORK/eagle1_train_log.jsonl" "$ROOT/models/smollm2_eagle1_train_log.jsonl"
  else
    python3 "$HERE/train_lm.py" "${feats[@]}" --model "$MODEL" --out "$WORK/draft_lm.pt" --batch 4 --lr 2e-3 --wd 0.05 --warmup 30 --seed 2024 \
      --log "$WORK/draft_train_log.jsonl" --minutes "$MINUTES" --threads "$THREADS" "${bf16[@]}"
    python3 "$HERE/export_gguf.py" --kind llama --ckpt "$WORK/draft_lm.pt" --target "$MODEL" --out "$ROOT/models/smollm2-draft.gguf" \
      --name smollm2-draft --type q8_0
    cp "$WORK/draft_train_log.jsonl" "$ROOT/models/smollm2_draft_train_log.jsonl"
  fi
done
