"""Who may use `specula serve`, end to end (docs/server.md, "Access"): API keys through the real
`openai` client, JSON-only POSTs, foreign origins and CORS preflights, the Host check against DNS
rebinding. After each refused request the server must still answer /health. Each test states the
breakage it catches."""
import http.client
import json
import os
import subprocess
import tempfile
import urllib.parse

import openai
import pytest

from serving import CLI, TARGET, serve

CHAT = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4, "temperature": 0}


def request(base, method, path, body=None, headers=None):
    """(status, headers as a lower-case dict, parsed JSON body or text) of one request on a new connection."""
    conn = http.client.HTTPConnection(urllib.parse.urlsplit(base).netloc, timeout=120)
    try:
        conn.request(method, path, body=body, headers=headers or {})
        r = conn.getresponse()
        text = r.read().decode()
        try:
            payload = json.loads(text)
        except ValueError:
            payload = text
        return r.status, {k.lower(): v for k, v in r.getheaders()}, payload
    finally:
        conn.close()


def assert_healthy(base):
    status, _, body = request(base, "GET", "/health")
    assert (status, body) == (200, {"status": "ok"})


def assert_openai_error(body, code):
    assert set(body["error"]) == {"message", "type", "param", "code"}, body
    assert body["error"]["code"] == code and body["error"]["param"] is None and body["error"]["message"], body


def client(base, key):
    return openai.OpenAI(base_url=base + "/v1", api_key=key, max_retries=0, timeout=120)


# Catches a server that answers without the key, refuses the right one, or locks /health and the
# page's HTML (a health check and a browser opening the page carry no key).
def test_the_right_key_works_and_a_wrong_key_is_refused():
    with serve("--api-key", "sk-first", "--api-key", "sk-second") as (_, base):
        for key in ("sk-first", "sk-second"):
            c = client(base, key)
            assert [m.id for m in c.models.list()] == ["specula-target"]
            assert c.completions.create(model="specula-target", prompt="def", max_tokens=4, temperature=0).choices[0].text
        for key in ("sk-wrong", "sk-firs", "sk-first2"):
            with pytest.raises(openai.AuthenticationError) as refused:
                client(base, key).chat.completions.create(model="specula-target", **CHAT)
            assert refused.value.status_code == 401 and refused.value.code == "invalid_api_key"
            assert refused.value.type == "authentication_error"  # llama-server's, which its clients and tests check
            assert_healthy(base)
        for path in ("/v1/models", "/metrics", "/metrics.json", "/slots"):
            status, headers, body = request(base, "GET", path)
            assert status == 401 and headers.get("www-authenticate") == "Bearer", path
            assert_openai_error(body, "invalid_api_key")
            assert request(base, "GET", path, headers={"Authorization": "Bearer sk-second"})[0] == 200, path
            assert request(base, "GET", path, headers={"X-Api-Key": "sk-first"})[0] == 200, path
        status, headers, page = request(base, "GET", "/")
        assert status == 200 and headers["content-type"].startswith("text/html") and "<html" in page
        assert_healthy(base)


# Catches keys from the environment or a key file ignored (a server the operator believes locked).
def test_keys_from_the_environment_and_a_file():
    with tempfile.NamedTemporaryFile("w", suffix=".keys") as keys:
        keys.write("# the team's keys\nsk-from-file\n")
        keys.flush()
        with serve("--api-key-file", keys.name, env={**os.environ, "SPECULA_API_KEY": "sk-from-env"}) as (_, base):
            for key in ("sk-from-file", "sk-from-env"):
                assert [m.id for m in client(base, key).models.list()] == ["specula-target"], key
            with pytest.raises(openai.AuthenticationError):
                client(base, "unused").models.list()
            assert_healthy(base)


