"""GGML's Q8_0 and Q4_0 blocks in NumPy, written from ggml-quants.c's reference definitions
(quantize_row_q8_0_ref, quantize_row_q4_0_ref, dequantize_row_q8_0 / q4_0), and the 8-bit
activations numesh's block-format kernels multiply (ops/kernels/block_gemm.hpp): the references
of tests/runtime/block_formats_check.py and of the model checks with quantized weights.
"""
import numpy as np

BLOCK = 32
Q8_0 = np.dtype([("d", "<u2"), ("qs", "i1", (32,))])  # GGML's block_q8_0, 34 bytes, packed
Q4_0 = np.dtype([("d", "<u2"), ("qs", "u1", (16,))])  # GGML's block_q4_0, 18 bytes
assert Q8_0.itemsize == 34 and Q4_0.itemsize == 18
F32 = np.float32
F32_MAX = float(np.finfo(F32).max)


def f16_bits(d):
    with np.errstate(over="ignore"):
        return d.astype(np.float16).view(np.uint16)


def reciprocal(d):
    """1/d in f32, 0 where d is 0 (GGML) or where 1/d overflows (q8_0 codes 0 then, as x86)."""
    with np.errstate(divide="ignore", over="ignore"):
        inv = (F32(1) / d).astype(F32)
    return np.where((d != 0) & np.isfinite(inv), inv, F32(0)).astype(F32)


def defined_in_ggml(d):
    """The blocks where GGML's C is defined: a zero scale or a finite reciprocal."""
    with np.errstate(divide="ignore", over="ignore"):
        return (d == 0) | np.isfinite(F32(1) / d)


def q8_0_scale(x):
    return (np.abs(x).max(axis=1) / F32(127)).astype(F32)


def roundf(p):
    """C's roundf (half away from zero), exact: float64 holds |p| + 0.5 for any f32 |p| < 2^52."""
    p = p.astype(np.float64)
    return np.sign(p) * np.floor(np.abs(p) + 0.5)


def quantize_q8_0(x):
    d = q8_0_scale(x)
    scaled = (x * reciprocal(d)[:, None]).astype(F32)
    out = np.zeros(len(x), Q8_0)
    out["d"] = f16_bits(d)
    out["qs"] = roundf(scaled).astype(np.int8)
    return out


def q4_0_scale(x):
    ax = np.abs(x)
    amax = ax.max(axis=1)
    first = np.argmax(ax, axis=1)  # the first of equal magnitudes, as GGML's strict <
    m = np.where(amax > 0, x[np.arange(len(x)), first], F32(0)).astype(F32)  # +0 for zeros
    return (m / F32(-8)).astype(F32)


def q4_0_codes(x, fused=False):
    d = q4_0_scale(x)
    idv = reciprocal(d)[:, None]
    if fused:  # what one multiply-add would give (exact where it is used to pick blocks)
        shifted = (x.astype(np.float64) * idv.astype(np.float64) + 8.5).astype(F32)
    else:
        shifted = (x * idv).astype(F32) + F32(8.5)
    q = np.minimum(15, np.trunc(shifted).astype(np.int64))
    return np.where(defined_in_ggml(d)[:, None], q, 0)  # 1/d overflows: code 0, as x86


def quantize_q4_0(x):
    q = q4_0_codes(x)
    out = np.zeros(len(x), Q4_0)
    out["d"] = f16_bits(q4_0_scale(x))
    out["qs"] = (q[:, :16] | (q[:, 16:] << 4)).astype(np.uint8)
    return out


def widened_scale(blocks):
    return np.ascontiguousarray(blocks["d"]).view(np.float16).astype(F32)


def dequantize_q8_0(blocks):
    with np.errstate(invalid="ignore", over="ignore"):
        return (blocks["qs"].astype(F32) * widened_scale(blocks)[:, None]).reshape(-1)


def dequantize_q4_0(blocks):
    q = np.concatenate([blocks["qs"] & 0x0F, blocks["qs"] >> 4], axis=1).astype(np.int64) - 8
    with np.errstate(invalid="ignore", over="ignore"):
        return (q.astype(F32) * widened_scale(blocks)[:, None]).reshape(-1)



def stored_rows(x, fmt):
    """x [rows, k] (k whole blocks) as a tensor of GGML format `fmt` ("q8_0" or "q4_0") holds it:
    each row quantized and dequantized, as f32."""
    x = np.ascontiguousarray(x, dtype=F32)
    blocks = x.reshape(-1, BLOCK)
    if fmt == "q8_0":
        values = dequantize_q8_0(quantize_q8_0(blocks))
    elif fmt == "q4_0":
        values = dequantize_q4_0(quantize_q4_0(blocks))
    else:
        raise ValueError(f"not a block format: {fmt}")
    return values.reshape(x.shape)


def quantized_activations(x):
    """x [rows, k] (f32, k whole blocks) as numesh's block-format kernels multiply it: per block of
    32, d = max|x| / 127 in f32, codes rounded to nearest even within +-127, value = code * d in
    f32; a block holding a non-finite value is NaN."""
    x = np.ascontiguousarray(x, dtype=F32)
    blocks = x.reshape(-1, BLOCK)
    d = (np.abs(blocks).max(axis=1) / F32(127)).astype(F32)
    with np.errstate(divide="ignore", over="ignore", invalid="ignore"):
        inv = np.where(d != 0, (F32(1) / d).astype(F32), F32(0)).astype(F32)
        codes = np.clip(np.rint((blocks * inv[:, None]).astype(F32)), -127, 127).astype(F32)
        values = (codes * d[:, None]).astype(F32)
    values[~np.isfinite(blocks).all(axis=1)] = np.nan
    return values.reshape(x.shape)
