#!/usr/bin/python3
"""Checks numesh's Q8_0 and Q4_0 block codecs against GGML's reference, byte for byte.

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
  dequantization: f32(f16 d) * code (q4_0: code - 8), in f32.
Where 1/d overflows (a block below ~3.7e-37 for q8_0, ~2.4e-38 for q4_0) GGML converts inf or
NaN to an integer, undefined in C; x86-64 builds get 0x80000000 (low byte 0), so every code is
0 (q4_0: min(15, 0)), and numesh and the transcription write that.

`write` writes DIR/values.f32: random rows at magnitudes from 1e-45 to 1e38 (normal, uniform,
log-uniform, heavy-tailed) and adversarial blocks (zeros of both signs, outliers, values exactly
at k + 0.5 after scaling and their neighbours, negative extremes, ties of magnitude with
opposite signs, scales at f16 rounding ties, at f16 overflow, in f16's subnormals, at the
reciprocal's overflow, and blocks where an FMA or f32 rounding would change a code), with
DIR/kinds.json naming the blocks of each kind; DIR/blocks.q8_0 and DIR/blocks.q4_0, blocks with
every f16 scale pattern (NaN, inf, subnormals) and random codes, to dequantize.

`check` compares numesh's quantized bytes and dequantized values with the transcription's (NaN
outputs compared as NaN only). When NUMESH_GGML_LIB names a built libggml-base.so (an x86-64
build: see above for the blocks where GGML's C is undefined) it also calls GGML's own
quantize_row_q8_0_ref, quantize_row_q4_0_ref, dequantize_row_q8_0 and dequantize_row_q4_0
through ctypes on the same data and compares; unset, that part is skipped with a printed line.
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

from ggml_blocks import (BLOCK, F32, F32_MAX, Q4_0, Q8_0, dequantize_q4_0, dequantize_q8_0,  # noqa: E402,F401
                         f16_bits, q4_0_codes, q4_0_scale, q8_0_scale, quantize_q4_0, quantize_q8_0,
                         reciprocal, roundf, widened_scale, defined_in_ggml)


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
                 65520 * 8, F32_MAX, -F32_MAX]:
        x = rng.uniform(-1, 1, (2, BLOCK)) * abs(amax)
        x[:, 3] = amax
        rows.append(to_f32(x))
    kinds["scales at f16 overflow"] = np.concatenate(rows)

    # Across the overflow of 1/d (d <= 2^-128): extremes from 127 * 2^-128 (q8_0) and 8 * 2^-128
    # (q4_0) up, one f32 step at a time, and a few smaller ones.
    extremes = [1.4e-45, 1e-40, 1e-38, 3e-37, 4e-37]
    for start in (127 * 2.0 ** -128, 8 * 2.0 ** -128):
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
    rows_ = np.arange(n)[:, None]
    targets = rng.integers(1, 4, (n, 8)) - 8.5
    idv = reciprocal(q4_0_scale(pool)).astype(np.float64)[:, None]
    near = to_f32(targets / idv)
    for _ in range(3):
        step = rng.integers(-1, 2, (n, 8))
        near = np.where(step > 0, np.nextafter(near, F32(np.inf)),
                        np.where(step < 0, np.nextafter(near, F32(-np.inf)), near)).astype(F32)
    q4 = pool.copy()
    q4[rows_, cols] = near
    fma = np.any(q4_0_codes(q4) != q4_0_codes(q4, fused=True), axis=1)
    kinds["q4_0 where an FMA would differ"] = q4[fma][:300]
    idv = reciprocal(q8_0_scale(pool)).astype(np.float64)[:, None]
    near = to_f32(rng.choice([-0.5, 0.5], (n, 8)) / idv)
    for _ in range(3):
        step = rng.integers(-1, 2, (n, 8))
        near = np.where(step > 0, np.nextafter(near, F32(np.inf)),
                        np.where(step < 0, np.nextafter(near, F32(-np.inf)), near)).astype(F32)
    q8 = pool.copy()
    q8[rows_, cols] = near
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
        print(f"      got  d {got[b]['d']:#06x} qs {got[b]['qs'].tolist()}")
        print(f"      want d {want[b]['d']:#06x} qs {want[b]['qs'].tolist()}")
    return bad.size == 0


def compare_values(title, got, want):
    nan = np.isnan(want)
    bad = np.flatnonzero(((got.view(np.uint32) != want.view(np.uint32)) & ~nan) | (nan & ~np.isnan(got)))
    print(f"{title}: {got.size} values {'identical' if bad.size == 0 else f'{bad.size} DIFFER'}")
    for i in bad[:5]:
        print(f"    value {i} (block {i // BLOCK}): got {got[i]!r} ({got.view(np.uint32)[i]:#010x}), "
              f"want {want[i]!r} ({want.view(np.uint32)[i]:#010x})")
    return bad.size == 0


def ggml_check(index, x, blocks8, blocks4, mine):
    """GGML's own functions, when NUMESH_GGML_LIB names libggml-base.so; True when they agree."""
    path = os.environ.get("NUMESH_GGML_LIB")
    if not path:
        print("ggml: skipped: NUMESH_GGML_LIB is not set (a built libggml-base.so to compare with "
              "GGML's own reference quantizers)")
        return True
    lib = ctypes.CDLL(path)
    for name in ("quantize_row_q8_0_ref", "quantize_row_q4_0_ref", "dequantize_row_q8_0",
                 "dequantize_row_q4_0"):
        getattr(lib, name).argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64]
        getattr(lib, name).restype = None

    ok = True
    flat = np.ascontiguousarray(x.reshape(-1))
    for fmt, dtype, scale in (("q8_0", Q8_0, q8_0_scale), ("q4_0", Q4_0, q4_0_scale)):
        theirs = np.zeros(len(x), dtype)
        getattr(lib, f"quantize_row_{fmt}_ref")(flat.ctypes.data, theirs.ctypes.data, flat.size)
        undefined = ~defined_in_ggml(scale(x))
        ok &= compare_blocks(f"{fmt} quantize, numesh vs GGML ({path})", index, x, mine[fmt], theirs)
        ok &= compare_blocks(f"{fmt} quantize, NumPy vs GGML", index, x, mine[f"{fmt} numpy"], theirs)
        print(f"    of which {int(undefined.sum())} blocks where 1/d overflows (GGML's C undefined, "
              f"x86 bytes)")
    for fmt, blocks, got in (("q8_0", blocks8, mine["q8_0 any"]), ("q4_0", blocks4, mine["q4_0 any"])):
        theirs = np.zeros(len(blocks) * BLOCK, F32)
        getattr(lib, f"dequantize_row_{fmt}")(blocks.ctypes.data, theirs.ctypes.data, theirs.size)
        ok &= compare_values(f"{fmt} dequantize every scale, numesh vs GGML", got, theirs)
    return ok


