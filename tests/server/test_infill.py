"""POST /infill end to end through a real socket on Qwen2.5-Coder-0.5B (scripts/fetch_models.sh qwen-coder):
the request shapes llama.vscode and llama.vim send, llama-server's repo-level prompt layout, speculative
output equal to plain decoding, the per-token stop rules, and the refusals. Mirrors llama.cpp's own
tools/server/tests/unit/test_infill.py where the routes agree."""
import json
import os
import urllib.request

import pytest

from serving import SMOLLM2, post, serve

MODELS = os.environ.get("SPECULA_MODEL_CACHE") or os.path.expanduser("~/.cache/specula/models")
QWEN_CODER = os.path.join(MODELS, "qwen2.5-coder-0.5b-instruct-q8_0.gguf")

# llama.vscode's completion request (src/llama-server.ts, createRequestPayload): its defaults, with
# the extension's n_predict, t_max_prompt_ms and t_max_predict_ms settings at their defaults.
VSCODE = {"input_prefix": "", "input_suffix": "", "input_extra": [], "prompt": "", "n_predict": 128,
          "top_k": 40, "top_p": 0.99, "stream": False, "samplers": ["top_k", "top_p", "infill"], "cache_prompt": True,
          "t_max_prompt_ms": 500, "t_max_predict_ms": 2500}
# Its warm-up when the extra context changes: nothing predicted, the prompt cached.
VSCODE_WARMUP = {"input_prefix": "", "input_suffix": "", "input_extra": [], "prompt": "", "n_predict": 0, "samplers": [],
                 "cache_prompt": True, "t_max_prompt_ms": 500, "t_max_predict_ms": 1}
# llama.vim's completion request (autoload/llama.vim, llama#fim): chunks carry the time they were picked.
VIM = {"id_slot": 0, "input_prefix": "", "input_suffix": "", "input_extra": [], "prompt": "", "n_predict": 128, "n_indent": 0,
       "top_k": 40, "top_p": 0.99, "stream": False, "samplers": ["top_k", "top_p", "infill"], "cache_prompt": True,
       "t_max_prompt_ms": 500, "t_max_predict_ms": 1000,
       "response_fields": ["content", "timings/prompt_n", "timings/prompt_ms", "timings/prompt_per_token_ms",
                           "timings/prompt_per_second", "timings/predicted_n", "timings/predicted_ms",
                           "timings/predicted_per_token_ms", "timings/predicted_per_second", "truncated", "tokens_cached"]}
# Its ring-buffer update (s:ring_update): the extra context alone, temperature 0 with no samplers.
VIM_RING = {"input_prefix": "", "input_suffix": "", "input_extra": [], "prompt": "", "n_predict": 0, "temperature": 0.0,
            "stream": False, "samplers": [], "cache_prompt": True, "t_max_prompt_ms": 1, "t_max_predict_ms": 1, "response_fields": [""]}

SIBLING = ("def add(a, b):\n    return a + b\n\n\ndef mul(a, b):\n    return a * b\n\n\n"
           "def area(width, height):\n    total = mul(width, height)\n    return total\n")
EXTRA = [{"filename": "ops.py", "text": SIBLING, "time": [1733400000, 5000]}, {"text": "# no name\n"}]
PREFIX = "from ops import add, mul\n\n\ndef area(width, height):\n"
SUFFIX = "\n\ndef main():\n    print(area(2, 3))\n"
GREEDY = {"temperature": 0, "samplers": ["top_k", "temperature"], "top_k": 1}


@pytest.fixture(scope="module", autouse=True)
def need_models():
    assert os.path.exists(QWEN_CODER), f"{QWEN_CODER} is absent: run scripts/fetch_models.sh qwen-coder"


@pytest.fixture(scope="module")
def plain():
    with serve("-c", "4096", model=QWEN_CODER) as (_, base):
        yield base


@pytest.fixture(scope="module")
def lookup():
    """Prompt lookup (n-gram) drafts: code repeats its sibling files, so drafts are accepted."""
    with serve("-c", "4096", "--ngram", model=QWEN_CODER) as (_, base):
        yield base


def infill(base, **fields):
    status, body = post(base, "/infill", fields)
    assert status == 200, body
    return body


def tokens(base, text, special=False):
    status, body = post(base, "/tokenize", {"content": text, "parse_special": special})
    assert status == 200, body
    return body["tokens"]


def test_plugin_request_shapes(plain):
    chunk = {"filename": "ops.py", "text": SIBLING}
    for shape in (VSCODE, VIM):
        body = infill(plain, **{**shape, "input_prefix": PREFIX, "input_suffix": SUFFIX, "input_extra": [chunk], "n_predict": 16,
                                "t_max_prompt_ms": 600000})
        assert isinstance(body["content"], str)
        if "response_fields" in shape:  # llama.vim reads the flattened paths it asked for, and nothing else
            assert set(body) == set(shape["response_fields"])
            assert body["timings/predicted_n"] > 0 and body["truncated"] is False
        else:
            assert body["tokens_predicted"] > 0 and body["tokens_evaluated"] > 0
            assert body["stop_type"] in ("eos", "limit", "word") and body["truncated"] is False
            assert set(body["timings"]) >= {"prompt_n", "prompt_ms", "predicted_n", "predicted_ms", "predicted_per_second"}
    for warmup in (VSCODE_WARMUP, VIM_RING):
        body = infill(plain, **{**warmup, "input_extra": [chunk]})
        assert body.get("content", "") == "" and body.get("tokens_predicted", 0) == 0


