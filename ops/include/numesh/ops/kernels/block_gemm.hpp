#pragma once

#include <cstdint>

#include "numesh/core/dtype.hpp"
#include "numesh/ops/eigen_views.hpp"
#include "numesh/runtime/cpu_features.hpp"

// The kernels of weights in GGML's block formats, Q8_0 and Q4_0 (runtime/block_formats.hpp),
// stored out-in ([n, k] row-major, nn.Linear's layout; each output's k weights are k / 32 blocks
// side by side):
//
// - Decode (dot_gemm_q8_0, dot_gemm_q4_0): integer dot products, as llama.cpp computes
//   Q8_0 x Q8_0 and Q4_0 x Q8_0. The activations are quantized first (quantize_activations_q8),
//   per row and per block of 32 inputs, to int8 codes q_a and one f32 scale d_a:
//     amax = max |x|, d_a = amax / 127 (f32), id = 1 / d_a (f32; 0 when d_a is 0 or 1 / d_a
//     overflows, below amax ~ 3.7e-37), q_a = x * id rounded to nearest even, clamped to
//     [-127, 127].
//   This is GGML's quantize_row_q8_0 (what llama.cpp runs on activations for Q8_0 and Q4_0
//   weights) but for the scale, which numesh keeps in f32 where GGML rounds it to f16 (a
//   relative error of up to 2^-11 in every product of the block). Codes round to nearest even,
//   as GGML's x86 vector code does (its reference rounds half away from zero: exact halves of
//   x * id differ by one code), with id = 1 / d_a as its reference (its x86 code takes
//   127 / amax, which may differ in the last bit and so move a code on a rounding boundary).
//   A block holding a NaN or an infinity gets scale NaN (and codes 0), so that every output it
//   feeds is NaN, as the exact product would be NaN or infinite.
//
//   The order of the sum, the same at every kernel level bit for bit (each level only computes
//   it differently): for output j of row i, with q_w the weight codes (q4_0: nibble - 8), d_w
//   the weights' f16 scales widened exactly, and s[0..15] starting at +0,
//     for each block t of the row, in order (32 inputs each):
//       isum[l] = sum of q_a[e] q_w[e] over e = 4l .. 4l + 3 of the block (l = 0..7; an exact
//                 int32, |isum| <= 4 * 127 * 128, exact in f32 too)
//       scale_t = d_a[t] * d_w[t]                              (one f32 product)
//       s[(t mod 2) 8 + l] = fma(f32(isum[l]), scale_t, s[(t mod 2) 8 + l])
//     then the fold: u[l] = s[l] + s[l + 8] (l < 8); u[l] += u[l + 4] (l < 4);
//     u[l] += u[l + 2] (l < 2); c = u[0] + u[1].
//   It is what a 512-bit register holding two blocks (lanes 0-7 the even block, 8-15 the odd)
//   computes naturally with vpdpbusd or vpmaddubsw + vpmaddwd; AVX2 keeps the even and odd
//   blocks in two 8-lane accumulators.
//   The error against the exact product of the dequantized weights and the original f32
//   activations is the activations' quantization error plus f32 accumulation:
//     |c - sum_e x_e w_e| <= sum over blocks t of d_a[t] (1/2 + 2^-12) sum_{e in t} |w_e|
//                            + (k / 64 + 5) 2^-24 sum_e |q_a[e] d_a[t] w_e|
//   (each code is within half a step of x / d_a, plus the roundings of id and x * id; the
//   second term is one rounding per scale product, fma and fold step; block_gemm_test checks
//   both on random rows, where the error takes up to 36 % of the bound at k = 32, 2 % at 4128).
//   Blocks whose largest magnitude is below ~3.7e-37 are the exception: their codes are 0.
//
//   Single-threaded on Zen 4 at the avx512-bf16 level (bench/decode_bench.cpp, BM_Decode_Dot):
//   on [4096, 1024] weights (in L3) q8_0 reads 40 GB/s of weights for one row of activations and
//   8.7 for 8 rows, q4_0 19 and 4.1, dot_gemm_bf16 73 and 14: compute-bound, a matrix takes
//   about bf16's time (q8_0 0.9-1.0x, q4_0 1.0-1.1x). From memory ([4096, 8192]) it takes
//   0.40-0.46x bf16's time.
//
// - Prefill (gemm_dequantized): panels of the weights dequantized to fp32 exactly as the runtime
//   dequantizers give them, and numesh's fp32 gemm(); the activations are not quantized.

