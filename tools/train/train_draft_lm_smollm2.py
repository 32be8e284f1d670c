#!/usr/bin/env python3
"""Distil a small draft LM for SmolLM2-135M-Instruct from the target's own replies
(target_features.py outputs: token ids and the target's top-k next-token distributions).

The draft is a plain llama-architecture LM with the target's tokenizer and vocabulary, so
specula (`--draft`) and llama.cpp (`llama-speculative-simple -md`) both run it. Its cost is
dominated by the tied embedding / LM head (vocabulary x --dim), so --dim stays small; the
embedding starts as the target's projected onto its top --dim right singular vectors (the
subspace the target's own tied head reads most), a start a short CPU budget cannot get from
random weights. Loss: soft cross-entropy against the target's top-k distribution at every
position (prompt positions weighted --prompt_weight: the draft needs the chat context, but
only ever proposes replies). Every --val_every steps, greedy top-1 agreement with the target
on the replies of a held-back twentieth of the training sequences; the checkpoint kept is the
best one by that figure, so a run cut short (or overfitting late) still yields the best head.
  train_draft_lm_smollm2.py --feats feats.pt [--feats more.pt] --model GGUF --out draft.pt --minutes 40"""
import argparse, json, os, sys, time
import torch
import torch.nn.functional as F
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from model import ROPE_BASE, Llama, LlamaConfig, load_gguf_tensors
from schedule import wallclock_cosine_lr

ap = argparse.ArgumentParser()
ap.add_argument("--feats", action="append", required=True)
ap.add_argument("--model", required=True, help="target GGUF (its token embedding seeds the draft's)")
ap.add_argument("--out", required=True)
ap.add_argument("--log", required=True)
ap.add_argument("--dim", type=int, default=128)
ap.add_argument("--layers", type=int, default=4)
ap.add_argument("--heads", type=int, default=4)
ap.add_argument("--kv_heads", type=int, default=2)
ap.add_argument("--ffn", type=int, default=512)
ap.add_argument("--batch", type=int, default=4)
ap.add_argument("--lr", type=float, default=2e-3)
ap.add_argument("--wd", type=float, default=0.05)
ap.add_argument("--warmup", type=int, default=30)
ap.add_argument("--prompt_weight", type=float, default=0.3)
ap.add_argument("--minutes", type=float, default=40.0)
ap.add_argument("--val_every", type=int, default=100)
ap.add_argument("--threads", type=int, default=2)
ap.add_argument("--seed", type=int, default=2024)
ap.add_argument("--bf16", action="store_true",
                help="bf16 autocast for the matmuls: several times faster on CPUs with AMX or AVX-512 BF16, emulated (slow) elsewhere")
a = ap.parse_args()
torch.set_num_threads(a.threads)
torch.manual_seed(a.seed)

parts = [torch.load(f) for f in a.feats]
tc = parts[0]["config"]
seqs = [s for p in parts for s in p["seqs"] if s["split"] == "train"]
val = [s for i, s in enumerate(seqs) if i % 20 == 7]
train = [s for i, s in enumerate(seqs) if i % 20 != 7]
c = LlamaConfig(vocab_size=tc["vocab_size"], dim=a.dim, n_layers=a.layers, n_heads=a.heads, n_kv_heads=a.kv_heads,
                ffn_dim=a.ffn, ctx=tc["ctx"], rope_base=tc["rope_base"], norm_eps=tc["norm_eps"], tie_embeddings=True)
ROPE_BASE[0] = c.rope_base
model = Llama(c)
E = load_gguf_tensors(a.model, ["token_embd.weight"])["token_embd.weight"]
with torch.no_grad():
    _, _, Vh = torch.linalg.svd(E, full_matrices=False)
    model.tok_embd.weight.copy_(E @ Vh[:a.dim].T)
nparam = sum(p.numel() for p in model.parameters())
n_embd = model.tok_embd.weight.numel()
print(f"{len(train)} training / {len(val)} validation sequences, {sum(len(s['ids']) for s in train)} training tokens; "
      f"draft {nparam / 1e6:.2f}M params ({(nparam - n_embd) / 1e6:.2f}M besides the embedding)", flush=True)
