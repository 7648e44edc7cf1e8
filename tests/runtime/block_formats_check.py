#!/usr/bin/python3
"""Checks numesh's Q8_0, Q4_0, Q5_0, IQ4_NL, Q3_K, Q4_K, Q5_K, Q6_K and IQ4_XS block codecs against GGML's reference, byte for byte.

    block_formats_check.py write DIR   # the rows to quantize and the blocks to dequantize
    block_formats_check.py check DIR   # compares what block_formats_check_main wrote

The reference is a NumPy transcription of GGML's definitions (ggml-quants.c's
quantize_row_q8_0_ref, quantize_row_q4_0_ref, dequantize_row_q8_0, dequantize_row_q4_0), each
step in the precision the C performs it:
  q8_0: amax = max |x|; d = f32(amax) / f32(127); id = 1/d in f32 (0 when d is 0);
        qs = roundf(f32(x * id)), half away from zero, computed exactly in float64 (in float32,
        0.49999997 + 0.5 would round to 1); the stored scale is d as f16, nearest even.
  q4_0: m = the first element of largest magnitude (+0 when all are zeros: GGML's strict <);
        d = m / -8; id as above; q = min(15, trunc(f32(f32(x * id) + 8.5))): two f32
        roundings, no fused multiply-add; byte j = q[j] | q[j + 16] << 4.
  q5_0: as q4_0 with d = m / -16 and q = min(31, trunc(f32(f32(x * id) + 16.5))); byte j holds
        the low 4 bits of q[j] and q[j + 16] as q4_0's, bit j of the little-endian word before
        them q[j]'s fifth bit (quantize_row_q5_0_ref, dequantize_row_q5_0).
  iq4_xs: tests/common/ggml_blocks.py's quantize_iq4_xs: iq4_nl's search on each sub-block of 32,
        the scales coded in 6 bits by nearest_int against the largest, the indices re-chosen.
  iq4_nl: tests/common/ggml_blocks.py's quantize_iq4_nl, quantize_iq4_nl's search without an
        importance matrix step by step in f32 (weights x^2, the first guess and 15 trial scales,
        sequential sums along the block), then each index re-chosen as best_index_int8 chooses.
  dequantization: f32(f16 d) * code (q4_0: code - 8; iq4_nl: the codebook's value), in f32.
Where 1/d overflows (a block below ~3.7e-37 for q8_0, ~2.4e-38 for q4_0, ~4.7e-38 for q5_0)
GGML converts inf or NaN to an integer, undefined in C; x86-64 builds get 0x80000000 (low byte
0), so every code is 0 (q4_0, q5_0: min(15, 0), min(31, 0)), and numesh and the transcription
write that.
  q3_K, q4_K, q5_K, q6_K: tests/common/ggml_blocks.py's quantize_q3_k / q4_k / q5_k / q6_k, the
        searches (make_q3_quants, make_qkx2_quants, make_qx_quants) step by step in f32,
        sequential along a sub-block;
        nearest_int as GGML's bit arithmetic (round-half-even below 2^22, and GGML's release
        builds' bytes beyond, where its assert is compiled out).

`write` writes DIR/values.f32: random rows at magnitudes from 1e-45 to 1e38 (normal, uniform,
log-uniform, heavy-tailed) and adversarial blocks (zeros of both signs, outliers, values exactly
at k + 0.5 after scaling and their neighbours, negative extremes, ties of magnitude with
opposite signs, scales at f16 rounding ties, at f16 overflow, in f16's subnormals, at the
reciprocal's overflow, and blocks where an FMA or f32 rounding would change a code), with
DIR/kinds.json naming the blocks of each kind; DIR/blocks.q8_0, .q4_0, .q5_0 and .iq4_nl, blocks with
every f16 scale pattern (NaN, inf, subnormals) and random codes, to dequantize. For the
super-block formats, DIR/values_k.f32 and DIR/kinds_k.json: random 256-value rows at magnitudes
from 1e-45 to 1e38 and adversarial ones (zeros, constant rows, negative-only and positive-only
rows, one outlier, tiny values around GGML's 1e-15 and f16's underflow, elements exactly at the
.5 rounding boundaries of the final codes and their f32 neighbours, sub-blocks of very different
magnitudes whose scale codes round to 0, minimums far coarser than their scale, where GGML's
nearest_int leaves its asserted range, and scales at and beyond f16's overflow); DIR/blocks.q3_k,
.q4_k, .q5_k, .q6_k and .iq4_xs, blocks with every f16 pattern of exponent 0 or 31 for d (and dmin) and random
others, random scales and codes, to dequantize.

`check` compares numesh's quantized bytes and dequantized values with the transcription's (NaN
outputs compared as NaN only). When NUMESH_GGML_LIB names a built libggml-base.so (an x86-64
build: see above for the blocks where GGML's C is undefined) it also calls GGML's own
quantize_row_{q8_0,q4_0,q5_0,q3_K,q4_K,q5_K,q6_K}_ref, quantize_iq4_nl and dequantize_row_{...}
of each through ctypes
on the same data and compares; unset, that part is skipped with a printed line.
Exit status: 0 all identical; 1 a mismatch (the first few printed); 2 numpy is missing (77
with NUMESH_SKIP_TORCH_CHECKS=1, a reported skip).
"""
import ctypes
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "common"))
from python_deps import require  # noqa: E402  (a missing module: exit 2, or a skip)
np = require("numpy")

from ggml_blocks import (IQ4_NL, IQ4_NL_VALUES, dequantize_iq4_nl, iq4_search_scale,  # noqa: E402
                         quantize_iq4_nl, reciprocal_or_zero, IQ4_XS, quantize_iq4_xs,
                         dequantize_iq4_xs)
from ggml_blocks import (BLOCK, F32, F32_MAX, Q4_0, Q5_0, Q8_0, dequantize_q4_0,  # noqa: E402,F401
                         dequantize_q5_0, dequantize_q8_0, f16_bits, q4_0_codes, q4_0_scale,
                         q5_0_codes, q5_0_scale, q8_0_scale, quantize_q4_0, quantize_q5_0,
                         quantize_q8_0, reciprocal, roundf, widened_scale, defined_in_ggml)
