#!/usr/bin/env python3
"""Load on numesh serve, as vLLM's benchmark_serving measures it (Python's standard library only).

N concurrent clients on loopback send streamed completions (prompts of random token ids, fixed
or drawn lengths; ignore_eos, so every request generates its output length) until R requests
are done or T seconds pass, and the script reports requests/s, output tokens/s in all, time to
first token (TTFT) and inter-token latency (ITL, between a stream's chunks) at p50/p90/p99.

  bench/serve_bench.py --url http://127.0.0.1:8080 --concurrency 8 --requests 32
  bench/serve_bench.py --numesh build/release/tools/numesh --model DIR --concurrency 1,8,16 \\
      --server-args "--parallel 16 --batch-tokens 256"     # starts (and stops) the server
  bench/serve_bench.py ... --concurrency 1 --requests 4 --prompt-len 512 --output-len 1 \\
      --background 15                   # TTFT of a 512-token prompt while 15 streams decode

--json FILE writes the figures. A request that fails counts as failed and is reported.
"""

import argparse
import http.client
import json
import random
import re
import shlex
import signal
import subprocess
import sys
import threading
import time
from urllib.parse import urlparse


def percentile(values, p):
    if not values:
        return float("nan")
    s = sorted(values)
    k = (len(s) - 1) * p / 100
    lo, hi = int(k), min(int(k) + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


def one_request(host, port, prompt, output_len, timeout):
    """Streams one completion; returns (ttft, [gaps], tokens) or raises."""
    body = json.dumps({"prompt": prompt, "max_tokens": output_len, "temperature": 0,
                       "ignore_eos": True, "stream": True})
    c = http.client.HTTPConnection(host, port, timeout=timeout)
    start = time.perf_counter()
    c.request("POST", "/v1/completions", body=body, headers={"Content-Type": "application/json"})
    r = c.getresponse()
    if r.status != 200:
        raise RuntimeError(f"HTTP {r.status}: {r.read()[:200]!r}")
    ttft, last, gaps, tokens = None, None, [], 0
    buffer = b""
    while True:
        data = r.read1(65536) if hasattr(r, "read1") else r.read(1)
        if not data:
            break
        buffer += data
        while b"\n\n" in buffer:
            event, buffer = buffer.split(b"\n\n", 1)
            line = event.decode().strip()
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            n = len(json.loads(line[6:])["choices"][0].get("tokens", []))
            if n == 0:
                continue
            now = time.perf_counter()
            if ttft is None:
                ttft = now - start
            else:
                gaps.append((now - last) / n)
            last = now
            tokens += n
    c.close()
    return ttft, gaps, tokens


def run(url, concurrency, requests, duration, prompt_len, prompt_max, output_len, seed, vocab):
    parsed = urlparse(url)
    host, port = parsed.hostname, parsed.port or 80
    rng = random.Random(seed)
    lock = threading.Lock()
    results = {"ttft": [], "itl": [], "tokens": 0, "done": 0, "failed": 0, "errors": []}
    issued = [0]
    deadline = time.perf_counter() + duration

    def client():
        while True:
            with lock:
                if issued[0] >= requests or time.perf_counter() > deadline:
                    return
                issued[0] += 1
                length = prompt_len if prompt_max <= prompt_len else rng.randint(prompt_len, prompt_max)
                prompt = [rng.randrange(1, vocab) for _ in range(length)]
            try:
                ttft, gaps, tokens = one_request(host, port, prompt, output_len, timeout=600)
                with lock:
                    results["ttft"].append(ttft)
                    results["itl"].extend(gaps)
                    results["tokens"] += tokens
                    results["done"] += 1
            except Exception as e:  # a failed request is counted and named, not fatal
                with lock:
                    results["failed"] += 1
                    results["errors"].append(str(e))

    start = time.perf_counter()
    threads = [threading.Thread(target=client) for _ in range(concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - start
    ms = lambda xs, p: percentile(xs, p) * 1e3
    return {
        "concurrency": concurrency, "requests": results["done"], "failed": results["failed"],
        "errors": results["errors"][:5], "seconds": elapsed,
        "requests_per_second": results["done"] / elapsed,
        "output_tokens_per_second": results["tokens"] / elapsed,
        "ttft_ms": {p: ms(results["ttft"], p) for p in (50, 90, 99)},
        "itl_ms": {p: ms(results["itl"], p) for p in (50, 90, 99)},
        "prompt_len": [prompt_len, max(prompt_len, prompt_max)], "output_len": output_len,
    }


def background_streams(url, count, output_len, vocab, stop):
    """`count` streams of `output_len` tokens kept running (each restarted when it ends) until
    `stop` is set: the load a measured request arrives into."""
    parsed = urlparse(url)
    rng = random.Random(99)

    def loop():
        while not stop.is_set():
            try:
                one_request(parsed.hostname, parsed.port or 80,
                            [rng.randrange(1, vocab) for _ in range(16)], output_len, timeout=600)
            except Exception:
                time.sleep(0.1)

    threads = [threading.Thread(target=loop, daemon=True) for _ in range(count)]
    for t in threads:
        t.start()
    return threads


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url", help="a running server (else --numesh and --model start one)")
    ap.add_argument("--numesh", help="the numesh program, to start `numesh serve`")
    ap.add_argument("--model", help="the model folder to serve")
    ap.add_argument("--server-args", default="", help="more `numesh serve` options")
    ap.add_argument("--concurrency", default="8",
                    help="clients at once (1..1024), or a list (1,8,16) measured one after the "
                         "other on the same server, each against the first")
    ap.add_argument("--requests", type=int, default=32,
                    help="requests in all at each concurrency (1..100000)")
    ap.add_argument("--duration", type=float, default=300, help="stop issuing after this many s")
    ap.add_argument("--prompt-len", type=int, default=64, help="prompt tokens (or the least)")
    ap.add_argument("--prompt-max", type=int, default=0, help="draw prompt lengths up to this")
    ap.add_argument("--output-len", type=int, default=64, help="tokens each request generates")
    ap.add_argument("--vocab", type=int, default=4096, help="prompt ids are drawn below this")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--background", type=int, default=0,
                    help="streams decoding meanwhile (each --background-len tokens, restarted), "
                         "so that TTFT is measured under load")
    ap.add_argument("--background-len", type=int, default=512)
    ap.add_argument("--json", help="write the figures to FILE")
    a = ap.parse_args()
    try:
        levels = [int(c) for c in a.concurrency.split(",")]
    except ValueError:
        ap.error(f"--concurrency {a.concurrency!r} must be integers separated by commas")
    if not all(1 <= c <= 1024 for c in levels) or not 1 <= a.requests <= 100000 or a.duration <= 0:
        ap.error(f"--concurrency {a.concurrency} must be 1..1024, --requests {a.requests} "
                 f"1..100000 and --duration {a.duration} positive")
    if a.prompt_len < 1 or a.output_len < 1:
        ap.error(f"--prompt-len {a.prompt_len} and --output-len {a.output_len} must be positive")
    server = None
    url = a.url
    if url is None:
        if not (a.numesh and a.model):
            ap.error("give --url of a running server, or --numesh and --model to start one")
        server = subprocess.Popen([a.numesh, "serve", "--model", a.model, "--port", "0", "--quiet",
                                   *shlex.split(a.server_args)], stdout=subprocess.PIPE, text=True)
        line = server.stdout.readline()
        m = re.search(r"listening on (http://\S+) ", line)
        if not m:
            server.kill()
            sys.exit(f"serve_bench: the server did not start: {line!r}")
        url = m.group(1)
        print(line.strip(), file=sys.stderr)
    stop = threading.Event()
    try:
        if a.background > 0:
            background_streams(url, a.background, a.background_len, a.vocab, stop)
            time.sleep(2.0)  # the streams are decoding when the measured requests come
        results = []
        for c in levels:
            r = run(url, c, a.requests, a.duration, a.prompt_len, a.prompt_max, a.output_len,
                    a.seed, a.vocab)
            r["background_streams"] = a.background
            results.append(r)
    finally:
        stop.set()
        if server is not None:
            server.send_signal(signal.SIGTERM)
            server.wait(timeout=120)
    failed = 0
    for r in results:
        first = results[0]["output_tokens_per_second"]
        ratio = r["output_tokens_per_second"] / first if first > 0 else float("nan")
        print(f"{r['concurrency']} clients: {r['requests']} requests ({r['failed']} failed) in "
              f"{r['seconds']:.2f} s: {r['requests_per_second']:.2f} requests/s, "
              f"{r['output_tokens_per_second']:.1f} output tokens/s"
              + (f" ({ratio:.2f}x {results[0]['concurrency']} clients')" if len(results) > 1 else ""))
        print("  TTFT ms p50/p90/p99: " + " / ".join(f"{r['ttft_ms'][p]:.1f}" for p in (50, 90, 99)) +
              "; ITL ms p50/p90/p99: " + " / ".join(f"{r['itl_ms'][p]:.2f}" for p in (50, 90, 99)))
        for e in r["errors"]:
            print("  error:", e)
        failed += r["failed"]
    if a.json:
        with open(a.json, "w") as f:
            json.dump(results if len(results) > 1 else results[0], f, indent=2)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
