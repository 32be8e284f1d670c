#!/usr/bin/env python3
"""Target-side training data for drafters of a real target: token sequences (chat prompt + the
target's own reply) with the target's layer features and top-k next-token distribution.
  target_features.py --model GGUF --tokenize BIN --gen gen_T0.jsonl [--gen more.jsonl] --out feats.pt [--specula BIN]
Features are the inputs of --layers (llama.cpp `layer_inp` semantics, as the engine's taps)
plus the final pre-norm hidden state, stored bf16; labels are the target's top-k
log-probabilities (fp16). Training uses split == "train" (--split train stores only those).
With --specula, `specula target-features` computes them with the engine's own kernels (the
features a head is fed when it drafts, and several times faster than the fp32 torch port; the only
way for a qwen2 target). --teacher-forced: the responses are given text (code_corpus.py's FIM
middles and file continuations, not the target's replies), whole: no end-of-turn token is added
(a FIM middle spells its own <|endoftext|>)."""
import argparse, json, os, subprocess, sys, tempfile, time
import numpy as np
import torch
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gguf_target import load_gguf_target, target_config
from chat_format import ChatFormat, prompt_and_reply

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
ap.add_argument("--specula", default=None, help="specula binary: the features from its target-features command, not the torch port")
ap.add_argument("--teacher-forced", action="store_true",
                help="the responses are whole given texts (code_corpus.py's): no end-of-turn token added after them")
a = ap.parse_args()
torch.set_num_threads(a.threads)
m = None if a.specula else load_gguf_target(a.model)
config = target_config(a.model) if a.specula else m.c
chat = ChatFormat(a.model, a.frame)
layers = [int(x) for x in a.layers.split(",")]


def specula_features(ids_list, out_dir):
    """(taps [n, (layers + 1) * n_embd] bf16, top ids, top log-probs) per sequence, from specula."""
    ids_path, bin_path = os.path.join(out_dir, "ids.jsonl"), os.path.join(out_dir, "feats.bin")
    with open(ids_path, "w") as f:
        for ids in ids_list:
            f.write(json.dumps({"ids": ids}) + "\n")
    ctx = max(len(ids) for ids in ids_list)
    subprocess.run([a.specula, "-q", "target-features", "-m", a.model, "--tokens", ids_path, "-o", bin_path, "-t", str(a.threads),
                    "-c", str(ctx), "--top-k", str(a.topk), "--layers", ",".join(map(str, layers + [config.n_layers]))], check=True)
    raw = np.fromfile(bin_path, dtype=np.uint8)
    if raw[:8].tobytes() != b"SPFEAT01":
        sys.exit(f"target_features: {bin_path} is not a specula target-features file")
    n_taps, n_embd, k = (int(v) for v in np.frombuffer(raw[8:20].tobytes(), dtype=np.int32))  # Python ints: offsets pass 2 GiB
    off, out = 20, []
    for _ in ids_list:
        n = int(np.frombuffer(raw[off:off + 4].tobytes(), dtype=np.int32)[0])
        off += 4
        w = n * n_taps * n_embd
        taps = torch.from_numpy(raw[off:off + 2 * w].view(np.int16).copy()).view(torch.bfloat16).view(n, n_taps * n_embd)
        off += 2 * w
        top_ids = torch.from_numpy(raw[off:off + 4 * n * k].view(np.int32).copy()).view(n, k)
        off += 4 * n * k
        top_logp = torch.from_numpy(raw[off:off + 4 * n * k].view(np.float32).copy()).view(n, k)
        off += 4 * n * k
        out.append((taps, top_ids, top_logp))
    if off != len(raw):
        sys.exit(f"target_features: {bin_path} has {len(raw) - off} bytes after its {len(ids_list)} sequences")
    return out


records = []
for path in a.gen:
    for line in open(path):
        r = json.loads(line)
        if a.split and r["split"] != a.split:
            continue
        records.append((r, *prompt_and_reply(a.tokenize, a.model, chat, r, a.n, a.teacher_forced)))


def record(r, prompt, ids, feat, hfin, top_ids, top_logp):
    return {"index": r["index"], "category": r["category"], "split": r["split"], "temp": r.get("temp", 0.0),
            "ids": ids, "n_prompt": len(prompt), "feat": feat, "hfin": hfin, "top_ids": top_ids, "top_logp": top_logp}


seqs = []
t0 = time.time()
if a.specula:
    with tempfile.TemporaryDirectory(dir=os.path.dirname(os.path.abspath(a.out))) as tmp:
        feats = specula_features([prompt + reply for _, prompt, reply in records], tmp)
    E = config.dim
    for (r, prompt, reply), (taps, top_ids, top_logp) in zip(records, feats):
        seqs.append(record(r, prompt, torch.tensor(prompt + reply), taps[:, :-E].contiguous(), taps[:, -E:].contiguous(),
                           top_ids, top_logp.to(torch.float16)))
for r, prompt, reply in ([] if a.specula else records):
    ids = torch.tensor(prompt + reply)
    with torch.no_grad():  # fp32: bf16 autocast is emulated (slow) on CPUs without AVX-512/AMX
        logits, hfin, caps = m(ids[None], capture_layers=set(layers))
    logp = torch.log_softmax(logits[0].float(), -1)
    top = logp.topk(a.topk, -1)
    seqs.append(record(r, prompt, ids, torch.cat([caps[l][0] for l in layers], -1).to(torch.bfloat16), hfin[0].to(torch.bfloat16),
                       top.indices.to(torch.int32), top.values.to(torch.float16)))
    if len(seqs) % 5 == 0:  # saved as it goes: a run cut short still yields training data
        torch.save({"layers": layers, "config": config.__dict__, "seqs": seqs}, a.out)
        print(f"{len(seqs)} sequences, {sum(len(s['ids']) for s in seqs)} tokens, {time.time() - t0:.0f}s", flush=True)
torch.save({"layers": layers, "config": config.__dict__, "seqs": seqs}, a.out)
print("wrote", a.out, len(seqs), "sequences", sum(len(s["ids"]) for s in seqs), "tokens", f"{time.time() - t0:.0f}s")
