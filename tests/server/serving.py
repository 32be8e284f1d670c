"""Starting `specula serve` for the end-to-end tests: one function for every test module."""
import contextlib
import json
import os
import re
import subprocess
import threading
import time
import urllib.error
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CLI = os.environ.get("SPECULA_CLI", os.path.join(ROOT, "build", "bin", "specula"))
TARGET = os.path.join(ROOT, "models", "specula-target.gguf")
DRAFT = os.path.join(ROOT, "models", "specula-draft.gguf")
SMOLLM2 = os.path.join(os.environ.get("SPECULA_MODEL_CACHE") or os.path.expanduser("~/.cache/specula/models"),
                       "SmolLM2-135M-Instruct.Q4_1.gguf")

# A greedy request whose text a server must still give after an attack (greedy_text).
GREEDY = {"prompt": "def f(x):", "max_tokens": 16, "temperature": 0}


# How long a server may take to start while its process is alive: far beyond any machine's need,
# and beyond a sanitized build's on a busy 2-core machine (a Qwen2.5-Coder server under
# ThreadSanitizer beside other jobs took over two minutes). A server that exits fails at once.
START_S = 900


@contextlib.contextmanager
def serve(*args, model=TARGET, ready=True, env=None):
    """`specula serve -m MODEL --port 0 -t 1 ARGS...` for the length of a `with`; yields (process, base URL).
    With ready=True it returns once /health answers 200, else once the port is printed. The server's
    later stderr lines are kept in `proc.log` (a list, filled by a thread so that the pipe never fills);
    its start-up lines, to the one that ended the wait, in `proc.startup`."""
    proc = subprocess.Popen([CLI, "serve", "-m", model, "--port", "0", "-t", "1", *args], stderr=subprocess.PIPE, text=True,
                            env=env)
    proc.startup, proc.log = [], []
    started = threading.Event()
    port = None

    def pump():
        nonlocal port
        for line in proc.stderr:
            if started.is_set():
                proc.log.append(line)
                continue
            proc.startup.append(line)
            m = re.search(r"listening on http://[^:]+:(\d+)", line)
            port = int(m.group(1)) if m else port
            if (port and not ready) or "ready" in line:
                started.set()
        started.set()  # stderr closed: the server exited

    try:
        threading.Thread(target=pump, daemon=True).start()
        deadline = time.monotonic() + START_S
        while not started.wait(0.5) and proc.poll() is None and time.monotonic() < deadline:
            pass
        assert port, (f"the server exited with {proc.returncode}" if proc.poll() is not None else
                      f"the server printed no port in {START_S} s") + ":\n" + "".join(proc.startup)
        base = f"http://127.0.0.1:{port}"
        while ready and proc.poll() is None and time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(base + "/health") as r:
                    if r.status == 200:
                        break
            except OSError:
                time.sleep(0.1)
        yield proc, base
    finally:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def post(base, path, body, timeout=120):
    """POSTs `body` (JSON-encoded, or bytes as they are); returns (status, the response's JSON), errors included."""
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    req = urllib.request.Request(base + path, data=data, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def greedy_text(base):
    """The text of the GREEDY completion; the request must succeed."""
    status, body = post(base, "/v1/completions", GREEDY)
    assert status == 200, body
    return body["choices"][0]["text"]


def port_of(base):
    return int(base.rsplit(":", 1)[1])


def read_message(sock, timeout=20):
    """(status, headers lower-cased, body bytes) of a Content-Length response on `sock`."""
    sock.settimeout(timeout)
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        assert chunk, f"the server closed the connection after {data!r}"
        data += chunk
    head, body = data.split(b"\r\n\r\n", 1)
    lines = head.decode().split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, v in (line.split(":", 1) for line in lines[1:])}
    while len(body) < int(headers.get("content-length", 0)):
        chunk = sock.recv(65536)
        assert chunk, "the server closed the connection inside the body"
        body += chunk
    return int(lines[0].split(" ")[1]), headers, body


def read_response(sock, timeout=20):
    """(status, body as JSON) of a Content-Length response on `sock`."""
    status, _, body = read_message(sock, timeout)
    return status, json.loads(body)


def get_json(url):
    with urllib.request.urlopen(url) as r:
        return json.loads(r.read())


def wait_for(condition, deadline_s=120):
    """Polls `condition` until it holds or a deadline far beyond any machine's need passes;
    returns whether it held. The tests wait on what the server shows, not on elapsed time."""
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.02)
    return condition()
