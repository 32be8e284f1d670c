#!/usr/bin/env python3
"""Export specula checkpoints to GGUF with llama.cpp's gguf-py.

  --kind llama   target / draft  -> general.architecture = "llama"
  --kind eagle3  EAGLE-3 head    -> general.architecture = "eagle3" (llama.cpp layout)
  --kind eagle1  EAGLE-1 head    -> general.architecture = "specula-eagle1" (specula layout)

Q/K weights are written UNPERMUTED: the PyTorch models already use llama.cpp's
NORM RoPE (adjacent pairs), so no HF-style permute is needed.
2-D weights are F16 (or Q8_0 with --type q8_0), 1-D norm weights F32.
EAGLE heads of a real target (tools/train/train_eagle.py --feats) are exported with
--target TARGET.gguf: the target's tokenizer.* keys are copied into the head, as
`specula convert-eagle` does (llama.cpp loads a draft's vocabulary from its own file and
checks it against the target's); a checkpoint with a compact draft
vocabulary also writes `d2t` (I64 target token id of every draft token, as compact-eagle3).
"""
import argparse, os, sys
import numpy as np
import torch

ap = argparse.ArgumentParser()
ap.add_argument("--kind", required=True, choices=["llama", "eagle3", "eagle1"])
ap.add_argument("--ckpt", required=True)
ap.add_argument("--tokenizer", help="SentencePiece .model (required for --kind llama)")
ap.add_argument("--target", help="target GGUF whose tokenizer.* keys the file carries (an EAGLE head for llama.cpp, or a draft LM distilled on the target's vocabulary)")
ap.add_argument("--omit-vocab", action="store_true",
                help="with --target: do not copy its tokenizer.* keys (a head llama.cpp cannot run anyway, e.g. for a gemma3 target, whose 262144-token vocabulary would be 6.5 MB of the file; specula uses the target's)")
ap.add_argument("--out", required=True)
ap.add_argument("--name", default=None)
ap.add_argument("--type", default="f16", choices=["f16", "q8_0", "q4_0"],
                help="2-D weights (q8_0: half the size; q4_0: a quarter, but an EAGLE head's lm_head stays q8_0, its ranking is the draft; the engine's kernels take all three)")
ap.add_argument("--gguf_py", default=None, help="path to llama.cpp gguf-py (default: /work/main/.deps/llama.cpp/gguf-py if present, else /tmp/deps/llama.cpp/gguf-py)")
a = ap.parse_args()
gp = a.gguf_py or next((p for p in ("/work/main/.deps/llama.cpp/gguf-py", "/tmp/deps/llama.cpp/gguf-py") if os.path.isdir(p)), None)
if gp:
    sys.path.insert(0, gp)
import gguf

ck = torch.load(a.ckpt, map_location="cpu")
c = ck["config"]
sd = {k: v.float() for k, v in ck["state_dict"].items()}
arch = {"llama": "llama", "eagle3": "eagle3", "eagle1": "specula-eagle1"}[a.kind]
w = gguf.GGUFWriter(a.out, arch)
w.add_name(a.name or os.path.splitext(os.path.basename(a.out))[0])
w.add_file_type({"q8_0": gguf.LlamaFileType.MOSTLY_Q8_0, "q4_0": gguf.LlamaFileType.MOSTLY_Q4_0}.get(a.type, gguf.LlamaFileType.MOSTLY_F16))

if a.kind == "llama" and not (a.tokenizer or a.target):
    sys.exit("export_gguf: error: --kind llama needs --tokenizer, or --target to share the target's tokenizer")
if a.tokenizer:  # identical to convert_hf_to_gguf.py's _set_vocab_sentencepiece
    from sentencepiece import SentencePieceProcessor
    sp = SentencePieceProcessor(model_file=a.tokenizer)
    T = gguf.TokenType
    tokens, scores, types = [], [], []
    for i in range(sp.vocab_size()):
        tokens.append(sp.id_to_piece(i).encode("utf-8"))
        scores.append(sp.get_score(i))
        t = T.NORMAL
        if sp.is_unknown(i): t = T.UNKNOWN
        elif sp.is_control(i): t = T.CONTROL
        elif sp.is_unused(i): t = T.UNUSED
        elif sp.is_byte(i): t = T.BYTE
        types.append(int(t))
    assert sp.vocab_size() == c["vocab_size"]
    w.add_tokenizer_model("llama")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_bos_token_id(sp.bos_id())
    w.add_eos_token_id(sp.eos_id())
    w.add_unk_token_id(sp.unk_id())
    w.add_add_bos_token(True)
    w.add_add_eos_token(False)
    w.add_add_space_prefix(True)  # tokenizer trained with add_dummy_prefix=True

