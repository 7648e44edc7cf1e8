#!/usr/bin/python3
"""Checks numesh's operators against PyTorch through .npy files.

    torch_check.py DIR

DIR holds what torch_check_main wrote: cases.json (the manifest: each case's op, parameters,
calls, input files and numesh's output files) and the .npy files. For every case this script
recomputes the op in float64 with torch (torch.nn.functional's exact-erf and tanh GELUs, SiLU,
matmuls, softmax) from the same fp32 inputs, then compares every numesh output with it:

  * non-finite values: got and want must be non-finite at the same elements, with the same
    value there (NaN with NaN, +inf with +inf); the first mismatch is named by its index;
  * finite values: max |got - want| / max |want| (the error relative to the output's scale),
    with the index of the worst element, against the bound of the output's tolerance class
    (BOUNDS below; routing statistics are compared exactly).

Cases with 16-bit weights (params "dtype": "bf16" or "f16") get the fp32 weights numesh was
given; torch rounds them to the dtype (x.to(torch.bfloat16), to nearest even) and, for bf16,
rounds each projection's input too, as numesh does (docs/ops.md, "Weight dtypes"), then computes
in float64. bf16 MLP outputs are also compared with PyTorch's own MLP run in torch.bfloat16.

The ops written here follow numesh's definitions (docs/ops.md): rotate-half RoPE, GQA by
repeating kv heads, causal masks at absolute positions, KV caches as concatenated keys, MoE
top-k with GShard-priority capacity, and the transformer block
h = x + attn(rmsnorm(x)); x' = h + ffn(rmsnorm(h)); optional final rmsnorm.

Exit status: 0 every output within its bound; 1 a mismatch (each printed); 77 torch or numpy
is missing and NUMESH_SKIP_TORCH_CHECKS=1 is set (CTest reports a skip); 2 torch or numpy is
missing otherwise (a failure naming the Debian package). Run with Debian's /usr/bin/python3
(python3-torch, python3-numpy).
"""
import json
import math
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "common"))
from python_deps import require  # noqa: E402  (a missing module: exit 2, or a skip)
require("numpy", "torch")

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

# max |got - want| / max |want| allowed per tolerance class: numesh in fp32 (fp32 inputs and
# outputs) against torch in float64 on the same inputs. "measured" is the largest error of the
# class in this check (the default seed), then over ten other seeds (torch_check_main DIR SEED);
# each bound is a few times that. docs/ops.md has the per-case figures.
BOUNDS = {
    # The dense references, float64 arithmetic inside, rounded to fp32 once: MLPs (small and
    # T=64, H=256, F=512), RMSNorm, attention_reference (up to 4005 keys), moe_reference,
    # TransformerReference. The output's own fp32 rounding is 2^-24 = 6.0e-8 of the scale.
    # Measured 5.3e-8 (5.4e-8 over ten seeds).
    "reference": 2e-7,
    # The sharded operators in fp32 (OpenBLAS sgemm, fp32 softmax, SiLU/GELU and norms):
    # ShardedMlp, ShardedAttention over up to 192 keys, ShardedTransformer (one block).
    # Measured 8.8e-7 (1.3e-6 over ten seeds).
    "sharded": 4e-6,
    # ShardedAttention over 3000-3100 cached keys: fp32 softmax sums and p.v sums over
    # thousands of keys. Measured 1.7e-6 (2.0e-6 over ten seeds).
    "sharded_long": 6e-6,
    # Routing statistics (kept tokens per expert): integers, equal.
    "exact": 0.0,
    # bf16 weights (the references are in "reference": torch rounds the weights and each
    # projection's input to bf16 as numesh does, in float64, and the float64 references round
    # the same float64 values; measured 5.4e-8 over ten seeds). The sharded operators compute
    # in fp32: an activation whose fp32 value in numesh and float64 value in torch round to
    # neighbouring bf16 values moves its token's row by up to 2^-8 of that activation times its
    # weights. Measured 3.8e-4 (1.9e-3 over ten seeds, one such flip in a decode step).
    "bf16_sharded": 4e-3,
    # numesh's bf16 MLP against PyTorch's own MLP in torch.bfloat16, which rounds the output of
    # every op (gate, up, activation, product, the result) to bf16. Measured 4.0e-3 (6.2e-3
    # over ten seeds).
    "torch_bf16": 2e-2,
}

