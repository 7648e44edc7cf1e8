"""GGML's Q8_0, Q4_0, Q5_0, IQ4_NL, Q3_K, Q4_K, Q5_K, Q6_K and IQ4_XS blocks in NumPy, written from
ggml-quants.c's reference definitions (quantize_row_q8_0_ref, quantize_row_q4_0_ref,
quantize_row_q5_0_ref, quantize_iq4_nl without an importance matrix, quantize_row_q3_K_ref,
quantize_row_q4_K_ref, quantize_row_q5_K_ref, quantize_row_q6_K_ref, quantize_row_iq4_xs_ref,
dequantize_row_q8_0 / q4_0 / q5_0 / iq4_nl / q3_K / q4_K / q5_K / q6_K / iq4_xs), and the 8-bit activations
numesh's block-format kernels multiply (ops/kernels/block_gemm.hpp): the references of
tests/runtime/block_formats_check.py and of the model checks with quantized weights.

The K-quant searches are loops of f32 operations whose order decides the bytes, so they are
transcribed as the C runs them: vectorized across sub-blocks, sequential along each one (every
sum a running f32 sum, every product and sum its own f32 rounding, as GGML's FMA-less build).
"""
import numpy as np

BLOCK = 32
Q8_0 = np.dtype([("d", "<u2"), ("qs", "i1", (32,))])  # GGML's block_q8_0, 34 bytes, packed
Q4_0 = np.dtype([("d", "<u2"), ("qs", "u1", (16,))])  # GGML's block_q4_0, 18 bytes
# GGML's block_q5_0, 22 bytes: code j's fifth bit is bit j of the little-endian word qh.
Q5_0 = np.dtype([("d", "<u2"), ("qh", "<u4"), ("qs", "u1", (16,))])
assert Q8_0.itemsize == 34 and Q4_0.itemsize == 18 and Q5_0.itemsize == 22
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


def signed_extreme(x):
    """Each block's element of largest magnitude, the first of equal ones (GGML's strict <); +0
    for a block of zeros."""
    ax = np.abs(x)
    amax = ax.max(axis=1)
    first = np.argmax(ax, axis=1)
    return np.where(amax > 0, x[np.arange(len(x)), first], F32(0)).astype(F32)


def q4_0_scale(x):
    return (signed_extreme(x) / F32(-8)).astype(F32)


def q5_0_scale(x):
    return (signed_extreme(x) / F32(-16)).astype(F32)


def offset_codes(x, d, offset, fused=False):
    """Q4_0's (offset 8) and Q5_0's (16) codes: min(2 offset - 1, trunc(f32(f32(x id) + offset
    + 0.5)))."""
    idv = reciprocal(d)[:, None]
    if fused:  # what one multiply-add would give (exact where it is used to pick blocks)
        shifted = (x.astype(np.float64) * idv.astype(np.float64) + offset + 0.5).astype(F32)
    else:
        shifted = (x * idv).astype(F32) + F32(offset + 0.5)
    q = np.minimum(2 * offset - 1, np.trunc(shifted).astype(np.int64))
    return np.where(defined_in_ggml(d)[:, None], q, 0)  # 1/d overflows: code 0, as x86


def q4_0_codes(x, fused=False):
    return offset_codes(x, q4_0_scale(x), 8, fused)


def q5_0_codes(x, fused=False):
    return offset_codes(x, q5_0_scale(x), 16, fused)


def quantize_q4_0(x):
    q = q4_0_codes(x)
    out = np.zeros(len(x), Q4_0)
    out["d"] = f16_bits(q4_0_scale(x))
    out["qs"] = (q[:, :16] | (q[:, 16:] << 4)).astype(np.uint8)
    return out


def quantize_q5_0(x):
    q = q5_0_codes(x)
    out = np.zeros(len(x), Q5_0)
    out["d"] = f16_bits(q5_0_scale(x))
    low = q & 0x0F
    out["qs"] = (low[:, :16] | (low[:, 16:] << 4)).astype(np.uint8)
    out["qh"] = ((q >> 4) << np.arange(BLOCK)).sum(axis=1).astype(np.uint32)
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


def dequantize_q5_0(blocks):
    low = np.concatenate([blocks["qs"] & 0x0F, blocks["qs"] >> 4], axis=1).astype(np.int64)
    high = (blocks["qh"].astype(np.int64)[:, None] >> np.arange(BLOCK)) & 1
    q = (low | (high << 4)) - 16
    with np.errstate(invalid="ignore", over="ignore"):
        return (q.astype(F32) * widened_scale(blocks)[:, None]).reshape(-1)



# ---- Q4_K and Q6_K: super-blocks of 256 ------------------------------------------------------