from ggml_blocks import (QK_K, Q3_K, Q4_K, Q5_K, Q6_K, dequantize_q3_k,  # noqa: E402
                         dequantize_q4_k, dequantize_q5_k, dequantize_q6_k, q3_k_scale_codes,
                         q4_k_scale_min, quantize_q3_k, quantize_q4_k, quantize_q5_k,
                         quantize_q6_k)


# ---- the data ---------------------------------------------------------------------------------

def to_f32(v):
    """float64 values as f32, clipped to the finite range (a 1e38-scale normal may exceed it)."""
    return np.clip(np.asarray(v, dtype=np.float64), -F32_MAX, F32_MAX).astype(F32)


def neighbours(x):
    """Two copies of x: every element nudged one f32 step up, then down, except the block's
    extreme, so that the scale, and the boundary, stay where they were."""
    keep = np.abs(x) == np.abs(x).max(axis=1, keepdims=True)
    return np.concatenate([np.where(keep, x, np.nextafter(x, F32(np.inf))),
                           np.where(keep, x, np.nextafter(x, F32(-np.inf)))]).astype(F32)


def adversarial_blocks(rng):
    kinds = {}
    z = np.zeros((1, BLOCK), F32)
    kinds["zeros"] = z
    kinds["negative zeros"] = -z
    kinds["mixed-sign zeros"] = np.where(rng.random((4, BLOCK)) < 0.5, F32(0), F32(-0.0)).astype(F32)

    out = to_f32(rng.normal(0, 0.01, (200, BLOCK)))
    pos = rng.integers(0, BLOCK, 200)
    out[np.arange(200), pos] = to_f32(rng.choice([-1, 1], 200) * 10 ** rng.uniform(0, 4, 200))
    kinds["one outlier"] = out

    # q8_0 exact halves: amax = 127 * 2^e gives d = 2^e exactly, so (k + 0.5) * 2^e scales to
    # k + 0.5; and the f32 neighbours of those values.
    rows = []
    for e in list(range(-126, 100, 7)) + [-10, -1, 0, 1, 10]:
        x = (rng.integers(-127, 127, (3, BLOCK)) + 0.5) * 2.0 ** e
        x[:, rng.integers(0, BLOCK)] = 127 * 2.0 ** e
        rows.append(to_f32(x))
    halves = np.concatenate(rows)
    kinds["q8_0 values at k + 0.5"] = halves
    kinds["q8_0 neighbours of k + 0.5"] = neighbours(halves)
    x = np.zeros((1, BLOCK), F32)
    x[0, :8] = [127, 0.49999997, -0.49999997, 0.5, -0.5, 126.5, -126.49999, 1.5]
    kinds["q8_0 0.49999997 and friends"] = x

    # q4_0 boundaries: m = -8 * 2^e gives d = 2^e; (k - 8.5) * 2^e lands on integer k after + 8.5.
    rows = []
    for e in list(range(-120, 100, 11)) + [-1, 0, 1]:
        x = (rng.integers(0, 17, (3, BLOCK)) - 8.5 + 0.0) * 2.0 ** e
        x = np.clip(x, -8 * 2.0 ** e, 8 * 2.0 ** e)
        x[:, rng.integers(0, BLOCK)] = -8 * 2.0 ** e
        rows.append(to_f32(x))
    edges = np.concatenate(rows)
    kinds["q4_0 values at integer codes"] = edges
    kinds["q4_0 neighbours of integer codes"] = neighbours(edges)
    kinds["q4_0 positive extreme at integer codes"] = (-edges).astype(F32)
    # q5_0's: m = -16 * 2^e gives d = 2^e; (k - 16.5) * 2^e lands on integer k after + 16.5.
    rows = []
    for e in list(range(-120, 100, 11)) + [-1, 0, 1]:
        x = (rng.integers(0, 33, (3, BLOCK)) - 16.5 + 0.0) * 2.0 ** e
        x = np.clip(x, -16 * 2.0 ** e, 16 * 2.0 ** e)
        x[:, rng.integers(0, BLOCK)] = -16 * 2.0 ** e
        rows.append(to_f32(x))
    edges = np.concatenate(rows)
    kinds["q5_0 values at integer codes"] = edges
    kinds["q5_0 neighbours of integer codes"] = neighbours(edges)
    kinds["q5_0 positive extreme at integer codes"] = (-edges).astype(F32)

    # iq4_nl: elements whose id * x (id = 1 / d, d the block's searched scale) is exactly midway
    # between two codebook values (best_index_int8 takes the upper), and their f32 neighbours.
    # Moving an element moves the search's scale, so the elements are placed again against the
    # new scale a few times, and the blocks where some ties remain are kept.
    placed = to_f32(rng.normal(0, 1, (2000, BLOCK)) * 10 ** rng.uniform(-3, 3, (2000, 1)))
    mids = (IQ4_NL_VALUES[:-1] + IQ4_NL_VALUES[1:]) / 2
    extreme = np.argmax(np.abs(placed), axis=1)
    cols = (extreme[:, None] + 1 + np.arange(6)[None, :]) % BLOCK
    rows = np.arange(2000)[:, None]
    want = mids[rng.integers(0, 15, (2000, 6))].astype(F32)
    for _ in range(4):
        inv = reciprocal_or_zero(iq4_search_scale(placed))[:, None]
        guess = to_f32(want.astype(np.float64) / inv.astype(np.float64))
        for step in range(-2, 3):
            c = guess
            for _ in range(abs(step)):
                c = np.nextafter(c, F32(np.inf) if step > 0 else F32(-np.inf)).astype(F32)
            hit = (inv * c).astype(F32) == want
            placed[rows, cols] = np.where(hit, c, placed[rows, cols])
    v = (reciprocal_or_zero(iq4_search_scale(placed))[:, None] * placed).astype(F32)
    tied = np.isin(v, mids.astype(F32)).any(axis=1)
    kinds["iq4_nl values midway between codebook values"] = placed[tied][:400]
    kinds["iq4_nl neighbours of midway values"] = neighbours(placed[tied][:400])

    x = to_f32(rng.normal(0, 1, (100, BLOCK)))
    neg = np.argmax(np.abs(x), axis=1)
    x[np.arange(100), neg] = -np.abs(x[np.arange(100), neg])
    kinds["negative extreme"] = x
    ties = to_f32(rng.normal(0, 1, (200, BLOCK)))
    for r in range(200):
        i, j = rng.choice(BLOCK, 2, replace=False)
        v = F32(3 + rng.random())
        sign = 1 if r % 2 else -1
        ties[r, i], ties[r, j] = sign * v, (-sign if r % 4 < 2 else sign) * v
    kinds["ties of magnitude"] = ties

    # Scales at f16 rounding ties: d = t exactly with t halfway between f16 values (normal and
    # subnormal), for q8_0 (amax = 127 t) and q4_0 (m = -8 t and 8 t).
    ts = [(1 + (2 * k + 1) * 2.0 ** -11) * 2.0 ** e for k in range(4) for e in (-14, -3, 0, 5, 15)]
    ts += [(2 * k + 1) * 2.0 ** -25 for k in range(0, 1024, 37)]
    rows = []
    for t in ts:
        x = rng.uniform(-1, 1, (1, BLOCK)) * t * 8
        a = x.copy()
        a[0, 0] = 127 * t
        rows.append(to_f32(a))
        b = rng.uniform(-1, 1, (1, BLOCK)) * t * 7.9
        b[0, 5] = -8 * t
        rows.append(to_f32(b))
        b = b.copy()
        b[0, 5] = 8 * t
        rows.append(to_f32(b))
    kinds["scales at f16 ties"] = np.concatenate(rows)

    rows = []
    for amax in [65504 * 127, 65519 * 127, 65519.99 * 127, 65520 * 127, 65536 * 127, 65504 * 8,
                 65520 * 8, 65504 * 16, 65520 * 16, F32_MAX, -F32_MAX]:
        x = rng.uniform(-1, 1, (2, BLOCK)) * abs(amax)
        x[:, 3] = amax
        rows.append(to_f32(x))
    kinds["scales at f16 overflow"] = np.concatenate(rows)

    # Across the overflow of 1/d (d <= 2^-128): extremes from 127 * 2^-128 (q8_0) and 8 * 2^-128
    # (q4_0) up, one f32 step at a time, and a few smaller ones.
    extremes = [1.4e-45, 1e-40, 1e-38, 3e-37, 4e-37]
    for start in (127 * 2.0 ** -128, 8 * 2.0 ** -128, 16 * 2.0 ** -128):
        a = F32(start)
        for _ in range(40):
            extremes.append(float(a))
            a = np.nextafter(a, F32(np.inf))
    rows = []
    for amax in extremes:
        x = rng.uniform(-1, 1, (2, BLOCK)) * amax
        x[:, 7] = amax
        x[1, 7] = -amax
        rows.append(to_f32(x))
    kinds["reciprocal at overflow"] = np.concatenate(rows)

    # Blocks where a fused x * id + 8.5 (q4_0) or roundf in f32 (q8_0) would give another code,
    # proof that numesh does neither. Random values rarely land there: set 8 elements of random
    # blocks to the f32 values nearest a boundary (x * id = k - 8.5 for the small codes, where
    # the sum is finer than the product; x * id = 0.5), nudged by up to 3 steps, and keep the
    # blocks where the wrong computation differs (float64 holds x * id + 8.5 exactly here).
    n = 20000
    pool = to_f32(rng.normal(0, 1, (n, BLOCK)) * 10 ** rng.uniform(-3, 3, (n, 1)))
    extreme = np.argmax(np.abs(pool), axis=1)
    cols = (extreme[:, None] + 1 + np.arange(8)[None, :]) % BLOCK

    def placed_near(boundaries, scale):
        """pool with the 8 elements after each block's extreme at x * id = boundaries (id the
        reciprocal of the format's scale of the block), nudged by up to 3 f32 steps."""
        near = to_f32(boundaries / reciprocal(scale).astype(np.float64)[:, None])
        for _ in range(3):
            step = rng.integers(-1, 2, (n, 8))
            near = np.where(step > 0, np.nextafter(near, F32(np.inf)),
                            np.where(step < 0, np.nextafter(near, F32(-np.inf)), near)).astype(F32)
        placed = pool.copy()
        placed[np.arange(n)[:, None], cols] = near
        return placed

    q4 = placed_near(rng.integers(1, 4, (n, 8)) - 8.5, q4_0_scale(pool))
    fma = np.any(q4_0_codes(q4) != q4_0_codes(q4, fused=True), axis=1)
    kinds["q4_0 where an FMA would differ"] = q4[fma][:300]
    q5 = placed_near(rng.integers(1, 4, (n, 8)) - 16.5, q5_0_scale(pool))
    fma = np.any(q5_0_codes(q5) != q5_0_codes(q5, fused=True), axis=1)
    kinds["q5_0 where an FMA would differ"] = q5[fma][:300]
    q8 = placed_near(rng.choice([-0.5, 0.5], (n, 8)), q8_0_scale(pool))
    scaled = (q8 * reciprocal(q8_0_scale(q8))[:, None]).astype(F32)
    naive = np.sign(scaled) * np.floor(np.abs(scaled) + F32(0.5))  # the addition in f32: wrong
    kinds["q8_0 where f32 rounding would differ"] = q8[np.any(naive != roundf(scaled), axis=1)][:300]
    return kinds


