#!/usr/bin/env python3
"""numesh serve, driven over HTTP as clients drive it (Python's standard library only).

Writes a tiny Llama (safetensors, written here, independent of numesh's writer) beside the
repository's tiny byte-level BPE tokenizer, starts `numesh serve --port 0` on it and checks:
every endpoint, streamed and whole (by hand and by the official OpenAI client, npm openai);
greedy completions equal `numesh generate`; the stream's
pieces add up to the whole response; stop strings; every bad-request class with its status and
OpenAI's error object; the API key; the queue limit's 503; a client that leaves mid-stream frees
its blocks; 8 concurrent requests give each the tokens it gets alone; SIGTERM drains and exits 0.

usage: server_check.py NUMESH WORK_DIR TOKENIZER_JSON
"""

import http.client
import json
import os
import re
import shutil
import signal
import socket
import struct
import subprocess
import sys
import threading
import time

import numpy as np

NUMESH, WORK, TOKENIZER = sys.argv[1], sys.argv[2], sys.argv[3]
FAILURES = []


def check(condition, what):
    if not condition:
        FAILURES.append(what)
        print("FAIL:", what, flush=True)


def tokenizer_vocab():
    """The ids the tokenizer uses: its model's and its added tokens'."""
    with open(TOKENIZER) as f:
        t = json.load(f)
    return 1 + max([*t["model"]["vocab"].values(), *(a["id"] for a in t.get("added_tokens", []))])


VOCAB = tokenizer_vocab()


def write_model(folder, vocab=VOCAB, hidden=64, layers=2, heads=2, kv_heads=1, ffn=128):
    """A random Llama in Hugging Face's layout, its safetensors file written by hand."""
    os.makedirs(folder, exist_ok=True)
    rng = np.random.default_rng(5)
    tensors = {"model.embed_tokens.weight": rng.normal(0, 1, (vocab, hidden)),
               "model.norm.weight": 1 + rng.normal(0, 0.1, hidden)}
    d = hidden // heads
    for l in range(layers):
        p = f"model.layers.{l}."
        tensors[p + "input_layernorm.weight"] = 1 + rng.normal(0, 0.1, hidden)
        tensors[p + "post_attention_layernorm.weight"] = 1 + rng.normal(0, 0.1, hidden)
        for name, shape in [("self_attn.q_proj", (hidden, hidden)),
                            ("self_attn.k_proj", (kv_heads * d, hidden)),
                            ("self_attn.v_proj", (kv_heads * d, hidden)),
                            ("self_attn.o_proj", (hidden, hidden)),
                            ("mlp.gate_proj", (ffn, hidden)), ("mlp.up_proj", (ffn, hidden)),
                            ("mlp.down_proj", (hidden, ffn))]:
            tensors[p + name + ".weight"] = rng.normal(0, 1 / np.sqrt(shape[1]), shape)
    header, blobs, offset = {}, [], 0
    for name, t in tensors.items():
        b = np.ascontiguousarray(t, dtype="<f4").tobytes()
        header[name] = {"dtype": "F32", "shape": list(t.shape), "data_offsets": [offset, offset + len(b)]}
        blobs.append(b)
        offset += len(b)
    h = json.dumps(header).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(os.path.join(folder, "model.safetensors"), "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))
    config = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "vocab_size": vocab,
              "hidden_size": hidden, "intermediate_size": ffn, "num_hidden_layers": layers,
              "num_attention_heads": heads, "num_key_value_heads": kv_heads,
              "max_position_embeddings": 512, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
              "tie_word_embeddings": True, "bos_token_id": vocab - 1, "eos_token_id": vocab - 1}
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump(config, f)
    shutil.copy(TOKENIZER, os.path.join(folder, "tokenizer.json"))


