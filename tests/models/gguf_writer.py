#!/usr/bin/python3
"""A GGUF writer and reader independent of numesh, and a Hugging Face -> GGUF converter that
lays a checkpoint out as llama.cpp's convert_hf_to_gguf.py does: the reference files numesh's
GGUF loader is checked against.

    gguf_writer.py convert HF_DIR OUT.gguf FTYPE  # FTYPE: f32 f16 bf16 q8_0 q4_0 q5_0 iq4_nl q3_k q4_k q5_k q6_k iq4_xs
    gguf_writer.py dump FILE.gguf                 # what read_gguf sees: metadata and tensor infos
    gguf_writer.py selftest [--ggml LIBGGML_BASE] # every tiny model of hf_model_check.py in every
                                                  # ftype, read back (and by ggml's own reader)

Written from the GGUF specification (ggml's docs/gguf.md; src/gguf.cpp for what ggml's reader
checks) and from llama.cpp's converter (convert_hf_to_gguf.py, now split into conversion/*.py;
gguf-py/gguf/constants.py, tensor_mapping.py, gguf_writer.py, quants.py). Nothing here uses
numesh or the `gguf` PyPI package.

The format (GGUF v3, little-endian): "GGUF", uint32 version 3, uint64 tensor count, uint64
metadata count; each metadata entry is a string key (uint64 length + UTF-8 bytes), a uint32
value type and the value (strings as keys; arrays as uint32 element type, uint64 count, the
elements); then each tensor's info: name (a string, < 64 bytes), uint32 n_dims, n_dims uint64
ne (innermost first: ne[0] is the row length), uint32 ggml type, uint64 offset relative to the
data section. The data section starts at the first multiple of the alignment after the infos
(general.alignment, a uint32, default 32), and every tensor starts at a multiple of it, padded
with zeros; ggml's reader wants the offsets to be exactly the running sum of the padded sizes,
which is how tensors are laid out here (in the order they were added).

GgufWriter takes tensors as NumPy arrays in NumPy's order (outermost first; the file's ne is the
reversed shape): F32 / F16 / BF16 (from f32 by round-to-nearest-even of the bits, NaN made quiet,
as gguf-py's quants.BF16 and ggml's ggml_compute_fp32_to_bf16), or GGML blocks Q8_0 / Q4_0 / Q5_0 /
Q3_K / Q4_K / Q5_K / Q6_K quantized row by row along the last axis with tests/common/ggml_blocks.py (GGML's reference
quantizers), or raw bytes of any of those types (add_raw_tensor).

convert(hf_dir, out_path, ftype) follows llama.cpp's converter for LlamaForCausalLM,
MistralForCausalLM and MixtralForCausalLM (GGUF architecture "llama"), Qwen2 ("qwen2"), Qwen3
("qwen3"), Qwen2-MoE ("qwen2moe"), Qwen3-MoE ("qwen3moe"), Gemma ("gemma": every norm
written as 1 + w, lm_head never written, no rope.freq_base key) and Phi-3 ("phi3": qkv_proj as
attn_qkv, gate_up_proj as ffn_up, both whole):
  * names: token_embd, output_norm, output (only when the checkpoint has lm_head and the
    embeddings are not tied), blk.N.attn_norm, attn_q / attn_k / attn_v / attn_output (.weight,
    .bias), attn_q_norm / attn_k_norm (qwen3, qwen3moe), ffn_norm, ffn_gate / ffn_up / ffn_down
    (.weight, .bias), MoE: ffn_gate_inp (the router), ffn_gate_exps / ffn_up_exps / ffn_down_exps
    (the experts stacked: NumPy [E, out, in], ne {in, out, E}), qwen2moe's shared expert
    ffn_gate_shexp / ffn_up_shexp / ffn_down_shexp and its gate ffn_gate_inp_shexp (kept 2-D as
    the converter writes it: NumPy [1, hidden], ne {hidden, 1}; llama.cpp's loader asks {n_embd}
    and accepts the trailing 1); rope_freqs (llama with rope_scaling.rope_type "llama3": the
    per-frequency divisors, F32 [head_dim / 2], written first).
  * the llama architecture (llama, mistral, mixtral) permutes the rows of q_proj (with
    n_head) and k_proj (with n_head_kv), weights and biases, from Hugging Face's rotate-half
    order to GGML's interleaved pairs (permute_qk below); the qwen architectures do not.
  * types: 1-D tensors, names ending in _norm.weight, anything not ending in .weight (biases),
    the routers ffn_gate_inp and ffn_gate_inp_shexp stay F32; every other tensor (embeddings and
    output included) takes the ftype. bf16 / f16 sources are read as llama.cpp reads them (bf16
    widened to f32 first). A block format whose block does not divide a row raises ValueError
    (llama.cpp falls back to F16 for that tensor). The ftype "q4_k_m" is llama.cpp's quantize
    mixture of that name for a dense Llama-style model whose rows are whole super-blocks (Q4_K;
    Q6_K for the output and for attn_v and ffn_down on the layers use_more_bits picks:
    _q4_k_m_type); not its rules for 70B models, 8 experts, fused attn_qkv (Q5_K) or rows
    that are not whole super-blocks (Q5_0 / Q8_0 fallbacks). "q5_k_m" and "q3_k_m" are its
    mixtures of those names by the same rules (MIXTURES: _q5_k_m_type, _q3_k_m_type).
  * metadata, in the converter's order: general.architecture, [general.alignment when asked],
    general.type "model", general.name, general.size_label, {arch}.block_count, .context_length,
    .embedding_length, .feed_forward_length, .attention.head_count, .attention.head_count_kv,
    [.rope.scaling.* for linear / yarn], .rope.freq_base, .attention.layer_norm_rms_epsilon,
    [.expert_count, .expert_used_count], [.attention.key_length / .value_length when config.json
    has head_dim], general.file_type, then llama: .vocab_size, .rope.dimension_count; qwen MoE:
    .expert_feed_forward_length, [.expert_shared_feed_forward_length]; general.quantization_version
    2; tokenizer.ggml.bos_token_id / eos_token_id (config.json's integer ids below vocab_size).
    Integers are uint32, floats float32, as gguf-py's add_* methods write them.
  extra_metadata adds or overrides keys after all of that (a value None removes the key).

Exit status of the CLI: 0 success; 1 a self-test mismatch; 2 numpy (or torch for selftest) missing.
"""
import json
import math
import os
import re
import struct
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "common"))
from python_deps import require  # noqa: E402  (a missing module: exit 2, or a skip)

np = require("numpy")
import ggml_blocks  # noqa: E402  (GGML's reference block quantizers in NumPy)

# ---- the format's constants -------------------------------------------------------------------

GGUF_MAGIC = b"GGUF"
GGUF_VERSION = 3
DEFAULT_ALIGNMENT = 32
MAX_NAME_BYTES = 63  # GGML_MAX_NAME 64, the terminating NUL included (gguf.cpp: length >= 64 fails)
MAX_DIMS = 4
GGML_QUANT_VERSION = 2

# gguf_metadata_value_type
UINT8, INT8, UINT16, INT16, UINT32, INT32, FLOAT32, BOOL, STRING, ARRAY, UINT64, INT64, FLOAT64 = range(13)
VALUE_TYPE_NAMES = ["UINT8", "INT8", "UINT16", "INT16", "UINT32", "INT32", "FLOAT32", "BOOL", "STRING",
                    "ARRAY", "UINT64", "INT64", "FLOAT64"]
SCALAR_FORMATS = {UINT8: "<B", INT8: "<b", UINT16: "<H", INT16: "<h", UINT32: "<I", INT32: "<i",
                  FLOAT32: "<f", UINT64: "<Q", INT64: "<q", FLOAT64: "<d"}
NUMPY_VALUE_TYPES = {np.dtype(np.uint8): UINT8, np.dtype(np.int8): INT8, np.dtype(np.uint16): UINT16,
                     np.dtype(np.int16): INT16, np.dtype(np.uint32): UINT32, np.dtype(np.int32): INT32,
                     np.dtype(np.float32): FLOAT32, np.dtype(np.bool_): BOOL, np.dtype(np.uint64): UINT64,
                     np.dtype(np.int64): INT64, np.dtype(np.float64): FLOAT64}

# enum ggml_type: name -> (id, elements per block, bytes per block)
GGML_TYPES = {"F32": (0, 1, 4), "F16": (1, 1, 2), "Q4_0": (2, 32, 18), "Q5_0": (6, 32, 22), "Q8_0": (8, 32, 34),
              "IQ4_NL": (20, 32, 18),
              "Q3_K": (11, 256, 110), "Q4_K": (12, 256, 144), "Q5_K": (13, 256, 176), "Q6_K": (14, 256, 210), "IQ4_XS": (23, 256, 136), "I8": (24, 1, 1), "I16": (25, 1, 2),
              "I32": (26, 1, 4), "I64": (27, 1, 8), "F64": (28, 1, 8), "BF16": (30, 1, 2)}
GGML_TYPE_NAMES = {v[0]: k for k, v in GGML_TYPES.items()}
BLOCK_CODECS = {"Q8_0": (ggml_blocks.quantize_q8_0, ggml_blocks.dequantize_q8_0, ggml_blocks.Q8_0),
                "Q4_0": (ggml_blocks.quantize_q4_0, ggml_blocks.dequantize_q4_0, ggml_blocks.Q4_0),
                "Q5_0": (ggml_blocks.quantize_q5_0, ggml_blocks.dequantize_q5_0, ggml_blocks.Q5_0),
                "IQ4_NL": (ggml_blocks.quantize_iq4_nl, ggml_blocks.dequantize_iq4_nl, ggml_blocks.IQ4_NL),
                "Q3_K": (ggml_blocks.quantize_q3_k, ggml_blocks.dequantize_q3_k, ggml_blocks.Q3_K),
                "Q4_K": (ggml_blocks.quantize_q4_k, ggml_blocks.dequantize_q4_k, ggml_blocks.Q4_K),
                "Q5_K": (ggml_blocks.quantize_q5_k, ggml_blocks.dequantize_q5_k, ggml_blocks.Q5_K),
                "Q6_K": (ggml_blocks.quantize_q6_k, ggml_blocks.dequantize_q6_k, ggml_blocks.Q6_K),
                "IQ4_XS": (ggml_blocks.quantize_iq4_xs, ggml_blocks.dequantize_iq4_xs, ggml_blocks.IQ4_XS)}