namespace numesh::ops {

/// Quantizes activations a[m, k] (rows `lda` floats apart) for dot_gemm_q8_0 / dot_gemm_q4_0,
/// per row and per block of 32 inputs, as the comment above defines: codes of row i at
/// codes + i k (k of them), scales of row i at scales + i (k / 32). Bitwise the same at every
/// level. Runs on the calling thread; no state.
/// REQUIRES: m >= 0; lda >= k; `level` runs on this CPU; codes and scales hold m k and
/// m k / 32 values.
/// Throws: ShapeError naming k when k is not a multiple of 32 (or is negative).
void quantize_activations_q8(std::int64_t m, std::int64_t k, const float* a, std::int64_t lda,
                             std::int8_t* codes, float* scales,
                             runtime::KernelLevel level = runtime::kernel_level());

/// c[m, n] = activations[m, k] b for Q8_0 weights, on the calling thread: `codes` and `scales`
/// as quantize_activations_q8 wrote them for m rows of k inputs; b [k, n] stored out-in (its
/// output j's k / 32 blocks at b.stored_row(j), rows b.stride_bytes() apart); c fp32 with rows
/// `ldc` apart (overwritten, never read; k = 0 writes zeros). Each element is summed in the
/// fixed order above, so every level gives the same bits (NaN's payload aside). A weight block
/// whose scale is NaN or infinite makes its outputs NaN or infinite; codes of -128 (which
/// GGML's quantizer never writes, but a foreign file may hold) are multiplied exactly.
/// b.data needs no alignment. No state: safe to call from many threads at once.
/// REQUIRES: m >= 0; ldc >= n; `level` runs on this CPU; the codes and scales of m rows, codes
/// within [-127, 127] (as quantize_activations_q8 makes them: the vector steps negate them).
/// Throws: TypeError when b.dtype is not kQ8_0; ShapeError naming the values when b is not
/// stored out-in, k is not a multiple of 32, a size is negative, or b.stride() is shorter than
/// k or ldc than n.
void dot_gemm_q8_0(std::int64_t m, const std::int8_t* codes, const float* scales,
                   const WeightMatrix& b, float* c, std::int64_t ldc,
                   runtime::KernelLevel level = runtime::kernel_level());

/// dot_gemm_q8_0 for Q4_0 weights (codes q_w = nibble - 8, -8 .. 7).
/// REQUIRES / Throws: as dot_gemm_q8_0, with b.dtype kQ4_0.
void dot_gemm_q4_0(std::int64_t m, const std::int8_t* codes, const float* scales,
                   const WeightMatrix& b, float* c, std::int64_t ldc,
                   runtime::KernelLevel level = runtime::kernel_level());

/// c[m, n] = a[m, k] b on the calling thread, the prefill tile of Q8_0 or Q4_0 weights: a fp32
/// (not quantized) with rows `lda` floats apart, b [k, n] stored out-in, c fp32 with rows `ldc`
/// apart (overwritten, never read; k = 0 writes zeros). Panels of b, up to 256 inputs (8 blocks)
/// by 4096 outputs, are dequantized to fp32 exactly as runtime::dequantize_q8_0 / q4_0 give
/// them, into a buffer of the calling thread kept between calls (up to 4 MiB), and multiplied
/// by gemm() (blas_gemm.hpp), accumulating over the panels of k in order: for the outputs
/// [j0, j0 + 4096) c = gemm(a[:, 0:256], panel 0) and then c = gemm(a[:, 256 p:], panel p) + c
/// for each next panel p. So c is, bit for bit, that sequence of fp32 gemm() calls on the
/// dequantized weights, within fp32 accumulation of k terms of the float64 product. NaN or
/// infinite scales reach exactly the columns they multiply into. `level` is unused today (the
/// dequantizers and gemm() have one version each); it keeps the prefill tiles' signature.
/// REQUIRES: b.data aligned to 2 bytes (a block's f16 scale).
/// Throws: TypeError when b.dtype is not kQ8_0 or kQ4_0; ShapeError naming the values when b is
/// not stored out-in, k is not a multiple of 32, a size is negative, or a leading dimension is
/// shorter than its row (lda < k, b.stride() < k, ldc < n).
void gemm_dequantized(std::int64_t m, const float* a, std::int64_t lda, const WeightMatrix& b,
                      float* c, std::int64_t ldc,
                      runtime::KernelLevel level = runtime::kernel_level());

}  // namespace numesh::ops
