"""GGUF files against the safetensors checkpoints they were converted from.

`write DIR`: tiny Hugging Face checkpoints of every architecture numesh reads (hf_model_check.py's
cases, the same random weights), each converted by gguf_writer.py (written from the GGUF
specification and llama.cpp's converter, independent of numesh: its names, stacked experts and
the Q/K row permutation of Llama-family files) to GGUF files in F32, F16, BF16, Q8_0 and Q4_0 (and Q5_0 and IQ4_NL for three)
(Q3_K, Q4_K, Q5_K, Q6_K and llama.cpp's Q3_K_M, Q4_K_M and Q5_K_M mixtures where the rows are
whole super-blocks).
gguf_check_main then loads each file through GgufCheckpoint and the checkpoint it came from
through SafetensorsCheckpoint, stored in the file's format (a mixture's matrices each in its
own, as the file has it), on meshes of 1, 2 and 4 devices, and compares the configs, the
prompt's logits bit for bit and the greedy tokens. Quantizing at load (numesh) and in the writer (GGML's
reference quantizers, ggml_blocks.py) give the same bytes, so the two must be identical; and
hf_model_check compares the safetensors path with the float64 PyTorch forward over the same
(dequantized) weights.

gguf_check_main also writes each checkpoint in each format with numesh's own GGUF writer
(write_gguf, `numesh convert`) and loads it back (the same bits again); `check` then compares
that file with the script's, read by gguf_writer.py's independent reader: the same tensors, types,
shapes and bytes, and the same values for the keys both write.

`check DIR`: reads gguf_check_main's results.json and fails on any difference.
"""
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
try:
    import numpy as np
    import torch
    import hf_model_check as hf
    import gguf_writer
except ImportError as e:  # torch_check.cmake's rule: 77 for a missing module
    print(f"gguf_check: missing Python module: {e}")
    sys.exit(77)

FLOATS = ["f32", "f16", "bf16"]
BLOCKS = FLOATS + ["q8_0", "q4_0"]
WITH_Q5_0 = BLOCKS + ["q5_0", "iq4_nl"]
# Cases of hf_model_check.models() and the GGUF formats their widths allow.
FORMATS = {
    "llama_blocks": WITH_Q5_0,        # two safetensors shards, untied, Q/K permuted in GGUF
    "llama_mlp_bias_f32": FLOATS,     # MLP biases (mlp_bias)
    "qwen2_tied_blocks": WITH_Q5_0,   # q/k/v biases, tied embeddings (no output.weight)
    "qwen3_blocks": BLOCKS,           # q/k norms, head_dim 32 (attention.key_length)
    "mixtral_blocks": WITH_Q5_0,      # a llama file with experts: stacked ffn_*_exps, permuted
    "qwen2_moe_blocks": BLOCKS,       # shared expert and its gate; a dense layer between MoE ones
    "qwen3_moe_f32": FLOATS,          # renormalised top-k
    # and llama.cpp's Q3_K_M, Q4_K_M and Q5_K_M mixtures (MIXTURES_OF_TWO_LAYERS below), each
    # matrix kept in its own format by the default load.
    "llama_k_blocks": ["q3_k", "q4_k", "q5_k", "q6_k", "iq4_xs", "q3_k_m", "q4_k_m", "q5_k_m"],
    # Llama 3.1's RoPE scaling, tied embeddings: rope_freqs in the file (f32 divisors), so the
    # logits agree to rounding, not to the bit.
    "llama_tied_f32": FLOATS,
    # Gemma: norms written as 1 + w (numesh takes the 1 off), tied, one kv head, head_dim 32.
    "gemma_blocks": BLOCKS,
    # Phi-3: attn_qkv and ffn_up (gate and up) fused, read as slices of one tensor.
    "phi3_blocks": BLOCKS,
}
SCALED_TOLERANCE = 1e-5  # relative to the largest logit
# gguf_writer's q4_k_m of an untied two-layer model, as numesh lays its matrices out.
Q4_K_M_OF_TWO_LAYERS = {"embedding": "q4_k", "lm_head": "q6_k", "layers.0.wq": "q4_k",
                        "layers.0.wv": "q4_k", "layers.1.wv": "q6_k", "layers.0.down": "q4_k",
                        "layers.1.down": "q6_k"}
# and the same with Q5_K for Q5_K_M (llama.cpp's rule takes the same matrices to Q6_K).
MIXTURES_OF_TWO_LAYERS = {
    "q4_k_m": ("q4_k+q6_k", Q4_K_M_OF_TWO_LAYERS),
    "q5_k_m": ("q5_k+q6_k", {k: "q5_k" if v == "q4_k" else v for k, v in Q4_K_M_OF_TWO_LAYERS.items()}),
    # Q3_K_M: Q6_K output, Q5_K attn_v on the first two layers, Q4_K ffn_down (and attn_output).
    "q3_k_m": ("q3_k+q4_k+q5_k+q6_k",
               {"embedding": "q3_k", "lm_head": "q6_k", "layers.0.wq": "q3_k", "layers.0.wv": "q5_k",
                "layers.1.wv": "q5_k", "layers.0.down": "q4_k", "layers.1.down": "q4_k"})}


