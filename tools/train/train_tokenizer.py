#!/usr/bin/env python3
"""Train the specula SentencePiece BPE tokenizer (8192 vocab) on the train split.

Files are fed as multi-line chunks (<= 4000 bytes, cut at line boundaries) through
sentence_iterator so that '\n' is an ordinary character the BPE can merge
(e.g. ':\n', '\n\n'); runs of spaces (indentation) can form whitespace-only
pieces. Identity normalization + remove_extra_whitespaces=False keep the text
byte-exact; byte_fallback covers anything else.
"""
import argparse, hashlib, json, os, sys
import sentencepiece as spm

ap = argparse.ArgumentParser()
ap.add_argument("--work", required=True)
ap.add_argument("--vocab", type=int, default=8192)
ap.add_argument("--sample_pct", type=int, default=50, help="deterministic %% of chunks used for tokenizer training")
a = ap.parse_args()

def chunks():
    with open(os.path.join(a.work, "files_train.jsonl")) as f:
        recs = [json.loads(l) for l in f]
    for r in recs:
        txt = open(r["path"], encoding="utf-8").read()
        cur, n = [], 0
        for line in txt.splitlines(keepends=True):
            b = len(line.encode())
            if b > 3900:
                continue
            if n + b > 3900 and cur:
                yield "".join(cur)
                cur, n = [], 0
            cur.append(line); n += b
        if cur:
            yield "".join(cur)

def sampled():
    for c in chunks():
        if int(hashlib.sha256(c.encode()).hexdigest()[:8], 16) % 100 < a.sample_pct:
            yield c

spm.SentencePieceTrainer.train(
    sentence_iterator=sampled(),
    model_prefix=os.path.join(a.work, "specula_tok"),
    model_type="bpe",
    vocab_size=a.vocab,
    character_coverage=1.0,
    byte_fallback=True,
    split_digits=True,
    split_by_whitespace=True,
    allow_whitespace_only_pieces=True,
    remove_extra_whitespaces=False,
    add_dummy_prefix=True,
    normalization_rule_name="identity",
    max_sentence_length=4096,
    input_sentence_size=0,
    shuffle_input_sentence=False,
    unk_id=0, bos_id=1, eos_id=2, pad_id=-1,
    num_threads=1,
    seed_sentencepiece_size=1000000,
    train_extremely_large_corpus=False,
    minloglevel=1,
)
sp = spm.SentencePieceProcessor(model_file=os.path.join(a.work, "specula_tok.model"))
test = "def f(x):\n    if x:\n\treturn  x + 12345\n\n\nclass A:\n        pass\n"
ids = sp.encode(test)
assert sp.decode(ids) == test, (sp.decode(ids), test)
print("roundtrip ok", len(ids), [sp.id_to_piece(i) for i in ids])
