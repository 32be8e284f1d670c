"""Apps written for llama-server or vLLM against `specula serve`, through real sockets: model
aliases, the request fields those servers read, unknown fields named rather than refused (and
refused under --strict-fields), and CORS preflights asking for the headers SDKs send. Servers on
the bundled 15.7M target. Each test states the breakage it catches."""
import json
import time
import urllib.error
import urllib.request

import pytest

from serving import ROOT, post, serve

PROMPT = "def f(x):"

# A chatml template that shows the variables a request can give it (chat_template_kwargs,
# reasoning_effort, enable_thinking) in the prompt, so that their effect is its length.
TEMPLATE = """{%- for message in messages -%}{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' -}}{%- endfor -%}
{%- if style is defined -%}{{- 'Style: ' + style + '\\n' -}}{%- endif -%}
{%- if reasoning_effort is defined -%}{{- 'Effort: ' + reasoning_effort + '\\n' -}}{%- endif -%}
{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}
{%- if enable_thinking is defined and enable_thinking is false -%}{{- '<think>\\n\\n</think>\\n\\n' -}}{%- endif -%}{%- endif -%}"""


@pytest.fixture(scope="module")
def template(tmp_path_factory):
    path = tmp_path_factory.mktemp("compat") / "template.jinja"
    path.write_text(TEMPLATE)
    return str(path)


@pytest.fixture(scope="module")
def aliased(template):
    with serve("-c", "512", "--alias", "gpt-4o-mini,local", "--alias", "third", "--chat-template", template) as (proc, base):
        yield proc, base


def request(base, method, path, body=None, headers=None):
    """(status, headers, parsed JSON body or None) of one request."""
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(base + path, data=data, method=method,
                                 headers={**({"Content-Type": "application/json"} if data else {}), **(headers or {})})
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            raw = r.read()
            return r.status, r.headers, json.loads(raw) if raw else None
    except urllib.error.HTTPError as e:
        raw = e.read()
        return e.code, e.headers, json.loads(raw) if raw else None


def complete(base, **fields):
    status, body = post(base, "/v1/completions", {"prompt": PROMPT, "max_tokens": 24, "temperature": 0, **fields})
    assert status == 200, body
    return body


def test_every_alias_is_served_listed_and_echoed(aliased):
    # Catches: --alias not parsed as a list (comma-separated, repeated), an alias refused, the
    # response naming another model than the one asked for, /v1/models listing the file's name.
    _, base = aliased
    status, _, models = request(base, "GET", "/v1/models")
    assert status == 200 and [m["id"] for m in models["data"]] == ["gpt-4o-mini", "local", "third"], models
    assert all(m["aliases"] == ["gpt-4o-mini", "local", "third"] for m in models["data"]), models
    status, _, same = request(base, "GET", "/models")  # llama-server's second name
    assert status == 200 and same["data"] == models["data"], same
    for name in ("gpt-4o-mini", "local", "third"):
        body = complete(base, model=name, max_tokens=2)
        assert body["model"] == name, body
    status, body = post(base, "/v1/chat/completions", {"model": "local", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2})
    assert status == 200 and body["model"] == "local", body
    assert complete(base, max_tokens=2)["model"] == "gpt-4o-mini"  # none named: the first
    status, body = post(base, "/v1/completions", {"model": "specula-target", "prompt": PROMPT, "max_tokens": 2})
    assert status == 404 and body["error"]["code"] == "model_not_found", body


def test_unknown_fields_are_served_and_named_in_a_header_and_the_log(aliased):
    # Catches: a field other servers accept refused with 400, or dropped without a word.
    proc, base = aliased
    status, headers, body = request(base, "POST", "/v1/completions",
                                    {"prompt": PROMPT, "max_tokens": 2, "frobnicate": 1, "typical_p": 0.9, "user": "u"})
    assert status == 200, body
    assert headers["X-Specula-Ignored-Fields"] == "frobnicate, typical_p"
    deadline = time.time() + 10
    while not any("ignored fields: frobnicate, typical_p" in line for line in proc.log) and time.time() < deadline:
        time.sleep(0.1)
    assert any("POST /v1/completions: ignored fields: frobnicate, typical_p" in line for line in proc.log), proc.log
    status, headers, body = request(base, "POST", "/v1/completions", {"prompt": PROMPT, "max_tokens": 2, "user": "u"})
    assert status == 200 and headers.get("X-Specula-Ignored-Fields") is None


def test_strict_fields_refuses_them_by_name():
    # Catches: --strict-fields not restoring the 400 naming the field.
    with serve("-c", "256", "--strict-fields") as (_, base):
        status, body = post(base, "/v1/completions", {"prompt": PROMPT, "max_tokens": 2, "frobnicate": 1})
        assert status == 400 and body["error"]["param"] == "frobnicate" and "'frobnicate' is not supported" in body["error"]["message"], body
        status, body = post(base, "/v1/completions", {"prompt": PROMPT, "max_tokens": 2, "n_predict": 2, "min_tokens": 1})
        assert status == 200, body


def test_llama_servers_n_predict_and_n_probs(aliased):
    # Catches: n_predict not bounding the completion, n_probs not giving the alternatives.
    _, base = aliased
    status, body = post(base, "/v1/completions", {"prompt": PROMPT, "n_predict": 3, "n_probs": 2, "temperature": 0})
    assert status == 200 and body["usage"]["completion_tokens"] == 3, body
    assert all(len(alternatives) == 2 for alternatives in body["choices"][0]["logprobs"]["top_logprobs"]), body


