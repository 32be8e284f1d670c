#!/usr/bin/env python3
"""Read back every exported GGUF with llama.cpp's gguf-py reader: check the required
keys, tensor names/shapes/types, tokenizer arrays, and that every tensor equals the
PyTorch checkpoint (up to F16 rounding)."""
import argparse, os, sys
import numpy as np
import torch

ap = argparse.ArgumentParser()
ap.add_argument("--gguf_py", default=None)
ap.add_argument("--work", required=True)
ap.add_argument("--models", required=True)
a = ap.parse_args()
gp = a.gguf_py or next((p for p in ("/work/main/.deps/llama.cpp/gguf-py", "/tmp/deps/llama.cpp/gguf-py") if os.path.isdir(p)), None)
sys.path.insert(0, gp)
import gguf
import sentencepiece as spm

sp = spm.SentencePieceProcessor(model_file=os.path.join(a.work, "specula_tok.model"))
COMMON = ["context_length", "embedding_length", "block_count", "feed_forward_length", "attention.head_count",
          "attention.head_count_kv", "attention.layer_norm_rms_epsilon", "rope.freq_base", "rope.dimension_count", "vocab_size"]
TOK = ["tokenizer.ggml.model", "tokenizer.ggml.tokens", "tokenizer.ggml.scores", "tokenizer.ggml.token_type",
       "tokenizer.ggml.bos_token_id", "tokenizer.ggml.eos_token_id", "tokenizer.ggml.unknown_token_id"]

def pt_name_map(kind, sd):
    m = {}
    def blk(prefix, i, attn_norm=True):
        if attn_norm:
            m[f"blk.{i}.attn_norm.weight"] = f"{prefix}attn_norm.weight"
        for g, p in (("attn_q", "attn.wq"), ("attn_k", "attn.wk"), ("attn_v", "attn.wv"), ("attn_output", "attn.wo"),
                     ("ffn_gate", "mlp.w_gate"), ("ffn_up", "mlp.w_up"), ("ffn_down", "mlp.w_down")):
            m[f"blk.{i}.{g}.weight"] = f"{prefix}{p}.weight"
        m[f"blk.{i}.ffn_norm.weight"] = f"{prefix}ffn_norm.weight"
    if kind == "llama":
        m["token_embd.weight"] = "tok_embd.weight"; m["output_norm.weight"] = "norm.weight"
        if "output.weight" in sd: m["output.weight"] = "output.weight"
        n = max(int(k.split(".")[1]) for k in sd if k.startswith("layers.")) + 1
        for i in range(n): blk(f"layers.{i}.", i)
    elif kind == "eagle3":
        m.update({"fc.weight": "fc.weight", "blk.0.attn_norm_2.weight": "attn_norm_2.weight",
                  "output_norm.weight": "norm.weight", "output.weight": "output.weight"}); blk("", 0)
    else:
        m["fc.weight"] = "fc.weight"; blk("", 0, attn_norm=False)
    return m

ok = True
for fname, kind, ck, arch in (("specula-target.gguf", "llama", "target.pt", "llama"), ("specula-draft.gguf", "llama", "draft.pt", "llama"),
                              ("specula-eagle3.gguf", "eagle3", "eagle3.pt", "eagle3"), ("specula-eagle1.gguf", "eagle1", "eagle1.pt", "specula-eagle1")):
    path = os.path.join(a.models, fname)
    if not os.path.exists(path):
        print("MISSING", path); ok = False; continue
    r = gguf.GGUFReader(path)
    f = {k: v for k, v in r.fields.items()}
    assert f["general.architecture"].contents() == arch, fname
    need = [f"{arch}.{k}" for k in COMMON] + TOK
    if kind == "eagle3": need += ["eagle3.target_layers", "eagle3.target_hidden_size", "eagle3.norm_before_residual"]
    if kind == "eagle1": need += ["specula-eagle1.target_hidden_size"]
    miss = [k for k in need if k not in f]
    toks = f["tokenizer.ggml.tokens"].contents()
    tok_ok = len(toks) == sp.vocab_size() and all(toks[i] == sp.id_to_piece(i) for i in range(sp.vocab_size()))
    sd = torch.load(os.path.join(a.work, ck), map_location="cpu")["state_dict"]
    nm = pt_name_map(kind, sd)
    names = {t.name for t in r.tensors}
    maxerr = 0.0
    for t in r.tensors:
        ref = sd[nm[t.name]].float().numpy()
        got = np.asarray(t.data).astype(np.float32).reshape(ref.shape)
        maxerr = max(maxerr, float(np.abs(got - ref).max() / (np.abs(ref).max() + 1e-8)))
    extra, absent = names - set(nm), set(nm) - names
    good = not miss and tok_ok and not extra and not absent and maxerr < 2e-3
    ok &= good
    print(f"{fname}: arch={arch} tensors={len(r.tensors)} missing_keys={miss} tokenizer_match={tok_ok} "
          f"unexpected={sorted(extra)} absent={sorted(absent)} max_rel_err={maxerr:.2e} size={os.path.getsize(path)} -> {'OK' if good else 'FAIL'}")
print("ALL OK" if ok else "SOME CHECKS FAILED")
sys.exit(0 if ok else 1)
