"""Tool calls through `specula serve` with the `openai` Python client: the bundled target (no chat
template of its own) with tests/chat/tool_template.jinja given by --chat-template, so that the chat
layer describes the tools, constrains a required call with its grammar and parses the reply into
message.tool_calls. Each test states the breakage it catches."""
import json
import os

import openai
import pytest

from serving import DRAFT, ROOT, SMOLLM2, serve

TEMPLATE = os.path.join(ROOT, "tests", "chat", "tool_template.jinja")
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "enum": ["Paris", "Rome"]}}, "required": ["city"]}}}
QUESTION = [{"role": "user", "content": "What is the weather in Paris?"}]


@pytest.fixture(scope="module")
def client():
    with serve("--draft", DRAFT, "--parallel", "2", "-c", "1024", "--chat-template", TEMPLATE) as (_, base):
        yield openai.OpenAI(base_url=base + "/v1", api_key="unused", max_retries=0, timeout=120)


def test_a_named_function_is_called_with_json_arguments_and_its_result_answered(client):
    """Catches: tools or tool_choice not reaching the template or the grammar, a reply left as text
    instead of tool_calls, arguments that are not JSON, finish_reason not "tool_calls", or a
    tool-result message refused."""
    first = client.chat.completions.create(
        model="specula-target", messages=QUESTION, tools=[WEATHER], max_tokens=200, temperature=0,
        tool_choice={"type": "function", "function": {"name": "get_weather"}}, parallel_tool_calls=False)
    choice = first.choices[0]
    assert choice.finish_reason == "tool_calls", choice
    assert len(choice.message.tool_calls) >= 1
    call = choice.message.tool_calls[0]
    assert call.function.name == "get_weather"
    assert isinstance(json.loads(call.function.arguments), dict)
    assert call.id
    messages = QUESTION + [
        {"role": "assistant", "content": None, "tool_calls": [call.model_dump(include={"id", "type", "function"})]},
        {"role": "tool", "tool_call_id": call.id, "content": "18 C and sunny"}]
    second = client.chat.completions.create(model="specula-target", messages=messages, tools=[WEATHER], tool_choice="none",
                                            max_tokens=8, temperature=0)
    assert second.choices[0].message.tool_calls is None
    assert isinstance(second.choices[0].message.content, str)
    assert second.usage.prompt_tokens > first.usage.prompt_tokens


def test_a_required_call_streams_as_tool_call_deltas(client):
    """Catches: a stream that sends the call's markup as content, or no delta.tool_calls."""
    stream = client.chat.completions.create(model="specula-target", messages=QUESTION, tools=[WEATHER], tool_choice="required",
                                            parallel_tool_calls=False, max_tokens=200, temperature=0, stream=True)
    calls, finish = {}, None
    for chunk in stream:
        for c in chunk.choices:
            assert "<tool_call>" not in (c.delta.content or "")
            for d in c.delta.tool_calls or []:
                entry = calls.setdefault(d.index, {"name": "", "arguments": ""})
                entry["name"] += d.function.name or ""
                entry["arguments"] += d.function.arguments or ""
            finish = c.finish_reason or finish
    assert finish == "tool_calls"
    assert calls[0]["name"] == "get_weather"
    assert isinstance(json.loads(calls[0]["arguments"]), dict)


def test_a_streamed_calls_arguments_come_in_pieces_that_make_the_whole_replys(client):
    """Catches: a call sent whole in one delta at the end instead of its arguments as they are
    generated, its id, type or name repeated on later deltas, or pieces that do not concatenate
    to the arguments the same request gets unstreamed."""
    request = dict(model="specula-target", messages=QUESTION, tools=[WEATHER], tool_choice="required",
                   parallel_tool_calls=False, max_tokens=200, temperature=0)
    whole = client.chat.completions.create(**request).choices[0]
    deltas, finish = [], None
    for chunk in client.chat.completions.create(**request, stream=True):
        for c in chunk.choices:
            deltas += c.delta.tool_calls or []
            finish = c.finish_reason or finish
    assert finish == "tool_calls" == whole.finish_reason
    first, rest = deltas[0], deltas[1:]
    assert (first.index, first.type, first.function.name) == (0, "function", "get_weather") and first.id.startswith("call_")
    assert rest and all((d.index, d.id, d.type, d.function.name) == (0, None, None, None) for d in rest), deltas
    assert "".join(d.function.arguments for d in deltas) == whole.message.tool_calls[0].function.arguments


