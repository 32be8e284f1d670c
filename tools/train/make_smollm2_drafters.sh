#!/usr/bin/env bash
# Train the drafters for SmolLM2-135M-Instruct (the default target) from its own replies.
#   tools/train/make_smollm2_drafters.sh [WORK_DIR] [TRAIN_MINUTES] [DRAFTERS]
#   (defaults /tmp/smollm2_train, 30, "eagle3"; DRAFTERS: any of eagle3, eagle1, draft-lm, e.g. "eagle3 draft-lm")
# THREADS (default 2) sets the threads of every step: 1 leaves a core free for other work
# (libgomp collapses when more compute threads than CPUs are busy).
# Needs: pip install -r tools/train/requirements.txt; build/bin/specula and llama-tokenize
# (scripts/build.sh); the target in the model cache (scripts/fetch_models.sh).
# Outputs: models/smollm2-eagle3.gguf, models/smollm2-eagle1.gguf, models/smollm2-draft.gguf, with
# their training logs models/smollm2_train_log.jsonl, smollm2_eagle1_train_log.jsonl and
# smollm2_draft_train_log.jsonl.
# The shipped files are what these steps produce; models/README.md says how long each took.
# Steps: prompts (committed: models/smollm2_prompts.json) -> the target's chat replies, eight sets
# (specula serve, 4 slots; greedy, and sampled at T = 0.6, 0.7, 0.8 (two seeds), 0.9, 1.0 (two seeds))
# -> target features and top-16 distributions (torch, two processes) -> each drafter (wall-clock
# budget, checkpoints as it goes; bf16 matmuls where the CPU has AMX or AVX-512 BF16)
# -> GGUF with the target's tokenizer. Finished replies and features in WORK_DIR are reused.
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
WORK="${1:-/tmp/smollm2_train}"
MINUTES="${2:-30}"
DRAFTERS="${3:-eagle3}"
THREADS="${THREADS:-2}"
MODEL="${SPECULA_MODEL_CACHE:-$HOME/.cache/specula/models}/SmolLM2-135M-Instruct.Q4_1.gguf"
BIN="$ROOT/build/bin"
TOKENIZE="$BIN/llama-tokenize"  # llama.cpp's, from the pinned source scripts/build.sh fetched
for d in $DRAFTERS; do
  case "$d" in eagle3|eagle1|draft-lm) ;; *) echo "make_smollm2_drafters.sh: unknown drafter '$d' (eagle3, eagle1, draft-lm)" >&2; exit 2 ;; esac
done
cmake --build "$ROOT/build" --target llama-tokenize llama-server >/dev/null
mkdir -p "$WORK"
SETS="0:1 0.8:1000 1.0:2000 0.8:3000 1.0:4000 0.6:5000 0.7:6000 0.9:7000"  # temperature:seed of each reply set (prompt i uses seed + i)
for set in $SETS; do
  python3 "$HERE/generate_responses.py" --specula "$BIN/specula" --model "$MODEL" --prompts "$ROOT/models/smollm2_prompts.json" \
    --out "$WORK/gen_${set/:/_}.jsonl" --n 192 --temp "${set%%:*}" --seed "${set##*:}" --split train --parallel 4 --threads "$THREADS"
done
python3 "$HERE/chat_data.py" --model "$MODEL" --tokenize "$TOKENIZE" --gen "$WORK/gen_0_1.jsonl" --limit 10
features() {  # two processes, every other set each (one after the other with THREADS=1), a thread each
  for set in "$@"; do
    [ -f "$WORK/feats_${set/:/_}.pt" ] && continue
    python3 "$HERE/target_features.py" --model "$MODEL" --tokenize "$TOKENIZE" --gen "$WORK/gen_${set/:/_}.jsonl" --n 192 \
      --out "$WORK/feats_${set/:/_}.pt.tmp" --threads 1 --split train
    mv "$WORK/feats_${set/:/_}.pt.tmp" "$WORK/feats_${set/:/_}.pt"
  done
}
read -ra all <<<"$SETS"
if [ "$THREADS" -ge 2 ]; then
  even=() odd=()  # interleaved, so that a resumed run's remaining sets still split evenly
  for i in "${!all[@]}"; do if ((i % 2)); then odd+=("${all[i]}"); else even+=("${all[i]}"); fi; done
  features "${even[@]}" &
  features "${odd[@]}"
  wait
else
  features "${all[@]}"
fi
feats=()
for set in $SETS; do feats+=(--feats "$WORK/feats_${set/:/_}.pt"); done
bf16=()
if grep -qwE 'amx_bf16|avx512_bf16' /proc/cpuinfo; then bf16=(--bf16); fi
for d in $DRAFTERS; do
  if [ "$d" = eagle3 ]; then
    python3 "$HERE/train_eagle.py" --kind eagle3 "${feats[@]}" --model "$MODEL" --out "$WORK/eagle3.pt" --name smollm2-eagle3 \
      --log "$WORK/train_log.jsonl" --minutes "$MINUTES" --threads "$THREADS" --vocab 4096 --batch 4 --lr 2e-3 --warmup 20 \
      --save_every 50 "${bf16[@]}"
    python3 "$HERE/export_gguf.py" --kind eagle3 --ckpt "$WORK/eagle3.pt" --target "$MODEL" --out "$ROOT/models/smollm2-eagle3.gguf" \
      --name smollm2-eagle3 --type q8_0
    # every 10th step's record and the start/done events: the whole log (a record a step) is ~1.7 MB of models/' 80 MB
    python3 -c 'import json, sys
for line in open(sys.argv[1]):
    if json.loads(line).get("step", 0) % 10 == 0: sys.stdout.write(line)' "$WORK/train_log.jsonl" >"$ROOT/models/smollm2_train_log.jsonl"
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
