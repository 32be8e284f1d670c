#!/usr/bin/env python3
"""Train a llama-architecture LM (model.Llama) on CPU: the bundled family's target or draft, or a
draft distilled for a real target.

  --work DIR --name target|draft   the bundled family (model.CONFIGS[name]) on its token streams
      (DIR/train.bin, heldout.bin): cross-entropy on the next token; --steps optimizer steps, cosine
      by step to --min_lr_frac; held-out loss every --eval_every steps; writes DIR/<name>.pt. A fixed
      seed and step count make it reproducible (up to bf16/BLAS reduction order).
  --feats F --model GGUF --out draft.pt   a draft for a real target (SmolLM2-135M-Instruct), distilled
      from the target's own replies (target_features.py outputs: token ids and the target's top-k
      next-token distributions). The draft has the target's tokenizer and vocabulary, so specula
      (`--draft`) and llama.cpp (`llama-speculative-simple -md`) both run it. Its cost is dominated
      by the tied embedding / LM head (vocabulary x --dim), so --dim stays small; the embedding
      starts as the target's projected onto its top --dim right singular vectors (the subspace the
      target's own tied head reads most), a start a short CPU budget cannot get from random
      weights. Loss: soft cross-entropy against the target's top-k distribution at every position
      (prompt positions weighted --prompt_weight: the draft needs the chat context, but only ever
      proposes replies). A --minutes wall-clock budget, cosine over it; every --val_every steps,
      greedy top-1 agreement with the target on the replies of a held-back twentieth of the
      training sequences; the checkpoint kept is the best by that figure.
  train_lm.py --work DIR --name target --steps 1250 --log LOG [--bf16]
  train_lm.py --feats feats.pt [--feats more.pt] --model GGUF --out draft.pt --log LOG --minutes 40"""
import argparse, json, os, sys, time
import numpy as np
import torch
import torch.nn.functional as F
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from model import CONFIGS, ROPE_BASE, Llama, LlamaConfig, load_gguf_tensors
from schedule import optimizer_step, step_cosine_lr, wallclock_cosine_lr


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--work", help="the bundled family's work directory (train.bin, heldout.bin)")
    ap.add_argument("--name", choices=list(CONFIGS), help="--work: which of the family's LMs")
    ap.add_argument("--feats", action="append", help="target_features.py outputs (repeatable)")
    ap.add_argument("--model", help="--feats: the target GGUF (its token embedding seeds the draft's)")
    ap.add_argument("--out", help="--feats: the checkpoint to write")
    ap.add_argument("--log", required=True)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--lr", type=float, default=1.5e-3)
    ap.add_argument("--warmup", type=int, default=60)
    ap.add_argument("--wd", type=float, default=0.1)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--bf16", action="store_true",
                    help="bf16 autocast for the matmuls: several times faster on CPUs with AMX or AVX-512 BF16, emulated (slow) elsewhere")
    ap.add_argument("--steps", type=int, help="--work: optimizer steps")
    ap.add_argument("--seq", type=int, default=512, help="--work: tokens per training window")
    ap.add_argument("--min_lr_frac", type=float, default=0.1, help="--work: the cosine's floor, a fraction of --lr")
    ap.add_argument("--eval_every", type=int, default=200, help="--work: steps between held-out evaluations")
    ap.add_argument("--bench", type=int, default=0, help="--work: only time N steps")
    ap.add_argument("--dim", type=int, default=128, help="--feats: the draft's width")
    ap.add_argument("--layers", type=int, default=4, help="--feats: its layers")
    ap.add_argument("--heads", type=int, default=4, help="--feats: its query heads")
    ap.add_argument("--kv_heads", type=int, default=2, help="--feats: its KV heads")
    ap.add_argument("--ffn", type=int, default=512, help="--feats: its FFN width")
    ap.add_argument("--prompt_weight", type=float, default=0.3, help="--feats: loss weight of prompt positions")
    ap.add_argument("--minutes", type=float, default=40.0, help="--feats: wall-clock budget; the cosine schedule spans it")
    ap.add_argument("--val_every", type=int, default=100, help="--feats: steps between validations")
    a = ap.parse_args()
    if bool(a.work) == bool(a.feats):
        ap.error("give the bundled family's --work DIR or a real target's --feats files, one of them")
    if a.work and (a.name is None or a.steps is None):
        ap.error("--work needs --name and --steps")
    if a.feats and (not a.model or not a.out):
        ap.error("--feats needs --model and --out")
    return a


def adamw(a, model, no_decay=()):
    """AdamW with weight decay on the matrices only (and not on the parameters named in no_decay)."""
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2 and n not in no_decay]
    rest = [p for n, p in model.named_parameters() if p.dim() < 2 or n in no_decay]
    return torch.optim.AdamW([{"params": decay, "weight_decay": a.wd}, {"params": rest, "weight_decay": 0.0}],
                             lr=a.lr, betas=(0.9, 0.95), eps=1e-8)


def train_family_lm(a, log):
    rng = np.random.default_rng(a.seed)
    train = np.memmap(os.path.join(a.work, "train.bin"), dtype=np.uint16, mode="r")
    held = np.memmap(os.path.join(a.work, "heldout.bin"), dtype=np.uint16, mode="r")
    c = CONFIGS[a.name]
    model = Llama(c)
    nparam = sum(p.numel() for p in model.parameters())
    print(f"{a.name}: {nparam/1e6:.2f}M params", flush=True)
    opt = adamw(a, model)

    def batch(data, r, B, T):
        ix = r.integers(0, len(data) - T - 1, size=B)
        x = np.stack([data[i:i + T + 1].astype(np.int64) for i in ix])
        return torch.from_numpy(x[:, :-1]), torch.from_numpy(x[:, 1:])

    er = np.random.default_rng(999)
    evals = [batch(held, er, 4, a.seq) for _ in range(4)]  # the same held-out windows every time

    def evaluate():
        model.eval()
        tot, n = 0.0, 0
        with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=a.bf16):
            for x, y in evals:
                lg, _, _ = model(x)
                tot += F.cross_entropy(lg.float().reshape(-1, lg.size(-1)), y.reshape(-1), reduction="sum").item()
                n += y.numel()
        model.train()
        return tot / n

    log.write(json.dumps({"event": "start", "model": a.name, "params": nparam, "config": c.__dict__, "args": vars(a)}) + "\n")
    t0 = time.time()
    steps = a.bench or a.steps
    for s in range(steps):
        lr = step_cosine_lr(a.lr, a.warmup, a.steps, s, a.min_lr_frac)
        for g in opt.param_groups:
            g["lr"] = lr
        x, y = batch(train, rng, a.batch, a.seq)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=a.bf16):
            lg, _, _ = model(x)
        loss = F.cross_entropy(lg.float().reshape(-1, lg.size(-1)), y.reshape(-1))
        gn = optimizer_step(opt, model, loss)
        el = time.time() - t0
        rec = {"model": a.name, "step": s + 1, "loss": round(loss.item(), 4), "lr": lr, "grad_norm": round(gn.item(), 3),
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


def distil_draft_lm(a, log):
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
    opt = adamw(a, model, no_decay={"tok_embd.weight"})

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
        ck = {"config": c.__dict__, "state_dict": model.state_dict(), "step": step, "val_top1_agree": val_agree, "args": vars(a)}
        torch.save(ck, a.out + ".tmp")
        os.replace(a.out + ".tmp", a.out)

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
            gn = optimizer_step(opt, model, loss)
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


def main():
    a = parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)
    with open(a.log, "a") as log:
        (train_family_lm if a.work else distil_draft_lm)(a, log)


if __name__ == "__main__":
    main()