QK_K = 256
Q4_K = np.dtype([("d", "<u2"), ("dmin", "<u2"), ("scales", "u1", (12,)), ("qs", "u1", (128,))])
Q5_K = np.dtype([("d", "<u2"), ("dmin", "<u2"), ("scales", "u1", (12,)), ("qh", "u1", (32,)),
                 ("qs", "u1", (128,))])
Q6_K = np.dtype([("ql", "u1", (128,)), ("qh", "u1", (64,)), ("scales", "i1", (16,)), ("d", "<u2")])
assert Q4_K.itemsize == 144 and Q5_K.itemsize == 176 and Q6_K.itemsize == 210
GROUP_MAX_EPS = F32(1e-15)


def nearest_int(v):
    """GGML's nearest_int, bit for bit: the low 23 bits of f32(v + 1.5 * 2^23), less 2^22. That is
    round-half-even(v) for |v| < 2^22, and defined bit arithmetic beyond (GGML's release builds)."""
    with np.errstate(invalid="ignore", over="ignore"):
        shifted = (np.asarray(v, dtype=F32) + F32(12582912)).astype(F32)
    return (shifted.view(np.int32).astype(np.int64) & 0x007FFFFF) - 0x00400000


def _running_sum(terms):
    """sum over the last axis as C's `s = 0; for (...) s += t;` in f32."""
    s = np.zeros(terms.shape[:-1], F32)
    for i in range(terms.shape[-1]):
        s = (s + terms[..., i]).astype(F32)
    return s


def make_qkx2_quants(x, w, nmax=15, rmin=-1.0, rdelta=0.1, nstep=20):
    """GGML's make_qkx2_quants(n, nmax, x, w, L, &the_min, Laux, rmin, rdelta, nstep, false) on
    every row of x [g, n] at once: (scale [g], the_min [g], L [g, n] int64)."""
    n = x.shape[1]
    with np.errstate(all="ignore"):
        mn, mx = x[:, 0].copy(), x[:, 0].copy()
        sum_w = w[:, 0].copy()
        sum_x = (sum_w * x[:, 0]).astype(F32)
        for i in range(1, n):
            mn = np.where(x[:, i] < mn, x[:, i], mn)
            mx = np.where(x[:, i] > mx, x[:, i], mx)
            sum_w = (sum_w + w[:, i]).astype(F32)
            sum_x = (sum_x + (w[:, i] * x[:, i]).astype(F32)).astype(F32)
        mn = np.where(mn > 0, F32(0), mn).astype(F32)
        flat = mx == mn  # GGML returns here: codes 0, scale 0, the_min -min
        flat_min = mn
        iscale = (F32(nmax) / (mx - mn).astype(F32)[:, None]).astype(F32)
        scale = (F32(1) / iscale).astype(F32)[:, 0]
        L = np.clip(nearest_int((iscale * (x - mn[:, None]).astype(F32)).astype(F32)), 0, nmax)
        diff = ((scale[:, None] * L.astype(F32)).astype(F32) + mn[:, None]).astype(F32) - x
        diff = diff.astype(F32)
        best = _running_sum((w * (diff * diff).astype(F32)).astype(F32))
        for step in range(nstep + 1):
            num = ((F32(rmin) + (F32(rdelta) * F32(step)).astype(F32)).astype(F32) + F32(nmax))
            # max - min with the min of the best trial so far, as GGML's loop (not the range's).
            iscale = (F32(num) / (mx - mn).astype(F32)[:, None]).astype(F32)
            l = np.clip(nearest_int((iscale * (x - mn[:, None]).astype(F32)).astype(F32)), 0, nmax)
            lf = l.astype(F32)
            wl = (w * lf).astype(F32)
            sum_l = _running_sum(wl)
            sum_l2 = _running_sum((wl * lf).astype(F32))
            sum_xl = _running_sum((wl * x).astype(F32))
            D = ((sum_w * sum_l2).astype(F32) - (sum_l * sum_l).astype(F32)).astype(F32)
            this_scale = (((sum_w * sum_xl).astype(F32) - (sum_x * sum_l).astype(F32)).astype(F32)
                          / D).astype(F32)
            this_min = (((sum_l2 * sum_x).astype(F32) - (sum_l * sum_xl).astype(F32)).astype(F32)
                        / D).astype(F32)
            positive = this_min > 0
            this_min = np.where(positive, F32(0), this_min).astype(F32)
            this_scale = np.where(positive, (sum_xl / sum_l2).astype(F32), this_scale).astype(F32)
            diff = ((this_scale[:, None] * lf).astype(F32) + this_min[:, None]).astype(F32) - x
            diff = diff.astype(F32)
            cur = _running_sum((w * (diff * diff).astype(F32)).astype(F32))
            better = (D > 0) & (cur < best)
            L = np.where(better[:, None], l, L)
            best = np.where(better, cur, best).astype(F32)
            scale = np.where(better, this_scale, scale).astype(F32)
            mn = np.where(better, this_min, mn).astype(F32)
        L = np.where(flat[:, None], 0, L)
        scale = np.where(flat, F32(0), scale).astype(F32)
        mn = np.where(flat, flat_min, mn).astype(F32)
        return scale, (-mn).astype(F32), L


