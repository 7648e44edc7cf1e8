#!/usr/bin/python3
"""Checks numesh's Hugging Face models end to end against a PyTorch forward.

    hf_model_check.py write DIR   # tiny random checkpoints in Hugging Face layout, and prompts
    hf_model_check.py check DIR   # compares what hf_model_check_main produced with PyTorch

`write` makes small models with random weights as transformers saves them (config.json,
model.safetensors or two shards with model.safetensors.index.json; the safetensors bytes
written here as the official writer lays them out, safetensors_check.serialize), and
DIR/cases.json naming each model, its prompts (2 sequences of 5 tokens) and the weight dtype
numesh stores. hf_model_check_main loads each one through HfConfig, SafetensorsCheckpoint and
CausalLm on several meshes and writes the prompt's logits, then greedy tokens and the logits
of each decode step. `check` recomputes everything with a forward written here from the
published architectures (Llama: RMSNorm, rotate-half RoPE with llama3 scaling, GQA, SwiGLU;
Mixtral: softmax router, top-2 renormalised, SwiGLU experts w1/w3/w2; Qwen2: q/k/v biases;
Qwen3: RMSNorm of each q and k head before RoPE; Qwen3-MoE: Qwen3's attention with experts
gate_proj/up_proj/down_proj; Llama's mlp_bias: biases on gate_proj, up_proj and down_proj;
Qwen2-MoE: Qwen2's attention, experts with the raw top-k softmax weights, a shared expert scaled
by sigmoid(x shared_expert_gate^T), and the dense MLP in the layers of mlp_only_layers; Gemma:
the embedding times sqrt(hidden_size), RMSNorms scaling by 1 + w, GeGLU with PyTorch's tanh
GELU (gelu_pytorch_tanh), head_dim apart from hidden / heads, one kv head, tied by default;
Phi-3: q, k and v as rows of one qkv_proj, gate and up of one gate_up_proj (chunked in two), a
sliding window wider than the prompts), in float64, and
compares: logits max|numesh - torch| / max|torch| within the case's bound, each greedy token
torch's argmax or tied with it within twice the bound (torch fed numesh's tokens),
and the perplexity numesh's perplexity() gives for a stream of 21 tokens in chunks of 8 against
llama.cpp's procedure applied here to the torch logits, relative error within the same bound.
With bf16-stored weights torch rounds the weights and every projection's input to bf16 as
numesh does (docs/ops.md, "Weight dtypes"); with GGML's q8_0, q4_0, q5_0, iq4_nl, q3_k, q4_k, q5_k, q6_k or iq4_xs
blocks it quantizes every matrix along its rows (tests/common/ggml_blocks.py, GGML's reference
quantizers) and every projection's input to 8 bits a block of 32, as numesh's block-format kernels
do.
Exit status: 0 all agree; 1 a mismatch; 2 torch or numpy missing (77 with
NUMESH_SKIP_TORCH_CHECKS=1, a reported skip).
"""
import json
import math
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "common"))
from safetensors_check import serialize  # noqa: E402  (also does the torch/numpy import check)
from errors import relative_max, within, worst  # noqa: E402  (NaN-propagating error measures)
from ggml_blocks import quantized_activations, stored_rows  # noqa: E402  (GGML's blocks in NumPy)

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

BATCH, PROMPT, NEW_TOKENS = 2, 5, 4
# The perplexity stream: 2 whole chunks of 8 tokens and 5 left over (left out), BOS id 1.
PERPLEXITY_TOKENS, PERPLEXITY_CONTEXT, BOS = 21, 8, 1
# max |numesh - torch| / max |torch| over logits: fp32 kernels against float64 (fp32 weights,
# or bf16 values read into fp32); bf16-stored weights add the activations' bf16 rounding, whose
# float64 twin can round to the other neighbour (torch_check.py's bf16_sharded).
# Block formats: torch quantizes its own float64 activations, numesh its fp32 ones; a value next
# to a code boundary can take the neighbouring code (a step of max|x| / 127 in its block).
BOUNDS = {"f32": 1e-4, "bf16": 4e-3, "q8_0": 2e-2, "q4_0": 2e-2, "q5_0": 2e-2, "iq4_nl": 2e-2, "q3_k": 2e-2, "q4_k": 2e-2,
          "q5_k": 2e-2, "q6_k": 2e-2, "iq4_xs": 2e-2}