def random_blocks(rng):
    kinds = {}
    for scale in [1e-44, 1e-40, 1e-38, 3e-37, 1e-36, 1e-30, 1e-20, 1e-8, 3e-6, 1e-5, 1e-4, 1e-3,
                  0.02, 0.1, 1, 10, 1e3, 6.5e4, 1e5, 1e7, 1e10, 1e20, 1e30, 1e38]:
        kinds[f"normal at {scale:g}"] = to_f32(rng.normal(0, scale, (400, BLOCK)))
        kinds[f"uniform at {scale:g}"] = to_f32(rng.uniform(-scale, scale, (200, BLOCK)))
    kinds["log-uniform 1e-45 .. 1e38"] = to_f32(
        rng.choice([-1, 1], (2000, BLOCK)) * 10 ** rng.uniform(-45, 38, (2000, BLOCK)))
    kinds["student-t (df 2) at 0.02"] = to_f32(rng.standard_t(2, (2000, BLOCK)) * 0.02)
    kinds["laplace at 1"] = to_f32(rng.laplace(0, 1, (1000, BLOCK)))
    return kinds


# ---- the super-block (Q4_K, Q6_K) data --------------------------------------------------------

def q4_k_final_terms(x, blocks):
    """The final pass's per-sub-block scale d and minimum dm of blocks quantized from x [n, 256]
    (as GGML reads them back from the bytes), and its nearest_int arguments (x + dm) / d."""
    n = len(x)
    sc, m = q4_k_scale_min(blocks["scales"])
    with np.errstate(all="ignore"):
        d = (widened_scale(blocks)[:, None] * sc.astype(F32)).astype(F32)
        dmin = np.ascontiguousarray(blocks["dmin"]).view(np.float16).astype(F32)
        dm = (dmin[:, None] * m.astype(F32)).astype(F32)
        arg = ((x.reshape(n, 8, 32) + dm[:, :, None]).astype(F32) / d[:, :, None]).astype(F32)
    return np.repeat(d, 32, axis=1), np.repeat(dm, 32, axis=1), arg.reshape(n, QK_K)