def _minimum_super_blocks(x, nmax, rmin, nstep, dtype):
    """quantize_row_q4_K_ref's and quantize_row_q5_K_ref's work on x [blocks, 256] f32 (finite)
    but the packing of the codes: (out with d, dmin and scales set, L [blocks, 8, 32])."""
    nb = len(x)
    sub = np.ascontiguousarray(x, dtype=F32).reshape(nb * 8, 32)
    with np.errstate(all="ignore"):
        sum_x2 = _running_sum((sub * sub).astype(F32))
        av_x = np.sqrt((sum_x2 / F32(32)).astype(F32)).astype(F32)
        w = (av_x[:, None] + np.abs(sub)).astype(F32)
        scales, mins, L = make_qkx2_quants(sub, w, nmax=nmax, rmin=rmin, nstep=nstep)
        scales, mins, L = scales.reshape(nb, 8), mins.reshape(nb, 8), L.reshape(nb, 8, 32)
        # GGML's running maxima start at +0 and take a value only when strictly larger: NaN never.
        max_scale = np.max(np.where(scales > 0, scales, F32(0)), axis=1).astype(F32)
        max_min = np.max(np.where(mins > 0, mins, F32(0)), axis=1).astype(F32)
        inv_scale = np.where(max_scale > 0, (F32(63) / max_scale).astype(F32), F32(0)).astype(F32)
        inv_min = np.where(max_min > 0, (F32(63) / max_min).astype(F32), F32(0)).astype(F32)
        # nearest_int's int stored in a uint8_t (mod 256), then MIN(63, .).
        ls = np.minimum(63, nearest_int((inv_scale[:, None] * scales).astype(F32)) & 0xFF)
        lm = np.minimum(63, nearest_int((inv_min[:, None] * mins).astype(F32)) & 0xFF)
        out = np.zeros(nb, dtype)
        packed = np.zeros((nb, 12), np.int64)
        packed[:, 0:4] = ls[:, 0:4] | ((ls[:, 4:8] >> 4) << 6)
        packed[:, 4:8] = lm[:, 0:4] | ((lm[:, 4:8] >> 4) << 6)
        packed[:, 8:12] = (ls[:, 4:8] & 0xF) | ((lm[:, 4:8] & 0xF) << 4)
        out["scales"] = packed.astype(np.uint8)
        out["d"] = f16_bits((max_scale / F32(63)).astype(F32))
        out["dmin"] = f16_bits((max_min / F32(63)).astype(F32))
        d = (widened_scale(out)[:, None] * ls.astype(F32)).astype(F32)
        dm = (np.ascontiguousarray(out["dmin"]).view(np.float16).astype(F32)[:, None]
              * lm.astype(F32)).astype(F32)
        xs = sub.reshape(nb, 8, 32)
        again = np.clip(nearest_int(((xs + dm[:, :, None]).astype(F32) / d[:, :, None]).astype(F32)),
                        0, nmax)
        L = np.where((d != 0)[:, :, None], again, L)  # `if (!d) continue`: NaN goes on
    return out, L


def quantize_q4_k(x):
    """quantize_row_q4_K_ref on x [blocks, 256] f32 (finite)."""
    out, L = _minimum_super_blocks(x, 15, -1.0, 20, Q4_K)
    L = L.reshape(len(x), 4, 2, 32)
    out["qs"] = (L[:, :, 0, :] | (L[:, :, 1, :] << 4)).reshape(len(x), 128).astype(np.uint8)
    return out


def quantize_q5_k(x):
    """quantize_row_q5_K_ref on x [blocks, 256] f32 (finite): Q4_K's steps with 5-bit codes, the
    low 4 bits as Q4_K's nibbles, the fifth bit of sub-block j's element l as bit j of qh[l]."""
    out, L = _minimum_super_blocks(x, 31, -0.5, 15, Q5_K)
    low = (L & 0xF).reshape(len(x), 4, 2, 32)
    out["qs"] = (low[:, :, 0, :] | (low[:, :, 1, :] << 4)).reshape(len(x), 128).astype(np.uint8)
    out["qh"] = ((L >> 4) << np.arange(8)[None, :, None]).sum(axis=1).astype(np.uint8)
    return out


