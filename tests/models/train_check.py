#!/usr/bin/python3
"""Checks whole training runs of numesh against the same runs in PyTorch, float64.

    train_check.py write DIR   # tiny random Llama checkpoints, training data, the run's options
    train_check.py check DIR   # trains each in PyTorch and compares with what train_check_main did

`write` makes tiny Llama checkpoints (untied with llama3 RoPE scaling, and tied) and a tiny
Mixtral (top-2 of 4 experts in every block; once more with the router's load-balancing loss),
a Qwen2 (q/k/v biases), a Qwen3 (per-head q/k norms), a Llama with mlp_bias, a Qwen2-MoE (a
shared expert behind its sigmoid gate beside the routed experts, and a dense layer) and a Gemma
(GeGLU, norms of 1 + w, the embedding scaled by sqrt(hidden)) and a Phi-3 (fused qkv_proj and
gate_up_proj, saved fused) in Hugging Face layout, an int32 .npy of 6 rows of T + 1 ids, and DIR/cases.json with the optimizer's options
(AdamW with weight decay, clipping that bites, warm-up then cosine). train_check_main trains each
with numesh's CausalLmTrainer on many meshes (and once stopped halfway, saved and resumed) and
saves the losses and the final checkpoint. `check` trains the same model on the same rows in the
same order in float64 (hf_model_check's Llama and Mixtral forwards, torch autograd, torch.optim.AdamW,
torch.nn.utils.clip_grad_norm_) and compares: each step's loss within 1e-5 relative, each step's
gradient norm before clipping within 1e-5 relative, each final weight within 1e-3 relative
(Frobenius), tensor by tensor; a NaN anywhere fails. The schedule has no warm-up, so that the
first AdamW step moves the weights (transformers' warm-up runs step 0 at rate 0; the warm-up
itself is checked by ops_optimizer_matches_pytorch).
Exit status: 0 all agree; 1 a mismatch; 2 torch or numpy missing (77 with
NUMESH_SKIP_TORCH_CHECKS=1, a reported skip).
"""
import json
import math
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "common"))
from errors import relative_scalar, within, worst  # noqa: E402  (NaN-propagating error measures)
from hf_model_check import LLAMA, Model, read_safetensors, save, weights  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

# Measured on the cases below: losses 2.5e-7, gradient norms ~1e-6, weights 1.5e-4 (fp32 against
# float64 over 12 steps).
LOSS_BOUND, NORM_BOUND, WEIGHT_BOUND = 1e-5, 1e-5, 1e-3
OPTIONS = {"batch": 4, "tokens": 16, "steps": 12, "lr": 3e-3, "beta1": 0.9, "beta2": 0.95, "eps": 1e-8,
           "weight_decay": 0.1, "clip": 1.0, "warmup": 0, "schedule": "cosine"}