def test_stop_token_ids_end_the_text_and_min_tokens_bans_them(aliased):
    # Catches: stop_token_ids not ending the generation (or their text in the reply), min_tokens
    # not keeping the end tokens away until that many tokens are generated.
    _, base = aliased
    full = complete(base)
    text = full["choices"][0]["text"]
    status, ids = post(base, "/tokenize", {"content": text, "with_pieces": True})
    assert status == 200, ids
    pieces = ids["tokens"]
    # A token whose first use in the greedy text is a few tokens in, so that the text before it is
    # the reply when it stops the generation.
    k = next(i for i in range(2, len(pieces)) if all(p["id"] != pieces[i]["id"] for p in pieces[:i]))
    stop_id = pieces[k]["id"]
    cut = complete(base, stop_token_ids=[stop_id])
    assert cut["choices"][0]["finish_reason"] == "stop", cut
    assert text.startswith(cut["choices"][0]["text"]) and len(cut["choices"][0]["text"]) < len(text), (cut, text)
    held = complete(base, stop_token_ids=[stop_id], min_tokens=k + 4, max_tokens=k + 4)
    assert held["usage"]["completion_tokens"] == k + 4 and held["choices"][0]["finish_reason"] == "length", held
    status, body = post(base, "/v1/completions", {"prompt": PROMPT, "stop_token_ids": [10**8]})
    assert status == 400 and body["error"]["param"] == "stop_token_ids", body


def test_chat_template_kwargs_and_reasoning_effort_reach_the_template(aliased):
    # Catches: chat_template_kwargs or reasoning_effort refused or never given to the template,
    # enable_thinking among them not switching the chat layer's thinking.
    _, base = aliased
    messages = [{"role": "user", "content": "hi"}]

    def prompt_tokens(**fields):
        status, body = post(base, "/v1/chat/completions", {"messages": messages, "max_tokens": 1, **fields})
        assert status == 200, body
        return body["usage"]["prompt_tokens"]

    plain = prompt_tokens()
    assert prompt_tokens(chat_template_kwargs={"style": "terse"}) > plain
    assert prompt_tokens(reasoning_effort="low") > plain
    assert prompt_tokens(chat_template_kwargs={"enable_thinking": False}) > plain
    status, body = post(base, "/v1/chat/completions", {"messages": messages, "reasoning_effort": "extreme"})
    assert status == 400 and body["error"]["param"] == "reasoning_effort", body


def test_a_preflight_gets_the_headers_it_asks_for():
    # Catches: a preflight answered with a fixed list of headers, which the browser then refuses
    # for the openai npm SDK's x-stainless-* headers (the request is never sent).
    origin = "http://localhost:5173"
    asked = "authorization, content-type, x-stainless-arch, x-stainless-os, x-stainless-retry-count"
    with serve("-c", "256", "--cors-origin", origin) as (_, base):
        status, headers, _ = request(base, "OPTIONS", "/v1/chat/completions",
                                     headers={"Origin": origin, "Access-Control-Request-Method": "POST", "Access-Control-Request-Headers": asked})
        assert status == 200
        assert headers["Access-Control-Allow-Headers"] == asked
        assert headers["Access-Control-Allow-Origin"] == origin


def stream_events(base, path, body):
    """The JSON of each `data:` event of a streamed answer, [DONE] left out."""
    req = urllib.request.Request(base + path, data=json.dumps({**body, "stream": True}).encode(), headers={"Content-Type": "application/json"})
    events = []
    with urllib.request.urlopen(req, timeout=120) as r:
        for line in r:
            line = line.decode().strip()
            if line.startswith("data: ") and line != "data: [DONE]":
                events.append(json.loads(line[6:]))
    return events


def test_llama_servers_completion_route_answers_in_its_shape(aliased):
    # Catches: /completion missing, or answering in OpenAI's shape (llama-server's clients read
    # content, tokens_predicted, tokens_evaluated, stop, timings), its stream not adding up.
    _, base = aliased
    text = complete(base, max_tokens=8)["choices"][0]["text"]
    status, body = post(base, "/completion", {"prompt": PROMPT, "n_predict": 8, "temperature": 0})
    assert status == 200, body
    assert body["content"] == text and body["tokens_predicted"] == 8 and body["stop"] is True and body["stop_type"] == "limit", body
    status, ids = post(base, "/tokenize", {"content": PROMPT, "add_special": True})
    assert body["tokens_evaluated"] == len(ids["tokens"]), (body, ids)
    assert body["timings"]["predicted_n"] == 8 and body["timings"]["prompt_n"] + body["timings"]["cache_n"] == len(ids["tokens"]), body
    events = stream_events(base, "/completion", {"prompt": PROMPT, "n_predict": 8, "temperature": 0})
    assert "".join(e["content"] for e in events) == text
    assert events[-1]["stop"] is True and events[-1]["tokens_predicted"] == 8 and all(e["stop"] is False for e in events[:-1]), events
    status, body = post(base, "/completion", {"prompt": PROMPT, "n_predict": 3, "n_probs": 2, "temperature": 0})
    probs = body["completion_probabilities"]
    assert len(probs) == 3 and all(len(p["top_logprobs"]) == 2 and isinstance(p["id"], int) for p in probs), body


def test_completion_reports_generation_settings_and_keeps_only_the_response_fields_asked_for(aliased):
    # Catches: /completion without llama-server's generation_settings (clients read the settings a
    # request ran with there), or response_fields ignored (the whole answer sent back), or a path
    # into a nested object not followed.
    _, base = aliased
    status, body = post(base, "/completion", {"prompt": PROMPT, "n_predict": 6, "temperature": 0.5, "top_k": 7, "seed": 3})
    assert status == 200, body
    settings = body["generation_settings"]
    assert settings["n_predict"] == 6 and settings["temperature"] == 0.5 and settings["top_k"] == 7 and settings["seed"] == 3, settings
    fields = ["content", "generation_settings/n_predict", "timings/predicted_n", "no/such/field"]
    status, body = post(base, "/completion", {"prompt": PROMPT, "n_predict": 6, "temperature": 0, "response_fields": fields})
    assert status == 200, body
    assert set(body) == {"content", "generation_settings/n_predict", "timings/predicted_n"}, body
    assert body["generation_settings/n_predict"] == 6 and body["timings/predicted_n"] == 6 and isinstance(body["content"], str), body
    status, body = post(base, "/completion", {"prompt": PROMPT, "n_predict": 2, "response_fields": "content"})
    assert status == 400 and "response_fields" in json.dumps(body), body


