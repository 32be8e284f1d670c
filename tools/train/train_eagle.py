#!/usr/bin/env python3
"""Train an EAGLE-3 or EAGLE-1 head (model.Eagle3Head, model.Eagle1Head) on a frozen target.

Two targets, one training-time test:
  --work DIR   the bundled family's target (DIR/target.pt) on its token streams (DIR/train.bin,
               heldout.bin): the target's features and full next-token distributions computed on
               the fly; --steps optimizer steps, cosine by step; held-out loss and agreement every
               --eval_every steps; the head is written to DIR/<kind>.pt.
  --feats F    a real target (SmolLM2-135M-Instruct, Gemma 3 270M) on its own replies: features and
               top-k distributions precomputed by target_features.py (repeatable), --model its GGUF
               (token embedding, output norm); a --minutes wall-clock budget, cosine over it, or
               --steps optimizer steps, cosine by step (the same run on any machine; --minutes then
               only caps the time); a checkpoint every --save_every steps to --out, so a run cut
               short still yields a head; --resume OUT continues it (head, optimizer, draft
               vocabulary, data order, elapsed time): a larger --minutes or --steps and more --feats
               files extend a run across days;
               --init GGUF starts from a head export_gguf.py wrote (the shipped models/*.gguf: its
               weights and draft vocabulary, a new optimizer and cosine) when its checkpoint is gone,
               --init OUT from a checkpoint; --init_new_vocab then re-chooses the draft vocabulary
               from this run's replies (new data whose tokens the head's vocabulary misses),
               --init_grow_vocab keeps the head's vocabulary and adds this run's most frequent
               other reply tokens up to --vocab (new data, every trained row kept);
               --init_grow_ffn with a larger --ffn widens the head's FFN by units whose output
               columns start at zero, so the wider head starts as the --init head's function.
               EAGLE-3 drafts over a compact vocabulary (d2t): the --vocab most frequent target
               tokens of the replies (ties: lower id), in id order; its lm_head starts from those
               rows of the target's lm_head (its tied embedding, or its own output.weight) and fc
               as "take the high tap".
EAGLE-3: g = fc(the inputs of the target layers it taps); loss: soft cross-entropy against the
  target's next-token distribution (--feats: its top-k, restricted to the draft vocabulary).
EAGLE-1: the feature is the target's final pre-norm hidden state, with uniform noise (+-0.1 RMS)
  in training; the head predicts the next one; its logits are the target's own output norm and
  lm_head (frozen). Loss, as EAGLE-1: smooth L1 to the target's next state (--feats: in units of
  its RMS) + 0.1 x that soft cross-entropy.
Training-time test: --ttt_steps self-fed steps; step 0 reads the target's features, step k the
head's own previous output; step k at head index t reads token x[t+1+k] and is scored (weight
0.8^k) on the target's next-token distribution at t+1+k. The token embedding is the target's.
  train_eagle.py --work DIR --kind eagle3 --steps 160 --log LOG [--bf16]
  train_eagle.py [--kind eagle1] --feats feats.pt [--feats more.pt] --model GGUF --out head.pt --log LOG --minutes 35
  train_eagle.py --feats feats.pt --feats newer.pt --model GGUF --out head.pt --log LOG --minutes 80 --resume head.pt
  train_eagle.py --feats feats.pt --model GGUF --out head.pt --log LOG --minutes 60 --init models/smollm2-eagle3.gguf
  train_eagle.py --feats feats.pt --model GGUF --out head.pt --log LOG --steps 6000"""