def models():
    """(name, config, whether its blocks are mixtures of experts)."""
    untied = dict(LLAMA, tie_word_embeddings=False)
    tied = dict(LLAMA, tie_word_embeddings=True, rope_scaling=None, rope_theta=10000.0)
    # Mixtral: every block a top-2 of 4 experts, renormalised, dropless.
    mixtral = dict(LLAMA, model_type="mixtral", architectures=["MixtralForCausalLM"], num_local_experts=4,
                   num_experts_per_tok=2, tie_word_embeddings=False, rope_scaling=None, rope_theta=1e6,
                   sliding_window=None)
    del mixtral["head_dim"]
    # Mixtral trained with the router's load-balancing loss (transformers' output_router_logits),
    # its coefficient 20 times the default so that it moves the routers.
    mixtral_aux = dict(mixtral, output_router_logits=True, router_aux_loss_coef=0.02)
    # Qwen2: q/k/v biases, tied; Qwen3: per-head q/k RMSNorm, head_dim 32 (not hidden / heads).
    qwen2 = dict(LLAMA, model_type="qwen2", architectures=["Qwen2ForCausalLM"], tie_word_embeddings=True,
                 rope_scaling=None, rope_theta=1e6, rms_norm_eps=1e-6, use_sliding_window=False)
    del qwen2["head_dim"]
    qwen3 = dict(LLAMA, model_type="qwen3", architectures=["Qwen3ForCausalLM"], tie_word_embeddings=False,
                 rope_scaling=None, rope_theta=1e6, rms_norm_eps=1e-6, head_dim=32, use_sliding_window=False)
    # Llama with mlp_bias: biases on the three MLP projections.
    llama_mlp_bias = dict(untied, mlp_bias=True)
    # Qwen2-MoE: Qwen2's q/k/v biases; 3 layers, the middle one dense (mlp_only_layers), the
    # others top-2 of 4 experts with the raw softmax weights (norm_topk_prob false) and a shared
    # expert of 80 behind its sigmoid gate, all trained.
    qwen2_moe = dict(qwen2, model_type="qwen2_moe", architectures=["Qwen2MoeForCausalLM"], num_hidden_layers=3,
                     num_experts=4, num_experts_per_tok=2, moe_intermediate_size=48,
                     shared_expert_intermediate_size=80, norm_topk_prob=False, decoder_sparse_step=1,
                     mlp_only_layers=[1], tie_word_embeddings=False)
    # Gemma: GeGLU, norms of 1 + w (w trained and decayed toward 0), the embedding times
    # sqrt(hidden), one kv head, tied by default.
    gemma = dict(LLAMA, model_type="gemma", architectures=["GemmaForCausalLM"], num_key_value_heads=1,
                 head_dim=32, hidden_act="gelu", hidden_activation="gelu_pytorch_tanh", rope_scaling=None,
                 rope_theta=10000.0, rms_norm_eps=1e-6)
    # Phi-3: fused qkv_proj and gate_up_proj, trained and saved fused.
    phi3 = dict(LLAMA, model_type="phi3", architectures=["Phi3ForCausalLM"], rope_scaling=None, rope_theta=10000.0,
                sliding_window=127, tie_word_embeddings=False)
    del phi3["head_dim"]
    # New cases go last: each case's random draws follow from its index.
    return [("llama", untied, False), ("llama_tied", tied, False), ("mixtral", mixtral, True),
            ("mixtral_aux", mixtral_aux, True), ("qwen2", qwen2, False), ("qwen3", qwen3, False),
            ("llama_mlp_bias", llama_mlp_bias, False), ("qwen2_moe", qwen2_moe, True), ("gemma", gemma, False),
            ("phi3", phi3, False)]


def write(d):
    cases = []
    for i, (name, c, moe) in enumerate(models()):
        save(os.path.join(d, name), c, weights(c, torch.float32, 2000 + i), 1)
        g = torch.Generator().manual_seed(300 + i)
        data = torch.randint(0, c["vocab_size"], (6, OPTIONS["tokens"] + 1), generator=g).numpy().astype("<i4")
        np.save(os.path.join(d, name, "data.npy"), data)
        cases.append({"name": name, "moe": moe})
    with open(os.path.join(d, "cases.json"), "w") as out:
        json.dump({"cases": cases, "options": OPTIONS}, out, indent=1)


def lr_at(o, k):
    if k < o["warmup"]:
        return o["lr"] * k / max(1, o["warmup"])
    if o["schedule"] == "constant":
        return o["lr"]
    progress = min(1.0, (k - o["warmup"]) / max(1, o["steps"] - o["warmup"]))
    return o["lr"] * max(0.0, 0.5 * (1.0 + math.cos(math.pi * progress)))


def load_balancing_loss(router, experts, k):
    """transformers' load_balancing_loss_func (no attention mask) over every MoE layer's router
    probabilities and top-k choices, concatenated."""
    probs = torch.cat([p.reshape(-1, experts) for p, _ in router])
    chosen = torch.cat([i.reshape(-1, k) for _, i in router])
    tokens_per_expert = F.one_hot(chosen, experts).double().mean(0)
    return experts * (tokens_per_expert * probs.mean(0)[None]).sum()


