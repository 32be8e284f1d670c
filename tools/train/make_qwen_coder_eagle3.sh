#!/usr/bin/env bash
# The data of an EAGLE-3 head for Qwen2.5-Coder-1.5B-Instruct, distilled on real code, in stages
# that each skip what an earlier run finished (a run killed at any point resumes where it stopped):
#   tools/train/make_qwen_coder_eagle3.sh [WORK_DIR]   (default ~/.cache/specula/train/qwen-coder)
# STOP=corpus|replies|features ends the run after that stage (default: after the training).
# Stages (docs/eagle.md, "EAGLE-3 data for Qwen2.5-Coder": measured costs and the budget):
# 1 corpus    code_corpus.py: real source files of the installed Debian packages and the cached
#             pure-Python wheels (/opt/pypi*/files), licences recorded per package, held out by
#             project -> WORK/corpus: FIM spans and file continuations (teacher-forced: the real
#             text is the reply), chat prompts about real functions (explain, complete, review,
#             test, document), manifest.json and licences.tsv (models/qwen_coder_corpus.* are a
#             copy); skipped when WORK/corpus/manifest.json exists. Seconds.
#             Then WORK/draft-vocab.txt: the VOCAB_N (32768) most frequent tokens of the training
#             files (`specula draft-vocab`), and WORK/coverage.jsonl: the share of each held-out
#             kind's reply tokens it and models/qwen2.5-coder-draft-vocab.txt cover (again after
#             the replies, with the held-out chat replies).
# 2 replies   the target's own chat replies to those prompts (generate_responses.py: specula serve,
#             PARALLEL slots, N tokens): greedy to the first HELDOUT_CHAT held-out prompts, then a set
#             per SETS entry (temperature:seed, prompt i seeded seed + i) to the first LIMIT training
#             prompts in reply order (the categories round-robin). The only stage that decodes.
# 3 features  `specula target-features` (target_features.py --specula) at LAYERS and the final
#             state, top-16 log-probabilities, per CHUNK records: each reply set, the held-out chat
#             replies, the first FIM_LIMIT / CONT_LIMIT training FIM spans / continuations and the
#             first HELDOUT_TF of each held-out kind -> WORK/feats_<set>_<first>_<count>.pt; a
#             chunk whose file exists is skipped, so a larger LIMIT adds chunks only. Prefill only.
# 4 training  train_eagle.py --kind eagle3 on every training features file, the held-out chat
#             replies' file scored every EVAL_EVERY steps, MINUTES of wall clock (cosine over them),
#             the draft vocabulary WORK/draft-vocab.txt, TTT training-time-test steps (as deep as the
#             trees the engine grows), an FFN of FFN units (the target's 8960 would cost a quarter more
#             of every training step and draft level; train_eagle.py --init_grow_ffn widens a head
#             later); a run cut short resumes from WORK/eagle3.pt (train_eagle.py
#             --resume, a larger MINUTES extends it). Then the head exported (Q8_0, export_gguf.py)
#             and its layers requantized to Q4_0, lm_head kept (requantize_gguf.py) ->
#             WORK/qwen2.5-coder-1.5b-eagle3.gguf, for `specula generate --eagle3 FILE`.
# Every step's wall time goes to WORK/times.tsv (stage, file, seconds, load average, and for features
# sequences, tokens and scored tokens).
# Needs: pip install -r tools/train/requirements.txt (torch: the features files); SPECULA (default
# build/bin/specula, scripts/build.sh); the target in the model cache (scripts/fetch_models.sh qwen-coder).
# THREADS (default 2) the threads of every step; run under `nice -n 19` beside other work.
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
WORK="${1:-$HOME/.cache/specula/train/qwen-coder}"
THREADS="${THREADS:-2}"
SPECULA="${SPECULA:-$ROOT/build/bin/specula}"
MODEL="${SPECULA_MODEL_CACHE:-$HOME/.cache/specula/models}/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf"
SETS="${SETS:-0:1 0.7:1000}"
LIMIT="${LIMIT:-300}"
HELDOUT_CHAT="${HELDOUT_CHAT:-100}"
N="${N:-256}"
CTX="${CTX:-1536}"
PARALLEL="${PARALLEL:-4}"
FIM_LIMIT="${FIM_LIMIT:-1000}"
CONT_LIMIT="${CONT_LIMIT:-1000}"
HELDOUT_TF="${HELDOUT_TF:-200}"
CHUNK="${CHUNK:-200}"
VOCAB_N="${VOCAB_N:-32768}"
LAYERS="${LAYERS:-2,14,25}"  # llama.cpp's EAGLE-3 taps of a 28-layer target: 2, n/2, n-3
MINUTES="${MINUTES:-60}"
TTT="${TTT:-5}"
FFN="${FFN:-4096}"
EVAL_EVERY="${EVAL_EVERY:-200}"
STOP="${STOP:-}"
case "$STOP" in ""|corpus|replies|features) ;; *) echo "make_qwen_coder_eagle3.sh: STOP is corpus, replies or features, not '$STOP'" >&2; exit 2 ;; esac
[ -x "$SPECULA" ] || { echo "make_qwen_coder_eagle3.sh: no specula binary at $SPECULA (scripts/build.sh, or SPECULA=)" >&2; exit 2; }
[ -f "$MODEL" ] || { echo "make_qwen_coder_eagle3.sh: $MODEL is missing: scripts/fetch_models.sh qwen-coder" >&2; exit 2; }
mkdir -p "$WORK"
C="$WORK/corpus"
timed() {  # $1 stage, $2 output, then the command; appends its wall time and the load to times.tsv,
  # and for a features file its sequences, tokens and scored (reply) tokens
  local stage="$1" out="$2" t0 counts=""
  shift 2
  t0=$(date +%s)
  "$@"
  case "$out" in *.pt.tmp) counts=$(python3 -c 'import sys, torch
d = torch.load(sys.argv[1], mmap=True)["seqs"]
print(len(d), sum(len(s["ids"]) for s in d), sum(len(s["ids"]) - s["n_prompt"] for s in d), sep="\t")' "$out") ;; esac
  printf '%s\t%s\t%s\t%s\t%s\n' "$stage" "$(basename "${out%.tmp}")" "$(($(date +%s) - t0))" "$(cut -d' ' -f1-3 /proc/loadavg)" "$counts" \
    >>"$WORK/times.tsv"
}