def q6_k_final_terms(x, blocks):
    """The final pass's per-sub-block scale d and its nearest_int arguments x / d."""
    with np.errstate(all="ignore"):
        d = (widened_scale(blocks)[:, None] * blocks["scales"].astype(F32)).astype(F32)
        d = np.repeat(d, 16, axis=1)
        return d, (x / d).astype(F32)


def q3_k_final_terms(x, blocks):
    """The final pass's per-sub-block scale d (sc - 32) and its nearest_int arguments x / d."""
    with np.errstate(all="ignore"):
        d = (widened_scale(blocks)[:, None]
             * (q3_k_scale_codes(blocks["scales"]) - 32).astype(F32)).astype(F32)
        d = np.repeat(d, 16, axis=1)
        return d, (x / d).astype(F32)


# Each super-block format's quantizer and final-pass terms (Q5_K's scales and minimums are
# Q4_K's); Q3_K and Q6_K have sub-blocks of 16 and no minimums.
SUB_BLOCKS_OF_16 = ("q3_k", "q6_k")
K_FINAL_TERMS = {"q4_k": (quantize_q4_k, q4_k_final_terms), "q5_k": (quantize_q5_k, q4_k_final_terms),
                 "q6_k": (quantize_q6_k, q6_k_final_terms), "q3_k": (quantize_q3_k, q3_k_final_terms)}


def exact_halves(arg, d):
    """Where the final pass's nearest_int argument is exactly k + 0.5 (and the pass runs)."""
    with np.errstate(invalid="ignore"):
        return (d != 0) & np.isfinite(arg) & (arg - np.floor(arg) == F32(0.5)) & (np.abs(arg) < 2 ** 22)


def at_halves(x, rng, fmt, share):
    """Rows of x whose non-extreme elements (a share of them, the same ones throughout) are moved
    to the final pass's k + 0.5 boundaries: x = (k + 0.5) d - dm for the block's stored d and dm,
    re-quantized and moved again (moving an element changes the search, and so maybe d), keeping
    the rows where some exact halves remain. Q4_K's least-squares search with a minimum moves
    more: few elements a row converge, many do not."""
    quantize, terms = K_FINAL_TERMS[fmt]
    sub = 16 if fmt in SUB_BLOCKS_OF_16 else 32
    x = x.copy()
    chosen = rng.random(x.shape) < share
    for _ in range(5):
        blocks = quantize(x)
        if fmt not in SUB_BLOCKS_OF_16:
            d, dm, arg = terms(x, blocks)
        else:
            (d, arg), dm = terms(x, blocks), np.zeros_like(x)
        amax = np.repeat(np.abs(x).reshape(len(x), -1, sub).max(axis=2), sub, axis=1)
        pick = chosen & (np.abs(x) < 0.8 * amax) & (d != 0) & np.isfinite(arg)
        with np.errstate(all="ignore"):
            target = (np.floor(arg.astype(np.float64)) + 0.5) * d - dm
        x = np.where(pick & np.isfinite(target), to_f32(target), x).astype(F32)
    d, arg = terms(x, quantize(x))[0], terms(x, quantize(x))[-1]
    return x[exact_halves(arg, d).any(axis=1)]


def nudged_halves(x, fmt):
    """Two copies of rows x, every element at an exact half nudged one f32 step up, then down."""
    quantize, terms = K_FINAL_TERMS[fmt]
    t = terms(x, quantize(x))
    halves = exact_halves(t[-1], t[0])
    return np.concatenate([np.where(halves, np.nextafter(x, F32(np.inf)), x),
                           np.where(halves, np.nextafter(x, F32(-np.inf)), x)]).astype(F32)


