#!/usr/bin/env python3
"""numesh serve, driven over HTTP as clients drive it (Python's standard library, NumPy, and
python3-jinja2 for the chat templates).

Writes a tiny Llama (safetensors, written here, independent of numesh's writer) beside the
repository's tiny byte-level BPE tokenizer and a chat template (tokenizer_config.json), starts
`numesh serve --port 0` on it and checks: every endpoint, streamed and whole (by hand and by the
official OpenAI client, npm openai); greedy completions equal `numesh generate`; the stream's
pieces add up to the whole response; stop strings; chat completions equal completions of the
prompt Python's jinja2 renders, as transformers does; --chat-template; every bad-request class
with its status and OpenAI's error object; the API key; the queue limit's 503; a client that
leaves mid-stream frees its blocks; 8 concurrent requests give each the tokens it gets alone;
SIGTERM drains and exits 0.

usage: server_check.py NUMESH WORK_DIR TOKENIZER_JSON
"""

import http.client
import json
import math
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
BOS = "<|begin_of_text|>"  # the tiny tokenizer's one special token, id VOCAB - 1

# A ChatML-like chat template: a loop, trim, content parts, tool calls' arguments and tools
# written with tojson (their keys in the order sent), raise_exception, add_generation_prompt and
# a keyword a request gives through chat_template_kwargs (enable_thinking, as Qwen3's).
CHAT_TEMPLATE = r"""{{ bos_token }}
{%- if tools %}
{{- '<|im_start|>system\n' }}
{%- for tool in tools %}{{ tool | tojson }}{% endfor %}
{{- '<|im_end|>\n' }}
{%- endif %}
{%- for message in messages %}
{%- if message['role'] == 'system' and not loop.first %}
{{- raise_exception('a system message must come first') }}
{%- endif %}
{{- '<|im_start|>' + message['role'] + '\n' }}
{%- if message['content'] is string %}
{{- message['content'] | trim }}
{%- elif message['content'] is not none %}
{%- for part in message['content'] %}{{ part['text'] }}{% endfor %}
{%- endif %}
{%- if message['tool_calls'] is defined %}
{%- for call in message['tool_calls'] %}
{{- '<call>' + call['function']['name'] + (call['function']['arguments'] | tojson) }}
{%- endfor %}
{%- endif %}
{{- '<|im_end|>\n' }}
{%- endfor %}
{%- if add_generation_prompt %}
{{- '<|im_start|>assistant\n' }}
{%- if enable_thinking is defined and enable_thinking is false %}
{{- '<think></think>' }}
{%- endif %}
{%- endif %}"""
RAISE_LINE = 1 + CHAT_TEMPLATE.split("\n").index(
    "{{- raise_exception('a system message must come first') }}")
# --chat-template's: another shape (Llama 2's), so that the override shows in the prompt.
OVERRIDE_TEMPLATE = r"""{{ bos_token }}
{%- for message in messages %}
{%- if message['role'] == 'user' %}
{{- '[INST] ' + message['content'] + ' [/INST]' }}
{%- else %}
{{- ' ' + message['content'] + ' ' }}
{%- endif %}
{%- endfor %}"""


def render_chat(template, messages, tools=None, add_generation_prompt=True, **kwargs):
    """`template` rendered by Python's jinja2 as transformers' apply_chat_template does: a
    sandbox with trim_blocks and lstrip_blocks, loop controls, its tojson (json.dumps, keys in
    their order, no ASCII escapes) and raise_exception; the special tokens beneath."""
    import jinja2.ext
    import jinja2.sandbox

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                          sort_keys=sort_keys)

    env = jinja2.sandbox.ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                                       extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    return env.from_string(template).render(bos_token=BOS, eos_token=BOS, messages=messages,
                                            tools=tools,
                                            add_generation_prompt=add_generation_prompt, **kwargs)


def write_model(folder, vocab=VOCAB, hidden=64, layers=2, heads=2, kv_heads=1, ffn=128,
                chat_template=None, positions=512):
    """A random Llama in Hugging Face's layout, its safetensors file written by hand; with
    `chat_template`, a tokenizer_config.json holding it and the special tokens."""
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
              "max_position_embeddings": positions, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
              "tie_word_embeddings": True, "bos_token_id": vocab - 1, "eos_token_id": vocab - 1}
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump(config, f)
    shutil.copy(TOKENIZER, os.path.join(folder, "tokenizer.json"))
    if chat_template is not None:
        with open(os.path.join(folder, "tokenizer_config.json"), "w") as f:
            json.dump({"bos_token": BOS, "eos_token": BOS, "chat_template": chat_template}, f)


