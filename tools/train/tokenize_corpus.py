#!/usr/bin/env python3
"""Tokenize train / held-out splits into uint16 token streams.
Each file becomes [BOS] + sp.encode(text) + [EOS]; files concatenated in path order.
Writes train.bin, heldout.bin and tokenized.json (counts, SHA-256 of the .bin files)."""
import argparse, hashlib, json, os
import numpy as np
import sentencepiece as spm

ap = argparse.ArgumentParser()
ap.add_argument("--work", required=True)
a = ap.parse_args()
sp = spm.SentencePieceProcessor(model_file=os.path.join(a.work, "specula_tok.model"))
info = {}
for split in ("train", "heldout"):
    recs = [json.loads(l) for l in open(os.path.join(a.work, f"files_{split}.jsonl"))]
    parts, kinds = [], {"code": 0, "prose": 0}
    nbytes = 0
    for r in recs:
        txt = open(r["path"], encoding="utf-8").read()
        ids = [sp.bos_id()] + sp.encode(txt) + [sp.eos_id()]
        parts.append(np.asarray(ids, dtype=np.uint16))
        kinds[r["kind"]] += len(ids)
        nbytes += len(txt.encode())
    arr = np.concatenate(parts)
    path = os.path.join(a.work, f"{split}.bin")
    arr.tofile(path)
    sha = hashlib.sha256(open(path, "rb").read()).hexdigest()
    info[split] = {"files": len(recs), "bytes": nbytes, "tokens": int(arr.size), "tokens_by_kind": kinds,
                   "bytes_per_token": nbytes / arr.size, "sha256_uint16le": sha}
    print(split, info[split])
json.dump(info, open(os.path.join(a.work, "tokenized.json"), "w"), indent=1)