class Server:
    """`numesh serve` on a free port; stop() sends SIGTERM and returns the exit status."""

    def __init__(self, model, *args):
        self.proc = subprocess.Popen([NUMESH, "serve", "--model", model, "--port", "0", "--quiet",
                                      *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     text=True)
        line = self.proc.stdout.readline()
        m = re.search(r"listening on http://127\.0\.0\.1:(\d+)", line)
        if not m:
            raise RuntimeError(f"no address: {line!r} {self.proc.stderr.read()}")
        self.port = int(m.group(1))

    def request(self, method, path, body=None, headers=None, timeout=60):
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        data = body if isinstance(body, (bytes, str)) or body is None else json.dumps(body)
        c.request(method, path, body=data, headers=headers or {"Content-Type": "application/json"})
        r = c.getresponse()
        raw = r.read().decode()
        c.close()
        try:
            return r.status, json.loads(raw), r
        except json.JSONDecodeError:
            return r.status, raw, r

    def stream(self, body):
        """The events of a streamed completion: (list of JSON chunks, saw [DONE])."""
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)
        c.request("POST", "/v1/completions", body=json.dumps({**body, "stream": True}),
                  headers={"Content-Type": "application/json"})
        r = c.getresponse()
        check(r.getheader("Content-Type", "").startswith("text/event-stream"), "stream content type")
        chunks, done = [], False
        for line in r.read().decode().split("\n"):
            if line == "data: [DONE]":
                done = True
            elif line.startswith("data: "):
                chunks.append(json.loads(line[6:]))
        c.close()
        return chunks, done

    def metrics(self):
        _, text, _ = self.request("GET", "/metrics")
        return {k: float(v) for k, v in re.findall(r"^(numesh_\w+) (\S+)$", text, re.M)}

    def stop(self):
        self.proc.send_signal(signal.SIGTERM)
        out, err = self.proc.communicate(timeout=60)
        return self.proc.returncode, out, err


def error_object(status, body, want_status, param=None):
    check(status == want_status, f"status {status}, expected {want_status}: {body}")
    ok = isinstance(body, dict) and set(body.get("error", {})) == {"message", "type", "param", "code"}
    check(ok, f"OpenAI's error object: {body}")
    if ok and param is not None:
        check(body["error"]["param"] == param, f"param {body['error']['param']}, expected {param}")


def generate_ids(model, ids, n):
    out = os.path.join(WORK, "generate.json")
    subprocess.run([NUMESH, "generate", "--model", model, "--ids", ",".join(map(str, ids)),
                    "--max-new-tokens", str(n), "--ignore-eos", "--quiet", "--json", out],
                   check=True, capture_output=True)
    with open(out) as f:
        return json.load(f)["ids"]