BLOCK_FORMATS = ("q8_0", "q4_0", "q5_0", "iq4_nl", "q3_k", "q4_k", "q5_k", "q6_k", "iq4_xs")
# Q5_0 and IQ4_NL on a dense, a tied and an MoE model (Q5_0's kernel is Q4_0's with a fifth bit,
# IQ4_NL's Q8_0's on codes looked up from Q4_0's nibbles: the same steps).
BLOCKS_OF_32, K_QUANTS = ["q8_0", "q4_0"], ["q4_k", "q6_k"]
ALL_BLOCKS_OF_32 = BLOCKS_OF_32 + ["q5_0", "iq4_nl"]
# Q5_K and Q3_K on a dense and an MoE model (Q5_K's kernel is Q4_K's with a fifth bit, Q3_K's
# Q6_K's steps on 3-bit codes, IQ4_XS's IQ4_NL's codebook on Q4_K's sub-blocks of 32).
ALL_K_QUANTS = K_QUANTS + ["q5_k", "q3_k", "iq4_xs"]

LLAMA = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "vocab_size": 256, "hidden_size": 64,
         "intermediate_size": 96, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
         "head_dim": 16, "hidden_act": "silu", "max_position_embeddings": 128, "rms_norm_eps": 1e-5,
         "rope_theta": 500000.0, "attention_bias": False, "mlp_bias": False, "bos_token_id": 1, "eos_token_id": 2,
         # llama3 scaling with an original context of 64: every band is populated at d = 16.
         "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                          "original_max_position_embeddings": 64}}