# Catches a body parsed whatever its Content-Type: a foreign page's text/plain POST needs no CORS
# preflight. The refused body is never read, so it must not be taken for the next request on the
# same connection.
def test_a_post_that_is_not_json_gets_415_and_the_connection_stays_usable():
    with serve() as (_, base):
        conn = http.client.HTTPConnection(urllib.parse.urlsplit(base).netloc, timeout=120)
        for content_type in ("text/plain", "application/x-www-form-urlencoded"):
            conn.request("POST", "/v1/chat/completions", body=json.dumps(CHAT), headers={"Content-Type": content_type})
            r = conn.getresponse()
            body = json.loads(r.read())
            assert r.status == 415, (content_type, body)
            assert_openai_error(body, "unsupported_media_type")
            conn.request("GET", "/health")
            r = conn.getresponse()
            assert (r.status, json.loads(r.read())) == (200, {"status": "ok"}), content_type
        conn.close()
        status, _, body = request(base, "POST", "/v1/chat/completions", json.dumps(CHAT), {"Content-Type": "application/json; charset=utf-8"})
        assert status == 200 and body["choices"][0]["message"]["content"], body


# Catches a foreign web page driving the server: a request carrying another site's Origin is
# refused whatever its type, and nothing tells the browser it may read the answer; the server's own
# page (its own origin) still works.
def test_a_foreign_origin_gets_403_and_no_cors_header():
    with serve() as (_, base):
        for headers in ({"Content-Type": "text/plain"}, {"Content-Type": "application/json"}):
            status, response_headers, body = request(base, "POST", "/v1/chat/completions", json.dumps(CHAT),
                                                     {"Origin": "http://evil.example", **headers})
            assert status == 403, body
            assert_openai_error(body, "origin_not_allowed")
            assert "access-control-allow-origin" not in response_headers
            assert_healthy(base)
        status, response_headers, _ = request(base, "GET", "/metrics.json", headers={"Origin": "http://evil.example"})
        assert status == 403 and "access-control-allow-origin" not in response_headers
        preflight = {"Origin": "http://evil.example", "Access-Control-Request-Method": "POST",
                     "Access-Control-Request-Headers": "content-type"}
        status, response_headers, _ = request(base, "OPTIONS", "/v1/chat/completions", headers=preflight)
        assert status == 200 and "access-control-allow-origin" not in response_headers  # llama-server's answer: the browser sends nothing
        status, _, body = request(base, "POST", "/v1/chat/completions", json.dumps(CHAT), {"Origin": base, "Content-Type": "application/json"})
        assert status == 200 and body["choices"][0]["message"]["content"], body
        assert_healthy(base)


# Catches a preflight refused for an allowed origin (browsers send no key on it) or an allowed
# page unable to read the answer (no Access-Control-Allow-Origin).
def test_with_cors_origin_the_preflight_and_the_request_work():
    origin = "http://localhost:3000"
    with serve("--cors-origin", origin, "--api-key", "sk-page") as (_, base):
        status, headers, _ = request(base, "OPTIONS", "/v1/chat/completions", headers={
            "Origin": origin, "Access-Control-Request-Method": "POST", "Access-Control-Request-Headers": "authorization,content-type"})
        assert status == 200
        assert headers["access-control-allow-origin"] == origin
        assert "POST" in headers["access-control-allow-methods"]
        allowed = headers["access-control-allow-headers"].lower()
        assert "authorization" in allowed and "content-type" in allowed
        status, headers, body = request(base, "POST", "/v1/chat/completions", json.dumps(CHAT),
                                        {"Origin": origin, "Content-Type": "application/json", "Authorization": "Bearer sk-page"})
        assert status == 200 and headers["access-control-allow-origin"] == origin, body
        status, headers, body = request(base, "POST", "/v1/chat/completions", json.dumps(CHAT), {"Origin": origin, "Content-Type": "application/json"})
        assert status == 401 and headers["access-control-allow-origin"] == origin, body
        status, headers, _ = request(base, "GET", "/v1/models", headers={"Origin": "http://localhost:3001", "Authorization": "Bearer sk-page"})
        assert status == 403 and "access-control-allow-origin" not in headers
        assert_healthy(base)


