#!/usr/bin/env python3
"""Writes the fuzz targets' seed corpora into fuzz/corpus/<target>/ (seed-* files).

The seeds are small valid (and a few nearly valid) inputs of each parser, so that libFuzzer
starts from the formats' real structure. Inputs that once made a target fail are kept beside
them as regression-* files, added by hand, and are never rewritten here. Run from anywhere:
    python3 fuzz/make_seeds.py
"""
import json
import shutil
import struct
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CORPUS = ROOT / "fuzz" / "corpus"


def write(target, name, data):
    d = CORPUS / target
    d.mkdir(parents=True, exist_ok=True)
    if isinstance(data, str):
        data = data.encode()
    (d / f"seed-{name}").write_bytes(data)


def safetensors(tensors, metadata=None):
    """tensors: list of (name, dtype, shape, raw bytes), laid out in order."""
    header, offset, body = {}, 0, b""
    for name, dtype, shape, raw in tensors:
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + len(raw)]}
        offset += len(raw)
        body += raw
    if metadata is not None:
        header["__metadata__"] = metadata
    text = json.dumps(header, separators=(",", ":")).encode()
    return struct.pack("<Q", len(text)) + text + body


def gguf(kvs, tensors, alignment=32, version=3):
    """kvs: list of encoded key-value pairs (gguf_kv); tensors: list of (name, GGML type id, ne
    innermost first, raw bytes), laid out as GGML writes them (each padded to the alignment)."""
    def s(text):
        text = text.encode() if isinstance(text, str) else text
        return struct.pack("<Q", len(text)) + text
    out = b"GGUF" + struct.pack("<IQQ", version, len(tensors), len(kvs)) + b"".join(kvs)
    offset, body = 0, b""
    for name, type_id, ne, raw in tensors:
        out += s(name) + struct.pack("<I", len(ne)) + struct.pack(f"<{len(ne)}q", *ne)
        out += struct.pack("<IQ", type_id, offset)
        padded = raw + b"\0" * (-len(raw) % alignment)
        offset += len(padded)
        body += padded
    if tensors:
        out += b"\0" * (-len(out) % alignment)
    return out + body


def gguf_kv(key, value_type, value):
    """One GGUF key-value pair. value_type: a struct code ("B", "i", "f", "?", "Q", "d"...), "s"
    for a string, or ("a", code) for an array of `value` (a list)."""
    codes = {"B": 0, "b": 1, "H": 2, "h": 3, "I": 4, "i": 5, "f": 6, "?": 7, "s": 8, "Q": 10,
             "q": 11, "d": 12}

    def s(text):
        text = text.encode()
        return struct.pack("<Q", len(text)) + text

    def one(code, v):
        return s(v) if code == "s" else struct.pack("<" + code, v)
    head = s(key)
    if isinstance(value_type, tuple):
        code = value_type[1]
        return head + struct.pack("<IIQ", 9, codes[code], len(value)) + b"".join(one(code, v) for v in value)
    return head + struct.pack("<I", codes[value_type]) + one(value_type, value)


