#!/usr/bin/env python3
"""numesh serve under mpirun: rank 0 answers HTTP and the other ranks follow its engine's steps.

On a tiny Llama (written by server_check.write_model), `mpirun -np RANKS numesh serve` over a mesh
that spans the ranks is checked against `numesh serve` in one process on the same mesh shape:
greedy, sampled (seeded) and log-probability completions, sent one at a time and then all at
once, give the same tokens and log-probabilities; a streamed completion adds up to the whole;
/health and /metrics answer; a client that leaves mid-stream frees its blocks on every rank (the
next requests still agree); SIGTERM to mpirun drains rank 0 and every other rank ends with it;
a follower that hangs mid-request (SIGSTOP) is named within NUMESH_RANK_TIMEOUT and ends the job.

usage: serve_ranks_check.py NUMESH WORK_DIR TOKENIZER_JSON MPIRUN RANKS DIMS
  (DIMS: the mesh's dp,ep,tp dims, e.g. 1,1,2; each rank is one device)
"""

import http.client
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time

import server_check as sc

MPIRUN, RANKS, DIMS = sys.argv[4], int(sys.argv[5]), sys.argv[6]
ONE_CORE = "numa:1 core:1 pu:1"
# The hung follower's request and its model's context: long enough to be in flight when the
# follower stops, whatever the build's speed.
LONG_REQUEST, LONG_CONTEXT = 8000, 8192


def completion(server, body):
    status, reply, _ = server.request("POST", "/v1/completions", body)
    sc.check(status == 200, f"status {status}: {reply}")
    if status != 200:
        return None
    choice = reply["choices"][0]
    return {"text": choice["text"], "tokens": choice["tokens"], "logprobs": choice.get("logprobs"),
            "finish_reason": choice["finish_reason"]}


def requests():
    r = []
    for i in range(6):
        body = {"prompt": [3 + i, 7, 9 * i, 11], "max_tokens": 6 + i, "ignore_eos": True}
        if i % 2 == 1:
            body.update({"temperature": 0.8, "top_k": 16, "seed": 100 + i})
        else:
            body["temperature"] = 0
        if i == 2:
            body["logprobs"] = 2
        r.append(body)
    return r


def answers(server):
    """Each request alone, then all at once: both lists."""
    alone = [completion(server, b) for b in requests()]
    together = [None] * len(alone)

    def run(i):
        together[i] = completion(server, requests()[i])

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(alone))]
    for t in threads:
        t.start()
        time.sleep(0.01)
    for t in threads:
        t.join()
    return alone, together


def leave_mid_stream(server):
    """A streamed completion of 500 tokens whose client reads its first event and leaves."""
    c = http.client.HTTPConnection("127.0.0.1", server.port, timeout=60)
    c.request("POST", "/v1/completions",
              body=json.dumps({"prompt": [1, 2, 3], "max_tokens": 500, "ignore_eos": True,
                               "stream": True}),
              headers={"Content-Type": "application/json"})
    r = c.getresponse()
    sc.check(r.status == 200, f"the stream's status {r.status}")
    r.readline()
    c.close()


def rank_pid(launcher_pid, rank):
    """The pid of mpirun's child whose rank is `rank` (read from /proc), or None."""
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                parent = int(f.read().rsplit(")", 1)[1].split()[1])
            with open(f"/proc/{entry}/environ", "rb") as f:
                env = f.read().split(b"\0")
        except OSError:
            continue
        if parent == launcher_pid and f"OMPI_COMM_WORLD_RANK={rank}".encode() in env:
            return int(entry)
    return None


def check_hung_follower(model, mesh, launcher):
    """A follower that hangs (SIGSTOP) mid-request: rank 0's step gives up after
    NUMESH_RANK_TIMEOUT (2 s) naming it, the server stops and every rank ends. The model has
    room for a request of LONG_REQUEST tokens, which runs for seconds even in a Release build
    (one of 500 could end before the signal)."""
    os.environ["NUMESH_RANK_TIMEOUT"] = "2"
    try:
        server = sc.Server(model, "--synthetic", ONE_CORE, *mesh, "--ctx-size", str(LONG_CONTEXT),
                           launcher=launcher)
    finally:
        del os.environ["NUMESH_RANK_TIMEOUT"]
    victim = rank_pid(server.proc.pid, 1)
    sc.check(victim is not None, "rank 1's process")
    if victim is None:
        server.stop()
        return
    result = []
    thread = threading.Thread(target=lambda: result.append(server.request(
        "POST", "/v1/completions",
        {"prompt": [1, 2, 3], "max_tokens": LONG_REQUEST, "ignore_eos": True}, timeout=60)))
    thread.start()
    deadline = time.time() + 30
    while time.time() < deadline and server.metrics().get("numesh_requests_running", 0) != 1:
        time.sleep(0.01)
    sc.check(server.metrics().get("numesh_requests_running") == 1, "the long request runs")
    os.kill(victim, signal.SIGSTOP)
    try:
        out, err = server.proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        os.kill(victim, signal.SIGKILL)
        server.proc.kill()
        out, err = server.proc.communicate()
        sc.check(False, f"the server was still running 60 s after rank 1 hung: {err!r}")
    thread.join()
    sc.check(server.proc.returncode != 0, f"mpirun exits {server.proc.returncode}")
    print("rank 0's error:", next((l for l in err.splitlines() if "most likely hung" in l), None))
    sc.check(re.search(r"nothing from rank 1 for 2 s; it has most likely hung", err) is not None,
             f"the error names the rank that hangs: {err!r}")
    status = result[0][0] if result and isinstance(result[0], tuple) else None
    sc.check(status != 200 or "error" in json.dumps(result[0][1]),
             f"the request in flight did not complete normally: {result}")


