"""Bounded load test for `specula serve` (not run by CI): N concurrent streaming clients for a
while on 127.0.0.1, each request's text compared with the same prompt's text from a single client
at T = 0. Prints throughput, latency percentiles and the server's memory (RSS) at start and end.

    .venv-server/bin/python tests/server/load_test.py --clients 32 --seconds 120 -- \\
        build/bin/specula serve -m models/specula-target.gguf --draft models/specula-draft.gguf --parallel 8

Exits 1 when any response differs from its single-client text, is incomplete, or fails."""
import argparse
import re
import statistics
import subprocess
import sys
import threading
import time

import openai

PROMPTS = ["def read_config(path):", "import os\nimport sys\n", "class Parser:", "The Python standard library",
           "for line in f:", "# Copyright", "def main():", "try:", "Return the number of", "    for i in range("]


def rss_kb(pid):
    with open(f"/proc/{pid}/status") as f:
        return int(re.search(r"VmRSS:\s+(\d+)", f.read()).group(1))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--clients", type=int, default=32)
    ap.add_argument("--seconds", type=float, default=120)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("server", nargs=argparse.REMAINDER, help="-- followed by the serve command (it must not set --port)")
    a = ap.parse_args()
    cmd = [x for x in a.server if x != "--"] + ["--port", "0"]
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True)
    port = None
    for line in proc.stderr:
        m = re.search(r"listening on http://[\d.]+:(\d+)", line)
        port = int(m.group(1)) if m else port
        if "ready" in line:
            break
    threading.Thread(target=lambda: [None for _ in proc.stderr], daemon=True).start()
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused", max_retries=0, timeout=600)
    ask = dict(model=client.models.list().data[0].id, max_tokens=a.max_tokens, temperature=0)
    reference = {p: client.completions.create(prompt=p, **ask).choices[0].text for p in PROMPTS}
    rss_start = rss_kb(proc.pid)

    lock = threading.Lock()
    results, failures = [], []
    stop_at = time.time() + a.seconds

    def worker(i):
        n = i
        while time.time() < stop_at:
            prompt = PROMPTS[n % len(PROMPTS)]
            n += 1
            t0 = time.time()
            first, text, tokens, finish = None, "", 0, None
            try:
                for ch in client.completions.create(prompt=prompt, stream=True, stream_options={"include_usage": True}, **ask):
                    if ch.usage:
                        tokens = ch.usage.completion_tokens
                    for c in ch.choices:
                        if c.text and first is None:
                            first = time.time() - t0
                        text += c.text
                        finish = c.finish_reason or finish
            except Exception as e:  # noqa: BLE001 - every failure is reported
                with lock:
                    failures.append(f"{prompt!r}: {e}")
                continue
            with lock:
                if text != reference[prompt] or finish is None:
                    failures.append(f"{prompt!r}: text differs from the single-client text or has no finish_reason")
                results.append((time.time() - t0, first or 0.0, tokens))

    t_start = time.time()
    threads = [threading.Thread(target=worker, args=(i,)) for i in range(a.clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.time() - t_start
    rss_end = rss_kb(proc.pid)
    proc.terminate()
    proc.wait(timeout=30)

    def pct(xs, q):
        xs = sorted(xs)
        return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else float("nan")
    lat = [r[0] for r in results]
    ttft = [r[1] for r in results]
    toks = sum(r[2] for r in results)
    print(f"clients {a.clients}, {wall:.0f} s: {len(results)} responses, {len(failures)} failures")
    print(f"aggregate {toks / wall:.1f} tok/s, per request {statistics.mean(r[2] / r[0] for r in results if r[0] > 0):.1f} tok/s")
    print(f"latency p50 {pct(lat, .5):.3f} s, p90 {pct(lat, .9):.3f} s, p99 {pct(lat, .99):.3f} s; "
          f"TTFT p50 {pct(ttft, .5):.3f} s, p90 {pct(ttft, .9):.3f} s, p99 {pct(ttft, .99):.3f} s")
    print(f"server RSS {rss_start / 1024:.1f} MiB at start, {rss_end / 1024:.1f} MiB at end")
    for f in failures[:10]:
        print("FAIL", f)
    sys.exit(1 if failures or not results else 0)


if __name__ == "__main__":
    main()
