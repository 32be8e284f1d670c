#!/usr/bin/env python3
"""Self-distillation data: the target's own chat replies to the prompt set, one JSON line per prompt.
The replies come from `specula serve`, started here with --parallel slots that decode side by side
in one batched forward (several times the throughput of one `specula generate --chat` per prompt
on a CPU, where a step of a few rows costs little more than a step of one), through its
/v1/chat/completions: the model's chat template, greedy, or sampled at --temp with seed + prompt
index per request (a sequence's output does not depend on its neighbours in the batch).
  generate_responses.py --specula BIN --model GGUF --prompts smollm2_prompts.json --out OUT.jsonl
Resumable: prompts already in OUT are skipped, and so are those the server refused (too long for
--ctx with --n reply tokens) in an earlier run with the same --ctx and --n (OUT.refused.jsonl)."""
import argparse, json, os, socket, subprocess, sys, time, urllib.error, urllib.request
from concurrent.futures import ThreadPoolExecutor
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from chat_format import messages
from reply_order import reply_order

ap = argparse.ArgumentParser()
ap.add_argument("--specula", required=True)
ap.add_argument("--model", required=True)
ap.add_argument("--prompts", required=True)
ap.add_argument("--out", required=True)
ap.add_argument("--n", type=int, default=128)
ap.add_argument("--temp", type=float, default=0.0)
ap.add_argument("--seed", type=int, default=1)
ap.add_argument("--threads", type=int, default=2)
ap.add_argument("--parallel", type=int, default=4, help="server slots, and requests in flight")
ap.add_argument("--ctx", type=int, default=1024, help="context per slot (prompt + --n must fit)")
ap.add_argument("--split", default=None, help="only this split (train / heldout)")
ap.add_argument("--first", type=int, default=None, help="only the first N prompts of the set")
ap.add_argument("--limit", type=int, default=None,
                help="only the first N prompts in reply order (held-out first, then the categories round-robin; after --split)")
ap.add_argument("--frame", default=None,
                help="for a pretrained (not chat-tuned) target: /v1/completions of this frame around each prompt, e.g. 'Question: {}\\nAnswer:'")
ap.add_argument("--single-turn", action="store_true",
                help="only the prompts without an earlier conversation (a --frame takes one prompt, not a conversation)")
a = ap.parse_args()

prompts = json.load(open(a.prompts))["prompts"][:a.first]
done = set()
if os.path.exists(a.out):
    done = {json.loads(l)["index"] for l in open(a.out)}
refused_path = a.out + ".refused.jsonl"
if os.path.exists(refused_path):
    refused = {r["index"] for r in map(json.loads, open(refused_path)) if r["ctx"] == a.ctx and r["n"] == a.n}
    if refused - done:
        print(f"generate_responses: {len(refused - done)} prompts the server refused at --ctx {a.ctx} --n {a.n} are skipped "
              f"({refused_path})", file=sys.stderr)
    done |= refused
if a.frame and not a.single_turn:
    for i, p in enumerate(prompts):
        if p.get("context"):
            sys.exit(f"generate_responses: prompt {i} carries an earlier conversation, which a --frame cannot render: pass --single-turn")
order = reply_order(prompts, a.split, a.single_turn)[:a.limit]
todo = [i for i in order if i not in done]
if not todo:
    sys.exit(0)

with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
url = f"http://127.0.0.1:{port}"
log_path = a.out + ".server.log"
server = subprocess.Popen([a.specula, "-q", "serve", "-m", a.model, "--parallel", str(a.parallel), "-t", str(a.threads),
                           "-c", str(a.ctx), "--host", "127.0.0.1", "--port", str(port)],
                          stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=open(log_path, "w"))


def wait_ready(timeout=900):  # a server loading beside other work (nice 19) can take minutes
    t0 = time.time()
    while time.time() - t0 < timeout:
        if server.poll() is not None:
            sys.exit(f"generate_responses: specula serve exited ({server.returncode}); see {log_path}")
        try:
            with urllib.request.urlopen(url + "/health", timeout=2) as r:
                if r.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.5)
    sys.exit(f"generate_responses: specula serve did not come up within {timeout} s; see {log_path}")


def reply(i):
    body = {"max_tokens": a.n, "temperature": a.temp, "seed": a.seed + i}
    if a.frame:
        body["prompt"] = a.frame.format(prompts[i]["prompt"])
    else:
        body["messages"] = messages(prompts[i])
    route = "/v1/completions" if a.frame else "/v1/chat/completions"
    req = urllib.request.Request(url + route, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=600) as r:
            choice = json.load(r)["choices"][0]
            return i, choice["text"] if a.frame else choice["message"]["content"]
    except urllib.error.HTTPError as e:
        if e.code != 400:
            raise
        # a prompt the server refuses (e.g. longer than --ctx with the reply): named, left out and
        # recorded, so that a rerun does not ask again
        error = e.read().decode(errors="replace")[:300]
        print(f"generate_responses: prompt {i} refused: {error}", file=sys.stderr, flush=True)
        with open(refused_path, "a") as f:
            f.write(json.dumps({"index": i, "ctx": a.ctx, "n": a.n, "error": error}) + "\n")
        return i, None


try:
    wait_ready()
    t0 = time.time()
    with open(a.out, "a") as out, ThreadPoolExecutor(a.parallel) as pool:
        for n, (i, text) in enumerate(pool.map(reply, todo), 1):
            if text is None:
                continue
            out.write(json.dumps(dict(prompts[i], index=i, temp=a.temp, frame=a.frame, response=text)) + "\n")
            out.flush()
            if n % 20 == 0 or n == len(todo):
                print(f"{a.out}: {n}/{len(todo)} replies, {time.time() - t0:.0f} s", flush=True)
finally:
    server.terminate()
    server.wait()