class Server:
    """`numesh serve` on a free port (started by `launcher`, e.g. mpirun and its options, when
    given); stop() sends SIGTERM and returns the exit status."""

    def __init__(self, model, *args, launcher=()):
        self.proc = subprocess.Popen([*launcher, NUMESH, "serve", "--model", model, "--port", "0",
                                      "--quiet", *args], stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True)
        line = self.proc.stdout.readline()
        self.banner = line
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

    def stream(self, body, path="/v1/completions"):
        """The events of a streamed completion: (list of JSON chunks, saw [DONE])."""
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)
        c.request("POST", path, body=json.dumps({**body, "stream": True}),
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


def same_as_completion(server, request, template=CHAT_TEMPLATE, messages=None):
    """A greedy chat completion of `request` equals the completion of the prompt jinja2 renders
    from it (from `messages` when given: the request's with tool calls' arguments as objects),
    encoded without special tokens (the template writes BOS, as transformers'
    apply_chat_template with tokenize=True). Returns the chat's response (None on failure)."""
    s = server.request
    text = render_chat(template, messages or request["messages"], request.get("tools"),
                       request.get("add_generation_prompt", True),
                       **request.get("chat_template_kwargs", {}))
    ids = s("POST", "/tokenize", {"content": text, "add_special": False})[1]["tokens"]
    check(ids[0] == VOCAB - 1 and ids.count(VOCAB - 1) == 1, f"BOS once, first: {ids[:4]}")
    limits = {"max_tokens": 8, "temperature": 0, "ignore_eos": True}
    status, chat, _ = s("POST", "/v1/chat/completions", {**request, **limits})
    check(status == 200, f"chat completion: {status} {chat}")
    if status != 200:
        return None
    plain = s("POST", "/v1/completions", {"prompt": ids, **limits})[1]
    check(chat["usage"]["prompt_tokens"] == len(ids),
          f"the chat's prompt is jinja2's {text!r} ({len(ids)} ids): {chat['usage']}")
    check(chat["choices"][0]["message"]["content"] == plain["choices"][0]["text"],
          f"the chat's text {chat['choices'][0]['message']['content']!r} is the completion's "
          f"{plain['choices'][0]['text']!r}")
    return chat


def check_chat(server):
    """Chat completions of the folder's template, whole and streamed, equal completions of the
    prompts jinja2 renders; the stream adds up; max_tokens defaults to the rest of the context."""
    conversation = [{"role": "system", "content": "  Be brief. "},
                    {"role": "user", "content": [{"type": "text", "text": "hello "},
                                                 {"type": "text", "text": "world"}]},
                    {"role": "assistant", "content": "hi"},
                    {"role": "user", "content": "the end"}]
    chat = same_as_completion(server, {"messages": conversation})
    if chat is not None:
        choice = chat["choices"][0]
        check(chat["object"] == "chat.completion" and chat["id"].startswith("chatcmpl-"),
              f"a chat completion's object and id: {chat['object']} {chat['id']}")
        check(choice["message"]["role"] == "assistant" and choice["finish_reason"] == "length",
              f"the chat's choice: {choice}")
        check(chat["usage"]["completion_tokens"] == 8, f"the chat's usage: {chat['usage']}")
    same_as_completion(server, {"messages": conversation[1:2], "add_generation_prompt": False})
    # Tools and a tool call (its arguments sent as a JSON string reach the template as the
    # object, keys in their order), and a keyword of the template.
    arguments = {"y": 1, "x": [2, "é"]}
    call = {"id": "c1", "type": "function",
            "function": {"name": "f", "arguments": json.dumps(arguments)}}
    sent = [{"role": "user", "content": "use f"},
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "c1", "content": "3"}]
    rendered = [*sent[:1], {**sent[1], "tool_calls": [{**call, "function": {
        "name": "f", "arguments": arguments}}]}, *sent[2:]]
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"y": 1, "b": 2}}}]
    same_as_completion(server, {"messages": sent, "tools": tools,
                                "chat_template_kwargs": {"enable_thinking": False}},
                       messages=rendered)

    request = {"messages": conversation, "max_tokens": 8, "temperature": 0, "ignore_eos": True}
    chunks, done = server.stream(request, "/v1/chat/completions")
    check(done and len(chunks) >= 2, f"the chat stream ends with [DONE]: {len(chunks)} chunks")
    if chunks:
        check(all(c["object"] == "chat.completion.chunk" and c["id"] == chunks[0]["id"]
                  for c in chunks), "every chunk is a chat.completion.chunk of one id")
        check(chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""},
              f"the first chunk gives the role: {chunks[0]}")
        last = chunks[-1]
        check(last["choices"][0]["delta"] == {} and last["choices"][0]["finish_reason"] == "length"
              and last["usage"]["completion_tokens"] == 8, f"the last chunk: {last}")
        streamed = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks)
        check(chat is not None and streamed == chat["choices"][0]["message"]["content"],
              f"the chat stream adds up: {streamed!r}")
    # Without max_tokens a chat may take the rest of the context (512 positions: a prompt of p
    # tokens and n new ones take p + n - 1).
    status, body, _ = server.request("POST", "/v1/chat/completions",
                                     {"messages": conversation[3:], "temperature": 0,
                                      "ignore_eos": True})
    usage = body.get("usage", {}) if status == 200 else {}
    check(usage.get("prompt_tokens", 0) + usage.get("completion_tokens", 0) == 513,
          f"max_tokens defaults to the rest of the context: {status} {usage}")


