"""The request fields of `specula serve` end to end: stop strings (streamed and not, across tokens
and inside a block of accepted drafts), logprobs, logit_bias, response_format, fields refused by
name, and /tokenize and /detokenize. Servers on the bundled 15.7M target, alone and with its draft
model drafting every round. Each test states the breakage it catches."""
import json
import subprocess

import openai
import pytest

from serving import CLI, DRAFT, TARGET, post, serve

MODEL = "specula-target"
PROMPT = "def f(x):"
N = 48


@pytest.fixture(scope="module")
def plain():
    with serve("-c", "512") as (_, base):
        yield base


@pytest.fixture(scope="module")
def speculative():
    with serve("--draft", DRAFT, "--draft-policy", "fixed", "--draft-max", "4", "-c", "512") as (_, base):
        yield base


def client(base):
    return openai.OpenAI(base_url=base + "/v1", api_key="unused", max_retries=0, timeout=120)


def complete(base, **fields):
    status, body = post(base, "/v1/completions", {"prompt": PROMPT, "max_tokens": N, "temperature": 0, **fields})
    assert status == 200, body
    return body


def stream(base, **fields):
    """A streamed completion's text, finish_reason, the tokens of its `specula` extension, and its logprobs' tokens."""
    text, finish, tokens, logprobs = "", None, [], []
    resp = client(base).completions.create(**{"model": MODEL, "prompt": PROMPT, "max_tokens": N, "temperature": 0, "stream": True, **fields})
    for chunk in resp:
        c = chunk.choices[0]
        text += c.text
        finish = c.finish_reason or finish
        tokens += (chunk.model_extra.get("specula") or {}).get("tokens", [])
        if c.logprobs:
            logprobs += c.logprobs.tokens
    return text, finish, tokens, logprobs


def stop_inside_accepted_block(tokens):
    """A stop string that starts in one token and ends inside the next, an accepted draft followed
    by more tokens of its round (so the sequence must stop within a block of accepted tokens);
    returns (stop string, index of the token it ends in)."""
    for i in range(1, len(tokens) - 1):
        prev, tok, after = tokens[i - 1], tokens[i], tokens[i + 1]
        if tok["kind"] == "accepted" and after["depth"] == tok["depth"] + 1 and prev["text"] and len(tok["text"]) >= 2:
            return prev["text"][-1:] + tok["text"][:1], i
    pytest.fail("the draft model had no accepted token inside a round: " + json.dumps(tokens))


def test_a_stop_string_across_tokens_ending_inside_an_accepted_block_cuts_the_text_there(plain, speculative):
    # Catches: a stop string ignored, found only within one token, its text returned, text after it
    # streamed before the match was known, the sequence generating past the stopping token, or the
    # live page's token origins disagreeing with the cut text.
    full = complete(plain)["choices"][0]["text"]
    spec_full, _, tokens, _ = stream(speculative)
    assert spec_full == full  # greedy speculation is plain decoding
    stop, _ = stop_inside_accepted_block(tokens)
    cut = full.find(stop)
    expected = full[:cut]
    # The token the stop string ends in: the sequence stops there.
    ends, ending_token = 0, None
    for k, t in enumerate(tokens):
        ends += len(t["text"])
        if ends >= cut + len(stop):
            ending_token = k
            break
    for base in (plain, speculative):
        body = complete(base, stop=[stop, "never appears in this text"])
        assert body["choices"][0]["text"] == expected, (stop, body)
        assert body["choices"][0]["finish_reason"] == "stop"
        assert body["usage"]["completion_tokens"] == ending_token + 1
        text, finish, origins, _ = stream(base, stop=stop)
        assert (text, finish) == (expected, "stop")
        assert "".join(t["text"] for t in origins) == expected
    assert complete(speculative)["choices"][0]["finish_reason"] == "length"


