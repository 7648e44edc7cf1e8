#!/usr/bin/python3
"""Checks numesh's safetensors reader against PyTorch, bit for bit.

    safetensors_check.py write DIR   # a checkpoint of PyTorch tensors, and the reads to make
    safetensors_check.py check DIR   # compares what safetensors_check_main read with PyTorch

`write` saves seeded PyTorch tensors (F32, BF16, F16, plus an I64 one that is never read) as a
two-shard checkpoint in DIR/checkpoint, laid out as the official writer lays out a file (the
Rust crate's `prepare`: tensors sorted by descending dtype, then name; compact JSON header with
"__metadata__" first, padded with spaces to a multiple of 8) and indexed as transformers'
save_pretrained indexes shards (model.safetensors.index.json with metadata.total_size and
weight_map). It also writes DIR/requests.json: whole tensors and the boxes a tensor-parallel
load reads (column and row blocks of every matrix over 2 and 4 devices, boxes of a rank-3
tensor), each into f32, bf16 and f16. safetensors_check_main performs them with numesh and
writes the raw little-endian results; `check` wants exactly PyTorch's bits for each:
t[box].to(dtype) (round to nearest even; bf16 <-> f16 through float32, exact for both).
Exit status: 0 all identical; 1 a mismatch (the first few printed); 2 torch or numpy is missing
(77 with NUMESH_SKIP_TORCH_CHECKS=1, a reported skip).
"""
import json
import os
import struct
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "common"))
from python_deps import require  # noqa: E402  (a missing module: exit 2, or a skip)
np, torch = require("numpy", "torch")

TORCH_DTYPE = {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16}
# The safetensors names, in the order of the Rust crate's `enum Dtype` (its sort key).
RUST_DTYPE_ORDER = ["BOOL", "F4", "F6_E2M3", "F6_E3M2", "U8", "I8", "F8_E5M2", "F8_E4M3",
                    "F8_E8M0", "F8_E4M3FNUZ", "F8_E5M2FNUZ", "I16", "U16", "F16", "BF16", "I32",
                    "U32", "F32", "C64", "F64", "I64", "U64"]
SAFETENSORS_NAME = {torch.float32: "F32", torch.bfloat16: "BF16", torch.float16: "F16",
                    torch.int64: "I64"}


def tensor_bytes(t):
    """The tensor's little-endian bytes (numpy has no bfloat16: go through int16 bits)."""
    t = t.contiguous()
    if t.dtype in (torch.bfloat16, torch.float16):
        return t.view(torch.int16).numpy().tobytes()
    return t.numpy().tobytes()


def serialize(tensors, metadata):
    """A safetensors file as the Rust crate's serialize() writes it."""
    order = sorted(tensors, key=lambda n: (-RUST_DTYPE_ORDER.index(SAFETENSORS_NAME[tensors[n].dtype]), n))
    header = {"__metadata__": metadata} if metadata else {}
    offset = 0
    blobs = []
    for name in order:
        data = tensor_bytes(tensors[name])
        header[name] = {"dtype": SAFETENSORS_NAME[tensors[name].dtype],
                        "shape": list(tensors[name].shape),
                        "data_offsets": [offset, offset + len(data)]}
        offset += len(data)
        blobs.append(data)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text + b"".join(blobs)


def make_tensors():
    g = torch.Generator().manual_seed(20240601)

    def randn(*shape):
        return torch.randn(*shape, generator=g) * 3.0

    x = randn(16, 24)
    # Values on the rounding boundaries: bf16 ties (1 + 2^-8, 1 + 3 * 2^-8), f16 overflow
    # (65520 -> inf, just below -> 65504), f16 subnormal ties (2^-25), signed zero, infinities.
    special = torch.tensor(np.array([0x3F808000, 0x3F818000, 0x477FF000, 0x477FEFFF, 0x33000000,
                                     0x33000001, 0x80000000, 0x7F800000, 0xFF800000],
                                    dtype=np.uint32).view(np.float32))
    x.view(-1)[:special.numel()] = special
    shard1 = {
        "model.embed_tokens.weight": randn(32, 16),
        "model.layers.0.mlp.up_proj.weight": x,
        "model.layers.0.mlp.gate_proj.weight": randn(24, 16).to(torch.bfloat16),
        "model.layers.0.input_layernorm.weight": randn(16).to(torch.float16),
        "model.layers.0.position_ids": torch.arange(12, dtype=torch.int64).reshape(3, 4),
    }
    shard2 = {
        "model.layers.0.mlp.down_proj.weight": randn(16, 24).to(torch.bfloat16),
        "model.layers.0.self_attn.k_proj.weight": randn(3, 5, 7).to(torch.float16),
        "lm_head.weight": randn(32, 16).to(torch.float16),
        "model.norm.scale": randn(()),
        "model.empty": randn(0, 4).to(torch.bfloat16),
    }
    return shard1, shard2