import argparse, json, math, os, sys, time
import numpy as np
import torch
import torch.nn.functional as F
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from draft_vocab_coverage import read_draft_vocab
from feats_files import weighted_feats
from model import ROPE_BASE, Eagle1Head, Eagle3Head, LlamaConfig, load_gguf_tensors, load_llama
from schedule import budget_cosine_lr, optimizer_step, step_cosine_lr


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--kind", choices=["eagle3", "eagle1"], default="eagle3")
    ap.add_argument("--work", help="the bundled family's work directory (target.pt, train.bin, heldout.bin)")
    ap.add_argument("--feats", action="append", help="target_features.py outputs (repeatable: greedy and sampled replies); "
                                                     "FILE:N counts FILE's sequences N times (read once)")
    ap.add_argument("--model", help="--feats: the target GGUF (token embedding, output norm and lm_head rows for init)")
    ap.add_argument("--out", help="--feats: the checkpoint to write")
    ap.add_argument("--log", required=True)
    ap.add_argument("--name", default=None, help="the model name in the log (default: --kind with --work, the --out file's stem with --feats)")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--ttt_steps", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--seed", type=int, default=4321)
    ap.add_argument("--bf16", action="store_true",
                    help="bf16 autocast for the matmuls: several times faster on CPUs with AMX or AVX-512 BF16, emulated (slow) elsewhere")
    ap.add_argument("--steps", type=int, help="optimizer steps, the cosine over them (--work: required; --feats: instead of a "
                                              "wall-clock cosine over --minutes, which then only caps the time)")
    ap.add_argument("--seq", type=int, default=512, help="--work: tokens per training window")
    ap.add_argument("--target_layers", default="1,3,5", help="--work, EAGLE-3: the target layers whose inputs the head reads")
    ap.add_argument("--eval_every", type=int, default=100, help="steps between held-out evaluations (--work; --feats with --heldout)")
    ap.add_argument("--heldout", help="--feats: target_features.py's output for held-out prompts (--split heldout): the head's "
                                      "agreement on it at the start, every --eval_every steps and at the end, in the log")
    ap.add_argument("--vocab", type=int, default=8192, help="--feats, EAGLE-3: the draft vocabulary's size")
    ap.add_argument("--vocab_file", help="--feats, EAGLE-3: the draft vocabulary a `specula draft-vocab` file lists (counted on "
                                         "a corpus far larger than the replies) instead of the --vocab most frequent reply tokens")
    ap.add_argument("--heads", type=int, default=0, help="--feats: query heads of the head's attention (0: the target's)")
    ap.add_argument("--kv_heads", type=int, default=0, help="--feats: its KV heads (0: the target's)")
    ap.add_argument("--ffn", type=int, default=0, help="--feats: its FFN width (0: the target's)")
    ap.add_argument("--minutes", type=float, default=None,
                    help="--feats: the run's wall-clock budget, minutes already trained included (with --resume); the cosine "
                         "spans it unless --steps is given (default 35, or no limit with --steps)")
    ap.add_argument("--resume", help="--feats: a checkpoint this trainer wrote (--out): its head, optimizer, draft vocabulary, "
                                     "step and elapsed time; more --feats files and a larger --minutes extend the run")
    ap.add_argument("--init", help="--feats: start from this head GGUF (export_gguf.py's) or checkpoint (--out): its weights and "
                                   "draft vocabulary, a new optimizer and schedule")
    ap.add_argument("--init_new_vocab", action="store_true",
                    help="with --init: the draft vocabulary chosen from this run's replies (--vocab tokens), not the head's; "
                         "the rows of tokens both have keep their weights, new rows start at zero")
    ap.add_argument("--init_grow_vocab", action="store_true",
                    help="with --init: the head's draft vocabulary plus this run's most frequent other reply tokens, "
                         "--vocab in all; every trained row keeps its weights, new rows start at zero")
    ap.add_argument("--init_grow_ffn", action="store_true",
                    help="with --init and a --ffn wider than the head's: new FFN units with gate and up rows drawn like a "
                         "fresh head's and down columns at zero (the wider head computes what --init's did)")
    ap.add_argument("--max_steps", type=int, default=100000, help="--feats with a wall-clock cosine: at most this many steps")
    ap.add_argument("--save_every", type=int, default=25, help="--feats: steps between checkpoints")
    a = ap.parse_args()
    if bool(a.work) == bool(a.feats):
        ap.error("give the bundled family's --work DIR or a real target's --feats files, one of them")
    if a.work and a.steps is None:
        ap.error("--work needs --steps")
    if a.feats and (not a.model or not a.out):
        ap.error("--feats needs --model and --out")
    if a.resume and not a.feats:
        ap.error("--resume continues a --feats run")
    if a.init and (not a.feats or a.resume):
        ap.error("--init starts a --feats run (not with --resume)")
    if (a.init_new_vocab or a.init_grow_vocab) and (not a.init or a.kind != "eagle3"):
        ap.error("--init_new_vocab and --init_grow_vocab re-choose an EAGLE-3 --init head's draft vocabulary")
    if a.init_new_vocab and a.init_grow_vocab:
        ap.error("--init_new_vocab or --init_grow_vocab, not both")
    if a.vocab_file and (a.init or a.resume or a.kind != "eagle3" or not a.feats):
        ap.error("--vocab_file chooses a new EAGLE-3 --feats head's draft vocabulary (an --init or --resume head has its own)")
    if a.init_grow_ffn and (not a.init or not a.ffn):
        ap.error("--init_grow_ffn widens an --init head's FFN to --ffn units: give both")
    if a.work and a.minutes is not None:
        ap.error("--minutes budgets a --feats run; --work runs --steps")
    if a.feats and a.steps is not None and a.max_steps != ap.get_default("max_steps"):
        ap.error("--max_steps caps a wall-clock run; with --steps the run is --steps long")
    if a.feats:
        a.max_steps = a.steps if a.steps is not None else a.max_steps
        if a.minutes is None and a.steps is None:
            a.minutes = 35.0
    a.name = a.name or (a.kind if a.work else os.path.splitext(os.path.basename(a.out))[0])
    return a