def q4_k_scale_min(scales):
    """get_scale_min_k4 for j = 0 .. 7: (sc [blocks, 8], m [blocks, 8]) from the 12 bytes."""
    q = scales.astype(np.int64)
    sc = np.concatenate([q[:, 0:4] & 63, (q[:, 8:12] & 0xF) | ((q[:, 0:4] >> 6) << 4)], axis=1)
    m = np.concatenate([q[:, 4:8] & 63, (q[:, 8:12] >> 4) | ((q[:, 4:8] >> 6) << 4)], axis=1)
    return sc, m


def _minimum_dequantized(blocks, q):
    """d sc q - dmin m in f32, as dequantize_row_q4_K and q5_K compute it, for codes q
    [blocks, 8, 32] of Q4_K or Q5_K blocks."""
    sc, m = q4_k_scale_min(blocks["scales"])
    with np.errstate(invalid="ignore", over="ignore"):
        d = (widened_scale(blocks)[:, None] * sc.astype(F32)).astype(F32)
        dmin = np.ascontiguousarray(blocks["dmin"]).view(np.float16).astype(F32)
        mins = (dmin[:, None] * m.astype(F32)).astype(F32)
        return ((d[:, :, None] * q.astype(F32)).astype(F32) - mins[:, :, None]).astype(F32).reshape(-1)


def _low_nibbles(blocks):
    """Q4_K's and Q5_K's 4-bit codes [blocks, 8, 32] from their 128 nibble bytes."""
    qs = blocks["qs"].reshape(-1, 4, 32).astype(np.int64)
    return np.stack([qs & 0xF, qs >> 4], axis=2).reshape(-1, 8, 32)


def dequantize_q4_k(blocks):
    return _minimum_dequantized(blocks, _low_nibbles(blocks))


def dequantize_q5_k(blocks):
    high = (blocks["qh"].astype(np.int64)[:, None, :] >> np.arange(8)[None, :, None]) & 1
    return _minimum_dequantized(blocks, _low_nibbles(blocks) | (high << 4))


def make_qx_quants_rmse1(x, nmax=32):
    """GGML's make_qx_quants(n, nmax, x, L, 1, NULL) on every row of x [g, n]: (scale [g],
    L [g, n] int64, stored + nmax)."""
    ax = np.abs(x)
    first = np.argmax(ax, axis=1)  # the first of equal magnitudes, as GGML's strict >
    amax = ax[np.arange(len(x)), first]
    mx = np.where(amax > 0, x[np.arange(len(x)), first], F32(0)).astype(F32)
    zero = amax < GROUP_MAX_EPS
    with np.errstate(over="ignore"):
        w = (x * x).astype(F32)
        wx = (w * x).astype(F32)

    def sums(iscale):
        l = np.clip(nearest_int((iscale[:, None] * x).astype(F32)), -nmax, nmax - 1)
        lf = l.astype(F32)
        sumlx = _running_sum((wx * lf).astype(F32))
        suml2 = _running_sum(((w * lf).astype(F32) * lf).astype(F32))
        return l, sumlx, suml2

    with np.errstate(all="ignore"):
        l, sumlx, suml2 = sums((F32(-nmax) / mx).astype(F32))
        L = l + nmax
        scale = np.where(suml2 != 0, (sumlx / suml2).astype(F32), F32(0)).astype(F32)
        best = (scale * sumlx).astype(F32)
        for step in range(-9, 10):
            if step == 0:
                continue
            num = (F32(nmax) + (F32(0.1) * F32(step)).astype(F32)).astype(F32)
            l, sumlx, suml2 = sums(((-num) / mx).astype(F32))
            better = (suml2 > 0) & ((sumlx * sumlx).astype(F32) > (best * suml2).astype(F32))
            L = np.where(better[:, None], l + nmax, L)
            scale = np.where(better, (sumlx / suml2).astype(F32), scale).astype(F32)
            best = np.where(better, (scale * sumlx).astype(F32), best).astype(F32)
    return np.where(zero, F32(0), scale).astype(F32), np.where(zero[:, None], 0, L)


def _largest_scale(scales):
    """The super-block loops of Q6_K, Q3_K and IQ4_XS over their sub-block scales [blocks, n]:
    (the first scale of largest magnitude, its magnitude), both +0 from the start and taken only
    when strictly larger (so never a NaN)."""
    a = np.abs(scales)
    a = np.where(np.isnan(a), F32(-1), a)
    first = np.argmax(a, axis=1)
    rows = np.arange(len(scales))
    max_abs = np.maximum(a[rows, first], F32(0))
    return np.where(max_abs > 0, scales[rows, first], F32(0)).astype(F32), max_abs


