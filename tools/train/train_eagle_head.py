#!/usr/bin/env python3
"""Train an EAGLE head for a real target (SmolLM2-135M-Instruct, Gemma 3 270M) on precomputed
target features (target_features.py).

--kind eagle3 (default): model.Eagle3Head over a compact draft vocabulary (d2t): the --vocab most
  frequent target tokens of the training sequences' replies (ties: lower id), in id order; g =
  fc(the target's 3 tapped layer inputs). Loss: soft CE against the target's top-k distribution
  restricted to the draft vocabulary.
--kind eagle1: model.Eagle1Head; its input feature is the target's final pre-norm hidden state,
  its logits the target's own (output norm and tied lm_head, frozen: the full vocabulary). Loss,
  as EAGLE-1: smooth L1 to the target's next hidden state (in units of its RMS) + 0.1 x that soft
  CE, with uniform feature noise (+-0.1 rms) on the target features.
Both: the token embedding is the target's (frozen, not stored in the head). Training-time test as
train_eagle.py: --ttt_steps self-fed steps, step k at head index t reads token x[t+1+k] and is
scored (weight 0.8^k) on the target's next-token distribution at t+1+k.
A checkpoint is written every --save_every steps, so a run cut short still yields a head.
  train_eagle_head.py [--kind eagle1] --feats feats.pt [--feats more.pt] --model GGUF --out head.pt --minutes 35"""
import argparse, json, os, sys, time
import torch
import torch.nn.functional as F
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from model import ROPE_BASE, Eagle1Head, Eagle3Head, LlamaConfig, load_gguf_tensors
from schedule import wallclock_cosine_lr

ap = argparse.ArgumentParser()
ap.add_argument("--kind", choices=["eagle3", "eagle1"], default="eagle3")
ap.add_argument("--feats", action="append", required=True, help="target_features.py outputs (repeatable: greedy and sampled replies)")
ap.add_argument("--model", required=True, help="target GGUF (token embedding, output norm and lm_head rows for init)")
ap.add_argument("--out", required=True)
ap.add_argument("--log", required=True)
ap.add_argument("--name", default=None, help="the model name in the log (default: the --out file's stem)")
ap.add_argument("--vocab", type=int, default=8192)
ap.add_argument("--heads", type=int, default=0, help="query heads of the head's attention (0: the target's)")
ap.add_argument("--kv_heads", type=int, default=0, help="its KV heads (0: the target's)")
ap.add_argument("--ffn", type=int, default=0, help="its FFN width (0: the target's)")
ap.add_argument("--batch", type=int, default=8)
ap.add_argument("--lr", type=float, default=1e-3)
ap.add_argument("--warmup", type=int, default=20)
ap.add_argument("--ttt_steps", type=int, default=3)
ap.add_argument("--minutes", type=float, default=35.0, help="wall-clock budget; the cosine schedule spans it")
ap.add_argument("--max_steps", type=int, default=100000)
ap.add_argument("--save_every", type=int, default=25)
ap.add_argument("--threads", type=int, default=1)
ap.add_argument("--seed", type=int, default=4321)
ap.add_argument("--bf16", action="store_true",
                help="bf16 autocast for the head's matmuls: several times faster on CPUs with AMX or AVX-512 BF16, emulated (slow) elsewhere")
a = ap.parse_args()
a.name = a.name or os.path.splitext(os.path.basename(a.out))[0]
torch.set_num_threads(a.threads)
torch.manual_seed(a.seed)

parts = [torch.load(f) for f in a.feats]
data = parts[0]
layers = data["layers"]
if any(p["layers"] != layers for p in parts):
    sys.exit("train_eagle_head: error: the --feats files were extracted at different layers")
train = [s for p in parts for s in p["seqs"] if s["split"] == "train"]
n_vocab = data["config"]["vocab_size"]
counts = torch.zeros(n_vocab, dtype=torch.long)
for s in train:
    counts.index_add_(0, s["ids"][s["n_prompt"]:], torch.ones(len(s["ids"]) - s["n_prompt"], dtype=torch.long))
if a.kind == "eagle1":
    a.vocab = n_vocab  # drafts over the target's own logits
