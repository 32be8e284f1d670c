"""Gemma 3 (e.g. gemma-3-270m-it) in PyTorch, frozen fp32, weights dequantized from its GGUF: the
target side of drafter training (features and next-token distributions), op for op what
llama.cpp's src/models/gemma3.cpp and specula's runtime/arch/gemma3.cpp compute:
  x = embed(tok) * sqrt(width); per layer: x += post_attn_norm(attn(attn_norm(x))),
  x += post_ffw_norm(down(gelu_tanh(gate(h)) * up(h))) with h = ffn_norm(x);
  attention: per-head RMSNorm of q and k, NEOX RoPE (sliding layers base 10000, global layers the
  file's base), q scaled by 1/sqrt(head size) and the scores then by 1, sliding layers masked to
  the last `sliding_window` positions; logits = tied embedding @ output_norm(x).
GGUF stores Gemma's norm weights with the +1 already added (llama.cpp's converter), so they are
used as stored."""
import math
import torch
import torch.nn.functional as F
from model import LlamaConfig, dequantized


def rms_norm(x, w, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def neox_rope(x, positions, base):
    """x: [B, T, H, D]; the two halves of each head rotate together (GGML NEOX mode)."""
    D = x.shape[-1]
    inv = base ** (-torch.arange(0, D, 2, dtype=torch.float64) / D)
    ang = positions.to(torch.float64)[:, None] * inv
    cos, sin = torch.cos(ang).float()[None, :, None, :], torch.sin(ang).float()[None, :, None, :]
    x0, x1 = x[..., :D // 2], x[..., D // 2:]
    return torch.cat([x0 * cos - x1 * sin, x0 * sin + x1 * cos], -1)


class Gemma3(torch.nn.Module):
    def __init__(self, c: LlamaConfig, head_dim, sliding, window, local_base, query_scale, w):
        super().__init__()
        self.c, self.head_dim, self.sliding, self.window = c, head_dim, sliding, window
        self.local_base, self.query_scale, self.w = local_base, query_scale, w

    def attention(self, i, h, T):
        w, c, D = self.w, self.c, self.head_dim
        B = h.shape[0]
        q = (h @ w[f"blk.{i}.attn_q.weight"].T).view(B, T, c.n_heads, D)
        k = (h @ w[f"blk.{i}.attn_k.weight"].T).view(B, T, c.n_kv_heads, D)
        v = (h @ w[f"blk.{i}.attn_v.weight"].T).view(B, T, c.n_kv_heads, D)
        pos = torch.arange(T)
        base = self.local_base if self.sliding[i] else c.rope_base
        q = neox_rope(rms_norm(q, w[f"blk.{i}.attn_q_norm.weight"], c.norm_eps), pos, base) * self.query_scale
        k = neox_rope(rms_norm(k, w[f"blk.{i}.attn_k_norm.weight"], c.norm_eps), pos, base)
        rep = c.n_heads // c.n_kv_heads
        k, v = k.repeat_interleave(rep, 2), v.repeat_interleave(rep, 2)
        s = q.transpose(1, 2) @ k.transpose(1, 2).transpose(-1, -2)  # B H T T, scale already in q
        d = pos[:, None] - pos[None, :]
        hidden = (d < 0) | ((d >= self.window) if self.sliding[i] else torch.zeros_like(d, dtype=torch.bool))
        p = s.masked_fill(hidden, float("-inf")).softmax(-1)
        o = (p @ v.transpose(1, 2)).transpose(1, 2).reshape(B, T, -1)
        return o @ w[f"blk.{i}.attn_output.weight"].T

    def lm_head(self, h):
        return h @ self.w["token_embd.weight"].T

    def norm(self, h):
        return rms_norm(h, self.w["output_norm.weight"], self.c.norm_eps)

    def forward(self, idx, capture_layers=None):
        """As model.Llama.forward: (logits, final pre-norm hidden, {layer: layer-input hidden})."""
        w, c = self.w, self.c
        T = idx.shape[1]
        x = F.embedding(idx, w["token_embd.weight"]) * math.sqrt(c.dim)
        caps = {}
        for i in range(c.n_layers):
            if capture_layers and i in capture_layers:
                caps[i] = x
            a = self.attention(i, rms_norm(x, w[f"blk.{i}.attn_norm.weight"], c.norm_eps), T)
            x = x + rms_norm(a, w[f"blk.{i}.post_attention_norm.weight"], c.norm_eps)
            h = rms_norm(x, w[f"blk.{i}.ffn_norm.weight"], c.norm_eps)
            f = (F.gelu(h @ w[f"blk.{i}.ffn_gate.weight"].T, approximate="tanh") * (h @ w[f"blk.{i}.ffn_up.weight"].T))
            x = x + rms_norm(f @ w[f"blk.{i}.ffn_down.weight"].T, w[f"blk.{i}.post_ffw_norm.weight"], c.norm_eps)
        if capture_layers and c.n_layers in capture_layers:
            caps[c.n_layers] = x
        return self.lm_head(self.norm(x)), x, caps


def load_gguf_gemma3(reader, kv, tensors):
    """The Gemma 3 GGUF behind an open gguf.GGUFReader (kv: its non-tokenizer keys)."""
    a = "gemma3"
    if f"{a}.final_logit_softcapping" in kv or "output.weight" in tensors:
        raise ValueError("gemma3: logit softcapping or an untied output is not supported by the torch port")
    n_layers = int(kv[f"{a}.block_count"])
    n_heads, width = int(kv[f"{a}.attention.head_count"]), int(kv[f"{a}.embedding_length"])
    head_dim = int(kv.get(f"{a}.attention.key_length", width // n_heads))
    c = LlamaConfig(vocab_size=int(tensors["token_embd.weight"].shape[1]), dim=width, n_layers=n_layers, n_heads=n_heads,
                    n_kv_heads=int(kv[f"{a}.attention.head_count_kv"]), ffn_dim=int(kv[f"{a}.feed_forward_length"]),
                    ctx=int(kv[f"{a}.context_length"]), rope_base=float(kv[f"{a}.rope.freq_base"]),
                    norm_eps=float(kv[f"{a}.attention.layer_norm_rms_epsilon"]), tie_embeddings=True)
    if f"{a}.attention.sliding_window_pattern" in kv or f"{a}.rope.scaling.factor" in kv:
        raise ValueError("gemma3: an explicit sliding-window pattern or RoPE scaling is not supported by the torch port")
    sliding = [i % 6 < 5 for i in range(n_layers)]  # llama.cpp's default: every 6th layer global
    window = int(kv.get(f"{a}.attention.sliding_window", 1 << 30))
    query_scale = 1.0 / math.sqrt(width / n_heads if n_layers == 62 else head_dim)  # as runtime/model.cpp
    w = {name: dequantized(t) for name, t in tensors.items()}
    m = Gemma3(c, head_dim, sliding, window, float(kv.get(f"{a}.rope.freq_base_swa", 10000.0)), query_scale, w)
    m.eval()
    return m