def quantize_q6_k(x):
    """quantize_row_q6_K_ref on x [blocks, 256] f32 (finite)."""
    nb = len(x)
    sub = np.ascontiguousarray(x, dtype=F32).reshape(nb * 16, 16)
    scales, L = make_qx_quants_rmse1(sub)
    scales, L = scales.reshape(nb, 16), L.reshape(nb, 16, 16)
    max_scale, max_abs = _largest_scale(scales)
    zero = max_abs < GROUP_MAX_EPS
    out = np.zeros(nb, Q6_K)
    with np.errstate(all="ignore"):
        iscale = (F32(-128) / max_scale).astype(F32)
        out["d"] = np.where(zero, 0, f16_bits((F32(1) / iscale).astype(F32)))
        sc = np.minimum(127, nearest_int((iscale[:, None] * scales).astype(F32)))
        out["scales"] = np.where(zero[:, None], 0, sc & 0xFF).astype(np.uint8).view(np.int8)
        d = (widened_scale(out)[:, None] * out["scales"].astype(F32)).astype(F32)
        again = np.clip(nearest_int((sub.reshape(nb, 16, 16) / d[:, :, None]).astype(F32)), -32, 31)
        L = np.where((d != 0)[:, :, None], again + 32, L)  # `if (!d) continue`: NaN goes on
    L = np.where(zero[:, None, None], 0, L).reshape(nb, 2, 4, 32)  # memset
    ql = np.stack([L[:, :, 0] & 0xF | ((L[:, :, 2] & 0xF) << 4),
                   L[:, :, 1] & 0xF | ((L[:, :, 3] & 0xF) << 4)], axis=2)
    qh = ((L[:, :, 0] >> 4) | ((L[:, :, 1] >> 4) << 2) | ((L[:, :, 2] >> 4) << 4)
          | ((L[:, :, 3] >> 4) << 6))
    out["ql"] = ql.reshape(nb, 128).astype(np.uint8)
    out["qh"] = qh.reshape(nb, 64).astype(np.uint8)
    return out


def dequantize_q6_k(blocks):
    nb = len(blocks)
    ql = blocks["ql"].reshape(nb, 2, 2, 32).astype(np.int64)
    qh = blocks["qh"].reshape(nb, 2, 32).astype(np.int64)
    q = np.stack([(ql[:, :, 0] & 0xF) | (((qh >> 0) & 3) << 4),
                  (ql[:, :, 1] & 0xF) | (((qh >> 2) & 3) << 4),
                  (ql[:, :, 0] >> 4) | (((qh >> 4) & 3) << 4),
                  (ql[:, :, 1] >> 4) | (((qh >> 6) & 3) << 4)], axis=2) - 32  # [nb, 2, 4, 32]
    sc = blocks["scales"].astype(F32).reshape(nb, 16)
    with np.errstate(invalid="ignore", over="ignore"):
        ds = (widened_scale(blocks)[:, None] * sc).astype(F32).reshape(nb, 16, 1)
        values = (ds * q.reshape(nb, 16, 16).astype(F32)).astype(F32)
    return values.reshape(-1)


# GGML's block_q3_K, 110 bytes: element e's low two bits at bits 2 ((e mod 128) // 32) of
# qs[32 (e // 128) + e mod 32], its high bit as bit e // 32 of hmask[e mod 32]; sub-block g's
# 6-bit scale code (0 .. 63, the scale sc - 32) in the low (g < 8) or high nibble of scales[g mod
# 8] and bits 2 (g // 4) of scales[8 + g mod 4].
Q3_K = np.dtype([("hmask", "u1", (32,)), ("qs", "u1", (64,)), ("scales", "u1", (12,)),
                 ("d", "<u2")])
assert Q3_K.itemsize == 110


def _run_extreme(x):
    """The searches' start on every row of x [g, n]: (the row's first value of largest magnitude,
    as GGML's strict > finds it, or 1 where the row is below GROUP_MAX_EPS [g]; those rows [g])."""
    rows = np.arange(len(x))
    ax = np.abs(x)
    first = np.argmax(ax, axis=1)  # the first of equal magnitudes, as GGML's strict >
    zero = ax[rows, first] < GROUP_MAX_EPS
    return np.where(zero, F32(1), x[rows, first]).astype(F32), zero