def test_props_v1_health_and_apply_template(aliased, template):
    # Catches: llama-server's /props, /chat/completions, /v1/health or /apply-template missing, or /props not naming
    # the context, slots, model file and template the server runs with.
    _, base = aliased
    status, _, props = request(base, "GET", "/props")
    assert status == 200, props
    assert props["n_ctx"] == 512 and props["default_generation_settings"]["n_ctx"] == 512 and props["total_slots"] == 1, props
    assert props["model_path"].endswith("specula-target.gguf") and props["chat_template"] == TEMPLATE, props
    status, body = post(base, "/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1})
    assert status == 200 and body["object"] == "chat.completion", body  # llama-server's name without /v1
    status, _, health = request(base, "GET", "/v1/health")
    assert status == 200 and health == {"status": "ok"}
    status, body = post(base, "/apply-template", {"messages": [{"role": "user", "content": "hi"}]})
    assert status == 200 and body == {"prompt": "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"}, body
    status, body = post(base, "/apply-template", {"messages": [{"role": "user", "content": "hi"}], "chat_template_kwargs": {"style": "x"}})
    assert status == 200 and "Style: x" in body["prompt"], body


def test_token_id_prompts_and_echo(aliased):
    # Catches: a prompt of token ids refused or read otherwise than its text, an id that is no
    # token reaching the engine, echo refused or not starting the text with the prompt.
    _, base = aliased
    text = complete(base)["choices"][0]["text"]
    status, ids = post(base, "/tokenize", {"content": PROMPT, "add_special": True})
    assert complete(base, prompt=ids["tokens"])["choices"][0]["text"] == text
    assert complete(base, prompt=[ids["tokens"]])["choices"][0]["text"] == text
    status, body = post(base, "/v1/completions", {"prompt": [1, 10**6], "max_tokens": 2})
    assert status == 400 and body["error"]["param"] == "prompt" and "prompt[1]" in body["error"]["message"], body
    assert complete(base, echo=True)["choices"][0]["text"] == PROMPT + text
    events = stream_events(base, "/v1/completions", {"prompt": PROMPT, "max_tokens": 24, "temperature": 0, "echo": True})
    assert "".join(e["choices"][0]["text"] for e in events if e["choices"]) == PROMPT + text


def test_a_batch_of_prompts_gets_each_prompts_choices_in_order(aliased):
    # Catches: a batch refused or answered for its first prompt only, choices out of OpenAI's
    # order (prompt k's choice j at index k * n + j), a prompt answered with another's text, usage
    # counting one prompt, llama-server's /completion answering a batch with one object.
    _, base = aliased
    status, ids = post(base, "/tokenize", {"content": "class A:", "add_special": True})
    prompts = [PROMPT, ids["tokens"], "import os"]
    alone = [complete(base, prompt=p, max_tokens=12) for p in prompts]
    body = complete(base, prompt=prompts, max_tokens=12, n=2)
    assert [c["index"] for c in body["choices"]] == list(range(6)), body
    for k, choice in enumerate(body["choices"]):
        assert choice["text"] == alone[k // 2]["choices"][0]["text"], (k, body)
    assert body["usage"]["prompt_tokens"] == sum(a["usage"]["prompt_tokens"] for a in alone), body
    assert body["usage"]["completion_tokens"] == 2 * sum(a["usage"]["completion_tokens"] for a in alone), body
    events = stream_events(base, "/v1/completions", {"prompt": prompts, "max_tokens": 12, "temperature": 0})
    texts = ["", "", ""]
    for e in events:
        for c in e["choices"]:
            texts[c["index"]] += c["text"]
    assert texts == [a["choices"][0]["text"] for a in alone], events
    status, answers = post(base, "/completion", {"prompt": prompts, "n_predict": 12, "temperature": 0})
    assert status == 200 and [a["index"] for a in answers] == [0, 1, 2], answers
    assert [a["content"] for a in answers] == texts, answers
    status, body = post(base, "/v1/completions", {"prompt": [PROMPT, [1, 10**6]], "max_tokens": 2})
    assert status == 400 and "prompt[1][1]" in body["error"]["message"], body
    status, body = post(base, "/v1/completions", {"prompt": [PROMPT] * 40, "max_tokens": 2, "n": 2})
    assert status == 400 and body["error"]["param"] == "prompt", body


def test_echo_with_logprobs_scores_the_prompt_as_lm_eval_asks(aliased):
    # Catches: prompt tokens without logprobs or shifted by one (a token scored by its own row),
    # the first token not null, a cached prefix left unscored, logprobs other than those the same
    # tokens get when generated, max_tokens 0 refused, a batch's choices scored with one prompt.
    _, base = aliased
    status, ids = post(base, "/tokenize", {"content": PROMPT, "add_special": True})
    status, generated = post(base, "/completion", {"prompt": PROMPT, "n_predict": 8, "n_probs": 1, "temperature": 0})
    assert status == 200, generated
    gen = generated["completion_probabilities"]
    scored = ids["tokens"] + [g["id"] for g in gen]
    body = complete(base, prompt=scored, max_tokens=0, echo=True, logprobs=1)
    choice = body["choices"][0]
    lp = choice["logprobs"]
    assert body["usage"]["completion_tokens"] == 0 and len(lp["tokens"]) == len(scored), body
    assert lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None, lp
    assert all(isinstance(x, float) for x in lp["token_logprobs"][1:]), lp
    for g, value, top in zip(gen, lp["token_logprobs"][len(ids["tokens"]):], lp["top_logprobs"][len(ids["tokens"]):]):
        assert abs(value - g["logprob"]) < 1e-4, (g, value)
        assert abs(max(top.values()) - value) < 1e-6, (g, top)  # greedy tokens: each is its row's most likely
    assert choice["text"].endswith(generated["content"]), choice
    # lm-eval's loglikelihood request: a batch of token lists, echo, logprobs 1, one token generated.
    body = complete(base, prompt=[scored, ids["tokens"]], max_tokens=1, echo=True, logprobs=1)
    first, second = body["choices"]
    assert len(first["logprobs"]["token_logprobs"]) == len(scored) + 1, first
    assert first["logprobs"]["token_logprobs"][:-1] == lp["token_logprobs"], first
    assert len(second["logprobs"]["token_logprobs"]) == len(ids["tokens"]) + 1, second
    assert abs(second["logprobs"]["token_logprobs"][-1] - gen[0]["logprob"]) < 1e-4, second
    status, body = post(base, "/v1/completions", {"prompt": PROMPT, "echo": True, "logprobs": 1, "stream": True})
    assert status == 400 and body["error"]["param"] == "echo", body


def test_skip_special_tokens_false_renders_control_tokens(aliased):
    # Catches: skip_special_tokens false refused or ignored, control tokens' text in replies by
    # default, the end token's text returned, logprobs' tokens named otherwise than the text, the
    # field changing which tokens a speculative server generates (its text against a plain one's).
    _, base = aliased
    bos = {"1": 100}  # <s>, a control token of the bundled vocabulary that does not end the generation
    body = complete(base, max_tokens=3, logit_bias=bos)
    assert body["choices"][0]["text"] == "" and body["usage"]["completion_tokens"] == 3, body
    body = complete(base, max_tokens=3, logit_bias=bos, skip_special_tokens=False, logprobs=1)
    assert body["choices"][0]["text"] == "<s><s><s>", body
    assert body["choices"][0]["logprobs"]["tokens"] == ["<s>"] * 3, body
    status, chat = post(base, "/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, "temperature": 0,
                                                       "logit_bias": bos, "skip_special_tokens": False})
    assert status == 200 and chat["choices"][0]["message"]["content"] == "<s><s>", chat
    body = complete(base, logit_bias={"2": 100}, skip_special_tokens=False)
    assert body["choices"][0]["text"] == "" and body["choices"][0]["finish_reason"] == "stop", body
    text = complete(base, max_tokens=40)["choices"][0]["text"]
    assert complete(base, max_tokens=40, skip_special_tokens=False)["choices"][0]["text"] == text
    with serve("-c", "512", "--no-spec") as (_, plain):
        assert complete(plain, max_tokens=40, skip_special_tokens=False)["choices"][0]["text"] == text


def test_embeddings_through_the_openai_client(aliased):
    # Catches: /v1/embeddings missing or answering without --embeddings, vectors not unit length,
    # inputs answered out of order or a token-id input read otherwise than its text, base64 other
    # than the float32 bytes the client decodes, usage not counting the inputs' tokens, the pooling
    # flag ignored, a too-long input reaching the engine.
    import base64
    import struct

    import openai
    _, base = aliased
    status, body = post(base, "/v1/embeddings", {"input": "hi"})
    assert status == 501 and "--embeddings" in body["error"]["message"], body
    with serve("-c", "64", "--embeddings") as (_, mean), serve("-c", "64", "--embeddings", "--pooling", "last") as (_, last):
        client = openai.OpenAI(base_url=mean + "/v1", api_key="unused", max_retries=0, timeout=120)
        status, ids = post(mean, "/tokenize", {"content": "class A:", "add_special": True})
        got = client.embeddings.create(model="specula-target", input=[PROMPT, "class A:", ids["tokens"]])
        vectors = [d.embedding for d in got.data]
        assert [d.index for d in got.data] == [0, 1, 2] and len(vectors[0]) > 8
        for v in vectors:
            assert abs(sum(x * x for x in v) - 1.0) < 1e-4
        assert vectors[0] != vectors[1] and max(abs(a - b) for a, b in zip(vectors[1], vectors[2])) < 1e-6
        assert got.usage.prompt_tokens == got.usage.total_tokens == 2 * len(ids["tokens"]) + len(post(mean, "/tokenize", {"content": PROMPT, "add_special": True})[1]["tokens"])
        one = client.embeddings.create(model="specula-target", input=PROMPT).data[0].embedding
        assert max(abs(a - b) for a, b in zip(one, vectors[0])) < 1e-6
        status, raw = post(mean, "/v1/embeddings", {"input": PROMPT, "encoding_format": "base64"})
        decoded = struct.unpack(f"<{len(one)}f", base64.b64decode(raw["data"][0]["embedding"]))
        assert max(abs(a - b) for a, b in zip(decoded, one)) < 1e-6
        status, via_llama = post(mean, "/embeddings", {"input": PROMPT})
        assert status == 200 and via_llama["data"][0]["embedding"] == post(mean, "/v1/embeddings", {"input": PROMPT})[1]["data"][0]["embedding"]
        lasting = openai.OpenAI(base_url=last + "/v1", api_key="unused", max_retries=0, timeout=120)
        assert max(abs(a - b) for a, b in zip(lasting.embeddings.create(model="specula-target", input=PROMPT).data[0].embedding, one)) > 1e-3
        status, body = post(mean, "/v1/embeddings", {"input": ["ok", "word " * 100]})
        assert status == 400 and body["error"]["param"] == "input" and "input[1]" in body["error"]["message"] and "too large" in body["error"]["message"], body
        status, body = post(mean, "/v1/embeddings", {"input": [], "model": "specula-target"})
        assert status == 400 and body["error"]["param"] == "input", body
        # llama-server counts the inputs among the prompt tokens and their forwards among the decodes.
        with urllib.request.urlopen(mean + "/metrics") as r:
            metrics = dict(line.split(" ") for line in r.read().decode().splitlines() if line and not line.startswith("#"))
        embedded = float(metrics["specula:embedding_tokens_total"])
        assert embedded >= got.usage.prompt_tokens and float(metrics["llamacpp:prompt_tokens_total"]) == embedded, metrics
        assert float(metrics["llamacpp:n_decode_total"]) == float(metrics["specula:embedding_forwards_total"]) > 0, metrics
        assert float(metrics["llamacpp:tokens_predicted_total"]) == 0 and float(metrics["specula:prompt_tokens_total"]) == 0, metrics


WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "The weather in a city",
                                            "parameters": {"type": "object", "properties": {"city": {"enum": ["Paris", "Oslo"]}}, "required": ["city"]}}}


