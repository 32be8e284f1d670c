"""Clients that shut their sending side after the request (shutdown(SHUT_WR), as curl-like clients
and `nc -N` do) still read the answer: only a connection closed for good or reset ends a request.
Raw sockets on 127.0.0.1; each test states the breakage it catches; none asserts a time."""
import json
import re
import socket
import struct
import urllib.request

from serving import get_json, port_of, read_response, serve, wait_for

LONG = {"prompt": "Once upon a time", "max_tokens": 3000, "ignore_eos": True, "temperature": 0}


def request_bytes(body, stream=False):
    data = json.dumps(dict(body, stream=stream)).encode()
    return (b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            b"Content-Length: " + str(len(data)).encode() + b"\r\n\r\n" + data)


def counter(base, name):
    metrics = urllib.request.urlopen(base + "/metrics").read().decode()
    return int(re.search(rf"^specula:{name} (\d+)", metrics, re.M).group(1))


def test_a_half_closed_client_gets_its_whole_non_streamed_answer():
    # Catches: the end of the client's sending side taken for a client gone, which cancels the
    # request (its slot freed, the answer never sent or cut short).
    with serve("--parallel", "1", "-c", "512") as (_, base):
        body = {"prompt": "def f(x):", "max_tokens": 48, "ignore_eos": True, "temperature": 0}
        with socket.create_connection(("127.0.0.1", port_of(base))) as sock:
            sock.sendall(request_bytes(body))
            sock.shutdown(socket.SHUT_WR)
            status, reply = read_response(sock, timeout=120)
        assert status == 200, reply
        assert reply["usage"]["completion_tokens"] == 48, reply
        assert reply["choices"][0]["finish_reason"] == "length"
        assert counter(base, "requests_cancelled_total") == 0
        with socket.create_connection(("127.0.0.1", port_of(base))) as sock:
            sock.sendall(request_bytes(body))
            status, whole = read_response(sock, timeout=120)
        assert status == 200 and whole["choices"][0]["text"] == reply["choices"][0]["text"]


def test_a_half_closed_client_gets_its_whole_stream():
    # Catches: a stream ended for a client that only shut its sending side.
    with serve("--parallel", "1", "-c", "512") as (_, base):
        with socket.create_connection(("127.0.0.1", port_of(base))) as sock:
            sock.sendall(request_bytes({"prompt": "def f(x):", "max_tokens": 48, "ignore_eos": True, "temperature": 0}, stream=True))
            sock.shutdown(socket.SHUT_WR)
            sock.settimeout(120)
            data = b""
            while not data.rstrip().endswith(b"0\r\n"):
                chunk = sock.recv(65536)
                if not chunk:
                    break
                data += chunk
        assert data.startswith(b"HTTP/1.1 200"), data[:80]
        assert b"data: [DONE]" in data, data[-200:]
        assert counter(base, "requests_cancelled_total") == 0


def close_while_generating(base, how):
    sock = socket.create_connection(("127.0.0.1", port_of(base)))
    sock.sendall(request_bytes(LONG))
    # llama-server's is_processing beside specula's state, which its clients poll.
    assert wait_for(lambda: (lambda s: s["n_generated"] > 0 and s["is_processing"] is True)(get_json(base + "/slots")[0])), \
        "the request never reached its slot"
    how(sock)
    sock.close()
    assert wait_for(lambda: (lambda s: s["state"] == "idle" and s["is_processing"] is False)(get_json(base + "/slots")[0])), "the slot stayed busy"
    assert counter(base, "requests_finished_total") == 0


def test_a_client_that_closes_or_resets_still_frees_its_slot():
    # Catches: a half close told apart from a close by never cancelling at all: a client gone
    # for good (closed, or reset) must still free its slot, not have its 3000 tokens generated.
    with serve("--parallel", "1", "-c", "4096") as (_, base):
        close_while_generating(base, lambda sock: None)
        assert counter(base, "requests_cancelled_total") == 1
        close_while_generating(base, lambda sock: sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0)))
        assert counter(base, "requests_cancelled_total") == 2
        close_while_generating(base, lambda sock: sock.shutdown(socket.SHUT_WR))  # then closed
        assert counter(base, "requests_cancelled_total") == 3