def test_input_extra_layout(plain):
    """The prompt is llama-server's format_prompt_infill: repo name, each chunk after a file separator
    and its name ("tmp" without one), the current file's separator, then prefix, prompt, suffix."""
    body = infill(plain, input_prefix=PREFIX, input_suffix=SUFFIX, input_extra=EXTRA, prompt="    total", n_predict=1,
                  return_prompt_tokens=True)
    special = {name: tokens(plain, f"<|{name}|>", special=True) for name in ("repo_name", "file_sep", "fim_prefix", "fim_suffix", "fim_middle")}
    assert all(len(t) == 1 for t in special.values()), special
    expected = (special["repo_name"] + tokens(plain, "myproject\n")
                + special["file_sep"] + tokens(plain, "ops.py\n") + tokens(plain, SIBLING)
                + special["file_sep"] + tokens(plain, "tmp\n") + tokens(plain, "# no name\n")
                + special["file_sep"] + tokens(plain, "filename\n")
                + special["fim_prefix"] + tokens(plain, PREFIX) + tokens(plain, "    total")
                + special["fim_suffix"] + tokens(plain, SUFFIX) + special["fim_middle"])
    assert body["prompt_tokens"] == expected
    assert body["tokens_evaluated"] == len(expected)


def test_speculative_equals_plain(plain, lookup):
    """Greedy text with lookup drafts is plain decoding's, request by request, and the drafts were accepted."""
    accepted = 0
    for prompt in ("    total = ", "    ", "    return "):
        request = {"input_prefix": PREFIX, "input_suffix": SUFFIX, "input_extra": EXTRA, "prompt": prompt, "n_predict": 48, **GREEDY}
        spec = infill(lookup, **request)
        assert spec["content"] == infill(plain, **request)["content"]
        accepted += spec["speculation"]["accepted"]
    assert accepted > 0


def indent_cut(text, n_indent):
    """llama-server's n_indent rule on a whole text: a line after the first whose first non-blank
    character has fewer blanks before it ends the text before that character."""
    lines = text.split("\n")
    at = len(lines[0]) + 1
    for line in lines[1:]:
        stripped = line.lstrip(" \t")
        if stripped and len(line) - len(stripped) < n_indent:
            return text[:at + len(line) - len(stripped)]
        at += len(line) + 1
    return text


@pytest.mark.parametrize("server", ["plain", "lookup"])
def test_n_indent_stops_the_text(server, request):
    """At the first token that starts a line indented less than n_indent, inside accepted drafts too."""
    base = request.getfixturevalue(server)
    fields = {"input_prefix": "class Shape:\n    def __init__(self, w, h):\n", "input_suffix": "\n", "input_extra": EXTRA,
              "prompt": "        self.w = w\n", "n_predict": 96, **GREEDY}
    free = infill(base, **fields)["content"]
    cut = indent_cut(free, 8)
    assert cut != free, f"the greedy text never dedents: {free!r}"
    limited = infill(base, **fields, n_indent=8)
    assert limited["content"] == cut
    assert limited["stop_type"] == "limit"


def test_t_max_predict_ms_ends_at_a_newline(plain):
    """Past the limit, the text ends with the next token that holds a newline."""
    fields = {"input_prefix": PREFIX, "input_suffix": SUFFIX, "input_extra": EXTRA, "prompt": "", "n_predict": 64, **GREEDY}
    free = infill(plain, **fields)["content"]
    assert free.count("\n") >= 3, free
    limited = infill(plain, **fields, t_max_predict_ms=1)
    assert free.startswith(limited["content"]) and "\n" in limited["content"]
    assert len(limited["content"]) < len(free) and limited["stop_type"] == "limit"


def test_t_max_prompt_ms_ends_at_the_first_token(plain):
    """A prompt that took longer than the limit to process ends the text at its first token."""
    body = infill(plain, input_prefix=PREFIX * 20, input_suffix=SUFFIX, input_extra=[{"text": SIBLING * 10}], n_predict=32,
                  t_max_prompt_ms=1, **GREEDY)
    assert body["tokens_predicted"] == 1 and body["stop_type"] == "limit"


def test_n_predict_zero_caches_the_prompt(plain):
    """llama.vscode's warm-up: no tokens, and the next request reuses the prompt's rows."""
    extra = [{"filename": "warm.py", "text": SIBLING * 3}]
    warm = infill(plain, input_prefix="", input_suffix="", input_extra=extra, prompt="", n_predict=0)
    assert warm["content"] == "" and warm["tokens_predicted"] == 0 and warm["stop_type"] == "limit"
    body = infill(plain, input_prefix=PREFIX, input_suffix=SUFFIX, input_extra=extra, n_predict=4, **GREEDY)
    assert body["timings"]["cache_n"] >= len(tokens(plain, SIBLING * 3))


