"""specula model family in PyTorch: Llama target/draft, EAGLE-3 head, EAGLE-1 head.

RoPE convention: exactly llama.cpp's LLAMA_ROPE_TYPE_NORM (used for arch `llama`
and `eagle3`): adjacent pairs (x[2i], x[2i+1]) are rotated by angle
pos * base^(-2i/head_dim). Because the PyTorch model uses this convention
directly, Q/K weights are exported to GGUF *unpermuted* (no HF permute).
"""
import math
from dataclasses import dataclass, asdict
import torch
import torch.nn as nn
import torch.nn.functional as F


@dataclass
class LlamaConfig:
    vocab_size: int = 8192
    dim: int = 384
    n_layers: int = 6
    n_heads: int = 6
    n_kv_heads: int = 2
    ffn_dim: int = 1024
    ctx: int = 512
    rope_base: float = 10000.0
    norm_eps: float = 1e-5
    tie_embeddings: bool = False

    @property
    def head_dim(self):
        return self.dim // self.n_heads


CONFIGS = {
    "target": LlamaConfig(dim=384, n_layers=6, n_heads=6, n_kv_heads=2, ffn_dim=1024, tie_embeddings=False),
    "draft": LlamaConfig(dim=128, n_layers=2, n_heads=4, n_kv_heads=2, ffn_dim=384, tie_embeddings=True),
}


class RMSNorm(nn.Module):
    def __init__(self, dim, eps):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return (xf * self.weight.float()).to(x.dtype) if x.dtype != torch.float32 else xf * self.weight


def rope_cos_sin(positions, head_dim, base):
    """positions: LongTensor [...]; returns cos, sin of shape [..., head_dim/2] (fp32)."""
    inv = base ** (-torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)
    ang = positions.to(torch.float64)[..., None] * inv
    return torch.cos(ang).float(), torch.sin(ang).float()


def apply_rope(x, cos, sin):
    """x: [B, T, H, D]; cos/sin: [T, D/2] or [B, T, D/2]. GGML NORM mode (adjacent pairs)."""
    if cos.dim() == 2:
        cos, sin = cos[None, :, None, :], sin[None, :, None, :]
    else:
        cos, sin = cos[:, :, None, :], sin[:, :, None, :]
    cos, sin = cos.to(x.dtype), sin.to(x.dtype)
    x0, x1 = x[..., 0::2], x[..., 1::2]
    o0 = x0 * cos - x1 * sin
    o1 = x0 * sin + x1 * cos
    return torch.stack((o0, o1), dim=-1).flatten(-2)


_MASKS = {}


def causal_mask(T):
    if T not in _MASKS:
        _MASKS[T] = torch.full((T, T), float("-inf")).triu(1)
    return _MASKS[T]


class Attention(nn.Module):
    def __init__(self, in_dim, dim, n_heads, n_kv_heads):
        super().__init__()
        self.n_heads, self.n_kv = n_heads, n_kv_heads
        self.hd = dim // n_heads
        self.wq = nn.Linear(in_dim, n_heads * self.hd, bias=False)
        self.wk = nn.Linear(in_dim, n_kv_heads * self.hd, bias=False)
        self.wv = nn.Linear(in_dim, n_kv_heads * self.hd, bias=False)
        self.wo = nn.Linear(n_heads * self.hd, dim, bias=False)

    def qkv(self, x, cos, sin):
        B, T, _ = x.shape
        q = apply_rope(self.wq(x).view(B, T, self.n_heads, self.hd), cos, sin)
        k = apply_rope(self.wk(x).view(B, T, self.n_kv, self.hd), cos, sin)
        v = self.wv(x).view(B, T, self.n_kv, self.hd)
        return q, k, v

    def expand_kv(self, k):
        rep = self.n_heads // self.n_kv
        return k.repeat_interleave(rep, dim=2) if rep > 1 else k

    def forward(self, x, cos, sin):
        B, T, _ = x.shape
        q, k, v = self.qkv(x, cos, sin)
        k, v = self.expand_kv(k), self.expand_kv(v)
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))  # B H T D
        s = (q * (1.0 / math.sqrt(self.hd))) @ k.transpose(-1, -2)
        p = (s.float() + causal_mask(T)).softmax(-1).to(v.dtype)
        o = (p @ v).transpose(1, 2).reshape(B, T, -1)
        return self.wo(o)