# Catches --cors-origin localhost (llama-server's value: any page of this machine, at any port)
# refused at start or not reflected, or a foreign page let through.
def test_cors_origin_localhost_allows_the_pages_of_this_machine():
    with serve("--cors-origin", "localhost") as (_, base):
        for origin in ("http://localhost:5173", "http://127.0.0.1", "http://[::1]:3000"):
            status, headers, _ = request(base, "OPTIONS", "/v1/completions", headers={"Origin": origin, "Access-Control-Request-Method": "POST"})
            assert status == 200 and headers["access-control-allow-origin"] == origin, origin
            status, headers, body = request(base, "POST", "/v1/chat/completions", json.dumps(CHAT), {"Origin": origin, "Content-Type": "application/json"})
            assert status == 200 and headers["access-control-allow-origin"] == origin, body
        status, headers, _ = request(base, "POST", "/v1/chat/completions", json.dumps(CHAT),
                                     {"Origin": "http://localhost.evil.example", "Content-Type": "application/json"})
        assert status == 403 and "access-control-allow-origin" not in headers
        assert_healthy(base)


# Catches DNS rebinding: a page on evil.example whose name now resolves to 127.0.0.1 is the
# server's "own" origin, so only its Host header gives it away.
def test_a_foreign_host_on_a_loopback_bind_gets_403():
    with serve() as (_, base):
        port = urllib.parse.urlsplit(base).port
        for host in (f"evil.example:{port}", "evil.example"):
            status, _, body = request(base, "GET", "/v1/models", headers={"Host": host})
            assert status == 403, (host, body)
            assert_openai_error(body, "host_not_allowed")
            status, _, body = request(base, "POST", "/v1/chat/completions", json.dumps(CHAT),
                                      {"Host": host, "Origin": f"http://{host}", "Content-Type": "application/json"})
            assert status == 403, (host, body)
            assert_healthy(base)
        for host in (f"localhost:{port}", f"127.0.0.1:{port}", f"[::1]:{port}"):
            assert request(base, "GET", "/v1/models", headers={"Host": host})[0] == 200, host
    with serve("--allowed-host", "specula.example") as (_, base):
        assert request(base, "GET", "/v1/models", headers={"Host": "specula.example"})[0] == 200
        assert request(base, "GET", "/v1/models", headers={"Host": "evil.example"})[0] == 403
        assert_healthy(base)


# Catches the Host check left to loopback binds: bound to every interface without a key, a
# rebound page's requests (Host: its own name) were answered, and --allowed-host was ignored.
def test_a_foreign_host_on_any_bind_gets_403_and_allowed_hosts_apply():
    with serve("--host", "0.0.0.0", "--allowed-host", "specula.example") as (proc, base):
        port = urllib.parse.urlsplit(base).port
        for host in (f"evil.example:{port}", "evil.example"):
            status, _, body = request(base, "POST", "/v1/chat/completions", json.dumps(CHAT),
                                      {"Host": host, "Origin": f"http://{host}", "Content-Type": "application/json"})
            assert status == 403, (host, body)
            assert_openai_error(body, "host_not_allowed")
        for host in (f"specula.example:{port}", f"localhost:{port}", f"192.0.2.7:{port}", f"[2001:db8::7]:{port}"):
            assert request(base, "GET", "/v1/models", headers={"Host": host})[0] == 200, host
        assert_healthy(base)
    with serve("--host", "0.0.0.0", "--allowed-host", "*") as (_, base):
        assert request(base, "GET", "/v1/models", headers={"Host": "any.example"})[0] == 200


# Catches a flag value that can never match accepted silently: the server must not start.
def test_bad_access_flags_are_refused_naming_them():
    for args, says in ((["--cors-origin", "http://localhost:3000/"], "is not an origin"),
                       (["--api-key", "has space"], "API key 1 of 1"),
                       (["--api-key-file", "/nonexistent/keys"], "cannot read the API key file /nonexistent/keys")):
        r = subprocess.run([CLI, "serve", "-m", TARGET, "--port", "0", *args], capture_output=True, text=True, timeout=120)
        assert r.returncode == 1 and "specula: error:" in r.stderr and says in r.stderr, (args, r.stderr)
        assert "listening" not in r.stderr