def k_adversarial_rows(rng):
    kinds = {}
    z = np.zeros((1, QK_K), F32)
    kinds["zeros"] = z
    kinds["negative zeros"] = -z
    kinds["mixed-sign zeros"] = np.where(rng.random((4, QK_K)) < 0.5, F32(0), F32(-0.0)).astype(F32)
    rows = []
    for v in [1.0, -1.0, 0.5, -3.25, 1e-3, -1e-3, 1e-20, -1e-20, 7e4, -7e4, 1e10, -1e10, F32_MAX,
              -F32_MAX, 1.4e-45, -1.4e-45]:
        rows.append(np.full((1, QK_K), v))
    kinds["constant rows"] = to_f32(np.concatenate(rows))
    per_sub = rng.normal(0, 1, (40, 16, 1)) * 10 ** rng.uniform(-3, 3, (40, 16, 1))
    kinds["constant sub-blocks of 16"] = to_f32(np.repeat(per_sub, 16, axis=2).reshape(40, QK_K))
    kinds["constant sub-blocks of 32"] = to_f32(np.repeat(per_sub[:, :8], 32, axis=2).reshape(40, QK_K))
    x = to_f32(np.full((20, QK_K), -2.0))
    x[np.arange(20), rng.integers(0, QK_K, 20)] = 5.0
    kinds["constant but one"] = x
    kinds["negative-only rows"] = to_f32(-np.abs(rng.normal(0, 1, (200, QK_K)))
                                         * 10 ** rng.uniform(-4, 4, (200, 1)))
    kinds["positive-only rows"] = to_f32(np.abs(rng.normal(0, 1, (200, QK_K)))
                                         * 10 ** rng.uniform(-4, 4, (200, 1)))
    kinds["uniform [0, 1)"] = to_f32(rng.random((100, QK_K)))

    out = to_f32(rng.normal(0, 0.01, (300, QK_K)))
    out[np.arange(300), rng.integers(0, QK_K, 300)] = to_f32(
        rng.choice([-1, 1], 300) * 10 ** rng.uniform(-1, 6, 300))
    kinds["one outlier"] = out

    # Tiny values: around GGML's GROUP_MAX_EPS (1e-15: a q6_K sub-block, and a block's largest
    # sub-block scale, about amax / 32) and around f16's underflow of d (amax ~1.2e-4 for q6_K,
    # a range ~2.8e-5 for q4_K), and subnormals.
    rows = []
    for amax in [1.4e-45, 1e-42, 1e-38, 1e-30, 1e-16, 9.9e-16, 1e-15, 1.01e-15, 3e-15, 3e-14,
                 3.2e-14, 3.3e-14, 1e-13, 1e-10, 1e-7, 1e-6, 1e-5, 2.8e-5, 3e-5, 1e-4, 1.2e-4,
                 1.3e-4, 3e-4, 1e-3, 3e-3]:
        x = rng.uniform(-1, 1, (4, QK_K)) * amax
        x[:, 5] = amax
        x[1, 5] = -amax
        x[2] = np.abs(x[2])
        x[3] = -np.abs(x[3])
        rows.append(to_f32(x))
    kinds["tiny values"] = np.concatenate(rows)

    # Sub-blocks of very different magnitudes: small sub-blocks' 6- or 8-bit scale codes round to
    # 0 (GGML's `if (!d) continue` keeps their search's codes) or to a few steps.
    kinds["sub-blocks of mixed magnitude"] = to_f32(
        rng.normal(0, 1, (400, 16, 16)) * 10 ** rng.uniform(-6, 3, (400, 16, 1))).reshape(400, QK_K)
    # Q4_K sub-blocks far from zero with a small range: a 6-bit minimum much coarser than the
    # sub-block's scale puts (x + dm) / d beyond nearest_int's asserted 2^22 (GGML's release bytes).
    n = 4000
    offset = np.where(rng.random((n, 8, 1)) < 0.5, -10 ** rng.uniform(0, 7, (n, 8, 1)), 0)
    spread = 10 ** rng.uniform(-6, 1, (n, 8, 1))
    x = to_f32((offset + spread * rng.random((n, 8, 32))).reshape(n, QK_K))
    d, _, arg = q4_k_final_terms(x, quantize_q4_k(x))
    beyond = ((d != 0) & ~(np.abs(arg) <= 4194303)).any(axis=1)
    kinds["q4_k minimums far coarser than the scale"] = x[beyond][:400]
    kinds["offset sub-blocks"] = x[~beyond][:200]

    # The .5 boundaries of the final codes (nearest_int rounds them to even, not away from zero),
    # and their f32 neighbours.
    base = to_f32(rng.normal(0, 1, (600, QK_K)) * 10 ** rng.uniform(-3, 3, (600, 1)))
    base[300:] = np.abs(base[300:])  # min 0: dm = 0, more exact halves
    for fmt, share in (("q4_k", 0.02), ("q6_k", 0.2)):
        h = at_halves(base, rng, fmt, share)
        kinds[f"{fmt} values at k + 0.5"] = h
        kinds[f"{fmt} neighbours of k + 0.5"] = nudged_halves(h, fmt)

    # Super-block scales at f16's overflow (d = max scale / 63 or / -128 near 65504) and beyond,
    # up to f32's largest (where the squares and sums overflow to inf and NaN).
    rows = []
    for amax in [3e7, 6e7, 6.2e7, 6.3e7, 1e8, 2.6e8, 2.7e8, 2.8e8, 1e9, 1e15, 1.8e19, 2e19, 1e25,
                 1e30, 1e37, F32_MAX]:
        x = rng.uniform(-1, 1, (3, QK_K)) * amax
        x[:, 9] = amax
        x[1, 9] = -amax
        x[2] = np.abs(x[2])
        rows.append(to_f32(x))
    kinds["scales at f16 overflow and beyond"] = np.concatenate(rows)
    # Q5_K's .5 boundaries last, so that the kinds above keep their data.
    h = at_halves(base, rng, "q5_k", 0.02)
    kinds["q5_k values at k + 0.5"] = h
    kinds["q5_k neighbours of k + 0.5"] = nudged_halves(h, "q5_k")
    # Q3_K's after those: its final pass rounds x / (d (sc - 32)) to 3-bit codes.
    h = at_halves(base, rng, "q3_k", 0.2)
    kinds["q3_k values at k + 0.5"] = h
    kinds["q3_k neighbours of k + 0.5"] = nudged_halves(h, "q3_k")
    return kinds


def k_random_rows(rng):
    kinds = {}
    for scale in [1e-44, 1e-40, 1e-38, 1e-30, 1e-20, 1e-15, 1e-12, 1e-8, 1e-5, 1e-4, 1e-3, 0.02,
                  0.1, 1, 10, 1e3, 1e5, 1e7, 1e10, 1e20, 1e30, 1e38]:
        kinds[f"normal at {scale:g}"] = to_f32(rng.normal(0, scale, (120, QK_K)))
        kinds[f"uniform at {scale:g}"] = to_f32(rng.uniform(-scale, scale, (60, QK_K)))
    kinds["log-uniform 1e-45 .. 1e38"] = to_f32(
        rng.choice([-1, 1], (400, QK_K)) * 10 ** rng.uniform(-45, 38, (400, QK_K)))
    kinds["student-t (df 2) at 0.02"] = to_f32(rng.standard_t(2, (1500, QK_K)) * 0.02)
    kinds["normal at 0.02, per-row scale"] = to_f32(
        rng.normal(0, 0.02, (1500, QK_K)) * 10 ** rng.uniform(-1, 1, (1500, 1)))
    kinds["laplace at 1"] = to_f32(rng.laplace(0, 1, (500, QK_K)))
    return kinds


def k_arbitrary_blocks(rng, dtype, n=1 << 14):
    """n blocks of random bytes whose f16 scales (d, and q4_K's dmin) take every pattern with
    exponent 0 or 31 (zeros, subnormals, infinities, NaNs) once, then random ones."""
    special = np.array([s | (e << 10) | m for s in (0, 0x8000) for e in (0, 31) for m in range(1024)],
                       np.uint16)
    blocks = np.frombuffer(rng.integers(0, 256, n * dtype.itemsize, dtype=np.uint8).tobytes(),
                           dtype).copy()
    for field in ("d", "dmin") if "dmin" in dtype.names else ("d",):
        d = rng.integers(0, 1 << 16, n).astype(np.uint16)
        d[:special.size] = rng.permutation(special)
        blocks[field] = d
    return blocks


