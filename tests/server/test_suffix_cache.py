"""The suffix cache through a running server: a request repeating an earlier one is drafted from
the earlier text (its drafts accepted, counted on /metrics) and gives the text plain decoding gives;
--suffix-cache-tokens 0 turns it off, and a bad value is refused."""
import re
import subprocess
import urllib.request

from serving import CLI, TARGET, post, serve

ARGS = ("--ngram", "--draft-policy", "fixed", "--draft-max", "6")
PROMPT = "The list of the planets, in order: Mercury,"


def metrics(base):
    with urllib.request.urlopen(base + "/metrics") as r:
        text = r.read().decode()
    return {m.group(1): float(m.group(2)) for m in re.finditer(r"^specula:(suffix_cache_\w+) (\S+)$", text, re.M)}


def completion(base, **sampling):
    request = {"prompt": PROMPT, "max_tokens": 24, "temperature": 0} | sampling
    status, body = post(base, "/v1/completions", request)
    assert status == 200, body
    return body["choices"][0]["text"]


def test_a_repeated_request_is_drafted_from_the_earlier_one_and_gives_the_plain_text():
    with serve("--no-spec") as (_, base):  # plain decoding
        plain = completion(base)
    with serve(*ARGS) as (_, base):
        first = completion(base)
        before = metrics(base)
        second = completion(base)
        after = metrics(base)
    assert first == second == plain
    assert before["suffix_cache_tokens"] > 0
    assert after["suffix_cache_drafts_total"] > before["suffix_cache_drafts_total"]
    assert after["suffix_cache_accepted_tokens_total"] > before["suffix_cache_accepted_tokens_total"], after
    with serve(*ARGS, "--suffix-cache-tokens", "0") as (_, base):
        completion(base)
        assert completion(base) == plain
        off = metrics(base)
    assert off["suffix_cache_drafts_total"] == 0 and off["suffix_cache_tokens"] == 0


def test_a_seeded_sampled_request_repeats_plain_decodings_text_whatever_the_cache_drafted():
    # Each position's token is drawn at a uniform keyed by the seed and the position: drafts
    # proposed one-hot (the suffix cache's, lookup's) change how many tokens a forward emits,
    # never which. Without the keyed draws the second request, drafted from the first, drew
    # differently.
    seeded = {"temperature": 1.0, "seed": 11}
    with serve("--no-spec") as (_, base):
        plain = completion(base, **seeded)
        assert completion(base, **seeded | {"seed": 12}) != plain  # the seed matters
    for args in (ARGS, ()):  # fixed n-gram chains; the default (lookup trees, sized by measured times)
        with serve(*args) as (_, base):
            texts = [completion(base, **seeded) for _ in range(3)]
            drafted = metrics(base)["suffix_cache_accepted_tokens_total"]
        assert texts == [plain] * 3, (args, texts, plain)
        assert drafted > 0, args


def test_a_negative_bound_is_refused_naming_the_option():
    run = subprocess.run([CLI, "serve", "-m", TARGET, "--suffix-cache-tokens", "-1"], capture_output=True, text=True, timeout=60)
    assert run.returncode != 0
    assert "--suffix-cache-tokens" in run.stderr