def _type_name(ggml_type):
    """"Q8_0" from "q8_0", "Q8_0" or 8."""
    if isinstance(ggml_type, (int, np.integer)):
        if int(ggml_type) not in GGML_TYPE_NAMES:
            raise ValueError(f"unsupported ggml type id {ggml_type}")
        return GGML_TYPE_NAMES[int(ggml_type)]
    name = str(ggml_type).upper()
    if name not in GGML_TYPES:
        raise ValueError(f"unsupported ggml type {ggml_type!r} (known: {', '.join(GGML_TYPES)})")
    return name


def tensor_nbytes(shape, ggml_type):
    """Bytes of a tensor of NumPy shape `shape` in `ggml_type` (the last axis whole blocks)."""
    name = _type_name(ggml_type)
    _, block, size = GGML_TYPES[name]
    shape = tuple(int(d) for d in shape)
    row = shape[-1] if shape else 1
    if row % block:
        raise ValueError(f"a row of {row} is not a whole number of {name} blocks of {block}")
    return int(np.prod(shape, dtype=np.int64)) // block * size


def _pad(n, alignment):
    return (n + alignment - 1) // alignment * alignment


# ---- tensor encodings -------------------------------------------------------------------------

def f32_to_bf16_bits(x):
    """uint16 bf16 bits of float32 x: round to nearest even, NaN kept NaN and made quiet (gguf-py's
    quants.BF16.quantize_blocks = ggml_compute_fp32_to_bf16)."""
    n = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    nan = (n & 0x7FFFFFFF) > 0x7F800000
    rounded = (n + (0x7FFF + ((n >> 16) & 1))) >> 16
    quiet = ((n & 0xFFFF0000) | (64 << 16)) >> 16
    return np.where(nan, quiet, rounded).astype(np.uint16)


