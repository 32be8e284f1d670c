"""`specula serve` against hostile or careless HTTP clients, through real sockets on 127.0.0.1: bodies
over the limit whatever their framing, clients that trickle their request, oversized heads, more
connections than the cap, kept-alive connections left idle, unknown routes, and SIGTERM during a stream. After each attack the server
must still answer /health and give a fixed greedy request the text it gave before. Each test
states the breakage it catches; none asserts a time (the timeouts below only bound a failing run)."""
import json
import select
import signal
import socket
import threading
import time
import urllib.error
import urllib.request

from serving import greedy_text, port_of, read_message, read_response, serve


def health(base, timeout=10):
    with urllib.request.urlopen(base + "/health", timeout=timeout) as r:
        return r.status


def read_status(sock, timeout=20):
    """The status code of the response on `sock`, or None when the server closed it without one."""
    sock.settimeout(timeout)
    data = b""
    try:
        while b"\r\n" not in data:
            chunk = sock.recv(4096)
            if not chunk:
                break
            data += chunk
    except ConnectionResetError:
        pass
    return int(data.split(b" ")[1]) if data.startswith(b"HTTP/1.1 ") else None


def test_a_prompt_that_cannot_be_prepared_within_the_request_timeout_gets_408():
    # Catches: a prompt's tokenization (uninterruptible, seconds for a few MiB) holding its handler
    # thread past --request-timeout, answered whenever it ends. Three MiB take far longer than
    # 0.2 s to tokenize on any machine; the server must answer the next request meanwhile.
    with serve("--head-timeout", "0.2", "--request-timeout", "0.2", "--max-request-bytes", str(4 << 20)) as (_, base):
        before = greedy_text(base)
        sock = socket.create_connection(("127.0.0.1", port_of(base)))
        data = json.dumps({"prompt": "hello world " * ((3 << 20) // 12), "max_tokens": 1}).encode()
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                     b"Content-Length: %d\r\n\r\n" % len(data) + data)
        status, body = read_response(sock, timeout=120)
        sock.close()
        assert status == 408, body
        assert body["error"]["code"] == "request_timeout" and "could not be prepared" in body["error"]["message"], body
        assert health(base) == 200
        assert greedy_text(base) == before


def test_a_body_over_the_limit_gets_413_whatever_its_framing():
    # Catches: the body limit checked against Content-Length only, so that a 10 MiB chunked body
    # (or one with no length at all) is read whole and answered 400.
    with serve("--max-request-bytes", "1048576") as (_, base):
        before = greedy_text(base)
        for framing in ("Transfer-Encoding: chunked", "Connection: close"):
            sock = socket.create_connection(("127.0.0.1", port_of(base)))
            piece = b" " * 65536
            chunk = (b"%x\r\n" % len(piece) + piece + b"\r\n") if "chunked" in framing else piece
            # With neither length nor chunks the request has no body (RFC 9112) but what already
            # follows its head, which the server reads up to the limit: the head goes with a chunk.
            sock.sendall(f"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n{framing}\r\n\r\n".encode()
                         + chunk)

            def send_body():
                try:
                    for _ in range(159):  # 10 MiB in all
                        sock.sendall(chunk)
                except OSError:
                    pass  # the server answered and closed: the rest of the body is not wanted

            sender = threading.Thread(target=send_body)
            sender.start()
            status, body = read_response(sock)
            sender.join()
            sock.close()
            assert status == 413, (framing, body)
            assert body["error"]["code"] == "request_too_large", body
            assert health(base) == 200
        assert greedy_text(base) == before


def test_clients_trickling_their_head_hold_no_thread_and_get_408():
    # Catches: a fixed pool of threads, each held by a client that sends a header line a second
    # (with no deadline for the head), so that 40 such clients keep /health and /metrics from answering.
    with serve("--parallel", "2", "--queue", "4", "--head-timeout", "4", "--request-timeout", "6") as (_, base):
        before = greedy_text(base)
        head = b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n" + b"X-Slow: 1\r\n" * 100
        socks = [socket.create_connection(("127.0.0.1", port_of(base))) for _ in range(40)]
        replies = {}  # socket index -> what the server sent before it closed
        stop = threading.Event()

        def trickle():
            for i in range(len(head)):
                if stop.is_set():
                    return
                for k, s in enumerate(socks):
                    if k in replies:
                        continue
                    try:
                        s.send(head[i:i + 1])
                    except OSError:
                        replies[k] = b""
                readable, _, _ = select.select([s for k, s in enumerate(socks) if k not in replies], [], [], 1.0)
                for s in readable:
                    try:
                        replies[socks.index(s)] = s.recv(4096)
                    except OSError:
                        replies[socks.index(s)] = b""
                if len(replies) == len(socks):
                    return

        trickler = threading.Thread(target=trickle)
        trickler.start()
        try:
            for _ in range(3):  # while the tricklers hold their sockets
                assert health(base, timeout=3) == 200
                with urllib.request.urlopen(base + "/metrics", timeout=3) as r:
                    assert b"specula:requests_processing" in r.read()
                time.sleep(0.5)
            trickler.join(timeout=20)
            assert len(replies) == len(socks), f"only {len(replies)} of {len(socks)} trickling clients were closed"
            assert all(r.startswith(b"HTTP/1.1 408") for r in replies.values() if r), replies
        finally:
            stop.set()
            trickler.join()
            for s in socks:
                s.close()
        assert greedy_text(base) == before


def test_a_body_past_the_request_deadline_gets_408():
    # Catches: no deadline for the body, so that a client sending its body a byte at a time holds
    # a thread for as long as it likes.
    with serve("--head-timeout", "2", "--request-timeout", "3") as (_, base):
        before = greedy_text(base)
        sock = socket.create_connection(("127.0.0.1", port_of(base)))
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n{")
        status = None
        for _ in range(20):
            readable, _, _ = select.select([sock], [], [], 1.0)
            if readable:
                status = read_status(sock)
                break
            sock.send(b" ")
        sock.close()
        assert status == 408
        assert greedy_text(base) == before


def test_an_oversized_head_is_refused_and_the_server_lives_on():
    # Catches: a head of any size read whole, or a crash on one.
    with serve() as (_, base):
        before = greedy_text(base)
        for head in (b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Big: " + b"a" * 65536 + b"\r\n\r\n",
                     b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n" + b"".join(b"X-%d: 1\r\n" % i for i in range(200)) + b"\r\n"):
            sock = socket.create_connection(("127.0.0.1", port_of(base)))
            try:
                sock.sendall(head)
            except OSError:
                pass
            status = read_status(sock)
            sock.close()
            assert status in (400, 431), status
            assert health(base) == 200
        assert greedy_text(base) == before


def test_connections_over_the_cap_get_503():
    # Catches: no cap on open connections, so that idle sockets pile up without bound. Five sockets
    # against a cap of four: one of them is refused at once with 503, the others wait for their head
    # (408 after its deadline). Which one is refused depends on when the server counts the greedy
    # request's connection as closed, so the test asks that the first answer on any of them be 503.
    with serve("--max-connections", "4") as (_, base):
        before = greedy_text(base)
        opened = [socket.create_connection(("127.0.0.1", port_of(base))) for _ in range(5)]
        try:
            readable, _, _ = select.select(opened, [], [], 20)
            assert readable, "no answer on any of five connections against a cap of four"
            assert read_status(readable[0]) == 503
        finally:
            for s in opened:
                s.close()
        for _ in range(100):  # the server sees the idle sockets close
            try:
                if health(base) == 200:
                    break
            except OSError:
                time.sleep(0.1)
        assert greedy_text(base) == before


def keep_alive_request(sock, path="/health"):
    """A GET on `sock` that leaves the connection open; (status, headers lower-cased)."""
    sock.sendall(f"GET {path} HTTP/1.1\r\nHost: localhost\r\n\r\n".encode())
    status, headers, _ = read_message(sock)
    return status, headers


def test_a_kept_alive_connection_carries_several_requests():
    # Catches: one request per connection ("Connection: close"), so that every request of an
    # application pays a new connection; or a second request on the connection never answered.
    with serve() as (_, base):
        sock = socket.create_connection(("127.0.0.1", port_of(base)))
        try:
            for _ in range(3):
                status, headers = keep_alive_request(sock)
                assert status == 200 and headers.get("connection") != "close" and "keep-alive" in headers, headers
            body = json.dumps({"prompt": "def f(x):", "max_tokens": 16, "temperature": 0}).encode()
            sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
                         b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
            status, reply = read_response(sock)
            assert status == 200 and reply["choices"][0]["text"] == greedy_text(base), reply
        finally:
            sock.close()


def test_idle_kept_alive_connections_give_way_to_new_clients_and_close_at_the_head_deadline():
    # Catches: idle kept-alive connections holding every connection (or a worker thread each), so
    # that new clients get 503; an idle one answered with a 408 no request asked for; and a kept
    # connection that trickles its next head escaping the head deadline.
    with serve("--max-connections", "4", "--head-timeout", "1", "--request-timeout", "30") as (_, base):
        before = greedy_text(base)
        kept = []
        try:
            # The connection greedy_text closed counts until the server has seen it close: a 503
            # then is that, and the client comes again.
            for _ in range(4):
                for _ in range(100):
                    sock = socket.create_connection(("127.0.0.1", port_of(base)))
                    if keep_alive_request(sock)[0] == 200:
                        break
                    sock.close()
                    time.sleep(0.05)
                else:
                    raise AssertionError("a kept-alive client never served")
                kept.append(sock)
            for _ in range(3):  # more new clients than there are idle connections to spare: each served
                fresh = socket.create_connection(("127.0.0.1", port_of(base)))
                assert keep_alive_request(fresh)[0] == 200
                kept.append(fresh)
            # Left idle, each is closed without a response once the head deadline passes.
            for sock in kept:
                sock.settimeout(20)
                try:
                    assert sock.recv(4096) == b""
                except ConnectionResetError:
                    pass
            trickler = socket.create_connection(("127.0.0.1", port_of(base)))
            kept.append(trickler)
            assert keep_alive_request(trickler)[0] == 200
            trickler.sendall(b"GET /health HTTP/1.1\r\n")  # and never the rest of the head
            assert read_status(trickler) == 408
        finally:
            for sock in kept:
                sock.close()
        assert health(base) == 200 and greedy_text(base) == before


def test_unknown_routes_and_methods_get_an_openai_error():
    # Catches: cpp-httplib's bare 404 (no JSON body) for an unknown route or a known one asked with
    # the wrong method.
    with serve() as (_, base):
        try:
            urllib.request.urlopen(base + "/v1/nothing-here")
            raise AssertionError("no 404")
        except urllib.error.HTTPError as e:
            assert e.code == 404 and json.loads(e.read())["error"]["type"] == "not_found_error"
        try:
            urllib.request.urlopen(base + "/v1/chat/completions")
            raise AssertionError("no 405")
        except urllib.error.HTTPError as e:
            assert e.code == 405 and e.headers["Allow"] == "POST"
            assert "message" in json.loads(e.read())["error"]


def test_sigterm_ends_streams_cleanly_and_exits_0():
    # Catches: SIGTERM killing the process (streams reset mid-answer, a non-zero exit), or a
    # shutdown that never ends.
    with serve("--shutdown-timeout", "1", "-c", "2048") as (proc, base):
        sock = socket.create_connection(("127.0.0.1", port_of(base)))
        body = json.dumps({"prompt": "import", "max_tokens": 2000, "ignore_eos": True, "temperature": 0, "stream": True}).encode()
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(body)
                     + body)
        sock.settimeout(30)
        received = b""
        while b"data: " not in received:
            chunk = sock.recv(65536)
            assert chunk, received
            received += chunk
        proc.send_signal(signal.SIGTERM)
        while True:
            chunk = sock.recv(65536)
            if not chunk:
                break
            received += chunk
        sock.close()
        events = [line[len("data: "):] for line in received.decode(errors="replace").split("\n") if line.startswith("data: ")]
        assert events[-1] == "[DONE]", events[-3:]
        last = json.loads(events[-2])
        assert "error" in last or last["choices"][0]["finish_reason"] == "length", last
        assert proc.wait(timeout=20) == 0
