#!/usr/bin/env bash
# Train the drafters for SmolLM2-135M-Instruct (the default target) from its own replies.
#   tools/train/make_smollm2_drafters.sh [WORK_DIR] [TRAIN_MINUTES]   (default /tmp/smollm2_train, 40)
# Needs: pip install -r tools/train/requirements.txt; build/bin/specula and llama-tokenize
# (scripts/build.sh); the target in the model cache (scripts/fetch_models.sh).
# Outputs: models/smollm2-eagle3.gguf, models/smollm2_train_log.jsonl.
# The shipped head is what these steps produce (session 11: about 80 minutes on a 2-core Intel
# Xeon with AMX, 40 of them training; see models/README.md).
# Steps: prompts (committed: models/smollm2_prompts.json) -> the target's chat replies, six sets
# (specula serve, 4 slots; greedy, and sampled at T = 0.6, 0.8 (two seeds), 1.0 (two seeds))
# -> target features and top-16 distributions (torch, two processes) -> EAGLE-3 head (wall-clock
# budget, checkpoints as it goes; bf16 matmuls where the CPU has AMX or AVX-512 BF16)
# -> GGUF with the target's tokenizer.
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
WORK="${1:-/tmp/smollm2_train}"
MINUTES="${2:-40}"
MODEL="${SPECULA_MODEL_CACHE:-$HOME/.cache/specula/models}/SmolLM2-135M-Instruct.Q4_1.gguf"
BIN="$ROOT/build/bin"
TOKENIZE="$BIN/llama-tokenize"  # llama.cpp's, from the pinned source scripts/build.sh fetched
cmake --build "$ROOT/build" --target llama-tokenize >/dev/null
mkdir -p "$WORK"
SETS="0:1 0.8:1000 1.0:2000 0.8:3000 1.0:4000 0.6:5000"  # temperature:seed of each reply set (prompt i uses seed + i)
for set in $SETS; do
  python3 "$HERE/generate_responses.py" --specula "$BIN/specula" --model "$MODEL" --prompts "$ROOT/models/smollm2_prompts.json" \
    --out "$WORK/gen_${set/:/_}.jsonl" --n 192 --temp "${set%%:*}" --seed "${set##*:}" --split train --parallel 4 --threads 2
done
python3 "$HERE/smollm2_data.py" --model "$MODEL" --tokenize "$TOKENIZE" --gen "$WORK/gen_0_1.jsonl" --limit 10
features() {  # one process per half of the sets, a thread each
  for set in "$@"; do
    python3 "$HERE/smollm2_features.py" --model "$MODEL" --tokenize "$TOKENIZE" --gen "$WORK/gen_${set/:/_}.jsonl" --n 192 \
      --out "$WORK/feats_${set/:/_}.pt" --threads 1 --split train
  done
}
read -ra all <<<"$SETS"
features "${all[@]:0:3}" &
features "${all[@]:3}"
wait
feats=()
for set in $SETS; do feats+=(--feats "$WORK/feats_${set/:/_}.pt"); done
bf16=()
if grep -qwE 'amx_bf16|avx512_bf16' /proc/cpuinfo; then bf16=(--bf16); fi
python3 "$HERE/train_eagle3_smollm2.py" "${feats[@]}" --model "$MODEL" --out "$WORK/eagle3.pt" \
  --log "$WORK/train_log.jsonl" --minutes "$MINUTES" --threads 2 --vocab 4096 --batch 4 --lr 2e-3 --warmup 20 --save_every 50 "${bf16[@]}"
python3 "$HERE/export_gguf.py" --kind eagle3 --ckpt "$WORK/eagle3.pt" --target "$MODEL" --out "$ROOT/models/smollm2-eagle3.gguf" --name smollm2-eagle3 --type q8_0
cp "$WORK/train_log.jsonl" "$ROOT/models/smollm2_train_log.jsonl"