def main():
    shutil.rmtree(WORK, ignore_errors=True)
    model = os.path.join(WORK, "model")
    write_model(model)
    server = Server(model, "--parallel", "4", "--ctx-size", "128", "--batch-tokens", "32",
                    "--max-queue", "16")
    s = server.request
    status, body, _ = s("GET", "/health")
    check(status == 200 and body == {"status": "ok"}, f"/health: {status} {body}")
    status, body, _ = s("GET", "/v1/models")
    check(status == 200 and body["data"][0]["id"] == "model", f"/v1/models: {body}")

    # Greedy completions equal numesh generate's ids; the stream adds up to the whole.
    for ids in ([1, 2, 3], [5, 9, 200, 7, 1, 1, 4, 30, 31, 32, 33, 34, 35, 36, 37, 38, 39, 40]):
        want = generate_ids(model, ids, 8)
        status, body, _ = s("POST", "/v1/completions",
                            {"prompt": ids, "max_tokens": 8, "temperature": 0, "ignore_eos": True})
        check(status == 200, f"completion: {status} {body}")
        choice = body["choices"][0]
        check(choice["tokens"] == want, f"tokens {choice['tokens']} != generate's {want}")
        check(choice["finish_reason"] == "length", f"finish_reason {choice['finish_reason']}")
        check(body["usage"] == {"prompt_tokens": len(ids), "completion_tokens": 8,
                                "total_tokens": len(ids) + 8}, f"usage {body['usage']}")
        chunks, done = server.stream({"prompt": ids, "max_tokens": 8, "temperature": 0,
                                      "ignore_eos": True})
        check(done, "the stream ends with data: [DONE]")
        streamed = [t for c in chunks for t in c["choices"][0]["tokens"]]
        check(streamed == want, f"streamed tokens {streamed} != {want}")
        check(chunks and chunks[-1]["choices"][0]["finish_reason"] == "length",
              "the last chunk says why it stopped")
        check("".join(c["choices"][0]["text"] for c in chunks) == choice["text"],
              "the stream's text adds up to the whole response's")

    # Text in and out, and stop strings.
    status, body, _ = s("POST", "/v1/completions",
                        {"prompt": "hello world", "max_tokens": 24, "temperature": 0,
                         "ignore_eos": True, "unknown_field": [1, 2]})
    check(status == 200, f"text completion (an unknown field ignored): {status} {body}")
    text = body["choices"][0]["text"]
    check(len(text) >= 4, f"the completion has text: {text!r}")
    if len(text) >= 4:
        stop = text[2:4]
        status, body, _ = s("POST", "/v1/completions",
                            {"prompt": "hello world", "max_tokens": 24, "temperature": 0,
                             "ignore_eos": True, "stop": [stop]})
        cut = body["choices"][0]
        check(cut["text"] == text[:text.index(stop)] and cut["finish_reason"] == "stop",
              f"stop {stop!r}: {cut['text']!r} ({cut['finish_reason']}), full text {text!r}")
        chunks, done = server.stream({"prompt": "hello world", "max_tokens": 24,
                                      "temperature": 0, "ignore_eos": True, "stop": stop})
        streamed = "".join(c["choices"][0]["text"] for c in chunks)
        check(done and streamed == text[:text.index(stop)], f"streamed stop: {streamed!r}")
    status, body, _ = s("POST", "/tokenize", {"content": "hello world"})
    check(status == 200 and body["tokens"], f"/tokenize: {status} {body}")
    status, back, _ = s("POST", "/detokenize", {"tokens": body["tokens"]})
    check(status == 200 and back["content"] == "hello world", f"/detokenize: {back}")

    # Seeded sampling: the same seed, the same tokens.
    req = {"prompt": [4, 5, 6], "max_tokens": 12, "temperature": 0.9, "top_p": 0.9, "seed": 11,
           "ignore_eos": True}
    a = s("POST", "/v1/completions", req)[1]["choices"][0]["tokens"]
    b = s("POST", "/v1/completions", req)[1]["choices"][0]["tokens"]
    check(a == b, f"seed 11 twice: {a} != {b}")

    # Batch invariance over HTTP: 8 requests at once give what each gives alone.
    requests = [{"prompt": [1 + i, 2 + 3 * i, 7] * (1 + i % 3), "max_tokens": 10 + i,
                 "ignore_eos": True,
                 **({"temperature": 0} if i % 2 == 0 else {"temperature": 0.8, "seed": 100 + i})}
                for i in range(8)]
    alone = [s("POST", "/v1/completions", r)[1]["choices"][0]["tokens"] for r in requests]
    together = [None] * len(requests)

    def run(i):
        together[i] = s("POST", "/v1/completions", requests[i])[1]["choices"][0]["tokens"]

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(requests))]
    for t in threads:
        t.start()
        time.sleep(0.01)
    for t in threads:
        t.join()
    check(together == alone, f"8 concurrent requests differ from alone: {together} vs {alone}")

    # Every bad request: its status and OpenAI's error object; nothing else changes.
    bad = [("not JSON", "{", None), ("no prompt", {"max_tokens": 3}, "prompt"),
           ("prompt of a wrong type", {"prompt": 7}, "prompt"),
           ("an id outside the vocabulary", {"prompt": [1, VOCAB]}, "prompt"),
           ("a list of prompts", {"prompt": ["a", "b"]}, "prompt"),
           ("max_tokens negative", {"prompt": [1], "max_tokens": -1}, "max_tokens"),
           ("max_tokens a string", {"prompt": [1], "max_tokens": "3"}, "max_tokens"),
           ("max_tokens past the context", {"prompt": [1], "max_tokens": 500}, None),
           ("temperature out of range", {"prompt": [1], "temperature": 7}, "temperature"),
           ("n of 2", {"prompt": [1], "n": 2}, "n"),
           ("stream not a boolean", {"prompt": [1], "stream": "yes"}, "stream"),
           ("stop of a wrong type", {"prompt": [1], "stop": 3}, "stop"),
           ("logprobs", {"prompt": [1], "logprobs": 2}, "logprobs")]
    for what, body_in, param in bad:
        status, body, _ = s("POST", "/v1/completions", body_in)
        error_object(status, body, 400, param)
        if status != 400:
            print("  (the request was:", what, ")")
    status, body, _ = s("POST", "/v1/completions", b"x" * (2 << 20))
    error_object(status, body, 413)
    status, body, _ = s("GET", "/v1/nothing")
    error_object(status, body, 404)
    status, body, _ = s("POST", "/v1/chat/completions", {"messages": []})
    error_object(status, body, 501)
    m = server.metrics()
    check(m.get("numesh_requests_running") == 0 and m.get("numesh_kv_blocks_used") == 0,
          f"after the requests nothing runs and no block is held: {m}")
    check(m.get("numesh_generated_tokens_total", 0) > 0, "the metrics count tokens")

    # The official OpenAI client (npm openai, pinned by openai_client/package-lock.json).
    client_dir = os.path.join(os.path.dirname(os.path.abspath(__file__)), "openai_client")
    if not os.path.isdir(os.path.join(client_dir, "node_modules", "openai")):
        check(False, f"the OpenAI client is not installed: run `npm ci` in {client_dir}")
    else:
        run = subprocess.run(["node", os.path.join(client_dir, "check.mjs"),
                              f"http://127.0.0.1:{server.port}"], capture_output=True, text=True,
                             timeout=120)
        print(run.stdout, end="")
        check(run.returncode == 0, f"the OpenAI client's checks: {run.stdout} {run.stderr}")

    # A client that leaves mid-stream: its request is cancelled and its blocks freed.
    c = socket.create_connection(("127.0.0.1", server.port))
    body = json.dumps({"prompt": [1, 2, 3], "max_tokens": 100, "ignore_eos": True,
                       "stream": True}).encode()
    c.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
              + f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
    c.recv(256)  # the first bytes of the stream
    c.close()
    deadline = time.time() + 30
    while time.time() < deadline:
        m = server.metrics()
        if m.get("numesh_requests_running") == 0 and m.get("numesh_kv_blocks_used") == 0:
            break
        time.sleep(0.1)
    check(m.get("numesh_requests_running") == 0 and m.get("numesh_kv_blocks_used") == 0,
          f"a client gone mid-stream frees its sequence: {m}")
    check(m.get("numesh_generated_tokens_total", 0) < 10**6, "metrics stay sane")

    # SIGTERM drains: a stream in flight ends with [DONE], the process exits 0.
    result = {}

    def long_stream():
        result["stream"] = server.stream({"prompt": [1, 2], "max_tokens": 60, "ignore_eos": True})

    t = threading.Thread(target=long_stream)
    t.start()
    time.sleep(0.3)
    code, out, err = server.stop()
    t.join()
    chunks, done = result["stream"]
    check(done and sum(len(c["choices"][0]["tokens"]) for c in chunks) == 60,
          "the stream in flight at SIGTERM ran to its end")
    check(code == 0 and "stopped on signal 15" in out, f"exit {code}: {out} {err}")

    # The API key: 401 without it (an error object), /health open, 200 with it.
    keyed = Server(model, "--api-key", "s3cret", "--parallel", "1")
    status, body, _ = keyed.request("POST", "/v1/completions", {"prompt": [1], "max_tokens": 1})
    error_object(status, body, 401)
    status, body, _ = keyed.request("POST", "/v1/completions", {"prompt": [1], "max_tokens": 1},
                                    {"Authorization": "Bearer wrong"})
    error_object(status, body, 401)
    check(keyed.request("GET", "/health", headers={})[0] == 200, "/health needs no key")
    status, body, _ = keyed.request("POST", "/v1/completions", {"prompt": [1], "max_tokens": 1},
                                    {"Authorization": "Bearer s3cret",
                                     "Content-Type": "application/json"})
    check(status == 200, f"with the key: {status} {body}")
    keyed.stop()

    # The queue limit: one running, one waiting, the third gets 503 with Retry-After (a larger
    # model, so that the first request still runs when the third comes).
    larger = os.path.join(WORK, "larger")
    write_model(larger, hidden=256, layers=4, heads=4, kv_heads=2, ffn=512)
    small = Server(larger, "--parallel", "1", "--max-queue", "1", "--batch-tokens", "1")
    statuses, retry = [], []

    def long_request():
        status, _, r = small.request("POST", "/v1/completions",
                                     {"prompt": [1, 2, 3], "max_tokens": 500, "ignore_eos": True})
        statuses.append(status)
        retry.append(r.getheader("Retry-After"))

    threads = [threading.Thread(target=long_request) for _ in range(3)]
    for t in threads:
        t.start()
        time.sleep(0.05)
    for t in threads:
        t.join()
    check(sorted(statuses) == [200, 200, 503], f"statuses {statuses}")
    check("1" in retry, f"Retry-After on the 503: {retry}")
    small.stop()

    if FAILURES:
        print(f"{len(FAILURES)} checks failed")
        return 1
    print("numesh serve: every check passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
