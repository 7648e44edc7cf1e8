"""Training from Python: numesh.Trainer against `numesh train` on the same checkpoint, data and
options (the losses of every step), and its refusals of bad rows."""

import csv
import os
import subprocess

import numpy as np
import pytest

import numesh
from test_models import MESHES, checkpoints  # noqa: F401  (the module's checkpoint fixture)

OPTIONS = dict(lr=3e-3, warmup=1, total_steps=3, schedule="cosine", clip=0.5, weight_decay=0.05)


def data(vocab, rows=6, tokens=8):
    return np.random.default_rng(5).integers(3, vocab, size=(rows, tokens + 1)).astype(np.int32)


@pytest.mark.skipif(not os.environ.get("NUMESH_CLI"), reason="NUMESH_CLI (the numesh program) is not set")
@pytest.mark.parametrize("name", ["llama_tied_f32", "mixtral_f32"])
def test_trainer_losses_equal_numesh_train(checkpoints, tmp_path, name):  # noqa: F811
    d, _ = checkpoints
    rows = data(256)
    np.save(tmp_path / "data.npy", rows)
    log = tmp_path / "log.csv"
    subprocess.run([os.environ["NUMESH_CLI"], "train", "--model", str(d / name), "--data",
                    str(tmp_path / "data.npy"), "--batch", "2", "--steps", "3", "--lr", "3e-3",
                    "--warmup", "1", "--schedule", "cosine", "--clip", "0.5", "--weight-decay", "0.05",
                    "--log", str(log), "--quiet"], check=True, capture_output=True)
    with open(log) as f:
        cli = [float(r["loss"]) for r in csv.DictReader(f)]
    trainer = numesh.Trainer(str(d / name), batch=2, tokens=8, **OPTIONS)
    losses = [trainer.step(rows[2 * k:2 * k + 2]) for k in range(3)]
    assert len(cli) == 3
    # The CLI's log prints 9 significant digits of the same computation.
    assert losses == pytest.approx(cli, rel=1e-8, abs=0)
    assert trainer.steps == 3 and trainer.last_step["step"] == 3


def test_trainer_saves_and_resumes(checkpoints, tmp_path):  # noqa: F811
    d, _ = checkpoints
    rows = data(256)
    whole = numesh.Trainer(str(d / "llama_tied_f32"), batch=2, tokens=8, mesh=MESHES["tp2"](), **OPTIONS)
    want = [whole.step(rows[2 * k:2 * k + 2]) for k in range(3)]
    first = numesh.Trainer(str(d / "llama_tied_f32"), batch=2, tokens=8, mesh=MESHES["tp2"](), **OPTIONS)
    first.step(rows[0:2])
    first.save(str(tmp_path / "saved"))
    resumed = numesh.Trainer(str(tmp_path / "saved"), batch=2, tokens=8, mesh=MESHES["tp2"](), **OPTIONS)
    assert resumed.steps == 1
    got = [resumed.step(rows[2 * k:2 * k + 2]) for k in (1, 2)]
    assert got == pytest.approx(want[1:], rel=1e-6)
    # The saved folder is a model numesh loads.
    lm = numesh.CausalLM.from_pretrained(str(tmp_path / "saved"), mesh=MESHES["one device"]())
    assert lm.logits([1, 2, 3]).shape == (3, 256)


def test_trainer_refuses_bad_rows_and_options(checkpoints):  # noqa: F811
    d, _ = checkpoints
    trainer = numesh.Trainer(str(d / "llama_tied_f32"), batch=2, tokens=8, mesh=MESHES["one device"]())
    good = data(256)[:2]
    with pytest.raises(TypeError, match="dtype int64"):
        trainer.step(good.astype(np.int64))
    with pytest.raises(TypeError, match="NumPy int32 array"):
        trainer.step(good.tolist())
    with pytest.raises(numesh.Error, match=r"rows \[2, 9\].*got shape \(3, 9\)"):
        trainer.step(data(256)[:3])
    with pytest.raises(ValueError, match="C-contiguous"):
        trainer.step(np.asfortranarray(good))
    bad = good.copy()
    bad[1, 4] = 256
    with pytest.raises(IndexError, match="256"):
        trainer.step(bad)
    assert trainer.steps == 0  # nothing ran
    trainer.step(good)
    assert trainer.steps == 1
    with pytest.raises(ValueError, match="init 'scratch'"):
        numesh.Trainer(str(d / "llama_tied_f32"), batch=2, tokens=8, init="scratch")
    with pytest.raises(ValueError, match="invalid learning rate -1"):
        numesh.Trainer(str(d / "llama_tied_f32"), batch=2, tokens=8, lr=-1.0)
    with pytest.raises(TypeError):
        numesh.Trainer(str(d / "llama_tied_f32"), batch=2)  # tokens is required


@pytest.mark.skipif(not os.environ.get("NUMESH_CLI"), reason="NUMESH_CLI (the numesh program) is not set")
@pytest.mark.parametrize("name", ["llama_tied_f32", "gemma_bf16", "phi3_bf16"])
def test_a_trainer_starts_from_a_gguf_file_as_from_its_folder(checkpoints, tmp_path, name):  # noqa: F811
    # llama_tied_f32 has Llama 3.1's RoPE scaling: rope_freqs in the GGUF file, read back as it.
    # Gemma's norms are written as 1 + w and read back as w; Phi-3's qkv and gate_up stay fused.
    d, _ = checkpoints
    gguf = tmp_path / "model.gguf"
    subprocess.run([os.environ["NUMESH_CLI"], "convert", "--model", str(d / name), "--out",
                    str(gguf), "--type", "f32", "--quiet"], check=True, capture_output=True)
    rows = data(256)
    folder = numesh.Trainer(str(d / name), batch=2, tokens=8, **OPTIONS)
    from_file = numesh.Trainer(str(gguf), batch=2, tokens=8, progress=False, **OPTIONS)
    want = [folder.step(rows[2 * k:2 * k + 2]) for k in range(3)]
    got = [from_file.step(rows[2 * k:2 * k + 2]) for k in range(3)]
    assert got == pytest.approx(want, rel=1e-6)
    from_file.save(str(tmp_path / "saved"))
    assert numesh.CausalLM.from_pretrained(str(tmp_path / "saved")).logits([1, 2, 3]).shape == (3, 256)