def make_q3_quants_rmse(x, nmax=4):
    """GGML's make_q3_quants(n, nmax, x, L, true) on every row of x [g, n]: (scale [g], L [g, n]
    int64, stored + nmax, or 0 for a row below GROUP_MAX_EPS). Its refinement is sequential along
    a row (each element's change moves the sums the next one sees) and stops a row at the first
    of its five passes that changes nothing: vectorized across rows only."""
    g, n = x.shape
    mx, zero = _run_extreme(x)
    with np.errstate(all="ignore"):
        iscale = (F32(-nmax) / mx).astype(F32)
        w = (x * x).astype(F32)
        wx = (w * x).astype(F32)
        L = np.clip(nearest_int((iscale[:, None] * x).astype(F32)), -nmax, nmax - 1)
        lf = L.astype(F32)
        sumlx = _running_sum((wx * lf).astype(F32))
        suml2 = _running_sum(((w * lf).astype(F32) * lf).astype(F32))
        active = ~zero
        for _ in range(5):
            changed = np.zeros(g, bool)
            for i in range(n):
                li = L[:, i].astype(F32)
                slx = (sumlx - (wx[:, i] * li).astype(F32)).astype(F32)
                sl2 = (suml2 - ((w[:, i] * li).astype(F32) * li).astype(F32)).astype(F32)
                new_l = np.clip(nearest_int(((x[:, i] * sl2).astype(F32) / slx).astype(F32)),
                                -nmax, nmax - 1)
                nf = new_l.astype(F32)
                slx_new = (slx + (wx[:, i] * nf).astype(F32)).astype(F32)
                sl2_new = (sl2 + ((w[:, i] * nf).astype(F32) * nf).astype(F32)).astype(F32)
                take = (active & (slx > 0) & (new_l != L[:, i]) & (sl2_new > 0)
                        & (((slx_new * slx_new).astype(F32) * suml2).astype(F32)
                           > ((sumlx * sumlx).astype(F32) * sl2_new).astype(F32)))
                L[:, i] = np.where(take, new_l, L[:, i])
                sumlx = np.where(take, slx_new, sumlx).astype(F32)
                suml2 = np.where(take, sl2_new, suml2).astype(F32)
                changed |= take
            active &= changed
        scale = np.where(suml2 > 0, (sumlx / suml2).astype(F32), F32(0)).astype(F32)
    return np.where(zero, F32(0), scale).astype(F32), np.where(zero[:, None], 0, L + nmax)