class MLP(nn.Module):
    def __init__(self, dim, ffn):
        super().__init__()
        self.w_gate = nn.Linear(dim, ffn, bias=False)
        self.w_up = nn.Linear(dim, ffn, bias=False)
        self.w_down = nn.Linear(ffn, dim, bias=False)

    def forward(self, x):
        return self.w_down(F.silu(self.w_gate(x)) * self.w_up(x))


class Block(nn.Module):
    def __init__(self, c: LlamaConfig):
        super().__init__()
        self.attn_norm = RMSNorm(c.dim, c.norm_eps)
        self.attn = Attention(c.dim, c.dim, c.n_heads, c.n_kv_heads)
        self.ffn_norm = RMSNorm(c.dim, c.norm_eps)
        self.mlp = MLP(c.dim, c.ffn_dim)

    def forward(self, x, cos, sin):
        x = x + self.attn(self.attn_norm(x), cos, sin)
        return x + self.mlp(self.ffn_norm(x))


class Llama(nn.Module):
    def __init__(self, c: LlamaConfig):
        super().__init__()
        self.c = c
        self.tok_embd = nn.Embedding(c.vocab_size, c.dim)
        self.layers = nn.ModuleList([Block(c) for _ in range(c.n_layers)])
        self.norm = RMSNorm(c.dim, c.norm_eps)
        self.output = None if c.tie_embeddings else nn.Linear(c.dim, c.vocab_size, bias=False)
        self.apply(self._init)
        for n, p in self.named_parameters():
            if n.endswith("wo.weight") or n.endswith("w_down.weight"):
                nn.init.normal_(p, std=0.02 / math.sqrt(2 * c.n_layers))

    @staticmethod
    def _init(m):
        if isinstance(m, (nn.Linear, nn.Embedding)):
            nn.init.normal_(m.weight, std=0.02)

    def lm_head(self, h):
        w = self.tok_embd.weight if self.output is None else self.output.weight
        return F.linear(h, w)

    def forward(self, idx, capture_layers=None):
        """Returns (logits, final_prenorm_hidden, {layer_id: layer-input hidden}).
        capture_layers uses llama.cpp's `layer_inp` semantics: id i = input of layer i
        (= output of layer i-1); id n_layers = final hidden before the output norm."""
        B, T = idx.shape
        cos, sin = rope_cos_sin(torch.arange(T), self.c.head_dim, self.c.rope_base)
        x = self.tok_embd(idx)
        caps = {}
        for i, layer in enumerate(self.layers):
            if capture_layers and i in capture_layers:
                caps[i] = x
            x = layer(x, cos, sin)
        if capture_layers and self.c.n_layers in capture_layers:
            caps[self.c.n_layers] = x
        logits = self.lm_head(self.norm(x))
        return logits, x, caps


# ----------------------------------------------------------------------------------
# EAGLE heads. Both use a "tree-free chain" training-time test (TTT): step 0 sees the
# target features; step k>0 sees the head's own previous output hidden state. The
# query of step k at base position t sits at RoPE position t+k and attends to the
# step-0 keys at positions <= t plus the chain keys of steps 1..k (positions t+1..t+k),
# which is exactly the KV-cache content during chained drafting in llama.cpp.
# ----------------------------------------------------------------------------------


