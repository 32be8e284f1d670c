"""`specula serve -m MODEL` without a drafter drafts by prompt lookup (n-grams and the suffix cache of
earlier requests); --no-spec serves plain decoding. The same greedy text either way; only the
default drafts."""
from serving import post, serve

REQUEST = {"prompt": "def f(x):", "max_tokens": 48, "temperature": 0}


def completion(base):
    status, body = post(base, "/v1/completions", REQUEST)
    assert status == 200, body
    return body["choices"][0]["text"], body["speculation"]


def test_without_a_drafter_serve_drafts_by_prompt_lookup_and_no_spec_serves_plain_decoding():
    with serve() as (_, base):
        text, speculation = completion(base)
    with serve("--no-spec") as (_, base):
        plain_text, plain_speculation = completion(base)
    assert text == plain_text
    assert speculation["drafted"] > 0 and speculation["accepted"] > 0, speculation
    assert plain_speculation["drafted"] == 0, plain_speculation