def test_tools_with_a_template_without_tool_markup_use_the_generic_format(aliased):
    # Catches: tools refused (or dropped unsaid) for a template that describes none, a required
    # call not forced into the generic format's JSON, the JSON not parsed back into tool_calls,
    # auto's reply neither a call nor content, a call's result not rendered back into the prompt.
    import openai
    _, base = aliased
    client = openai.OpenAI(base_url=base + "/v1", api_key="unused", max_retries=0, timeout=120)
    messages = [{"role": "user", "content": "What is the weather in Paris?"}]
    got = client.chat.completions.create(model="local", messages=messages, tools=[WEATHER], tool_choice="required",
                                         parallel_tool_calls=False, temperature=0, max_tokens=300)
    choice = got.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None, got
    call = choice.message.tool_calls[0]
    assert call.function.name == "get_weather" and json.loads(call.function.arguments)["city"] in ("Paris", "Oslo"), got
    auto = client.chat.completions.create(model="local", messages=messages, tools=[WEATHER], temperature=0, max_tokens=300)
    assert auto.choices[0].message.tool_calls or auto.choices[0].message.content, auto
    follow = messages + [{"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
                         {"role": "tool", "tool_call_id": call.id, "content": "18 C"}]
    status, body = post(base, "/apply-template", {"messages": follow, "tools": [WEATHER]})
    assert status == 200 and '"tool_response"' in body["prompt"] and "Respond in JSON format" in body["prompt"], body


def test_any_model_answers_whatever_name_a_request_gives():
    # Catches: --any-model not parsed, a name it should answer refused, the response's model not
    # the name asked for (llama-server's behaviour, which apps and its own tests rely on).
    import openai
    with serve("-c", "256", "--any-model") as (_, base):
        client = openai.OpenAI(base_url=base + "/v1", api_key="unused", max_retries=0, timeout=120)
        got = client.chat.completions.create(model="gpt-3.5-turbo", messages=[{"role": "user", "content": "hi"}], max_tokens=2)
        assert got.model == "gpt-3.5-turbo", got
        assert complete(base, model="davinci-002", max_tokens=2)["model"] == "davinci-002"


def test_server_wide_sampling_defaults_apply_where_a_request_omits_them():
    # Catches: serve's --temp/--seed/--top-k (llama-server's server-wide defaults) not parsed, not
    # reaching a request that omits the field, not shown by /props, or overriding a request's own.
    # Plain decoding: under speculation a seed's sampled text also depends on the drafts, which the
    # suffix cache changes from one request to the next (docs/server.md, "Independence").
    with serve("-c", "256", "--no-spec", "--temp", "0.9", "--top-k", "20", "--seed", "42") as (_, base):
        status, _, props = request(base, "GET", "/props")
        params = props["default_generation_settings"]["params"]
        assert status == 200 and params["temperature"] == pytest.approx(0.9) and params["top_k"] == 20 and params["seed"] == 42, props
        omitted = {"prompt": PROMPT, "max_tokens": 24}
        texts = [post(base, "/v1/completions", omitted)[1]["choices"][0]["text"] for _ in range(2)]
        assert texts[0] == texts[1], texts  # seeded by the server: equal requests, equal texts
        given = post(base, "/v1/completions", {**omitted, "temperature": 0.9, "top_k": 20, "seed": 42})[1]["choices"][0]["text"]
        assert given == texts[0], (given, texts)
    with serve("-c", "256", "--n-predict", "5") as (_, base):
        assert complete(base, max_tokens=None)["usage"]["completion_tokens"] == 5
        assert complete(base, max_tokens=7)["usage"]["completion_tokens"] == 7
        # A prompt that leaves room for fewer than 5 tokens: the default is cut, not refused.
        long_prompt = next(p for p in (" ".join(["word"] * k) for k in range(200, 256))
                           if 256 - len(post(base, "/tokenize", {"content": p, "add_special": True})[1]["tokens"]) in range(1, 5))
        status, body = post(base, "/v1/completions", {"prompt": long_prompt, "temperature": 0})
        assert status == 200 and 0 < body["usage"]["completion_tokens"] <= 256 - body["usage"]["prompt_tokens"], body
    with serve("-c", "256") as (_, base):  # without the flags: OpenAI's temperature 1, a random seed
        _, _, props = request(base, "GET", "/props")
        assert props["default_generation_settings"]["params"]["temperature"] == 1 and props["default_generation_settings"]["params"]["seed"] == -1, props


def test_llama_servers_metric_names_beside_speculas():
    # Catches: llama-server's llamacpp:* metrics missing (its dashboards and alerts find nothing),
    # without their TYPE and HELP lines, or counting otherwise than it does (prompt tokens without
    # the cached ones).
    with serve("-c", "256") as (_, base):
        usages = [complete(base, max_tokens=6)["usage"] for _ in range(2)]
        assert usages[1]["prompt_tokens_details"]["cached_tokens"] > 0, usages
        with urllib.request.urlopen(base + "/metrics") as r:
            assert int(r.headers["Process-Start-Time-Unix"]) > 0
            text = r.read().decode()
    values, types = {}, {}
    for line in text.splitlines():
        if line.startswith("# TYPE llamacpp:"):
            _, _, name, kind = line.split(" ")
            types[name] = kind
        elif line.startswith("llamacpp:"):
            name, value = line.split(" ")
            values[name] = float(value)
            assert f"# HELP {name} " in text, name
    counters = ["prompt_tokens_total", "prompt_tokens_cached_total", "prompt_seconds_total", "tokens_predicted_total", "tokens_predicted_seconds_total",
                "n_decode_total", "n_tokens_max", "spec_decode_num_draft_tokens_total", "spec_decode_num_accepted_tokens_total", "spec_decode_num_drafts_total"]
    gauges = ["prompt_tokens_seconds", "predicted_tokens_seconds", "requests_processing", "requests_deferred", "n_busy_slots_per_decode"]
    assert {n: types.get("llamacpp:" + n) for n in counters + gauges} == {**{n: "counter" for n in counters}, **{n: "gauge" for n in gauges}}, types
    cached = sum(u["prompt_tokens_details"]["cached_tokens"] for u in usages)
    assert values["llamacpp:prompt_tokens_total"] == sum(u["prompt_tokens"] for u in usages) - cached, values
    assert values["llamacpp:prompt_tokens_cached_total"] == cached, values
    assert values["llamacpp:tokens_predicted_total"] == sum(u["completion_tokens"] for u in usages), values
    assert values["llamacpp:n_tokens_max"] == max(u["total_tokens"] for u in usages), values
    assert values["llamacpp:n_decode_total"] > 0 and values["llamacpp:requests_processing"] == 0, values


def test_input_tokens_counts_a_chat_requests_prompt(aliased):
    # Catches: llama-server's /chat/completions/input_tokens missing, or counting another prompt
    # than the chat request's (its template, BOS, tools).
    _, base = aliased
    messages = [{"role": "system", "content": "Book"}, {"role": "user", "content": "What is the best book"}]
    status, chat = post(base, "/v1/chat/completions", {"messages": messages, "max_tokens": 1})
    assert status == 200, chat
    for path in ("/chat/completions/input_tokens", "/v1/chat/completions/input_tokens"):
        status, body = post(base, path, {"messages": messages})
        assert status == 200 and body == {"input_tokens": chat["usage"]["prompt_tokens"]}, (path, body)
    status, body = post(base, "/chat/completions/input_tokens", {"messages": "hi"})
    assert status == 400 and body["error"]["param"] == "messages", body


def test_a_chat_streams_first_delta_is_the_role_without_content(aliased):
    # Catches: a first delta with empty content (OpenAI sends ""), which llama-server's clients and
    # test suite take for a text delta: llama-server's first delta is the role, content null.
    _, base = aliased
    events = stream_events(base, "/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4})
    first = events[0]["choices"][0]["delta"]
    assert first == {"role": "assistant", "content": None}, events[0]
    assert all("role" not in e["choices"][0]["delta"] and e["choices"][0]["delta"].get("content") != "" for e in events[1:] if e["choices"]), events


def test_prompts_mixing_text_and_token_ids_as_llama_server_reads_them(aliased):
    # Catches: llama-server's mixed prompts ([ids, "text", ids]) and {"prompt_string"} objects
    # refused or read as batches, a later text given a BOS, images in a prompt dropped silently.
    _, base = aliased
    status, ids = post(base, "/tokenize", {"content": PROMPT, "add_special": True})
    tokens = ids["tokens"]
    status, plain = post(base, "/completion", {"prompt": tokens, "n_predict": 6, "temperature": 0})
    assert status == 200, plain
    for batch in ([tokens, PROMPT], [tokens, {"prompt_string": PROMPT}], [PROMPT, [PROMPT]]):
        status, body = post(base, "/completion", {"prompt": batch, "n_predict": 6, "temperature": 0})
        assert status == 200 and [b["content"] for b in body] == [plain["content"]] * 2 and [b["index"] for b in body] == [0, 1], (batch, body)
    status, no_bos = post(base, "/tokenize", {"content": PROMPT, "add_special": False})
    status, body = post(base, "/completion", {"prompt": tokens[:1] + [PROMPT], "n_predict": 6, "temperature": 0})
    assert status == 200 and body["tokens_evaluated"] == 1 + len(no_bos["tokens"]), body
    status, body = post(base, "/completion", {"prompt": {"prompt_string": PROMPT}, "n_predict": 6, "temperature": 0})
    assert status == 200 and body["content"] == plain["content"], body
    status, body = post(base, "/completion", {"prompt": {"prompt_string": "<__media__>", "multimodal_data": ["iVBORw0KGgo="]}})
    assert status == 400 and "multimodal_data" in body["error"]["message"], body
    status, body = post(base, "/v1/completions", {"prompt": [1, 2, PROMPT, 3], "max_tokens": 2})
    assert status == 200 and body["usage"]["prompt_tokens"] == 3 + len(no_bos["tokens"]), body


def test_llama_servers_verbose_return_tokens_and_timings_per_token(aliased):
    # Catches: `verbose` without llama-server's __verbose (its /completion object with the prompt's
    # text), return_tokens' ids missing or not the tokens generated, timings only at the end of
    # a timings_per_token stream, the stream's last event without the whole generation's timings.
    _, base = aliased
    messages = [{"role": "system", "content": "Book"}, {"role": "user", "content": "What is the best book"}]
    status, body = post(base, "/v1/chat/completions", {"messages": messages, "max_tokens": 3, "verbose": True, "temperature": 0})
    assert status == 200 and "Book" in body["__verbose"]["prompt"] and body["__verbose"]["content"] == body["choices"][0]["message"]["content"], body
    assert body["timings"]["predicted_n"] == 3, body
    status, body = post(base, "/v1/chat/completions", {"messages": messages, "max_tokens": 3})
    assert "__verbose" not in body, body
    status, body = post(base, "/completion", {"prompt": PROMPT, "n_predict": 5, "temperature": 0, "return_tokens": True})
    assert status == 200 and len(body["tokens"]) == 5 and isinstance(body["has_new_line"], bool), body
    status, detok = post(base, "/detokenize", {"tokens": body["tokens"]})
    assert detok["content"] == body["content"], (detok, body)
    status, body = post(base, "/completion", {"prompt": PROMPT, "n_predict": 5, "temperature": 0})
    assert body["tokens"] == [], body
    # An event per token, as llama-server streams (a round's drafted tokens one by one), none before them.
    events = stream_events(base, "/completion", {"prompt": PROMPT, "n_predict": 5, "temperature": 0, "n_probs": 2})
    assert [len(e["tokens"]) for e in events[:-1]] == [1] * 5 and events[-1]["tokens"] == [], events
    assert all([p["id"] for p in e["completion_probabilities"]] == e["tokens"] for e in events[:-1]), events
    events = stream_events(base, "/v1/chat/completions", {"messages": messages, "max_tokens": 6, "timings_per_token": True,
                                                          "stream_options": {"include_usage": True}})
    assert "timings" not in events[0], events[0]
    texts = [e for e in events[1:] if e["choices"] and e["choices"][0]["delta"].get("content")]
    assert texts and all(0 < e["timings"]["predicted_n"] <= 6 for e in texts), events
    assert events[-1]["choices"] == [] and events[-1]["timings"]["predicted_n"] == events[-1]["usage"]["completion_tokens"], events[-1]


def test_a_prompt_beyond_the_context_is_llama_servers_exceed_context_size_error(aliased):
    # Catches: the context error without llama-server's type and sizes, which its clients read.
    _, base = aliased
    messages = [{"role": "user", "content": "What is the best book " * 200}]
    for stream in (False, True):
        status, body = post(base, "/v1/chat/completions", {"messages": messages, "stream": stream})
        assert status == 400 and body["error"]["type"] == "exceed_context_size_error" and body["error"]["n_ctx"] == 512, body
        assert body["error"]["n_prompt_tokens"] > 512 and body["error"]["code"] == "context_length_exceeded", body


def test_post_sampling_probs_are_the_sampled_distributions(aliased):
    # Catches: post_sampling_probs ignored (llama-server's prob and top_probs missing), or values
    # before the sampler chain: at T = 0 the token alone with probability 1; with top-k 3 three
    # that sum to 1.
    _, base = aliased
    status, body = post(base, "/completion", {"prompt": PROMPT, "n_predict": 4, "n_probs": 5, "temperature": 0, "post_sampling_probs": True})
    probs = body["completion_probabilities"]
    assert status == 200 and len(probs) == 4, body
    assert all(p["prob"] == 1.0 and [t["id"] for t in p["top_probs"]] == [p["id"]] and "logprob" not in p for p in probs), probs
    status, body = post(base, "/completion", {"prompt": PROMPT, "n_predict": 4, "n_probs": 5, "temperature": 1, "top_k": 3, "seed": 5,
                                              "post_sampling_probs": True})
    for p in body["completion_probabilities"]:
        assert len(p["top_probs"]) == 3 and abs(sum(t["prob"] for t in p["top_probs"]) - 1) < 1e-5, p
        assert p["prob"] == next(t["prob"] for t in p["top_probs"] if t["id"] == p["id"]), p
    status, body = post(base, "/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, "logprobs": True,
                                                       "top_logprobs": 2, "temperature": 0, "post_sampling_probs": True})
    assert all(e["prob"] == 1.0 and len(e["top_probs"]) == 1 for e in body["choices"][0]["logprobs"]["content"]), body


def test_a_final_assistant_message_is_continued(aliased):
    # Catches: llama-server's assistant prefill (and vLLM's continue_final_message) closing the
    # message and opening a new turn, the prefill repeated in the reply, or the stream and the
    # whole answer disagreeing; the continuations llama-server refuses accepted.
    _, base = aliased
    asked = [{"role": "system", "content": "Book"}, {"role": "user", "content": "What is the best book"}]
    prefilled = asked + [{"role": "assistant", "content": "Whill"}]
    status, body = post(base, "/apply-template", {"messages": asked})
    assert status == 200 and body["prompt"].endswith("<|im_start|>assistant\n"), body
    status, cont = post(base, "/apply-template", {"messages": prefilled})
    assert status == 200 and cont["prompt"] == body["prompt"] + "Whill", cont
    status, vllm = post(base, "/apply-template", {"messages": prefilled, "continue_final_message": True, "add_generation_prompt": False})
    assert status == 200 and vllm == cont, vllm
    status, reply = post(base, "/v1/chat/completions", {"messages": prefilled, "max_tokens": 8, "temperature": 0, "verbose": True})
    assert status == 200 and reply["__verbose"]["prompt"].endswith("<|im_start|>assistant\nWhill"), reply
    text = reply["choices"][0]["message"]["content"]
    assert text and not text.startswith("Whill"), reply
    events = stream_events(base, "/v1/chat/completions", {"messages": prefilled, "max_tokens": 8, "temperature": 0})
    assert "".join(e["choices"][0]["delta"].get("content") or "" for e in events if e["choices"]) == text, events
    status, closed = post(base, "/apply-template", {"messages": asked, "add_generation_prompt": False})
    assert status == 200 and closed["prompt"] + "<|im_start|>assistant\n" == body["prompt"], closed
    for refused, param in (({"messages": prefilled, "continue_final_message": True}, "continue_final_message"),
                           ({"messages": prefilled + [{"role": "assistant", "content": "x"}]}, "messages"),
                           ({"messages": asked, "continue_final_message": True, "add_generation_prompt": False}, "continue_final_message")):
        status, body = post(base, "/v1/chat/completions", {**refused, "max_tokens": 2})
        assert status == 400 and body["error"]["param"] == param, (refused, body)


def test_verbose_logs_requests_and_gives_llama_servers_verbose_object():
    # Catches: --verbose (the shim passes llama-server's) refused, the bodies not logged, the polled
    # routes logged, or __verbose missing from a request that does not ask for it.
    with serve("-c", "256", "--verbose") as (proc, base):
        status, body = post(base, "/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2})
        assert status == 200 and "<|im_start|>user\nhi" in body["__verbose"]["prompt"], body
        status, body = post(base, "/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, "verbose": False})
        assert status == 200 and "__verbose" not in body, body
        request(base, "GET", "/health")
        events = stream_events(base, "/v1/completions", {"prompt": PROMPT, "max_tokens": 2})
        assert events, events
        deadline = time.time() + 10
        while sum("specula: POST" in line for line in proc.log) < 3 and time.time() < deadline:
            time.sleep(0.1)
        log = "".join(proc.log)
        assert "specula: POST /v1/chat/completions 200" in log and "request:  {\"messages\"" in log and "response: {\"" in log, log
        assert "specula: POST /v1/completions 200" in log and "(a stream of server-sent events)" in log, log
        assert "GET /health" not in log, log


def test_reasoning_off_asks_a_thinking_template_not_to_think():
    # Catches: llama-server's --reasoning off (the shim passes it) refused or not reaching the
    # template's enable_thinking, or overriding a request's own chat_template_kwargs.
    template = ROOT + "/tests/chat/think_template.jinja"
    messages = [{"role": "user", "content": "What is today?"}]
    with serve("-c", "256", "--chat-template", template, "--reasoning", "off") as (_, base):
        status, body = post(base, "/apply-template", {"messages": messages})
        assert status == 200 and body["prompt"].endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n"), body
        status, body = post(base, "/apply-template", {"messages": messages, "chat_template_kwargs": {"enable_thinking": True}})
        assert status == 200 and body["prompt"].endswith("<|im_start|>assistant\n"), body
    with serve("-c", "256", "--chat-template", template) as (_, base):
        status, body = post(base, "/apply-template", {"messages": messages})
        assert status == 200 and body["prompt"].endswith("<|im_start|>assistant\n"), body


def test_llama_servers_json_schema_constrains_the_reply(aliased):
    # Catches: llama-server's top-level json_schema, or the schema beside response_format's json_object,
    # ignored (the reply unconstrained); json_schema allowed beside a grammar.
    _, base = aliased
    messages = [{"role": "user", "content": "Write an example"}]
    status, body = post(base, "/v1/chat/completions", {"messages": messages, "max_tokens": 6, "json_schema": {"const": "42"}})
    assert status == 200 and body["choices"][0]["message"]["content"] == "\"42\"", body
    status, body = post(base, "/completion", {"prompt": PROMPT, "n_predict": 6, "json_schema": {"const": "42"}})
    assert status == 200 and body["content"] == "\"42\"", body
    status, body = post(base, "/v1/chat/completions", {"messages": messages, "max_tokens": 6, "json_schema": {"const": "42"}, "grammar": "root ::= \"a\""})
    assert status == 400 and body["error"]["param"] == "json_schema", body
    # llama-server's schema beside json_object.
    status, body = post(base, "/v1/chat/completions", {"messages": messages, "max_tokens": 6, "response_format": {"type": "json_object", "schema": {"const": "42"}}})
    assert status == 200 and body["choices"][0]["message"]["content"] == "\"42\"", body
    status, body = post(base, "/v1/chat/completions", {"messages": messages, "max_tokens": 6, "response_format": {"type": "json_object", "schema": 123}})
    assert status == 400 and body["error"]["param"] == "response_format.schema", body


def test_return_progress_streams_the_prompts_progress_before_the_reply():
    # Catches: llama-server's return_progress ignored, a report per chunk missing, reports that go
    # backwards or end short of the prompt, a report after the reply's first token, a second turn's
    # cached rows not counted, progress events without being asked.
    with serve("-c", "512", "--prefill-chunk", "16") as (_, base):
        body = {"messages": [{"role": "user", "content": "This is a test of the prompt progress. " * 8}], "max_tokens": 4,
                "temperature": 0, "return_progress": True, "timings_per_token": True}
        for turn in range(2):
            events = stream_events(base, "/v1/chat/completions", body)
            reports = [(i, e["prompt_progress"]) for i, e in enumerate(events) if "prompt_progress" in e]
            assert len(reports) >= (4 if turn == 0 else 2), events  # the second turn's prompt is in the slot's cache but its last token
            first, last = reports[0][1], reports[-1][1]
            assert first["processed"] == first["cache"] and first["time_ms"] == 0 and (first["cache"] > 0) == (turn == 1), reports
            assert events[reports[0][0]]["timings"]["prompt_n"] == 0 and events[reports[0][0]]["timings"]["prompt_ms"] == 0, events
            assert last["processed"] == last["total"] and all(p["total"] == last["total"] and p["cache"] == first["cache"] for _, p in reports), reports
            assert all(a["processed"] < b["processed"] and a["time_ms"] <= b["time_ms"] for (_, a), (_, b) in zip(reports, reports[1:])), reports
            texts = [i for i, e in enumerate(events) if e.get("choices") and e["choices"][0]["delta"].get("content")]
            assert texts and reports[-1][0] < texts[0], events
        events = stream_events(base, "/completion", {"prompt": PROMPT * 20, "n_predict": 2, "return_progress": True})
        reports = [e["prompt_progress"] for e in events if "prompt_progress" in e]
        assert len(reports) >= 3 and reports[-1]["processed"] == reports[-1]["total"] and all(e["content"] == "" for e in events if "prompt_progress" in e), events
        events = stream_events(base, "/v1/chat/completions", {**body, "return_progress": False})
        assert not any("prompt_progress" in e for e in events), events
