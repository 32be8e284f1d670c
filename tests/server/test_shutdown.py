"""The shutdown never waits on a thread that cannot stop (docs/server.md, "Shutdown"): a request
whose computation outlasts --shutdown-timeout + 5 s is abandoned, the process naming it on stderr
and exiting with status 3; a second signal exits at once with 128 + its number. Each test states
the breakage it catches."""
import json
import signal
import socket
import time
import urllib.parse

from serving import serve

# A prompt whose tokenization takes far longer than the shutdown's 5 s past its timeout (about
# 30 s on a 2-core VM): the handler's thread is busy in llama.cpp's tokenizer, which nothing can
# interrupt.
PROMPT_BYTES = 16_000_000


def send(base, body):
    """Sends a POST /v1/completions whole on a new socket and returns the socket, unread."""
    sock = socket.create_connection(("127.0.0.1", urllib.parse.urlsplit(base).port))
    data = json.dumps(body).encode()
    sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n"
                 % len(data) + data)
    return sock


# Catches: a shutdown that joins a handler thread stuck in a computation (the process then runs
# until the computation ends, or until SIGKILL), or one that abandons it without saying what.
def test_a_request_stuck_in_a_computation_is_abandoned_with_status_3():
    with serve("--max-request-bytes", str(PROMPT_BYTES + 1000), "--shutdown-timeout", "0", "-c", "512") as (proc, base):
        sock = send(base, {"prompt": "hello world " * (PROMPT_BYTES // 12), "max_tokens": 1})
        time.sleep(2)  # the body read, its tokenization under way
        proc.send_signal(signal.SIGTERM)
        # The tokenization alone would take several times this bound.
        assert proc.wait(timeout=60) == 3
        sock.close()
        time.sleep(0.2)  # the last stderr lines reach proc.log
        log = "".join(proc.log)
        assert "abandoning POST /v1/completions (" in log and "exiting with status 3" in log, log


# Catches: a second SIGINT or SIGTERM ignored during the shutdown's grace (the signals stay
# blocked, and the operator's only way out is SIGKILL).
def test_a_second_signal_exits_at_once():
    with serve("--shutdown-timeout", "60", "-c", "2048") as (proc, base):
        sock = send(base, {"prompt": "import", "max_tokens": 2000, "ignore_eos": True, "temperature": 0, "stream": True})
        sock.settimeout(30)
        received = b""
        while b"data: " not in received:
            chunk = sock.recv(65536)
            assert chunk, received
            received += chunk
        proc.send_signal(signal.SIGINT)
        time.sleep(0.5)
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=20) == 130
        sock.close()
        time.sleep(0.2)
        assert "SIGINT again: exiting at once with status 130" in "".join(proc.log), proc.log
