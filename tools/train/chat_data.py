#!/usr/bin/env python3
"""Chat data helpers for the real targets, and the check that the torch port of a target is the target.

  chat_data.py --model GGUF --tokenize BIN --gen gen_T0.jsonl [--limit N]
      teacher-forces specula's greedy replies (generate_responses.py) through the torch
      target (fp32, weights dequantized from the GGUF): prints how often its argmax is the
      reply's next token (not 1.0 exactly: the reply text is re-tokenized, and specula's
      kernels quantize activations to int8).
Chat format = what `specula generate --chat` feeds the target (llama.cpp's template for it, no
system message; the tokenizer adds BOS where the model asks for it):
  llama (SmolLM2, chatml): <|im_start|>user\\n{prompt}<|im_end|>\\n<|im_start|>assistant\\n
  gemma3: <start_of_turn>user\\n{prompt}<end_of_turn>\\n<start_of_turn>model\\n"""
import argparse, json, os, subprocess, sys
import torch
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from model import load_gguf_target

# architecture -> (chat text of a one-turn prompt, the token that ends the model's turn)
CHAT_FORMATS = {
    "llama": ("<|im_start|>user\n{}<|im_end|>\n<|im_start|>assistant\n", "<|im_end|>"),
    "gemma3": ("<start_of_turn>user\n{}<end_of_turn>\n<start_of_turn>model\n", "<end_of_turn>"),
}


class ChatFormat:
    """The target's one-turn chat text and the id of its end-of-turn token, read from its GGUF.
    With a frame (a pretrained model, prompted for completions: e.g. "Question: {}\\nAnswer:"),
    the framed prompt as plain text and the model's EOS."""

    def __init__(self, model, frame=None):
        import gguf
        r = gguf.GGUFReader(model)
        if frame:
            self.template, self.end_id = frame, int(r.fields["tokenizer.ggml.eos_token_id"].contents())
            return
        arch = r.fields["general.architecture"].contents()
        if arch not in CHAT_FORMATS:
            raise ValueError(f"{model}: no chat format for architecture {arch}")
        self.template, end = CHAT_FORMATS[arch]
        self.end_id = r.fields["tokenizer.ggml.tokens"].contents().index(end)

    def text(self, prompt):
        return self.template.format(prompt)


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
    ap.add_argument("--frame", default=None, help="the completion frame the replies were generated with (generate_responses.py --frame)")
    a = ap.parse_args()
    torch.set_num_threads(1)
    m = load_gguf_target(a.model)
    chat = ChatFormat(a.model, a.frame)
    recs = [json.loads(l) for l in open(a.gen)][: a.limit or None]
    agree = total = 0
    for r in recs:
        ids = tokenize(a.tokenize, a.model, chat.text(r["prompt"]) + r["response"])
        P = len(tokenize(a.tokenize, a.model, chat.text(r["prompt"])))
        with torch.no_grad():
            lg, _, _ = m(torch.tensor([ids]))
        pred = lg[0, P - 1:-1].argmax(-1)
        agree += (pred == torch.tensor(ids[P:])).sum().item()
        total += len(ids) - P
    print(json.dumps({"replies": len(recs), "tokens": total, "torch_argmax_equals_specula_greedy": agree / total}))


if __name__ == "__main__":
    main()
