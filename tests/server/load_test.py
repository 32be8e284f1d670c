"""Bounded load test for `specula serve`: N concurrent streaming clients for a while on 127.0.0.1.
Most requests are greedy (T = 0), each one's text compared with the same prompt's text from a
single client; mixed in are sampled requests (T = 0.9, which must complete) and requests whose
client goes away after the first chunk (which must be cancelled, freeing their slots). Samples the
server's RSS from /proc every second; records throughput, latency and time-to-first-token
percentiles and the RSS samples (--json). ctest runs a 20-second version (server_load).

    .venv-server/bin/python tests/server/load_test.py --clients 32 --seconds 120 --json load.json -- \\
        build/bin/specula serve -m models/specula-target.gguf --draft models/specula-draft.gguf --parallel 8

Exits 1 when any response fails, a greedy one differs from its single-client text, any is
incomplete (greedy: fewer tokens than alone; every one: no finish_reason), the cancelled requests
are not counted as cancelled or leave a slot busy, or when memory is not flat, or when the server
does not exit 0 on SIGTERM (under ASan: LeakSanitizer found a leak at its exit). Flat: the RSS
beside the bounded caches the server reports in /metrics (the forward graphs' compute buffers, whose
sizes follow the batch shapes the load brings, and the prefix store) peaks in the second half of the
run at most --rss-growth (default 10%) above its peak in the first half, when the graph caches fill."""
import argparse
import collections
import json
import re
import statistics
import subprocess
import sys
import threading
import time
import urllib.request

import openai

PROMPTS = ["def read_config(path):", "import os\nimport sys\n", "class Parser:", "The Python standard library",
           "for line in f:", "# Copyright", "def main():", "try:", "Return the number of", "    for i in range("]


def rss_kb(pid):
    with open(f"/proc/{pid}/status") as f:
        return int(re.search(r"VmRSS:\s+(\d+)", f.read()).group(1))


def get_json(url):
    with urllib.request.urlopen(url) as r:
        return json.loads(r.read())


def gauge(metrics, name):
    return int(float(re.search(rf"^specula:{name} (\S+)", metrics, re.M).group(1)))