def check(d):
    path = lambda name: os.path.join(d, name)  # noqa: E731
    x = np.fromfile(path("values.f32"), dtype=F32).reshape(-1, BLOCK)
    with open(path("kinds.json")) as f:
        index = json.load(f)
    blocks8 = np.fromfile(path("blocks.q8_0"), dtype=Q8_0)
    blocks4 = np.fromfile(path("blocks.q4_0"), dtype=Q4_0)
    print(f"{len(x)} blocks ({x.size} values) of {len(index)} kinds to quantize; "
          f"{len(blocks8)} + {len(blocks4)} blocks to dequantize")
    mine = {"q8_0": np.fromfile(path("values.q8_0"), dtype=Q8_0),
            "q4_0": np.fromfile(path("values.q4_0"), dtype=Q4_0),
            "q8_0 any": np.fromfile(path("blocks.q8_0.f32"), dtype=F32),
            "q4_0 any": np.fromfile(path("blocks.q4_0.f32"), dtype=F32)}
    ok = True
    for fmt, quantize, dequantize in (("q8_0", quantize_q8_0, dequantize_q8_0),
                                      ("q4_0", quantize_q4_0, dequantize_q4_0)):
        want = mine[f"{fmt} numpy"] = quantize(x)
        ok &= compare_blocks(f"{fmt} quantize, numesh vs NumPy", index, x, mine[fmt], want)
        ok &= compare_values(f"{fmt} dequantize its blocks, numesh vs NumPy",
                             np.fromfile(path(f"values.{fmt}.f32"), dtype=F32), dequantize(mine[fmt]))
    ok &= compare_values("q8_0 dequantize every scale, numesh vs NumPy", mine["q8_0 any"],
                         dequantize_q8_0(blocks8))
    ok &= compare_values("q4_0 dequantize every scale, numesh vs NumPy", mine["q4_0 any"],
                         dequantize_q4_0(blocks4))
    ok &= ggml_check(index, x, blocks8, blocks4, mine)
    return 0 if ok else 1


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] not in ("write", "check"):
        print("usage: block_formats_check.py write|check DIR")
        sys.exit(2)
    sys.exit(write(sys.argv[2]) if sys.argv[1] == "write" else check(sys.argv[2]))