def models():
    """(name, config, checkpoint dtype, shards, numesh stored dtypes)."""
    tied = dict(LLAMA, tie_word_embeddings=True)
    untied = dict(LLAMA, tie_word_embeddings=False, rope_scaling=None, rope_theta=10000.0)
    mixtral = dict(LLAMA, model_type="mixtral", architectures=["MixtralForCausalLM"], num_local_experts=4,
                   num_experts_per_tok=2, tie_word_embeddings=False, rope_scaling=None, rope_theta=1e6,
                   sliding_window=None)
    del mixtral["head_dim"]  # hidden / heads = 16, transformers' default
    # Qwen2: q/k/v biases (always), tied embeddings, theta 1e6; Qwen3: q/k RMSNorm per head,
    # head_dim 32 (not hidden / heads), no biases.
    qwen2 = dict(LLAMA, model_type="qwen2", architectures=["Qwen2ForCausalLM"], tie_word_embeddings=True,
                 rope_scaling=None, rope_theta=1e6, rms_norm_eps=1e-6, use_sliding_window=False)
    del qwen2["head_dim"]
    qwen3 = dict(LLAMA, model_type="qwen3", architectures=["Qwen3ForCausalLM"], tie_word_embeddings=False,
                 rope_scaling=None, rope_theta=1e6, rms_norm_eps=1e-6, head_dim=32, use_sliding_window=False)
    # Qwen3-MoE: q/k norms and MoE layers of mlp.gate / mlp.experts.E.*_proj, top-2 of 4
    # renormalised (norm_topk_prob).
    qwen3_moe = dict(qwen3, model_type="qwen3_moe", architectures=["Qwen3MoeForCausalLM"], num_experts=4,
                     num_experts_per_tok=2, moe_intermediate_size=48, norm_topk_prob=True, decoder_sparse_step=1,
                     mlp_only_layers=[])
    # Llama with mlp_bias: biases on the three MLP projections.
    llama_mlp_bias = dict(LLAMA, mlp_bias=True, tie_word_embeddings=False)
    # Qwen2-MoE: Qwen2's q/k/v biases; 3 layers, 1 dense (mlp_only_layers, intermediate_size
    # 96) between two MoE layers of top-2 of 4 experts with the raw softmax weights
    # (norm_topk_prob false) and a shared expert of 80, each with its sigmoid gate.
    qwen2_moe = dict(qwen2, model_type="qwen2_moe", architectures=["Qwen2MoeForCausalLM"], num_hidden_layers=3,
                     num_experts=4, num_experts_per_tok=2, moe_intermediate_size=48,
                     shared_expert_intermediate_size=80, norm_topk_prob=False, decoder_sparse_step=1,
                     mlp_only_layers=[1], tie_word_embeddings=False)
    # Gemma (transformers' GemmaForCausalLM): one kv head, head_dim 32 (4 x 32 = 128 query
    # columns against a hidden size of 64), hidden_act "gelu" ignored for hidden_activation, tied
    # by default (no tie_word_embeddings field).
    gemma = {"model_type": "gemma", "architectures": ["GemmaForCausalLM"], "vocab_size": 256, "hidden_size": 64,
             "intermediate_size": 96, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 1,
             "head_dim": 32, "hidden_act": "gelu", "hidden_activation": "gelu_pytorch_tanh",
             "max_position_embeddings": 128, "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "attention_bias": False,
             "bos_token_id": 2, "eos_token_id": 1, "pad_token_id": 0}
    # Phi-3 (transformers' Phi3ForCausalLM): fused qkv_proj (GQA 4/2 here: q 64 rows, k and v 32
    # each) and gate_up_proj, a sliding window wider than any context here.
    phi3 = dict(LLAMA, model_type="phi3", architectures=["Phi3ForCausalLM"], rope_scaling=None, rope_theta=10000.0,
                sliding_window=127, tie_word_embeddings=False, original_max_position_embeddings=128,
                resid_pdrop=0.0, embd_pdrop=0.0, attention_dropout=0.0)
    del phi3["head_dim"]
    # New cases go last: each case's random draws follow from its index.
    return [("llama_tied_f32", tied, torch.float32, 1, ["f32"]),
            ("llama_bf16_two_shards", untied, torch.bfloat16, 2, ["f32", "bf16"]),
            ("mixtral_f32", mixtral, torch.float32, 1, ["f32"]),
            ("qwen2_f32", qwen2, torch.float32, 1, ["f32"]),
            ("qwen3_bf16", qwen3, torch.bfloat16, 1, ["f32", "bf16"]),
            ("qwen3_moe_f32", qwen3_moe, torch.float32, 1, ["f32"]),
            ("llama_mlp_bias_f32", llama_mlp_bias, torch.float32, 1, ["f32"]),
            ("qwen2_moe_f32", qwen2_moe, torch.float32, 1, ["f32"]),
            # GGML's blocks quantized at load: every projection's inputs whole blocks of 32 on
            # every mesh (an intermediate of 128, 64 a device over tp2; Qwen3's 4 heads of 32).
            ("llama_blocks", dict(untied, intermediate_size=128), torch.float32, 2, ALL_BLOCKS_OF_32),
            ("qwen3_blocks", dict(qwen3, intermediate_size=128), torch.bfloat16, 1, BLOCKS_OF_32),
            ("qwen2_tied_blocks", dict(qwen2, intermediate_size=128), torch.float32, 1, ALL_BLOCKS_OF_32),
            # The experts in blocks too, their routers (and Qwen2-MoE's shared-expert gate) fp32.
            ("mixtral_blocks", dict(mixtral, intermediate_size=128), torch.float32, 1, ALL_BLOCKS_OF_32),
            ("qwen2_moe_blocks", dict(qwen2_moe, intermediate_size=128, moe_intermediate_size=64,
                                      shared_expert_intermediate_size=128), torch.bfloat16, 1,
             BLOCKS_OF_32),
            # GGML's K formats, super-blocks of 256: every projection's inputs whole super-blocks
            # on every mesh (hidden 256, 4 heads of 128, FFNs of 512: 256 a device on tp2).
            ("llama_k_blocks", dict(untied, hidden_size=256, head_dim=128, intermediate_size=512), torch.float32, 1,
             ALL_K_QUANTS),
            ("qwen3_moe_k_blocks", dict(qwen3_moe, hidden_size=256, head_dim=128, intermediate_size=512,
                                        moe_intermediate_size=512), torch.bfloat16, 1, K_QUANTS),
            ("gemma_bf16", gemma, torch.bfloat16, 1, ["f32", "bf16"]),
            ("gemma_blocks", dict(gemma, intermediate_size=128), torch.float32, 2, BLOCKS_OF_32),
            ("gemma_untied_f32", dict(gemma, tie_word_embeddings=False), torch.float32, 1, ["f32"]),
            ("phi3_bf16", phi3, torch.bfloat16, 1, ["f32", "bf16"]),
            ("phi3_blocks", dict(phi3, intermediate_size=128), torch.float32, 2, BLOCKS_OF_32),
            # A float16 checkpoint (the third source format) quantized at load, and read as is.
            ("llama_f16_blocks", dict(untied, intermediate_size=128), torch.float16, 1, ["f32"] + BLOCKS_OF_32),
            # Mixtral's experts in GGML's K formats (hidden 256, 4 heads of 128, experts of 512: 256 a
            # device on tp2).
            ("mixtral_k_blocks", dict(mixtral, hidden_size=256, head_dim=128,
                                      intermediate_size=512), torch.float32, 1, ALL_K_QUANTS)]


