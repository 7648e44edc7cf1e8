"""Models from Python against PyTorch and against `numesh generate`: the tiny random checkpoints
of tests/models/hf_model_check.py (its writer and its float64 forward from the published
architectures), loaded through CausalLM.from_pretrained on meshes of one and two devices."""

import json
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest

import numesh
from conftest import ROOT, share_of_a_python_thread_during

sys.path.insert(0, str(ROOT / "tests" / "models"))
sys.path.insert(0, str(ROOT / "tests" / "common"))
torch = pytest.importorskip("torch", reason="PyTorch (python3-torch) is the reference of these tests")
hf_model_check = pytest.importorskip("hf_model_check")

CASES = ["llama_tied_f32", "qwen2_f32", "mixtral_f32"]
# Two devices on one machine of any size: a synthetic topology of two NUMA nodes of one core
# (its devices run unpinned), the layers over tp.
MESHES = {
    "one device": lambda: numesh.DeviceMesh((1, 1, 1), ("dp", "ep", "tp"),
                                            topology=numesh.Topology.from_synthetic("numa:1 core:1 pu:1")),
    "tp2": lambda: numesh.DeviceMesh((1, 1, 2), ("dp", "ep", "tp"),
                                     topology=numesh.Topology.from_synthetic("numa:2 core:1 pu:1")),
}


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    d = tmp_path_factory.mktemp("hf_models")
    hf_model_check.write(str(d))
    cases = {c["name"]: c for c in json.loads((d / "cases.json").read_text())["cases"]}
    return d, cases


@pytest.mark.parametrize("mesh_name", sorted(MESHES))
@pytest.mark.parametrize("name", CASES)
def test_logits_and_greedy_tokens_equal_pytorch(checkpoints, name, mesh_name):
    d, cases = checkpoints
    prompt = cases[name]["prompt"][0]
    lm = numesh.CausalLM.from_pretrained(str(d / name), dtype="f32", mesh=MESHES[mesh_name]())
    got = lm.logits(prompt)
    assert got.dtype == np.float32 and got.shape == (len(prompt), lm.vocab_size)
    model = hf_model_check.Model(str(d / name), "f32")
    want = model.logits(torch.tensor([prompt]))[0]
    err = hf_model_check.relative_max(torch.from_numpy(got).double(), want)
    assert hf_model_check.within(err, hf_model_check.BOUNDS["f32"]), f"{name} on {mesh_name}: {err:.2e}"
    # Greedy tokens: torch's own loop over the whole sequence.
    seq = torch.tensor([prompt])
    for _ in range(4):
        seq = torch.cat([seq, model.logits(seq)[:, -1].argmax(-1)[:, None]], 1)
    out = lm.generate(np.array(prompt, dtype=np.int64), max_new_tokens=4, stop_ids=[])
    assert out["ids"] == seq[0, len(prompt):].tolist()
    assert out["stop_reason"] == "max new tokens" and out["text"] is None  # no tokenizer


@pytest.mark.skipif(not os.environ.get("NUMESH_CLI"), reason="NUMESH_CLI (the numesh program) is not set")
@pytest.mark.parametrize("name,file_type", [("llama_tied_f32", "f32"), ("gemma_bf16", "bf16"), ("phi3_bf16", "f32"),
                                            ("mixtral_blocks", "q8_0"), ("qwen3_blocks", "q4_0")])
def test_a_gguf_file_gives_its_folders_logits(checkpoints, tmp_path, name, file_type):
    # `numesh convert`'s file, loaded by CausalLM.from_pretrained, against the folder stored in the
    # file's format (quantized at load as the writer quantized it): the same bits, on two devices.
    d, cases = checkpoints
    gguf = tmp_path / f"{name}.{file_type}.gguf"
    subprocess.run([os.environ["NUMESH_CLI"], "convert", "--model", str(d / name), "--out", str(gguf), "--type",
                    file_type, "--quiet"], check=True, capture_output=True)
    prompt = cases[name]["prompt"][0]
    from_file = numesh.CausalLM.from_pretrained(str(gguf), mesh=MESHES["tp2"](), progress=False)
    folder = numesh.CausalLM.from_pretrained(str(d / name), dtype=file_type, mesh=MESHES["tp2"]())
    got, want = from_file.logits(prompt), folder.logits(prompt)
    assert got.shape == want.shape == (len(prompt), folder.vocab_size)
    np.testing.assert_array_equal(got, want)
    assert from_file.generate(prompt, max_new_tokens=3, stop_ids=[])["ids"] == \
        folder.generate(prompt, max_new_tokens=3, stop_ids=[])["ids"]


