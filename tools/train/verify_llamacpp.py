#!/usr/bin/env python3
"""Check the exported GGUFs with llama.cpp's own binaries (if built):
 1. llama-tokenize on code/prose with indentation, blank lines, tabs, digits, unicode:
    ids must equal [BOS] + SentencePiece ids (so decode round-trips exactly).
 2. llama-simple (greedy) on the target: continuation must match the PyTorch greedy
    continuation (validates the export incl. RoPE convention).
 3. llama-speculative-simple: target + EAGLE-3 head (--spec-type draft-eagle3) and
    target + draft model (--spec-type draft-simple), temp 0: output must equal plain
    greedy; acceptance statistics are recorded.
Writes a JSON report."""
import argparse, json, os, re, subprocess, sys, tempfile
import torch
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from model import load_llama
import sentencepiece as spm

ap = argparse.ArgumentParser()
ap.add_argument("--bin", default="/work/main/build/bin")
ap.add_argument("--models", default="/work/main/models")
ap.add_argument("--work", required=True)
ap.add_argument("--out", required=True)
ap.add_argument("--n", type=int, default=48)
a = ap.parse_args()
torch.set_num_threads(1)
M = lambda f: os.path.join(a.models, f)
B = lambda f: os.path.join(a.bin, f)
sp = spm.SentencePieceProcessor(model_file=os.path.join(a.work, "specula_tok.model"))
rep = {"bin": a.bin}

def run(cmd, timeout=300):
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    return p.returncode, p.stdout, p.stderr

# 1. tokenizer
TESTS = ["def f(x):\n    if x:\n        return  x + 12345\n\n\n\tpass\n",
         "class A(B):\n    \"\"\"Doc.\"\"\"\n\n    def __init__(self, *args, **kw):\n        super().__init__()\n        self.x = [1, 2.5e-3, 0x1F]\n",
         "   leading spaces\n\n\ntrailing   \n",
         "The :mod:`json` module — naïve café ünïcödé 日本語 🙂\n",
         "\n\nx=1"]
if os.path.exists(B("llama-tokenize")):
    res = []
    for t in TESTS:
        with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as f:
            f.write(t)
        rc, out, err = run([B("llama-tokenize"), "-m", M("specula-target.gguf"), "-f", f.name, "--ids", "--log-disable"])
        os.unlink(f.name)
        m = re.search(r"\[([0-9, ]*)\]", out)
        ids = [int(x) for x in m.group(1).split(",")] if m else None
        ref = [sp.bos_id()] + sp.encode(t)
        res.append({"text": t, "match": ids == ref, "llama_ids": ids, "sp_ids": ref,
                    "roundtrip": ids is not None and sp.decode(ids[1:]) == t})
    rep["tokenizer"] = {"all_match": all(r["match"] for r in res), "cases": res}
    print("tokenizer all_match:", rep["tokenizer"]["all_match"], flush=True)
else:
    rep["tokenizer"] = "llama-tokenize not built"

# 2. greedy target vs PyTorch
tgt = load_llama(os.path.join(a.work, "target.pt"))
PROMPTS = ["def fibonacci(n):\n", "import os\nimport sys\n\n\ndef main():\n", "The :mod:`json` module"]
def torch_greedy(p, n):
    ids = [sp.bos_id()] + sp.encode(p)
    n0 = len(ids)
    with torch.no_grad():
        for _ in range(n):
            lg, _, _ = tgt(torch.tensor([ids]))
            ids.append(int(lg[0, -1].argmax()))
    return ids[n0:]
GEN = "llama-simple" if os.path.exists(B("llama-simple")) else "llama-completion"
if os.path.exists(B(GEN)):
    res = []
    for p in PROMPTS:
        cont = torch_greedy(p, a.n)
        full = sp.decode(sp.encode(p) + cont)  # decode with the prompt so the first piece keeps its leading space
        assert full.startswith(p)
        txt = full[len(p):]
        if GEN == "llama-simple":
            cmd = [B(GEN), "-m", M("specula-target.gguf"), "-n", str(a.n), p]
        else:
            cmd = [B(GEN), "-m", M("specula-target.gguf"), "-p", p, "-n", str(a.n), "--temp", "0", "--top-k", "1",
                   "-no-cnv", "--no-display-prompt", "-t", "1", "-c", "512", "--no-warmup", "--seed", "1"]
        rc, out, err = run(cmd)
        # llama-simple echoes the prompt then the continuation
        gen = out[out.find(p) + len(p):] if (GEN == "llama-simple" and p in out) else out
        k = 0
        while k < min(len(gen), len(txt)) and gen[k] == txt[k]:
            k += 1
        res.append({"tool": GEN, "prompt": p, "torch": txt, "llama_cpp": gen, "identical": gen.rstrip("\n") == txt.rstrip("\n") or gen.startswith(txt), "n_tokens": a.n,
                    "common_prefix_chars": k, "rc": rc})
        print(repr(p), "identical" if res[-1]["identical"] else f"DIFF after {k} chars", flush=True)
    rep["greedy_vs_torch"] = res
else:
    rep["greedy_vs_torch"] = "neither llama-simple nor llama-completion built"

# 3. speculative decoding with llama.cpp
if os.path.exists(B("llama-speculative-simple")):
    res = []
    p = "import os\nimport sys\n\n\ndef main():\n"
    for name, extra in (("eagle3", ["-md", M("specula-eagle3.gguf"), "--spec-type", "draft-eagle3"]),
                        ("draft", ["-md", M("specula-draft.gguf"), "--spec-type", "draft-simple"])):
        cmd = [B("llama-speculative-simple"), "-m", M("specula-target.gguf"), *extra, "--spec-draft-n-max", "4", "--spec-draft-p-min", "0",
               "-p", p, "-n", "64", "--temp", "0", "--top-k", "1", "--seed", "42", "-t", "1", "-c", "512"]
        rc, out, err = run(cmd)
        stats = {k: v for k, v in re.findall(r"(n_draft|n_predict|n_drafted|n_accept|accept)\s*=\s*([0-9.%]+)", err + out)}
        res.append({"drafter": name, "rc": rc, "cmd": " ".join(cmd), "stats": stats, "output_tail": out[-600:], "stderr_tail": err[-1500:]})
        print(name, rc, stats, flush=True)
    rep["speculative_simple"] = res
else:
    rep["speculative_simple"] = "llama-speculative-simple not built"
json.dump(rep, open(a.out, "w"), indent=1, ensure_ascii=False)
print("wrote", a.out)