def check_logprobs(server):
    """Log-probabilities: a completion's (tokens, token_logprobs, top_logprobs with the chosen
    one, text_offset) and a chat's (content entries with their top alternatives), whole and
    streamed alike; each a log-probability (<= 0, the alternatives' mass at most 1), greedy's
    choice the most likely. That they are the model's log-softmax is EngineTest's proof."""
    s = server.request
    req = {"prompt": "hello world", "max_tokens": 6, "temperature": 0, "ignore_eos": True,
           "logprobs": 3}
    status, body, _ = s("POST", "/v1/completions", req)
    check(status == 200, f"a completion with logprobs: {status} {body}")
    lp = body["choices"][0]["logprobs"] if status == 200 else None
    if lp:
        n = body["usage"]["completion_tokens"]
        check(len(lp["tokens"]) == n and len(lp["token_logprobs"]) == n and
              len(lp["top_logprobs"]) == n and len(lp["text_offset"]) == n,
              f"one entry per token: {lp}")
        for token, value, top in zip(lp["tokens"], lp["token_logprobs"], lp["top_logprobs"]):
            check(value <= 0 and top.get(token) == value and len(top) <= 4,
                  f"a token's log-probability and its alternatives: {token!r} {value} {top}")
            check(value == max(top.values()), f"greedy picks the most likely: {value} {top}")
            check(sum(math.exp(v) for v in top.values()) <= 1 + 1e-6, f"at most all mass: {top}")
        check(lp["text_offset"][0] == 0 and lp["text_offset"] == sorted(lp["text_offset"]),
              f"text offsets: {lp['text_offset']}")
        chunks, done = server.stream(req)
        streamed = {k: [x for c in chunks if c["choices"][0]["logprobs"]
                        for x in c["choices"][0]["logprobs"][k]] for k in lp}
        check(done and streamed == lp, f"the stream's logprobs add up: {streamed} != {lp}")
    # Without asking: none.
    status, body, _ = s("POST", "/v1/completions", {**req, "logprobs": None})
    check(status == 200 and body["choices"][0]["logprobs"] is None, f"no logprobs: {body}")

    chat = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 5, "temperature": 0,
            "ignore_eos": True, "logprobs": True, "top_logprobs": 2}
    status, body, _ = s("POST", "/v1/chat/completions", chat)
    check(status == 200, f"a chat with logprobs: {status} {body}")
    content = body["choices"][0]["logprobs"]["content"] if status == 200 else []
    check(len(content) == 5, f"a chat's logprobs, one per token: {content}")
    for entry in content:
        top = entry["top_logprobs"]
        check(len(top) == 2 and top[0]["logprob"] >= top[1]["logprob"] and
              entry["logprob"] == top[0]["logprob"] and entry["token"] == top[0]["token"] and
              entry["bytes"] == list(entry["token"].encode()),
              f"a chat token's entry: {entry}")
    chunks, done = server.stream(chat, "/v1/chat/completions")
    streamed = [e for c in chunks if c["choices"][0].get("logprobs")
                for e in c["choices"][0]["logprobs"]["content"]]
    check(done and streamed == content, f"the chat stream's logprobs add up: {streamed}")

    for bad, param in (({**req, "logprobs": 21}, "logprobs"),
                       ({**req, "logprobs": "3"}, "logprobs"),
                       ({**chat, "logprobs": False}, "top_logprobs"),
                       ({**chat, "top_logprobs": -1}, "top_logprobs")):
        path = "/v1/chat/completions" if "messages" in bad else "/v1/completions"
        status, body, _ = s("POST", path, bad)
        error_object(status, body, 400, param)


