#!/usr/bin/env python3
"""SmolLM2 chat data helpers, and the check that the torch port of the target is the target.

  smollm2_data.py --model GGUF --tokenize BIN --gen gen_T0.jsonl [--limit N]
      teacher-forces specula's greedy replies (generate_responses.py) through the torch
      target (fp32, weights dequantized from the GGUF): prints how often its argmax is the
      reply's next token (not 1.0 exactly: the reply text is re-tokenized, and specula's
      kernels quantize activations to int8).
Chat format = what `specula generate --chat` feeds the target (llama.cpp's chatml
template, no system message): <|im_start|>user\\n{prompt}<|im_end|>\\n<|im_start|>assistant\\n"""
import argparse, json, os, subprocess, sys
import torch
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from model import load_gguf_llama

EOS = 2  # <|im_end|>


def chat_text(prompt):
    return f"<|im_start|>user\n{prompt}<|im_end|>\n<|im_start|>assistant\n"


def tokenize(bin_path, model, text):
    out = subprocess.run([bin_path, "-m", model, "-p", text, "--ids", "--log-disable"],
                         capture_output=True, text=True, check=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--tokenize", required=True, help="llama-tokenize binary")
    ap.add_argument("--gen", required=True, help="specula's replies (generate_responses.py output)")
    ap.add_argument("--limit", type=int, default=0)
    a = ap.parse_args()
    torch.set_num_threads(1)
    m = load_gguf_llama(a.model)
    recs = [json.loads(l) for l in open(a.gen)][: a.limit or None]
    agree = total = 0
    for r in recs:
        ids = tokenize(a.tokenize, a.model, chat_text(r["prompt"]) + r["response"])
        P = len(tokenize(a.tokenize, a.model, chat_text(r["prompt"])))
        with torch.no_grad():
            lg, _, _ = m(torch.tensor([ids]))
        pred = lg[0, P - 1:-1].argmax(-1)
        agree += (pred == torch.tensor(ids[P:])).sum().item()
        total += len(ids) - P
    print(json.dumps({"replies": len(recs), "tokens": total, "torch_argmax_equals_specula_greedy": agree / total}))


if __name__ == "__main__":
    main()