def unrolled_loss(a, head, x, feat, embed, target_head, score, train_mode=True, lo=0):
    """The training-time test over one batch of token ids x [B, T]: returns (loss, agreement per step).
    feat [B, T, .]: the target's features; embed(tok): the target's token embedding; target_head(out):
    EAGLE-1's logits; score(k, lo, n, lq, out): step k's loss and agreement from its log-probabilities
    lq [B, n - lo, vocab] and predicted states out [B, n - lo, dim] of head indices lo..n-1 (n = valid
    head indices of the step). lo: the first head index any step scores (a batch's prompts are not
    scored): step 0 still keys every position, the rest of every step runs from lo on."""
    B, T = x.shape
    Th = T - 1  # head index t reads token x[t+1]
    base = torch.arange(Th)
    cache, losses, accs = [], [], []
    g = None
    for k in range(a.ttt_steps):
        n = Th - k  # valid head indices: t + 1 + k <= T - 1
        tok = torch.zeros(B, Th, dtype=torch.long)
        tok[:, :n] = x[:, 1 + k:1 + k + n]
        emb = embed(tok if k == 0 else tok[:, lo:])
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=a.bf16):
            if a.kind == "eagle3":
                if k == 0:
                    g = head.fc(feat[:, :Th])
                out, logits = head.step(emb, g, k, cache, base, lo)
            else:
                if k == 0:
                    g = feat[:, :Th]
                    if train_mode:
                        g = g + (torch.rand_like(g) * 0.2 - 0.1) * g.pow(2).mean(-1, keepdim=True).sqrt()
                out = head.step(emb, g, k, cache, base, lo)
                logits = target_head(out)
        lq = F.log_softmax(logits[:, :n - lo].float(), -1)
        loss, agree = score(k, lo, n, lq, out[:, :n - lo].float())
        losses.append((0.8 ** k) * loss)
        accs.append(agree)
        g = out
    return sum(losses), accs


def optimizer(a, head):
    return torch.optim.AdamW(head.parameters(), lr=a.lr, betas=(0.9, 0.95), weight_decay=0.0)


def train_on_family(a, log):
    """The bundled family: the PyTorch target computes features and distributions per batch."""
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
    opt = optimizer(a, head)

    def batch(data, r, B, T):
        ix = r.integers(0, len(data) - T, size=B)
        return torch.from_numpy(np.stack([data[i:i + T].astype(np.int64) for i in ix]))

    def run(x, train_mode=True):
        with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=a.bf16):
            logits, hfin, caps = tgt(x, capture_layers=set(layers) if a.kind == "eagle3" else None)
        p = F.log_softmax(logits.float(), -1).exp()
        hfin = hfin.float()
        feat = torch.cat([caps[l].float() for l in layers], -1) if a.kind == "eagle3" else hfin

        def score(k, lo, n, lq, out):
            tp = p[:, 1 + k + lo:1 + k + n]
            ce = -(tp * lq).sum(-1).mean()
            loss = ce if a.kind == "eagle3" else F.smooth_l1_loss(out, hfin[:, 1 + k + lo:1 + k + n]) + 0.1 * ce
            return loss, (lq.argmax(-1) == tp.argmax(-1)).float().mean().item()

        return unrolled_loss(a, head, x, feat, lambda tok: tgt.tok_embd(tok).float(), lambda out: tgt.lm_head(tgt.norm(out)),
                             score, train_mode)

    er = np.random.default_rng(999)
    evals = [batch(held, er, 4, a.seq) for _ in range(2)]

    def evaluate():
        head.eval()
        with torch.no_grad():
            res = [run(x, train_mode=False) for x in evals]
        head.train()
        return (round(sum(r[0].item() for r in res) / len(res), 4),
                [round(sum(r[1][k] for r in res) / len(res), 4) for k in range(a.ttt_steps)])

    log.write(json.dumps({"event": "start", "model": a.name, "params": nparam, "args": vars(a)}) + "\n")
    t0 = time.time()
    for s in range(a.steps):
        lr = step_cosine_lr(a.lr, a.warmup, a.steps, s)
        for gr in opt.param_groups:
            gr["lr"] = lr
        loss, accs = run(batch(train, rng, a.batch, a.seq))
        gn = optimizer_step(opt, head, loss)
        rec = {"model": a.name, "step": s + 1, "loss": round(loss.item(), 4), "top1_agree_by_step": [round(v, 4) for v in accs],
               "lr": lr, "grad_norm": round(gn.item(), 3), "tokens": (s + 1) * a.batch * a.seq, "elapsed_s": round(time.time() - t0, 1)}
        if (s + 1) % a.eval_every == 0 or s + 1 == a.steps:
            rec["heldout_loss"], rec["heldout_top1_agree_by_step"] = evaluate()
        log.write(json.dumps(rec) + "\n"); log.flush()
        if (s + 1) % 10 == 0 or "heldout_loss" in rec:
            print(rec, flush=True)
    ck = {"config": c.__dict__, "state_dict": head.state_dict(), "args": vars(a), "target_hidden_size": c.dim}
    if a.kind == "eagle3":
        ck["target_layers"] = layers
    torch.save(ck, os.path.join(a.work, f"{a.kind}.pt"))
    log.write(json.dumps({"event": "done", "model": a.name, "elapsed_s": time.time() - t0}) + "\n")
    print("done", time.time() - t0)