def check_bad_chats(server):
    """Every bad chat request: 400 and OpenAI's error object naming the field; a template's own
    raise_exception names its line."""
    ok = [{"role": "user", "content": "hi"}]
    bad = [("no messages", {"max_tokens": 3}, "messages"),
           ("empty messages", {"messages": []}, "messages"),
           ("messages not a list", {"messages": "hi"}, "messages"),
           ("a message not an object", {"messages": ["hi"]}, "messages[0]"),
           ("a message without role", {"messages": [{"content": "hi"}]}, "messages[0].role"),
           ("a message without content", {"messages": [*ok, {"role": "user"}]},
            "messages[1].content"),
           ("content a number", {"messages": [{"role": "user", "content": 5}]},
            "messages[0].content"),
           ("a user's content null", {"messages": [{"role": "user", "content": None}]},
            "messages[0].content"),
           ("an image part", {"messages": [{"role": "user", "content": [
               {"type": "image_url", "image_url": {"url": "data:,"}}]}]}, "messages[0].content"),
           ("tools not a list", {"messages": ok, "tools": {"type": "function"}}, "tools"),
           ("chat_template_kwargs not an object", {"messages": ok, "chat_template_kwargs": [1]},
            "chat_template_kwargs"),
           ("add_generation_prompt not a boolean",
            {"messages": ok, "add_generation_prompt": "yes"}, "add_generation_prompt"),
           ("max_completion_tokens a string", {"messages": ok, "max_completion_tokens": "3"},
            "max_completion_tokens"),
           ("max_tokens negative", {"messages": ok, "max_tokens": -1}, "max_tokens"),
           ("temperature out of range", {"messages": ok, "temperature": 7}, "temperature"),
           ("n of 2", {"messages": ok, "n": 2}, "n"),
           ("stop of a wrong type", {"messages": ok, "stop": 3}, "stop"),
           ("logprobs not a boolean", {"messages": ok, "logprobs": "yes"}, "logprobs"),
           ("top_logprobs past 20", {"messages": ok, "logprobs": True, "top_logprobs": 21},
            "top_logprobs"),
           ("a body nested too deep", {"messages": ok, "x": json.loads("[" * 70 + "]" * 70)},
            None),
           ("a prompt past the context", {"messages": [{"role": "user", "content": "x " * 600}]},
            None)]
    for what, body_in, param in bad:
        status, body, _ = server.request("POST", "/v1/chat/completions", body_in)
        error_object(status, body, 400, param)
        if status != 400:
            print("  (the chat request was:", what, ")")
    status, body, _ = server.request("POST", "/v1/chat/completions",
                                     {"messages": ok, "logprobs": False, "max_tokens": 1})
    check(status == 200, f"logprobs false asks for none: {status} {body}")
    status, body, _ = server.request("POST", "/v1/chat/completions",
                                     {"messages": [*ok, {"role": "system", "content": "late"}]})
    error_object(status, body, 400)
    message = body["error"]["message"] if isinstance(body, dict) and "error" in body else ""
    check("a system message must come first" in message and
          re.search(rf"\b{RAISE_LINE}\b", message) is not None,
          f"the template's raise_exception, naming its line {RAISE_LINE}: {message!r}")


def check_chat_template_option(model):
    """--chat-template FILE takes the place of the folder's template."""
    path = os.path.join(WORK, "override.jinja")
    with open(path, "w") as f:
        f.write(OVERRIDE_TEMPLATE)
    messages = [{"role": "user", "content": "hello"}, {"role": "assistant", "content": "hi"},
                {"role": "user", "content": "bye"}]
    check(render_chat(OVERRIDE_TEMPLATE, messages) != render_chat(CHAT_TEMPLATE, messages),
          "the two templates render differently")
    server = Server(model, "--parallel", "1", "--chat-template", path)
    check(path in server.banner, f"the listening line names the template: {server.banner!r}")
    same_as_completion(server, {"messages": messages}, template=OVERRIDE_TEMPLATE)
    server.stop()