def test_a_long_streamed_reply_adds_up_to_the_unstreamed_one(client):
    """Catches: a streamed reply parsed less often than on every chunk (its cost bounded) losing
    or repeating a piece: its content and its calls (names, arguments) must be the unstreamed
    reply's, for "auto" (free text, then calls) and "required" alike."""
    for choice in ("auto", "required"):
        request = dict(model="specula-target", messages=QUESTION, tools=[WEATHER], tool_choice=choice, max_tokens=400, temperature=0)
        whole = client.chat.completions.create(**request).choices[0]
        content, calls, finish = "", {}, None
        for chunk in client.chat.completions.create(**request, stream=True):
            for c in chunk.choices:
                content += c.delta.content or ""
                for d in c.delta.tool_calls or []:
                    entry = calls.setdefault(d.index, {"name": "", "arguments": ""})
                    entry["name"] += d.function.name or ""
                    entry["arguments"] += d.function.arguments or ""
                finish = c.finish_reason or finish
        assert finish == whole.finish_reason, choice
        assert content == (whole.message.content or ""), choice
        expected = [{"name": t.function.name, "arguments": t.function.arguments} for t in whole.message.tool_calls or []]
        assert [calls[i] for i in sorted(calls)] == expected, choice


def test_parallel_tool_calls_false_ends_the_reply_after_one_call(client):
    """Catches: parallel_tool_calls false not enforced: the random-weight model, unbiased, would go
    on writing call blocks until max_tokens (finish_reason "length")."""
    r = client.chat.completions.create(model="specula-target", messages=QUESTION, tools=[WEATHER], tool_choice="required",
                                       parallel_tool_calls=False, max_tokens=300, temperature=0)
    assert r.choices[0].finish_reason == "tool_calls", r.choices[0]
    assert len(r.choices[0].message.tool_calls) == 1


def test_bad_tool_fields_are_refused_naming_the_field(client):
    """Catches: a named function that is not among the tools, a tool result without its call's id,
    or response_format beside the calls' grammar, passed on instead of refused with 400."""
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="specula-target", messages=QUESTION, tools=[WEATHER],
                                       tool_choice={"type": "function", "function": {"name": "get_time"}})
    assert e.value.body["param"] == "tool_choice"
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="specula-target", messages=QUESTION + [{"role": "tool", "content": "18 C"}])
    assert e.value.body["param"] == "messages[1].tool_call_id"
    for choice in ("auto", "required"):  # the calls' grammar and another cannot both apply
        with pytest.raises(openai.BadRequestError) as e:
            client.chat.completions.create(model="specula-target", messages=QUESTION, tools=[WEATHER], tool_choice=choice,
                                           response_format={"type": "json_object"})
        assert e.value.body["param"] == "response_format", choice


STOP_TEMPLATE = os.path.join(ROOT, "tests", "chat", "stop_template.jinja")


def test_a_templates_own_stop_strings_apply_beside_the_clients_four():
    """Catches: the chat layer's stop strings of the template's format (additional_stops) not
    applied, or counted against the client's limit of 4. The grammar spells one out mid-reply."""
    with serve("--draft", DRAFT, "-c", "512", "--chat-template", STOP_TEMPLATE) as (_, base):
        c = openai.OpenAI(base_url=base + "/v1", api_key="unused", max_retries=0, timeout=120)
        for stream in (False, True):
            r = c.chat.completions.create(model="specula-target", messages=QUESTION, max_tokens=40, temperature=0, stream=stream,
                                          stop=["w", "x", "y", "z"], extra_body={"grammar": 'root ::= "ab</assistant>cd"'})
            if stream:
                chunks = [ch.choices[0] for ch in r if ch.choices]
                text, finish = "".join(ch.delta.content or "" for ch in chunks), chunks[-1].finish_reason
            else:
                text, finish = r.choices[0].message.content, r.choices[0].finish_reason
            assert (text, finish) == ("ab", "stop"), stream


def call_of(i, city):
    return {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_%d" % i, "type": "function", "function": {"name": "get_weather", "arguments": json.dumps({"city": city})}}]}


@pytest.mark.skipif(not os.path.exists(SMOLLM2), reason=SMOLLM2 + " is absent: run scripts/fetch_models.sh")
def test_tool_choice_auto_is_constrained_once_the_model_starts_a_call():
    """Catches: tool_choice "auto" generating the call unconstrained (llama.cpp's lazy grammar not
    applied from its trigger on). Three calls shown before, SmolLM2 calls for Tokyo, a city the
    schema's enum does not hold: free, it writes "Tokyo"; constrained, a city of the enum."""
    messages = []
    for i, city in enumerate(["Rome", "Oslo", "Lima"]):
        messages += [{"role": "user", "content": "What is the weather in %s?" % city}, call_of(i, city),
                     {"role": "tool", "tool_call_id": "call_%d" % i, "content": "18 C"}, {"role": "assistant", "content": "18 C."}]
    messages.append({"role": "user", "content": "What is the weather in Tokyo?"})
    with serve("-c", "2048", "--chat-template", TEMPLATE, model=SMOLLM2) as (_, base):
        c = openai.OpenAI(base_url=base + "/v1", api_key="unused", max_retries=0, timeout=120)
        r = c.chat.completions.create(model="SmolLM2-135M-Instruct.Q4_1", messages=messages, tools=[WEATHER], tool_choice="auto",
                                      max_tokens=60, temperature=0)
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls", choice
    assert json.loads(choice.message.tool_calls[0].function.arguments)["city"] in ("Paris", "Rome")