def load_checkpoint(a, flag, path, layers, needs=("kind",)):
    """A checkpoint this trainer wrote, checked against this run: the keys `needs` names, same
    kind and, for EAGLE-3, the same target layers."""
    ck = torch.load(path)
    if not isinstance(ck, dict) or "state_dict" not in ck:
        sys.exit(f"train_eagle: error: {flag} {path}: not a checkpoint of this trainer")
    missing = [k for k in needs if k not in ck]
    if missing:
        sys.exit(f"train_eagle: error: {flag} {path}: written without {', '.join(missing)} (a checkpoint for export only); start a new run")
    if ck["kind"] != a.kind:
        sys.exit(f"train_eagle: error: {flag} {path} is an {ck['kind']} head, not {a.kind}")
    if a.kind == "eagle3" and list(ck["target_layers"]) != list(layers):
        sys.exit(f"train_eagle: error: {flag} {path} reads target layers {ck['target_layers']}, the --feats files {layers}")
    return ck


def load_resume(a, layers):
    """The checkpoint --resume names, with the optimizer state that continuing needs (checkpoints
    without it are for export only)."""
    if not os.path.exists(a.resume):
        sys.exit(f"train_eagle: error: --resume {a.resume}: no such file")
    return load_checkpoint(a, "--resume", a.resume, layers, needs=("kind", "optimizer", "epoch", "elapsed_s", "generator", "config"))


# export_gguf.py's tensor names -> the heads' parameter names
GGUF_TO_HEAD = {"fc.weight": "fc.weight", "blk.0.attn_norm.weight": "attn_norm.weight", "blk.0.attn_norm_2.weight": "attn_norm_2.weight",
                "blk.0.attn_q.weight": "attn.wq.weight", "blk.0.attn_k.weight": "attn.wk.weight", "blk.0.attn_v.weight": "attn.wv.weight",
                "blk.0.attn_output.weight": "attn.wo.weight", "blk.0.ffn_norm.weight": "ffn_norm.weight",
                "blk.0.ffn_gate.weight": "mlp.w_gate.weight", "blk.0.ffn_up.weight": "mlp.w_up.weight",
                "blk.0.ffn_down.weight": "mlp.w_down.weight", "output_norm.weight": "norm.weight", "output.weight": "output.weight"}


def load_init(a, layers):
    """The head --init names, a GGUF (weights dequantized, as PyTorch's parameter names; d2t) or a
    checkpoint of this trainer, checked against this run: same kind and, for EAGLE-3, the same
    target layers."""
    import gguf
    from model import dequantized
    if not os.path.exists(a.init):
        sys.exit(f"train_eagle: error: --init {a.init}: no such file")
    with open(a.init, "rb") as f:
        is_gguf = f.read(4) == b"GGUF"
    if not is_gguf:
        ck = load_checkpoint(a, "--init", a.init, layers)
        return {"state_dict": ck["state_dict"], **({"d2t": ck["d2t"]} if "d2t" in ck else {})}
    r = gguf.GGUFReader(a.init)
    arch = r.fields["general.architecture"].contents()
    want = {"eagle3": "eagle3", "eagle1": "specula-eagle1"}[a.kind]
    if arch != want:
        sys.exit(f"train_eagle: error: --init {a.init} is a {arch} file, not {want}")
    if a.kind == "eagle3" and list(r.fields["eagle3.target_layers"].contents()) != list(layers):
        sys.exit(f"train_eagle: error: --init {a.init} reads target layers {r.fields['eagle3.target_layers'].contents()}, "
                 f"the --feats files {layers}")
    tensors = {t.name: t for t in r.tensors}
    init = {"state_dict": {GGUF_TO_HEAD[n]: dequantized(t) for n, t in tensors.items() if n in GGUF_TO_HEAD}}
    if "d2t" in tensors:
        init["d2t"] = torch.from_numpy(np.array(tensors["d2t"].data, dtype=np.int64))
    return init


