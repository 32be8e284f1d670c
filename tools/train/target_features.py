#!/usr/bin/env python3
"""Target-side training data for drafters of a real target: token sequences (chat prompt + the
target's own reply) with the target's layer features and top-k next-token distribution.
  target_features.py --model GGUF --tokenize BIN --gen gen_T0.jsonl [--gen more.jsonl] --out feats.pt
Features are the inputs of --layers (llama.cpp `layer_inp` semantics, as the engine's taps)
plus the final pre-norm hidden state, stored bf16; labels are the target's top-k
log-probabilities (fp16). Training uses split == "train" (--split train stores only those)."""
import argparse, json, os, sys, time
import torch
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from model import load_gguf_target
from chat_data import ChatFormat, tokenize

ap = argparse.ArgumentParser()
ap.add_argument("--model", required=True)
ap.add_argument("--tokenize", required=True)
ap.add_argument("--gen", action="append", required=True)
ap.add_argument("--out", required=True)
ap.add_argument("--layers", default="2,15,27")
ap.add_argument("--topk", type=int, default=16)
ap.add_argument("--n", type=int, default=128, help="the reply budget the replies were generated with")
ap.add_argument("--threads", type=int, default=1)
ap.add_argument("--split", default=None, help="only replies of this split (train / heldout)")
ap.add_argument("--frame", default=None, help="the completion frame the replies were generated with (generate_responses.py --frame)")
a = ap.parse_args()
torch.set_num_threads(a.threads)
m = load_gguf_target(a.model)
chat = ChatFormat(a.model, a.frame)
layers = [int(x) for x in a.layers.split(",")]
seqs = []
t0 = time.time()
for path in a.gen:
    for line in open(path):
        r = json.loads(line)
        if a.split and r["split"] != a.split:
            continue
        prompt = tokenize(a.tokenize, a.model, chat.text(r["prompt"]))
        reply = tokenize(a.tokenize, a.model, chat.text(r["prompt"]) + r["response"])[len(prompt):]
        if len(reply) < a.n - 4:  # the reply ended at the end-of-turn token, which the text does not show
            reply.append(chat.end_id)
        ids = torch.tensor(prompt + reply)
        with torch.no_grad():  # fp32: bf16 autocast is emulated (slow) on CPUs without AVX-512/AMX
            logits, hfin, caps = m(ids[None], capture_layers=set(layers))
        logp = torch.log_softmax(logits[0].float(), -1)
        top = logp.topk(a.topk, -1)
        seqs.append({"index": r["index"], "category": r["category"], "split": r["split"], "temp": r.get("temp", 0.0),
                     "ids": ids, "n_prompt": len(prompt),
                     "feat": torch.cat([caps[l][0] for l in layers], -1).to(torch.bfloat16),
                     "hfin": hfin[0].to(torch.bfloat16),
                     "top_ids": top.indices.to(torch.int32), "top_logp": top.values.to(torch.float16)})
        if len(seqs) % 5 == 0:  # saved as it goes: a run cut short still yields training data
            torch.save({"layers": layers, "config": m.c.__dict__, "seqs": seqs}, a.out)
            print(f"{len(seqs)} sequences, {sum(len(s['ids']) for s in seqs)} tokens, {time.time() - t0:.0f}s", flush=True)
torch.save({"layers": layers, "config": m.c.__dict__, "seqs": seqs}, a.out)
print("wrote", a.out, len(seqs), "sequences", sum(len(s["ids"]) for s in seqs), "tokens", f"{time.time() - t0:.0f}s")
