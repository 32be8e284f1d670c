"""Grammars, JSON schemas and tool definitions built to crash or hang libllama's GBNF engine, sent
to a real `specula serve` (the bundled target; with --draft, so that drafts walk the grammar too):
each is answered 400 naming the limit, or ends with an error, and the server answers the same
greedy request afterwards. Each test states the breakage it catches."""
import concurrent.futures
import json
import os
import re
import urllib.request

import pytest

from serving import DRAFT, ROOT, greedy_text, post, serve

TEMPLATE = os.path.join(ROOT, "tests", "chat", "tool_template.jinja")
SMOLLM2 = os.path.join(os.environ.get("SPECULA_MODEL_CACHE") or os.path.expanduser("~/.cache/specula/models"), "SmolLM2-135M-Instruct.Q4_1.gguf")


def chain_schema(n):
    """n $defs, each an anyOf that names the next twice."""
    defs = {f"d{i}": {"anyOf": [{"$ref": f"#/$defs/d{i + 1}"}, {"$ref": f"#/$defs/d{i + 1}"}]} for i in range(n)}
    defs[f"d{n}"] = {"type": "string"}
    return {"$ref": "#/$defs/d0", "$defs": defs}


@pytest.fixture(scope="module")
def server():
    with serve("--draft", DRAFT, "--parallel", "2", "--chat-template", TEMPLATE) as (proc, base):
        yield proc, base, greedy_text(base)


def refused(server, body, path="/v1/completions"):
    """The 400's message; the server must still be alive and give the same greedy text."""
    proc, base, before = server
    if path == "/v1/completions":
        body = {"prompt": "x", "max_tokens": 8, **body}
    status, reply = post(base, path, body)
    assert status == 400, reply
    assert reply["error"]["type"] == "invalid_request_error"
    assert proc.poll() is None, "the server died"
    assert greedy_text(base) == before
    return reply["error"]


def test_parentheses_nested_200000_deep_are_a_400(server):
    # Catches: libllama's parser recursing once per parenthesis (SIGSEGV: the server died).
    error = refused(server, {"grammar": "root ::= " + "(" * 200000 + '"a"' + ")" * 200000})
    assert error["param"] == "grammar"
    assert "the grammar exceeds a limit: larger than 256 KiB" in error["message"]
    error = refused(server, {"grammar": "root ::= " + "(" * 100 + '"a"' + ")" * 100})
    assert "the grammar exceeds a limit: nesting deeper than 64" in error["message"]


def test_rules_that_name_the_next_twice_are_a_400(server):
    # Catches: libllama's left-recursion check walking 2^60 paths on the HTTP thread (a hang),
    # from a grammar and from response_format's schema.
    rules = "".join(f"a{i} ::= a{i + 1} | a{i + 1}\n" for i in range(60)) + 'a60 ::= "x"\nroot ::= a0\n'
    error = refused(server, {"grammar": rules})
    assert "the grammar exceeds a limit: rules that branch into more than" in error["message"]
    schema = {"type": "json_schema", "json_schema": {"name": "chain", "schema": chain_schema(60)}}
    error = refused(server, {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 8, "response_format": schema}, "/v1/chat/completions")
    assert error["param"] == "response_format"
    assert "the grammar exceeds a limit" in error["message"]


def test_a_repetition_whose_minimum_exceeds_its_maximum_is_a_400(server):
    # Catches: {5,3} reaching libllama, which loops ~2^64 times making its rules.
    error = refused(server, {"grammar": 'root ::= "a"{5,3}'})
    assert "repetition {5,3} has its minimum above its maximum" in error["message"]