def pct(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else float("nan")


def start_server(cmd):
    """Starts the serve command on any free port; returns (process, port) once it is ready."""
    proc = subprocess.Popen(cmd + ["--port", "0"], stderr=subprocess.PIPE, text=True)
    port, log = None, []
    for line in proc.stderr:
        log.append(line)
        m = re.search(r"listening on http://[\d.]+:(\d+)", line)
        port = int(m.group(1)) if m else port
        if "ready" in line:
            break
    if port is None or proc.poll() is not None:
        sys.exit("load test: the server did not come up:\n" + "".join(log[-20:]))
    proc.log_tail = collections.deque(maxlen=40)  # the server's last stderr lines, for a failed exit
    threading.Thread(target=lambda: proc.log_tail.extend(proc.stderr), daemon=True).start()
    return proc, port


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--clients", type=int, default=32)
    ap.add_argument("--seconds", type=float, default=120)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--rss-growth", type=float, default=0.10, help="allowed growth of the RSS peak from the first to the second half")
    ap.add_argument("--json", help="write the figures and RSS samples here")
    ap.add_argument("server", nargs=argparse.REMAINDER, help="-- followed by the serve command (it must not set --port)")
    a = ap.parse_args()
    proc, port = start_server([x for x in a.server if x != "--"])
    try:
        report = run(a, proc, port)
    finally:
        proc.terminate()
        exit_code = proc.wait(timeout=60)
    # SIGTERM ends the server gracefully: exit 0, after LeakSanitizer's check in a sanitized build.
    if exit_code != 0:
        report["passed"] = False
        time.sleep(0.5)  # the last stderr lines
        print(f"FAIL the server exited with {exit_code} after SIGTERM:\n" + "".join(proc.log_tail))
    report["server_exit_code"] = exit_code
    if a.json:
        with open(a.json, "w") as f:
            json.dump(report, f, indent=2)
        print(f"wrote {a.json}")
    sys.exit(0 if report["passed"] else 1)


def run(a, proc, port):
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused", max_retries=0, timeout=600)
    ask = dict(model=client.models.list().data[0].id, max_tokens=a.max_tokens, temperature=0)
    reference = {}
    for p in PROMPTS:
        c = client.completions.create(prompt=p, **ask)
        reference[p] = (c.choices[0].text, c.usage.completion_tokens)

    lock = threading.Lock()
    results, failures, rss = [], [], []
    caches = []  # (prefix store bytes, suffix cache tokens, graph buffer bytes, graphs kept) beside each RSS sample
    t_start = time.time()
    stop_at = t_start + a.seconds
    running = threading.Event()
    running.set()

    def sample_rss():
        while running.is_set():
            rss.append((round(time.time() - t_start, 1), rss_kb(proc.pid)))
            metrics = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics").read().decode()
            caches.append(tuple(gauge(metrics, name) for name in ("prefix_store_bytes", "suffix_cache_tokens", "graph_buffer_bytes", "graphs_kept")))
            time.sleep(1.0)

    cancelled = [0]

    def go_away(prompt):
        """Streams a request and closes the connection after its first chunk."""
        stream = client.completions.create(prompt=prompt, stream=True, **dict(ask, max_tokens=a.max_tokens * 4))
        for _ in stream:
            break
        stream.close()
        with lock:
            cancelled[0] += 1

    def sampled(prompt, seed):
        text, finish = "", None
        for ch in client.completions.create(prompt=prompt, stream=True, **dict(ask, temperature=0.9, seed=seed)):
            for c in ch.choices:
                text += c.text
                finish = c.finish_reason or finish
        if finish is None:
            with lock:
                failures.append(f"{prompt!r} at T = 0.9: no finish_reason")

    def worker(i):
        n = i
        while time.time() < stop_at:
            prompt = PROMPTS[n % len(PROMPTS)]
            n += 1
            if n % 8 in (3, 6):
                try:
                    go_away(prompt) if n % 8 == 3 else sampled(prompt, n)
                except Exception as e:  # noqa: BLE001 - every failure is reported
                    with lock:
                        failures.append(f"{prompt!r} ({'cancelled' if n % 8 == 3 else 'sampled'}): {e}")
                continue
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
                want_text, want_tokens = reference[prompt]
                if text != want_text:
                    failures.append(f"{prompt!r}: text differs from the single-client text")
                elif finish is None or tokens != want_tokens:
                    failures.append(f"{prompt!r}: incomplete ({tokens} of {want_tokens} tokens, finish_reason {finish})")
                results.append((time.time() - t0, first or 0.0, tokens))

    sampler = threading.Thread(target=sample_rss, daemon=True)
    sampler.start()
    threads = [threading.Thread(target=worker, args=(i,)) for i in range(a.clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.time() - t_start
    running.clear()
    sampler.join()

    # Every slot idle again, and every client that went away counted as cancelled (a request can
    # also end before the server notices its client left, hence at most).
    base = f"http://127.0.0.1:{port}"
    deadline = time.time() + 120
    while time.time() < deadline and any(s["state"] != "idle" for s in get_json(base + "/slots")):
        time.sleep(0.05)
    if any(s["state"] != "idle" for s in get_json(base + "/slots")):
        failures.append("a slot stayed busy after every client finished")
    metrics = urllib.request.urlopen(base + "/metrics").read().decode()
    n_cancelled = int(re.search(r"^specula:requests_cancelled_total (\d+)", metrics, re.M).group(1))
    if cancelled[0] and n_cancelled == 0:
        failures.append(f"{cancelled[0]} clients went away, the server cancelled none")
    if n_cancelled > cancelled[0]:
        failures.append(f"{n_cancelled} requests cancelled, but only {cancelled[0]} clients went away")

    # Memory beside the bounded caches the server reports: the forward graphs' compute buffers
    # (their shapes, and so their sizes, change as the load does) and the prefix store.
    half = wall / 2
    rest = [(t, kb - (c[0] + c[2]) // 1024) for (t, kb), c in zip(rss, caches)]
    first_peak = max((kb for t, kb in rest if t <= half), default=0)
    second_peak = max((kb for t, kb in rest if t > half), default=0)
    rss_flat = first_peak > 0 and second_peak <= first_peak * (1 + a.rss_growth)
    lat = [r[0] for r in results]
    ttft = [r[1] for r in results]
    toks = sum(r[2] for r in results)
    per_request = statistics.mean(r[2] / r[0] for r in results if r[0] > 0) if results else float("nan")
    report = {
        "clients": a.clients, "seconds": wall, "max_tokens": a.max_tokens, "responses": len(results), "failures": failures,
        "clients_gone": cancelled[0], "requests_cancelled": n_cancelled,
        "aggregate_tok_s": toks / wall, "per_request_tok_s_mean": per_request,
        "latency_s": {q: pct(lat, v) for q, v in (("p50", .5), ("p90", .9), ("p99", .99))},
        "ttft_s": {q: pct(ttft, v) for q, v in (("p50", .5), ("p90", .9), ("p99", .99))},
        "rss_kb_samples": rss, "prefix_store_bytes_samples": [c[0] for c in caches],
        "suffix_cache_tokens_samples": [c[1] for c in caches],
        "graph_buffer_bytes_samples": [c[2] for c in caches], "graphs_kept_samples": [c[3] for c in caches],
        "rest_peak_kb_first_half": first_peak, "rest_peak_kb_second_half": second_peak, "rss_flat": rss_flat,
    }
    report["passed"] = bool(results) and not failures and rss_flat
    print(f"clients {a.clients}, {wall:.0f} s: {len(results)} greedy responses, {len(failures)} failures; "
          f"{cancelled[0]} clients went away, {n_cancelled} requests cancelled")
    print(f"aggregate {report['aggregate_tok_s']:.1f} tok/s, per request {per_request:.1f} tok/s")
    print("latency p50 {p50:.3f} s, p90 {p90:.3f} s, p99 {p99:.3f} s".format(**report["latency_s"]) +
          "; TTFT p50 {p50:.3f} s, p90 {p90:.3f} s, p99 {p99:.3f} s".format(**report["ttft_s"]))
    print(f"server RSS {rss[0][1] / 1024:.1f} -> {max(kb for _, kb in rss) / 1024:.1f} MiB at its peak; "
          f"forward graphs kept {caches[-1][3]}, their buffers {caches[-1][2] / 2**20:.1f} MiB; prefix store {caches[-1][0] / 2**20:.1f} MiB")
    print(f"RSS beside them: peak {first_peak / 1024:.1f} MiB in the first half, {second_peak / 1024:.1f} MiB in the second: "
          + ("flat" if rss_flat else f"GREW more than {a.rss_growth:.0%}"))
    for f in failures[:10]:
        print("FAIL", f)
    return report


if __name__ == "__main__":
    main()
