#!/usr/bin/env python3
"""How early could SmolLM2 exit? The measured input of SpecEE's bound (docs/specee.md).

For the target's own greedy replies to held-out prompts (generate_responses.py --split heldout),
runs the target (torch, from the GGUF) and reads every layer's residual stream through the final
norm and the full LM head ("logit lens"). Per reply token it records:
  first  = the first layer whose argmax is the final token (a perfect predictor could exit there
           and the exit would be confirmed: the best case of the lossless mode);
  stable = the first layer from which every later layer's argmax is the final token (the best a
           lossy exit could do without changing the text).
It prints their distributions by category and the speedup bounds with a perfect, free predictor,
from docs/specee.md's cost model (layers 0.79, LM head 0.21 of a plain token): lossless = exit at
`first`, the deferred layers of 2 tokens verified together at c(2) times one row; lossy = exit at
`stable` with the full-LM-head probe, nothing deferred.
  specee_exit_bound.py --model GGUF --tokenize llama-tokenize --gen heldout_T0.jsonl [--per-category 6]
"""
import argparse, collections, json, os, sys
import torch
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gguf_target import load_gguf_target
from chat_format import ChatFormat, tokenize

ap = argparse.ArgumentParser()
ap.add_argument("--model", required=True)
ap.add_argument("--tokenize", required=True)
ap.add_argument("--gen", required=True)
ap.add_argument("--per-category", type=int, default=6)
ap.add_argument("--threads", type=int, default=2)
ap.add_argument("--layer-share", type=float, default=0.79, help="the layers' share of a plain token's cost (docs/specee.md)")
ap.add_argument("--verify-2", type=float, default=1.03, help="cost of a 2-row forward relative to 1 row")
ap.add_argument("--json", default=None)
ap.add_argument("--frame", default=None, help="the completion frame the replies were generated with (generate_responses.py --frame)")
a = ap.parse_args()
torch.set_num_threads(a.threads)
m = load_gguf_target(a.model)
chat = ChatFormat(a.model, a.frame)
L = m.c.n_layers
taken = collections.Counter()
first_by_cat, stable_by_cat = collections.defaultdict(list), collections.defaultdict(list)
for line in open(a.gen):
    r = json.loads(line)
    if taken[r["category"]] >= a.per_category:
        continue
    taken[r["category"]] += 1
    prompt = tokenize(a.tokenize, a.model, chat.text(r["prompt"], r.get("context", ())))
    reply = tokenize(a.tokenize, a.model, chat.text(r["prompt"], r.get("context", ())) + r["response"])[len(prompt):]
    ids = torch.tensor(prompt + reply)
    with torch.no_grad():
        logits, _, caps = m(ids[None], capture_layers=set(range(1, L)))
        rows = slice(len(prompt) - 1, len(ids) - 1)  # positions that predict the reply's tokens
        final = logits[0, rows].argmax(-1)
        match = torch.stack([m.lm_head(m.norm(caps[l][0, rows])).argmax(-1) == final for l in range(1, L)]
                            + [torch.ones_like(final, dtype=torch.bool)])  # [L, tokens]; layer L = the output
    for t in range(match.shape[1]):
        col = match[:, t].tolist()
        first = 1 + col.index(True)
        stable = L
        while stable > 1 and col[stable - 2]:
            stable -= 1
        first_by_cat[r["category"]].append(first)
        stable_by_cat[r["category"]].append(stable)
    print(f"{r['category']:15s} {len(reply):4d} tokens", flush=True)


def summary(xs):
    xs = sorted(xs)
    q = lambda f: xs[min(len(xs) - 1, int(f * len(xs)))]
    return {"tokens": len(xs), "mean": sum(xs) / len(xs), "p25": q(0.25), "median": q(0.5), "p75": q(0.75),
            "at_most_half": sum(x <= L // 2 for x in xs) / len(xs)}


def lossless_cost(exits):
    # Every token exits at its layer E (e = E / L), the probe is free, and its deferred layers run
    # beside the next token's in a 2-row forward: 0.79 e + (0.79 (1 - e) + 0.21) c(2) / 2.
    # A token no earlier layer agrees on does not exit: it costs a plain token.
    s = a.layer_share
    return sum(1.0 if E == L else s * (E / L) + (s * (1 - E / L) + (1 - s)) * a.verify_2 / 2 for E in exits) / len(exits)


def lossy_cost(exits):
    # The paper's exit at layer E emits the token: layers up to E plus the full LM head (the
    # probe that confirms the candidate), no deferred layers: 0.79 e + 0.21.
    s = a.layer_share
    return sum(s * (E / L) + (1 - s) for E in exits) / len(exits)


out = {"model": os.path.basename(a.model), "n_layers": L, "by_category": {}}
print(f"\nexit layer (1..{L}; {L} = no earlier layer agrees) per reply token, greedy held-out replies")
print(f"{'category':15s} {'tokens':>6s}  {'first: mean/median':>18s} {'<=L/2':>6s}  {'stable: mean/median':>19s} {'<=L/2':>6s}  lossless / lossy bound")
cats = sorted(first_by_cat) + ["all"]
for cat in cats:
    f = sum(first_by_cat.values(), []) if cat == "all" else first_by_cat[cat]
    st = sum(stable_by_cat.values(), []) if cat == "all" else stable_by_cat[cat]
    sf, ss = summary(f), summary(st)
    cost, lossy = lossless_cost(f), lossy_cost(st)
    out["by_category"][cat] = {"first": sf, "stable": ss, "lossless_cost_per_token": cost, "lossless_speedup_bound": 1 / cost,
                               "lossy_cost_per_token": lossy, "lossy_speedup_bound": 1 / lossy}
    print(f"{cat:15s} {sf['tokens']:6d}  {sf['mean']:9.1f} / {sf['median']:<6d} {sf['at_most_half']:6.2f}  {ss['mean']:10.1f} / {ss['median']:<6d} "
          f"{ss['at_most_half']:6.2f}  {1 / cost:.2f}x / {1 / lossy:.2f}x")
if a.json:
    json.dump(out, open(a.json, "w"), indent=1)