order = sorted(range(len(counts)), key=lambda i: (-int(counts[i]), i))
d2t = torch.tensor(sorted(order[:a.vocab]))
t2d = torch.full((len(counts),), -1, dtype=torch.long)
t2d[d2t] = torch.arange(a.vocab)
coverage = counts[d2t].sum().item() / max(1, counts.sum().item())
print(f"{len(train)} training sequences, {sum(len(s['ids']) for s in train)} tokens; draft vocabulary {a.vocab} covers {coverage:.4f} of reply tokens", flush=True)

c = LlamaConfig(**{**data["config"], "vocab_size": a.vocab, "n_layers": 1})
c.n_heads, c.n_kv_heads, c.ffn_dim = a.heads or c.n_heads, a.kv_heads or c.n_kv_heads, a.ffn or c.ffn_dim
if c.dim % c.n_heads or c.n_heads % c.n_kv_heads or (c.dim // c.n_heads) % 16:
    sys.exit(f"train_eagle_head: error: width {c.dim} with {c.n_heads} heads / {c.n_kv_heads} KV heads: the head size must be "
             "a whole multiple of 16 and the heads a multiple of the KV heads")
ROPE_BASE[0] = c.rope_base
if not data["config"]["tie_embeddings"]:
    sys.exit("train_eagle_head: error: expects a target with tied embeddings (its lm_head is token_embd)")
w = load_gguf_tensors(a.model, ["token_embd.weight", "output_norm.weight"])
head = Eagle3Head(c, layers) if a.kind == "eagle3" else Eagle1Head(c)
for mod in head.modules():
    if isinstance(mod, torch.nn.Linear):
        torch.nn.init.normal_(mod.weight, std=0.02)
if a.kind == "eagle3":
    with torch.no_grad():  # lm_head and final norm start from the target's (rows of the draft vocabulary)
        head.output.weight.copy_(w["token_embd.weight"][d2t])
        head.norm.weight.copy_(w["output_norm.weight"])
        # fc starts as "take the high tap": g begins in the target's own hidden space (a short CPU
        # budget gets far less out of a random fc)
        head.fc.weight[:, 2 * c.dim:] += torch.eye(c.dim)
else:
    with torch.no_grad():  # fc starts as "take the feature": x begins as the target's own hidden state
        head.fc.weight[:, c.dim:] += torch.eye(c.dim)
    target_norm = torch.nn.RMSNorm(c.dim, eps=c.norm_eps, elementwise_affine=True)
    target_norm.weight = torch.nn.Parameter(w["output_norm.weight"], requires_grad=False)
embd = torch.nn.Embedding.from_pretrained(w["token_embd.weight"])  # frozen: the engine feeds the target's
nparam = sum(p.numel() for p in head.parameters())
print(f"{a.kind} head: {nparam / 1e6:.2f}M params", flush=True)
opt = torch.optim.AdamW(head.parameters(), lr=a.lr, betas=(0.9, 0.95), weight_decay=0.0)


def make_batch(seqs):
    T = max(len(s["ids"]) for s in seqs)
    B = len(seqs)
    x = torch.zeros(B, T, dtype=torch.long)
    feat = torch.zeros(B, T, (3 if a.kind == "eagle3" else 1) * c.dim)
    hfin = torch.zeros(B, T, c.dim)
    K = seqs[0]["top_ids"].shape[1]
    top_ids = torch.zeros(B, T, K, dtype=torch.long)
    top_p = torch.zeros(B, T, K)
    valid = torch.zeros(B, T, dtype=torch.bool)
    for b, s in enumerate(seqs):
        n = len(s["ids"])
        x[b, :n] = s["ids"]; hfin[b, :n] = s["hfin"].float()
        feat[b, :n] = s["feat"].float() if a.kind == "eagle3" else hfin[b, :n]
        top_ids[b, :n] = s["top_ids"].long(); top_p[b, :n] = s["top_logp"].float().exp()
        valid[b, :n] = True
        valid[b, :max(0, s["n_prompt"] - 2)] = False  # score the reply (and the turn's last prompt tokens) only
    return x, feat, hfin, top_ids, top_p, valid


def run(x, feat, hfin, top_ids, top_p, valid, train_mode=True):
    B, T = x.shape
    Th = T - 1
    base = torch.arange(Th)
    cache, losses, accs = [], [], []
    g = None
    for k in range(a.ttt_steps):
        n = Th - k
        tok = torch.zeros(B, Th, dtype=torch.long)
        tok[:, :n] = x[:, 1 + k:1 + k + n]
        emb = embd(tok)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=a.bf16):
            if a.kind == "eagle3":
                if k == 0:
                    g = head.fc(feat[:, :Th])
                out, logits = head.step(emb, g, k, cache, base)
            else:
                if k == 0:
                    g = feat[:, :Th]
                    if train_mode:
                        g = g + (torch.rand_like(g) * 0.2 - 0.1) * g.pow(2).mean(-1, keepdim=True).sqrt()
                out = head.step(emb, g, k, cache, base)
                logits = target_norm(out) @ embd.weight.T
        lq = F.log_softmax(logits[:, :n].float(), -1)
        ids = top_ids[:, 1 + k:1 + k + n]
        p = top_p[:, 1 + k:1 + k + n]
        d = t2d[ids]
        m = valid[:, 1 + k:1 + k + n]
        ce = -(p * (d >= 0) * lq.gather(-1, d.clamp(min=0))).sum(-1)
        loss = (ce * m).sum() / m.sum().clamp(min=1)
        if a.kind == "eagle1":
            # In units of the target state's RMS: SmolLM2's final hidden states are large, and a raw
            # smooth L1 (~80 at the start) drowned the cross-entropy that drafting depends on.
            want = hfin[:, 1 + k:1 + k + n]
            rms = want.pow(2).mean(-1, keepdim=True).sqrt().clamp(min=1e-3)
            reg = F.smooth_l1_loss(out[:, :n].float() / rms, want / rms, reduction="none").mean(-1)
            loss = (reg * m).sum() / m.sum().clamp(min=1) + 0.1 * loss
        losses.append((0.8 ** k) * loss)
        agree = (d2t[lq.argmax(-1)] == ids[..., 0]) & m
        accs.append(agree.sum().item() / max(1, m.sum().item()))
        g = out
    return sum(losses), accs