def grown_ffn(state, head, init_path):
    """The --init head's weights with its FFN widened to the new head's: each new unit's gate and up
    rows are the new head's own (drawn as a fresh head's), its down column zero, so the unit adds
    nothing until training moves that column and the wider head starts as the old one's function."""
    old_ffn, new_ffn = state["mlp.w_gate.weight"].shape[0], head.mlp.w_gate.weight.shape[0]
    if new_ffn <= old_ffn:
        sys.exit(f"train_eagle: error: --init_grow_ffn: --ffn {new_ffn} is not wider than {init_path}'s {old_ffn} units")
    fresh = head.state_dict()
    state = dict(state)
    for name in ("mlp.w_gate.weight", "mlp.w_up.weight"):
        state[name] = torch.cat([state[name].to(fresh[name].dtype), fresh[name][old_ffn:]], 0)
    down = state["mlp.w_down.weight"]
    state["mlp.w_down.weight"] = torch.cat([down.to(fresh["mlp.w_down.weight"].dtype), torch.zeros(down.shape[0], new_ffn - old_ffn)], 1)
    print(f"FFN widened from {old_ffn} to {new_ffn} units ({init_path}'s function kept)", flush=True)
    return state


def read_features(a):
    """The --feats files (memory-mapped: the features stay in the page cache, shared by runs side by
    side on the same files), checked to be of the same layers: (their first file, the layers, the
    training sequences with their weights' repeats, each reply token's count over them)."""
    try:
        files = weighted_feats(a.feats)
    except ValueError as e:
        sys.exit(f"train_eagle: error: {e}")
    parts = [(torch.load(f, mmap=True), w) for f, w in files]
    data = parts[0][0]
    layers = data["layers"]
    if any(p["layers"] != layers for p, _ in parts):
        sys.exit("train_eagle: error: the --feats files were extracted at different layers")
    train = [s for p, w in parts for s in p["seqs"] if s["split"] == "train" for _ in range(w)]
    counts = torch.zeros(data["config"]["vocab_size"], dtype=torch.long)
    for s in train:
        counts.index_add_(0, s["ids"][s["n_prompt"]:], torch.ones(len(s["ids"]) - s["n_prompt"], dtype=torch.long))
    return data, layers, train, counts


def draft_vocabulary(a, counts, init, resumed):
    """The draft vocabulary d2t (target ids, ascending), a.vocab set to its size: the --init head's
    (grown by --init_grow_vocab, re-chosen by --init_new_vocab), the resumed run's, --vocab_file's,
    or the --vocab most frequent reply tokens."""
    def by_count():  # reply tokens, most frequent first (ties: lower id)
        return sorted(range(len(counts)), key=lambda i: (-int(counts[i]), i))
    chosen_here = a.init_grow_vocab or not ((init is not None and "d2t" in init) or (resumed is not None and "d2t" in resumed))
    if chosen_here and a.vocab > len(counts):
        sys.exit(f"train_eagle: error: --vocab {a.vocab} is larger than the target's vocabulary ({len(counts)} tokens)")
    if init is not None and "d2t" in init and a.init_grow_vocab:
        kept = set(int(t) for t in init["d2t"])
        if a.vocab < len(kept):
            sys.exit(f"train_eagle: error: --init_grow_vocab: --vocab {a.vocab} is smaller than the head's {len(kept)} tokens")
        others = [i for i in by_count() if i not in kept]
        return torch.tensor(sorted(kept | set(others[:a.vocab - len(kept)])))
    if init is not None and "d2t" in init and not a.init_new_vocab:
        d2t = init["d2t"]
    elif resumed is not None and "d2t" in resumed:
        d2t = resumed["d2t"]  # the head's output rows belong to this vocabulary, whatever the new data's counts
    elif a.vocab_file:
        d2t = torch.tensor(sorted(read_draft_vocab(a.vocab_file)))
        if d2t[-1] >= len(counts):
            sys.exit(f"train_eagle: error: {a.vocab_file} lists id {int(d2t[-1])}, beyond the target's {len(counts)} tokens")
    else:
        return torch.tensor(sorted(by_count()[:a.vocab]))
    a.vocab = len(d2t)
    return d2t


