#!/usr/bin/env python3
"""The chat text a real target is fed, and its token ids, for the training tools (no torch needed).
Chat format = what `specula serve` feeds the target for the same messages (the GGUF's Jinja
template, no system message of the request's own; the tokenizer adds BOS where the model asks for
it): the template's default system turn first where it has one (SmolLM2's "You are a helpful AI
assistant named SmolLM, ..."), then the earlier turns of a prompt's "context", each in the same
form as the prompt's:
  llama (SmolLM2, chatml): <|im_start|>user\\n{prompt}<|im_end|>\\n<|im_start|>assistant\\n
  gemma3: <start_of_turn>user\\n{prompt}<end_of_turn>\\n<start_of_turn>model\\n
  qwen2 (Qwen2.5-Coder): as llama's, after Qwen's default system turn"""
import json, os, re, subprocess, sys, urllib.request

# architecture -> (one turn's chat text, the opening of the model's turn, the model's role name, the
# token that ends a turn)
CHAT_FORMATS = {
    "llama": ("<|im_start|>{role}\n{content}<|im_end|>\n", "<|im_start|>assistant\n", "assistant", "<|im_end|>"),
    "gemma3": ("<start_of_turn>{role}\n{content}<end_of_turn>\n", "<start_of_turn>model\n", "model", "<end_of_turn>"),
}
CHAT_FORMATS["qwen2"] = CHAT_FORMATS["llama"]  # Qwen2.5(-Coder): ChatML


def messages(prompt):
    """A prompt record's chat messages, as `specula serve` and `generate --messages` read them: its
    earlier conversation ("context"), then the prompt as the user's turn."""
    return list(prompt.get("context", [])) + [{"role": "user", "content": prompt["prompt"]}]


class ChatFormat:
    """The target's chat text and the id of its end-of-turn token, read from its GGUF.
    With a frame (a pretrained model, prompted for completions: e.g. "Question: {}\\nAnswer:"),
    the framed prompt as plain text and the model's EOS."""

    def __init__(self, model, frame=None):
        import gguf
        r = gguf.GGUFReader(model)
        self.frame = frame
        if frame:
            self.end_id = int(r.fields["tokenizer.ggml.eos_token_id"].contents())
            return
        arch = r.fields["general.architecture"].contents()
        if arch not in CHAT_FORMATS:
            raise ValueError(f"{model}: no chat format for architecture {arch}")
        self.turn, self.reply, self.model_role, end = CHAT_FORMATS[arch]
        self.end_id = r.fields["tokenizer.ggml.tokens"].contents().index(end)
        self.system = ""
        if "tokenizer.chat_template" in r.fields:
            self.system = default_system_turn(r.fields["tokenizer.chat_template"].contents(), self.turn)

    def text(self, prompt, context=()):
        """The chat up to the opening of the model's reply to `prompt`, after the earlier turns in
        `context` (chat messages: role "user" or "assistant", and content)."""
        if self.frame:
            if context:
                raise ValueError("a completion frame takes one prompt, not a conversation")
            return self.frame.format(prompt)
        role = lambda r: self.model_role if r == "assistant" else r
        turns = [self.turn.format(role=role(m["role"]), content=m["content"]) for m in context]
        return self.system + "".join(turns) + self.turn.format(role="user", content=prompt) + self.reply


def default_system_turn(template, turn):
    """The system turn a Jinja chat template writes as a literal when the messages bring none
    (SmolLM2: `{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system ...' }}`;
    Qwen2.5: `{%- if messages[0]['role'] == 'system' %}...{%- else %}{{- '<|im_start|>system\\n...' }}`,
    a \\n in the literal being a newline), or "" for a template without one."""
    opening, closing = turn.split("{content}")
    opening = opening.format(role="system")
    template = template.replace("\\n", "\n")
    literal = r"\{\{-?\s*'(" + re.escape(opening) + r"[^']*?" + re.escape(closing) + r")'"
    m = re.search(r"messages\[0\]\[.role.\]\s*!=\s*.system.\s*%\}" + literal, template, re.S) or \
        re.search(r"messages\[0\]\[.role.\]\s*==\s*.system.\s*-?%\}.*?\{%-?\s*else\s*-?%\}\s*" + literal, template, re.S)
    return m.group(1) if m else ""


def prompt_and_reply(bin_path, model, chat, r, n, teacher_forced=False):
    """A reply record's (prompt ids, reply ids) as the target reads them: the reply's ids are those
    of the whole text after the prompt's, and a reply that ended before its n-token budget gets the
    end-of-turn token its text does not show (not a teacher-forced text, which spells any end token)."""
    text = chat.text(r["prompt"], r.get("context", ()))
    prompt = tokenize(bin_path, model, text)
    reply = tokenize(bin_path, model, text + r["response"])[len(prompt):]
    if not teacher_forced and len(reply) < n - 4:
        reply.append(chat.end_id)
    return prompt, reply


_servers = {}


def tokenize(bin_path, model, text):
    """Token ids of text as llama-tokenize (bin_path) gives them: BOS added where the model asks for
    it, special tokens parsed. Through one llama-server per model beside bin_path (its /tokenize),
    started on first use: llama-tokenize reloads the vocabulary on every call, 0.4 s for Gemma 3's
    262144 tokens, which was most of the feature extraction's time. bin_path may be specula itself:
    then `specula serve`'s /tokenize (the same tokenizer, llama.cpp's), for a build without llama.cpp's tools."""
    key = (bin_path, model)
    if key not in _servers:
        if os.path.basename(bin_path) == "specula":
            _servers[key] = _start_tokenizer_server(bin_path, model, specula=True)
        else:
            _servers[key] = _start_tokenizer_server(os.path.join(os.path.dirname(bin_path), "llama-server"), model)
    req = urllib.request.Request(_servers[key][1] + "/tokenize", headers={"Content-Type": "application/json"},
                                 data=json.dumps({"content": text, "add_special": True, "parse_special": True}).encode())
    with urllib.request.urlopen(req, timeout=60) as r:
        return json.load(r)["tokens"]


def _start_tokenizer_server(server_bin, model, specula=False):
    import atexit, socket, time, urllib.error
    if not os.path.exists(server_bin):
        sys.exit(f"chat_format: {server_bin} is missing: cmake --build build --target llama-server")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    args = ["--host", "127.0.0.1", "--port", str(port), "-c", "4096", "-t", "1"]
    cmd = [server_bin, "-q", "serve", "-m", model, "--no-spec"] + args if specula else [server_bin, "-m", model, "--no-webui"] + args
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    atexit.register(proc.terminate)
    url = f"http://127.0.0.1:{port}"
    for _ in range(600):
        if proc.poll() is not None:
            sys.exit(f"chat_format: llama-server exited ({proc.returncode}) loading {model}")
        try:
            with urllib.request.urlopen(url + "/health", timeout=2) as r:
                if r.status == 200:
                    return proc, url
        except (urllib.error.URLError, OSError):
            time.sleep(0.2)
    sys.exit(f"chat_format: llama-server did not come up for {model}")