def boxes(shape):
    """The whole tensor, and the shards tensor-parallel loads read."""
    out = [None]
    if len(shape) == 2:
        rows, cols = shape
        for n in (2, 4):
            out += [[[0, k * cols // n], [rows, cols // n]] for k in range(n) if cols % n == 0]
            out += [[[k * rows // n, 0], [rows // n, cols]] for k in range(n) if rows % n == 0]
        if rows > 2 and cols > 5:
            out.append([[1, 3], [rows - 2, cols - 5]])
    elif len(shape) == 3:
        out += [[[0, 1, 2], [3, 3, 4]], [[1, 0, 0], [2, 5, 7]], [[2, 4, 6], [1, 1, 1]],
                [[0, 0, 3], [3, 5, 2]]]
    return out


def write(d):
    shard1, shard2 = make_tensors()
    ckpt = os.path.join(d, "checkpoint")
    os.makedirs(ckpt)
    files = {"model-00001-of-00002.safetensors": shard1,
             "model-00002-of-00002.safetensors": shard2}
    weight_map = {}
    total = 0
    for file, tensors in files.items():
        with open(os.path.join(ckpt, file), "wb") as f:
            f.write(serialize(tensors, {"format": "pt"}))
        for name, t in tensors.items():
            weight_map[name] = file
            total += len(tensor_bytes(t))
    with open(os.path.join(ckpt, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))},
                  f, indent=2)
    torch.save({**shard1, **shard2}, os.path.join(d, "reference.pt"))

    requests = []
    for name, t in sorted({**shard1, **shard2}.items()):
        if t.dtype == torch.int64:
            continue
        for box in boxes(list(t.shape)):
            for target in TORCH_DTYPE:
                requests.append({"name": name, "target": target, "box": box,
                                 "out": f"out{len(requests)}.{target}"})
    with open(os.path.join(d, "requests.json"), "w") as f:
        json.dump(requests, f, indent=1)
    return 0


def check(d):
    reference = torch.load(os.path.join(d, "reference.pt"))
    with open(os.path.join(d, "requests.json")) as f:
        requests = json.load(f)
    failed = 0
    for r in requests:
        t = reference[r["name"]]
        if r["box"] is not None:
            offsets, sizes = r["box"]
            t = t[tuple(slice(o, o + s) for o, s in zip(offsets, sizes))]
        # One rounding from the stored value; bf16 <-> f16 through float32, which holds both.
        want = tensor_bytes(t.to(torch.float32).to(TORCH_DTYPE[r["target"]]))
        with open(os.path.join(d, r["out"]), "rb") as f:
            got = f.read()
        if got != want:
            failed += 1
            if failed <= 5:
                first = next((i for i, (a, b) in enumerate(zip(got, want)) if a != b),
                             min(len(got), len(want)))
                print(f"MISMATCH {r['name']} box {r['box']} as {r['target']}: {len(got)} bytes, "
                      f"want {len(want)}; first difference at byte {first}")
    print(f"safetensors_check: {len(requests) - failed} of {len(requests)} reads bit-identical to "
          f"PyTorch ({len(set(r['name'] for r in requests))} tensors, F32/BF16/F16 into f32/bf16/f16)")
    return 1 if failed else 0


if __name__ == "__main__":
    mode, d = sys.argv[1], sys.argv[2]
    sys.exit(write(d) if mode == "write" else check(d))