# Query rows per chunk in attention(), so that the float64 scores of a 3000-token prefill stay
# small ([B, H, chunk, S]).
QUERY_CHUNK = 512


def load(d, name):
    return torch.from_numpy(np.load(os.path.join(d, name + ".npy"))).double()


# The torch dtypes of the weight dtypes a case names (params["dtype"]).
TORCH_DTYPES = {"bf16": torch.bfloat16, "f16": torch.float16}


def rounded(t, dtype):
    """t's values as numesh stores them in `dtype`: through fp32, rounded to nearest even by
    torch's own conversion (dtype_check proves numesh's bit for bit the same)."""
    if dtype == "f32":
        return t
    return t.float().to(TORCH_DTYPES[dtype]).double()


def projection(x, w, dtype):
    """x w for weights stored as `dtype`, in float64: bf16 weights multiply bf16-rounded x (as
    numesh and PyTorch's bf16 linear do), f16 and f32 weights the fp32 x."""
    if dtype == "bf16":
        x = rounded(x, "bf16")
    return x @ rounded(w, dtype)


# --------------------------------------------------------------------------------------------
# The ops, in float64.

def inverse_frequencies(d, theta, scaling):
    """RoPE's inverse frequencies after Hugging Face's rope_scaling (None, "linear" or
    "llama3", as transformers' _compute_linear_scaling_rope_parameters and
    _compute_llama3_parameters compute them), in float64."""
    inv_freq = 1.0 / (float(theta) ** (torch.arange(0, d, 2, dtype=torch.float64) / d))
    if scaling is None:
        return inv_freq
    factor = scaling["factor"]
    if scaling["rope_type"] == "linear":
        return inv_freq / factor
    assert scaling["rope_type"] == "llama3", scaling
    low, high = scaling["low_freq_factor"], scaling["high_freq_factor"]
    old_context = scaling["original_max_position_embeddings"]
    low_freq_wavelen, high_freq_wavelen = old_context / low, old_context / high
    wavelen = 2 * math.pi / inv_freq
    inv_freq_llama = torch.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
    smooth = (old_context / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * inv_freq_llama / factor + smooth * inv_freq_llama
    is_medium = ~(wavelen < high_freq_wavelen) * ~(wavelen > low_freq_wavelen)
    return torch.where(is_medium, smoothed, inv_freq_llama)


def rope(x, first_position, theta, scaling=None):
    """Rotate-half RoPE on [B, T, H, D] (LLaMA / Hugging Face form), frequencies scaled as
    rope_scaling says; theta 0 leaves x as is."""
    if theta <= 0:
        return x
    d = x.shape[-1]
    half = d // 2
    pos = torch.arange(first_position, first_position + x.shape[1], dtype=torch.float64)
    freq = inverse_frequencies(d, theta, scaling)
    ang = pos[:, None] * freq[None, :]                      # [T, D/2]
    cos, sin = ang.cos()[None, :, None, :], ang.sin()[None, :, None, :]
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


def attention_core(q, k, v, q_offset, causal):
    """softmax(q k^T / sqrt(d) + mask) v without RoPE; q [B, T, Hq, D], k and v [B, S, Hkv, D].

    GQA repeats each kv head for its group of query heads. Query t sits at position
    q_offset + t and, when causal, sees keys 0..q_offset + t; otherwise every key."""
    group = q.shape[2] // k.shape[2]
    k = k.repeat_interleave(group, dim=2).permute(0, 2, 1, 3)  # [B, H, S, D]
    v = v.repeat_interleave(group, dim=2).permute(0, 2, 1, 3)
    qh = q.permute(0, 2, 1, 3)                                # [B, H, T, D]
    t, s = q.shape[1], k.shape[2]
    out = torch.empty_like(qh)
    for a in range(0, t, QUERY_CHUNK):
        b = min(t, a + QUERY_CHUNK)
        keys = min(s, q_offset + b) if causal else s          # keys any query of the chunk sees
        scores = qh[:, :, a:b] @ k[:, :, :keys].transpose(-1, -2) / math.sqrt(q.shape[-1])
        if causal:
            qpos = torch.arange(q_offset + a, q_offset + b)[:, None]
            kpos = torch.arange(keys)[None, :]
            scores = scores.masked_fill(kpos > qpos, float("-inf"))
        out[:, :, a:b] = torch.softmax(scores, dim=-1) @ v[:, :, :keys]
    return out.permute(0, 2, 1, 3)


def attention(q, k, v, p):
    """attention_reference: RoPE on q at q_offset and on k from 0, then attention_core."""
    q = rope(q, p["q_offset"], p["rope_theta"], p.get("rope_scaling"))
    k = rope(k, 0, p["rope_theta"], p.get("rope_scaling"))
    return attention_core(q, k, v, p["q_offset"], p["causal"])


class AttentionLayer:
    """The attention layer with a KV cache: x wq, x wk, x wv per call, RoPE at the tokens'
    positions, keys and values appended to the cache, attention over the cache, then wo."""

    def __init__(self, wq, wk, wv, wo, p):
        self.w = (wq, wk, wv, wo)
        self.p = p
        self.dtype = p.get("dtype", "f32")
        self.k = self.v = None

    def __call__(self, x, position):
        wq, wk, wv, wo = self.w
        p, dt = self.p, self.dtype
        b, t, _ = x.shape
        hq, hkv, d = p["num_heads"], p["num_kv_heads"], p["head_dim"]
        scaling = p.get("rope_scaling")
        q = rope(projection(x, wq, dt).reshape(b, t, hq, d), position, p["rope_theta"], scaling)
        k = rope(projection(x, wk, dt).reshape(b, t, hkv, d), position, p["rope_theta"], scaling)
        v = projection(x, wv, dt).reshape(b, t, hkv, d)
        if self.k is None or position == 0:
            self.k, self.v = k, v
        else:
            assert self.k.shape[1] == position, "calls must follow each other"
            self.k, self.v = torch.cat([self.k, k], dim=1), torch.cat([self.v, v], dim=1)
        o = attention_core(q, self.k, self.v, position, p["causal"])
        return projection(o.reshape(b, t, hq * d), wo, dt)


def mlp_gelu(x, w1, w2, dtype="f32"):
    return projection(F.gelu(projection(x, w1, dtype)), w2, dtype)


def mlp_swiglu(x, w_gate, w_up, w_down, dtype="f32"):
    return projection(F.silu(projection(x, w_gate, dtype)) * projection(x, w_up, dtype), w_down, dtype)


def mlp_geglu(x, w_gate, w_up, w_down, dtype="f32"):
    """Gemma's MLP: transformers' gelu_pytorch_tanh on the gate."""
    return projection(F.gelu(projection(x, w_gate, dtype), approximate="tanh") * projection(x, w_up, dtype), w_down,
                      dtype)


def torch_bf16_mlp(op, inputs):
    """PyTorch's own MLP in torch.bfloat16 (every tensor bf16, as model.to(torch.bfloat16)
    runs it), widened to float64 for the comparison."""
    b = {name: t.float().to(torch.bfloat16) for name, t in inputs.items()}
    if op == "mlp_gelu":
        y = F.gelu(b["x"] @ b["w1"]) @ b["w2"]
    elif op == "mlp_geglu":
        y = (F.gelu(b["x"] @ b["w_gate"], approximate="tanh") * (b["x"] @ b["w_up"])) @ b["w_down"]
    else:
        y = (F.silu(b["x"] @ b["w_gate"]) * (b["x"] @ b["w_up"])) @ b["w_down"]
    return y.double()


def rmsnorm(x, weight, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight


def moe(x, router, gate, up, down, k, capacity_factor, renormalize, dtype="f32"):
    """A plain top-k MoE with SwiGLU experts (stored as `dtype`; the router stays fp32) and
    GShard-priority capacity over all of x's rows (one routing group): every token's first
    choice before any second, tokens in order. Returns y and the kept tokens per expert [1, E]."""
    t, e = x.shape[0], router.shape[1]
    probs = torch.softmax(x @ router, dim=-1)
    topv, topi = probs.topk(k, dim=-1)          # highest first
    if renormalize:
        topv = topv / topv.sum(-1, keepdim=True)
    capacity = math.ceil(capacity_factor * t * k / e) if capacity_factor > 0 else None
    load = [0] * e
    y = torch.zeros_like(x)
    for j in range(k):
        for i in range(t):
            ex = int(topi[i, j])
            if capacity is not None and load[ex] >= capacity:
                continue
            load[ex] += 1
            y[i] += topv[i, j] * mlp_swiglu(x[i], gate[ex], up[ex], down[ex], dtype)
    return y, torch.tensor(load, dtype=torch.float64)[None, :]


class Transformer:
    """Blocks of h = x + attn(rmsnorm(x)); x' = h + ffn(rmsnorm(h)) (ffn a SwiGLU MLP, or MoE
    when (layer + 1) % moe_every == 0), then the final rmsnorm when the model has one."""

    def __init__(self, d, name, p):
        self.p = p
        self.dtype = p.get("dtype", "f32")
        self.layers = []
        for layer in range(p["layers"]):
            def w(tensor):
                return load(d, f"{name}_l{layer}_{tensor}")
            moe_layer = p["moe_every"] > 0 and (layer + 1) % p["moe_every"] == 0
            ffn = [w(t) for t in (("router", "moe_gate", "moe_up", "moe_down") if moe_layer
                                  else ("w_gate", "w_up", "w_down"))]
            attn = AttentionLayer(w("wq"), w("wk"), w("wv"), w("wo"), p)
            self.layers.append((w("attn_norm"), attn, w("ffn_norm"), moe_layer, ffn))
        self.final_norm = load(d, f"{name}_final_norm") if p["final_norm"] else None

    def __call__(self, x, position):
        """Returns y and the tokens per expert summed over the MoE layers (None without)."""
        p, eps = self.p, self.p["norm_eps"]
        b, t, hidden = x.shape
        loads = None
        for attn_norm, attn, ffn_norm, moe_layer, ffn in self.layers:
            h = x + attn(rmsnorm(x, attn_norm, eps), position)
            n = rmsnorm(h, ffn_norm, eps).reshape(b * t, hidden)
            if moe_layer:
                f, counts = moe(n, *ffn, p["top_k"], p["capacity_factor"], p["renormalize"], self.dtype)
                loads = counts if loads is None else loads + counts
            else:
                f = mlp_swiglu(n, *ffn, self.dtype)
            x = h + f.reshape(b, t, hidden)
        if self.final_norm is not None:
            x = rmsnorm(x, self.final_norm, eps)
        return x, loads


def expected(d, case):
    """{(quantity, step, against): tensor} for one case of the manifest; `against` is "float64"
    (the op in float64 with the case's weight dtype) or "torch_bf16" (PyTorch's bf16 layer)."""
    name, op, p = case["name"], case["op"], case["params"]
    dtype = p.get("dtype", "f32")

    def inp(tensor):
        return load(d, f"{name}_{tensor}")
    if op == "lm_head":
        logits = projection(inp("x"), inp("weight"), dtype)
        return {("y", 0): logits, ("logits", 0): logits,
                ("greedy_ids", 0): torch.argmax(logits, dim=-1).double()[None, :]}
    if op in ("mlp_gelu", "mlp_swiglu", "mlp_geglu"):
        names = ("x", "w1", "w2") if op == "mlp_gelu" else ("x", "w_gate", "w_up", "w_down")
        inputs = {n: inp(n) for n in names}
        mlp = {"mlp_gelu": mlp_gelu, "mlp_swiglu": mlp_swiglu, "mlp_geglu": mlp_geglu}[op]
        out = {("y", 0): mlp(*inputs.values(), dtype)}
        if dtype == "bf16":
            own = torch_bf16_mlp(op, inputs)
            # On a CPU without AVX-512 BF16, PyTorch 1.13's bf16 matmul accumulates in bf16:
            # its own error against the float64 product of the same bf16 values is then larger
            # than the bound, and it is no yardstick (numesh is still held to the float64 one).
            own_error = float((own - out[("y", 0)]).abs().max() / out[("y", 0)].abs().max())
            out[("y", 0, "torch_bf16")] = own if own_error <= BOUNDS["torch_bf16"] else own_error
        return out
    if op == "rmsnorm":
        return {("y", 0): rmsnorm(inp("x"), inp("weight"), p["eps"])}
    if op == "attention":
        return {("y", 0): attention(inp("q"), inp("k"), inp("v"), p)}
    if op == "moe":
        y, counts = moe(*(inp(t) for t in ("x", "router", "gate", "up", "down")),
                        p["top_k"], p["capacity_factor"], p["renormalize"])
        return {("y", 0): y, ("tokens_per_expert", 0): counts}
    if op == "attention_layer":
        layer = AttentionLayer(inp("wq"), inp("wk"), inp("wv"), inp("wo"), p)
        return {("y", i): layer(inp(f"x_step{i}"), s["position"]) for i, s in enumerate(case["steps"])}
    if op == "transformer":
        model = Transformer(d, name, p)
        out = {}
        for i, s in enumerate(case["steps"]):
            y, loads = model(inp(f"x_step{i}"), s["position"])
            out[("y", i)] = y
            if loads is not None:
                out[("tokens_per_expert", i)] = loads
        return out
    raise ValueError(f"case {name}: unknown op {op!r}")


# --------------------------------------------------------------------------------------------
# The comparison.

def index_text(shape, flat):
    return "[" + ", ".join(str(int(i)) for i in np.unravel_index(int(flat), shape)) + "]"


def compare(got, want, bound):
    """(ok, relative error, text): non-finite patterns first, then the scaled error."""
    got, want = got.numpy(), want.numpy()
    if got.shape != want.shape:
        return False, math.inf, f"shape {list(got.shape)}, torch has {list(want.shape)}"
    gf, wf = np.isfinite(got), np.isfinite(want)
    # Where either is non-finite both must be, and equal (nan == nan counts as equal here).
    same_nonfinite = (~gf & ~wf) & ((got == want) | (np.isnan(got) & np.isnan(want)))
    mismatch = (gf != wf) | ((~gf & ~wf) & ~same_nonfinite)
    if mismatch.any():
        i = int(np.flatnonzero(mismatch)[0])
        return False, math.inf, (f"{int(mismatch.sum())} non-finite mismatches, first at "
                                 f"{index_text(got.shape, i)}: got {got.flat[i]}, torch {want.flat[i]}")
    both = gf & wf
    if not both.any():
        return True, 0.0, "no finite elements"
    finite = np.flatnonzero(both)
    diff = np.abs(got.flat[finite] - want.flat[finite])
    worst = int(finite[np.argmax(diff)])
    # The floor only keeps the division defined: against an all-zero want any error fails.
    scale = max(float(np.abs(want.flat[finite]).max()), float(np.finfo(np.float32).tiny))
    err = float(diff.max()) / scale
    text = (f"worst at {index_text(got.shape, worst)}: got {got.flat[worst]:.9g}, "
            f"torch {want.flat[worst]:.9g}, scale {scale:.4g}")
    if (~wf).any():
        text += f"; {int((~wf).sum())} non-finite elements, matched"
    return err <= bound, err, text


def main():
    d = sys.argv[1]
    with open(os.path.join(d, "cases.json")) as f:
        cases = json.load(f)["cases"]
    failed = 0
    worst = {}  # tolerance class -> (error, where)
    for case in cases:
        want = expected(d, case)
        for out in case["outputs"]:
            check = out["check"]
            if check not in BOUNDS:
                raise ValueError(f"case {case['name']}: unknown tolerance class {check!r}")
            bound = BOUNDS[check]
            against = out.get("against", "float64")
            key = (out["quantity"], out["step"]) if against == "float64" else (out["quantity"], out["step"], against)
            got = load(d, out["file"])
            label = f"{case['name']} {out['impl']} step {out['step']}"
            if out["quantity"] != "y":
                label += f" {out['quantity']}"
            if against != "float64":
                label += f" vs {against}"
            if isinstance(want[key], float):  # a yardstick this machine cannot give (expected())
                print(f"skip {label:70s} PyTorch's own bf16 result is {want[key]:.2e} off the float64 product "
                      f"of the same bf16 values (bound {bound:.0e}): its bf16 matmul accumulates in bf16 on "
                      "this CPU")
                continue
            ok, err, text = compare(got, want[key], bound)
            print(f"{'ok  ' if ok else 'FAIL'} {label:70s} {err:9.2e} (bound {bound:.0e}, {check}) {text}")
            if not ok:
                failed += 1
            if err > worst.get(check, (-1.0, ""))[0]:
                worst[check] = (err, label)
    print("\nlargest error per tolerance class:")
    for check, (err, label) in sorted(worst.items()):
        print(f"  {check:16s} {err:9.2e} <= {BOUNDS[check]:.0e}? {'yes' if err <= BOUNDS[check] else 'NO'}  ({label})")
    if failed:
        print(f"torch_check: {failed} outputs differ from PyTorch beyond their bounds")
        return 1
    print(f"torch_check: all outputs of {len(cases)} cases agree with PyTorch")
    return 0


if __name__ == "__main__":
    sys.exit(main())