def train(d, o):
    """The run in float64: losses and gradient norms per step, and the final weights by name."""
    m = Model(d, "f32")
    params = {name: torch.nn.Parameter(t.double()) for name, t in m.t.items()}
    m.t = params
    data = torch.from_numpy(np.load(os.path.join(d, "data.npy")).astype(np.int64))
    opt = torch.optim.AdamW(list(params.values()), lr=o["lr"], betas=(o["beta1"], o["beta2"]), eps=o["eps"],
                            weight_decay=o["weight_decay"])
    b, losses, norms = o["batch"], [], []
    for k in range(o["steps"]):
        rows = data[[(k * b + r) % data.shape[0] for r in range(b)]]
        m.router = [] if m.c.get("output_router_logits") else None
        logits = m.logits(rows[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), rows[:, 1:].reshape(-1))
        if m.router is not None:
            aux = load_balancing_loss(m.router, m.c["num_local_experts"], m.c["num_experts_per_tok"])
            loss = loss + m.c["router_aux_loss_coef"] * aux
        opt.zero_grad()
        loss.backward()
        norms.append(float(torch.nn.utils.clip_grad_norm_(list(params.values()), o["clip"])))
        for group in opt.param_groups:
            group["lr"] = lr_at(o, k)
        opt.step()
        losses.append(loss.item())
    return losses, norms, {name: p.detach() for name, p in params.items()}


def check(d):
    with open(os.path.join(d, "cases.json")) as f:
        spec = json.load(f)
    with open(os.path.join(d, "results.json")) as f:
        results = json.load(f)["results"]
    o, failed, runs = spec["options"], 0, 0
    for case in spec["cases"]:
        name = case["name"]
        want_losses, want_norms, want = train(os.path.join(d, name), o)
        for r in (r for r in results if r["case"] == name):
            runs += 1
            got = read_safetensors(os.path.join(d, r["checkpoint"], "model.safetensors"))
            loss_err = worst(relative_scalar(g, w) for g, w in zip(r["losses"], want_losses))
            norm_err = worst(relative_scalar(g, w) for g, w in zip(r["grad_norms"], want_norms))
            problems = []
            if len(r["losses"]) != len(want_losses) or not within(loss_err, LOSS_BOUND):
                problems.append(f"losses {r['losses']} against torch {want_losses}")
            if len(r["grad_norms"]) != len(want_norms) or not within(norm_err, NORM_BOUND):
                problems.append(f"gradient norms {r['grad_norms']} against torch {want_norms}")
            if sorted(got) != sorted(want):
                problems.append(f"tensors {sorted(set(got) ^ set(want))} differ between the checkpoints")
            weight_errs = {t: float((got[t] - want[t]).norm() / want[t].norm()) for t in want if t in got}
            weight_err = worst(weight_errs.values())
            worst_tensor = max(weight_errs, key=lambda t: (math.isnan(weight_errs[t]), weight_errs[t]), default="")
            if not within(weight_err, WEIGHT_BOUND):
                problems.append(f"weight {worst_tensor} off by {weight_err:.2e}")
            status = "FAILED" if problems else "ok"
            print(f"{status} {name} on {r['mesh']}: {len(r['losses'])} steps, losses {r['losses'][0]:.5f} .. "
                  f"{r['losses'][-1]:.5f}, max loss error {loss_err:.2e} (bound {LOSS_BOUND}), gradient norm "
                  f"error {norm_err:.2e} (bound {NORM_BOUND}), final weights max error {weight_err:.2e} "
                  f"({worst_tensor}; bound {WEIGHT_BOUND})")
            for p in problems:
                print("   ", p)
            failed += bool(problems)
    if failed:
        print(f"train_check: {failed} of {runs} runs differ from PyTorch")
        return 1
    print(f"train_check: all {runs} runs train as PyTorch does")
    return 0


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] not in ("write", "check"):
        print(__doc__)
        sys.exit(2)
    if sys.argv[1] == "write":
        write(sys.argv[2])
        sys.exit(0)
    sys.exit(check(sys.argv[2]))
