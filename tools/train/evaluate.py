#!/usr/bin/env python3
"""Held-out evaluation of the specula family (PyTorch fp32, 1 thread).

Target: cross-entropy / perplexity / top-1 next-token accuracy over the whole
held-out token stream (non-overlapping 512-token windows, BOS-separated files).

Drafters (draft LM, EAGLE-3, EAGLE-1): for every base position s of W held-out
windows (context = real tokens x[0..s]), the drafter proposes d_1..d_5 running
autoregressively on its own proposals; the target is evaluated on exactly the same
path (context + d_1..d_{j-1}) via KV-chain attention (equivalent to a full forward).
  greedy  : d_j = argmax q_j.  agree[j] = P(d_j == argmax p_j)   (on the drafter's path)
            accept[j] = P(d_1..d_j all == target greedy)  (= greedy spec-decoding
            acceptance of the first j drafted tokens); E[accepted | 5 drafted] = sum(accept).
  temp=1  : d_j ~ q_j (seeded).  alpha[j] = E[sum_v min(p_j(v), q_j(v))] = probability
            that speculative sampling accepts d_j given d_<j were accepted;
            accept[j] = E[prod_{i<=j} alpha_i].
EAGLE heads: head index t = s-1 consumes (target feature at t, token x[s]) as in
llama.cpp (KV position t for step 0, t+j for step j).
Cost: measured wall time per token of one drafting step relative to one target
forward, both as a 1x256 batched forward in PyTorch fp32 (1 thread), plus MACs/token."""
import argparse, json, math, os, sys, time
import numpy as np
import torch
import torch.nn.functional as F
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from model import (Eagle3Head, Eagle1Head, LlamaConfig, load_llama, lm_chain_step)
import sentencepiece as spm

ap = argparse.ArgumentParser()
ap.add_argument("--work", required=True)
ap.add_argument("--out", required=True)
ap.add_argument("--windows", type=int, default=8)
ap.add_argument("--win_len", type=int, default=256)
ap.add_argument("--depth", type=int, default=5)
ap.add_argument("--skip_target_ppl", action="store_true")
a = ap.parse_args()
torch.set_num_threads(1)
torch.manual_seed(0)
W = a.work
held = np.fromfile(os.path.join(W, "heldout.bin"), dtype=np.uint16).astype(np.int64)
tgt = load_llama(os.path.join(W, "target.pt"))
res = {}

# ---------------- target held-out loss / ppl / top1 ----------------
if not a.skip_target_ppl:
    t0 = time.time()
    tot, n, corr = 0.0, 0, 0
    L = 512
    with torch.no_grad():
        for i in range(0, len(held) - 1, L):
            x = torch.from_numpy(held[i:i + L + 1])
            if len(x) < 2:
                break
            inp, y = x[:-1][None], x[1:][None]
            lg, _, _ = tgt(inp)
            tot += F.cross_entropy(lg[0], y[0], reduction="sum").item()
            corr += (lg[0].argmax(-1) == y[0]).sum().item()
            n += y.numel()
    res["target_heldout"] = {"tokens": n, "loss_nats": tot / n, "perplexity": math.exp(tot / n), "top1_acc": corr / n,
                             "bits_per_byte": None, "eval_seconds": time.time() - t0}
    tj = json.load(open(os.path.join(W, "tokenized.json")))
    res["target_heldout"]["bits_per_byte"] = (tot / math.log(2)) / tj["heldout"]["bytes"] * (tj["heldout"]["tokens"] - 1) / n
    print(res["target_heldout"], flush=True)

# ---------------- drafters ----------------
rng = np.random.default_rng(2024)
starts = rng.integers(0, len(held) - a.win_len - 1, size=a.windows)
X = torch.from_numpy(np.stack([held[s:s + a.win_len] for s in starts]))  # [B, L]
B, L = X.shape
D = a.depth
base = torch.arange(L)
with torch.no_grad():
    tlog0, thfin, tcaps = tgt(X, capture_layers={1, 3, 5, tgt.c.n_layers})

