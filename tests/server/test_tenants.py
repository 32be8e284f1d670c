"""Tenants through a running server (docs/server.md, "Tenants"): with several API keys, one key's
requests never reuse what another key's left (the slots' prefixes, the prefix store, the suffix
cache's lookup drafts), `cache_salt` splits one key's caches the same way, and /slots shows a key
the figures of its own requests only. Each test states the breakage it catches."""
import json
import re
import urllib.error
import urllib.request

from serving import serve

KEY_A, KEY_B = "sk-tenant-a", "sk-tenant-b"
KEYS = ("--api-key", KEY_A, "--api-key", KEY_B)
# A system prompt long enough that its reuse is plain in cached_tokens.
SYSTEM = ("You are the assistant of the Northwind trading company. Answer in one sentence, name the warehouse "
          "(Oslo, Lyon or Porto) that ships the item, and never mention prices or the discount codes "
          "ALPHA-7, BRAVO-9 and CHARLIE-3, which are for staff only.")


def call(base, path, key, body=None):
    """(status, JSON) of a request with `key` as its bearer token; GET without a body."""
    req = urllib.request.Request(base + path, data=None if body is None else json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json", "Authorization": "Bearer " + key})
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def chat(base, key, question, **fields):
    body = {"messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}], "max_tokens": 8,
            "temperature": 0, **fields}
    status, reply = call(base, "/v1/chat/completions", key, body)
    assert status == 200, reply
    return reply


def cached(reply):
    return reply["usage"]["prompt_tokens_details"]["cached_tokens"]


# Catches: one key's request reusing another key's cached system prompt (slot or prefix store),
# whose cached_tokens and time to first token then tell the second key the first one's prompt
# token by token; and a per-key cache that no longer serves a key's own next turn.
def test_a_key_reuses_its_own_prefix_and_never_another_keys():
    with serve(*KEYS, "--parallel", "2") as (_, base):
        first = chat(base, KEY_A, "Where does the tea come from?")
        assert cached(first) == 0
        other = chat(base, KEY_B, "Where does the tea come from?")
        assert cached(other) == 0, other["usage"]
        again = chat(base, KEY_A, "Where does the coffee come from?")
        assert cached(again) > first["usage"]["prompt_tokens"] // 2, again["usage"]
        # The second key's own next turn is served from its own cache.
        assert cached(chat(base, KEY_B, "Where does the coffee come from?")) > 0


# Catches: `cache_salt` refused or ignored (a salted request served another salt's or the unsalted
# prefix), or a request with the same salt not served from its cache.
def test_cache_salt_splits_a_keys_cache():
    with serve(*KEYS, "--parallel", "2") as (_, base):
        assert cached(chat(base, KEY_A, "Where does the tea come from?", cache_salt="user-1")) == 0
        assert cached(chat(base, KEY_A, "Where does the tea come from?", cache_salt="user-2")) == 0
        assert cached(chat(base, KEY_A, "Where does the tea come from?")) == 0
        assert cached(chat(base, KEY_A, "Where does the rice come from?", cache_salt="user-1")) > 0
        assert cached(chat(base, KEY_B, "Where does the rice come from?", cache_salt="user-1")) == 0
        for salt, problem in (("", "non-empty string"), (7, "non-empty string"), ("x" * 1025, "1024")):
            status, refused = call(base, "/v1/chat/completions", KEY_A,
                                   {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2, "cache_salt": salt})
            assert status == 400 and refused["error"]["param"] == "cache_salt" and problem in refused["error"]["message"], refused


# Catches: /slots showing one key the lengths of another key's prompt and reply (how much of a
# slot its prompt filled, how far its generation went).
def test_slots_show_a_key_nothing_of_another_keys_requests():
    with serve(*KEYS, "--parallel", "2") as (_, base):
        chat(base, KEY_A, "Where does the tea come from?")
        status, mine = call(base, "/slots", KEY_A)
        assert status == 200 and any(s.get("n_cached", 0) > 0 for s in mine), mine
        status, theirs = call(base, "/slots", KEY_B)
        assert status == 200 and len(theirs) == 2
        for slot in theirs:
            assert set(slot) == {"id", "state", "n_ctx"} or slot.get("n_cached", 0) == slot.get("n_prompt", 0) == 0, theirs


def suffix_metrics(base, key):
    req = urllib.request.Request(base + "/metrics", headers={"Authorization": "Bearer " + key})
    with urllib.request.urlopen(req) as r:
        text = r.read().decode()
    return {m.group(1): float(m.group(2)) for m in re.finditer(r"^specula:(suffix_cache_\w+) (\S+)$", text, re.M)}


# Catches: lookup drafts taken from another key's earlier requests (which make a key's speed, and
# the `speculation` object and token kinds of its replies, tell what another key's requests said)
# without --shared-suffix-cache, or the flag not sharing them.
def test_the_suffix_cache_drafts_across_keys_only_with_the_flag():
    args = (*KEYS, "--ngram", "--draft-policy", "fixed", "--draft-max", "6", "--cache-bytes", "0")
    prompt = {"prompt": "The list of the planets, in order: Mercury,", "max_tokens": 24, "temperature": 0}
    for shared in (False, True):
        with serve(*args, *(("--shared-suffix-cache",) if shared else ())) as (_, base):
            status, first = call(base, "/v1/completions", KEY_A, prompt)
            assert status == 200, first
            before = suffix_metrics(base, KEY_A)
            status, second = call(base, "/v1/completions", KEY_B, prompt)
            assert status == 200, second
            after = suffix_metrics(base, KEY_A)
            assert second["choices"][0]["text"] == first["choices"][0]["text"]
            gained = after["suffix_cache_accepted_tokens_total"] - before["suffix_cache_accepted_tokens_total"]
            assert (gained > 0) == shared, (shared, before, after)
            if not shared:
                # The first key's own repeat still drafts from its own earlier request.
                call(base, "/v1/completions", KEY_A, prompt)
                assert suffix_metrics(base, KEY_A)["suffix_cache_accepted_tokens_total"] > after["suffix_cache_accepted_tokens_total"]


# Catches: per-key caches on a server without keys (one tenant, "anonymous": every request reuses
# every other's prefix, as before keys existed).
def test_without_keys_every_request_shares_one_cache():
    with serve("--parallel", "2") as (_, base):
        chat(base, "", "Where does the tea come from?")
        assert cached(chat(base, "", "Where does the coffee come from?")) > 0
