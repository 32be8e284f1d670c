#!/usr/bin/env python3
"""Renders the conversations of tests/chat/conversations.json with llama.cpp's own server
(POST /apply-template) for SmolLM2-135M-Instruct (with its own template and with
tests/chat/tool_template.jinja) and Gemma 3 270M, into tests/chat/renderings.json,
which test_chat_template compares specula's renderings with.

SmolLM2 renders with the Jinja template in its file, as llama-server does by default. The Gemma 3
GGUF carries no template; specula then uses llama.cpp's built-in "gemma" template, which is what
llama-server renders with `--no-jinja --chat-template gemma`.
Usage: scripts/chat_renderings.py [LLAMA_SERVER] (default build/bin/llama-server; `cmake --build
build --target llama-server`). Needs the models in the model cache (scripts/fetch_models.sh)."""
import json
import os
import socket
import subprocess
import sys
import time
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CACHE = os.environ.get("SPECULA_MODEL_CACHE", os.path.expanduser("~/.cache/specula/models"))
# rendering name -> (model file, llama-server flags)
RENDERINGS = {
    "SmolLM2-135M-Instruct.Q4_1.gguf": ("SmolLM2-135M-Instruct.Q4_1.gguf", []),
    "gemma-3-270m-q4_k_m.gguf": ("gemma-3-270m-q4_k_m.gguf", ["--no-jinja", "--chat-template", "gemma"]),
    # specula --chat-template tests/chat/tool_template.jinja
    "SmolLM2-135M-Instruct.Q4_1.gguf+tool_template.jinja":
        ("SmolLM2-135M-Instruct.Q4_1.gguf", ["--chat-template-file", os.path.join(ROOT, "tests/chat/tool_template.jinja")]),
}


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def post(port, body):
    request = urllib.request.Request(f"http://127.0.0.1:{port}/apply-template", json.dumps(body).encode(),
                                     {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=60) as response:
        return json.load(response)["prompt"]


def render(server, model, flags, conversations):
    port = free_port()
    proc = subprocess.Popen([server, "-m", os.path.join(CACHE, model), "--port", str(port), "-c", "512", "-t", "1", *flags],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(600):
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5) as r:
                    if r.status == 200:
                        break
            except Exception:
                time.sleep(0.1)
        out = {}
        for name, body in conversations.items():
            if "tools" in body and "--chat-template-file" not in flags:
                continue  # specula refuses tools a template does not show (llama-server drops them)
            out[name] = post(port, body)
        return out
    finally:
        proc.terminate()
        proc.wait()


def main():
    server = sys.argv[1] if len(sys.argv) > 1 else os.path.join(ROOT, "build/bin/llama-server")
    with open(os.path.join(ROOT, "tests/chat/conversations.json")) as f:
        conversations = json.load(f)
    renderings = {name: render(server, model, flags, conversations) for name, (model, flags) in RENDERINGS.items()}
    with open(os.path.join(ROOT, "tests/chat/renderings.json"), "w") as f:
        json.dump(renderings, f, indent=2, ensure_ascii=False)
        f.write("\n")


if __name__ == "__main__":
    main()
