#!/usr/bin/python3
"""Checks the dense references' gradients (numesh/ops/reference/backward.hpp) against PyTorch.

    backward_check.py DIR

DIR holds what backward_check_main wrote. Each case's forward is written here with torch
operations in float64 (RMSNorm, LayerNorm (torch.nn.functional.layer_norm), a linear layer, the SwiGLU, GeGLU and GELU MLPs, causal GQA attention
with RoPE as Hugging Face's Llama writes it, a MoE layer routed as Mixtral's sparse block
(softmax, top-k, renormalised) with GShard's capacity where asked and Qwen2-MoE's sigmoid-gated
shared expert where present, an embedding lookup, the LM head with
torch.nn.functional.cross_entropy's mean), torch.autograd computes the gradients,
and numesh's (float64 inside, rounded to fp32) must agree: max |numesh - torch| / max |torch|
<= 1e-6 per gradient, the loss within 1e-12 relative.
Exit status: 0 all agree; 1 a mismatch; 2 torch or numpy missing (77 with
NUMESH_SKIP_TORCH_CHECKS=1, a reported skip).
"""
import json
import math
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "common"))
from python_deps import require  # noqa: E402  (a missing module: exit 2, or a skip)
from errors import relative_max, within, worst  # noqa: E402  (NaN-propagating error measures)
np, torch = require("numpy", "torch")
import torch.nn.functional as F  # noqa: E402

BOUND = 1e-6


def rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def llama_attention(x, wq, wk, wv, wo, heads, kv_heads, head_dim, theta, extras=None, eps=1e-6):
    """Hugging Face's LlamaAttention, causal, positions from 0, in float64; with `extras`
    (bq, bk, bv, bo, q_norm, k_norm) Qwen2's biases and Qwen3's per-head q/k RMSNorm before RoPE."""
    b, t, _ = x.shape
    e = extras or {}
    q, k, v = x @ wq, x @ wk, x @ wv
    if e:
        q, k, v = q + e["bq"], k + e["bk"], v + e["bv"]
    q = q.view(b, t, heads, head_dim)
    k = k.view(b, t, kv_heads, head_dim)
    if e:
        q = q * torch.rsqrt(q.pow(2).mean(-1, keepdim=True) + eps) * e["q_norm"]
        k = k * torch.rsqrt(k.pow(2).mean(-1, keepdim=True) + eps) * e["k_norm"]
    q, k = q.transpose(1, 2), k.transpose(1, 2)
    v = v.view(b, t, kv_heads, head_dim).transpose(1, 2)
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim))
    freqs = torch.outer(torch.arange(t, dtype=torch.float64), inv_freq)
    emb = torch.cat((freqs, freqs), dim=-1)
    cos, sin = emb.cos(), emb.sin()
    q = q * cos + rotate_half(q) * sin
    k = k * cos + rotate_half(k) * sin
    k = k.repeat_interleave(heads // kv_heads, dim=1)
    v = v.repeat_interleave(heads // kv_heads, dim=1)
    scores = q @ k.transpose(-1, -2) / head_dim ** 0.5
    mask = torch.triu(torch.ones(t, t, dtype=torch.bool), diagonal=1)
    p = scores.masked_fill(mask, float("-inf")).softmax(-1)
    y = (p @ v).transpose(1, 2).reshape(b, t, heads * head_dim) @ wo
    return y + e["bo"] if e else y


def moe_forward(x, router, gate, up, down, top_k, capacity_factor, renormalize):
    """Mixtral's sparse MoE block (softmax, top-k, weights renormalised when asked) with
    GShard's capacity when capacity_factor > 0: an expert keeps at most
    ceil(capacity_factor * T * k / E) choices, every token's first choice before any second."""
    t, e = x.shape[0], router.shape[1]
    probs = (x @ router).softmax(-1)
    weights, chosen = torch.topk(probs, top_k, dim=-1)
    if renormalize:
        weights = weights / weights.sum(-1, keepdim=True)
    keep = torch.ones(t, top_k, dtype=torch.bool)
    if capacity_factor > 0:
        capacity = math.ceil(capacity_factor * t * top_k / e)
        load = [0] * e
        for j in range(top_k):
            for i in range(t):
                ex = int(chosen[i, j])
                keep[i, j] = load[ex] < capacity
                load[ex] += int(keep[i, j])
    rows = []
    for i in range(t):
        row = torch.zeros(x.shape[1], dtype=x.dtype)
        for j in range(top_k):
            if keep[i, j]:
                ex = int(chosen[i, j])
                row = row + weights[i, j] * ((F.silu(x[i] @ gate[ex]) * (x[i] @ up[ex])) @ down[ex])
        rows.append(row)
    return torch.stack(rows)


def load_balancing_loss(probs, chosen, experts):
    """transformers' load_balancing_loss_func on one layer's router probabilities and top-k
    choices (no attention mask): E * sum(mean one-hot choices [k, E] * mean probabilities [E])."""
    tokens_per_expert = F.one_hot(chosen, experts).double().mean(0)
    return experts * (tokens_per_expert * probs.mean(0)[None]).sum()


def main():
    d = sys.argv[1]

    def load(case, name, grad=False):
        t = torch.from_numpy(np.load(os.path.join(d, f"{case}_{name}.npy"))).double()
        return t.requires_grad_(grad)

    failed = False
    for c in json.load(open(os.path.join(d, "cases.json"))):
        n = c["name"]
        loss_error = None
        if n == "rmsnorm":
            x, w, dy = load(n, "x", True), load(n, "w", True), load(n, "dy")
            y = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + c["eps"]) * w
            y.backward(dy)
            grads = {"dx": x.grad, "dw": w.grad}
        elif n == "layernorm":
            x, w, dy = load(n, "x", True), load(n, "w", True), load(n, "dy")
            b = torch.zeros(w.shape[1], dtype=torch.float64, requires_grad=True)
            F.layer_norm(x, (x.shape[1],), w[0], b, c["eps"]).backward(dy)
            grads = {"dx": x.grad, "dw": w.grad, "db": b.grad[None]}
        elif n == "linear":
            x, w, dy = load(n, "x", True), load(n, "w", True), load(n, "dy")
            (x @ w).backward(dy)
            grads = {"dx": x.grad, "dw": w.grad}
        elif n == "swiglu_bias":
            x, g, u, dn, dy = (load(n, "x", True), load(n, "gate", True), load(n, "up", True),
                               load(n, "down", True), load(n, "dy"))
            bg, bu, bd = load(n, "gate_bias", True), load(n, "up_bias", True), load(n, "down_bias", True)
            ((F.silu(x @ g + bg) * (x @ u + bu)) @ dn + bd).backward(dy)
            grads = {"dx": x.grad, "dgate": g.grad, "dup": u.grad, "ddown": dn.grad, "dgate_bias": bg.grad,
                     "dup_bias": bu.grad, "ddown_bias": bd.grad}
        elif n == "swiglu":
            x, g, u, dn, dy = (load(n, "x", True), load(n, "gate", True), load(n, "up", True),
                               load(n, "down", True), load(n, "dy"))
            ((F.silu(x @ g) * (x @ u)) @ dn).backward(dy)
            grads = {"dx": x.grad, "dgate": g.grad, "dup": u.grad, "ddown": dn.grad}
        elif n == "geglu":  # Gemma's MLP: gelu_pytorch_tanh on the gate
            x, g, u, dn, dy = (load(n, "x", True), load(n, "gate", True), load(n, "up", True),
                               load(n, "down", True), load(n, "dy"))
            ((F.gelu(x @ g, approximate="tanh") * (x @ u)) @ dn).backward(dy)
            grads = {"dx": x.grad, "dgate": g.grad, "dup": u.grad, "ddown": dn.grad}
        elif n == "gelu":
            x, u, dn, dy = load(n, "x", True), load(n, "up", True), load(n, "down", True), load(n, "dy")
            (F.gelu(x @ u) @ dn).backward(dy)
            grads = {"dx": x.grad, "dup": u.grad, "ddown": dn.grad}
        elif c.get("kind") == "attention":
            x, wq, wk, wv, wo = (load(n, "x", True), load(n, "wq", True), load(n, "wk", True),
                                 load(n, "wv", True), load(n, "wo", True))
            extras = ({key: load(n, key, True) for key in ("bq", "bk", "bv", "bo", "q_norm", "k_norm")}
                      if c["extras"] else None)
            llama_attention(x, wq, wk, wv, wo, c["heads"], c["kv_heads"], c["head_dim"], c["theta"], extras,
                            c["qk_norm_eps"]).backward(load(n, "dy"))
            grads = {"dx": x.grad, "dwq": wq.grad, "dwk": wk.grad, "dwv": wv.grad, "dwo": wo.grad}
            for key, t in (extras or {}).items():
                grads["d" + key] = t.grad
        elif c.get("kind") == "moe":
            x, r, g, u, dn = (load(n, "x", True), load(n, "router", True), load(n, "gate", True),
                              load(n, "up", True), load(n, "down", True))
            y = moe_forward(x, r, g, u, dn, c["top_k"], c["capacity_factor"], c["renormalize"])
            shared = {}
            if c.get("shared"):  # Qwen2-MoE's shared expert behind its sigmoid gate
                shared = {key: load(n, key, True) for key in ("shared_gate", "shared_up", "shared_down",
                                                              "shared_expert_gate")}
                y = y + torch.sigmoid(x @ shared["shared_expert_gate"]) * (
                    (F.silu(x @ shared["shared_gate"]) * (x @ shared["shared_up"])) @ shared["shared_down"])
            loss = (y * load(n, "dy")).sum()
            if c.get("aux_coef", 0.0) > 0.0:
                probs = (x @ r).softmax(-1)
                aux = load_balancing_loss(probs, torch.topk(probs, c["top_k"], dim=-1)[1], r.shape[1])
                loss = loss + c["aux_coef"] * aux
                loss_error = abs(c["aux_loss"] - float(aux)) / abs(float(aux))
            loss.backward()
            grads = {"dx": x.grad, "drouter": r.grad, "dgate": g.grad, "dup": u.grad, "ddown": dn.grad}
            for key, t in shared.items():
                grads["d" + key] = t.grad
        elif n == "embedding":
            table = torch.zeros(c["vocab"], load(n, "dy").shape[1], dtype=torch.float64, requires_grad=True)
            F.embedding(torch.tensor(c["ids"]), table).backward(load(n, "dy"))
            grads = {"dtable": table.grad}
        elif n == "cross_entropy":
            x, w = load(n, "x", True), load(n, "w", True)
            loss = F.cross_entropy(x @ w, torch.tensor(c["targets"]))
            loss.backward()
            grads = {"dx": x.grad, "dw": w.grad}
            loss_error = abs(c["loss"] - float(loss)) / abs(float(loss))
        else:
            print(f"{n}: FAILED: unknown case")
            failed = True
            continue
        errors = {}
        for key, want in grads.items():
            errors[key] = relative_max(np.load(os.path.join(d, f"{n}_{key}.npy")), want.numpy())
        ok = within(worst(errors.values()), BOUND) and (loss_error is None or within(loss_error, 1e-12))
        failed |= not ok
        text = ", ".join(f"{k} {v:.2e}" for k, v in errors.items())
        if loss_error is not None:
            text += f", loss {loss_error:.2e}"
        print(f"{n}: {text}: {'ok' if ok else 'FAILED'}")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