def ties_embeddings(c):
    """Whether the LM head is the embedding (transformers' default: Gemma's True, the others'
    False)."""
    return c.get("tie_word_embeddings", c["model_type"] == "gemma")


def sparse(c, layer):
    """True when the layer's feed-forward is a MoE block (transformers' rule: Mixtral every layer;
    Qwen-MoE every decoder_sparse_step-th layer not in mlp_only_layers)."""
    if c["model_type"] == "mixtral":
        return True
    if c["model_type"] not in ("qwen2_moe", "qwen3_moe"):
        return False
    return layer not in c.get("mlp_only_layers", []) and (layer + 1) % c.get("decoder_sparse_step", 1) == 0


def weights(c, dtype, seed):
    """Random weights in transformers' names and [out, in] layout."""
    g = torch.Generator().manual_seed(seed)
    h, f, v = c["hidden_size"], c["intermediate_size"], c["vocab_size"]
    d = c.get("head_dim", h // c["num_attention_heads"])
    q, kv = c["num_attention_heads"] * d, c["num_key_value_heads"] * d

    def lin(out, inp):
        return torch.randn(out, inp, generator=g) / math.sqrt(inp)

    def norm():  # Gemma's norms scale by 1 + w: its w near 0
        return (0.0 if c["model_type"] == "gemma" else 1.0) + 0.1 * torch.randn(h, generator=g)
    # Gemma multiplies its embedding by sqrt(hidden) and ties its head to it: rows of norm ~1, as
    # its own checkpoints' are, keep the logits (and its greedy tokens) in a lively range.
    embedding_scale = 1.0 / math.sqrt(h) if c["model_type"] == "gemma" else 1.0
    t = {"model.embed_tokens.weight": embedding_scale * torch.randn(v, h, generator=g), "model.norm.weight": norm()}
    for layer in range(c["num_hidden_layers"]):
        p = f"model.layers.{layer}."
        t.update({p + "input_layernorm.weight": norm(), p + "post_attention_layernorm.weight": norm(),
                  p + "self_attn.q_proj.weight": lin(q, h), p + "self_attn.k_proj.weight": lin(kv, h),
                  p + "self_attn.v_proj.weight": lin(kv, h), p + "self_attn.o_proj.weight": lin(h, q)})
        if c["model_type"] == "phi3":  # Phi3Attention's one qkv_proj: q's rows, then k's, then v's
            t[p + "self_attn.qkv_proj.weight"] = torch.cat(
                [t.pop(p + f"self_attn.{x}_proj.weight") for x in "qkv"])
        if c["model_type"] in ("qwen2", "qwen2_moe"):  # Qwen2Attention: bias=True on q, k and v
            t.update({p + "self_attn.q_proj.bias": 0.5 * torch.randn(q, generator=g),
                      p + "self_attn.k_proj.bias": 0.5 * torch.randn(kv, generator=g),
                      p + "self_attn.v_proj.bias": 0.5 * torch.randn(kv, generator=g)})
        if c["model_type"] in ("qwen3", "qwen3_moe"):  # Qwen3RMSNorm over head_dim on q and k
            t.update({p + "self_attn.q_norm.weight": 1.0 + 0.1 * torch.randn(d, generator=g),
                      p + "self_attn.k_norm.weight": 1.0 + 0.1 * torch.randn(d, generator=g)})
        if c["model_type"] == "mixtral":
            t[p + "block_sparse_moe.gate.weight"] = lin(c["num_local_experts"], h)
            for e in range(c["num_local_experts"]):
                ep = f"{p}block_sparse_moe.experts.{e}."
                t.update({ep + "w1.weight": lin(f, h), ep + "w3.weight": lin(f, h), ep + "w2.weight": lin(h, f)})
        elif sparse(c, layer):  # Qwen-MoE
            fe = c["moe_intermediate_size"]
            t[p + "mlp.gate.weight"] = lin(c["num_experts"], h)
            for e in range(c["num_experts"]):
                ep = f"{p}mlp.experts.{e}."
                t.update({ep + "gate_proj.weight": lin(fe, h), ep + "up_proj.weight": lin(fe, h),
                          ep + "down_proj.weight": lin(h, fe)})
            if c["model_type"] == "qwen2_moe":  # Qwen2MoeSparseMoeBlock's shared expert and its gate
                fs, sp = c["shared_expert_intermediate_size"], f"{p}mlp.shared_expert."
                t.update({sp + "gate_proj.weight": lin(fs, h), sp + "up_proj.weight": lin(fs, h),
                          sp + "down_proj.weight": lin(h, fs), p + "mlp.shared_expert_gate.weight": lin(1, h)})
        else:
            t.update({p + "mlp.gate_proj.weight": lin(f, h), p + "mlp.up_proj.weight": lin(f, h),
                      p + "mlp.down_proj.weight": lin(h, f)})
            if c["model_type"] == "phi3":  # Phi3MLP's gate_up_proj: gate's rows, then up's
                t[p + "mlp.gate_up_proj.weight"] = torch.cat(
                    [t.pop(p + "mlp.gate_proj.weight"), t.pop(p + "mlp.up_proj.weight")])
            if c.get("mlp_bias"):  # LlamaMLP: bias=config.mlp_bias on all three
                t.update({p + "mlp.gate_proj.bias": 0.5 * torch.randn(f, generator=g),
                          p + "mlp.up_proj.bias": 0.5 * torch.randn(f, generator=g),
                          p + "mlp.down_proj.bias": 0.5 * torch.randn(h, generator=g)})
    if not ties_embeddings(c):
        t["lm_head.weight"] = lin(v, h)
    return {name: w.to(dtype) for name, w in t.items()}


def save(d, c, tensors, shards):
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "config.json"), "w") as out:
        json.dump(c, out, indent=1)
    names = sorted(tensors)
    if shards == 1:
        with open(os.path.join(d, "model.safetensors"), "wb") as out:
            out.write(serialize(tensors, {"format": "pt"}))
        return
    weight_map = {}
    for s in range(shards):
        part = {n: tensors[n] for n in names[s::shards]}
        file = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
        with open(os.path.join(d, file), "wb") as out:
            out.write(serialize(part, {"format": "pt"}))
        weight_map.update({n: file for n in part})
    with open(os.path.join(d, "model.safetensors.index.json"), "w") as out:
        json.dump({"metadata": {"total_size": 0}, "weight_map": weight_map}, out, indent=1)