def target_on_path(path):
    """path: list of D-1 [B,L] token tensors d_1..d_{D-1} (index s). Returns list of D target
    log-prob tensors p_1..p_D at index s (p_j = target dist after context + d_<j)."""
    caches = [[] for _ in tgt.layers]
    out = []
    with torch.no_grad():
        lg, _ = lm_chain_step(tgt, X, 0, caches, base)
        out.append(F.log_softmax(lg, -1))
        for j in range(1, D):
            lg, _ = lm_chain_step(tgt, path[j - 1], j, caches, base)
            out.append(F.log_softmax(lg, -1))
    return out

def drafter_draft_lm(model, mode, gen):
    caches = [[] for _ in model.layers]
    qs, ds = [], []
    with torch.no_grad():
        tok = X
        for j in range(D):
            lg, _ = lm_chain_step(model, tok, j, caches, base)
            lq = F.log_softmax(lg, -1)
            d = lq.argmax(-1) if mode == "greedy" else torch.multinomial(lq.exp().view(-1, lq.size(-1)), 1, generator=gen).view(B, L)
            qs.append(lq); ds.append(d); tok = d
    return qs, ds

def drafter_eagle(head, kind, mode, gen):
    """Head index t = s-1. Returns q_j, d_j re-indexed by s (index 0 invalid -> filled by shifting)."""
    Th = L - 1
    hb = torch.arange(Th)
    cache, qs, ds = [], [], []
    with torch.no_grad():
        tok = X[:, 1:]
        if kind == "eagle3":
            g = head.fc(torch.cat([tcaps[l] for l in head.target_layers], -1)[:, :Th])
        else:
            g = thfin[:, :Th]
        for j in range(D):
            emb = tgt.tok_embd(tok)
            if kind == "eagle3":
                out, lg = head.step(emb, g, j, cache, hb)
            else:
                out = head.step(emb, g, j, cache, hb)
                lg = tgt.lm_head(tgt.norm(out))
            lq = F.log_softmax(lg, -1)
            d = lq.argmax(-1) if mode == "greedy" else torch.multinomial(lq.exp().view(-1, lq.size(-1)), 1, generator=gen).view(B, Th)
            # shift to s-indexing: s = t+1; position s=0 gets a dummy copy (excluded later)
            qs.append(torch.cat([lq[:, :1], lq], 1)); ds.append(torch.cat([d[:, :1], d], 1))
            tok, g = d, out
    return qs, ds

def score(qs, ds, mode):
    ps = target_on_path(ds[:D - 1])
    # valid s: 1 .. L-1 (s=0 excluded for EAGLE alignment, kept identical for all drafters)
    sl = slice(1, L)
    agree, accept, alpha, cum = [], [], [], []
    run = torch.ones(B, L - 1)
    for j in range(D):
        p, q, d = ps[j][:, sl], qs[j][:, sl], ds[j][:, sl]
        if mode == "greedy":
            m = (d == p.argmax(-1)).float()
            run = run * m
            agree.append(m.mean().item()); accept.append(run.mean().item())
        else:
            al = torch.minimum(p.exp(), q.exp()).sum(-1)
            run = run * al
            alpha.append(al.mean().item()); accept.append(run.mean().item())
    if mode == "greedy":
        return {"agree_by_depth": agree, "accept_cum_by_depth": accept, "expected_accepted_of_5": sum(accept)}
    return {"alpha_by_depth": alpha, "accept_cum_by_depth": accept, "expected_accepted_of_5": sum(accept)}

drafters = {}
draft_lm = load_llama(os.path.join(W, "draft.pt")) if os.path.exists(os.path.join(W, "draft.pt")) else None
if draft_lm is not None:
    drafters["draft"] = lambda mode, gen: drafter_draft_lm(draft_lm, mode, gen)
heads = {}
for kind, cls in (("eagle3", Eagle3Head), ("eagle1", Eagle1Head)):
    pth = os.path.join(W, f"{kind}.pt")
    if os.path.exists(pth):
        ck = torch.load(pth, map_location="cpu")
        h = cls(LlamaConfig(**ck["config"]), ck["target_layers"]) if kind == "eagle3" else cls(LlamaConfig(**ck["config"]))
        h.load_state_dict(ck["state_dict"]); h.eval()
        heads[kind] = h
        drafters[kind] = (lambda hh, kk: (lambda mode, gen: drafter_eagle(hh, kk, mode, gen)))(h, kind)