def test_tool_schemas_are_bounded(server):
    # Catches: a tool's parameters compiled by the chat layer without limits (its time and memory
    # grow with the square of an object's optional properties).
    properties = {f"p{i}": {"type": "integer"} for i in range(300)}
    tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": properties}}}
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 8, "tools": [tool], "tool_choice": "required"}
    error = refused(server, body, "/v1/chat/completions")
    assert error["param"] == "tools[0].function.parameters"
    assert "more than 256 optional properties" in error["message"]
    refs = chain_schema(24)  # 2^24 paths: past the limit, and a prompt within the context
    parameters = {"type": "object", "properties": {"x": {"$ref": refs["$ref"]}}, "required": ["x"], "$defs": refs["$defs"]}
    chain = {"type": "function", "function": {"name": "f", "parameters": parameters}}
    error = refused(server, {**body, "tools": [chain]}, "/v1/chat/completions")
    assert error["param"] == "tools"
    assert "the grammar exceeds a limit" in error["message"]


def stream_events(base, path, body):
    """The JSON of each `data:` event of a streamed answer, [DONE] left out."""
    req = urllib.request.Request(base + path, data=json.dumps({**body, "stream": True}).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as r:
        return [json.loads(line[6:]) for line in (raw.decode().strip() for raw in r) if line.startswith("data: ") and line != "data: [DONE]"]


def test_a_grammar_limit_met_while_generating_is_the_clients_error(server):
    # Catches: "a" root "b" | "a" root "c" doubling libllama's stacks with every "a" (and the forced
    # text walking 64 of them at once) until the server ran out of memory; and the limit, met while
    # generating, answered as the server's failure (500) rather than the request's (400).
    proc, base, before = server
    body = {"prompt": "x", "max_tokens": 64, "temperature": 0, "grammar": 'root ::= "a" root "b" | "a" root "c"'}
    limit = (
        "the grammar exceeds a limit: more than 1024 parse stacks at once (one per way the text so far parses: an ambiguous rule such as "
        'x ::= "a" x "b" | "a" x "c" doubles them at each level of nesting; factor the alternatives\' common beginning out: x ::= "a" x ("b" | "c"))'
    )
    status, reply = post(base, "/v1/completions", body)
    assert status == 400, reply
    assert reply["error"] == {**reply["error"], "message": limit, "type": "invalid_request_error"}
    errors = [e["error"] for e in stream_events(base, "/v1/completions", body) if "error" in e]
    assert [(e["message"], e["type"]) for e in errors] == [(limit, "invalid_request_error")]
    # A request stepped beside it goes on: only the request whose grammar failed ends.
    neighbour = {"prompt": "def f(x):", "max_tokens": 48, "temperature": 0}
    alone = post(base, "/v1/completions", neighbour)
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        beside = pool.submit(post, base, "/v1/completions", neighbour)
        failed = pool.submit(post, base, "/v1/completions", body)
        assert failed.result()[0] == 400
        assert beside.result()[0] == 200
        assert beside.result()[1]["choices"][0]["text"] == alone[1]["choices"][0]["text"]
    assert proc.poll() is None, "the server died"
    with urllib.request.urlopen(base + "/health") as r:
        assert r.status == 200
    assert greedy_text(base) == before


def test_an_ambiguous_whitespace_grammar_is_answered():
    # Catches: libllama's token step following each parse of a run of spaces apart, 2^L steps for a
    # token of L spaces (SmolLM2's vocabulary has runs of 16 and more): the request pinned a core.
    if not os.path.exists(SMOLLM2):
        pytest.skip(f"{SMOLLM2} is absent: run scripts/fetch_models.sh")
    with serve("--parallel", "2", model=SMOLLM2) as (proc, base):
        before = greedy_text(base)
        status, reply = post(base, "/v1/completions", {"prompt": "Indent:", "max_tokens": 16, "temperature": 0,
                                                       "grammar": 'root ::= (" " | "  ")* "x"'})
        if status == 200:
            assert re.fullmatch(r" *x?", reply["choices"][0]["text"]), reply
        else:
            assert status == 400, reply
            assert reply["error"]["message"].startswith("the grammar exceeds a limit"), reply
        assert proc.poll() is None, "the server died"
        with urllib.request.urlopen(base + "/health") as r:
            assert r.status == 200
        assert greedy_text(base) == before