def q3_k_scale_codes(scales):
    """The 16 sub-blocks' 6-bit scale codes [blocks, 16] (0 .. 63) from Q3_K's 12 bytes."""
    s = scales.astype(np.int64)
    low = np.concatenate([s[:, 0:8] & 0xF, s[:, 0:8] >> 4], axis=1)
    g = np.arange(16)
    return low | (((s[:, 8 + g % 4] >> (2 * (g // 4))) & 3) << 4)


def quantize_q3_k(x):
    """quantize_row_q3_K_ref on x [blocks, 256] f32 (finite)."""
    nb = len(x)
    sub = np.ascontiguousarray(x, dtype=F32).reshape(nb * 16, 16)
    scales, L = make_q3_quants_rmse(sub)
    scales, L = scales.reshape(nb, 16), L.reshape(nb, 16, 16)
    max_scale = _largest_scale(scales)[0]
    nonzero = max_scale != 0  # `if (max_scale)`
    out = np.zeros(nb, Q3_K)
    with np.errstate(all="ignore"):
        iscale = (F32(-32) / np.where(nonzero, max_scale, F32(1))).astype(F32)
        l = nearest_int((iscale[:, None] * scales).astype(F32))
        l = ((l & 0xFF) ^ 0x80) - 0x80  # stored in an int8_t first
        l = np.where(nonzero[:, None], np.clip(l, -32, 31) + 32, 0)
        packed = np.zeros((nb, 12), np.int64)
        packed[:, 0:8] = (l[:, 0:8] & 0xF) | ((l[:, 8:16] & 0xF) << 4)
        for j in range(16):
            packed[:, 8 + j % 4] |= (l[:, j] >> 4) << (2 * (j // 4))
        out["scales"] = packed.astype(np.uint8)
        out["d"] = np.where(nonzero, f16_bits((F32(1) / iscale).astype(F32)), 0)
        # Every code again against the scale as stored (`if (!d) continue`: NaN goes on).
        d = (widened_scale(out)[:, None]
             * (q3_k_scale_codes(out["scales"]) - 32).astype(F32)).astype(F32)
        again = np.clip(nearest_int((sub.reshape(nb, 16, 16) / d[:, :, None]).astype(F32)), -4, 3)
        L = np.where((d != 0)[:, :, None], again + 4, L).reshape(nb, 256)
    high = L > 3
    low = np.where(high, L - 4, L).reshape(nb, 2, 4, 32)
    out["hmask"] = (high.reshape(nb, 8, 32).astype(np.int64)
                    << np.arange(8)[None, :, None]).sum(axis=1).astype(np.uint8)
    out["qs"] = (low[:, :, 0] | (low[:, :, 1] << 2) | (low[:, :, 2] << 4)
                 | (low[:, :, 3] << 6)).reshape(nb, 64).astype(np.uint8)
    return out


def dequantize_q3_k(blocks):
    nb = len(blocks)
    qs = blocks["qs"].reshape(nb, 2, 1, 32).astype(np.int64)
    low = ((qs >> (2 * np.arange(4))[None, None, :, None]) & 3).reshape(nb, 8, 32)
    high = (blocks["hmask"].astype(np.int64)[:, None, :] >> np.arange(8)[None, :, None]) & 1
    q = (low - np.where(high == 1, 0, 4)).reshape(nb, 256).astype(F32)
    with np.errstate(invalid="ignore", over="ignore"):
        dl = (widened_scale(blocks)[:, None]
              * (q3_k_scale_codes(blocks["scales"]) - 32).astype(F32)).astype(F32)
        return (np.repeat(dl, 16, axis=1) * q).astype(F32).reshape(-1)


# ---- IQ4_NL: Q4_0's blocks of 32, each index a value of a fixed codebook --------------------

IQ4_NL = Q4_0  # GGML's block_iq4_nl: d, then 16 bytes of two 4-bit indices each, 18 bytes
IQ4_NL_VALUES = np.array([-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89,
                          113], F32)  # GGML's kvalues_iq4nl


def iq4_nearest_index(v):
    """GGML's best_index_int8(16, kvalues_iq4nl, v) on every element of v (f32): the nearest
    value's index, the upper of two equally near; beyond either end that end; NaN 15."""
    v = np.asarray(v, dtype=F32)
    # The binary search ends at the first value above v (mu); then `v - val[mu-1] < val[mu] - v`.
    mu = np.clip(np.searchsorted(IQ4_NL_VALUES, v, side="right"), 1, 15)
    with np.errstate(invalid="ignore"):
        below = (v - IQ4_NL_VALUES[mu - 1]).astype(F32)
        above = (IQ4_NL_VALUES[mu] - v).astype(F32)
        index = np.where(below < above, mu - 1, mu)
        index = np.where(v <= IQ4_NL_VALUES[0], 0, index)
        index = np.where(v >= IQ4_NL_VALUES[15], 15, index)
    return np.where(np.isnan(v), 15, index).astype(np.int64)


def iq4_search_scale(x, trials=7):
    """quantize_row_iq4_nl_impl's scale search for rows of 32 (x [g, 32] f32, finite), without
    an importance matrix (weights x^2): the scale [g]."""
    mx, zero = _run_extreme(x)
    with np.errstate(all="ignore"):
        w = (x * x).astype(F32)

        def fit(iscale):
            q = IQ4_NL_VALUES[iq4_nearest_index((iscale[:, None] * x).astype(F32))]
            return (_running_sum(((w * q).astype(F32) * x).astype(F32)),
                    _running_sum(((w * q).astype(F32) * q).astype(F32)))

        d0 = (-mx / IQ4_NL_VALUES[0]).astype(F32)
        sumqx, sumq2 = fit((F32(1) / d0).astype(F32))
        d = np.where(sumq2 > 0, (sumqx / sumq2).astype(F32), F32(0)).astype(F32)
        best = (d * sumqx).astype(F32)
        for t in range(-trials, trials + 1):
            sumqx, sumq2 = fit((F32(t - 127) / mx).astype(F32))
            better = (sumq2 > 0) & ((sumqx * sumqx).astype(F32) > (best * sumq2).astype(F32))
            d = np.where(better, (sumqx / sumq2).astype(F32), d).astype(F32)
            best = np.where(better, (d * sumqx).astype(F32), best).astype(F32)
    return np.where(zero, F32(0), d).astype(F32)


def quantize_iq4_nl(x):
    """quantize_iq4_nl(x, y, 1, n, NULL) on x [blocks, 32] f32 (finite)."""
    x = np.ascontiguousarray(x, dtype=F32)
    d = iq4_search_scale(x)
    out = np.zeros(len(x), IQ4_NL)
    out["d"] = f16_bits(d)
    with np.errstate(all="ignore"):
        q = iq4_nearest_index((reciprocal_or_zero(d)[:, None] * x).astype(F32))
    out["qs"] = (q[:, :16] | (q[:, 16:] << 4)).astype(np.uint8)
    return out


# GGML's block_iq4_xs, 136 bytes: sub-block g's 6-bit scale code (0 .. 63, the scale sc - 32) in
# the low (even g) or high nibble of scales_l[g // 2] and bits 2 g of scales_h; its 32 indices in
# qs[16 g, 16 g + 16) as IQ4_NL keeps them.
IQ4_XS = np.dtype([("d", "<u2"), ("scales_h", "<u2"), ("scales_l", "u1", (4,)), ("qs", "u1", (128,))])
assert IQ4_XS.itemsize == 136


def iq4_xs_scale_codes(blocks):
    """The 8 sub-blocks' 6-bit scale codes [blocks, 8] (0 .. 63)."""
    g = np.arange(8)
    low = (blocks["scales_l"].astype(np.int64)[:, g // 2] >> (4 * (g % 2))) & 0xF
    return low | (((blocks["scales_h"].astype(np.int64)[:, None] >> (2 * g)) & 3) << 4)


def quantize_iq4_xs(x):
    """quantize_row_iq4_xs_ref (quantize_iq4_xs without an importance matrix) on x [blocks, 256]
    f32 (finite)."""
    nb = len(x)
    x = np.ascontiguousarray(x, dtype=F32)
    sub = x.reshape(nb * 8, 32)
    scales = iq4_search_scale(sub).reshape(nb, 8)
    max_scale = _largest_scale(scales)[0]
    out = np.zeros(nb, IQ4_XS)
    with np.errstate(all="ignore"):
        d = (-max_scale / F32(32)).astype(F32)
        out["d"] = f16_bits(d)
        l = np.clip(nearest_int((reciprocal_or_zero(d)[:, None] * scales).astype(F32)), -32, 31)
        dl = (d[:, None] * l.astype(F32)).astype(F32)
        q = iq4_nearest_index((reciprocal_or_zero(dl.reshape(-1))[:, None] * sub).astype(F32))
    q = q.reshape(nb, 8, 32)
    out["qs"] = (q[:, :, :16] | (q[:, :, 16:] << 4)).reshape(nb, 128).astype(np.uint8)
    code = l + 32
    out["scales_l"] = ((code[:, 0::2] & 0xF) | ((code[:, 1::2] & 0xF) << 4)).astype(np.uint8)
    out["scales_h"] = ((code >> 4) << (2 * np.arange(8))).sum(axis=1).astype(np.uint16)
    return out


def dequantize_iq4_xs(blocks):
    nb = len(blocks)
    qs = blocks["qs"].reshape(nb, 8, 16).astype(np.int64)
    q = np.concatenate([qs & 0x0F, qs >> 4], axis=2)
    with np.errstate(invalid="ignore", over="ignore"):
        dl = (widened_scale(blocks)[:, None] * (iq4_xs_scale_codes(blocks) - 32).astype(F32)).astype(F32)
        return (dl[:, :, None] * IQ4_NL_VALUES[q]).astype(F32).reshape(-1)


def reciprocal_or_zero(d):
    """GGML's `d ? 1/d : 0` in f32 (inf where 1/d overflows)."""
    with np.errstate(divide="ignore", over="ignore"):
        return np.where(d != 0, (F32(1) / np.where(d != 0, d, F32(1))).astype(F32), F32(0))


def dequantize_iq4_nl(blocks):
    q = np.concatenate([blocks["qs"] & 0x0F, blocks["qs"] >> 4], axis=1).astype(np.int64)
    with np.errstate(invalid="ignore", over="ignore"):
        return (widened_scale(blocks)[:, None] * IQ4_NL_VALUES[q]).astype(F32).reshape(-1)


def stored_rows(x, fmt):
    """x [rows, k] (k whole blocks) as a tensor of GGML format `fmt` ("q8_0", "q4_0", "q5_0",
    "iq4_nl", "q3_k", "q4_k", "q5_k", "q6_k" or "iq4_xs") holds it: each row quantized and
    dequantized, as f32."""
    x = np.ascontiguousarray(x, dtype=F32)
    codecs = {"q8_0": (BLOCK, quantize_q8_0, dequantize_q8_0),
              "q4_0": (BLOCK, quantize_q4_0, dequantize_q4_0),
              "q5_0": (BLOCK, quantize_q5_0, dequantize_q5_0),
              "iq4_nl": (BLOCK, quantize_iq4_nl, dequantize_iq4_nl),
              "q3_k": (QK_K, quantize_q3_k, dequantize_q3_k),
              "q4_k": (QK_K, quantize_q4_k, dequantize_q4_k),
              "q5_k": (QK_K, quantize_q5_k, dequantize_q5_k),
              "q6_k": (QK_K, quantize_q6_k, dequantize_q6_k),
              "iq4_xs": (QK_K, quantize_iq4_xs, dequantize_iq4_xs)}
    if fmt not in codecs:
        raise ValueError(f"not a block format: {fmt}")
    size, quantize, dequantize = codecs[fmt]
    values = dequantize(quantize(x.reshape(-1, size)))
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