def main():
    for old in CORPUS.glob("*/seed-*"):
        old.unlink()

    # .npy: the readers' own test files (fp32, int ids, every header version, broken ones).
    for f in sorted((ROOT / "tests" / "data" / "ops").glob("*.npy")) + sorted(
            (ROOT / "tests" / "data" / "train").glob("*.npy")):
        write("npy_fuzz", f.name, f.read_bytes())

    f32 = struct.pack("<6f", 1, 2, 3, 4, 5, 6)
    write("safetensors_fuzz", "f32", safetensors([("w", "F32", [2, 3], f32)]))
    write("safetensors_fuzz", "mixed", safetensors(
        [("a", "BF16", [2], b"\x80\x3f\x00\x40"), ("b", "F16", [1, 2], b"\x00\x3c\x00\x40"),
         ("empty", "F32", [0, 4], b""), ("s", "F32", [], struct.pack("<f", 7)),
         ("i", "I64", [1], struct.pack("<q", 5))], metadata={"format": "pt"}))
    write("safetensors_fuzz", "bad-offsets", safetensors([("w", "F32", [3], f32)]))

    # GGUF: a tiny llama's metadata of every value type, tensors of the types numesh reads (the
    # block formats' bytes hand-made: an f16 scale, then codes), one it does not, and a broken
    # layout.
    meta = [gguf_kv("general.architecture", "s", "llama"), gguf_kv("general.alignment", "I", 32),
            gguf_kv("llama.block_count", "I", 2), gguf_kv("llama.context_length", "Q", 4096),
            gguf_kv("llama.rope.freq_base", "f", 10000.0), gguf_kv("llama.attention.layer_norm_rms_epsilon", "d", 1e-5),
            gguf_kv("tokenizer.ggml.add_bos_token", "?", True), gguf_kv("i8", "b", -3), gguf_kv("u16", "H", 7),
            gguf_kv("i16", "h", -7), gguf_kv("i64", "q", -1), gguf_kv("u8", "B", 255),
            gguf_kv("tokenizer.ggml.tokens", ("a", "s"), ["<s>", "</s>", "a", "b"]),
            gguf_kv("tokenizer.ggml.scores", ("a", "f"), [0.0, 0.0, -1.0, -2.0]),
            gguf_kv("tokenizer.ggml.token_type", ("a", "i"), [3, 3, 1, 1]),
            gguf_kv("empty", ("a", "Q"), [])]
    q8_block = struct.pack("<e", 0.5) + bytes(range(32))
    q4_block = struct.pack("<e", 0.25) + bytes(range(0, 256, 16))
    q4k_block = struct.pack("<ee", 0.5, 0.125) + bytes(range(12)) + bytes(range(128))
    q6k_block = bytes(range(128)) + bytes(range(64)) + bytes(range(16)) + struct.pack("<e", 0.5)
    write("gguf_fuzz", "llama", gguf(meta, [
        ("token_embd.weight", 0, [4, 2], struct.pack("<8f", *range(8))),
        ("blk.0.attn_norm.weight", 1, [4], struct.pack("<4e", 1, 2, 3, 4)),
        ("blk.0.ffn_up.weight", 30, [2, 2], b"\x80\x3f\x00\x40\x80\x3f\x00\x40"),
        ("blk.0.attn_q.weight", 8, [64, 1], q8_block * 2),
        ("blk.0.attn_k.weight", 2, [32, 2], q4_block * 2),
        ("blk.0.ffn_down.weight", 12, [512], q4k_block * 2),
        ("output.weight", 14, [256], q6k_block),
        ("blk.0.ffn_gate.weight", 13, [256], bytes(176)),
        ("scalar", 0, [], struct.pack("<f", 1.5)),
        ("empty", 0, [4, 0], b"")]))
    write("gguf_fuzz", "v2-align64", gguf([gguf_kv("general.alignment", "I", 64)],
                                           [("a", 0, [3], struct.pack("<3f", 1, 2, 3)),
                                            ("b", 8, [32], q8_block)], alignment=64, version=2))
    write("gguf_fuzz", "metadata-only", gguf(meta, []))
    broken = bytearray(gguf([], [("a", 0, [4], bytes(16)), ("b", 0, [4], bytes(16))]))
    infos_end = 24 + 2 * (8 + 1 + 4 + 8 + 4 + 8)
    broken[infos_end - 8:infos_end] = struct.pack("<Q", 0)  # b's offset: a's
    write("gguf_fuzz", "bad-offsets", bytes(broken))

    shards = {"a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"}
    write("safetensors_index_fuzz", "index", json.dumps({"metadata": {"total_size": 16}, "weight_map": shards}))
    write("safetensors_index_fuzz", "one-shard", json.dumps({"weight_map": {"a": shards["a"]}}))
    write("safetensors_index_fuzz", "path", json.dumps({"weight_map": {"a": "../" + shards["a"], "b": shards["b"]}}))

    llama = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": 64,
             "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
             "num_key_value_heads": 2, "vocab_size": 256, "max_position_embeddings": 512,
             "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "hidden_act": "silu",
             "tie_word_embeddings": False, "bos_token_id": 1, "eos_token_id": [2, 3]}
    write("hf_config_fuzz", "llama", json.dumps(llama, indent=1))
    write("hf_config_fuzz", "llama3-rope", json.dumps(dict(llama, rope_scaling={
        "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
        "original_max_position_embeddings": 256})))
    write("hf_config_fuzz", "mixtral", json.dumps(dict(llama, model_type="mixtral", num_local_experts=4,
                                                       num_experts_per_tok=2, sliding_window=None)))
    write("hf_config_fuzz", "qwen2", json.dumps(dict(llama, model_type="qwen2", use_sliding_window=False,
                                                     tie_word_embeddings=True)))
    write("hf_config_fuzz", "qwen3-moe", json.dumps(dict(llama, model_type="qwen3_moe", head_dim=16, num_experts=8,
                                                         num_experts_per_tok=2, moe_intermediate_size=32,
                                                         norm_topk_prob=True, decoder_sparse_step=1,
                                                         mlp_only_layers=[0])))

    tokenizer = (ROOT / "tests" / "data" / "models" / "tiny_tokenizer" / "tokenizer.json").read_text()
    write("tokenizer_json_fuzz", "tiny", tokenizer)
    t = json.loads(tokenizer)
    t["model"]["vocab"] = dict(list(t["model"]["vocab"].items())[:260])
    t["model"]["merges"] = t["model"]["merges"][:4]
    t["post_processor"] = None
    write("tokenizer_json_fuzz", "small", json.dumps(t))

    for i, text in enumerate(["Hello world", "  two  spaces\tand\ttabs\n\nlines", "naïve café ☃ 日本語 🙂",
                              "<|begin_of_text|>x<|begin_of_text|>", "don't we'll I'M 1234567 3.14",
                              "def f(x):\n    return x**2  # code", "\u00a0\u2028\u3000"]):
        write("tokenizer_encode_fuzz", str(i), text)

    # Chat templates of numesh's own writing, in the shapes real ones take (ChatML, Llama 3's
    # headers, tools with tojson, a namespace, a macro, whitespace control).
    for i, text in enumerate([
            "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
            "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}",
            "{{- bos_token }}\n{%- for message in messages %}\n    {{- '<|start_header_id|>' + message['role']"
            " + '<|end_header_id|>\\n\\n' + message['content'] | trim + '<|eot_id|>' }}\n{%- endfor %}",
            "{%- if tools %}{% for t in tools %}{{ t | tojson(indent=2) }}\n{% endfor %}{% endif %}"
            "{%- set ns = namespace(last=-1) %}{% for m in messages[::-1] %}{% if m.role == 'user' %}"
            "{% set ns.last = loop.index0 %}{% endif %}{% endfor %}{{ ns.last }}",
            "{% macro turn(role, text='') -%}[{{ role|upper }}] {{ text }}{%- endmacro %}"
            "{% for m in messages if m.content is string %}{{ turn(m.role, m.content) }}\n{% else %}none{% endfor %}",
            "{{ messages | selectattr('role', 'equalto', 'user') | map(attribute='content') | join(', ') }}"
            "{{ raise_exception('bad ' ~ messages|length) if messages|length > 9 }}",
            "{# comment #}\n  {% if x is not defined and 1 < 2.5 %}{{ 'a'[0:1] * 3 }}{{ {'k': [1, (2,)]} }}{% endif %}"]):
        write("chat_template_fuzz", str(i), text)

    for f in sorted((ROOT / "tests" / "data" / "topologies").glob("*.xml")):
        write("topology_fuzz", f.name, f.read_bytes())
    for i, text in enumerate(["package:2 numa:2 core:8 pu:2", "numa:4 core:2 pu:1", "pack:2 l3:2 core:4 pu:2",
                              "core:2 pu:1", "node:2 core:1 pu:1"]):
        write("topology_fuzz", f"synthetic-{i}", text)

    write("partition_axis_fuzz", "empty", "{}")
    write("partition_axis_fuzz", "fields", json.dumps({
        "batch_axis": ["fsdp", "dp"], "sequence_axis": "sp", "hidden_state_axis": "tp",
        "head_axis": "tp", "expert_axis": "ep", "decode_batch_axis": ["fsdp", "dp"],
        "query_sequence_axis": None, "key_sequence_axis": "sp"}))
    write("partition_axis_fuzz", "unknown", json.dumps({"batch_axis": "dp", "nonsense_axis": "tp"}))

    for i, (sel, text) in enumerate([(0, "P('dp', ('fsdp','sp'), None)"), (0, "dp,(fsdp,sp),None"),
                                     (0, "P()"), (1, "batch,query_length,embed"), (1, "(batch,length),_,None,tp"),
                                     (1, "__BATCH__,HEAD,[fsdp,sp]"), (2, "dp:2,fsdp:1,ep:1,tp:4,sp:1"),
                                     (2, "1, 2, -1, 1, 1"), (2, " 1_0 ,+2,1,1,1")]):
        write("partition_spec_fuzz", str(i), bytes([sel]) + text.encode())

    for i, text in enumerate(["kernel|bias->fsdp.tp,embedding->tp\nmodel/layers/0/mlp/kernel",
                              ".*->(fsdp,sp).tp\nx", r"layers/\d+/attn/(q|k|v)_proj->..tp" + "\nlayers/3/attn/q_proj",
                              r"^(?:a|b)+?$->fsdp" + "\nababab", "(?=lm)head->tp\nlm_head"]):
        write("rule_regex_fuzz", str(i), text)

    cli = ["dp,fsdp,tp", "a, b ,c", "1,2,-1", "1, 2, 3000000", "8,128,4096", "64MiB", "4096",
           "read,copy,triad", "1,2,all", "numa", "dim:-1", "decode", "insert", "bhtd",
           "batch,(fsdp,sp),None", '["dp", "fsdp"]', "batch_axis=(fsdp,dp)"]
    for sel, text in enumerate(cli):
        write("cli_parsers_fuzz", str(sel), bytes([sel]) + text.encode())


if __name__ == "__main__":
    main()