@pytest.mark.skipif(not os.environ.get("NUMESH_CLI"), reason="NUMESH_CLI (the numesh program) is not set")
@pytest.mark.parametrize("sampling", [[], ["--temperature", "0.8", "--top-k", "10", "--seed", "7"]],
                         ids=["greedy", "sampled"])
def test_generate_equals_numesh_generate(checkpoints, tmp_path, sampling):
    d, cases = checkpoints
    prompt = cases["llama_tied_f32"]["prompt"][0]
    out_json = tmp_path / "out.json"
    subprocess.run([os.environ["NUMESH_CLI"], "generate", "--model", str(d / "llama_tied_f32"), "--ids",
                    ",".join(map(str, prompt)), "--max-new-tokens", "6", "--ignore-eos", "--json",
                    str(out_json), *sampling], check=True, capture_output=True)
    cli = json.loads(out_json.read_text())
    lm = numesh.CausalLM.from_pretrained(str(d / "llama_tied_f32"))
    options = dict(temperature=0.8, top_k=10, seed=7) if sampling else {}
    got = lm.generate(prompt, max_new_tokens=6, stop_ids=[], **options)
    assert got["ids"] == cli["sequences"][0]["ids"]
    streamed = list(lm.stream(prompt, max_new_tokens=6, stop_ids=[], **options))
    assert streamed == got["ids"]


@pytest.mark.parametrize("mesh_name", sorted(MESHES))
def test_matrices_read_in_place_or_copied_give_the_same_logits(checkpoints, mesh_name):
    d, cases = checkpoints
    prompt = cases["llama_tied_f32"]["prompt"][0]
    got = {m: numesh.CausalLM.from_pretrained(str(d / "llama_tied_f32"), mesh=MESHES[mesh_name](),
                                              mmap=m).logits(prompt)
           for m in ("on", "off", "auto")}
    assert np.array_equal(got["on"], got["off"]) and np.array_equal(got["auto"], got["off"])
    with pytest.raises(ValueError, match="'yes' is not a weight mapping: auto .*, on .* or off"):
        numesh.CausalLM.from_pretrained(str(d / "llama_tied_f32"), mmap="yes")


def test_sixteen_bit_kv_caches_give_logits_near_the_fp32_caches(checkpoints):
    d, cases = checkpoints
    prompt = cases["gemma_blocks"]["prompt"][0]  # head_dim 32: whole 16-lane chunks
    path = str(d / "gemma_blocks")
    want = numesh.CausalLM.from_pretrained(path, mesh=MESHES["one device"]()).logits(prompt)
    for kv, bound in (("bf16", 2e-2), ("f16", 3e-3)):
        got = numesh.CausalLM.from_pretrained(path, mesh=MESHES["one device"](),
                                              kv_dtype=kv).logits(prompt)
        # The keys' and values' rounding moves them, but only so far (relative to the largest).
        diff = np.abs(got - want).max() / np.abs(want).max()
        assert 0 < diff < bound, (kv, diff)
    with pytest.raises(ValueError, match=r"KV cache dtype 'q8_0': expected f32, bf16 or f16"):
        numesh.CausalLM.from_pretrained(path, kv_dtype="q8_0")


def test_a_prompt_longer_than_the_prefill_chunk_gives_the_logits_of_one_run(checkpoints):
    d, cases = checkpoints
    path = str(d / "llama_tied_f32")
    prompt = list(range(1, 12))
    want = numesh.CausalLM.from_pretrained(path, mesh=MESHES["one device"]()).logits(prompt)
    # 11 tokens in chunks of at most 4 (4, 4, 3), each writing its keys before the next reads.
    got = numesh.CausalLM.from_pretrained(path, mesh=MESHES["one device"](),
                                          prefill_chunk=4).logits(prompt)
    assert got.shape == want.shape
    assert np.abs(got - want).max() <= 1e-5 * np.abs(want).max()
    with pytest.raises(ValueError, match=r"engine: prefill_chunk 0 must be positive"):
        numesh.CausalLM.from_pretrained(path, prefill_chunk=0)