def write(d):
    cases = []
    for i, (name, c, dtype, shards, _) in enumerate(hf.models()):
        if name not in FORMATS:
            continue
        folder = os.path.join(d, name)
        # Llama 3.1's RoPE scaling goes in as rope_freqs; only llama_tied_f32 keeps it.
        scaled = name == "llama_tied_f32"
        if c.get("rope_scaling") and not scaled:
            c = dict(c, rope_scaling=None)
        hf.save(folder, c, hf.weights(c, dtype, 1000 + i), shards)
        for fmt in FORMATS[name]:
            # Qwen2-MoE's dense layer (mlp_only_layers): llama.cpp's converter has no names for
            # one; the writer then uses the dense layers' (blk.N.ffn_gate, ...), as numesh reads.
            # The factors from rope_scaling's own original context, as transformers computes
            # them (llama.cpp's converter reads a top-level one: the same in real Llama 3.1).
            original = c["rope_scaling"]["original_max_position_embeddings"] if scaled else None
            gguf_writer.convert(folder, os.path.join(folder, f"model.{fmt}.gguf"), fmt,
                                allow_dense_moe_layers=True, llama3_original_context=original)
        g = torch.Generator().manual_seed(77 + i)
        prompt = torch.randint(3, c["vocab_size"], (hf.BATCH, hf.PROMPT), generator=g).tolist()
        cases.append({"name": name, "formats": FORMATS[name], "prompt": prompt,
                      "tolerance": SCALED_TOLERANCE if scaled else 0.0})
    with open(os.path.join(d, "cases.json"), "w") as out:
        json.dump({"cases": cases}, out, indent=1)


# Keys only one of the two writers writes: the script's general.size_label (a name heuristic),
# general.alignment when it asks for one, and head_dim's keys, which the script writes only
# when config.json names head_dim (llama.cpp's converter reads transformers' defaults).
ONE_SIDED = {"general.size_label", "general.alignment", "general.name"}
HEAD_DIM_KEYS = ("attention.key_length", "attention.value_length")


def compare_files(ours, theirs):
    """What differs between numesh's file and the script's (both read by gguf_writer.read_gguf)."""
    a, b = gguf_writer.read_gguf(ours), gguf_writer.read_gguf(theirs)
    out = []
    if list(a["tensors"]) and set(a["tensors"]) != set(b["tensors"]):
        out.append(f"tensors {sorted(set(a['tensors']) ^ set(b['tensors']))}")
    for name in set(a["tensors"]) & set(b["tensors"]):
        x, y = a["tensors"][name], b["tensors"][name]
        if (x["shape"], x["type"]) != (y["shape"], y["type"]):
            out.append(f"{name}: {x['shape']} {x['type_name']} vs {y['shape']} {y['type_name']}")
        elif name == "rope_freqs.weight":  # f32 divisors computed in float64 on both sides
            if not np.allclose(x["data"], y["data"], rtol=1e-6, atol=0):
                out.append(f"{name}: {x['data']} vs {y['data']}")
        elif x["raw"] != y["raw"]:
            out.append(f"{name}: bytes differ")
    for key in set(a["metadata"]) | set(b["metadata"]):
        if key in ONE_SIDED or key.endswith(HEAD_DIM_KEYS) or key.startswith("tokenizer."):
            continue
        if key not in a["metadata"] or key not in b["metadata"]:
            out.append(f"key {key} only in {'numesh' if key in a['metadata'] else 'the script'}'s")
        elif a["metadata"][key] != b["metadata"][key] or a["types"][key] != b["types"][key]:
            out.append(f"key {key}: {a['metadata'][key]!r} vs {b['metadata'][key]!r}")
    return out


def check(d):
    with open(os.path.join(d, "results.json")) as f:
        results = json.load(f)["results"]
    failed = 0
    compared = {}
    for r in results:
        key = (r["name"], r["format"])
        if key not in compared:
            folder = os.path.join(d, r["name"])
            compared[key] = (compare_files(os.path.join(folder, r["written"]),
                                           os.path.join(folder, f"model.{r['format']}.gguf"))
                             if r["written"] else [])
        # Only Qwen2-MoE's dense layer is refused by numesh's writer (llama.cpp has no names).
        refusal_expected = r["name"] == "qwen2_moe_blocks"
        written_ok = (bool(r["written_refused"]) == refusal_expected and r["written_same"]
                      and not compared[key])
        if compared[key]:
            print(f"     numesh's {r['written']} of {r['name']} differs from the script's: {compared[key][:4]}")
        # A mixture's matrices keep their formats: the default load's own list of them, and the
        # Q4_K_M rule on the two layers (use_more_bits picks layer 1) and the output.
        mixture = MIXTURES_OF_TWO_LAYERS.get(r["format"])
        formats_ok = mixture is None or (r["formats"] == mixture[0]
                                         and r["matrix_formats"] == mixture[1])
        if not formats_ok:
            print(f"     {r['name']} from model.{r['format']}.gguf loaded as {r['formats']}: "
                  f"{r['matrix_formats']}, not {mixture}")
        ok = (r["config_differences"] == [] and r["same_logits"] and r["same_greedy"] and written_ok
              and formats_ok)
        failed += not ok
        print(f"{'ok  ' if ok else 'FAIL'} {r['name']} from model.{r['format']}.gguf on {r['mesh']} "
              f"({r['formats']}): "
              f"config {'same' if not r['config_differences'] else r['config_differences']}, "
              f"logits max |diff| {r['max_diff']:.3g}, greedy {r['greedy']} vs {r['expected_greedy']}")
    expected = sum(len(FORMATS[n]) for n in FORMATS)
    meshes = {(r["name"], r["format"]) for r in results}
    if len(meshes) != expected:
        print(f"gguf_check: {len(meshes)} (case, format) pairs ran, {expected} expected")
        return 1
    if failed:
        print(f"gguf_check: {failed} of {len(results)} runs differ from safetensors")
        return 1
    print(f"gguf_check: all {len(results)} runs equal their safetensors checkpoints")
    return 0


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] not in ("write", "check"):
        print("usage: gguf_check.py write|check DIR")
        sys.exit(2)
    if sys.argv[1] == "write":
        write(sys.argv[2])
        sys.exit(0)
    sys.exit(check(sys.argv[2]))