decay = [p for n, p in model.named_parameters() if p.dim() >= 2 and n != "tok_embd.weight"]
rest = [p for n, p in model.named_parameters() if p.dim() < 2 or n == "tok_embd.weight"]
opt = torch.optim.AdamW([{"params": decay, "weight_decay": a.wd}, {"params": rest, "weight_decay": 0.0}],
                        lr=a.lr, betas=(0.9, 0.95))


def make_batch(batch):
    T = max(len(s["ids"]) for s in batch)
    B, K = len(batch), batch[0]["top_ids"].shape[1]
    x = torch.zeros(B, T, dtype=torch.long)
    top_ids = torch.zeros(B, T, K, dtype=torch.long)
    top_p = torch.zeros(B, T, K)
    weight = torch.zeros(B, T)
    reply = torch.zeros(B, T, dtype=torch.bool)
    for b, s in enumerate(batch):
        n, P = len(s["ids"]), s["n_prompt"]
        x[b, :n] = s["ids"]
        top_ids[b, :n] = s["top_ids"].long()
        top_p[b, :n] = s["top_logp"].float().exp()
        weight[b, :P - 1] = a.prompt_weight
        weight[b, P - 1:n - 1] = 1.0  # position t predicts t+1: the last one predicts past the reply
        reply[b, P - 1:n - 1] = True
    return x, top_ids, top_p, weight, reply


def run(x, top_ids, top_p, weight, reply):
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=a.bf16):
        logits, _, _ = model(x)
    lq = F.log_softmax(logits.float(), -1)
    ce = -(top_p * lq.gather(-1, top_ids)).sum(-1)
    loss = (ce * weight).sum() / weight.sum()
    agree = ((lq.argmax(-1) == top_ids[..., 0]) & reply).sum().item()
    return loss, agree, reply.sum().item()


def validate():
    model.eval()
    agree = total = 0
    with torch.no_grad():
        for i in range(0, len(val), a.batch):
            _, ag, n = run(*make_batch(val[i:i + a.batch]))
            agree, total = agree + ag, total + n
    model.train()
    return agree / max(1, total)


def save(step, val_agree):
    ck = {"config": c.__dict__, "state_dict": model.state_dict(), "step": step, "val_top1_agree": val_agree,
          "args": vars(a)}
    torch.save(ck, a.out + ".tmp")
    os.replace(a.out + ".tmp", a.out)


log = open(a.log, "a")
log.write(json.dumps({"event": "start", "model": "smollm2-draft", "params": nparam, "args": vars(a)}) + "\n")
g = torch.Generator().manual_seed(a.seed)
t0 = time.time()
step, epoch, best = 0, 0, -1.0
while time.time() - t0 < a.minutes * 60:
    perm = torch.randperm(len(train), generator=g).tolist()
    for i in range(0, len(perm) - a.batch + 1, a.batch):
        el = time.time() - t0
        if el >= a.minutes * 60:
            break
        lr = wallclock_cosine_lr(a.lr, a.warmup, el / (a.minutes * 60), step)
        for gr in opt.param_groups:
            gr["lr"] = lr
        loss, agree, n = run(*make_batch([train[j] for j in perm[i:i + a.batch]]))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        gn = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        step += 1
        rec = {"model": "smollm2-draft", "step": step, "epoch": epoch, "loss": round(loss.item(), 4),
               "top1_agree": round(agree / max(1, n), 4), "lr": lr, "grad_norm": round(gn.item(), 3),
               "elapsed_s": round(time.time() - t0, 1)}
        if step % a.val_every == 0:
            rec["val_top1_agree"] = round(validate(), 4)
            if rec["val_top1_agree"] > best:
                best = rec["val_top1_agree"]
                save(step, best)
        log.write(json.dumps(rec) + "\n"); log.flush()
        if step % 10 == 0:
            print(rec, flush=True)
    epoch += 1
v = validate()
if v > best:
    best = v
    save(step, v)
log.write(json.dumps({"event": "done", "model": "smollm2-draft", "steps": step, "best_val_top1_agree": best,
                      "elapsed_s": time.time() - t0}) + "\n")
print("done", step, "steps, best validation top-1 agreement", best, time.time() - t0)