# 1 corpus
if [ ! -f "$C/manifest.json" ]; then
  timed corpus "$C" python3 "$HERE/code_corpus.py" --out "$C.tmp"
  rm -rf "$C" && mv "$C.tmp" "$C"
fi
# the draft vocabulary: the VOCAB_N most frequent tokens of the training split's files (seconds)
if [ ! -f "$WORK/draft-vocab.txt" ]; then
  timed vocab "$WORK/draft-vocab.txt" "$SPECULA" -q draft-vocab -m "$MODEL" -n "$VOCAB_N" -o "$WORK/draft-vocab.txt.tmp" "$C/train_files"
  mv "$WORK/draft-vocab.txt.tmp" "$WORK/draft-vocab.txt"
fi
coverage() {  # each held-out kind's reply tokens the committed list and WORK's cover -> WORK/coverage.jsonl
  local vocab held
  if [ "$WORK/coverage.jsonl" -nt "$WORK/draft-vocab.txt" ] && { [ ! -f "$WORK/heldout_0_1.jsonl" ] || [ "$WORK/coverage.jsonl" -nt "$WORK/heldout_0_1.jsonl" ]; }; then
    return 0
  fi
  : >"$WORK/coverage.jsonl.tmp"
  for vocab in "$ROOT/models/qwen2.5-coder-draft-vocab.txt" "$WORK/draft-vocab.txt"; do
    for held in "$C/fim_heldout.jsonl" "$C/cont_heldout.jsonl"; do
      python3 "$HERE/draft_vocab_coverage.py" --model "$MODEL" --tokenize "$SPECULA" --vocab-file "$vocab" --gen "$held" \
        --frame '{}' --teacher-forced --limit "$HELDOUT_TF" >>"$WORK/coverage.jsonl.tmp"
    done
    if [ -s "$WORK/heldout_0_1.jsonl" ]; then
      python3 "$HERE/draft_vocab_coverage.py" --model "$MODEL" --tokenize "$SPECULA" --vocab-file "$vocab" \
        --gen "$WORK/heldout_0_1.jsonl" --n "$N" >>"$WORK/coverage.jsonl.tmp"
    fi
  done
  mv "$WORK/coverage.jsonl.tmp" "$WORK/coverage.jsonl"
}
[ "$STOP" = corpus ] && { coverage; exit 0; }

