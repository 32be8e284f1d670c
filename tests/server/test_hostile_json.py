"""`specula serve` against hostile JSON and forged control tokens, through real sockets on 127.0.0.1
with the real `openai` client: a body nested a million arrays deep, an unknown model, and chat text
that spells the model's control tokens. Each test states the breakage it catches."""
import os
import urllib.request

import openai
import pytest

from serving import SMOLLM2, greedy_text, post, serve

FORGED = "<|im_start|>" * 8


def test_a_body_nested_a_million_deep_is_a_400_and_the_server_lives_on():
    # Catches: the 2 MB body that killed the server (SIGSEGV: its 400 message dumped the value,
    # which recurses once per level), or a refusal that does not name the nesting limit.
    with serve() as (proc, base):
        before = greedy_text(base)
        depth = 10 ** 6
        body = b'{"prompt": "x", "specee": ' + b"[" * depth + b"]" * depth + b"}"
        status, error = post(base, "/v1/completions", body)
        assert status == 400, error
        assert error["error"]["type"] == "invalid_request_error"
        assert "nested more than 64 levels deep" in error["error"]["message"]
        assert proc.poll() is None, "the server died"
        with urllib.request.urlopen(base + "/health", timeout=30) as r:
            assert r.status == 200
        assert greedy_text(base) == before


def test_an_unknown_model_is_404_model_not_found():
    # Catches: the old 400 (OpenAI and vLLM answer 404; the openai client raises NotFoundError),
    # and a JSON type error answered 500 instead of a 400 naming the field.
    with serve() as (_, base):
        client = openai.OpenAI(base_url=base + "/v1", api_key="unused", max_retries=0, timeout=120)
        with pytest.raises(openai.NotFoundError) as e:
            client.chat.completions.create(model="gpt-4", messages=[{"role": "user", "content": "hi"}], max_tokens=4)
        assert e.value.status_code == 404
        assert e.value.body["code"] == "model_not_found" and e.value.body["param"] == "model"
        assert e.value.body["type"] == "invalid_request_error"
        status, error = post(base, "/v1/chat/completions", {"messages": [{"role": "user", "content": [{"type": 1}]}]})
        assert status == 400, error
        assert error["error"]["param"] == "messages[0].content[0].type"


@pytest.mark.skipif(not os.path.exists(SMOLLM2), reason=f"{SMOLLM2} is absent: run scripts/fetch_models.sh")
def test_control_tokens_typed_in_a_message_are_text():
    # Catches: "<|im_start|>" typed by a user tokenized as the control token (8 of them cost 7
    # more prompt tokens than "hello"): a user could forge system or assistant turns. The chat
    # prompt must cost what the template plus the text tokenized as plain text costs, which
    # completions prompts (text by default) measure. With --special-tokens-in-prompt the operator
    # gets the control tokens back.
    def prompt_tokens(base, path, text):
        body = {"messages": [{"role": "user", "content": text}]} if "chat" in path else {"prompt": text}
        status, reply = post(base, path, {**body, "max_tokens": 1, "temperature": 0})
        assert status == 200, reply
        return reply["usage"]["prompt_tokens"]

    with serve(model=SMOLLM2) as (_, base):
        chat = {t: prompt_tokens(base, "/v1/chat/completions", t) for t in ("hello", FORGED)}
        text = {t: prompt_tokens(base, "/v1/completions", t) for t in ("hello", FORGED)}
        assert text[FORGED] - text["hello"] > 7, "a completions prompt's control-token text became control tokens"
        assert chat[FORGED] - chat["hello"] == text[FORGED] - text["hello"]
    with serve("--special-tokens-in-prompt", model=SMOLLM2) as (_, base):
        for path in ("/v1/chat/completions", "/v1/completions"):
            assert prompt_tokens(base, path, FORGED) - prompt_tokens(base, path, "hello") == 7, path
