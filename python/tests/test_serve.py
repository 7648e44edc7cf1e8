"""numesh.serve: the server of `numesh serve` started from Python (serve::Service, the same
engine), driven over HTTP with Python's standard library: greedy completions equal
CausalLM.generate's tokens, concurrent requests each get their own, the `with` block and
stop()/wait() end it, Ctrl-C in wait() stops it, bad options are named as keywords. The
endpoints themselves are proven by tests/serve/server_check.py against `numesh serve`."""

import http.client
import json
import os
import shutil
import signal
import subprocess
import sys
import threading

import numesh
import pytest
from conftest import ROOT

sys.path.insert(0, str(ROOT / "tests" / "models"))
sys.path.insert(0, str(ROOT / "tests" / "common"))
pytest.importorskip("torch", reason="hf_model_check (which writes the checkpoint) needs PyTorch")
hf_model_check = pytest.importorskip("hf_model_check")


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    d = tmp_path_factory.mktemp("serve_models")
    hf_model_check.write(str(d))
    return str(d / "llama_tied_f32")


def one_device():
    return numesh.DeviceMesh((1, 1, 1), ("dp", "ep", "tp"),
                             topology=numesh.Topology.from_synthetic("numa:1 core:1 pu:1"))


def post(server, path, body):
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=60)
    conn.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
    response = conn.getresponse()
    return response.status, json.loads(response.read())


def complete(server, ids, n):
    status, body = post(server, "/v1/completions",
                        {"prompt": ids, "max_tokens": n, "temperature": 0, "ignore_eos": True})
    assert status == 200, body
    return body["choices"][0]["tokens"]


def test_completions_are_generates_tokens_and_each_request_gets_its_own(model):
    lm = numesh.CausalLM.from_pretrained(model, mesh=one_device())
    prompts = [[5, 9, 14], [7, 1, 200, 3, 3], [42]]
    want = [lm.generate(p, max_new_tokens=6, stop_ids=[])["ids"] for p in prompts]
    with numesh.serve(model, port=0, parallel=2, ctx_size=64, mesh=one_device(),
                      model_name="tiny") as server:
        assert server.port > 0 and server.url == f"http://127.0.0.1:{server.port}"
        conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=60)
        conn.request("GET", "/v1/models")
        assert json.loads(conn.getresponse().read())["data"][0]["id"] == "tiny"
        assert complete(server, prompts[0], 6) == want[0]
        # Three at once on two running slots: each the tokens it gets alone.
        got = [None] * 3
        threads = [threading.Thread(target=lambda i=i: got.__setitem__(i, complete(server, prompts[i], 6)))
                   for i in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert got == want
    assert server.wait(timeout=0) is True  # the block's end stopped it
    with pytest.raises(OSError):
        complete(server, prompts[0], 1)


@pytest.mark.skipif(not os.environ.get("NUMESH_CLI"), reason="NUMESH_CLI (the numesh program) is not set")
def test_a_gguf_file_serves_chats_by_its_own_template(model, tmp_path):
    # The folder beside a byte-level tokenizer and a chat template, and `numesh convert`'s file of
    # it (tokenizer.ggml.* and tokenizer.chat_template): the same chat, rendered by the template
    # the file carries (one token a byte of the rendered text), the same greedy answer.
    from byte_level_tokenizer import byte_level_tokenizer
    folder = tmp_path / "chat_model"
    folder.mkdir()
    for f in ("config.json", "model.safetensors"):
        shutil.copy(os.path.join(model, f), folder / f)
    template = ("{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"
                "{% if add_generation_prompt %}<|assistant|>{% endif %}")
    (folder / "tokenizer.json").write_text(json.dumps(byte_level_tokenizer(256, extras=False)))
    (folder / "tokenizer_config.json").write_text(json.dumps({"chat_template": template}))
    gguf = tmp_path / "chat_model.gguf"
    subprocess.run([os.environ["NUMESH_CLI"], "convert", "--model", str(folder), "--out", str(gguf), "--type",
                    "f32", "--quiet"], check=True, capture_output=True)
    request = {"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello!"}],
               "max_tokens": 5, "temperature": 0}
    rendered = "<|system|>Be brief.\n<|user|>Hello!\n<|assistant|>"
    answers = []
    for source in (folder, gguf):
        with numesh.serve(str(source), port=0, parallel=1, ctx_size=64, mesh=one_device()) as server:
            status, body = post(server, "/v1/chat/completions", request)
        assert status == 200, body
        assert body["usage"]["prompt_tokens"] == len(rendered.encode()), f"{source}: {body['usage']}"
        answers.append((body["choices"][0]["message"]["content"], body["usage"]))
    assert answers[1] == answers[0]


def test_stop_from_another_thread_ends_wait(model):
    server = numesh.serve(model, port=0, parallel=1, ctx_size=32, mesh=one_device())
    assert server.wait(timeout=0.2) is False  # still serving
    threading.Timer(0.2, server.stop).start()
    assert server.wait() is True


def test_ctrl_c_in_wait_stops_the_server(model):
    server = numesh.serve(model, port=0, parallel=1, ctx_size=32, mesh=one_device())
    threading.Timer(0.3, lambda: os.kill(os.getpid(), signal.SIGINT)).start()
    with pytest.raises(KeyboardInterrupt):
        server.wait()
    assert server.wait(timeout=0) is True


def test_bad_options_are_named_as_keywords(model, tmp_path):
    with pytest.raises(ValueError, match=r"parallel=0 must be between 1 and 1024"):
        numesh.serve(model, parallel=0)
    with pytest.raises(ValueError, match=r"port=70000 is not a port"):
        numesh.serve(model, port=70000)
    with pytest.raises(ValueError, match=r"batch_tokens=4 must be at least parallel=8"):
        numesh.serve(model, batch_tokens=4)
    with pytest.raises(numesh.IoError, match=r"chat_template: cannot read '/nonexistent.jinja'"):
        numesh.serve(model, chat_template="/nonexistent.jinja")
    with pytest.raises(numesh.Error, match=r"/nonexistent does not exist"):
        numesh.serve("/nonexistent", port=0)
    with pytest.raises(TypeError, match=r"unexpected keyword|incompatible function arguments"):
        numesh.serve(model, threads=2)
    with pytest.raises(ValueError, match=r"'always' is not a weight mapping: auto .*, on .* or off"):
        numesh.serve(model, port=0, mmap="always")