def save(step):
    ck = {"config": c.__dict__, "state_dict": head.state_dict(), "target_hidden_size": c.dim, "step": step, "args": vars(a)}
    if a.kind == "eagle3":
        ck.update({"target_layers": layers, "d2t": d2t, "vocab_coverage": coverage})
    torch.save(ck, a.out + ".tmp")
    os.replace(a.out + ".tmp", a.out)


log = open(a.log, "a")
log.write(json.dumps({"event": "start", "model": a.name, "params": nparam, "args": vars(a), "coverage": coverage}) + "\n")
g = torch.Generator().manual_seed(a.seed)
t0 = time.time()
step, epoch = 0, 0
while step < a.max_steps and time.time() - t0 < a.minutes * 60:
    perm = torch.randperm(len(train), generator=g).tolist()
    for i in range(0, len(perm) - a.batch + 1, a.batch):
        el = time.time() - t0
        if el >= a.minutes * 60 or step >= a.max_steps:
            break
        lr = wallclock_cosine_lr(a.lr, a.warmup, el / (a.minutes * 60), step)
        for gr in opt.param_groups:
            gr["lr"] = lr
        loss, accs = run(*make_batch([train[j] for j in perm[i:i + a.batch]]))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        gn = torch.nn.utils.clip_grad_norm_(head.parameters(), 1.0)
        opt.step()
        step += 1
        rec = {"model": a.name, "step": step, "epoch": epoch, "loss": round(loss.item(), 4),
               "top1_agree_by_step": [round(v, 4) for v in accs], "lr": lr, "grad_norm": round(gn.item(), 3),
               "elapsed_s": round(time.time() - t0, 1)}
        log.write(json.dumps(rec) + "\n"); log.flush()
        if step % 5 == 0:
            print(rec, flush=True)
        if step % a.save_every == 0:
            save(step)
    epoch += 1
save(step)
log.write(json.dumps({"event": "done", "model": a.name, "steps": step, "elapsed_s": time.time() - t0}) + "\n")
print("done", step, "steps", time.time() - t0)