res["drafters"] = {"windows": B, "win_len": L, "base_positions": B * (L - 1), "depth": D}
for name, fn in drafters.items():
    t0 = time.time()
    r = {}
    for mode in ("greedy", "temp1"):
        gen = torch.Generator().manual_seed(7)
        qs, ds = fn(mode, gen)
        r[mode] = score(qs, ds, mode)
    res["drafters"][name] = r
    print(name, json.dumps(r), f"{time.time()-t0:.0f}s", flush=True)

# ---------------- cost per token ----------------
def timeit(f, reps=3):
    f(); t = time.time()
    for _ in range(reps):
        f()
    return (time.time() - t) / reps

xc = X[:1]
cost = {}
with torch.no_grad():
    t_tgt = timeit(lambda: tgt(xc))
    cost["target_ms_per_token"] = 1000 * t_tgt / xc.numel()
    if draft_lm is not None:
        cost["draft"] = timeit(lambda: draft_lm(xc)) / t_tgt
    f3 = torch.cat([tcaps[l][:1] for l in (1, 3, 5)], -1)
    emb = tgt.tok_embd(xc)
    if "eagle3" in heads:
        h = heads["eagle3"]
        cost["eagle3"] = timeit(lambda: h.step(emb, h.fc(f3), 0, [], base)) / t_tgt
    if "eagle1" in heads:
        h = heads["eagle1"]
        cost["eagle1"] = timeit(lambda: tgt.lm_head(tgt.norm(h.step(emb, thfin[:1], 0, [], base)))) / t_tgt

def macs(kind):
    c = tgt.c
    h, f, V, kvd = c.dim, c.ffn_dim, c.vocab_size, c.n_kv_heads * c.head_dim
    layer = h * h * 2 + 2 * h * kvd + 3 * h * f
    if kind == "target":
        return c.n_layers * layer + h * V
    if kind == "eagle3":
        return 3 * h * h + (2 * h * h + 2 * 2 * h * kvd + h * h + 3 * h * f) + h * V
    if kind == "eagle1":
        return 2 * h * h + layer + h * V
    dc = draft_lm.c
    dl = dc.dim * dc.dim * 2 + 2 * dc.dim * dc.n_kv_heads * dc.head_dim + 3 * dc.dim * dc.ffn_dim
    return dc.n_layers * dl + dc.dim * dc.vocab_size
cost["macs_per_token"] = {k: macs(k) for k in ["target"] + list(drafters)}
cost["macs_ratio_to_target"] = {k: macs(k) / macs("target") for k in drafters}
cost["note"] = "wall-time ratios: 1x256-token batched forward, PyTorch fp32, 1 thread; drafter step vs target forward"
res["cost_relative_to_target"] = cost
print(cost, flush=True)

# ---------------- greedy samples ----------------
sp = spm.SentencePieceProcessor(model_file=os.path.join(W, "specula_tok.model"))
prompts = ["def fibonacci(n):\n", "import os\nimport sys\n\n\ndef main():\n", "class Stack:\n    def __init__(self):\n",
           "The :mod:`json` module", "This tutorial introduces the reader informally to"]
samples = []
with torch.no_grad():
    for p in prompts:
        ids = [sp.bos_id()] + sp.encode(p)
        n0 = len(ids)
        for _ in range(48):
            lg, _, _ = tgt(torch.tensor([ids]))
            ids.append(int(lg[0, -1].argmax()))
        samples.append({"prompt": p, "prompt_tokens": ids[:n0], "continuation_tokens": ids[n0:], "continuation": sp.decode(ids[1:])[len(p):]})
        print(repr(p), "->", repr(samples[-1]["continuation"]), flush=True)
res["greedy_samples"] = samples
json.dump(res, open(a.out, "w"), indent=1)
print("wrote", a.out)
