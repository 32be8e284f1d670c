#!/usr/bin/env python3
"""Render the model-card tables (markdown) from eval.json, train_log.jsonl, corpus.json."""
import json, sys
ev = json.load(open(sys.argv[1]))
log = [json.loads(l) for l in open(sys.argv[2])]
out = []
t = ev.get("target_heldout")
if t:
    out.append("| held-out tokens | loss (nats/token) | perplexity | top-1 acc | bits/byte |\n|---|---|---|---|---|")
    out.append(f"| {t['tokens']} | {t['loss_nats']:.3f} | {t['perplexity']:.2f} | {100*t['top1_acc']:.1f}% | {t['bits_per_byte']:.3f} |")
d = ev["drafters"]
names = [n for n in ("draft", "eagle1", "eagle3") if n in d]
out.append(f"\nGreedy (temp 0), {d['base_positions']} held-out base positions ({d['windows']} windows x {d['win_len']} tokens):\n")
out.append("| drafter | " + " | ".join(f"agree@{j+1}" for j in range(d["depth"])) + " | " + " | ".join(f"accept≤{j+1}" for j in range(d["depth"])) + " | E[accepted of 5] |")
out.append("|---" * (2 * d["depth"] + 2) + "|")
for n in names:
    g = d[n]["greedy"]
    out.append(f"| {n} | " + " | ".join(f"{100*v:.1f}%" for v in g["agree_by_depth"]) + " | " + " | ".join(f"{100*v:.1f}%" for v in g["accept_cum_by_depth"]) + f" | {g['expected_accepted_of_5']:.2f} |")
out.append(f"\nTemperature 1 (alpha = E[sum_v min(p,q)] on the drafter's own sampled path):\n")
out.append("| drafter | " + " | ".join(f"alpha@{j+1}" for j in range(d["depth"])) + " | " + " | ".join(f"accept≤{j+1}" for j in range(d["depth"])) + " | E[accepted of 5] |")
out.append("|---" * (2 * d["depth"] + 2) + "|")
for n in names:
    g = d[n]["temp1"]
    out.append(f"| {n} | " + " | ".join(f"{100*v:.1f}%" for v in g["alpha_by_depth"]) + " | " + " | ".join(f"{100*v:.1f}%" for v in g["accept_cum_by_depth"]) + f" | {g['expected_accepted_of_5']:.2f} |")
c = ev["cost_relative_to_target"]
out.append(f"\n| drafter | measured time / target forward | MACs/token | MACs ratio |\n|---|---|---|---|")
for n in names:
    out.append(f"| {n} | {c[n]:.3f} | {c['macs_per_token'][n]/1e6:.2f}M | {c['macs_ratio_to_target'][n]:.3f} |")
out.append(f"| target | 1 ({c['target_ms_per_token']:.2f} ms/token) | {c['macs_per_token']['target']/1e6:.2f}M | 1 |")
out.append("\nTraining curves (held-out loss at eval points):\n")
out.append("| model | step | tokens seen | train loss | held-out loss | elapsed s |\n|---|---|---|---|---|---|")
for r in log:
    if "heldout_loss" in r:
        extra = f" (top-1 agree by TTT step {r['heldout_top1_agree_by_step']})" if "heldout_top1_agree_by_step" in r else ""
        out.append(f"| {r['model']} | {r['step']} | {r['tokens']} | {r['loss']} | {r['heldout_loss']}{extra} | {r['elapsed_s']} |")
out.append("\nGreedy samples (PyTorch fp32, target):\n")
import sentencepiece as spm
sp = spm.SentencePieceProcessor(model_file=sys.argv[3]) if len(sys.argv) > 3 else None
for s in ev.get("greedy_samples", []):
    cont = sp.decode(s["prompt_tokens"][1:] + s["continuation_tokens"])[len(s["prompt"]):] if sp else s["continuation"]
    out.append("```text\n" + s["prompt"] + "⟦" + cont + "⟧\n```")
print("\n".join(out))