def test_chat_stop_streamed_and_not(speculative):
    # Catches: chat requests ignoring `stop`, or the stream's and the whole response's texts differing.
    c = client(speculative)
    messages = [{"role": "user", "content": "Write a Python function."}]
    full = c.chat.completions.create(model=MODEL, messages=messages, max_tokens=N, temperature=0).choices[0].message.content
    stop = full[len(full) // 2:len(full) // 2 + 3]
    assert stop, full
    expected = full[:full.find(stop)]
    whole = c.chat.completions.create(model=MODEL, messages=messages, max_tokens=N, temperature=0, stop=stop)
    assert (whole.choices[0].message.content, whole.choices[0].finish_reason) == (expected, "stop")
    text, finish = "", None
    for chunk in c.chat.completions.create(model=MODEL, messages=messages, max_tokens=N, temperature=0, stop=[stop], stream=True):
        for ch in chunk.choices:
            text += ch.delta.content or ""
            finish = ch.finish_reason or finish
    assert (text, finish) == (expected, "stop")


def test_generate_stop_prints_the_text_before_the_stop_string():
    # Catches: `specula generate --stop` ignored or printing the stop string.
    def run(*extra):
        out = subprocess.run([CLI, "generate", "-m", TARGET, "-p", PROMPT, "-n", str(N), "--temp", "0", "-t", "1", *extra],
                             capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr
        return out.stdout
    full = run()
    stop = full[len(PROMPT) + 5:len(PROMPT) + 8]
    assert run("--stop", stop, "--stop", "never appears") == full[:full.find(stop)]


def test_logprobs_have_openais_shapes_and_equal_plain_decodings(plain, speculative):
    # Catches: logprobs refused or missing, shapes the openai client cannot read, a speculative
    # server reporting other tokens or values than plain decoding, a stream's entries lost.
    messages = [{"role": "user", "content": "Hello"}]
    chats = [client(b).chat.completions.create(model=MODEL, messages=messages, max_tokens=16, temperature=0, logprobs=True, top_logprobs=3)
             for b in (plain, speculative)]
    for chat in chats:
        content = chat.choices[0].logprobs.content
        assert len(content) == chat.usage.completion_tokens
        assert "".join(e.token for e in content) == chat.choices[0].message.content
        for e in content:
            assert bytes(e.bytes).decode(errors="replace") == e.token and e.logprob <= 0
            assert len(e.top_logprobs) == 3 and e.top_logprobs[0].logprob >= e.top_logprobs[-1].logprob
            assert e.logprob == pytest.approx(e.top_logprobs[0].logprob, abs=1e-4)  # greedy: the most likely token
    a, b = (c.choices[0].logprobs.content for c in chats)
    assert [e.token for e in a] == [e.token for e in b]
    assert [e.logprob for e in a] == pytest.approx([e.logprob for e in b], abs=1e-3)
    body = complete(speculative, logprobs=2, max_tokens=16)
    lp = body["choices"][0]["logprobs"]
    assert "".join(lp["tokens"]) == body["choices"][0]["text"]
    assert len(lp["token_logprobs"]) == len(lp["top_logprobs"]) == len(lp["text_offset"]) == body["usage"]["completion_tokens"]
    assert lp["text_offset"][0] == 0 and all(len(t) <= 2 for t in lp["top_logprobs"])
    _, _, _, streamed = stream(speculative, logprobs=2, max_tokens=16)
    assert streamed == lp["tokens"]


def test_tokens_cut_by_a_stop_string_have_no_logprobs(speculative):
    # Catches: the logprobs of tokens whose text the stop string cut reported.
    full = complete(speculative, logprobs=0)
    tokens = full["choices"][0]["logprobs"]["tokens"]
    stop = tokens[5][-1:] + tokens[6]
    cut = complete(speculative, logprobs=0, stop=stop)
    text = cut["choices"][0]["text"]
    reported = cut["choices"][0]["logprobs"]["tokens"]
    assert "".join(reported) == text[:len("".join(reported))] and len(reported) <= 5
    assert len("".join(reported)) > len(text) - len(tokens[5])


def test_a_logit_bias_outside_the_vocabulary_is_refused(plain):
    # Catches: a bias for a token the model does not have reaching the engine, metadata refused.
    status, body = post(plain, "/v1/completions", {"prompt": PROMPT, "max_tokens": 2, "logit_bias": {"99999999": 5}})
    assert status == 400 and body["error"]["param"] == "logit_bias" and "99999999" in body["error"]["message"], body
    status, body = post(plain, "/v1/completions", {"prompt": PROMPT, "max_tokens": 2, "user": "u", "metadata": {"k": "v"}})
    assert status == 200, body


def test_logit_bias_bans_a_token(plain):
    # Catches: logit_bias accepted and dropped.
    first = complete(plain, max_tokens=1, logprobs=0)["choices"][0]["logprobs"]["tokens"][0]
    # The vocabulary puts a word-start space before a text: the token is among those of either spelling.
    banned = {t for text in (first, first.lstrip()) for t in post(plain, "/tokenize", {"content": text})[1]["tokens"]}
    body = complete(plain, max_tokens=1, logit_bias={str(t): -100 for t in banned})
    assert body["choices"][0]["text"] != first
    body = complete(plain, max_tokens=1, logit_bias=[[t, False] for t in banned])  # llama-server's form
    assert body["choices"][0]["text"] != first
    body = complete(plain, max_tokens=1, logit_bias=[[t, -100] for t in banned] * 2)  # ids repeated, as /tokenize's of a text repeat
    assert body["choices"][0]["text"] != first


def test_logit_bias_keyed_by_text_bans_the_texts_tokens(plain):
    # Catches: llama-server's logit_bias by text ({"text": bias}, [["text", bias]]) refused, or
    # accepted and dropped (its tokens never biased).
    first = complete(plain, max_tokens=1, logprobs=0)["choices"][0]["logprobs"]["tokens"][0]
    texts = {first, first.lstrip()}
    body = complete(plain, max_tokens=1, logit_bias={text: -100 for text in texts})
    assert body["choices"][0]["text"] != first, body
    status, body = post(plain, "/completion", {"prompt": PROMPT, "n_predict": 1, "temperature": 0, "logit_bias": [[text, False] for text in texts]})
    assert status == 200 and body["content"] != first, body
    status, body = post(plain, "/v1/completions", {"prompt": PROMPT, "max_tokens": 1, "logit_bias": {"": -100}})
    assert status == 400 and body["error"]["param"] == "logit_bias" and "empty text" in body["error"]["message"], body


def test_response_format_json_schema_gives_json_that_validates(speculative):
    # Catches: response_format ignored, or a schema's grammar that lets the model write other text.
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}, "n": {"type": "integer"}}, "required": ["ok", "n"],
              "additionalProperties": False}
    chat = client(speculative).chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Answer in JSON."}], max_tokens=64, temperature=0,
        response_format={"type": "json_schema", "json_schema": {"name": "answer", "schema": schema, "strict": True}})
    value = json.loads(chat.choices[0].message.content)
    assert set(value) == {"ok", "n"} and isinstance(value["ok"], bool) and isinstance(value["n"], int), value
    status, body = post(speculative, "/v1/completions", {"prompt": PROMPT, "grammar": "root ::= ("})
    assert status == 400 and body["error"]["param"] == "grammar", body


def test_tokenize_round_trips_as_the_prompt_is_tokenized(plain):
    # Catches: /tokenize giving other tokens than a prompt gets, pieces that are not the tokens'
    # texts, /detokenize not inverting it, ids outside the vocabulary accepted.
    text = "def f(x):\n    return x + 1  # é"
    status, ids = post(plain, "/tokenize", {"content": text, "add_special": True, "parse_special": False})
    assert status == 200, ids
    prompt_tokens = complete(plain, prompt=text, max_tokens=1)["usage"]["prompt_tokens"]
    assert len(ids["tokens"]) == prompt_tokens
    status, pieces = post(plain, "/tokenize", {"content": text, "with_pieces": True})
    assert [p["id"] for p in pieces["tokens"]] == ids["tokens"][len(ids["tokens"]) - len(pieces["tokens"]):]
    status, back = post(plain, "/detokenize", {"tokens": [p["id"] for p in pieces["tokens"]]})
    assert status == 200 and back["content"].strip() == text.strip(), back
    status, body = post(plain, "/detokenize", {"tokens": [1, 10 ** 9]})
    assert status == 400 and body["error"]["param"] == "tokens[1]", body
