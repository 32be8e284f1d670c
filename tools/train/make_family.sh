#!/usr/bin/env bash
# Reproduce the whole specula model family from scratch on CPU (1 torch thread).
#   tools/train/make_family.sh [WORK_DIR]      (default WORK_DIR=/tmp/specula_train)
# Needs (Debian 12): python3-torch python3-sentencepiece python3-numpy libopenblas0-pthread
#   libpython3.11-stdlib libpython3.11-testsuite python3.11-doc, and llama.cpp's gguf-py
#   (GGUF_PY, default /work/main/.deps/llama.cpp/gguf-py, else /tmp/deps/llama.cpp/gguf-py).
# Outputs: models/specula-{target,draft,eagle3,eagle1}.gguf, models/specula_tok.model,
#   models/train_log.jsonl, models/eval.json, models/corpus.json.
# Wall clock on a shared 2-core Xeon (AMX): ~50 min target, ~10 min draft, ~15 min EAGLE-3,
#   ~8 min EAGLE-1, ~8 min eval. Seeds and step counts are fixed (bf16 autocast and BLAS
#   summation order can still make the last bits differ between machines).
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
WORK="${1:-/tmp/specula_train}"
MODELS="$ROOT/models"
PY=/usr/bin/python3
export OPENBLAS_CORETYPE=SkylakeX OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
GGUF_PY="${GGUF_PY:-}"
if [ -z "$GGUF_PY" ]; then
  for p in "$ROOT/.deps/llama.cpp/gguf-py" /tmp/deps/llama.cpp/gguf-py; do [ -d "$p" ] && GGUF_PY="$p" && break; done
fi
mkdir -p "$WORK" "$MODELS"
LOG="$WORK/train_log.jsonl"; : > "$LOG"

# 1. corpus (files + held-out split by file) and tokenizer
$PY "$HERE/prepare_corpus.py" --out "$WORK"
$PY "$HERE/train_tokenizer.py" --work "$WORK" --vocab 8192 --sample_pct 50
$PY "$HERE/tokenize_corpus.py" --work "$WORK"

# 2. target (15.7M) and draft (1.4M) language models
$PY "$HERE/train_lm.py" --work "$WORK" --name target --steps 1250 --batch 4 --seq 512 --lr 1.5e-3 --warmup 50 --seed 1234 --eval_every 250 --log "$LOG" --bf16
$PY "$HERE/train_lm.py" --work "$WORK" --name draft  --steps 450  --batch 8 --seq 512 --lr 3e-3   --warmup 30 --seed 1235 --eval_every 150 --log "$LOG" --bf16

# 3. EAGLE heads on the frozen target
$PY "$HERE/train_eagle.py" --work "$WORK" --kind eagle3 --steps 160 --batch 4 --seq 512 --lr 1.5e-3 --warmup 15 --ttt_steps 3 --target_layers 1,3,5 --seed 4321 --eval_every 40 --log "$LOG" --bf16
$PY "$HERE/train_eagle.py" --work "$WORK" --kind eagle1 --steps 220 --batch 4 --seq 512 --lr 1.5e-3 --warmup 15 --ttt_steps 1 --seed 4322 --eval_every 55 --log "$LOG" --bf16

# 4. GGUF export
TOK="$WORK/specula_tok.model"
$PY "$HERE/export_gguf.py" --gguf_py "$GGUF_PY" --kind llama  --ckpt "$WORK/target.pt" --tokenizer "$TOK" --out "$MODELS/specula-target.gguf" --name specula-target
$PY "$HERE/export_gguf.py" --gguf_py "$GGUF_PY" --kind llama  --ckpt "$WORK/draft.pt"  --tokenizer "$TOK" --out "$MODELS/specula-draft.gguf"  --name specula-draft
$PY "$HERE/export_gguf.py" --gguf_py "$GGUF_PY" --kind eagle3 --ckpt "$WORK/eagle3.pt" --tokenizer "$TOK" --out "$MODELS/specula-eagle3.gguf" --name specula-eagle3
$PY "$HERE/export_gguf.py" --gguf_py "$GGUF_PY" --kind eagle1 --ckpt "$WORK/eagle1.pt" --tokenizer "$TOK" --out "$MODELS/specula-eagle1.gguf" --name specula-eagle1
$PY "$HERE/check_gguf.py" --gguf_py "$GGUF_PY" --work "$WORK" --models "$MODELS"

# 5. held-out evaluation + logs for the model card
$PY "$HERE/evaluate.py" --work "$WORK" --out "$MODELS/eval.json"
cp "$LOG" "$MODELS/train_log.jsonl"
cp "$TOK" "$MODELS/specula_tok.model"
$PY - "$WORK" "$MODELS/corpus.json" <<'PYEOF'
import json, sys
w, out = sys.argv[1], sys.argv[2]
meta = json.load(open(f"{w}/corpus_meta.json")); meta["tokenized"] = json.load(open(f"{w}/tokenized.json"))
json.dump(meta, open(out, "w"), indent=1)
PYEOF
# 6. llama.cpp-side checks (tokenizer, greedy equality, speculative runs) if the binaries exist
if [ -x "$ROOT/build/bin/llama-tokenize" ]; then
  $PY "$HERE/verify_llamacpp.py" --bin "$ROOT/build/bin" --models "$MODELS" --work "$WORK" --out "$MODELS/llamacpp_verify.json" --n 40
fi
echo "done: $(ls -la "$MODELS")"
