#!/usr/bin/env python3
"""The check that the torch port of a real target is the target.

  chat_data.py --model GGUF --tokenize BIN --gen gen_T0.jsonl [--limit N]
      teacher-forces specula's greedy replies (generate_responses.py) through the torch
      target (fp32, weights dequantized from the GGUF): prints how often its argmax is the
      reply's next token (not 1.0 exactly: the reply text is re-tokenized, and specula's
      kernels quantize activations to int8).
Chat format and tokens: chat_format.py.
"""
import argparse, json, os, sys
import torch
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gguf_target import load_gguf_target
from chat_format import ChatFormat, tokenize


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--tokenize", required=True, help="llama-tokenize binary")
    ap.add_argument("--gen", required=True, help="specula's replies (generate_responses.py output)")
    ap.add_argument("--limit", type=int, default=0)
    ap.add_argument("--frame", default=None, help="the completion frame the replies were generated with (generate_responses.py --frame)")
    a = ap.parse_args()
    torch.set_num_threads(1)
    m = load_gguf_target(a.model)
    chat = ChatFormat(a.model, a.frame)
    recs = [json.loads(l) for l in open(a.gen)][: a.limit or None]
    agree = total = 0
    for r in recs:
        ids = tokenize(a.tokenize, a.model, chat.text(r["prompt"], r.get("context", ())) + r["response"])
        P = len(tokenize(a.tokenize, a.model, chat.text(r["prompt"], r.get("context", ()))))
        with torch.no_grad():
            lg, _, _ = m(torch.tensor([ids]))
        pred = lg[0, P - 1:-1].argmax(-1)
        agree += (pred == torch.tensor(ids[P:])).sum().item()
        total += len(ids) - P
    print(json.dumps({"replies": len(recs), "tokens": total, "torch_argmax_equals_specula_greedy": agree / total}))


if __name__ == "__main__":
    main()