def main():
    model = os.path.join(sc.WORK, "model")
    sc.write_model(model, heads=2, kv_heads=2)
    mesh = ["--dims", DIMS]

    one = sc.Server(model, "--synthetic", f"numa:{RANKS} core:1 pu:1", *mesh)
    want_alone, want_together = answers(one)
    code, _, err = one.stop()
    sc.check(code == 0, f"one process exits {code}: {err}")
    sc.check(want_alone == want_together, "one process: together differs from alone")

    launcher = [MPIRUN, "-np", str(RANKS), "--oversubscribe", "--bind-to", "none"]
    ranks = sc.Server(model, "--synthetic", ONE_CORE, *mesh, launcher=launcher)
    sc.check(f"over {RANKS} ranks;" in ranks.banner, f"the banner names the ranks: {ranks.banner!r}")
    status, health, _ = ranks.request("GET", "/health")
    sc.check(status == 200, f"/health {status}: {health}")
    alone, together = answers(ranks)
    sc.check(alone == want_alone, f"{RANKS} ranks, one at a time: {alone} != one process's {want_alone}")
    sc.check(together == want_together,
             f"{RANKS} ranks, all at once: {together} != one process's {want_together}")

    chunks, done = ranks.stream({"prompt": [3, 7, 0, 11], "max_tokens": 6, "temperature": 0,
                                 "ignore_eos": True})
    sc.check(done, "the stream ends with [DONE]")
    streamed = "".join(c["choices"][0]["text"] for c in chunks)
    sc.check(streamed == want_alone[0]["text"], f"streamed {streamed!r} != {want_alone[0]['text']!r}")

    # The client that leaves cuts its request short on every rank (rank 0 sends the
    # cancellation): its blocks come back, fewer than its 500 tokens were made, and the
    # requests after it still agree with one process.
    before = ranks.metrics().get("numesh_generated_tokens_total", -1)
    leave_mid_stream(ranks)

    # The counts are taken after each step, a moment after its tokens are streamed: until the
    # request's first token is counted they still show the idle server (no block used).
    def settled(m):
        return (m.get("numesh_generated_tokens_total", -1) > before
                and m.get("numesh_kv_blocks_used", 1) == 0)

    deadline = time.time() + 30
    while time.time() < deadline and not settled(ranks.metrics()):
        time.sleep(0.1)
    metrics = ranks.metrics()
    sc.check(metrics.get("numesh_kv_blocks_used") == 0, f"blocks used after the client left: {metrics}")
    made = metrics.get("numesh_generated_tokens_total", -1) - before
    sc.check(before >= 0 and 0 <= made < 500,
             f"the request that lost its client made {made} tokens of 500 ({before} before)")
    again = completion(ranks, requests()[1])
    sc.check(again == want_alone[1], f"after a client left: {again} != {want_alone[1]}")

    # mpirun hands SIGTERM to every rank; rank 0 drains and tells the others to end. Open MPI's
    # mpirun exits 1 after a SIGTERM whatever its ranks did: each rank's own line says it ended
    # by itself, not killed.
    code, out, err = ranks.stop()
    sc.check(code in (0, 1), f"mpirun exits {code} after SIGTERM: {out} {err}")
    sc.check("numesh serve: stopped on signal 15" in out, f"rank 0 says it stopped: {out!r}")
    for r in range(1, RANKS):
        sc.check(f"numesh serve: rank {r}: stopped with rank 0" in err,
                 f"rank {r} says it stopped with rank 0: {err!r}")
    sc.check("exited on signal" not in err and "aborted" not in err, f"no rank was killed: {err!r}")

    long_model = os.path.join(sc.WORK, "long-model")
    sc.write_model(long_model, heads=2, kv_heads=2, positions=LONG_CONTEXT)
    check_hung_follower(long_model, mesh, launcher)

    if sc.FAILURES:
        print(f"{len(sc.FAILURES)} checks failed")
        return 1
    print(f"numesh serve on {RANKS} ranks: every check passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