def test_bad_input_is_a_python_exception_naming_it(checkpoints):
    d, cases = checkpoints
    lm = numesh.CausalLM.from_pretrained(str(d / "llama_tied_f32"), mesh=MESHES["one device"]())
    with pytest.raises(TypeError, match="got an array of dtype float64"):
        lm.logits(np.array([1.0, 2.0]))
    with pytest.raises(ValueError, match=r"1-D array; got shape \(1, 1, 2\)"):
        lm.logits(np.array([[[1, 2]]]))
    with pytest.raises(numesh.ShapeError, match=r"logits: 2 rows of ids; the model runs 1 a call \(CausalLM.from_pretrained\(batch=2\) runs 2\)"):
        lm.logits([[1, 2], [3, 4]])
    with pytest.raises(TypeError, match="token id at position 1 is '2' of <class 'str'>"):
        lm.logits([1, "2"])
    with pytest.raises(IndexError, match="256"):
        lm.logits([1, 256])  # the vocabulary is 256
    with pytest.raises(IndexError, match="token id 4294967296 at position 0"):
        lm.logits([2**32])
    with pytest.raises(IndexError, match=f"token id {2**70} at position 1"):
        lm.logits([1, 2**70])
    with pytest.raises(IndexError, match=f"token id {2**63 + 5} at position 0"):
        lm.logits(np.array([2**63 + 5], dtype=np.uint64))  # no wrap to a negative id
    with pytest.raises(numesh.Error, match="empty"):
        lm.logits([])
    with pytest.raises(ValueError, match="has no tokenizer: give the prompt as token ids"):
        lm.generate("hello")
    with pytest.raises(TypeError):
        lm.generate([1, 2], max_new_token=3)  # a keyword that does not exist
    with pytest.raises(ValueError, match="max_new_tokens"):
        lm.generate([1, 2], max_new_tokens=0)
    with pytest.raises(ValueError):
        numesh.CausalLM.from_pretrained(str(d / "llama_tied_f32"), dtype="f64")
    with pytest.raises(numesh.Error, match="config.json"):
        numesh.CausalLM.from_pretrained(str(d / "no_such_model"))
    # The model still works after each refusal.
    assert lm.logits([1, 2]).shape == (2, 256)


def test_topology_and_device_mesh():
    t = numesh.Topology.from_synthetic("package:2 numa:2 core:2 pu:2")
    assert t.source == "synthetic" and len(t.numa_nodes) == 4 and t.cores == 8 and t.pus == 16
    assert not t.can_bind
    mesh = numesh.DeviceMesh((2, -1), ("dp", "tp"), topology=t)
    assert mesh.mesh == numesh.Mesh(["dp", "tp"], [2, 2]) and mesh.size == 4
    assert [dev["numa_node"] for dev in mesh.devices] == [0, 1, 2, 3]
    assert mesh.devices[3]["coords"] == (1, 1)
    assert "DeviceMesh('dp': 2, 'tp': 2) over 4 devices (numa policy)" in repr(mesh)
    with pytest.raises(ValueError):
        numesh.DeviceMesh((3, -1), ("dp", "tp"), topology=t)
    with pytest.raises(ValueError, match="policy"):
        numesh.DeviceMesh(policy="sockets", topology=t)
    assert numesh.Topology.discover().pus >= 1


def test_ctrl_c_stops_generate_between_tokens(checkpoints):
    import signal

    d, cases = checkpoints
    lm = numesh.CausalLM.from_pretrained(str(d / "llama_tied_f32"), mesh=MESHES["one device"]())
    prompt = cases["llama_tied_f32"]["prompt"][0]
    seen = []

    def interrupt_at_third(token):
        seen.append(token)
        if len(seen) == 3:
            os.kill(os.getpid(), signal.SIGINT)  # what Ctrl-C sends

    with pytest.raises(KeyboardInterrupt):
        lm.generate(prompt, max_new_tokens=50, stop_ids=[], on_token=interrupt_at_third)
    assert 3 <= len(seen) < 50
    # The model is whole afterwards: the same tokens as an uninterrupted run.
    assert lm.generate(prompt, max_new_tokens=3, stop_ids=[])["ids"] == seen[:3]


