#pragma once

#include <cstdint>

#include "numesh/core/dtype.hpp"
#include "numesh/ops/eigen_views.hpp"
#include "numesh/runtime/cpu_features.hpp"

// The prefill kernel for 16-bit weights: c = a b with a fp32 activations and b bf16 or f16
// weights, on the calling thread (a device's threads call it per tile; the caller tiles).
// Debian's OpenBLAS 0.3.21 has no sbgemm, so the bf16 product is numesh's own:
//
// - kAvx512Bf16 with bf16 weights: vdpbf16ps. The activations are rounded to bf16 (round to
//   nearest even), as PyTorch's and oneDNN's bf16 matmuls do; each product of two bf16 values
//   is exact in fp32 (in the normal range) and is added in fp32. b is packed per call, in
//   blocks of 256 x 1024, into the layout vdpbf16ps reads (for each pair of rows k, k+1 and
//   each column j the dword (b[k][j], b[k+1][j]); an odd k gets a zero row), and a
//   register-blocked micro-kernel of 12 rows x 32 columns broadcasts pairs of a against it.
//   On Zen 4, single-threaded, [512, 1024] x [1024, 4096] runs at ~190 GFLOP/s, 1.95x the
//   fp32 gemm() (mlp_bench, BM_Gemm16).
//   Every element is one chain in k order, whatever the blocking: with a' and b' the bf16
//   values (a zero pair appended when k is odd), acc = 0 and for each pair p
//     acc = fp32(acc + a'[2p+1] b'[2p+1]);  acc = fp32(acc + a'[2p] b'[2p])
//   each step rounded to nearest even, with bf16 subnormal inputs read as zero and subnormal
//   results flushed to zero (Intel's definition of vdpbf16ps). Tested on AMD Zen 4: the
//   instruction gives exactly these bits (two roundings per pair, the odd element first; not a
//   fused three-way sum), on 3.2 million random lanes and on a subnormal intermediate
//   (tests/ops/gemm_16bit_test.cpp checks it bit for bit against this emulation).
//   At kAmx (Intel's server cores, where a 512-bit vdpbf16ps issues every two cycles and fmas
//   two a cycle) each pair step is two fmas under MXCSR's DAZ and FTZ: the same definition and
//   the same bits (the same tests), 1.5x the vdpbf16ps tiles on Emerald Rapids; pack_a_transposed's
//   pair-major panels (a weight gradient's dy^T x) keep vdpbf16ps.
// - Every other case (f16 weights at any level, bf16 below kAvx512Bf16): panels of b (256 rows
//   x up to 4096 columns) are widened to fp32 (exactly) into a buffer of the calling thread
//   and multiplied by numesh's gemm() (single-threaded OpenBLAS), accumulating over the panels
//   of k. a is used unrounded; the result is the fp32 GEMM's, within fp32 accumulation of k
//   terms of the float64 product. 0.95-1.0x the fp32 gemm() on the shape above.

namespace numesh::ops {

/// c[m, n] = a[m, k] b on the calling thread: a fp32 with rows `lda` floats apart, b [k, n] of bf16
/// or f16 stored as b.layout says (kInOut: [k, n] with rows b.stride() elements apart; kOutIn:
/// [n, k] likewise, packed and widened from that order), c fp32 with rows `ldc` apart
/// (overwritten, never read; k = 0 writes zeros). At kAvx512Bf16 with bf16 weights a is rounded
/// to bf16 first (see above); otherwise the product is the fp32 GEMM of a and the widened
/// weights. NaN and infinite weights reach exactly the columns of c they multiply into.
/// Keeps buffers of the calling thread between calls: up to 4 MiB of widened weights, or about
/// 0.6 MiB of packed operands on the vdpbf16ps path.
/// REQUIRES: `level` runs on this CPU.
/// Throws: ShapeError when b.dtype is not kBF16 or kF16 (fp32 weights go to gemm()), a size is
/// negative, or a leading dimension is shorter than its row (lda < k, b.stride() shorter than
/// b's stored row, ldc < n).
void gemm_16bit(std::int64_t m, const float* a, std::int64_t lda, const WeightMatrix& b, float* c,
                std::int64_t ldc, runtime::KernelLevel level = runtime::kernel_level());

/// c[m, n] = op(a) op(b) (or c += with `accumulate`) in bf16 compute, on the calling thread:
/// both operands are fp32 and each is rounded to bf16 (to nearest even) before it multiplies,
/// the products (exact in fp32) summed in fp32, as torch.autocast's bf16 matmul does on
/// fp32 tensors. op(a) is a [m, k] (rows `lda` apart) or, with `transpose_a`, a stored [k, m]
/// read transposed (a weight gradient's dy^T x: the sum runs down both operands' rows); op(b)
/// is b [k, n] or, with `transpose_b`, b stored [n, k]. At kAvx512Bf16 the vdpbf16ps kernel
/// above, rounding while it packs (vcvtneps2bf16 for a transposed a; the two roundings differ
/// only on fp32 subnormals, which vdpbf16ps reads as zero either way); below it, rounded
/// copies of both operands through the fp32 gemm() (no faster than fp32: the same products,
/// summed in another order). Buffers as gemm_16bit()'s, plus the rounded block of b.
/// REQUIRES: `level` runs on this CPU.
/// Throws: ShapeError when a size is negative or a leading dimension is shorter than its row.
void gemm_bf16_compute(std::int64_t m, std::int64_t n, std::int64_t k, const float* a,
                       std::int64_t lda, bool transpose_a, const float* b, std::int64_t ldb,
                       bool transpose_b, bool accumulate, float* c, std::int64_t ldc,
                       runtime::KernelLevel level = runtime::kernel_level());

}  // namespace numesh::ops
