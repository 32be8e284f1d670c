#!/usr/bin/env python3
"""Train a specula Llama LM (target or draft) on CPU, 1 thread, bf16 autocast.
Fixed seed + fixed step count => reproducible (up to bf16/BLAS nondeterminism)."""
import argparse, json, math, os, sys, time
import numpy as np
import torch
import torch.nn.functional as F
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from model import Llama, CONFIGS

ap = argparse.ArgumentParser()
ap.add_argument("--work", required=True)
ap.add_argument("--name", required=True, choices=list(CONFIGS))
ap.add_argument("--steps", type=int, required=True)
ap.add_argument("--batch", type=int, default=8)
ap.add_argument("--seq", type=int, default=512)
ap.add_argument("--lr", type=float, default=1.5e-3)
ap.add_argument("--min_lr_frac", type=float, default=0.1)
ap.add_argument("--warmup", type=int, default=60)
ap.add_argument("--wd", type=float, default=0.1)
ap.add_argument("--seed", type=int, default=1234)
ap.add_argument("--eval_every", type=int, default=200)
ap.add_argument("--log", required=True)
ap.add_argument("--bench", type=int, default=0, help="only time N steps")
a = ap.parse_args()

torch.set_num_threads(1)
torch.manual_seed(a.seed)
rng = np.random.default_rng(a.seed)
train = np.memmap(os.path.join(a.work, "train.bin"), dtype=np.uint16, mode="r")
held = np.memmap(os.path.join(a.work, "heldout.bin"), dtype=np.uint16, mode="r")
c = CONFIGS[a.name]
model = Llama(c)
nparam = sum(p.numel() for p in model.parameters())
print(f"{a.name}: {nparam/1e6:.2f}M params", flush=True)

decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
nodecay = [p for n, p in model.named_parameters() if p.dim() < 2]
opt = torch.optim.AdamW([{"params": decay, "weight_decay": a.wd}, {"params": nodecay, "weight_decay": 0.0}],
                        lr=a.lr, betas=(0.9, 0.95), eps=1e-8)

def batch(data, r, B, T):
    ix = r.integers(0, len(data) - T - 1, size=B)
    x = np.stack([data[i:i + T + 1].astype(np.int64) for i in ix])
    return torch.from_numpy(x[:, :-1]), torch.from_numpy(x[:, 1:])

# fixed held-out eval set (same windows every time)
er = np.random.default_rng(999)
EVAL = [batch(held, er, 4, a.seq) for _ in range(4)]

def evaluate():
    model.eval()
    tot, n = 0.0, 0
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        for x, y in EVAL:
            lg, _, _ = model(x)
            tot += F.cross_entropy(lg.float().reshape(-1, lg.size(-1)), y.reshape(-1), reduction="sum").item()
            n += y.numel()
    model.train()
    return tot / n

def lr_at(s):
    if s < a.warmup:
        return a.lr * (s + 1) / a.warmup
    pr = (s - a.warmup) / max(1, a.steps - a.warmup)
    return a.lr * (a.min_lr_frac + (1 - a.min_lr_frac) * 0.5 * (1 + math.cos(math.pi * pr)))

log = open(a.log, "a")
log.write(json.dumps({"event": "start", "model": a.name, "params": nparam, "config": c.__dict__, "args": vars(a)}) + "\n")
t0 = time.time()
steps = a.bench or a.steps
for s in range(steps):
    for g in opt.param_groups:
        g["lr"] = lr_at(s)
    x, y = batch(train, rng, a.batch, a.seq)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        lg, _, _ = model(x)
    loss = F.cross_entropy(lg.float().reshape(-1, lg.size(-1)), y.reshape(-1))
    opt.zero_grad(set_to_none=True)
    loss.backward()
    gn = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    el = time.time() - t0
    rec = {"model": a.name, "step": s + 1, "loss": round(loss.item(), 4), "lr": lr_at(s), "grad_norm": round(gn.item(), 3),
           "tokens": (s + 1) * a.batch * a.seq, "elapsed_s": round(el, 1), "tok_per_s": round((s + 1) * a.batch * a.seq / el, 1)}
    if (s + 1) % a.eval_every == 0 or s + 1 == steps:
        rec["heldout_loss"] = round(evaluate(), 4)
    log.write(json.dumps(rec) + "\n"); log.flush()
    if (s + 1) % 10 == 0 or "heldout_loss" in rec:
        print(rec, flush=True)
if not a.bench:
    torch.save({"config": c.__dict__, "state_dict": model.state_dict(), "args": vars(a)}, os.path.join(a.work, f"{a.name}.pt"))
    log.write(json.dumps({"event": "done", "model": a.name, "elapsed_s": time.time() - t0}) + "\n")
print("done", time.time() - t0)