def check_template_errors():
    """A folder whose template does not parse: a warning at start, chats refused with its
    error, completions served. Without a template, chats are refused saying how to give one."""
    folder = os.path.join(WORK, "broken")
    write_model(folder, chat_template="{{ bos_token }}\n{% frobnicate %}\n")
    server = Server(folder, "--parallel", "1")
    chat = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    status, body, _ = server.request("POST", "/v1/chat/completions", chat)
    error_object(status, body, 400)
    message = body["error"]["message"] if isinstance(body, dict) and "error" in body else ""
    check("cannot be used" in message and "--chat-template" in message,
          f"a template that did not parse: {message!r}")
    status, body, _ = server.request("POST", "/v1/completions", {"prompt": [1], "max_tokens": 2})
    check(status == 200, f"completions without a usable template: {status} {body}")
    code, _, err = server.stop()
    check(code == 0 and "numesh: warning: the model's chat template cannot be used" in err,
          f"the warning at start: {err!r}")
    plain = os.path.join(WORK, "plain")
    write_model(plain)
    # --mmap on: the f32 file's matrices are read in place, and the listening line says so.
    server = Server(plain, "--parallel", "1", "--mmap", "on")
    check(re.search(r"f32 weights \([0-9.]+ MB read in place from the file, --mmap\), mesh",
                    server.banner) is not None,
          f"the listening line names the bytes read in place: {server.banner!r}")
    status, body, _ = server.request("POST", "/v1/chat/completions", chat)
    error_object(status, body, 400)
    message = body["error"]["message"] if isinstance(body, dict) and "error" in body else ""
    check("no chat template" in message and "--chat-template FILE" in message,
          f"a model without a template: {message!r}")
    server.stop()


def main():
    shutil.rmtree(WORK, ignore_errors=True)
    model = os.path.join(WORK, "model")
    write_model(model, chat_template=CHAT_TEMPLATE)
    server = Server(model, "--parallel", "4", "--ctx-size", "512", "--batch-tokens", "32",
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
           ("max_tokens past the context", {"prompt": [1], "max_tokens": 1000}, None),
           ("temperature out of range", {"prompt": [1], "temperature": 7}, "temperature"),
           ("n of 2", {"prompt": [1], "n": 2}, "n"),
           ("stream not a boolean", {"prompt": [1], "stream": "yes"}, "stream"),
           ("stop of a wrong type", {"prompt": [1], "stop": 3}, "stop"),
           ("logprobs past 20", {"prompt": [1], "logprobs": 21}, "logprobs")]
    for what, body_in, param in bad:
        status, body, _ = s("POST", "/v1/completions", body_in)
        error_object(status, body, 400, param)
        if status != 400:
            print("  (the request was:", what, ")")
    status, body, _ = s("POST", "/v1/completions", b"x" * (2 << 20))
    error_object(status, body, 413)
    status, body, _ = s("GET", "/v1/nothing")
    error_object(status, body, 404)
    check_chat(server)
    check_bad_chats(server)
    check_logprobs(server)
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

    # The queue limit: one running, one waiting, the third gets 503 with Retry-After. Each
    # request is sent once the metrics show the one before it in place (a fixed pause let the
    # first 500 tokens end before the third came on a fast machine).
    larger = os.path.join(WORK, "larger")
    write_model(larger, hidden=256, layers=4, heads=4, kv_heads=2, ffn=512, positions=4096)
    small = Server(larger, "--parallel", "1", "--max-queue", "1", "--batch-tokens", "1")
    statuses, retry = [], []

    def long_request():
        status, _, r = small.request("POST", "/v1/completions",
                                     {"prompt": [1, 2, 3], "max_tokens": 4000, "ignore_eos": True})
        statuses.append(status)
        retry.append(r.getheader("Retry-After"))

    def wait_for(name, value):
        deadline = time.time() + 30
        while time.time() < deadline and small.metrics().get(name) != value:
            time.sleep(0.01)

    threads = [threading.Thread(target=long_request) for _ in range(3)]
    threads[0].start()
    wait_for("numesh_requests_running", 1)
    threads[1].start()
    wait_for("numesh_requests_waiting", 1)
    threads[2].start()
    for t in threads:
        t.join()
    check(sorted(statuses) == [200, 200, 503], f"statuses {statuses}")
    check("1" in retry, f"Retry-After on the 503: {retry}")
    small.stop()

    check_chat_template_option(model)
    check_template_errors()

    if FAILURES:
        print(f"{len(FAILURES)} checks failed")
        return 1
    print("numesh serve: every check passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
