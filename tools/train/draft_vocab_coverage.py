#!/usr/bin/env python3
"""How much of a target's reply text a draft vocabulary covers: the share of reply tokens (as the
target reads them, chat_format.prompt_and_reply) whose ids are in a `specula draft-vocab` file
(e.g. models/qwen2.5-coder-draft-vocab.txt), and, with --train, the share the --sizes most frequent
reply tokens of the training replies cover (the draft vocabulary train_eagle.py --vocab would choose).
Needs no torch.
  draft_vocab_coverage.py --model GGUF --tokenize BIN --vocab-file FILE --gen HELDOUT.jsonl [--frame '{}' --teacher-forced]
      [--train TRAIN.jsonl ... --sizes 8192,16384,32768] [--split heldout] [--limit N]
Prints one JSON line."""
import argparse, collections, json, os, sys
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from chat_format import ChatFormat, prompt_and_reply


def read_draft_vocab(path):
    """The ids of a `specula draft-vocab` file (format: src/tokenizer/draft_vocabulary.cpp)."""
    lines = [l.strip() for l in open(path) if l.strip() and not l.startswith("#")]
    if not lines or not lines[0].startswith("specula-draft-vocab "):
        sys.exit(f"{path} is not a specula draft vocabulary file (specula draft-vocab writes one)")
    count = int(lines[2].split()[1])
    ids = set()
    for run in lines[3:]:
        first, _, last = run.partition("-")
        ids.update(range(int(first), int(last or first) + 1))
    if len(ids) != count:
        sys.exit(f"{path} lists {len(ids)} ids, its header {count}")
    return ids


def reply_counts(a, chat, paths, split):
    counts = collections.Counter()
    n = 0
    for path in paths:
        for line in open(path):
            r = json.loads(line)
            if split and r["split"] != split:
                continue
            if a.limit and n >= a.limit:
                return counts
            n += 1
            counts.update(prompt_and_reply(a.tokenize, a.model, chat, r, a.n, a.teacher_forced)[1])
    return counts


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--tokenize", required=True, help="llama-tokenize, or specula (its serve's /tokenize)")
    ap.add_argument("--vocab-file", required=True)
    ap.add_argument("--gen", action="append", required=True, help="held-out replies (repeatable)")
    ap.add_argument("--split", default="heldout", help="only --gen records of this split ('' for all)")
    ap.add_argument("--train", action="append", default=[], help="training replies: the --sizes most frequent of their tokens")
    ap.add_argument("--sizes", default="4096,8192,16384,32768")
    ap.add_argument("--frame", default=None)
    ap.add_argument("--teacher-forced", action="store_true")
    ap.add_argument("--n", type=int, default=256, help="the reply budget of the replies")
    ap.add_argument("--limit", type=int, default=0, help="at most this many records of each side")
    a = ap.parse_args()
    chat = ChatFormat(a.model, a.frame)
    vocab = read_draft_vocab(a.vocab_file)
    held = reply_counts(a, chat, a.gen, a.split)
    total = sum(held.values())
    out = {"gen": a.gen, "reply_tokens": total, "distinct": len(held), "vocab_file": os.path.basename(a.vocab_file),
           "vocab_file_ids": len(vocab), "vocab_file_coverage": round(sum(c for t, c in held.items() if t in vocab) / max(1, total), 5)}
    if a.train:
        train = reply_counts(a, chat, a.train, "train")
        ranked = [t for t, _ in sorted(train.items(), key=lambda tc: (-tc[1], tc[0]))]
        out["train_reply_tokens"] = sum(train.values())
        out["top_k_of_train_coverage"] = {k: round(sum(held[t] for t in ranked[:k]) / max(1, total), 5)
                                          for k in map(int, a.sizes.split(","))}
    print(json.dumps(out))


if __name__ == "__main__":
    main()
