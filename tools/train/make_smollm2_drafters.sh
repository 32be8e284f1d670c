#!/usr/bin/env bash
# Train the drafters for SmolLM2-135M-Instruct (the default target) from its own replies.
#   tools/train/make_smollm2_drafters.sh [WORK_DIR] [TRAIN_MINUTES]   (default /tmp/smollm2_train, 35)
# Needs: pip install -r tools/train/requirements.txt; build/bin/specula and llama-tokenize
# (scripts/build.sh); the target in the model cache (scripts/fetch_models.sh).
# Outputs: models/smollm2-eagle3.gguf, models/smollm2_train_log.jsonl.
# The shipped head came from a cut-short run of these steps (170 of the greedy replies, all sampled
# ones, 28 minutes of training on a loaded CPU; see models/README.md); this script runs them in full.
# Steps: prompts (committed: models/smollm2_prompts.json) -> the target's greedy chat replies
# (specula generate --chat, -n 192; greedy and sampled at T=0.8) -> target features and top-16 distributions (torch) ->
# EAGLE-3 head (wall-clock budget, checkpoints as it goes) -> GGUF.
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
WORK="${1:-/tmp/smollm2_train}"
MINUTES="${2:-35}"
MODEL="${SPECULA_MODEL_CACHE:-$HOME/.cache/specula/models}/SmolLM2-135M-Instruct.Q4_1.gguf"
BIN="$ROOT/build/bin"
TOKENIZE="$BIN/llama-tokenize"  # built by scripts/build.sh (a llama.cpp peer target)
mkdir -p "$WORK"
for T in 0 0.8; do  # greedy and sampled replies (the sampled ones with their own seeds)
  python3 "$HERE/generate_responses.py" --specula "$BIN/specula" --model "$MODEL" --prompts "$ROOT/models/smollm2_prompts.json" \
    --out "$WORK/gen_T$T.jsonl" --n 192 --temp "$T" --seed $([ "$T" = 0 ] && echo 1 || echo 1000) --split train
done
python3 "$HERE/smollm2_data.py" --model "$MODEL" --tokenize "$TOKENIZE" --gen "$WORK/gen_T0.jsonl" --limit 10
for T in 0 0.8; do
  python3 "$HERE/smollm2_features.py" --model "$MODEL" --tokenize "$TOKENIZE" --gen "$WORK/gen_T$T.jsonl" --n 192 \
    --out "$WORK/feats_T$T.pt" --threads 2 --split train
done
python3 "$HERE/train_eagle3_smollm2.py" --feats "$WORK/feats_T0.pt" --feats "$WORK/feats_T0.8.pt" --model "$MODEL" --out "$WORK/eagle3.pt" \
  --log "$WORK/train_log.jsonl" --minutes "$MINUTES" --threads 2 --vocab 4096 --batch 4 --lr 3e-3 --warmup 10 --save_every 20
python3 "$HERE/export_gguf.py" --kind eagle3 --ckpt "$WORK/eagle3.pt" --target "$MODEL" --out "$ROOT/models/smollm2-eagle3.gguf" --name smollm2-eagle3 --type q8_0
cp "$WORK/train_log.jsonl" "$ROOT/models/smollm2_train_log.jsonl"
