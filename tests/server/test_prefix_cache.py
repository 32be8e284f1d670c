"""The prefix cache and n choices through a running server: cached_tokens in usage and on /metrics,
a conversation's next turn equal to the same turn on a fresh server, n choices equal to the single
requests seeded seed + i (streamed too, chunks carrying their index; more choices than slots queued), and the n that are refused."""
import json
import re
import urllib.request

from serving import DRAFT, post, serve

ARGS = ("--draft", DRAFT, "--draft-policy", "fixed", "--draft-max", "4", "--parallel", "3")


def metric(base, name):
    with urllib.request.urlopen(base + "/metrics") as r:
        m = re.search(rf"^specula:{name} (\S+)$", r.read().decode(), re.M)
    return float(m.group(1))


def completion(base, prompt, **fields):
    status, body = post(base, "/v1/completions", {"prompt": prompt, "max_tokens": 12, "temperature": 0, **fields})
    assert status == 200, body
    return body


def test_the_next_turn_is_served_from_the_cache_and_equals_it_cold():
    turn1 = "User: name three fruits\nAssistant:"
    with serve(*ARGS) as (_, base):
        first = completion(base, turn1)
        assert first["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
        turn2 = turn1 + first["choices"][0]["text"] + "\nUser: and three more\nAssistant:"
        second = completion(base, turn2, temperature=0.8, seed=3)
        cached = second["usage"]["prompt_tokens_details"]["cached_tokens"]
        assert cached > first["usage"]["prompt_tokens"] // 2, second["usage"]
        assert metric(base, "prompt_tokens_cached_total") == cached
    with serve(*ARGS) as (_, base):
        cold = completion(base, turn2, temperature=0.8, seed=3)
        assert cold["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    assert second["choices"][0]["text"] == cold["choices"][0]["text"]


def stream(base, body):
    req = urllib.request.Request(base + "/v1/chat/completions", data=json.dumps({**body, "stream": True}).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as r:
        events = [line[6:] for line in r.read().decode().split("\n") if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    return [json.loads(e) for e in events[:-1]]


def test_n_choices_equal_the_requests_seeded_seed_plus_i_streamed_or_not():
    body = {"messages": [{"role": "user", "content": "def main():"}], "max_tokens": 10, "temperature": 0.8, "seed": 40}
    with serve(*ARGS) as (_, base):
        alone = []
        for i in range(3):
            status, one = post(base, "/v1/chat/completions", {**body, "seed": 40 + i})
            assert status == 200, one
            alone.append(one)
        status, three = post(base, "/v1/chat/completions", {**body, "n": 3})
        assert status == 200, three
        assert [c["index"] for c in three["choices"]] == [0, 1, 2]
        assert [c["message"]["content"] for c in three["choices"]] == [a["choices"][0]["message"]["content"] for a in alone]
        assert three["usage"]["completion_tokens"] == sum(a["usage"]["completion_tokens"] for a in alone)
        assert three["usage"]["prompt_tokens"] == alone[0]["usage"]["prompt_tokens"]

        chunks = stream(base, {**body, "n": 3, "stream_options": {"include_usage": True}})
        texts, finished, roles = ["", "", ""], [None] * 3, [0] * 3
        for chunk in chunks[:-1]:
            (choice,) = chunk["choices"]
            i = choice["index"]
            texts[i] += choice["delta"].get("content") or ""  # the first delta's is null
            roles[i] += "role" in choice["delta"]
            finished[i] = choice["finish_reason"] or finished[i]
        assert texts == [c["message"]["content"] for c in three["choices"]]
        assert finished == [c["finish_reason"] for c in three["choices"]]
        assert roles == [1, 1, 1]
        assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == three["usage"]["completion_tokens"]


def test_more_choices_than_allowed_or_than_the_queue_holds_are_refused():
    with serve(*ARGS) as (_, base):
        for n, text in ((9, "at most 8"), (0, "between 1 and 8")):
            status, body = post(base, "/v1/completions", {"prompt": "x", "n": n})
            assert status == 400 and body["error"]["param"] == "n" and text in body["error"]["message"], body
    with serve(*ARGS, "--queue", "2") as (_, base):
        status, body = post(base, "/v1/completions", {"prompt": "x", "n": 6})
        assert status == 400 and body["error"]["param"] == "n" and "(5, --parallel + --queue)" in body["error"]["message"], body


def test_choices_beyond_the_slots_are_queued_and_equal_the_requests_seeded_seed_plus_i():
    body = {"messages": [{"role": "user", "content": "def main():"}], "max_tokens": 10, "temperature": 0.8, "seed": 40}
    with serve(*ARGS) as (_, base):
        alone = []
        for i in range(7):
            status, one = post(base, "/v1/chat/completions", {**body, "seed": 40 + i})
            assert status == 200, one
            alone.append(one["choices"][0]["message"]["content"])
        status, seven = post(base, "/v1/chat/completions", {**body, "n": 7})
        assert status == 200, seven
        assert [c["index"] for c in seven["choices"]] == list(range(7))
        assert [c["message"]["content"] for c in seven["choices"]] == alone
        chunks = stream(base, {**body, "n": 7})
        texts = [""] * 7
        for chunk in chunks:
            (choice,) = chunk["choices"]
            texts[choice["index"]] += choice["delta"].get("content") or ""
        assert texts == alone
        greedy = {"prompt": "def main():", "max_tokens": 10, "temperature": 0}
        status, one = post(base, "/v1/completions", greedy)
        status, five = post(base, "/v1/completions", {**greedy, "n": 5})
        assert status == 200 and [c["text"] for c in five["choices"]] == [one["choices"][0]["text"]] * 5, five


def test_alternating_conversations_on_one_slot_resume_from_the_prefix_store():
    one_slot = ("--draft", DRAFT, "--draft-policy", "fixed", "--draft-max", "4", "--parallel", "1")
    a1, b1 = "User: name three fruits\nAssistant:", "def main():\n    print("
    with serve(*one_slot) as (_, base):
        reply_a = completion(base, a1)["choices"][0]["text"]
        reply_b = completion(base, b1)["choices"][0]["text"]
        a2, b2 = a1 + reply_a + "\nUser: and three more\nAssistant:", b1 + reply_b + ")\n    return 0"
        warm = [completion(base, a2), completion(base, b2)]
        for turn in warm:
            assert turn["usage"]["prompt_tokens_details"]["cached_tokens"] > 1, turn["usage"]
        assert metric(base, "prefix_store_hits_total") == 2
        assert metric(base, "prefix_store_entries") >= 1 and metric(base, "prefix_store_bytes") > 0
    with serve(*one_slot, "--cache-bytes", "0") as (_, base):
        cold = [completion(base, a2), completion(base, b2)]
        assert metric(base, "prefix_store_hits_total") == 0
    assert [t["choices"][0]["text"] for t in warm] == [t["choices"][0]["text"] for t in cold]