def test_an_error_in_the_callback_ends_generate_and_is_raised(checkpoints):
    d, cases = checkpoints
    lm = numesh.CausalLM.from_pretrained(str(d / "llama_tied_f32"), mesh=MESHES["one device"]())

    def fail(token):
        raise RuntimeError(f"the caller's own error at {token}")

    with pytest.raises(RuntimeError, match="the caller's own error"):
        lm.generate([1, 2, 3], max_new_tokens=5, on_token=fail)
    assert len(lm.generate([1, 2, 3], max_new_tokens=5, stop_ids=[])["ids"]) == 5


def test_batched_logits_are_each_rows_own(checkpoints):
    """A model loaded for a batch takes rows of ids (a 2-D array or a list of lists) and gives
    [batch, T, vocab]: each row's logits, those of the row alone within fp32 reassociation."""
    d, cases = checkpoints
    one = numesh.CausalLM.from_pretrained(str(d / "qwen2_f32"), mesh=MESHES["one device"]())
    lm = numesh.CausalLM.from_pretrained(str(d / "qwen2_f32"), mesh=MESHES["tp2"](), batch=3)
    rows = np.array([[5, 9, 14, 3], [7, 7, 7, 7], [200, 1, 2, 3]], dtype=np.int32)
    got = lm.logits(rows)
    assert got.shape == (3, 4, lm.vocab_size) and got.dtype == np.float32
    for b in range(3):
        want = one.logits(rows[b])
        assert np.abs(got[b] - want).max() <= 1e-5 * np.abs(want).max(), b
    assert np.array_equal(lm.logits(rows.tolist()), got)
    with pytest.raises(numesh.ShapeError, match=r"logits: row 1 has 3 ids and row 0 4; the rows of a batch are of one length"):
        lm.logits([[1, 2, 3, 4], [1, 2, 3], [1, 2, 3, 4]])
    with pytest.raises(IndexError, match=r"token id 256 at row 2, position 1 is outside the vocabulary of 256"):
        lm.logits([[1, 2, 3, 4], [1, 2, 3, 4], [1, 256, 3, 4]])
    with pytest.raises(numesh.ShapeError, match=r"logits: one row of ids; the model runs 3 a call \(give them as \[3, T\]\)"):
        lm.logits([1, 2, 3])
    with pytest.raises(ValueError, match=r"generate runs one prompt; this model was loaded with batch=3"):
        lm.generate([1, 2])


def test_other_threads_run_while_the_model_generates(checkpoints):
    """The GIL is released while the model computes: a Python thread runs on meanwhile."""
    d, _ = checkpoints
    lm = numesh.CausalLM.from_pretrained(str(d / "llama_tied_f32"), mesh=MESHES["one device"]())
    share = share_of_a_python_thread_during(lambda: lm.generate([1, 2, 3], max_new_tokens=120, stop_ids=[]))
    assert share > 0.2, f"a Python thread did {share:.0%} of its work alone while generate ran"


def test_logits_arrays_own_their_memory_and_calls_do_not_leak(checkpoints):
    import resource

    d, _ = checkpoints
    lm = numesh.CausalLM.from_pretrained(str(d / "llama_tied_f32"), mesh=MESHES["one device"]())
    first = lm.logits([1, 2, 3])
    assert first.flags.owndata is False and first.base is not None  # a capsule owns the values
    kept = first.copy()
    del lm  # the array outlives the model
    assert np.array_equal(first, kept)
    lm = numesh.CausalLM.from_pretrained(str(d / "llama_tied_f32"), mesh=MESHES["one device"]())
    ids = list(range(3, 103))  # 100 KB of logits a call: a leak of them would be 200 MB
    for _ in range(200):
        lm.logits(ids)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    for _ in range(2000):
        lm.logits(ids)
    grown_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
    assert grown_kib < 16 * 1024, f"the peak RSS grew {grown_kib} KiB over 2000 calls"