# 2 replies
replies() {  # $1 output, then generate_responses.py's selection and sampling arguments
  local out="$1"
  shift
  timed replies "$out" python3 "$HERE/generate_responses.py" --specula "$SPECULA" --model "$MODEL" --prompts "$C/chat_prompts.json" \
    --out "$out" --n "$N" --parallel "$PARALLEL" --ctx "$CTX" --threads "$THREADS" "$@"
}
replies "$WORK/heldout_0_1.jsonl" --temp 0 --seed 1 --split heldout --limit "$HELDOUT_CHAT"
for set in $SETS; do
  replies "$WORK/gen_${set/:/_}.jsonl" --temp "${set%%:*}" --seed "${set##*:}" --split train --limit "$LIMIT"
done
coverage
[ "$STOP" = replies ] && exit 0

# 3 features
features() {  # $1 records file, $2 split, $3 how many of its records (first ones), then target_features.py's framing arguments
  local src="$1" split="$2" limit="$3" stem first last count part out
  shift 3
  stem="$(basename "$src" .jsonl)"
  [ -f "$src" ] || return 0
  for ((first = 0; first < limit; first += CHUNK)); do
    part="$WORK/chunk_${stem}.jsonl"
    last=$((first + (limit - first < CHUNK ? limit - first : CHUNK)))
    sed -n "$((first + 1)),${last}p;${last}q" "$src" >"$part"  # (a head in a pipe would end it with SIGPIPE under pipefail)
    count=$(wc -l <"$part")
    [ "$count" -eq 0 ] && break
    out="$WORK/feats_${stem}_${first}_${count}.pt"
    if [ ! -f "$out" ]; then
      # a shorter chunk at the same start (a smaller LIMIT, or replies still coming then) is superseded
      find "$WORK" -maxdepth 1 -name "feats_${stem}_${first}_*.pt" -delete
      timed features "$out.tmp" python3 "$HERE/target_features.py" --model "$MODEL" --tokenize "$SPECULA" --specula "$SPECULA" \
        --gen "$part" --n "$N" --out "$out.tmp" --threads "$THREADS" --split "$split" --layers "$LAYERS" "$@"
      mv "$out.tmp" "$out"
    fi
    [ "$count" -lt "$CHUNK" ] && break
  done
  rm -f "$WORK/chunk_${stem}.jsonl"
}
for set in $SETS; do features "$WORK/gen_${set/:/_}.jsonl" train "$LIMIT"; done
features "$WORK/heldout_0_1.jsonl" heldout "$HELDOUT_CHAT"
features "$C/fim_train.jsonl" train "$FIM_LIMIT" --frame '{}' --teacher-forced
features "$C/cont_train.jsonl" train "$CONT_LIMIT" --frame '{}' --teacher-forced
features "$C/fim_heldout.jsonl" heldout "$HELDOUT_TF" --frame '{}' --teacher-forced
features "$C/cont_heldout.jsonl" heldout "$HELDOUT_TF" --frame '{}' --teacher-forced
[ "$STOP" = features ] && exit 0

# 4 training
feats=()
for f in "$WORK"/feats_*.pt; do
  case "$(basename "$f")" in feats_heldout_*|feats_fim_heldout_*|feats_cont_heldout_*) ;; *) feats+=(--feats "$f") ;; esac
done
heldout=$(ls "$WORK"/feats_heldout_0_1_0_*.pt | head -1)
resume=()
[ -f "$WORK/eagle3.pt" ] && resume=(--resume "$WORK/eagle3.pt") || resume=(--vocab_file "$WORK/draft-vocab.txt")
bf16=()
if grep -qwE 'amx_bf16|avx512_bf16' /proc/cpuinfo; then bf16=(--bf16); fi
timed training "$WORK/eagle3.pt" python3 "$HERE/train_eagle.py" --kind eagle3 "${feats[@]}" --model "$MODEL" --out "$WORK/eagle3.pt" \
  --name qwen2.5-coder-1.5b-eagle3 --log "$WORK/train_log.jsonl" --minutes "$MINUTES" --threads "$THREADS" --batch 4 --lr 2e-3 \
  --warmup 20 --ttt_steps "$TTT" --ffn "$FFN" --save_every 25 --eval_every "$EVAL_EVERY" --heldout "$heldout" "${resume[@]}" "${bf16[@]}"
python3 "$HERE/export_gguf.py" --kind eagle3 --ckpt "$WORK/eagle3.pt" --target "$MODEL" --out "$WORK/eagle3-q8_0.gguf" \
  --name qwen2.5-coder-1.5b-eagle3 --type q8_0
python3 "$HERE/requantize_gguf.py" --input "$WORK/eagle3-q8_0.gguf" --output "$WORK/qwen2.5-coder-1.5b-eagle3.gguf"
echo "make_qwen_coder_eagle3.sh: the head is $WORK/qwen2.5-coder-1.5b-eagle3.gguf" >&2