def write_k(d):
    rng = np.random.default_rng(20240602)
    kinds = {**k_random_rows(rng), **k_adversarial_rows(rng)}
    index, start = [], 0
    for name, x in kinds.items():
        assert x.dtype == F32 and x.shape[1] == QK_K and np.all(np.isfinite(x)), name
        index.append([name, start, len(x)])
        start += len(x)
    np.concatenate(list(kinds.values())).tofile(os.path.join(d, "values_k.f32"))
    with open(os.path.join(d, "kinds_k.json"), "w") as f:
        json.dump(index, f)
    k_arbitrary_blocks(rng, Q4_K).tofile(os.path.join(d, "blocks.q4_k"))
    k_arbitrary_blocks(rng, Q6_K).tofile(os.path.join(d, "blocks.q6_k"))
    k_arbitrary_blocks(rng, Q5_K).tofile(os.path.join(d, "blocks.q5_k"))
    k_arbitrary_blocks(rng, Q3_K).tofile(os.path.join(d, "blocks.q3_k"))
    k_arbitrary_blocks(rng, IQ4_XS).tofile(os.path.join(d, "blocks.iq4_xs"))


def write(d):
    rng = np.random.default_rng(20240601)
    kinds = {**random_blocks(rng), **adversarial_blocks(rng)}
    index, start = [], 0
    for name, x in kinds.items():
        assert x.dtype == F32 and x.shape[1] == BLOCK and np.all(np.isfinite(x)), name
        index.append([name, start, len(x)])
        start += len(x)
    np.concatenate(list(kinds.values())).tofile(os.path.join(d, "values.f32"))
    with open(os.path.join(d, "kinds.json"), "w") as f:
        json.dump(index, f)
    # Every f16 scale pattern once (NaN, inf, subnormals, both zeros), with random codes.
    n = 1 << 16
    q8 = np.zeros(n, Q8_0)
    q8["d"] = np.arange(n, dtype=np.uint16)
    q8["qs"] = rng.integers(-128, 128, (n, 32)).astype(np.int8)
    q8.tofile(os.path.join(d, "blocks.q8_0"))
    q4 = np.zeros(n, Q4_0)
    q4["d"] = rng.permutation(n).astype(np.uint16)
    q4["qs"] = rng.integers(0, 256, (n, 16)).astype(np.uint8)
    q4.tofile(os.path.join(d, "blocks.q4_0"))
    q5 = np.zeros(n, Q5_0)
    q5["d"] = rng.permutation(n).astype(np.uint16)
    q5["qh"] = rng.integers(0, 1 << 32, n, dtype=np.uint64).astype(np.uint32)
    q5["qs"] = rng.integers(0, 256, (n, 16)).astype(np.uint8)
    q5.tofile(os.path.join(d, "blocks.q5_0"))
    iq4 = np.zeros(n, IQ4_NL)
    iq4["d"] = rng.permutation(n).astype(np.uint16)
    iq4["qs"] = rng.integers(0, 256, (n, 16)).astype(np.uint8)
    iq4.tofile(os.path.join(d, "blocks.iq4_nl"))
    write_k(d)
    return 0


# ---- the comparison ---------------------------------------------------------------------------

def kind_of(index, block):
    for name, start, count in index:
        if start <= block < start + count:
            return f"{name}, block {block - start}"
    return f"block {block}"


def compare_blocks(title, index, x, got, want):
    """Prints and returns whether the blocks are byte for byte identical."""
    bad = np.flatnonzero((got.view(np.uint8).reshape(len(got), -1)
                          != want.view(np.uint8).reshape(len(want), -1)).any(axis=1))
    n = len(got)
    print(f"{title}: {n} blocks {'identical' if bad.size == 0 else f'{bad.size} DIFFER'}")
    for b in bad[:5]:
        print(f"    {kind_of(index, b)}: x = {x[b].tolist()}")
        for who, blocks in (("got ", got), ("want", want)):
            fields = " ".join(f"{f} {blocks[b][f]:#06x}" if blocks.dtype[f].shape == () else
                              f"{f} {blocks[b][f].tolist()}" for f in blocks.dtype.names)
            print(f"      {who} {fields}")
    return bad.size == 0


def compare_values(title, got, want, block=BLOCK):
    nan = np.isnan(want)
    bad = np.flatnonzero(((got.view(np.uint32) != want.view(np.uint32)) & ~nan) | (nan & ~np.isnan(got)))
    print(f"{title}: {got.size} values {'identical' if bad.size == 0 else f'{bad.size} DIFFER'}")
    for i in bad[:5]:
        print(f"    value {i} (block {i // block}): got {got[i]!r} ({got.view(np.uint32)[i]:#010x}), "
              f"want {want[i]!r} ({want.view(np.uint32)[i]:#010x})")
    return bad.size == 0