# ---- hparams ----
dim, nh, nkv = c["dim"], c["n_heads"], c["n_kv_heads"]
w.add_context_length(c["ctx"])
w.add_embedding_length(dim)
w.add_block_count(c["n_layers"] if a.kind == "llama" else 1)
w.add_feed_forward_length(c["ffn_dim"])
w.add_head_count(nh)
w.add_head_count_kv(nkv)
w.add_layer_norm_rms_eps(c["norm_eps"])
w.add_rope_freq_base(c["rope_base"])
w.add_rope_dimension_count(dim // nh)
w.add_vocab_size(c["vocab_size"])
if a.target and not a.omit_vocab:
    for f in gguf.GGUFReader(a.target).fields.values():
        if f.name.startswith("tokenizer."):
            w.add_key_value(f.name, f.contents(), f.types[0], sub_type=f.types[-1] if len(f.types) > 1 else None)

if a.kind == "eagle3":
    w.add_target_layers([int(x) for x in ck["target_layers"]])
    w.add_target_hidden_size(int(ck["target_hidden_size"]))
    w.add_norm_before_residual(False)
    w.add_norm_before_fc(False)
if a.kind == "eagle1":
    w.add_uint32(f"{arch}.target_hidden_size", int(ck["target_hidden_size"]))

def put(name, t):
    arr = t.numpy()
    if arr.ndim == 2 and a.type != "f16":
        kind = "q8_0" if a.type == "q8_0" or (a.kind != "llama" and name == "output.weight") else "q4_0"
        q = gguf.GGMLQuantizationType.Q8_0 if kind == "q8_0" else gguf.GGMLQuantizationType.Q4_0
        w.add_tensor(name, gguf.quants.quantize(arr.astype(np.float32), q), raw_dtype=q)
        print(f"{name:28s} {tuple(arr.shape)} {kind}")
        return
    arr = arr.astype(np.float16) if arr.ndim == 2 else arr.astype(np.float32)
    w.add_tensor(name, arr)
    print(f"{name:28s} {tuple(arr.shape)} {arr.dtype}")

def block(prefix, i, has_attn_norm=True):
    p = prefix
    if has_attn_norm:
        put(f"blk.{i}.attn_norm.weight", sd[f"{p}attn_norm.weight"])
    put(f"blk.{i}.attn_q.weight", sd[f"{p}attn.wq.weight"])
    put(f"blk.{i}.attn_k.weight", sd[f"{p}attn.wk.weight"])
    put(f"blk.{i}.attn_v.weight", sd[f"{p}attn.wv.weight"])
    put(f"blk.{i}.attn_output.weight", sd[f"{p}attn.wo.weight"])
    put(f"blk.{i}.ffn_norm.weight", sd[f"{p}ffn_norm.weight"])
    put(f"blk.{i}.ffn_gate.weight", sd[f"{p}mlp.w_gate.weight"])
    put(f"blk.{i}.ffn_up.weight", sd[f"{p}mlp.w_up.weight"])
    put(f"blk.{i}.ffn_down.weight", sd[f"{p}mlp.w_down.weight"])

if a.kind == "llama":
    put("token_embd.weight", sd["tok_embd.weight"])
    for i in range(c["n_layers"]):
        block(f"layers.{i}.", i)
    put("output_norm.weight", sd["norm.weight"])
    if "output.weight" in sd:
        put("output.weight", sd["output.weight"])
elif a.kind == "eagle3":
    put("fc.weight", sd["fc.weight"])
    block("", 0)
    put("blk.0.attn_norm_2.weight", sd["attn_norm_2.weight"])
    put("output_norm.weight", sd["norm.weight"])
    put("output.weight", sd["output.weight"])
    if "d2t" in ck:
        w.add_tensor("d2t", ck["d2t"].numpy().astype(np.int64))
else:
    put("fc.weight", sd["fc.weight"])
    block("", 0, has_attn_norm=False)

w.write_header_to_file()
w.write_kv_data_to_file()
w.write_tensors_to_file()
w.close()
print("wrote", a.out, os.path.getsize(a.out))
