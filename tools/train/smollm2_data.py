#!/usr/bin/env python3
"""SmolLM2 self-distillation data, in PyTorch (fp32, the target's weights dequantized from its GGUF).

  smollm2_data.py check    --model GGUF --tokenize BIN --gen gen_T0.jsonl
      teacher-forces specula's greedy replies through the torch target: its argmax must
      be the reply's next token almost everywhere (the torch port is then the target).
  smollm2_data.py generate --model GGUF --tokenize BIN --prompts P.json --out OUT.jsonl [--temp T]
      batched KV-cached generation of the target's replies (token ids), far cheaper per
      token than one specula process per prompt on a shared 2-core machine.
Chat format = what `specula generate --chat` feeds the target (llama.cpp's chatml
template, no system message): <|im_start|>user\\n{prompt}<|im_end|>\\n<|im_start|>assistant\\n"""
import argparse, json, os, subprocess, sys, time
import torch
import torch.nn.functional as F
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from model import load_gguf_llama, rope_cos_sin, apply_rope

EOS = 2  # <|im_end|>


def chat_text(prompt):
    return f"<|im_start|>user\n{prompt}<|im_end|>\n<|im_start|>assistant\n"


def tokenize(bin_path, model, text):
    out = subprocess.run([bin_path, "-m", model, "-p", text, "--ids", "--log-disable"],
                         capture_output=True, text=True, check=True).stdout
    return json.loads(out.strip().splitlines()[-1])


@torch.no_grad()
def generate(m, prompts, n, temp, gen):
    """prompts: list of token lists. Left-padded batch, KV cache. Returns reply token lists
    (ending at and including EOS if produced)."""
    B, c = len(prompts), m.c
    P = max(len(p) for p in prompts)
    pad = torch.tensor([P - len(p) for p in prompts])
    x = torch.tensor([[EOS] * (P - len(p)) + p for p in prompts])
    cache = [([], []) for _ in m.layers]
    pos = (torch.arange(P)[None] - pad[:, None]).clamp(min=0)
    valid = torch.arange(P)[None] >= pad[:, None]  # key validity [B, T]
    out = [[] for _ in range(B)]
    done = torch.zeros(B, dtype=torch.bool)
    q_pos = pos
    for step in range(n + 1):
        T = x.shape[1]
        cos, sin = rope_cos_sin(q_pos, c.head_dim, c.rope_base)
        h = m.tok_embd(x)
        L = valid.shape[1]
        qi = torch.arange(L - T, L)
        mask = (torch.arange(L)[None, :] <= qi[:, None])[None] & valid[:, None, :]  # B T L
        bias = torch.zeros(mask.shape).masked_fill(~mask, float("-inf"))[:, None]
        for li, layer in enumerate(m.layers):
            a = layer.attn
            q, k, v = a.qkv(layer.attn_norm(h), cos, sin)
            ks, vs = cache[li]
            ks.append(k); vs.append(v)
            K, V = torch.cat(ks, 1), torch.cat(vs, 1)
            K, V = a.expand_kv(K).transpose(1, 2), a.expand_kv(V).transpose(1, 2)
            s = (q.transpose(1, 2) @ K.transpose(-1, -2)) * (a.hd ** -0.5) + bias
            o = (s.softmax(-1) @ V).transpose(1, 2).reshape(B, T, -1)
            h = h + a.wo(o)
            h = h + layer.mlp(layer.ffn_norm(h))
        if step == n:
            break
        logits = m.lm_head(m.norm(h[:, -1]))
        if temp > 0:
            nxt = torch.multinomial((logits / temp).softmax(-1), 1, generator=gen)[:, 0]
        else:
            nxt = logits.argmax(-1)
        for b in range(B):
            if not done[b]:
                out[b].append(int(nxt[b]))
        done |= nxt == EOS
        if done.all():
            break
        x = nxt[:, None]
        q_pos = pos[:, -1:] + 1
        pos = torch.cat([pos, q_pos], 1)
        valid = torch.cat([valid, torch.ones(B, 1, dtype=torch.bool)], 1)
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("cmd", choices=["check", "generate"])
    ap.add_argument("--model", required=True)
    ap.add_argument("--tokenize", required=True, help="llama-tokenize binary")
    ap.add_argument("--gen", help="check: specula's replies (generate_responses.py output)")
    ap.add_argument("--prompts")
    ap.add_argument("--out")
    ap.add_argument("--n", type=int, default=160)
    ap.add_argument("--temp", type=float, default=0.0)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--limit", type=int, default=0)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    m = load_gguf_llama(a.model)
    if a.cmd == "check":
        recs = [json.loads(l) for l in open(a.gen)][: a.limit or None]
        agree = total = 0
        for r in recs:
            ids = tokenize(a.tokenize, a.model, chat_text(r["prompt"]) + r["response"])
            P = len(tokenize(a.tokenize, a.model, chat_text(r["prompt"])))
            lg, _, _ = m(torch.tensor([ids]))
            pred = lg[0, P - 1:-1].argmax(-1)
            tgt = torch.tensor(ids[P:])
            agree += (pred == tgt).sum().item(); total += len(tgt)
        print(json.dumps({"replies": len(recs), "tokens": total, "torch_argmax_equals_specula_greedy": agree / total}))
        return
    prompts = json.load(open(a.prompts))["prompts"]
    gen = torch.Generator().manual_seed(a.seed)
    todo = [(i, p) for i, p in enumerate(prompts)][: a.limit or None]
    toks = [tokenize(a.tokenize, a.model, chat_text(p["prompt"])) for _, p in todo]
    order = sorted(range(len(todo)), key=lambda j: len(toks[j]))  # similar lengths per batch: little padding
    with open(a.out, "w") as f:
        for s in range(0, len(order), a.batch):
            idx = order[s:s + a.batch]
            t0 = time.time()
            replies = generate(m, [toks[j] for j in idx], a.n, a.temp, gen)
            for j, rep in zip(idx, replies):
                i, p = todo[j]
                f.write(json.dumps(dict(p, index=i, temp=a.temp, prompt_ids=toks[j], reply_ids=rep)) + "\n")
            f.flush()
            print(f"batch {s // a.batch}: {len(idx)} replies, {sum(map(len, replies))} tokens, {time.time() - t0:.1f}s", flush=True)


if __name__ == "__main__":
    main()