def ggml_check(index, x, blocks8, blocks4, blocks5, blocks_iq4, mine):
    """GGML's own functions, when NUMESH_GGML_LIB names libggml-base.so; True when they agree."""
    path = os.environ.get("NUMESH_GGML_LIB")
    if not path:
        print("ggml: skipped: NUMESH_GGML_LIB is not set (a built libggml-base.so to compare with "
              "GGML's own reference quantizers)")
        return True
    lib = ctypes.CDLL(path)
    for name in ("quantize_row_q8_0_ref", "quantize_row_q4_0_ref", "quantize_row_q5_0_ref",
                 "dequantize_row_q8_0", "dequantize_row_q4_0", "dequantize_row_q5_0",
                 "quantize_row_q3_K_ref", "quantize_row_q4_K_ref", "quantize_row_q5_K_ref",
                 "quantize_row_q6_K_ref", "dequantize_row_q3_K", "dequantize_row_q5_K",
                 "dequantize_row_q4_K", "dequantize_row_q6_K", "dequantize_row_iq4_nl",
                 "quantize_row_iq4_xs_ref", "dequantize_row_iq4_xs"):
        getattr(lib, name).argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64]
        getattr(lib, name).restype = None
    # quantize_iq4_nl(src, dst, rows, per row, importance), what llama.cpp writes files with.
    lib.quantize_iq4_nl.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64,
                                    ctypes.c_int64, ctypes.c_void_p]
    lib.quantize_iq4_nl.restype = ctypes.c_size_t

    ok = True
    flat = np.ascontiguousarray(x.reshape(-1))
    for fmt, dtype, scale in (("q8_0", Q8_0, q8_0_scale), ("q4_0", Q4_0, q4_0_scale),
                              ("q5_0", Q5_0, q5_0_scale)):
        theirs = np.zeros(len(x), dtype)
        getattr(lib, f"quantize_row_{fmt}_ref")(flat.ctypes.data, theirs.ctypes.data, flat.size)
        undefined = ~defined_in_ggml(scale(x))
        ok &= compare_blocks(f"{fmt} quantize, numesh vs GGML ({path})", index, x, mine[fmt], theirs)
        ok &= compare_blocks(f"{fmt} quantize, NumPy vs GGML", index, x, mine[f"{fmt} numpy"], theirs)
        print(f"    of which {int(undefined.sum())} blocks where 1/d overflows (GGML's C undefined, "
              f"x86 bytes)")
    theirs = np.zeros(len(x), IQ4_NL)
    lib.quantize_iq4_nl(flat.ctypes.data, theirs.ctypes.data, len(x), BLOCK, None)
    ok &= compare_blocks(f"iq4_nl quantize, numesh vs GGML ({path})", index, x, mine["iq4_nl"], theirs)
    ok &= compare_blocks("iq4_nl quantize, NumPy vs GGML", index, x, mine["iq4_nl numpy"], theirs)
    for fmt, blocks, got in (("q8_0", blocks8, mine["q8_0 any"]), ("q4_0", blocks4, mine["q4_0 any"]),
                             ("q5_0", blocks5, mine["q5_0 any"]),
                             ("iq4_nl", blocks_iq4, mine["iq4_nl any"])):
        theirs = np.zeros(len(blocks) * BLOCK, F32)
        getattr(lib, f"dequantize_row_{fmt}")(blocks.ctypes.data, theirs.ctypes.data, theirs.size)
        ok &= compare_values(f"{fmt} dequantize every scale, numesh vs GGML", got, theirs)

    k = mine["k"]
    flat = np.ascontiguousarray(k["x"].reshape(-1))
    for fmt, dtype in (("q3_k", Q3_K), ("q4_k", Q4_K), ("q5_k", Q5_K), ("q6_k", Q6_K),
                       ("iq4_xs", IQ4_XS)):
        ggml_name = fmt if fmt.startswith("iq") else fmt[:-1] + "K"
        theirs = np.zeros(len(k["x"]), dtype)
        getattr(lib, f"quantize_row_{ggml_name}_ref")(flat.ctypes.data, theirs.ctypes.data, flat.size)
        ok &= compare_blocks(f"{fmt} quantize, numesh vs GGML ({path})", k["index"], k["x"],
                             k[fmt], theirs)
        ok &= compare_blocks(f"{fmt} quantize, NumPy vs GGML", k["index"], k["x"],
                             k[f"{fmt} numpy"], theirs)
        theirs = np.zeros(len(k[f"{fmt} blocks"]) * QK_K, F32)
        getattr(lib, f"dequantize_row_{ggml_name}")(k[f"{fmt} blocks"].ctypes.data,
                                                   theirs.ctypes.data, theirs.size)
        ok &= compare_values(f"{fmt} dequantize arbitrary blocks, numesh vs GGML", k[f"{fmt} any"],
                             theirs, QK_K)
    return ok


def describe_k(x, q4k, q6k, q3k):
    """Counts of the cases the super-block data is there for, from the reference's bytes."""
    d4, _, arg4 = q4_k_final_terms(x, q4k)
    d6, arg6 = q6_k_final_terms(x, q6k)
    halves4, halves6 = exact_halves(arg4, d4), exact_halves(arg6, d6)
    # Ties where half away from zero (roundf) would give another code than half to even.
    with np.errstate(invalid="ignore"):
        odd4 = halves4 & (np.floor(arg4) % 2 == 0) & (np.floor(arg4) >= 0) & (np.floor(arg4) < 15)
        odd6 = halves6 & (np.floor(arg6) % 2 == 0) & (np.floor(arg6) >= -32) & (np.floor(arg6) < 31)
    beyond = (d4 != 0) & ~(np.abs(arg4) <= 4194303)
    skipped4 = (d4 == 0) & ~np.all(q4k["qs"] == 0, axis=1)[:, None]
    skipped6 = (d6 == 0) & (q6k["d"] != 0)[:, None]
    print(f"    q4_k: {int(halves4.sum())} elements at an exact k + 0.5 ({int(odd4.sum())} where "
          f"rounding half away from zero would differ) in {int(halves4.any(axis=1).sum())} blocks; "
          f"{int(beyond.any(axis=1).sum())} blocks with a final nearest_int argument beyond 2^22 "
          f"or non-finite; {int(skipped4.any(axis=1).sum())} blocks with a zero sub-block scale "
          f"(codes kept from the search)")
    print(f"    q6_k: {int(halves6.sum())} elements at an exact k + 0.5 ({int(odd6.sum())} where "
          f"rounding half away from zero would differ) in {int(halves6.any(axis=1).sum())} blocks; "
          f"{int(np.all(q6k.view(np.uint8).reshape(len(x), -1) == 0, axis=1).sum())} all-zero "
          f"blocks; {int(skipped6.any(axis=1).sum())} non-zero blocks with a zero sub-block scale "
          f"(codes kept from the search)")
    d3, arg3 = q3_k_final_terms(x, q3k)
    halves3 = exact_halves(arg3, d3)
    skipped3 = (d3 == 0) & (q3k["d"] != 0)[:, None]
    print(f"    q3_k: {int(halves3.sum())} elements at an exact k + 0.5 in "
          f"{int(halves3.any(axis=1).sum())} blocks; {int((q3k['d'] == 0).sum())} blocks with d 0; "
          f"{int(skipped3.any(axis=1).sum())} blocks with a zero sub-block scale under a non-zero d "
          f"(codes kept from the search)")