def chain_attention(attn: Attention, x, step, cache, base_pos, lo=0):
    """x: [B,T,in] at step 0, [B,T-lo,in] (positions lo..T-1) at later steps; step k; cache: list of
    (k,v) from previous steps (index 0 = step 0). Returns the attention output of positions lo..T-1
    [B,T-lo,dim] and appends this step's (k,v) to cache: step 0 keys every position, as later
    queries attend to all of them, but only positions from lo on need its queries (a caller that
    scores nothing before lo skips the rest)."""
    B, Tx, _ = x.shape
    cos, sin = rope_cos_sin(base_pos + step, attn.hd, ROPE_BASE[0])
    if step == 0 and lo:
        _, k, v = attn.qkv(x, cos, sin)
        q = apply_rope(attn.wq(x[:, lo:]).view(B, Tx - lo, attn.n_heads, attn.hd), cos[..., lo:, :], sin[..., lo:, :])
    else:
        q, k, v = attn.qkv(x, cos[..., lo:, :], sin[..., lo:, :])  # step 0 here has lo = 0: every position
    cache.append((k, v))
    q = q.transpose(1, 2)  # B H R D, R = T - lo rows
    R = q.shape[2]
    k0, v0 = (attn.expand_kv(t).transpose(1, 2) for t in cache[0])
    T = k0.shape[2]
    scale = 1.0 / math.sqrt(attn.hd)
    s0 = (q @ k0.transpose(-1, -2)).float() * scale  # B H R T
    mask = torch.ones(R, T, dtype=torch.bool).triu(1 + lo)
    s0 = s0.masked_fill(mask, float("-inf"))
    sd, vd = [], []
    for j in range(1, step + 1):
        kj, vj = (attn.expand_kv(t).transpose(1, 2) for t in cache[j])
        sd.append(((q.float() * kj.float()).sum(-1, keepdim=True)) * scale)  # B H R 1
        vd.append(vj)
    s = torch.cat([s0] + sd, dim=-1) if sd else s0
    p = s.softmax(-1)
    o = p[..., :T].to(v0.dtype) @ v0
    for j in range(step):
        o = o + p[..., T + j:T + j + 1].to(vd[j].dtype) * vd[j]
    o = o.transpose(1, 2).reshape(B, R, -1)
    return attn.wo(o)


ROPE_BASE = [10000.0]


class Eagle3Head(nn.Module):
    """llama.cpp `eagle3` layout. g = fc(concat(f_low, f_mid, f_high)) (3h -> h);
    x = concat(attn_norm(embed(tok)), attn_norm_2(g)) (2h); r = attn(x) + g
    (norm_before_residual = false); out = r + mlp(ffn_norm(r)) (pre-norm output, fed
    back as the next g); logits = output(output_norm(out))."""

    def __init__(self, c: LlamaConfig, target_layers):
        super().__init__()
        self.c = c
        self.target_layers = list(target_layers)
        h = c.dim
        self.fc = nn.Linear(3 * h, h, bias=False)
        self.attn_norm = RMSNorm(h, c.norm_eps)     # input_layernorm (token embedding)
        self.attn_norm_2 = RMSNorm(h, c.norm_eps)   # hidden_norm (fused / fed-back g)
        self.attn = Attention(2 * h, h, c.n_heads, c.n_kv_heads)
        self.ffn_norm = RMSNorm(h, c.norm_eps)
        self.mlp = MLP(h, c.ffn_dim)
        self.norm = RMSNorm(h, c.norm_eps)
        self.output = nn.Linear(h, c.vocab_size, bias=False)

    def step(self, emb, g, k, cache, base_pos, lo=0):
        """Step k of the chain (chain_attention); out and logits of positions lo on."""
        x = torch.cat([self.attn_norm(emb), self.attn_norm_2(g)], dim=-1)
        r = chain_attention(self.attn, x, k, cache, base_pos, lo) + (g[:, lo:] if k == 0 else g)
        out = r + self.mlp(self.ffn_norm(r))
        return out, self.output(self.norm(out))


class Eagle1Head(nn.Module):
    """specula-eagle1 layout. x = fc(concat(embed(tok), f)) (2h -> h) with f the
    target's final hidden state *before* its output norm; one decoder layer with no
    input norm: r = x + attn(x); out = r + mlp(ffn_norm(r)). out predicts the next
    pre-norm target hidden state; logits = target.output(target.norm(out))."""

    def __init__(self, c: LlamaConfig):
        super().__init__()
        self.c = c
        h = c.dim
        self.fc = nn.Linear(2 * h, h, bias=False)
        self.attn = Attention(h, h, c.n_heads, c.n_kv_heads)
        self.ffn_norm = RMSNorm(h, c.norm_eps)
        self.mlp = MLP(h, c.ffn_dim)

    def step(self, emb, f, k, cache, base_pos, lo=0):
        """Step k of the chain (chain_attention); out of positions lo on."""
        x = self.fc(torch.cat([emb, f], dim=-1))
        r = (x[:, lo:] if k == 0 else x) + chain_attention(self.attn, x, k, cache, base_pos, lo)
        return r + self.mlp(self.ffn_norm(r))


