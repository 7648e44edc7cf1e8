#!/usr/bin/python3
"""Checks numesh's dense references against PyTorch through .npy files.

    torch_check.py DIR

DIR holds the inputs and numesh's outputs that torch_check_main wrote. This script recomputes
each output with torch.nn.functional (exact-erf GELU, SiLU) and torch matmuls in float64 and
compares. Exit status: 0 all agree; 1 a mismatch (printed); 77 PyTorch is not installed for this
interpreter (CTest reports the test as skipped). Run with Debian's /usr/bin/python3.
"""
import math
import os
import sys

try:
    import numpy as np
    import torch
    import torch.nn.functional as F
except ImportError as e:  # pragma: no cover - depends on the machine
    print(f"torch_check: skipped: {e} (Debian: apt-get install python3-torch)")
    sys.exit(77)


def load(d, name):
    return torch.from_numpy(np.load(os.path.join(d, name + ".npy"))).double()


def rope(x, first_position, theta=10000.0):
    """Rotate-half RoPE on [B, T, H, D] (LLaMA / Hugging Face form)."""
    d = x.shape[-1]
    half = d // 2
    pos = torch.arange(first_position, first_position + x.shape[1], dtype=torch.float64)
    freq = theta ** (-2.0 * torch.arange(half, dtype=torch.float64) / d)
    ang = pos[:, None] * freq[None, :]                      # [T, D/2]
    cos, sin = ang.cos()[None, :, None, :], ang.sin()[None, :, None, :]
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


def attention(q, k, v, q_offset):
    """softmax(q k^T / sqrt(d) + causal mask) v, GQA by repeating kv heads; bthd in and out."""
    q, k = rope(q, q_offset), rope(k, 0)
    group = q.shape[2] // k.shape[2]
    k = k.repeat_interleave(group, dim=2)
    v = v.repeat_interleave(group, dim=2)
    qh, kh, vh = (t.permute(0, 2, 1, 3) for t in (q, k, v))  # [B, H, T, D]
    scores = qh @ kh.transpose(-1, -2) / (q.shape[-1] ** 0.5)
    t, s = q.shape[1], k.shape[1]
    qpos = torch.arange(q_offset, q_offset + t)[:, None]
    kpos = torch.arange(s)[None, :]
    scores = scores.masked_fill(kpos > qpos, float("-inf"))
    return (torch.softmax(scores, dim=-1) @ vh).permute(0, 2, 1, 3)


def moe(x, router, gate, up, down, k, capacity_factor, renormalize):
    """A plain PyTorch top-k MoE with SwiGLU experts and GShard-priority capacity."""
    t, e = x.shape[0], router.shape[1]
    probs = torch.softmax(x @ router, dim=-1)
    topv, topi = probs.topk(k, dim=-1)          # highest first
    if renormalize:
        topv = topv / topv.sum(-1, keepdim=True)
    capacity = math.ceil(capacity_factor * t * k / e) if capacity_factor > 0 else None
    load = [0] * e
    y = torch.zeros_like(x)
    for j in range(k):                           # every first choice before any second
        for i in range(t):
            ex = int(topi[i, j])
            if capacity is not None and load[ex] >= capacity:
                continue
            load[ex] += 1
            h = F.silu(x[i] @ gate[ex]) * (x[i] @ up[ex])
            y[i] += topv[i, j] * (h @ down[ex])
    return y, torch.tensor(load, dtype=torch.float64)[None, :]


def main():
    d = sys.argv[1]
    x, w1, w2 = load(d, "x"), load(d, "w1"), load(d, "w2")
    wg, wu, wd = load(d, "w_gate"), load(d, "w_up"), load(d, "w_down")
    nw = load(d, "norm_weight")
    expected = {
        "mlp_gelu_out": F.gelu(x @ w1) @ w2,
        "mlp_swiglu_out": (F.silu(x @ wg) * (x @ wu)) @ wd,
        "rmsnorm_out": x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * nw,
    }
    for name, q_offset in (("mha_prefill", 0), ("gqa_prefill", 0), ("gqa_decode", 6)):
        q, k, v = (load(d, f"{name}_{t}") for t in "qkv")
        expected[f"{name}_out"] = attention(q, k, v, q_offset)
    for name, k, cf, renorm in (("moe_top2_dropless", 2, 0.0, True), ("moe_top1_capacity", 1, 1.0, True),
                                ("moe_top3_raw", 3, 0.0, False)):
        tensors = [load(d, f"{name}_{t}") for t in ("x", "router", "gate", "up", "down")]
        out, counts = moe(*tensors, k, cf, renorm)
        expected[f"{name}_out"] = out
        expected[f"{name}_tokens_per_expert"] = counts
    # numesh computes in fp32; the bound is relative to the output's scale.
    failed = False
    for name, want in expected.items():
        got = load(d, name)
        err = (got - want).abs().max().item() / max(want.abs().max().item(), 1e-30)
        ok = err < 1e-5
        failed |= not ok
        print(f"{name:16s} max relative error {err:.2e} {'ok' if ok else 'MISMATCH'}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
