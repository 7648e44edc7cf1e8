#!/usr/bin/python3
"""Writes the .npy folders the `numesh op` CLI tests read (tests/tools/CMakeLists.txt):

    /usr/bin/python3 tests/data/ops/make_op_fixtures.py

Small random fp32 layers with the file names docs/ops.md documents. Seeded, so rerunning it
rewrites the same bytes.
"""
import pathlib

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parent
rng = np.random.default_rng(0)


def save(folder, **arrays):
    d = ROOT / folder
    d.mkdir(exist_ok=True)
    for name, a in arrays.items():
        np.save(d / f"{name}.npy", np.ascontiguousarray(a, dtype="<f4"))


def normal(*shape, scale=1.0):
    return rng.normal(0.0, scale, size=shape).astype(np.float32)


H, F, HEADS, KV, D, E, FE = 16, 32, 4, 2, 8, 4, 8
attention = dict(wq=normal(H, HEADS * D, scale=0.25), wk=normal(H, KV * D, scale=0.25),
                 wv=normal(H, KV * D, scale=0.25), wo=normal(HEADS * D, H, scale=0.2))
moe = dict(router=normal(H, E, scale=0.5), w_gate=normal(E, H, FE, scale=0.25),
           w_up=normal(E, H, FE, scale=0.25), w_down=normal(E, FE, H, scale=0.3))
save("op_mlp_gelu", x=normal(6, H), w1=normal(H, F, scale=0.25), w2=normal(F, H, scale=0.2))
save("op_mlp_swiglu", x=normal(6, H), w_gate=normal(H, F, scale=0.25), w_up=normal(H, F, scale=0.25),
     w_down=normal(F, H, scale=0.2))
save("op_attention", x=normal(2, 6, H), **attention)
save("op_moe", x=normal(8, H), **moe)
norms = dict(attn_norm=1.0 + normal(H, scale=0.1), ffn_norm=1.0 + normal(H, scale=0.1))
save("op_block_mlp", x=normal(2, 6, H), **norms, **attention, w_gate=normal(H, F, scale=0.25),
     w_up=normal(H, F, scale=0.25), w_down=normal(F, H, scale=0.2))
save("op_block_moe", x=normal(2, 6, H), **norms, **attention, **moe)