def lm_chain_step(model: Llama, tokens, step, caches, base_pos):
    """One chain step of a Llama LM (used for evaluation): step 0 = ordinary causal
    forward of `tokens` at positions base_pos; step j = token tokens[:, t] placed at
    position t+j, attending to step-0 positions <= t and chain steps 1..j at t.
    caches: list (per layer) of lists. Returns (logits, prenorm hidden)."""
    h = model.tok_embd(tokens)
    for i, layer in enumerate(model.layers):
        h = h + chain_attention(layer.attn, layer.attn_norm(h), step, caches[i], base_pos)
        h = h + layer.mlp(layer.ffn_norm(h))
    return model.lm_head(model.norm(h)), h


def load_llama(path):
    ck = torch.load(path, map_location="cpu")
    m = Llama(LlamaConfig(**ck["config"]))
    m.load_state_dict(ck["state_dict"])
    m.eval()
    for p in m.parameters():
        p.requires_grad_(False)
    return m


def dequantized(t):
    """A gguf.ReaderTensor as an fp32 torch tensor in PyTorch's [rows, cols] order."""
    import gguf
    a = gguf.quants.dequantize(t.data, t.tensor_type)
    return torch.from_numpy(a.reshape([int(d) for d in reversed(t.shape)]).astype("float32").copy())


def load_gguf_tensors(path, names):
    """Just these tensors of a GGUF, dequantized to fp32 (cheap next to loading the whole model)."""
    import gguf
    tensors = {t.name: t for t in gguf.GGUFReader(path).tensors}
    return {n: dequantized(tensors[n]) for n in names}


def gguf_llama_config(kv, tensors, arch="llama"):
    """The LlamaConfig of a llama-shaped GGUF (llama; qwen2, whose attention biases it does not
    record) from its metadata `kv` and tensors by name."""
    return LlamaConfig(vocab_size=int(tensors["token_embd.weight"].shape[1]), dim=int(kv[f"{arch}.embedding_length"]),
                       n_layers=int(kv[f"{arch}.block_count"]), n_heads=int(kv[f"{arch}.attention.head_count"]),
                       n_kv_heads=int(kv[f"{arch}.attention.head_count_kv"]),
                       ffn_dim=int(kv[f"{arch}.feed_forward_length"]), ctx=int(kv[f"{arch}.context_length"]),
                       rope_base=float(kv[f"{arch}.rope.freq_base"]),
                       norm_eps=float(kv[f"{arch}.attention.layer_norm_rms_epsilon"]),
                       tie_embeddings="output.weight" not in tensors)


def load_gguf_llama(kv, tensors):
    """A llama-architecture GGUF (e.g. SmolLM2-135M-Instruct; its metadata `kv`, tensors by name) as
    a frozen fp32 Llama. Quantized tensors are dequantized with the pinned `gguf` package; Q/K are
    used as stored (GGUF llama weights are already permuted for NORM RoPE, like this model)."""
    c = gguf_llama_config(kv, tensors)

    def w(name):
        return dequantized(tensors[name])

    m = Llama(c)
    names = {"attn_norm": "attn_norm", "attn.wq": "attn_q", "attn.wk": "attn_k", "attn.wv": "attn_v",
             "attn.wo": "attn_output", "ffn_norm": "ffn_norm", "mlp.w_gate": "ffn_gate", "mlp.w_up": "ffn_up",
             "mlp.w_down": "ffn_down"}
    sd = {"tok_embd.weight": w("token_embd.weight"), "norm.weight": w("output_norm.weight")}
    if not c.tie_embeddings:
        sd["output.weight"] = w("output.weight")
    for i in range(c.n_layers):
        for ours, theirs in names.items():
            sd[f"layers.{i}.{ours}.weight"] = w(f"blk.{i}.{theirs}.weight")
    m.load_state_dict(sd)
    m.eval()
    for p in m.parameters():
        p.requires_grad_(False)
    ROPE_BASE[0] = c.rope_base
    return m
