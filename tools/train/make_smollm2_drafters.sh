#!/usr/bin/env bash
# Train the drafters for SmolLM2-135M-Instruct (the default target) from its own replies.
#   tools/train/make_smollm2_drafters.sh [WORK_DIR] [TRAIN_MINUTES]   (default /tmp/smollm2_train, 62)
# Needs: pip install -r tools/train/requirements.txt; build/bin/specula and llama-tokenize
# (scripts/build.sh); the target in the model cache (scripts/fetch_models.sh).
# Outputs: models/smollm2-eagle3.gguf, models/smollm2_train_log.jsonl.
# The shipped head is what these steps produce (session 8: about 85 minutes on a 2-core AVX2 EPYC,
# 62 of them training; see models/README.md).
# Steps: prompts (committed: models/smollm2_prompts.json) -> the target's chat replies
# (specula generate --chat, -n 192; greedy, sampled at T=0.8 and at T=1.0) -> target features and top-16
# distributions (torch) -> EAGLE-3 head (wall-clock budget, checkpoints as it goes) -> GGUF with the target's tokenizer.
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
WORK="${1:-/tmp/smollm2_train}"
MINUTES="${2:-62}"
MODEL="${SPECULA_MODEL_CACHE:-$HOME/.cache/specula/models}/SmolLM2-135M-Instruct.Q4_1.gguf"
BIN="$ROOT/build/bin"
TOKENIZE="$BIN/llama-tokenize"  # llama.cpp's, from the pinned source scripts/build.sh fetched
cmake --build "$ROOT/build" --target llama-tokenize >/dev/null
mkdir -p "$WORK"
SETS="0:1 0.8:1000 1.0:2000"  # temperature:seed of each reply set (prompt i uses seed + i)
for set in $SETS; do
  T="${set%%:*}"
  python3 "$HERE/generate_responses.py" --specula "$BIN/specula" --model "$MODEL" --prompts "$ROOT/models/smollm2_prompts.json" \
    --out "$WORK/gen_T$T.jsonl" --n 192 --temp "$T" --seed "${set##*:}" --split train
done
python3 "$HERE/smollm2_data.py" --model "$MODEL" --tokenize "$TOKENIZE" --gen "$WORK/gen_T0.jsonl" --limit 10
feats=()
for set in $SETS; do
  T="${set%%:*}"
  feats+=(--feats "$WORK/feats_T$T.pt")
  python3 "$HERE/smollm2_features.py" --model "$MODEL" --tokenize "$TOKENIZE" --gen "$WORK/gen_T$T.jsonl" --n 192 \
    --out "$WORK/feats_T$T.pt" --threads 2 --split train
done
python3 "$HERE/train_eagle3_smollm2.py" "${feats[@]}" --model "$MODEL" --out "$WORK/eagle3.pt" \
  --log "$WORK/train_log.jsonl" --minutes "$MINUTES" --threads 2 --vocab 4096 --batch 4 --lr 2e-3 --warmup 20 --save_every 50
python3 "$HERE/export_gguf.py" --kind eagle3 --ckpt "$WORK/eagle3.pt" --target "$MODEL" --out "$ROOT/models/smollm2-eagle3.gguf" --name smollm2-eagle3 --type q8_0
cp "$WORK/train_log.jsonl" "$ROOT/models/smollm2_train_log.jsonl"