def head_config(a, target_config):
    """The head's shape: the target's width over the draft vocabulary, one layer, --heads, --kv_heads
    and --ffn where given."""
    c = LlamaConfig(**{**target_config, "vocab_size": a.vocab, "n_layers": 1})
    c.n_heads, c.n_kv_heads, c.ffn_dim = a.heads or c.n_heads, a.kv_heads or c.n_kv_heads, a.ffn or c.ffn_dim
    if c.dim % c.n_heads or c.n_heads % c.n_kv_heads or (c.dim // c.n_heads) % 16:
        sys.exit(f"train_eagle: error: width {c.dim} with {c.n_heads} heads / {c.n_kv_heads} KV heads: the head size must be "
                 "a whole multiple of 16 and the heads a multiple of the KV heads")
    return c


def target_tensors(model, tied):
    """The target's tensors a head starts from and reads: token embedding, output norm, and its
    lm_head as "output.weight" (the token embedding again when tied, as SmolLM2's; Qwen2.5-Coder-1.5B
    has its own)."""
    w = load_gguf_tensors(model, ["token_embd.weight", "output_norm.weight"] + ([] if tied else ["output.weight"]))
    if tied:
        w["output.weight"] = w["token_embd.weight"]
    return w


def new_head(a, c, layers, w, d2t):
    """A fresh head started from the target's tensors w, and for EAGLE-1 the target's frozen output
    norm (None for EAGLE-3)."""
    head = Eagle3Head(c, layers) if a.kind == "eagle3" else Eagle1Head(c)
    for mod in head.modules():
        if isinstance(mod, torch.nn.Linear):
            torch.nn.init.normal_(mod.weight, std=0.02)
    if a.kind == "eagle3":
        with torch.no_grad():  # lm_head and final norm start from the target's (rows of the draft vocabulary)
            head.output.weight.copy_(w["output.weight"][d2t])
            head.norm.weight.copy_(w["output_norm.weight"])
            # fc starts as "take the high tap": g begins in the target's own hidden space (a short CPU
            # budget gets far less out of a random fc)
            head.fc.weight[:, 2 * c.dim:] += torch.eye(c.dim)
        return head, None
    with torch.no_grad():  # fc starts as "take the feature": x begins as the target's own hidden state
        head.fc.weight[:, c.dim:] += torch.eye(c.dim)
    target_norm = torch.nn.RMSNorm(c.dim, eps=c.norm_eps, elementwise_affine=True)
    target_norm.weight = torch.nn.Parameter(w["output_norm.weight"], requires_grad=False)
    return head, target_norm


def load_init_weights(a, head, c, init, d2t):
    """The --init head's weights into head: its output rows carried to a re-chosen or grown draft
    vocabulary, its FFN widened by --init_grow_ffn."""
    if (a.init_new_vocab or a.init_grow_vocab) and "d2t" in init:  # carry the trained rows of the tokens both vocabularies have
        old_row = {int(t): i for i, t in enumerate(init["d2t"])}
        # New rows start at zero, not from the target's embedding: the trained rows have left the
        # embedding's directions, and copied rows would take the argmax from them before any step.
        out = torch.zeros_like(head.output.weight.detach())
        kept = [(j, old_row[int(t)]) for j, t in enumerate(d2t) if int(t) in old_row]
        out[[j for j, _ in kept]] = init["state_dict"]["output.weight"][[i for _, i in kept]].to(out.dtype)
        init["state_dict"] = {**init["state_dict"], "output.weight": out}
        print(f"draft vocabulary re-chosen: {len(kept)} of {a.vocab} rows kept from {a.init}", flush=True)
    if a.init_grow_ffn:
        init["state_dict"] = grown_ffn(init["state_dict"], head, a.init)
    try:
        head.load_state_dict(init["state_dict"])
    except RuntimeError as e:
        sys.exit(f"train_eagle: error: --init {a.init} does not fit a head of {c.__dict__}: {e}")
    print(f"initialized from {a.init}", flush=True)


def resume_from(a, resumed, c, head, opt, g, budget_s):
    """The resumed run's head, optimizer and data order; (step, epoch, seconds trained). Refuses a
    run whose --minutes or --steps it has already reached."""
    if resumed["config"] != c.__dict__:
        sys.exit(f"train_eagle: error: {a.resume} is a head of another shape ({resumed['config']}), not {c.__dict__}")
    head.load_state_dict(resumed["state_dict"])
    opt.load_state_dict(resumed["optimizer"])
    g.set_state(resumed["generator"])
    step, epoch, elapsed0 = resumed["step"], resumed["epoch"], resumed["elapsed_s"]
    print(f"resumed {a.resume}: step {step}, epoch {epoch}, {elapsed0 / 60:.1f} minutes trained", flush=True)
    if elapsed0 >= budget_s:
        sys.exit(f"train_eagle: error: {a.resume} has trained {elapsed0 / 60:.1f} minutes already: give a larger --minutes to extend it")
    if step >= a.max_steps:
        sys.exit(f"train_eagle: error: {a.resume} has trained {step} steps already: give a larger --steps to extend it")
    return step, epoch, elapsed0


def feature_batch(a, c, seqs):
    """target_features.py's sequences padded to the longest: (tokens, features, final hidden states,
    top-k ids, top-k probabilities, the positions scored)."""
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


def feature_loss(a, head, embd, target_norm, target_lm_head, d2t, t2d, batch, train_mode=True):
    """unrolled_loss on a feature_batch: soft cross-entropy against the target's top-k over the draft
    vocabulary (EAGLE-1: plus the smooth L1 to the target's next state); (loss, top-1 agreement by step)."""
    x, feat, hfin, top_ids, top_p, valid = batch

    def score(k, lo, n, lq, out):
        ids = top_ids[:, 1 + k + lo:1 + k + n]
        p = top_p[:, 1 + k + lo:1 + k + n]
        d = t2d[ids]
        m = valid[:, 1 + k + lo:1 + k + n]
        ce = -(p * (d >= 0) * lq.gather(-1, d.clamp(min=0))).sum(-1)
        loss = (ce * m).sum() / m.sum().clamp(min=1)
        if a.kind == "eagle1":
            # In units of the target state's RMS: SmolLM2's final hidden states are large, and a raw
            # smooth L1 (~80 at the start) drowned the cross-entropy that drafting depends on.
            want = hfin[:, 1 + k + lo:1 + k + n]
            rms = want.pow(2).mean(-1, keepdim=True).sqrt().clamp(min=1e-3)
            reg = F.smooth_l1_loss(out / rms, want / rms, reduction="none").mean(-1)
            loss = (reg * m).sum() / m.sum().clamp(min=1) + 0.1 * loss
        agree = (d2t[lq.argmax(-1)] == ids[..., 0]) & m
        return loss, agree.sum().item() / max(1, m.sum().item())

    # The first head index any step scores: step k at index t is scored at position t + 1 + k,
    # and a sequence's first scored position is its first valid one.
    first_valid = valid.float().argmax(1).min().item()
    lo = max(0, min(first_valid - a.ttt_steps, x.shape[1] - 1 - a.ttt_steps))
    return unrolled_loss(a, head, x, feat, embd, lambda out: target_norm(out) @ target_lm_head.T, score, train_mode, lo)


def evaluate_heldout(a, log, heldout, step, make_batch, run):
    """Loss and top-1 agreement by training-time-test step on the held-out sequences, weighted by
    tokens, overall and per prompt category, logged and printed."""
    if not heldout:
        return
    by_category = {}
    for s in heldout:
        by_category.setdefault(s["category"], []).append(s)
    sums = {}  # category -> [tokens, loss * tokens, agreement by step * tokens]
    with torch.no_grad():
        for cat, seqs in by_category.items():
            for i in range(0, len(seqs), 16):
                batch = make_batch(seqs[i:i + 16])
                n = batch[-1].sum().item()
                loss, accs = run(batch, train_mode=False)
                tot, loss_sum, acc_sum = sums.get(cat, (0, 0.0, [0.0] * len(accs)))
                sums[cat] = (tot + n, loss_sum + loss.item() * n, [x + n * v for x, v in zip(acc_sum, accs)])
    tot = sum(v[0] for v in sums.values())
    acc_sum = [sum(v[2][k] for v in sums.values()) for k in range(len(next(iter(sums.values()))[2]))]
    rec = {"event": "heldout", "model": a.name, "step": step, "sequences": len(heldout),
           "loss": round(sum(v[1] for v in sums.values()) / tot, 4), "top1_agree_by_step": [round(v / tot, 4) for v in acc_sum],
           "top1_agree_by_category": {c: [round(x / v[0], 4) for x in v[2]] for c, v in sorted(sums.items())}}
    log.write(json.dumps(rec) + "\n"); log.flush()
    print(rec, flush=True)


def train_on_features(a, log):
    """A real target: its features and top-k distributions read from target_features.py's files."""
    data, layers, train, counts = read_features(a)
    if a.kind == "eagle1":
        a.vocab = len(counts)  # drafts over the target's own logits
    resumed = load_resume(a, layers) if a.resume else None
    init = load_init(a, layers) if a.init else None
    d2t = draft_vocabulary(a, counts, init, resumed)
    t2d = torch.full((len(counts),), -1, dtype=torch.long)
    t2d[d2t] = torch.arange(a.vocab)
    coverage = counts[d2t].sum().item() / max(1, counts.sum().item())
    print(f"{len(train)} training sequences, {sum(len(s['ids']) for s in train)} tokens; draft vocabulary {a.vocab} covers {coverage:.4f} of reply tokens", flush=True)

    c = head_config(a, data["config"])
    ROPE_BASE[0] = c.rope_base
    w = target_tensors(a.model, data["config"]["tie_embeddings"])
    head, target_norm = new_head(a, c, layers, w, d2t)
    if init is not None:
        load_init_weights(a, head, c, init, d2t)
    embd = torch.nn.Embedding.from_pretrained(w["token_embd.weight"])  # frozen: the engine feeds the target's
    target_lm_head = w["output.weight"]  # EAGLE-1's logits: the target's own (frozen)
    nparam = sum(p.numel() for p in head.parameters())
    print(f"{a.kind} head: {nparam / 1e6:.2f}M params", flush=True)
    opt = optimizer(a, head)
    g = torch.Generator().manual_seed(a.seed)
    step, epoch, elapsed0 = 0, 0, 0.0
    budget_s = a.minutes * 60 if a.minutes is not None else math.inf  # with --steps, --minutes only caps the time
    if resumed is not None:
        step, epoch, elapsed0 = resume_from(a, resumed, c, head, opt, g, budget_s)

    def make_batch(seqs):
        return feature_batch(a, c, seqs)

    def run(batch, train_mode=True):
        return feature_loss(a, head, embd, target_norm, target_lm_head, d2t, t2d, batch, train_mode)

    heldout = [] if not a.heldout else [s for s in torch.load(a.heldout, mmap=True)["seqs"] if s["split"] == "heldout"]
    if a.heldout and not heldout:
        sys.exit(f"train_eagle: error: --heldout {a.heldout} has no held-out sequence (target_features.py --split heldout)")

    def evaluate(step):
        evaluate_heldout(a, log, heldout, step, make_batch, run)

    def save(step):
        ck = {"config": c.__dict__, "state_dict": head.state_dict(), "target_hidden_size": c.dim, "step": step, "args": vars(a),
              "kind": a.kind, "optimizer": opt.state_dict(), "epoch": epoch, "elapsed_s": elapsed0 + time.time() - t0,
              "generator": g.get_state()}
        if a.kind == "eagle3":
            ck.update({"target_layers": layers, "d2t": d2t, "vocab_coverage": coverage})
        torch.save(ck, a.out + ".tmp")
        os.replace(a.out + ".tmp", a.out)

    log.write(json.dumps({"event": "resume" if resumed is not None else "start", "model": a.name, "params": nparam, "args": vars(a),
                          "coverage": coverage, "step": step, "elapsed_s": elapsed0}) + "\n")
    evaluate(step)
    t0 = time.time()
    while step < a.max_steps and elapsed0 + time.time() - t0 < budget_s:
        perm = torch.randperm(len(train), generator=g).tolist()
        # Sequences of similar lengths batched together: each window of 16 batches sorted by length
        # (a batch is padded to its longest; real chat lengths vary tenfold).
        window = 16 * a.batch
        perm = [j for w in range(0, len(perm), window) for j in sorted(perm[w:w + window], key=lambda j: len(train[j]["ids"]))]
        for i in range(0, len(perm) - a.batch + 1, a.batch):
            el = elapsed0 + time.time() - t0
            if el >= budget_s or step >= a.max_steps:
                break
            lr = budget_cosine_lr(a.lr, a.warmup, step, steps=a.steps, frac=el / budget_s)
            for gr in opt.param_groups:
                gr["lr"] = lr
            loss, accs = run(make_batch([train[j] for j in perm[i:i + a.batch]]))
            gn = optimizer_step(opt, head, loss)
            step += 1
            rec = {"model": a.name, "step": step, "epoch": epoch, "loss": round(loss.item(), 4),
                   "top1_agree_by_step": [round(v, 4) for v in accs], "lr": lr, "grad_norm": round(gn.item(), 3),
                   "elapsed_s": round(elapsed0 + time.time() - t0, 1)}
            log.write(json.dumps(rec) + "\n"); log.flush()
            if step % 5 == 0:
                print(rec, flush=True)
            if step % a.save_every == 0:
                save(step)
            if step % a.eval_every == 0:
                evaluate(step)
        epoch += 1
    save(step)
    evaluate(step)
    log.write(json.dumps({"event": "done", "model": a.name, "steps": step, "elapsed_s": elapsed0 + time.time() - t0}) + "\n")
    print("done", step, "steps", elapsed0 + time.time() - t0)


def main():
    a = parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)
    with open(a.log, "a") as log:
        (train_on_family if a.work else train_on_features)(a, log)


if __name__ == "__main__":
    main()
