#!/usr/bin/env python3
"""Train an EAGLE-3 or EAGLE-1 head on the frozen specula target (CPU, 1 thread, bf16).

EAGLE-3 (--kind eagle3): features = target layer inputs of layers --target_layers
  (llama.cpp `layer_inp` semantics); training-time test with --ttt_steps unrolled
  self-fed steps: step 0 uses g = fc(features), step k uses the head's own previous
  output hidden state; token input at head index t for step k is x[t+1+k]; loss is soft
  CE against the target's next-token distribution at t+1+k, weighted 0.8^k.
EAGLE-1 (--kind eagle1): feature = target final hidden (before output norm); head
  predicts the next feature; loss = smoothL1(pred, f[t+1]) + 0.1 * softCE(target
  head(pred), p_target) (EAGLE-1 recipe) with uniform feature noise (+-0.1*rms).
  --ttt_steps > 1 additionally unrolls self-fed steps (default 1 = plain EAGLE-1)."""
import argparse, json, math, os, sys, time
import numpy as np
import torch
import torch.nn.functional as F
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from model import Eagle3Head, Eagle1Head, load_llama

ap = argparse.ArgumentParser()
ap.add_argument("--work", required=True)
ap.add_argument("--kind", required=True, choices=["eagle3", "eagle1"])
ap.add_argument("--steps", type=int, required=True)
ap.add_argument("--batch", type=int, default=4)
ap.add_argument("--seq", type=int, default=512)
ap.add_argument("--lr", type=float, default=1e-3)
ap.add_argument("--warmup", type=int, default=30)
ap.add_argument("--ttt_steps", type=int, default=3)
ap.add_argument("--target_layers", default="1,3,5")
ap.add_argument("--seed", type=int, default=4321)
ap.add_argument("--log", required=True)
ap.add_argument("--eval_every", type=int, default=100)
a = ap.parse_args()

torch.set_num_threads(1)
torch.manual_seed(a.seed)
rng = np.random.default_rng(a.seed)
train = np.memmap(os.path.join(a.work, "train.bin"), dtype=np.uint16, mode="r")
held = np.memmap(os.path.join(a.work, "heldout.bin"), dtype=np.uint16, mode="r")
tgt = load_llama(os.path.join(a.work, "target.pt"))
c = tgt.c
layers = [int(x) for x in a.target_layers.split(",")]
if a.kind == "eagle3":
    head = Eagle3Head(c, layers)
    with torch.no_grad():  # start lm_head / final norm from the target's
        head.output.weight.copy_(tgt.output.weight)
        head.norm.weight.copy_(tgt.norm.weight)
else:
    head = Eagle1Head(c)
for m in head.modules():
    if isinstance(m, torch.nn.Linear) and m is not getattr(head, "output", None):
        torch.nn.init.normal_(m.weight, std=0.02)
nparam = sum(p.numel() for p in head.parameters())
print(f"{a.kind}: {nparam/1e6:.2f}M params", flush=True)
opt = torch.optim.AdamW(head.parameters(), lr=a.lr, betas=(0.9, 0.95), weight_decay=0.0)

def batch(data, r, B, T):
    ix = r.integers(0, len(data) - T, size=B)
    return torch.from_numpy(np.stack([data[i:i + T].astype(np.int64) for i in ix]))

def target_feats(x):
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        logits, hfin, caps = tgt(x, capture_layers=set(layers) if a.kind == "eagle3" else None)
    logp = F.log_softmax(logits.float(), -1)
    feat = torch.cat([caps[l].float() for l in layers], -1) if a.kind == "eagle3" else hfin.float()
    return feat, hfin.float(), logp

def run(x, train_mode=True):
    """Returns (loss, per-step top-1 agreement with target argmax)."""
    B, T = x.shape
    feat, hfin, logp = target_feats(x)
    p = logp.exp()
    Th = T - 1  # head index t uses token x[t+1]
    base = torch.arange(Th)
    cache, losses, accs = [], [], []
    g = None
    for k in range(a.ttt_steps):
        n = Th - k  # valid head indices: t + 1 + k <= T - 1
        tok = torch.zeros(B, Th, dtype=torch.long)
        tok[:, :n] = x[:, 1 + k:1 + k + n]
        emb = tgt.tok_embd(tok).float()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            if a.kind == "eagle3":
                if k == 0:
                    g = head.fc(feat[:, :Th])
                out, logits = head.step(emb, g, k, cache, base)
            else:
                if k == 0:
                    f = feat[:, :Th]
                    if train_mode:
                        rms = f.pow(2).mean(-1, keepdim=True).sqrt()
                        f = f + (torch.rand_like(f) * 0.2 - 0.1) * rms
                    g = f
                out = head.step(emb, g, k, cache, base)
                logits = tgt.lm_head(tgt.norm(out))
        tp = p[:, 1 + k:1 + k + n]
        lq = F.log_softmax(logits[:, :n].float(), -1)
        ce = -(tp * lq).sum(-1).mean()
        if a.kind == "eagle3":
            l = ce
        else:
            l = F.smooth_l1_loss(out[:, :n].float(), hfin[:, 1 + k:1 + k + n]) + 0.1 * ce
        losses.append((0.8 ** k) * l)
        accs.append((lq.argmax(-1) == tp.argmax(-1)).float().mean().item())
        g = out
    return sum(losses), accs

er = np.random.default_rng(999)
EVAL = [batch(held, er, 4, a.seq) for _ in range(2)]

def evaluate():
    head.eval()
    with torch.no_grad():
        res = [run(x, train_mode=False) for x in EVAL]
    head.train()
    return round(sum(r[0].item() for r in res) / len(res), 4), [round(sum(r[1][k] for r in res) / len(res), 4) for k in range(a.ttt_steps)]

def lr_at(s):
    if s < a.warmup:
        return a.lr * (s + 1) / a.warmup
    pr = (s - a.warmup) / max(1, a.steps - a.warmup)
    return a.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * pr)))

log = open(a.log, "a")
log.write(json.dumps({"event": "start", "model": a.kind, "params": nparam, "args": vars(a)}) + "\n")
t0 = time.time()
for s in range(a.steps):
    for gr in opt.param_groups:
        gr["lr"] = lr_at(s)
    x = batch(train, rng, a.batch, a.seq)
    loss, accs = run(x)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    gn = torch.nn.utils.clip_grad_norm_(head.parameters(), 1.0)
    opt.step()
    el = time.time() - t0
    rec = {"model": a.kind, "step": s + 1, "loss": round(loss.item(), 4), "top1_agree_by_step": [round(v, 4) for v in accs],
           "lr": lr_at(s), "grad_norm": round(gn.item(), 3), "tokens": (s + 1) * a.batch * a.seq, "elapsed_s": round(el, 1)}
    if (s + 1) % a.eval_every == 0 or s + 1 == a.steps:
        rec["heldout_loss"], rec["heldout_top1_agree_by_step"] = evaluate()
    log.write(json.dumps(rec) + "\n"); log.flush()
    if (s + 1) % 10 == 0 or "heldout_loss" in rec:
        print(rec, flush=True)
ck = {"config": c.__dict__, "state_dict": head.state_dict(), "args": vars(a), "target_hidden_size": c.dim}
if a.kind == "eagle3":
    ck["target_layers"] = layers
torch.save(ck, os.path.join(a.work, f"{a.kind}.pt"))
log.write(json.dumps({"event": "done", "model": a.kind, "elapsed_s": time.time() - t0}) + "\n")
print("done", time.time() - t0)