def test_refusals(plain):
    base = {"input_prefix": PREFIX, "input_suffix": SUFFIX}
    for fields, param in [({"lora": [{"id": 0, "scale": 0.5}]}, "lora"),
                          ({"samplers": ["dry", "top_k"]}, "samplers"),
                          ({"samplers": ["temperature", "top_k"]}, "samplers"),
                          ({"samplers": ["top_k"], "temperature": 0.2}, "temperature"),
                          ({"samplers": ["infill"]}, "samplers"),
                          ({"input_extra": [{"filename": "a.py"}]}, "input_extra[0].text"),
                          ({"input_extra": [{"text": "x", "path": "a.py"}]}, "input_extra[0].path"),
                          ({"input_extra": "x"}, "input_extra"),
                          ({"n_indent": -1}, "n_indent"),
                          ({"id_slot": 3}, "id_slot")]:
        status, body = post(plain, "/infill", {**base, **fields})
        assert status == 400 and body["error"]["param"] == param, (fields, body)
    status, body = post(plain, "/infill", {"input_suffix": ""})
    assert status == 400 and body["error"]["param"] == "input_prefix"
    # A field /infill does not read is served and named, as on the OpenAI routes.
    req = urllib.request.Request(plain + "/infill", data=json.dumps({**base, **GREEDY, "n_predict": 1, "typical_p": 1}).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as r:
        assert r.status == 200 and r.headers["X-Specula-Ignored-Fields"] == "typical_p"


def test_model_without_fim_tokens():
    assert os.path.exists(SMOLLM2), f"{SMOLLM2} is absent: run scripts/fetch_models.sh smollm2"
    with serve(model=SMOLLM2) as (_, base):
        status, body = post(base, "/infill", {"input_prefix": "def f(", "input_suffix": ")\n"})
        assert status == 400 and "fill-in-the-middle" in body["error"]["message"], body


def test_typing_a_line_reuses_the_prompt(plain, lookup):
    """The layout puts what an editor keeps (extra context, the file above the cursor) first, so the
    request at the next line's end evaluates little more than that line, and its text is a cold request's."""
    above = "".join(f"def f{i}(x):\n    return x + {i}\n\n\n" for i in range(12))
    first = {"input_prefix": above, "input_suffix": "\n", "input_extra": EXTRA, "prompt": "def g(x):", "n_predict": 8, **GREEDY}
    second = {**first, "input_prefix": above + "def g(x):\n", "prompt": "    y = x * 2"}
    infill(plain, **first)
    warm = infill(plain, **second)
    assert warm["timings"]["prompt_n"] < warm["tokens_evaluated"] // 4, warm["timings"]
    assert warm["content"] == infill(lookup, **second)["content"]  # a server that never saw `first`


def test_a_line_inserted_above_the_cursor_recomputes_from_it(plain, lookup):
    """Rows before an inserted line are reused; from the insertion on, every row is recomputed (their
    context changed), so the text is a cold request's and not a shifted cache's."""
    head = "".join(f"def f{i}(x):\n    return x + {i}\n\n\n" for i in range(12))
    tail = "".join(f"def h{i}(x):\n    return x * {i}\n\n\n" for i in range(4))
    first = {"input_prefix": head + tail, "input_suffix": "\n", "input_extra": EXTRA, "prompt": "def g(x):", "n_predict": 8, **GREEDY}
    second = {**first, "input_prefix": head + "import math\n" + tail}
    infill(plain, **first)
    warm = infill(plain, **second)
    after_insertion = len(tokens(plain, "import math\n" + tail + "def g(x):")) + len(tokens(plain, "\n")) + 3  # + FIM_SUF, FIM_MID
    assert warm["tokens_evaluated"] - warm["timings"]["prompt_n"] >= len(tokens(plain, head)) - 1, warm["timings"]  # the head reused
    # From the insertion on, everything recomputed (no shifted rows); nothing before it.
    assert after_insertion - 3 <= warm["timings"]["prompt_n"] <= after_insertion + 2, warm["timings"]
    assert warm["content"] == infill(lookup, **second)["content"]  # a server that never saw `first`


def test_stream(plain):
    """Server-sent events: content pieces with stop false, then the whole reply's fields with stop true."""
    fields = {"input_prefix": PREFIX, "input_suffix": SUFFIX, "input_extra": EXTRA, "n_predict": 24, **GREEDY}
    whole = infill(plain, **fields)
    req = urllib.request.Request(plain + "/infill", data=json.dumps({**fields, "stream": True}).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as r:
        events = [json.loads(line[6:]) for line in r.read().decode().split("\n\n") if line.startswith("data: ")]
    assert events and all(not e["stop"] for e in events[:-1]) and events[-1]["stop"]
    assert "".join(e["content"] for e in events) == whole["content"]
    assert events[-1]["tokens_predicted"] == whole["tokens_predicted"] and events[-1]["stop_type"] == whole["stop_type"]