def bf16_bits_to_f32(bits):
    return (np.asarray(bits, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)


def encode_tensor(array, ggml_type):
    """(bytes, NumPy shape) of `array` stored as `ggml_type`: F32 / F16 / F64 / integer types by
    conversion (f16 by NumPy's round-to-nearest-even), BF16 as f32_to_bf16_bits, block formats
    quantized row by row along the last axis (which must be whole blocks)."""
    name = _type_name(ggml_type)
    a = np.asarray(array)
    shape = a.shape
    if name == "F32":
        data = a.astype("<f4")
    elif name == "F16":
        with np.errstate(over="ignore"):  # the converter's f32 -> f16: NumPy's round to nearest even
            data = a.astype("<f2") if a.dtype == np.float16 else a.astype(np.float32).astype("<f2")
    elif name == "F64":
        data = a.astype("<f8")
    elif name == "BF16":
        data = f32_to_bf16_bits(a.astype(np.float32)).astype("<u2")
    elif name in ("I8", "I16", "I32", "I64"):
        data = a.astype({"I8": "<i1", "I16": "<i2", "I32": "<i4", "I64": "<i8"}[name])
    else:
        _, block, _ = GGML_TYPES[name]
        if a.ndim == 0 or shape[-1] % block:
            raise ValueError(f"cannot store a tensor of shape {tuple(shape)} as {name}: its rows "
                             f"({shape[-1] if a.ndim else 1} values) are not whole blocks of {block}")
        quantize = BLOCK_CODECS[name][0]
        rows = np.ascontiguousarray(a, dtype=np.float32).reshape(-1, block)
        data = quantize(rows)
    return np.ascontiguousarray(data).tobytes(), tuple(shape)


def decode_tensor(raw, shape, ggml_type, dequantize=False):
    """The NumPy array (shape `shape`, NumPy order) of raw bytes stored as `ggml_type`: F32 / F16 /
    F64 / integers as themselves, BF16 as float32, block formats as their structured blocks
    ([rows, blocks per row] of ggml_blocks' dtype) or, with dequantize=True, as float32 values."""
    name = _type_name(ggml_type)
    buf = np.frombuffer(raw, dtype=np.uint8)
    simple = {"F32": "<f4", "F16": "<f2", "F64": "<f8", "I8": "<i1", "I16": "<i2", "I32": "<i4", "I64": "<i8"}
    if name in simple:
        return buf.view(simple[name]).reshape(shape).copy()
    if name == "BF16":
        return bf16_bits_to_f32(buf.view("<u2")).reshape(shape)
    _, dequant, dtype = BLOCK_CODECS[name]
    _, block, _ = GGML_TYPES[name]
    blocks = buf.view(dtype).copy()
    if dequantize:
        return dequant(blocks).astype(np.float32).reshape(shape)
    return blocks.reshape(tuple(shape[:-1]) + (shape[-1] // block,))


# ---- metadata values --------------------------------------------------------------------------

class GgufValue:
    """A metadata value with its GGUF type stated: GgufValue(UINT32, 7), GgufValue(ARRAY, [1, 2],
    INT32), GgufValue(ARRAY, ["a", "b"], STRING). Plain Python values are typed by infer_value."""
    __slots__ = ("vtype", "value", "subtype")

    def __init__(self, vtype, value, subtype=None):
        if vtype == ARRAY and subtype is None:
            subtype = infer_value(value).subtype
        self.vtype, self.value, self.subtype = vtype, value, subtype

    def __repr__(self):
        sub = f", {VALUE_TYPE_NAMES[self.subtype]}" if self.vtype == ARRAY else ""
        return f"GgufValue({VALUE_TYPE_NAMES[self.vtype]}, {self.value!r}{sub})"


def infer_value(value):
    """A GgufValue for a plain value, with gguf-py's rules (GGUFValueType.get_type): str / bytes ->
    STRING, bool -> BOOL, int -> INT32, float -> FLOAT32, list / tuple -> ARRAY of its first
    element's type (all elements alike); NumPy scalars and 1-D arrays keep their dtype. gguf-py's
    add_uint32 / add_float32 (what the converter uses for hyperparameters) are GgufValue(UINT32, v)
    / GgufValue(FLOAT32, v): state the type when it matters."""
    if isinstance(value, GgufValue):
        return value
    if isinstance(value, np.ndarray):
        if value.ndim != 1:
            raise ValueError("metadata arrays are 1-D")
        if value.dtype not in NUMPY_VALUE_TYPES:
            raise ValueError(f"no GGUF type for NumPy dtype {value.dtype}")
        return GgufValue(ARRAY, value, NUMPY_VALUE_TYPES[value.dtype])
    if isinstance(value, np.generic):
        if value.dtype not in NUMPY_VALUE_TYPES:
            raise ValueError(f"no GGUF type for NumPy dtype {value.dtype}")
        return GgufValue(NUMPY_VALUE_TYPES[value.dtype], value.item())
    if isinstance(value, (str, bytes, bytearray)):
        return GgufValue(STRING, value)
    if isinstance(value, bool):
        return GgufValue(BOOL, value)
    if isinstance(value, int):
        return GgufValue(INT32, value)
    if isinstance(value, float):
        return GgufValue(FLOAT32, value)
    if isinstance(value, (list, tuple)):
        if len(value) == 0:
            raise ValueError("an empty metadata array needs its element type: GgufValue(ARRAY, [], type)")
        types = [infer_value(v) for v in value]
        sub = types[0].vtype
        if any(t.vtype != sub for t in types):
            raise ValueError("all elements of a GGUF array have one type")
        return GgufValue(ARRAY, list(value), sub)
    raise ValueError(f"no GGUF type for {type(value).__name__} {value!r}")


def _pack_string(s):
    b = s.encode("utf-8") if isinstance(s, str) else bytes(s)
    return struct.pack("<Q", len(b)) + b


def _pack_payload(vtype, value, subtype=None):
    """The value's bytes without its type tag (arrays: element type, count, elements)."""
    if vtype in SCALAR_FORMATS:
        if vtype in (FLOAT32, FLOAT64):
            return struct.pack(SCALAR_FORMATS[vtype], float(value))
        return struct.pack(SCALAR_FORMATS[vtype], int(value))
    if vtype == BOOL:
        if not isinstance(value, (bool, np.bool_)) and value not in (0, 1):
            raise ValueError(f"a GGUF bool is 0 or 1, not {value!r}")
        return b"\x01" if value else b"\x00"
    if vtype == STRING:
        return _pack_string(value)
    if vtype == ARRAY:
        out = bytearray(struct.pack("<IQ", subtype, len(value)))
        if subtype in SCALAR_FORMATS or subtype == BOOL:
            dtype = {v: k for k, v in NUMPY_VALUE_TYPES.items()}[subtype].newbyteorder("<")
            if subtype in (FLOAT32, FLOAT64):
                arr = np.asarray(value, dtype=dtype)
            elif subtype == BOOL:
                if any(v not in (0, 1) for v in list(value)):
                    raise ValueError("a GGUF bool is 0 or 1")
                arr = np.array([bool(v) for v in value], dtype=np.bool_)
            else:
                info = np.iinfo(dtype)
                ints = [int(v) for v in value]
                if ints and (min(ints) < info.min or max(ints) > info.max):
                    raise ValueError(f"array value out of range for {VALUE_TYPE_NAMES[subtype]}")
                arr = np.array(ints, dtype=dtype)
            out += arr.tobytes()
        elif subtype == STRING:
            for s in value:
                out += _pack_string(s)
        elif subtype == ARRAY:  # nested arrays: in the spec, refused by ggml's reader
            for v in value:
                inner = infer_value(v)
                out += _pack_payload(ARRAY, inner.value, inner.subtype)
        else:
            raise ValueError(f"unknown GGUF array element type {subtype}")
        return bytes(out)
    raise ValueError(f"unknown GGUF value type {vtype}")


# ---- the writer -------------------------------------------------------------------------------

class GgufWriter:
    """A GGUF v3 little-endian file assembled in memory: metadata (in insertion order; setting a key
    again replaces its value in place) and tensors (in insertion order, each at a multiple of the
    alignment). write(path) or to_bytes() produce the file.

        w = GgufWriter()                      # alignment 32, no general.alignment key
        w = GgufWriter(alignment=64)          # general.alignment = uint32 64, written first
        w.add_string("general.architecture", "llama")
        w.add_uint32("llama.block_count", 2)
        w.add("some.key", [1, 2, 3])          # typed by infer_value (array of INT32 here)
        w.add_array("tokenizer.ggml.tokens", ["a", "b"], STRING)
        w.add_tensor("token_embd.weight", np.zeros((256, 64), np.float32), "Q8_0")
        w.add_raw_tensor("x.weight", (2, 32), "Q8_0", raw_block_bytes)
        w.write("model.gguf")
    """

    def __init__(self, alignment=None):
        self.alignment = DEFAULT_ALIGNMENT if alignment is None else int(alignment)
        if self.alignment <= 0 or self.alignment & (self.alignment - 1):
            raise ValueError(f"the alignment must be a power of two, not {alignment}")
        self.metadata = {}  # key -> GgufValue, in order
        self.tensors = []  # [name, ne (innermost first), type id, bytes]
        if alignment is not None:
            self.add_uint32("general.alignment", self.alignment)

    # metadata
    def add(self, key, value, vtype=None, subtype=None):
        """Sets key to value, typed by vtype (and subtype for arrays) or by infer_value."""
        if not isinstance(key, str) or not key:
            raise ValueError("a metadata key is a non-empty string")
        if len(key.encode("utf-8")) > 65535:
            raise ValueError("a metadata key is at most 65535 bytes")
        v = infer_value(value) if vtype is None else GgufValue(vtype, value, subtype)
        if key == "general.alignment":
            # A UINT32 sets the layout's alignment (a power of two); any other type is written as
            # asked with the data aligned to 32: a malformed file (ggml refuses it) for tests.
            alignment = int(v.value) if v.vtype == UINT32 else DEFAULT_ALIGNMENT
            if alignment <= 0 or alignment & (alignment - 1):
                raise ValueError(f"the alignment must be a power of two, not {alignment}")
            self.alignment = alignment
        _pack_payload(v.vtype, v.value, v.subtype)  # check it packs now, not at write time
        self.metadata[key] = v

    def remove(self, key):
        if key == "general.alignment":
            self.alignment = DEFAULT_ALIGNMENT
        self.metadata.pop(key, None)

    def add_uint8(self, key, v): self.add(key, v, UINT8)
    def add_int8(self, key, v): self.add(key, v, INT8)
    def add_uint16(self, key, v): self.add(key, v, UINT16)
    def add_int16(self, key, v): self.add(key, v, INT16)
    def add_uint32(self, key, v): self.add(key, v, UINT32)
    def add_int32(self, key, v): self.add(key, v, INT32)
    def add_uint64(self, key, v): self.add(key, v, UINT64)
    def add_int64(self, key, v): self.add(key, v, INT64)
    def add_float32(self, key, v): self.add(key, v, FLOAT32)
    def add_float64(self, key, v): self.add(key, v, FLOAT64)
    def add_bool(self, key, v): self.add(key, v, BOOL)
    def add_string(self, key, v): self.add(key, v, STRING)

    def add_array(self, key, values, subtype=None):
        self.add(key, values, ARRAY, subtype)

    # tensors
    def _check_tensor(self, name, shape):
        if len(name.encode("utf-8")) > MAX_NAME_BYTES:
            raise ValueError(f"tensor name {name!r} is longer than {MAX_NAME_BYTES} bytes")
        if any(t[0] == name for t in self.tensors):
            raise ValueError(f"duplicate tensor name {name!r}")
        if not 1 <= len(shape) <= MAX_DIMS:
            raise ValueError(f"tensor {name!r}: {len(shape)} dimensions (1 to {MAX_DIMS})")

    def add_tensor(self, name, array, ggml_type="F32"):
        """Adds `array` (NumPy order, outermost first) stored as ggml_type (encode_tensor)."""
        a = np.asarray(array)
        shape = a.shape if a.ndim else (1,)
        self._check_tensor(name, shape)
        data, _ = encode_tensor(a.reshape(shape), ggml_type)
        self.tensors.append([name, tuple(reversed(shape)), GGML_TYPES[_type_name(ggml_type)][0], data])

    def add_raw_tensor(self, name, shape, ggml_type, data):
        """Adds bytes already in ggml_type's layout for a tensor of NumPy shape `shape`."""
        shape = tuple(int(d) for d in shape)
        self._check_tensor(name, shape)
        data = bytes(data)
        if len(data) != tensor_nbytes(shape, ggml_type):
            raise ValueError(f"tensor {name!r}: {len(data)} bytes, {tensor_nbytes(shape, ggml_type)} "
                             f"expected for {shape} {_type_name(ggml_type)}")
        self.tensors.append([name, tuple(reversed(shape)), GGML_TYPES[_type_name(ggml_type)][0], data])

    def tensor_infos(self):
        """[(name, ne, ggml type id, offset in the data section, bytes)] as they will be written."""
        infos, offset = [], 0
        for name, ne, t, data in self.tensors:
            infos.append((name, ne, t, offset, len(data)))
            offset += _pad(len(data), self.alignment)
        return infos

    def header_bytes(self):
        """Everything before the data section, its padding included."""
        out = bytearray(GGUF_MAGIC)
        out += struct.pack("<IQQ", GGUF_VERSION, len(self.tensors), len(self.metadata))
        for key, v in self.metadata.items():
            out += _pack_string(key) + struct.pack("<I", v.vtype) + _pack_payload(v.vtype, v.value, v.subtype)
        for name, ne, t, offset, _ in self.tensor_infos():
            out += _pack_string(name) + struct.pack("<I", len(ne))
            out += struct.pack(f"<{len(ne)}Q", *ne) + struct.pack("<IQ", t, offset)
        out += b"\x00" * (_pad(len(out), self.alignment) - len(out))
        return bytes(out)

    def to_bytes(self):
        out = bytearray(self.header_bytes())
        for _, _, _, data in self.tensors:
            out += data + b"\x00" * (_pad(len(data), self.alignment) - len(data))
        return bytes(out)

    def write(self, path):
        with open(path, "wb") as f:
            f.write(self.header_bytes())
            for _, _, _, data in self.tensors:
                f.write(data)
                f.write(b"\x00" * (_pad(len(data), self.alignment) - len(data)))


# ---- an independent reader --------------------------------------------------------------------

class _Cursor:
    def __init__(self, data):
        self.data, self.pos = data, 0

    def take(self, n):
        if self.pos + n > len(self.data):
            raise ValueError(f"GGUF truncated at byte {self.pos} (wanted {n} more)")
        b = self.data[self.pos:self.pos + n]
        self.pos += n
        return b

    def unpack(self, fmt):
        return struct.unpack(fmt, self.take(struct.calcsize(fmt)))[0]

    def string(self):
        return self.take(self.unpack("<Q")).decode("utf-8", errors="surrogateescape")

    def value(self, vtype):
        if vtype in SCALAR_FORMATS:
            return self.unpack(SCALAR_FORMATS[vtype])
        if vtype == BOOL:
            b = self.unpack("<B")
            if b > 1:
                raise ValueError(f"bool value {b} at byte {self.pos - 1}")
            return bool(b)
        if vtype == STRING:
            return self.string()
        if vtype == ARRAY:
            sub, n = self.unpack("<I"), self.unpack("<Q")
            return [self.value(sub) for _ in range(n)], sub
        raise ValueError(f"unknown value type {vtype} at byte {self.pos - 4}")


def read_gguf(path, dequantize=False):
    """The file at `path` (or bytes) as a dict:
        version, alignment, data_offset (where the data section starts in the file),
        metadata {key: value} (arrays as lists), types {key: (value type, array element type or
        None)}, tensors {name: {"shape" (NumPy order), "ne", "type" (id), "type_name", "offset"
        (in the data section), "nbytes", "raw" (bytes), "data" (decode_tensor: arrays; block
        formats as structured blocks, or float32 with dequantize=True)}} in file order.
    Checks what ggml's reader checks: magic, version 3, unique keys and names, n_dims <= 4, rows
    of whole blocks, general.alignment a UINT32 power of two, offsets aligned and inside the file."""
    data = path if isinstance(path, (bytes, bytearray)) else open(path, "rb").read()
    c = _Cursor(data)
    if c.take(4) != GGUF_MAGIC:
        raise ValueError("not a GGUF file (bad magic)")
    version = c.unpack("<I")
    if version != 3:
        raise ValueError(f"GGUF version {version}, 3 expected")
    n_tensors, n_kv = c.unpack("<Q"), c.unpack("<Q")
    metadata, types = {}, {}
    for _ in range(n_kv):
        key = c.string()
        if key in metadata:
            raise ValueError(f"duplicate key {key!r}")
        vtype = c.unpack("<I")
        v = c.value(vtype)
        if vtype == ARRAY:
            metadata[key], types[key] = v[0], (ARRAY, v[1])
        else:
            metadata[key], types[key] = v, (vtype, None)
    alignment = DEFAULT_ALIGNMENT
    if "general.alignment" in metadata:
        if types["general.alignment"][0] != UINT32:
            raise ValueError("general.alignment is not a UINT32")
        alignment = metadata["general.alignment"]
        if alignment <= 0 or alignment & (alignment - 1):
            raise ValueError(f"alignment {alignment} is not a power of two")
    tensors = {}
    for _ in range(n_tensors):
        name = c.string()
        if name in tensors:
            raise ValueError(f"duplicate tensor {name!r}")
        n_dims = c.unpack("<I")
        if n_dims > MAX_DIMS:
            raise ValueError(f"tensor {name!r}: {n_dims} dimensions")
        ne = tuple(c.unpack("<Q") for _ in range(n_dims))
        t, offset = c.unpack("<I"), c.unpack("<Q")
        tname = _type_name(t)
        shape = tuple(reversed(ne))
        tensors[name] = {"shape": shape, "ne": ne, "type": t, "type_name": tname, "offset": offset,
                         "nbytes": tensor_nbytes(shape, tname)}
    data_offset = _pad(c.pos, alignment) if n_tensors else c.pos
    for name, info in tensors.items():
        if info["offset"] % alignment:
            raise ValueError(f"tensor {name!r} at offset {info['offset']}, not a multiple of {alignment}")
        start = data_offset + info["offset"]
        if start + info["nbytes"] > len(data):
            raise ValueError(f"tensor {name!r} runs past the end of the file")
        info["raw"] = bytes(data[start:start + info["nbytes"]])
        info["data"] = decode_tensor(info["raw"], info["shape"], info["type"], dequantize)
    return {"version": version, "alignment": alignment, "data_offset": data_offset,
            "metadata": metadata, "types": types, "tensors": tensors}


# ---- safetensors, read without torch ----------------------------------------------------------

SAFETENSORS_DTYPES = {"F32": "<f4", "F16": "<f2", "F64": "<f8", "I64": "<i8", "I32": "<i4", "I16": "<i2",
                      "I8": "<i1", "U8": "<u1", "BOOL": "?"}


def read_safetensors(path):
    """{name: NumPy array} of one safetensors file in its header's order, sorted by name (as
    gguf-py's SafetensorsLocal lists them). BF16 is returned widened to float32 (exact), F16 as
    float16, F32 as float32."""
    with open(path, "rb") as f:
        raw = f.read()
    n = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8:8 + n])
    out = {}
    for name in sorted(k for k in header if k != "__metadata__"):
        e = header[name]
        b, end = e["data_offsets"]
        buf = np.frombuffer(raw, dtype=np.uint8, count=end - b, offset=8 + n + b)
        if e["dtype"] == "BF16":
            arr = bf16_bits_to_f32(buf.view("<u2"))
        elif e["dtype"] in SAFETENSORS_DTYPES:
            arr = buf.view(SAFETENSORS_DTYPES[e["dtype"]]).copy()
        else:
            raise ValueError(f"{path}: tensor {name}: unsupported dtype {e['dtype']}")
        out[name] = arr.reshape(e["shape"])
    return out


def checkpoint_parts(hf_dir):
    """The safetensors files of a checkpoint folder in the converter's order: the index's files
    sorted, else model*.safetensors sorted."""
    index = os.path.join(hf_dir, "model.safetensors.index.json")
    if os.path.isfile(index):
        with open(index) as f:
            return sorted(set(json.load(f)["weight_map"].values()))
    parts = sorted(p for p in os.listdir(hf_dir) if p.startswith("model") and p.endswith(".safetensors"))
    if not parts:
        raise FileNotFoundError(f"{hf_dir}: no model*.safetensors")
    return parts


# ---- llama.cpp's conventions ------------------------------------------------------------------

# ftype -> (tensor type of the quantized weights, general.file_type = llama_ftype). llama.cpp's
# converter itself writes f32, f16, bf16 and q8_0; q4_0, q5_0 and the K types are llama-quantize's,
# whose mixes put some tensors in other types: here every such weight takes the one type (as
# llama-quantize --pure), and q3_k, q4_k and q5_k are labelled with their _M mixes (12, 15, 17).
FTYPES = {"f32": ("F32", 0), "f16": ("F16", 1), "bf16": ("BF16", 32), "q8_0": ("Q8_0", 7),
          "q4_0": ("Q4_0", 2), "q5_0": ("Q5_0", 8), "iq4_nl": ("IQ4_NL", 25), "q3_k": ("Q3_K", 12), "q4_k": ("Q4_K", 15), "q5_k": ("Q5_K", 17),
          "q6_k": ("Q6_K", 18), "iq4_xs": ("IQ4_XS", 30)}

# Hugging Face model_type -> GGUF architecture (llama.cpp's LlamaModel registers
# LlamaForCausalLM, MistralForCausalLM and MixtralForCausalLM; Qwen2Model, Qwen3Model,
# Qwen2MoeModel, Qwen3MoeModel the others).
ARCHITECTURES = {"llama": "llama", "mistral": "llama", "mixtral": "llama", "qwen2": "qwen2",
                 "qwen3": "qwen3", "qwen2_moe": "qwen2moe", "qwen3_moe": "qwen3moe", "gemma": "gemma",
                 "phi3": "phi3"}

# The tensors each architecture has (gguf-py constants.py MODEL_TENSORS), by GGUF base name.
_DENSE = {"ffn_gate", "ffn_up", "ffn_down"}
_ATTN = {"token_embd", "output_norm", "output", "attn_norm", "attn_q", "attn_k", "attn_v", "attn_output",
         "ffn_norm"}
_EXPERTS = {"ffn_gate_inp", "ffn_gate_exps", "ffn_up_exps", "ffn_down_exps"}
ARCH_TENSORS = {
    "llama": _ATTN | _DENSE | _EXPERTS | {"rope_freqs", "attn_rot_embd"},
    "qwen2": _ATTN | _DENSE | {"rope_freqs"},
    "qwen3": _ATTN | _DENSE | {"rope_freqs", "attn_q_norm", "attn_k_norm"},
    "qwen2moe": _ATTN | _EXPERTS | {"ffn_gate_inp_shexp", "ffn_gate_shexp", "ffn_up_shexp", "ffn_down_shexp"},
    "qwen3moe": _ATTN | _EXPERTS | {"attn_q_norm", "attn_k_norm"},
    "gemma": (_ATTN - {"output"}) | _DENSE,  # always tied: GemmaModel skips lm_head.weight
    # Phi3MiniModel: q, k, v in attn_qkv; gate and up in ffn_up (gate_up_proj kept whole)
    "phi3": (_ATTN - {"attn_q", "attn_k", "attn_v"}) | {"attn_qkv", "ffn_up", "ffn_down"},
}

# Hugging Face names (after model.layers.N.) -> GGUF names (after blk.N.): tensor_mapping.py.
LAYER_NAMES = {"input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm",
               "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
               "self_attn.o_proj": "attn_output", "self_attn.q_norm": "attn_q_norm",
               "self_attn.k_norm": "attn_k_norm", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
               "mlp.down_proj": "ffn_down", "self_attn.qkv_proj": "attn_qkv", "mlp.gate_up_proj": "ffn_up", "block_sparse_moe.gate": "ffn_gate_inp", "mlp.gate": "ffn_gate_inp",
               "mlp.shared_expert.gate_proj": "ffn_gate_shexp", "mlp.shared_expert.up_proj": "ffn_up_shexp",
               "mlp.shared_expert.down_proj": "ffn_down_shexp", "mlp.shared_expert_gate": "ffn_gate_inp_shexp"}
GLOBAL_NAMES = {"model.embed_tokens": "token_embd", "model.norm": "output_norm", "lm_head": "output"}
# Experts: Mixtral's w1 / w2 / w3 (gate / down / up), Qwen-MoE's gate_proj / down_proj / up_proj;
# the order the converter emits the stacked tensors in.
EXPERT_NAMES = {"mixtral": [("w1", "ffn_gate_exps"), ("w2", "ffn_down_exps"), ("w3", "ffn_up_exps")],
                "qwen": [("down_proj", "ffn_down_exps"), ("gate_proj", "ffn_gate_exps"), ("up_proj", "ffn_up_exps")]}
F32_ALWAYS = {"ffn_gate_inp", "ffn_gate_inp_shexp"}  # FFN_GATE_INP, FFN_GATE_INP_SHEXP
SKIPPED_SUFFIXES = (".attention.masked_bias", ".attention.bias", ".rotary_emb.inv_freq")


def permute_qk(w, n_head):
    """LlamaModel.permute: rows of each head, in Hugging Face's rotate-half order (pairs (j,
    j + d/2)), put in GGML's interleaved order (pairs (2j, 2j + 1)): with d = rows / n_head,
    new[h*d + 2j + a] = old[h*d + a*d/2 + j] for a in {0, 1}, j < d/2. q_proj uses n_head,
    k_proj n_head_kv; a bias (1-D) is permuted the same way."""
    w = np.asarray(w)
    rows = w.shape[0]
    return w.reshape(n_head, 2, rows // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def unpermute_qk(w, n_head):
    """The inverse of permute_qk."""
    w = np.asarray(w)
    rows = w.shape[0]
    return w.reshape(n_head, rows // n_head // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def llama3_rope_factors(config, original_context=None):
    """LlamaModel.generate_extra_tensors: rope_freqs for rope_type "llama3", computed in float32
    torch as the converter does (None for other RoPE). The converter takes the original context
    from the config's top level (hparams["original_max_position_embeddings"], default 8192), not
    from rope_scaling: `original_context` overrides it (e.g. with
    config["rope_scaling"]["original_max_position_embeddings"] to match the Hugging Face model)."""
    params = config.get("rope_parameters", config.get("rope_scaling")) or {}
    params = params.get("full_attention", params)
    if str(params.get("rope_type", params.get("type", ""))).lower() != "llama3":
        return None
    import torch  # the converter's float32 arithmetic, bit for bit
    base = params.get("rope_theta", config.get("rope_theta", 10000.0))
    dim = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
    freqs = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim))
    factor = params.get("factor", 8.0)
    low_freq_factor = params.get("low_freq_factor", 1.0)
    high_freq_factor = params.get("high_freq_factor", 4.0)
    old_context_len = (config.get("original_max_position_embeddings", 8192) if original_context is None
                       else original_context)
    low_freq_wavelen = old_context_len / low_freq_factor
    high_freq_wavelen = old_context_len / high_freq_factor
    factors = []
    for freq in freqs:
        wavelen = 2 * math.pi / freq
        if wavelen < high_freq_wavelen:
            factors.append(1)
        elif wavelen > low_freq_wavelen:
            factors.append(factor)
        else:
            smooth = (old_context_len / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
            factors.append(1 / ((1 - smooth) / factor + smooth))
    return torch.tensor(factors, dtype=torch.float32).numpy()


def _weight_count_label(n, min_digits=2):
    """gguf-py utility.model_weight_count_rounded_notation."""
    if n >= 1e12:
        scaled, suffix = n * 1e-12, "T"
    elif n >= 1e9:
        scaled, suffix = n * 1e-9, "B"
    elif n >= 1e6:
        scaled, suffix = n * 1e-6, "M"
    else:
        scaled, suffix = n * 1e-3, "K"
    fix = max(min_digits - len(str(round(scaled)).lstrip("0")), 0)
    return f"{scaled:.{fix}f}{suffix}"


def size_label(tensors):
    """gguf-py's GGUFWriter.get_total_parameter_count + utility.size_label over [(name, NumPy
    shape)]: "<E>x<per-expert size>" with experts, else the total, e.g. "262K"."""
    total = shared = expert = expert_sum = n_expert_tensors = 0
    for name, shape in tensors:
        size = int(np.prod(shape, dtype=np.int64))
        if "_exps." in name and len(shape) >= 3:
            count = shape[-2 if ".bias" in name else -3]
            expert += size // count
            expert_sum += count
            n_expert_tensors += 1
        else:
            shared += size
        total += size
    count = expert_sum // n_expert_tensors if n_expert_tensors else 0
    if count > 0:
        return f"{count}x{_weight_count_label(shared + expert)}"
    return _weight_count_label(total)


def _tensor_type(gguf_name, shape, quantized_type):
    """The converter's choice (ModelBase.prepare_tensors): F32 for 1-D tensors, *_norm.weight, the
    routers and anything not ending in .weight; the ftype's type otherwise."""
    base = gguf_name.rsplit(".", 1)[0].split(".")[-1]
    if len(shape) <= 1 or gguf_name.endswith("_norm.weight") or base in F32_ALWAYS \
            or not gguf_name.endswith(".weight"):
        return "F32"
    return quantized_type


def _use_more_bits(i, n):
    """llama.cpp's use_more_bits (llama-quant.cpp): the layers a K mixture gives more bits, the
    first and last eighth of the n and every third one between."""
    return i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2


def _k_m_type(base_type, gguf_name, shape, n_layer, tied):
    """llama.cpp's LLAMA_FTYPE_MOSTLY_Q4_K_M (base_type Q4_K) and Q5_K_M (Q5_K) for a dense
    Llama-style model whose rows are whole super-blocks (llama_tensor_get_type; not its 70B,
    8-expert or attn_qkv rules): base_type, but Q6_K for the output (the token embedding when the
    model is tied and has none) and for attn_v and ffn_down on the layers use_more_bits picks;
    F32 where every ftype keeps it."""
    t = _tensor_type(gguf_name, shape, base_type)
    if t != base_type:
        return t
    base = gguf_name.rsplit(".", 1)[0].split(".")[-1]
    if base == "output" or (tied and base == "token_embd"):
        return "Q6_K"
    if base in ("attn_v", "ffn_down") and _use_more_bits(int(gguf_name.split(".")[1]), n_layer):
        return "Q6_K"
    return base_type


def _q4_k_m_type(gguf_name, shape, n_layer, tied):
    return _k_m_type("Q4_K", gguf_name, shape, n_layer, tied)


def _q5_k_m_type(gguf_name, shape, n_layer, tied):
    return _k_m_type("Q5_K", gguf_name, shape, n_layer, tied)


def _q3_k_m_type(gguf_name, shape, n_layer, tied):
    """llama.cpp's LLAMA_FTYPE_MOSTLY_Q3_K_M for a dense Llama-style model whose rows are whole
    super-blocks (llama_tensor_get_type, not its 70B or 8-expert rules): Q3_K, but Q6_K for the
    output (the token embedding when tied), Q5_K for attn_v of the first two layers and Q4_K for
    the others', Q4_K for attn_output, and for ffn_down Q5_K on the first n_layer / 16 layers and
    Q4_K on the rest (its Q3_K branch is Falcon's); F32 where every ftype keeps it."""
    t = _tensor_type(gguf_name, shape, "Q3_K")
    if t != "Q3_K":
        return t
    base = gguf_name.rsplit(".", 1)[0].split(".")[-1]
    if base == "output" or (tied and base == "token_embd"):
        return "Q6_K"
    if base in ("attn_v", "ffn_down", "attn_output"):
        layer = int(gguf_name.split(".")[1])
        if base == "attn_v":
            return "Q5_K" if layer < 2 else "Q4_K"
        if base == "ffn_down":
            return "Q5_K" if layer < n_layer // 16 else "Q4_K"
        return "Q4_K"
    return "Q3_K"


# Mixtures of types, as llama.cpp's quantize writes them: ftype -> (the file_type it records,
# the type of each tensor from its name, shape, the layer count and whether the model is tied).
MIXTURES = {"q3_k_m": (12, _q3_k_m_type), "q4_k_m": (15, _q4_k_m_type),
            "q5_k_m": (17, _q5_k_m_type)}


def convert(hf_dir, out_path, ftype="f32", *, extra_metadata=None, alignment=None, name=None,
            llama3_original_context=None, allow_dense_moe_layers=False):
    """Converts the Hugging Face checkpoint folder hf_dir (config.json, model.safetensors or shards
    with model.safetensors.index.json) into the GGUF file out_path as llama.cpp's
    convert_hf_to_gguf.py lays it out (see the module's docstring), its weights in `ftype`.

    extra_metadata: {key: value} set last (plain values typed by infer_value, or GgufValue; None
        removes the key).
    alignment: writes general.alignment (uint32) and aligns the data to it (default: no key, 32).
    name: general.name (default: config's _name_or_path's last part, else the folder's name).
    llama3_original_context: the original context of llama3 RoPE factors (llama3_rope_factors;
        default the converter's rule).
    allow_dense_moe_layers: qwen2moe / qwen3moe layers with a dense MLP (mlp_only_layers) make
        llama.cpp's converter fail ("Can not map tensor"; its MODEL_TENSORS for these
        architectures have no ffn_gate / ffn_up / ffn_down): raise the same way unless True, then
        write them as blk.N.ffn_gate / ffn_up / ffn_down.
    Returns {"architecture", "metadata" (the GgufWriter's), "tensors": [(name, ggml type name,
    NumPy shape)]} of what was written."""
    if ftype not in FTYPES and ftype not in MIXTURES:
        raise ValueError(f"unknown ftype {ftype!r} (one of {', '.join([*FTYPES, *MIXTURES])})")
    quantized_type, file_type = FTYPES[ftype] if ftype in FTYPES else (None, MIXTURES[ftype][0])
    with open(os.path.join(hf_dir, "config.json")) as f:
        config = json.load(f)
    if "text_config" in config:
        config = {**config, **config["text_config"]}
    model_type = config.get("model_type")
    if model_type not in ARCHITECTURES:
        raise ValueError(f"{hf_dir}: model_type {model_type!r} not converted (known: {', '.join(ARCHITECTURES)})")
    arch = ARCHITECTURES[model_type]
    allowed = ARCH_TENSORS[arch] | (_DENSE if allow_dense_moe_layers else set())
    n_head = config["num_attention_heads"]
    n_head_kv = config.get("num_key_value_heads", n_head)
    n_experts = config.get("num_local_experts", config.get("num_experts"))
    experts_kind = "mixtral" if model_type == "mixtral" else "qwen"
    tied = bool(config.get("tie_word_embeddings", model_type == "gemma")) or arch == "gemma"

    out = []  # (gguf name, float array) in the converter's order
    factors = llama3_rope_factors(config, llama3_original_context) if arch == "llama" else None
    if factors is not None:
        out.append(("rope_freqs.weight", factors))

    pending = {}  # layer -> {hf name: array} of experts not yet stacked
    expert_re = re.compile(r"^model\.layers\.(\d+)\.(?:block_sparse_moe|mlp)\.experts\.(\d+)\.(\w+)\.weight$")
    layer_re = re.compile(r"^model\.layers\.(\d+)\.(.+)\.(weight|bias)$")
    global_re = re.compile(r"^(model\.embed_tokens|model\.norm|lm_head)\.(weight|bias)$")
    for part in checkpoint_parts(hf_dir):
        for hf_name, w in read_safetensors(os.path.join(hf_dir, part)).items():
            if hf_name.endswith(SKIPPED_SUFFIXES):
                continue
            if w.dtype not in (np.float16, np.float32):  # the converter's rule (bf16 already widened)
                w = w.astype(np.float32)
            if arch == "gemma" and hf_name.endswith("norm.weight"):
                w = w + 1  # GemmaModel.modify_tensors: llama.cpp's Gemma norms scale by the weight
            m = expert_re.match(hf_name)
            if m:
                layer = int(m.group(1))
                pending.setdefault(layer, {})[hf_name] = w
                if len(pending[layer]) >= n_experts * 3:
                    for hf_w, gguf_base in EXPERT_NAMES[experts_kind]:
                        prefix = "block_sparse_moe" if experts_kind == "mixtral" else "mlp"
                        stack = [pending[layer].pop(f"model.layers.{layer}.{prefix}.experts.{e}.{hf_w}.weight")
                                 for e in range(n_experts)]
                        if gguf_base not in allowed:
                            raise ValueError(f"Can not map tensor {hf_name!r} for {arch}")
                        out.append((f"blk.{layer}.{gguf_base}.weight", np.stack(stack, axis=0)))
                continue
            m = global_re.match(hf_name)
            if m:
                base, suffix = GLOBAL_NAMES[m.group(1)], m.group(2)
                if base == "output" and tied:
                    continue  # transformers saves no lm_head for tied embeddings; skip one if present
                out.append((f"{base}.{suffix}", w))
                continue
            m = layer_re.match(hf_name)
            if not m or m.group(2) not in LAYER_NAMES or LAYER_NAMES[m.group(2)] not in allowed:
                raise ValueError(f"Can not map tensor {hf_name!r} (architecture {arch}"
                                 + (", a dense MLP layer: allow_dense_moe_layers=True writes it"
                                    if m and m.group(2) in ("mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")
                                    else "") + ")")
            layer, base, suffix = int(m.group(1)), LAYER_NAMES[m.group(2)], m.group(3)
            if arch == "llama" and base == "attn_q":
                w = permute_qk(w, n_head)
            elif arch == "llama" and base == "attn_k":
                w = permute_qk(w, n_head_kv)
            out.append((f"blk.{layer}.{base}.{suffix}", w))
    left = [k for d in pending.values() for k in d]
    if left:
        raise ValueError(f"Unprocessed experts: {left}")

    writer = GgufWriter(alignment=None)
    writer.add_string("general.architecture", arch)
    if alignment is not None:
        writer.add_uint32("general.alignment", alignment)
    if ftype in MIXTURES:
        mixed = MIXTURES[ftype][1]
        typed = [(n, mixed(n, w.shape, config["num_hidden_layers"], tied), w) for n, w in out]
    else:
        typed = [(n, _tensor_type(n, w.shape, quantized_type), w) for n, w in out]
    for n, t, w in typed:  # before the metadata, so that a bad shape fails first
        writer.add_tensor(n, w, t)

    writer.add_string("general.type", "model")
    if name is None:
        name = os.path.basename(config["_name_or_path"]) if config.get("_name_or_path") else \
            os.path.basename(os.path.abspath(hf_dir))
    writer.add_string("general.name", name)
    writer.add_string("general.size_label", size_label([(n, w.shape) for n, _, w in typed]))
    p = f"{arch}."
    writer.add_uint32(p + "block_count", config["num_hidden_layers"])
    if "max_position_embeddings" in config:
        writer.add_uint32(p + "context_length", config["max_position_embeddings"])
    writer.add_uint32(p + "embedding_length", config["hidden_size"])
    if "intermediate_size" in config:
        writer.add_uint32(p + "feed_forward_length", config["intermediate_size"])
    writer.add_uint32(p + "attention.head_count", n_head)
    if "num_key_value_heads" in config:
        writer.add_uint32(p + "attention.head_count_kv", config["num_key_value_heads"])
    rope = config.get("rope_parameters", config.get("rope_scaling")) or {}
    rope = rope.get("full_attention", rope)
    rope_type, rope_factor = rope.get("rope_type", rope.get("type")), rope.get("factor")
    if rope_type == "linear" and rope_factor is not None:
        writer.add_string(p + "rope.scaling.type", "linear")
        writer.add_float32(p + "rope.scaling.factor", rope_factor)
    elif rope_type == "yarn" and rope_factor is not None:
        writer.add_string(p + "rope.scaling.type", "yarn")
        writer.add_float32(p + "rope.scaling.factor", rope_factor)
        writer.add_uint32(p + "rope.scaling.original_context_length", rope["original_max_position_embeddings"])
        for hf_key, key in (("extrapolation_factor", "yarn_ext_factor"), ("attention_factor", "yarn_attn_factor"),
                            ("beta_fast", "yarn_beta_fast"), ("beta_slow", "yarn_beta_slow")):
            if rope.get(hf_key) is not None:
                writer.add_float32(p + "rope.scaling." + key, rope[hf_key])
    theta = rope.get("rope_theta", config.get("rope_theta"))
    if theta is not None and arch != "gemma":  # GemmaModel writes no rope.freq_base
        writer.add_float32(p + "rope.freq_base", theta)
    if "rms_norm_eps" in config:
        writer.add_float32(p + "attention.layer_norm_rms_epsilon", config["rms_norm_eps"])
    if n_experts is not None:
        writer.add_uint32(p + "expert_count", n_experts)
    if config.get("num_experts_per_tok") is not None:
        writer.add_uint32(p + "expert_used_count", config["num_experts_per_tok"])
    if config.get("head_dim") is not None:
        writer.add_uint32(p + "attention.key_length", config["head_dim"])
        writer.add_uint32(p + "attention.value_length", config["head_dim"])
    writer.add_uint32("general.file_type", file_type)
    if arch == "phi3":  # Phi3MiniModel.set_gguf_parameters
        writer.add_uint32(p + "rope.dimension_count", config["hidden_size"] // n_head)
        if config.get("sliding_window") is not None:
            writer.add_uint32(p + "attention.sliding_window", config["sliding_window"])
    if arch == "llama":
        writer.add_uint32(p + "vocab_size", config["vocab_size"])
        writer.add_uint32(p + "rope.dimension_count",
                          config.get("head_dim") or config["hidden_size"] // n_head)
    if arch in ("qwen2moe", "qwen3moe"):
        if config.get("moe_intermediate_size") is not None:
            writer.add_uint32(p + "expert_feed_forward_length", config["moe_intermediate_size"])
        if config.get("shared_expert_intermediate_size") is not None:
            writer.add_uint32(p + "expert_shared_feed_forward_length", config["shared_expert_intermediate_size"])
    writer.add_uint32("general.quantization_version", GGML_QUANT_VERSION)
    for kind in ("bos", "eos"):  # gguf-py SpecialVocab._set_special_token: integer ids < n_vocab
        tid = config.get(f"{kind}_token_id")
        if isinstance(tid, int) and not isinstance(tid, bool) and 0 <= tid < config["vocab_size"]:
            writer.add_uint32(f"tokenizer.ggml.{kind}_token_id", tid)
    for key, value in (extra_metadata or {}).items():
        if value is None:
            writer.remove(key)
        else:
            writer.add(key, value)
    writer.write(out_path)
    return {"architecture": arch, "metadata": dict(writer.metadata),
            "tensors": [(n, t, tuple(w.shape)) for n, t, w in typed]}


# ---- ggml's own reader, through ctypes ----------------------------------------------------------

DEFAULT_LIBGGML = "/tmp/ggml-build/src/libggml-base.so"


class Ggml:
    """libggml-base's GGUF reader and type traits via ctypes (gguf.h, ggml.h)."""

    def __init__(self, path=DEFAULT_LIBGGML):
        import ctypes as C
        self.C = C
        lib = self.lib = C.CDLL(path)

        class InitParams(C.Structure):
            _fields_ = [("no_alloc", C.c_bool), ("ctx", C.POINTER(C.c_void_p))]

        class TypeTraits(C.Structure):
            _fields_ = [("type_name", C.c_char_p), ("blck_size", C.c_int64), ("blck_size_interleave", C.c_int64),
                        ("type_size", C.c_size_t), ("is_quantized", C.c_bool), ("to_float", C.c_void_p),
                        ("from_float_ref", C.c_void_p)]
        self.InitParams, self.TypeTraits = InitParams, TypeTraits
        sig = {"gguf_init_from_file": (C.c_void_p, [C.c_char_p, InitParams]),
               "gguf_free": (None, [C.c_void_p]),
               "gguf_get_version": (C.c_uint32, [C.c_void_p]),
               "gguf_get_alignment": (C.c_size_t, [C.c_void_p]),
               "gguf_get_data_offset": (C.c_size_t, [C.c_void_p]),
               "gguf_get_n_kv": (C.c_int64, [C.c_void_p]),
               "gguf_get_key": (C.c_char_p, [C.c_void_p, C.c_int64]),
               "gguf_get_kv_type": (C.c_int, [C.c_void_p, C.c_int64]),
               "gguf_get_arr_type": (C.c_int, [C.c_void_p, C.c_int64]),
               "gguf_get_arr_n": (C.c_size_t, [C.c_void_p, C.c_int64]),
               "gguf_get_arr_data": (C.c_void_p, [C.c_void_p, C.c_int64]),
               "gguf_get_arr_str": (C.c_char_p, [C.c_void_p, C.c_int64, C.c_size_t]),
               "gguf_get_val_str": (C.c_char_p, [C.c_void_p, C.c_int64]),
               "gguf_get_val_data": (C.c_void_p, [C.c_void_p, C.c_int64]),
               "gguf_get_n_tensors": (C.c_int64, [C.c_void_p]),
               "gguf_get_tensor_name": (C.c_char_p, [C.c_void_p, C.c_int64]),
               "gguf_get_tensor_type": (C.c_int, [C.c_void_p, C.c_int64]),
               "gguf_get_tensor_offset": (C.c_size_t, [C.c_void_p, C.c_int64]),
               "gguf_get_tensor_size": (C.c_size_t, [C.c_void_p, C.c_int64]),
               "ggml_get_tensor": (C.c_void_p, [C.c_void_p, C.c_char_p]),
               "ggml_get_data": (C.c_void_p, [C.c_void_p]),
               "ggml_nbytes": (C.c_size_t, [C.c_void_p]),
               "ggml_n_dims": (C.c_int, [C.c_void_p]),
               "ggml_free": (None, [C.c_void_p]),
               "ggml_get_type_traits": (C.POINTER(TypeTraits), [C.c_int]),
               "ggml_quantize_chunk": (C.c_size_t, [C.c_int, C.c_void_p, C.c_void_p, C.c_int64, C.c_int64,
                                                    C.c_int64, C.c_void_p])}
        for fn, (res, args) in sig.items():
            f = getattr(lib, fn)
            f.restype, f.argtypes = res, args
        scalar = {UINT8: C.c_uint8, INT8: C.c_int8, UINT16: C.c_uint16, INT16: C.c_int16, UINT32: C.c_uint32,
                  INT32: C.c_int32, FLOAT32: C.c_float, BOOL: C.c_bool, UINT64: C.c_uint64, INT64: C.c_int64,
                  FLOAT64: C.c_double}
        self.scalar = scalar
        self.dtypes = {t: np.dtype(c) for t, c in scalar.items()}

    def read(self, path, with_data=True):
        """What ggml's gguf_init_from_file sees: {"version", "alignment", "data_offset", "metadata"
        {key: value}, "types" {key: (type, array type)}, "tensors" {name: {"type", "offset",
        "nbytes", "raw" (the bytes ggml loaded into its context)}}}; raises if ggml refuses the file."""
        C, lib = self.C, self.lib
        ctx = C.c_void_p()
        params = self.InitParams(False, C.pointer(ctx)) if with_data else self.InitParams(True, None)
        g = lib.gguf_init_from_file(path.encode(), params)
        if not g:
            raise ValueError(f"ggml's gguf_init_from_file refused {path}")
        try:
            out = {"version": lib.gguf_get_version(g), "alignment": lib.gguf_get_alignment(g),
                   "data_offset": lib.gguf_get_data_offset(g), "metadata": {}, "types": {}, "tensors": {}}
            for i in range(lib.gguf_get_n_kv(g)):
                key = lib.gguf_get_key(g, i).decode()
                t = lib.gguf_get_kv_type(g, i)
                if t == ARRAY:
                    at, n = lib.gguf_get_arr_type(g, i), lib.gguf_get_arr_n(g, i)
                    if at == STRING:
                        v = [lib.gguf_get_arr_str(g, i, j).decode("utf-8", errors="surrogateescape")
                             for j in range(n)]
                    else:
                        ptr = lib.gguf_get_arr_data(g, i)
                        v = np.ctypeslib.as_array(C.cast(ptr, C.POINTER(self.scalar[at])), (n,)).copy().tolist() \
                            if n else []
                    out["metadata"][key], out["types"][key] = v, (ARRAY, at)
                elif t == STRING:
                    out["metadata"][key] = lib.gguf_get_val_str(g, i).decode("utf-8", errors="surrogateescape")
                    out["types"][key] = (STRING, None)
                else:
                    ptr = lib.gguf_get_val_data(g, i)
                    out["metadata"][key] = C.cast(ptr, C.POINTER(self.scalar[t])).contents.value
                    out["types"][key] = (t, None)
            for i in range(lib.gguf_get_n_tensors(g)):
                name = lib.gguf_get_tensor_name(g, i).decode()
                info = {"type": lib.gguf_get_tensor_type(g, i), "offset": lib.gguf_get_tensor_offset(g, i),
                        "nbytes": lib.gguf_get_tensor_size(g, i)}
                if with_data:
                    t = lib.ggml_get_tensor(ctx, name.encode())
                    n = lib.ggml_nbytes(t)
                    info["raw"] = C.string_at(lib.ggml_get_data(t), n)
                out["tensors"][name] = info
            return out
        finally:
            lib.gguf_free(g)
            if with_data and ctx:
                lib.ggml_free(ctx)

    def dequantize(self, raw, ggml_type, n):
        """ggml's to_float of n values stored as ggml_type (float32 array)."""
        C = self.C
        traits = self.lib.ggml_get_type_traits(GGML_TYPES[_type_name(ggml_type)][0]).contents
        to_float = C.CFUNCTYPE(None, C.c_void_p, C.POINTER(C.c_float), C.c_int64)(traits.to_float)
        dst = np.zeros(n, np.float32)
        src = C.create_string_buffer(bytes(raw), len(raw))
        to_float(src, dst.ctypes.data_as(C.POINTER(C.c_float)), n)
        return dst

    def quantize(self, x, ggml_type):
        """ggml_quantize_chunk (GGML's reference quantizers, no importance matrix) of x [rows, n]."""
        x = np.ascontiguousarray(x, dtype=np.float32)
        rows, n = x.shape
        dst = self.C.create_string_buffer(tensor_nbytes(x.shape, ggml_type))
        size = self.lib.ggml_quantize_chunk(GGML_TYPES[_type_name(ggml_type)][0], x.ctypes.data, dst, 0, rows,
                                            n, None)
        return dst.raw[:size]


# ---- self-test ----------------------------------------------------------------------------------

def _hf_expectations(hf_dir, config):
    """{gguf name: float64 array} from the safetensors by the rules written out again here, apart
    from convert(): q / k un-permuted later by the test, experts stacked, routers named."""
    import glob
    t = {}
    for f in sorted(glob.glob(os.path.join(hf_dir, "*.safetensors"))):
        t.update({k: v.astype(np.float64) for k, v in read_safetensors(f).items()})
    gemma = config["model_type"] == "gemma"  # norms written as 1 + w, always tied
    if gemma:
        t = {k: v + 1 if k.endswith("norm.weight") else v for k, v in t.items()}
    exp = {"token_embd.weight": t["model.embed_tokens.weight"], "output_norm.weight": t["model.norm.weight"]}
    if "lm_head.weight" in t and not config.get("tie_word_embeddings") and not gemma:
        exp["output.weight"] = t["lm_head.weight"]
    n_exp = config.get("num_local_experts", config.get("num_experts"))
    for layer in range(config["num_hidden_layers"]):
        hp, gp = f"model.layers.{layer}.", f"blk.{layer}."
        pairs = [("input_layernorm.weight", "attn_norm.weight"), ("post_attention_layernorm.weight", "ffn_norm.weight")]
        for x in ("q", "k", "v", "o"):
            g = "attn_output" if x == "o" else f"attn_{x}"
            pairs += [(f"self_attn.{x}_proj.weight", f"{g}.weight"), (f"self_attn.{x}_proj.bias", f"{g}.bias")]
        pairs += [("self_attn.q_norm.weight", "attn_q_norm.weight"), ("self_attn.k_norm.weight", "attn_k_norm.weight"),
                  ("self_attn.qkv_proj.weight", "attn_qkv.weight"), ("mlp.gate_up_proj.weight", "ffn_up.weight")]
        for x in ("gate", "up", "down"):
            pairs += [(f"mlp.{x}_proj.weight", f"ffn_{x}.weight"), (f"mlp.{x}_proj.bias", f"ffn_{x}.bias"),
                      (f"mlp.shared_expert.{x}_proj.weight", f"ffn_{x}_shexp.weight")]
        pairs += [("block_sparse_moe.gate.weight", "ffn_gate_inp.weight"), ("mlp.gate.weight", "ffn_gate_inp.weight"),
                  ("mlp.shared_expert_gate.weight", "ffn_gate_inp_shexp.weight")]
        for h, g in pairs:
            if hp + h in t:
                exp[gp + g] = t[hp + h]
        for mix, g in (("w1", "gate"), ("w3", "up"), ("w2", "down")):
            if f"{hp}block_sparse_moe.experts.0.{mix}.weight" in t:
                exp[f"{gp}ffn_{g}_exps.weight"] = np.stack(
                    [t[f"{hp}block_sparse_moe.experts.{e}.{mix}.weight"] for e in range(n_exp)])
            if f"{hp}mlp.experts.0.{g}_proj.weight" in t:
                exp[f"{gp}ffn_{g}_exps.weight"] = np.stack(
                    [t[f"{hp}mlp.experts.{e}.{g}_proj.weight"] for e in range(n_exp)])
    return exp


def _expected_types(name, shape, quantized):
    if len(shape) == 1 or name.endswith("_norm.weight") or name.endswith(".bias") \
            or ".ffn_gate_inp" in name:
        return "F32"
    return quantized


def _unpermute_rows(w, n_head):
    """Index-formula inverse of the converter's permutation (written apart from unpermute_qk)."""
    rows = w.shape[0]
    d = rows // n_head
    src = np.empty(rows, dtype=np.int64)
    for h in range(n_head):
        for j in range(d // 2):
            for a in range(2):
                src[h * d + a * (d // 2) + j] = h * d + 2 * j + a  # HF row <- GGUF row
    return w[src]


def _format_selftest(ggml, root, fail):
    """Every metadata value type and array element type, odd tensor shapes, and a non-default
    alignment, through read_gguf and ggml's reader; a tensor at a wrong offset refused by both."""
    w = GgufWriter(alignment=16)
    values = {"t.u8": GgufValue(UINT8, 255), "t.i8": GgufValue(INT8, -128), "t.u16": GgufValue(UINT16, 65535),
              "t.i16": GgufValue(INT16, -32768), "t.u32": GgufValue(UINT32, 2**32 - 1),
              "t.i32": GgufValue(INT32, -2**31), "t.f32": GgufValue(FLOAT32, 0.1), "t.bool": True,
              "t.str": "héllo \u2603", "t.u64": GgufValue(UINT64, 2**64 - 1), "t.i64": GgufValue(INT64, -2**63),
              "t.f64": GgufValue(FLOAT64, 0.1), "t.empty_str": "",
              "t.arr_u8": np.array([0, 255], np.uint8), "t.arr_i8": np.array([-1, 1], np.int8),
              "t.arr_u16": np.array([1, 65535], np.uint16), "t.arr_i16": np.array([-2, 2], np.int16),
              "t.arr_u32": GgufValue(ARRAY, [1, 2**32 - 1], UINT32), "t.arr_i32": [1, -2, 3],
              "t.arr_f32": [0.5, -1.25], "t.arr_bool": [True, False, True],
              "t.arr_str": ["a", "", "\u00e9\u00e8"], "t.arr_u64": GgufValue(ARRAY, [2**64 - 1], UINT64),
              "t.arr_i64": np.array([-2**63, 5], np.int64), "t.arr_f64": np.array([1e300, -0.0]),
              "t.arr_empty": GgufValue(ARRAY, [], INT32)}
    for k, v in values.items():
        w.add(k, v)
    rng = np.random.default_rng(5)
    arrays = {"a.f32": (rng.standard_normal((3, 5)).astype(np.float32), "F32"),
              "a.f16": (rng.standard_normal(7).astype(np.float32), "F16"),
              "a.bf16": (np.array([1.0, np.nan, -np.inf, 3.0000002, 1 + 2**-8, 1 + 3 * 2**-8], np.float32), "BF16"),
              "a.q8": (rng.standard_normal((2, 3, 64)).astype(np.float32), "Q8_0"),
              "a.q4": (rng.standard_normal((1, 32)).astype(np.float32), "Q4_0"),
              "a.i32": (np.arange(6, dtype=np.int32).reshape(2, 3), "I32")}
    for n, (a, t) in arrays.items():
        w.add_tensor(n, a, t)
    path = os.path.join(root, "format.gguf")
    w.write(path)
    if w.to_bytes() != open(path, "rb").read():
        fail("format: to_bytes differs from write")
    g = read_gguf(path)
    for k, v in values.items():
        want = infer_value(v)
        got = g["metadata"][k]
        ref = want.value.tolist() if isinstance(want.value, np.ndarray) else want.value
        if want.vtype == FLOAT32:
            ref = float(np.float32(ref))
        if want.vtype == ARRAY and want.subtype == FLOAT32:
            ref = [float(np.float32(x)) for x in ref]
        if got != ref or g["types"][k] != (want.vtype, want.subtype if want.vtype == ARRAY else None):
            fail(f"format: {k}: read {got!r} {g['types'][k]}, wrote {ref!r}")
    if g["alignment"] != 16 or any(i["offset"] % 16 for i in g["tensors"].values()):
        fail("format: alignment 16 not honoured")
    for n, (a, t) in arrays.items():
        got = g["tensors"][n]
        if got["shape"] != a.shape or got["ne"] != tuple(reversed(a.shape)) or got["type_name"] != t:
            fail(f"format: tensor {n}: {got['shape']} {got['type_name']}")
    bf = g["tensors"]["a.bf16"]["data"]
    want_bf = [1.0, np.nan, -np.inf, 3.0, 1.0, 1 + 4 * 2**-8]  # ties to even: 1+2^-8 -> 1, 1+3*2^-8 -> 1+2^-6
    if not (np.isnan(bf[1]) and np.array_equal(np.delete(bf, 1), np.delete(np.array(want_bf, np.float32), 1))):
        fail(f"format: bf16 rounding {bf}")
    if ggml is not None:
        theirs = ggml.read(path)
        mine = read_gguf(path)
        for k, v in mine["metadata"].items():
            tv = theirs["metadata"][k]
            if mine["types"][k] != theirs["types"][k] or not (
                    np.array_equal(np.float32(v), np.float32(tv)) if mine["types"][k] == (FLOAT32, None) else v == tv):
                fail(f"format: ggml reads {k} = {tv!r} {theirs['types'][k]}, read_gguf {v!r} {mine['types'][k]}")
        for n, info in mine["tensors"].items():
            ti = theirs["tensors"][n]
            if (ti["type"], ti["offset"], ti["raw"]) != (info["type"], info["offset"], info["raw"]):
                fail(f"format: ggml sees tensor {n} differently")
        if theirs["alignment"] != 16 or theirs["data_offset"] != mine["data_offset"]:
            fail("format: ggml's alignment / data offset differ")
    # a file whose second tensor sits one alignment further: both readers must refuse it
    bad = GgufWriter()
    bad.add_tensor("x", np.zeros(8, np.float32))
    bad.add_tensor("y", np.zeros(8, np.float32))
    raw = bytearray(bad.to_bytes())
    at = raw.index(b"y") + 1 + 4 + 8 + 4  # name, n_dims, ne[0], type
    struct.pack_into("<Q", raw, at, 64)
    bad_path = os.path.join(root, "bad.gguf")
    open(bad_path, "wb").write(bytes(raw))
    try:
        read_gguf(bad_path)
        fail("format: read_gguf accepted a tensor past the end")
    except ValueError:
        pass
    if ggml is not None:
        try:
            ggml.read(bad_path)
            fail("format: ggml accepted a wrong offset")
        except ValueError:
            pass
    print("ok format: every value type, array type, tensor type, alignment 16" +
          (", ggml agrees" if ggml is not None else ""))


def selftest(lib_path=DEFAULT_LIBGGML, workdir=None, quick=False):
    """Writes every tiny checkpoint of hf_model_check.py, converts each in every ftype its shapes
    allow (and checks the others raise), reads every file back with read_gguf and, when lib_path
    exists, with ggml's reader; compares with the safetensors: F32 exact, F16 / BF16 equal to
    torch's rounding, block formats equal to ggml_blocks' quantize -> dequantize of the same rows
    and (with ggml) byte-equal to ggml_quantize_chunk and dequantized equal by ggml's to_float.
    Returns the number of failures."""
    import tempfile
    torch = require("torch")
    import hf_model_check as hmc
    ggml = Ggml(lib_path) if lib_path and os.path.exists(lib_path) else None
    if ggml is None:
        print(f"gguf_writer selftest: {lib_path} missing: ggml's reader not used")
    failures = []

    def fail(msg):
        failures.append(msg)
        print("FAIL:", msg)

    tmp = tempfile.TemporaryDirectory() if workdir is None else None
    root = workdir or tmp.name
    _format_selftest(ggml, root, fail)
    w = np.arange(4 * 16 * 3).reshape(64, 3)
    if not np.array_equal(unpermute_qk(permute_qk(w, 4), 4), w) or \
            not np.array_equal(_unpermute_rows(permute_qk(w, 4), 4), w) or \
            not np.array_equal(permute_qk(np.arange(8), 1), [0, 4, 1, 5, 2, 6, 3, 7]):
        fail("permute_qk / unpermute_qk are not inverse, or not the interleaving")
    # llama3_original_context taken from rope_scaling: the factors are Hugging Face's divisors
    llama = dict(hmc.LLAMA)
    model = hmc.Model.__new__(hmc.Model)
    model.c = llama
    hf_inv = model.inv_freq(llama["head_dim"]).numpy()
    plain = 1.0 / llama["rope_theta"] ** (np.arange(0, llama["head_dim"], 2) / llama["head_dim"])
    factors = llama3_rope_factors(llama, llama["rope_scaling"]["original_max_position_embeddings"])
    if not np.allclose(factors, plain / hf_inv, rtol=2e-6, atol=0):
        fail(f"llama3 factors with the config's original context: {factors} vs {plain / hf_inv}")
    ftypes = ["f32", "f16", "bf16", "q8_0", "q4_0", "q5_0", "iq4_nl", "q3_k", "q4_k", "q5_k", "q6_k", "iq4_xs"]
    for i, (case, c, dtype, shards, _) in enumerate(hmc.models()):
        if quick and i not in (0, 2, 7, 13):
            continue
        hf_dir = os.path.join(root, case)
        hmc.save(hf_dir, c, hmc.weights(c, dtype, 1000 + i), shards)
        arch = ARCHITECTURES[c["model_type"]]
        dense_moe = bool(c.get("mlp_only_layers")) and arch in ("qwen2moe", "qwen3moe")
        if dense_moe:
            try:
                convert(hf_dir, os.path.join(root, "refused.gguf"), "f32")
                fail(f"{case}: a dense layer in {arch} converted without allow_dense_moe_layers")
            except ValueError as e:
                if "Can not map tensor" not in str(e):
                    fail(f"{case}: unexpected error {e}")
        exp = _hf_expectations(hf_dir, c)
        n_head, n_kv = c["num_attention_heads"], c["num_key_value_heads"]
        for ftype in ftypes:
            qtype = FTYPES[ftype][0]
            block = GGML_TYPES[qtype][1]
            rows_ok = all(v.shape[-1] % block == 0 for k, v in exp.items()
                          if _expected_types(k, v.shape, qtype) == qtype)
            path = os.path.join(root, f"{case}.{ftype}.gguf")
            align = 64 if ftype == "q4_0" else None  # one alignment other than the default
            try:
                convert(hf_dir, path, ftype, alignment=align, allow_dense_moe_layers=dense_moe,
                        extra_metadata={"numesh.test.u8": GgufValue(UINT8, 7), "general.name": "t"})
            except ValueError as e:
                if rows_ok:
                    fail(f"{case} {ftype}: {e}")
                elif "not whole blocks" not in str(e):
                    fail(f"{case} {ftype}: unexpected error {e}")
                continue
            if not rows_ok:
                fail(f"{case} {ftype}: converted although some rows are not whole blocks")
                continue
            g = read_gguf(path)
            md = g["metadata"]
            if md["general.architecture"] != arch or md["general.file_type"] != FTYPES[ftype][1] \
                    or md[f"{arch}.block_count"] != c["num_hidden_layers"] or md["general.name"] != "t" \
                    or md["numesh.test.u8"] != 7 or g["types"]["numesh.test.u8"][0] != UINT8 \
                    or g["alignment"] != (align or 32):
                fail(f"{case} {ftype}: metadata {md}")
            names = set(g["tensors"]) - {"rope_freqs.weight"}
            if names != set(exp):
                fail(f"{case} {ftype}: tensors {sorted(names ^ set(exp))} differ")
                continue
            scaling = c.get("rope_scaling") or {}
            if ("rope_freqs.weight" in g["tensors"]) != (scaling.get("rope_type") == "llama3"):
                fail(f"{case} {ftype}: rope_freqs present: {'rope_freqs.weight' in g['tensors']}")
            if "rope_freqs.weight" in g["tensors"]:  # the converter's rule: original context 8192
                rf = g["tensors"]["rope_freqs.weight"]
                d = c.get("head_dim") or c["hidden_size"] // n_head
                inv = 1.0 / c["rope_theta"] ** (np.arange(0, d, 2) / d)
                low, high = scaling["low_freq_factor"], scaling["high_freq_factor"]
                wl, f_, lo, hi = 2 * math.pi / inv, scaling["factor"], 8192 / low, 8192 / high
                sm = (8192 / wl - low) / (high - low)
                want_f = np.where(wl < hi, 1.0, np.where(wl > lo, f_, 1 / ((1 - sm) / f_ + sm)))
                if rf["type_name"] != "F32" or rf["shape"] != (d // 2,) or \
                        not np.allclose(rf["data"], want_f, rtol=1e-5, atol=0):
                    fail(f"{case} {ftype}: rope_freqs {rf['data']} want {want_f}")
            for name, want in exp.items():
                info = g["tensors"][name]
                t = info["type_name"]
                if t != _expected_types(name, want.shape, qtype) or info["shape"] != want.shape:
                    fail(f"{case} {ftype} {name}: {t} {info['shape']} (want {want.shape})")
                    continue
                got = decode_tensor(info["raw"], info["shape"], t, dequantize=True).astype(np.float64)
                if arch == "llama" and (".attn_q." in name or ".attn_k." in name):
                    got = _unpermute_rows(got, n_head if ".attn_q." in name else n_kv)
                w32 = torch.from_numpy(want).float()
                if t == "F32":
                    ref = w32.double().numpy()
                elif t == "F16":
                    ref = w32.half().double().numpy()
                elif t == "BF16":
                    ref = w32.bfloat16().double().numpy()
                else:
                    ref = ggml_blocks.stored_rows(
                        w32.numpy().reshape(-1, want.shape[-1]), qtype.lower()).reshape(want.shape)
                if not np.array_equal(got, ref):
                    fail(f"{case} {ftype} {name}: values differ (max {np.abs(got - ref).max()})")
            if ggml is not None:
                mine = g
                theirs = ggml.read(path)
                if theirs["version"] != 3 or theirs["alignment"] != mine["alignment"] \
                        or theirs["data_offset"] != mine["data_offset"]:
                    fail(f"{case} {ftype}: ggml header {theirs['alignment']} {theirs['data_offset']}")
                if list(theirs["metadata"]) != list(mine["metadata"]) or theirs["types"] != mine["types"]:
                    fail(f"{case} {ftype}: ggml keys/types differ")
                for k, v in mine["metadata"].items():
                    tv = theirs["metadata"][k]
                    same = (np.float32(v) == np.float32(tv)) if mine["types"][k][0] == FLOAT32 else v == tv
                    if not same:
                        fail(f"{case} {ftype}: {k} = {tv!r} by ggml, {v!r} by read_gguf")
                if list(theirs["tensors"]) != list(mine["tensors"]):
                    fail(f"{case} {ftype}: ggml tensor order differs")
                for n, info in mine["tensors"].items():
                    ti = theirs["tensors"][n]
                    if (ti["type"], ti["offset"], ti["nbytes"], ti["raw"]) != \
                            (info["type"], info["offset"], info["nbytes"], info["raw"]):
                        fail(f"{case} {ftype} {n}: ggml sees type {ti['type']} offset {ti['offset']} "
                             f"size {ti['nbytes']}")
                    if info["type_name"] in BLOCK_CODECS:
                        shape = info["shape"]
                        ours = decode_tensor(info["raw"], shape, info["type"], dequantize=True).reshape(-1)
                        if not np.array_equal(ggml.dequantize(info["raw"], info["type"], ours.size), ours):
                            fail(f"{case} {ftype} {n}: ggml's to_float differs from ggml_blocks'")
                        if n in exp:
                            src = exp[n].astype(np.float32)
                            if arch == "llama" and (".attn_q." in n or ".attn_k." in n):
                                src = permute_qk(src, n_head if ".attn_q." in n else n_kv)
                            if ggml.quantize(src.reshape(-1, shape[-1]), info["type"]) != info["raw"]:
                                fail(f"{case} {ftype} {n}: bytes differ from ggml_quantize_chunk's")
            print(f"ok {case} {ftype}: {len(g['tensors'])} tensors, {len(g['metadata'])} keys"
                  + (", ggml agrees" if ggml is not None else ""))
    if tmp is not None:
        tmp.cleanup()
    return len(failures)


def _dump(path):
    g = read_gguf(path)
    print(f"GGUF v{g['version']}, alignment {g['alignment']}, data at {g['data_offset']}")
    for k, v in g["metadata"].items():
        t, sub = g["types"][k]
        tn = VALUE_TYPE_NAMES[t] + (f"[{VALUE_TYPE_NAMES[sub]}]" if sub is not None else "")
        shown = v if not isinstance(v, list) or len(v) <= 8 else f"{v[:8]}... ({len(v)})"
        print(f"  {k}: {tn} = {shown}")
    for n, info in g["tensors"].items():
        print(f"  {n}: {info['type_name']} ne={list(info['ne'])} offset={info['offset']} bytes={info['nbytes']}")


def main(argv):
    if len(argv) >= 2 and argv[1] == "convert" and len(argv) == 5:
        s = convert(argv[2], argv[3], argv[4])
        print(f"{argv[3]}: {s['architecture']}, {len(s['tensors'])} tensors")
        return 0
    if len(argv) == 3 and argv[1] == "dump":
        _dump(argv[2])
        return 0
    if len(argv) >= 2 and argv[1] == "selftest":
        lib = argv[argv.index("--ggml") + 1] if "--ggml" in argv else DEFAULT_LIBGGML
        n = selftest(lib, quick="--quick" in argv)
        print("gguf_writer selftest:", "all agree" if n == 0 else f"{n} failures")
        return 1 if n else 0
    print(__doc__.split("\n\n")[1])
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