def describe_iq4_nl(x, blocks):
    """Counts of the cases the IQ4_NL data is there for, from the reference's bytes."""
    d = iq4_search_scale(x)
    with np.errstate(all="ignore"):
        v = (reciprocal_or_zero(d)[:, None] * x).astype(F32)
    mids = ((IQ4_NL_VALUES[:-1] + IQ4_NL_VALUES[1:]) / 2).astype(F32)
    midway = np.isin(v, mids)
    zero = (blocks["d"] & 0x7FFF) == 0
    print(f"    iq4_nl: {int(midway.sum())} elements exactly midway between two codebook values in "
          f"{int(midway.any(axis=1).sum())} blocks; {int(zero.sum())} blocks with scale 0")


def check_k(d, mine):
    """numesh's Q3_K, Q4_K, Q5_K, Q6_K and IQ4_XS against the NumPy transcription; fills mine["k"] for
    ggml_check."""
    path = lambda name: os.path.join(d, name)  # noqa: E731
    x = np.fromfile(path("values_k.f32"), dtype=F32).reshape(-1, QK_K)
    with open(path("kinds_k.json")) as f:
        index = json.load(f)
    k = mine["k"] = {"x": x, "index": index}
    ok = True
    print(f"{len(x)} super-blocks ({x.size} values) of {len(index)} kinds to quantize")
    for fmt, dtype, quantize, dequantize in (("q3_k", Q3_K, quantize_q3_k, dequantize_q3_k),
                                             ("q4_k", Q4_K, quantize_q4_k, dequantize_q4_k),
                                             ("q5_k", Q5_K, quantize_q5_k, dequantize_q5_k),
                                             ("q6_k", Q6_K, quantize_q6_k, dequantize_q6_k),
                                             ("iq4_xs", IQ4_XS, quantize_iq4_xs, dequantize_iq4_xs)):
        k[fmt] = np.fromfile(path(f"values_k.{fmt}"), dtype=dtype)
        want = k[f"{fmt} numpy"] = quantize(x)
        ok &= compare_blocks(f"{fmt} quantize, numesh vs NumPy", index, x, k[fmt], want)
        ok &= compare_values(f"{fmt} dequantize its blocks, numesh vs NumPy",
                             np.fromfile(path(f"values_k.{fmt}.f32"), dtype=F32),
                             dequantize(k[fmt]), QK_K)
        k[f"{fmt} blocks"] = np.fromfile(path(f"blocks.{fmt}"), dtype=dtype)
        k[f"{fmt} any"] = np.fromfile(path(f"blocks.{fmt}.f32"), dtype=F32)
        ok &= compare_values(f"{fmt} dequantize {len(k[f'{fmt} blocks'])} arbitrary blocks, "
                             f"numesh vs NumPy", k[f"{fmt} any"], dequantize(k[f"{fmt} blocks"]), QK_K)
    describe_k(x, k["q4_k numpy"], k["q6_k numpy"], k["q3_k numpy"])
    return ok


def check(d):
    path = lambda name: os.path.join(d, name)  # noqa: E731
    x = np.fromfile(path("values.f32"), dtype=F32).reshape(-1, BLOCK)
    with open(path("kinds.json")) as f:
        index = json.load(f)
    blocks8 = np.fromfile(path("blocks.q8_0"), dtype=Q8_0)
    blocks4 = np.fromfile(path("blocks.q4_0"), dtype=Q4_0)
    blocks5 = np.fromfile(path("blocks.q5_0"), dtype=Q5_0)
    blocks_iq4 = np.fromfile(path("blocks.iq4_nl"), dtype=IQ4_NL)
    print(f"{len(x)} blocks ({x.size} values) of {len(index)} kinds to quantize; "
          f"{len(blocks8)} + {len(blocks4)} + {len(blocks5)} + {len(blocks_iq4)} blocks to "
          f"dequantize")
    mine = {"q8_0": np.fromfile(path("values.q8_0"), dtype=Q8_0),
            "q4_0": np.fromfile(path("values.q4_0"), dtype=Q4_0),
            "q5_0": np.fromfile(path("values.q5_0"), dtype=Q5_0),
            "q8_0 any": np.fromfile(path("blocks.q8_0.f32"), dtype=F32),
            "q4_0 any": np.fromfile(path("blocks.q4_0.f32"), dtype=F32),
            "q5_0 any": np.fromfile(path("blocks.q5_0.f32"), dtype=F32),
            "iq4_nl": np.fromfile(path("values.iq4_nl"), dtype=IQ4_NL),
            "iq4_nl any": np.fromfile(path("blocks.iq4_nl.f32"), dtype=F32)}
    ok = True
    for fmt, quantize, dequantize in (("q8_0", quantize_q8_0, dequantize_q8_0),
                                      ("q4_0", quantize_q4_0, dequantize_q4_0),
                                      ("q5_0", quantize_q5_0, dequantize_q5_0),
                                      ("iq4_nl", quantize_iq4_nl, dequantize_iq4_nl)):
        want = mine[f"{fmt} numpy"] = quantize(x)
        ok &= compare_blocks(f"{fmt} quantize, numesh vs NumPy", index, x, mine[fmt], want)
        ok &= compare_values(f"{fmt} dequantize its blocks, numesh vs NumPy",
                             np.fromfile(path(f"values.{fmt}.f32"), dtype=F32), dequantize(mine[fmt]))
    ok &= compare_values("q8_0 dequantize every scale, numesh vs NumPy", mine["q8_0 any"],
                         dequantize_q8_0(blocks8))
    ok &= compare_values("q4_0 dequantize every scale, numesh vs NumPy", mine["q4_0 any"],
                         dequantize_q4_0(blocks4))
    ok &= compare_values("q5_0 dequantize every scale, numesh vs NumPy", mine["q5_0 any"],
                         dequantize_q5_0(blocks5))
    ok &= compare_values("iq4_nl dequantize every scale, numesh vs NumPy", mine["iq4_nl any"],
                         dequantize_iq4_nl(blocks_iq4))
    describe_iq4_nl(x, mine["iq4_nl numpy"])
    ok &= check_k(d, mine)
    ok &= ggml_check(index, x, blocks8, blocks4, blocks5, blocks_iq4, mine)
    return 0 if ok else 1


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] not in ("write", "check"):
        print("usage: block_formats_check.py write|check DIR")
        sys.exit(2)
    sys.exit(write(sys.argv[2]) if sys.argv[1] == "write" else check(sys.argv[2]))
