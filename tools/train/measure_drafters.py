#!/usr/bin/env python3
"""Engine-side acceptance of a real target's drafter on the held-out prompts, by category: runs
`specula generate --chat` (a prompt with an earlier conversation, ShareGPT's later turns: the whole
conversation, --messages) or, with --frame, a completion of the framed prompt (single-turn prompts
only: a frame takes one question) per prompt and mode (chain of --chain tokens, dynamic tree of
--nodes nodes; T=0 and T=1) and aggregates its end-of-run statistics. At T=0 in chain mode the
per-position acceptance is the drafter's per-depth greedy agreement with the target (given the
drafts before it were accepted).
  measure_drafters.py --specula BIN --model GGUF --prompts P.json --drafter-args "--eagle3 H.gguf" --out R.json"""
import argparse, json, os, re, shlex, subprocess, sys, tempfile
from collections import defaultdict
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from chat_format import messages

ap = argparse.ArgumentParser()
ap.add_argument("--specula", required=True)
ap.add_argument("--model", required=True)
ap.add_argument("--prompts", required=True)
ap.add_argument("--drafter-args", required=True)
ap.add_argument("--out", required=True)
ap.add_argument("--per-category", type=int, default=2)
ap.add_argument("--n", type=int, default=64)
ap.add_argument("--chain", type=int, default=4)
ap.add_argument("--nodes", type=int, default=16)
ap.add_argument("--modes", default="chain,dynamic", help="which of the modes to run (comma-separated)")
ap.add_argument("--frame", default=None, help="a pretrained target's completion frame (generate_responses.py --frame)")
a = ap.parse_args()

prompts = [p for p in json.load(open(a.prompts))["prompts"] if p["split"] == "heldout"]
if a.frame:
    conversations = sum(1 for p in prompts if p.get("context"))
    prompts = [p for p in prompts if not p.get("context")]
    if conversations:
        print(f"measure_drafters: --frame: {conversations} held-out prompts with an earlier conversation left out", file=sys.stderr)
chosen = defaultdict(list)
for p in prompts:
    if len(chosen[p["category"]]) < a.per_category:
        chosen[p["category"]].append(p)
scratch = tempfile.TemporaryDirectory(prefix="measure-drafters-")


def prompt_args(i, p):
    """The prompt's flags: the framed text, the chat message, or the conversation's messages file."""
    if a.frame:
        return ["-p", a.frame.format(p["prompt"])]
    if not p.get("context"):
        return ["--chat", "-p", p["prompt"]]
    path = f"{scratch.name}/{p['category']}-{i}.json"
    with open(path, "w") as f:
        json.dump(messages(p), f)
    return ["--messages", path]
modes = {"chain": ["--tree", "chain", "--draft-policy", "fixed", "--draft-max", str(a.chain)],
         "dynamic": ["--tree", "dynamic", "--tree-nodes", str(a.nodes)]}
wanted = a.modes.split(",")
unknown = set(wanted) - set(modes)
if unknown:
    ap.error(f"--modes: unknown mode(s) {', '.join(sorted(unknown))} (chain, dynamic)")
modes = {m: margs for m, margs in modes.items() if m in wanted}
SUMMARY = re.compile(r"drafted (\d+), accepted (\d+) .*?mean accepted length ([\d.]+) tokens/forward over (\d+) rounds(?:; per-position acceptance:(.*))?")
res = {}
for mode, margs in modes.items():
    for temp in (0.0, 1.0):
        for cat, ps in chosen.items():
            agg = {"drafted": 0, "accepted": 0, "rounds": 0, "tokens_x_rounds": 0.0, "per_position": defaultdict(list)}
            for i, p in enumerate(ps):
                cmd = [a.specula, "generate", "-m", a.model, *prompt_args(i, p), "-n", str(a.n), "-t", "1", "--temp", str(temp),
                       "--seed", str(i + 1)] + shlex.split(a.drafter_args) + margs
                # a reply cut at -n tokens may end inside a UTF-8 character: the output is bytes, not text
                err = subprocess.run(cmd, capture_output=True, check=True).stderr.decode("utf-8", errors="replace")
                m = SUMMARY.search(err)
                d, acc, mal, rounds = int(m[1]), int(m[2]), float(m[3]), int(m[4])
                agg["drafted"] += d; agg["accepted"] += acc; agg["rounds"] += rounds; agg["tokens_x_rounds"] += mal * rounds
                for kv in (m[5] or "").split():
                    k, v = kv.split(":")
                    agg["per_position"][int(k)].append(float(v))
            key = f"{mode} T={temp:g} {cat}"
            res[key] = {"prompts": len(ps), "with_conversation": sum(1 for p in ps if p.get("context")), "rounds": agg["rounds"], "tokens_per_forward": round(agg["tokens_x_rounds"] / agg["rounds"], 3),
                        "acceptance_rate": round(agg["accepted"] / max(1, agg["drafted"]), 3),
                        "per_position_acceptance": {k: round(sum(v) / len(v), 3) for k, v in sorted(agg["per_position"].items())}}
            print(key, res[key], flush=True)
json.dump({"drafter": a.drafter_args, "frame": a.frame, "n_predict": a.n, "chain": a.chain, "tree_nodes": a.nodes, "results": res}, open(a.out, "w"), indent=1)