def write(d):
    cases = []
    for i, (name, c, dtype, shards, stored) in enumerate(models()):
        save(os.path.join(d, name), c, weights(c, dtype, 1000 + i), shards)
        g = torch.Generator().manual_seed(77 + i)
        prompt = torch.randint(3, c["vocab_size"], (BATCH, PROMPT), generator=g).tolist()
        stream = torch.randint(3, c["vocab_size"], (PERPLEXITY_TOKENS,),
                               generator=torch.Generator().manual_seed(500 + i)).tolist()
        cases.append({"name": name, "prompt": prompt, "new_tokens": NEW_TOKENS, "stored": stored,
                      "perplexity": {"tokens": stream, "context": PERPLEXITY_CONTEXT, "bos": BOS}})
    with open(os.path.join(d, "cases.json"), "w") as out:
        json.dump({"cases": cases}, out, indent=1)


# --------------------------------------------------------------------------------------------
# The forward, in float64, from the published architectures.

class Model:
    def __init__(self, d, stored):
        with open(os.path.join(d, "config.json")) as f:
            self.c = json.load(f)
        self.stored = stored
        self.router = None  # a list: every MoE layer's (probabilities, top-k choices) are appended
        self.t = {}
        self.stored_weights = {}  # w()'s results by name
        for file in sorted(os.listdir(d)):
            if file.endswith(".safetensors"):
                self.t.update(read_safetensors(os.path.join(d, file)))

    def w(self, name):
        """A weight as numesh stores it: bf16 storage rounds it (exact when already bf16); a block
        format quantizes each row (a linear's inputs, an embedding's hidden) and dequantizes.
        Kept once made: the K formats' quantizers search each block, and every forward reads
        every weight."""
        if name not in self.stored_weights:
            x = self.t[name].double()
            if self.stored in BLOCK_FORMATS:
                x = torch.from_numpy(stored_rows(x.float().numpy(), self.stored)).double()
            elif self.stored == "bf16":
                x = x.float().to(torch.bfloat16).double()
            self.stored_weights[name] = x
        return self.stored_weights[name]

    def linear(self, x, name, bias=None):
        if self.stored == "bf16":
            x = x.float().to(torch.bfloat16).double()
        elif self.stored in BLOCK_FORMATS:
            rows = x.reshape(-1, x.shape[-1]).float().numpy()
            x = torch.from_numpy(quantized_activations(rows)).double().reshape(x.shape)
        y = x @ self.w(name).T
        return y + self.t[bias].double() if bias in self.t else y

    def rmsnorm(self, x, name, offset=None):
        """x / rms(x) * w; Gemma's block and final norms (GemmaRMSNorm) * (1 + w)."""
        if offset is None:
            offset = 1.0 if self.c["model_type"] == "gemma" else 0.0
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.c["rms_norm_eps"]) * (
            offset + self.t[name].double())

    def inv_freq(self, d):
        c = self.c
        inv = 1.0 / (c["rope_theta"] ** (torch.arange(0, d, 2, dtype=torch.float64) / d))
        s = c.get("rope_scaling")
        if not s:
            return inv
        factor, low, high = s["factor"], s["low_freq_factor"], s["high_freq_factor"]
        old = s["original_max_position_embeddings"]
        wavelen = 2 * math.pi / inv
        llama = torch.where(wavelen > old / low, inv / factor, inv)
        smooth = (old / wavelen - low) / (high - low)
        smoothed = (1 - smooth) * llama / factor + smooth * llama
        medium = ~(wavelen < old / high) * ~(wavelen > old / low)
        return torch.where(medium, smoothed, llama)

    def rope(self, x, positions):
        d = x.shape[-1]
        ang = positions[:, None].double() * self.inv_freq(d)[None, :]
        cos, sin = torch.cat([ang.cos(), ang.cos()], -1), torch.cat([ang.sin(), ang.sin()], -1)
        rotated = torch.cat([-x[..., d // 2:], x[..., :d // 2]], -1)
        return x * cos[None, :, None, :] + rotated * sin[None, :, None, :]

    def mlp(self, x, p):
        """SwiGLU (Gemma: GeGLU, gelu_pytorch_tanh); each projection's bias added when the
        checkpoint has it (Llama's mlp_bias)."""
        if p + "gate_up_proj.weight" in self.t:  # Phi-3: one projection, chunked
            gate, up = self.linear(x, p + "gate_up_proj.weight").chunk(2, dim=-1)
        else:
            gate = self.linear(x, p + "gate_proj.weight", p + "gate_proj.bias")
            up = self.linear(x, p + "up_proj.weight", p + "up_proj.bias")
        act = F.gelu(gate, approximate="tanh") if self.c["model_type"] == "gemma" else F.silu(gate)
        return self.linear(act * up, p + "down_proj.weight", p + "down_proj.bias")

    def moe(self, x, p):
        """Mixtral's block_sparse_moe (w1/w3/w2, always renormalised) or Qwen-MoE's mlp
        (gate_proj/up_proj/down_proj, renormalised when norm_topk_prob; Qwen2-MoE adds its shared
        expert scaled by sigmoid(x shared_expert_gate^T))."""
        mixtral = self.c["model_type"] == "mixtral"
        probs = torch.softmax(x @ self.t[p + "gate.weight"].double().T, dim=-1)  # the router stays fp32
        top, idx = probs.topk(self.c["num_experts_per_tok"], dim=-1)
        if self.router is not None:
            self.router.append((probs, idx))
        if mixtral or self.c.get("norm_topk_prob"):
            top = top / top.sum(-1, keepdim=True)
        names = ("w1", "w3", "w2") if mixtral else ("gate_proj", "up_proj", "down_proj")
        y = torch.zeros_like(x)
        for e in range(self.c["num_local_experts" if mixtral else "num_experts"]):
            ep = f"{p}experts.{e}."
            out = self.linear(F.silu(self.linear(x, ep + names[0] + ".weight")) *
                              self.linear(x, ep + names[1] + ".weight"), ep + names[2] + ".weight")
            weight = (top * (idx == e)).sum(-1, keepdim=True)
            y = y + weight * out
        if p + "shared_expert_gate.weight" in self.t:  # the gate stays fp32, as the router
            gate = torch.sigmoid(x @ self.t[p + "shared_expert_gate.weight"].double().T)
            y = y + gate * self.mlp(x, p + "shared_expert.")
        return y

    def logits(self, ids):
        """Logits [B, T, V] of whole sequences ids [B, T] from position 0."""
        c = self.c
        b, t = ids.shape
        hq, hkv = c["num_attention_heads"], c["num_key_value_heads"]
        d = c.get("head_dim", c["hidden_size"] // hq)
        x = self.w("model.embed_tokens.weight")[ids]
        if c["model_type"] == "gemma":  # GemmaModel's normalizer
            x = x * math.sqrt(c["hidden_size"])
        pos = torch.arange(t)
        mask = torch.ones(t, t, dtype=torch.bool).tril()
        for layer in range(c["num_hidden_layers"]):
            p = f"model.layers.{layer}."
            n = self.rmsnorm(x, p + "input_layernorm.weight")
            a = p + "self_attn."
            if a + "qkv_proj.weight" in self.t:  # Phi-3: one projection, split by rows
                q, k, v = self.linear(n, a + "qkv_proj.weight").split([hq * d, hkv * d, hkv * d], dim=-1)
            else:
                q = self.linear(n, a + "q_proj.weight", a + "q_proj.bias")
                k = self.linear(n, a + "k_proj.weight", a + "k_proj.bias")
                v = self.linear(n, a + "v_proj.weight", a + "v_proj.bias")
            q, k, v = q.reshape(b, t, hq, d), k.reshape(b, t, hkv, d), v.reshape(b, t, hkv, d)
            if a + "q_norm.weight" in self.t:  # Qwen3: RMSNorm of each head before RoPE
                q, k = self.rmsnorm(q, a + "q_norm.weight", 0.0), self.rmsnorm(k, a + "k_norm.weight", 0.0)
            q, k = self.rope(q, pos), self.rope(k, pos)
            k, v = k.repeat_interleave(hq // hkv, 2), v.repeat_interleave(hq // hkv, 2)
            s = torch.einsum("bthd,bshd->bhts", q, k) / math.sqrt(d)
            s = s.masked_fill(~mask, float("-inf"))
            o = torch.einsum("bhts,bshd->bthd", torch.softmax(s, -1), v).reshape(b, t, hq * d)
            x = x + self.linear(o, p + "self_attn.o_proj.weight")
            n = self.rmsnorm(x, p + "post_attention_layernorm.weight")
            if c["model_type"] == "mixtral":
                x = x + self.moe(n, p + "block_sparse_moe.")
            elif sparse(c, layer):
                x = x + self.moe(n, p + "mlp.")
            else:
                x = x + self.mlp(n, p + "mlp.")
        x = self.rmsnorm(x, "model.norm.weight")
        head = "model.embed_tokens.weight" if ties_embeddings(c) else "lm_head.weight"
        return self.linear(x, head)


def read_safetensors(path):
    with open(path, "rb") as f:
        data = f.read()
    n = int.from_bytes(data[:8], "little")
    header = json.loads(data[8:8 + n])
    out = {}
    for name, e in header.items():
        if name == "__metadata__":
            continue
        b, end = e["data_offsets"]
        raw = data[8 + n + b:8 + n + end]
        if e["dtype"] == "BF16":
            t = torch.from_numpy(np.frombuffer(raw, dtype="<i2").copy()).view(torch.bfloat16)
        elif e["dtype"] == "F16":
            t = torch.from_numpy(np.frombuffer(raw, dtype="<f2").copy())
        else:
            t = torch.from_numpy(np.frombuffer(raw, dtype="<f4").copy())
        out[name] = t.reshape(e["shape"]).double()
    return out


def perplexity(model, p):
    """llama.cpp's perplexity, from the published procedure: the stream cut into whole chunks of
    `context` tokens, each run from position 0 with its first token replaced by BOS, token j + 1
    scored from the logits at j for j in [context / 2, context - 1); exp of the mean NLL."""
    n, tokens = p["context"], p["tokens"]
    nll = []
    for c in range(len(tokens) // n):
        chunk = torch.tensor(tokens[c * n:(c + 1) * n])
        chunk[0] = p["bos"]
        log_probs = torch.log_softmax(model.logits(chunk[None])[0], dim=-1)
        nll += [-float(log_probs[j, chunk[j + 1]]) for j in range(n // 2, n - 1)]
    return math.exp(sum(nll) / len(nll))


def check(d):
    with open(os.path.join(d, "cases.json")) as f:
        cases = json.load(f)["cases"]
    with open(os.path.join(d, "results.json")) as f:
        results = json.load(f)["results"]
    failed = 0
    models = {}  # one Model a case and stored format: its stored weights are made once
    for r in results:
        case = next(c for c in cases if c["name"] == r["name"])
        key = (r["name"], r["stored"])
        if key not in models:
            models[key] = Model(os.path.join(d, r["name"]), r["stored"])
        model = models[key]
        prompt = torch.tensor(case["prompt"])
        bound = BOUNDS[r["stored"]]
        label = f"{r['name']} ({r['stored']} weights) on {r['mesh']}"
        # The prompt's logits, every position.
        want = model.logits(prompt).reshape(BATCH * PROMPT, -1)
        got = torch.from_numpy(np.load(os.path.join(d, r["prompt_logits"]))).double()
        err = relative_max(got, want)
        ok = within(err, bound)
        # Greedy generation: torch's own loop over whole sequences, fed numesh's tokens. Each of
        # numesh's tokens must be torch's argmax, or tie with it within twice the bound (torch's
        # logit of numesh's token no further below the row's largest than 2 bound max |logit|,
        # each of the two logits within the bound): the bound's own rounding (a block's
        # neighbouring activation code) can tip a near tie, and the sequences would then part,
        # every later step comparing different texts.
        seq = prompt.clone()
        steps = []
        want_ids = []
        got_ids = torch.tensor(r["greedy_ids"])
        same_ids = tuple(got_ids.shape) == (BATCH, case["new_tokens"])
        for i in range(case["new_tokens"] if same_ids else 0):
            logits = model.logits(seq)[:, -1]
            steps.append(logits)
            got = got_ids[:, i]
            gap = logits.max(-1).values - logits.gather(-1, got[:, None])[:, 0]
            same_ids = same_ids and bool((gap <= 2 * bound * logits.abs().max(-1).values).all())
            want_ids.append(logits.argmax(-1).tolist())
            seq = torch.cat([seq, got[:, None]], 1)
        want_ids = [list(row) for row in zip(*want_ids)]
        # Each decode step's logits, on the same tokens.
        step_err = (worst(relative_max(np.load(os.path.join(d, file)), steps[i + 1])
                          for i, file in enumerate(r["step_logits"]))
                    if len(steps) == len(r["step_logits"]) + 1 else math.inf)
        ok = ok and same_ids and within(step_err, bound)
        # Perplexity over the case's stream: numesh's perplexity() against the procedure above.
        want_ppl = perplexity(model, case["perplexity"])
        ppl_err = abs(r["perplexity"] - want_ppl) / want_ppl
        ok = ok and within(ppl_err, bound)
        failed += not ok
        print(f"{'ok  ' if ok else 'FAIL'} {label:55s} prompt logits {err:.2e}, decode logits {step_err:.2e} "
              f"(bound {bound:.0e}); greedy {r['greedy_ids']} {'~' if same_ids else '!~'} torch {want_ids}; perplexity "
              f"{r['perplexity']:.6g} vs torch {want_ppl:.6g} ({ppl_err:.1e})")
    if failed:
        print(f"hf_model_check: {failed} of {len(results)} runs differ from PyTorch")
        return 1
    print(f"hf_model_check: all {len(results)} runs agree with PyTorch")
    return 0


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] not in ("write", "check"):
        print("usage: hf_model_check.py write|check DIR")
        sys.exit(2)
    if sys.argv[1] == "write":
        write(sys.argv[2])
        sys.exit(0)
    sys.exit(check(sys.argv[2]))
