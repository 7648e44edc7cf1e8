"""Ctrl-C during a long call: the graph that is running stops where it is, the call raises
KeyboardInterrupt (with numesh's note when it cut a graph), and the model, the trainer or the
layer is whole afterwards. SIGINT comes from another thread, as the terminal's would, while the
main thread is inside numesh with the GIL released."""

import contextlib
import os
import signal
import socket
import threading

import numpy as np
import pytest

import numesh
from test_models import MESHES, checkpoints  # noqa: F401  (the module's checkpoint fixture)

NOTE = "numesh cancelled the call's graphs where they were"


@contextlib.contextmanager
def ctrl_c_in(seconds):
    """Sends this process SIGINT, what Ctrl-C sends, after `seconds`, from another thread; not
    at all if the block ended first (it must not reach a later test)."""
    timer = threading.Timer(seconds, lambda: os.kill(os.getpid(), signal.SIGINT))
    timer.start()
    try:
        yield
    finally:
        timer.cancel()


def notes(error):
    return " ".join(getattr(error, "__notes__", []))


def test_ctrl_c_stops_a_layer_in_the_middle_of_its_runs():
    rng = np.random.default_rng(3)
    x = rng.standard_normal((16, 32)).astype(np.float32)
    w = {"w1": (rng.standard_normal((32, 64)) * 0.2).astype(np.float32),
         "w2": (rng.standard_normal((64, 32)) * 0.2).astype(np.float32)}
    mesh = numesh.DeviceMesh((1, 1, 2), ("dp", "ep", "tp"),
                             topology=numesh.Topology.from_synthetic("numa:2 core:1 pu:1"))
    want = numesh.ops.run("mlp", x, w, mesh=mesh).y
    # Calls of 100,000 runs of the layer's graph each (seconds): Ctrl-C lands inside one, and
    # only a call whose graphs it cancelled raises with the note (one that had finished would
    # raise without it, between two calls).
    with ctrl_c_in(0.3), pytest.raises(KeyboardInterrupt) as info:
        for _ in range(1000):
            numesh.ops.run("mlp", x, w, mesh=mesh, repeats=100_000, check=False)
    assert NOTE in notes(info.value)
    np.testing.assert_array_equal(numesh.ops.run("mlp", x, w, mesh=mesh).y, want)


def test_ctrl_c_stops_logits_and_the_model_is_whole(checkpoints):  # noqa: F811
    d, _ = checkpoints
    lm = numesh.CausalLM.from_pretrained(str(d / "llama_tied_f32"), mesh=MESHES["tp2"]())
    ids = np.arange(lm.max_context, dtype=np.int64) % lm.vocab_size
    want = lm.logits(ids)
    with ctrl_c_in(0.3), pytest.raises(KeyboardInterrupt):
        for _ in range(1_000_000):
            lm.logits(ids)
    np.testing.assert_array_equal(lm.logits(ids), want)


def test_ctrl_c_never_leaves_half_a_training_step(checkpoints):  # noqa: F811
    d, _ = checkpoints
    rows = np.random.default_rng(5).integers(3, 256, size=(64, 9)).astype(np.int32)
    options = dict(batch=2, tokens=8, mesh=MESHES["tp2"](), lr=3e-3, total_steps=100_000)

    def batch(k):
        return rows[2 * (k % 32):2 * (k % 32) + 2]

    cut = numesh.Trainer(str(d / "llama_tied_f32"), **options)
    returned = 0
    with ctrl_c_in(0.3), pytest.raises(KeyboardInterrupt):
        for k in range(1_000_000):
            cut.step(batch(k))
            returned += 1
    # The step Ctrl-C met was not taken, or taken whole (its update had begun).
    assert cut.steps in (returned, returned + 1)
    # Either way the trajectory goes on as an uninterrupted trainer's, bit for bit.
    straight = numesh.Trainer(str(d / "llama_tied_f32"), **options)
    want = [straight.step(batch(k)) for k in range(cut.steps + 2)][-2:]
    got = [cut.step(batch(k)) for k in (cut.steps, cut.steps + 1)]
    assert got == want


def test_a_programs_own_sigint_handler_decides_and_nothing_is_cancelled(checkpoints):  # noqa: F811
    d, _ = checkpoints
    lm = numesh.CausalLM.from_pretrained(str(d / "llama_tied_f32"), mesh=MESHES["tp2"]())
    ids = np.arange(lm.max_context, dtype=np.int64) % lm.vocab_size
    want = lm.logits(ids)
    seen = []
    previous = signal.signal(signal.SIGINT, lambda signum, frame: seen.append(signum))
    try:
        with ctrl_c_in(0.3):
            while not seen:  # every call whole: the program's handler did not ask to stop
                np.testing.assert_array_equal(lm.logits(ids), want)
    finally:
        signal.signal(signal.SIGINT, previous)
    assert seen == [signal.SIGINT]


def test_a_stream_left_early_stops_its_worker(checkpoints):  # noqa: F811
    d, cases = checkpoints
    lm = numesh.CausalLM.from_pretrained(str(d / "llama_tied_f32"), mesh=MESHES["one device"]())
    prompt = cases["llama_tied_f32"]["prompt"][0]
    tokens = lm.stream(prompt, max_new_tokens=50, stop_ids=[])
    first = next(tokens)
    tokens.close()  # as a `break` out of the loop does
    assert not [t for t in threading.enumerate() if t.name == "numesh-generate"]
    assert lm.generate(prompt, max_new_tokens=1, stop_ids=[])["ids"] == [first]


def test_the_wakeup_descriptor_a_program_set_is_restored_and_hears_of_ctrl_c(checkpoints):  # noqa: F811
    # As an asyncio loop sets one: numesh stands in for it during a call (nested calls too, a
    # model's call inside another's on_token) and passes each signal's byte on to it.
    d, cases = checkpoints
    lm = numesh.CausalLM.from_pretrained(str(d / "llama_tied_f32"), mesh=MESHES["one device"]())
    other = numesh.CausalLM.from_pretrained(str(d / "llama_tied_f32"), mesh=MESHES["one device"]())
    ids = np.arange(lm.max_context, dtype=np.int64) % lm.vocab_size
    loop_side, handler_side = socket.socketpair()
    loop_side.setblocking(False)
    handler_side.setblocking(False)
    previous = signal.set_wakeup_fd(handler_side.fileno())
    try:
        shapes = []
        lm.generate(cases["llama_tied_f32"]["prompt"][0], max_new_tokens=3, stop_ids=[],
                    on_token=lambda token: shapes.append(other.logits([token]).shape))
        assert shapes == [(1, lm.vocab_size)] * 3
        assert signal.set_wakeup_fd(handler_side.fileno()) == handler_side.fileno()
        with ctrl_c_in(0.3), pytest.raises(KeyboardInterrupt):
            for _ in range(1_000_000):
                lm.logits(ids)
        assert bytes([signal.SIGINT]) in loop_side.recv(64)
    finally:
        signal.set_wakeup_fd(previous)
        loop_side.close()
        handler_side.close()
