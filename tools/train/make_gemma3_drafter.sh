#!/usr/bin/env bash
# Train the EAGLE-3 head for Gemma 3 270M (the PyPI file is the *pretrained* model, so it is
# self-distilled on completions, not chat turns) from its own continuations.
#   tools/train/make_gemma3_drafter.sh [WORK_DIR] [TRAIN_MINUTES]   (defaults /tmp/gemma3_train, 30)
# THREADS (default 2) sets the threads of every step.
# Needs: pip install -r tools/train/requirements.txt; build/bin/specula and llama-tokenize
# (scripts/build.sh); the target in the model cache (scripts/fetch_models.sh).
# Output: models/gemma3-eagle3.gguf and its training log models/gemma3_train_log.jsonl (every 10th step).
# Steps: the SmolLM2 prompt set (models/smollm2_prompts.json), each prompt framed as
# "Question: ...\nAnswer:" -> the target's continuations, four sets (specula serve, 4 slots,
# /v1/completions; greedy, and sampled at T = 0.6, 0.8, 1.0) -> target features at layers 2, 9, 15
# and top-16 distributions over the 262144-token vocabulary (torch, gemma3.py) -> the head over a
# compact 4096-token draft vocabulary (d2t), 4 heads of 160 / 2 KV heads, FFN 1024 -> GGUF (2-D
# weights Q4_0 but the lm_head Q8_0, and without a copy of the 262144-token vocabulary: llama.cpp
# cannot run an EAGLE-3 head on gemma3 anyway, specula uses the target's). Finished continuations and features in
# WORK_DIR are reused.
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
WORK="${1:-/tmp/gemma3_train}"
MINUTES="${2:-30}"
THREADS="${THREADS:-2}"
MODEL="${SPECULA_MODEL_CACHE:-$HOME/.cache/specula/models}/gemma-3-270m-q4_k_m.gguf"
BIN="$ROOT/build/bin"
TOKENIZE="$BIN/llama-tokenize"
FRAME=$'Question: {}\nAnswer:'
N=160
cmake --build "$ROOT/build" --target llama-tokenize llama-server >/dev/null
mkdir -p "$WORK"
SETS="0:1 0.8:1000 1.0:2000 0.6:5000"  # temperature:seed of each set (prompt i uses seed + i)
for set in $SETS; do
  python3 "$HERE/generate_responses.py" --specula "$BIN/specula" --model "$MODEL" --prompts "$ROOT/models/smollm2_prompts.json" \
    --out "$WORK/gen_${set/:/_}.jsonl" --n "$N" --temp "${set%%:*}" --seed "${set##*:}" --split train --parallel 4 \
    --threads "$THREADS" --frame "$FRAME" --first 352  # the 352 prompts the shipped head was trained on
done
python3 "$HERE/chat_data.py" --model "$MODEL" --tokenize "$TOKENIZE" --gen "$WORK/gen_0_1.jsonl" --limit 10 --frame "$FRAME"
feats=()
for set in $SETS; do
  f="$WORK/feats_${set/:/_}.pt"
  if [ ! -f "$f" ]; then
    python3 "$HERE/target_features.py" --model "$MODEL" --tokenize "$TOKENIZE" --gen "$WORK/gen_${set/:/_}.jsonl" --n "$N" \
      --out "$f.tmp" --threads "$THREADS" --split train --layers 2,9,15 --frame "$FRAME"
    mv "$f.tmp" "$f"
  fi
  feats+=(--feats "$f")
done
bf16=()
if grep -qwE 'amx_bf16|avx512_bf16' /proc/cpuinfo; then bf16=(--bf16); fi
python3 "$HERE/train_eagle.py" --kind eagle3 "${feats[@]}" --model "$MODEL" --out "$WORK/eagle3.pt" --name gemma3-eagle3 \
  --log "$WORK/train_log.jsonl" --minutes "$MINUTES" --threads "$THREADS" --vocab 4096 --heads 4 --kv_heads 2 --ffn 1024 \
  --batch 4 --lr 2e-3 --warmup 20 --save_every 50 "${bf16[@]}"
python3 "$HERE/export_gguf.py" --kind eagle3 --ckpt "$WORK/eagle3.pt" --target "$MODEL" --omit-vocab --out "$ROOT/models/gemma3-eagle3.gguf" \
  --name gemma3-eagle3 --type q4_0
# The committed log keeps every 10th step and the start/done events (the models/ budget).
python3 -c 'import json, sys
for line in open(sys.argv[1]):
    r = json.loads(line)
    if "event" in r or r["step"] % 10 == 0: sys.stdout.write(line)' "$WORK/train_log.jsonl" > "$ROOT/models/gemma3_train_log.jsonl"
