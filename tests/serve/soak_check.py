#!/usr/bin/env python3
"""A soak of numesh serve: 1000 requests of random prompt and output lengths, 16 clients at a
time, a fifth of them streamed and cut off mid-stream by their client, some refused as bad
input on the way; afterwards nothing runs or waits, every KV block is free, every request got
its answer, and the server's resident memory grew by less than a tenth between the first and
the last hundred requests.

usage: soak_check.py NUMESH WORK_DIR TOKENIZER_JSON
"""

import json
import os
import random
import socket
import sys
import threading
import time

from server_check import VOCAB, Server, write_model

NUMESH, WORK = sys.argv[1], sys.argv[2]
REQUESTS, CLIENTS = 1000, 16


def rss_kib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def cut_stream(port, body, rng):
    """A streamed request whose client reads a little, then leaves."""
    data = json.dumps({**body, "stream": True}).encode()
    s = socket.create_connection(("127.0.0.1", port), timeout=60)
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
              + f"Content-Length: {len(data)}\r\n\r\n".encode() + data)
    s.recv(rng.randint(1, 400))
    s.close()


def main():
    model = os.path.join(WORK, "soak-model")
    write_model(model)
    server = Server(model, "--parallel", "8", "--ctx-size", "256", "--batch-tokens", "64",
                    "--max-queue", "1000", "--http-threads", "32")
    rng_lock = threading.Lock()
    rng = random.Random(7)
    counts = {"ok": 0, "cut": 0, "refused": 0, "unexpected": []}
    rss = {}
    next_request = [0]

    def client():
        while True:
            with rng_lock:
                i = next_request[0]
                if i >= REQUESTS:
                    return
                next_request[0] += 1
                prompt = [rng.randrange(0, VOCAB) for _ in range(rng.randint(1, 120))]
                body = {"prompt": prompt, "max_tokens": rng.randint(1, 100),
                        "temperature": rng.choice([0, 0.8]), "seed": i, "ignore_eos": True}
                kind = rng.random()
                local = random.Random(i)
            if i == 100:
                rss["early"] = rss_kib(server.proc.pid)
            if kind < 0.2:
                cut_stream(server.port, body, local)
                with rng_lock:
                    counts["cut"] += 1
            elif kind < 0.25:
                status, reply, _ = server.request("POST", "/v1/completions",
                                                  {**body, "max_tokens": -1})
                with rng_lock:
                    if status == 400 and "error" in reply:
                        counts["refused"] += 1
                    else:
                        counts["unexpected"].append((status, reply))
            else:
                status, reply, _ = server.request("POST", "/v1/completions", body)
                ok = status == 200 and len(reply["choices"][0]["tokens"]) == body["max_tokens"]
                with rng_lock:
                    if ok:
                        counts["ok"] += 1
                    else:
                        counts["unexpected"].append((status, reply))

    start = time.time()
    threads = [threading.Thread(target=client) for _ in range(CLIENTS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    # The last cut streams' requests are cancelled at the engine's next step.
    deadline = time.time() + 30
    while time.time() < deadline:
        m = server.metrics()
        if m["numesh_requests_running"] == 0 and m["numesh_kv_blocks_used"] == 0:
            break
        time.sleep(0.1)
    rss["late"] = rss_kib(server.proc.pid)
    code, _, err = server.stop()
    seconds = time.time() - start
    failures = []
    if counts["unexpected"]:
        failures.append(f"{len(counts['unexpected'])} unexpected answers, e.g. "
                        f"{counts['unexpected'][:2]}")
    if counts["ok"] + counts["cut"] + counts["refused"] != REQUESTS:
        failures.append(f"answers {counts} do not add up to {REQUESTS}")
    if m["numesh_requests_running"] != 0 or m["numesh_requests_waiting"] != 0 or \
            m["numesh_kv_blocks_used"] != 0:
        failures.append(f"after the soak something still runs or holds blocks: {m}")
    if rss["late"] > rss["early"] * 1.10:
        failures.append(f"resident memory grew from {rss['early']} to {rss['late']} KiB")
    if code != 0:
        failures.append(f"the server exited {code}: {err}")
    print(f"soak: {REQUESTS} requests in {seconds:.1f} s ({counts['ok']} whole, {counts['cut']} "
          f"cut mid-stream, {counts['refused']} refused); RSS {rss['early']} -> {rss['late']} KiB; "
          f"{int(m['numesh_generated_tokens_total'])} tokens generated")
    for f in failures:
        print("FAIL:", f)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
