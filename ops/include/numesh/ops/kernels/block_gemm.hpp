#pragma once

#include <cstdint>

#include "numesh/core/dtype.hpp"
#include "numesh/ops/eigen_views.hpp"
#include "numesh/runtime/cpu_features.hpp"

// The kernels of weights in GGML's block formats, Q8_0, Q4_0, Q5_0, IQ4_NL, Q3_K, Q4_K, Q5_K,
// Q6_K and IQ4_XS (runtime/block_formats.hpp), stored out-in ([n, k] row-major, nn.Linear's layout;
// each output's k weights are its blocks side by side):
//
// - Decode (dot_gemm_blocks) of Q8_0, Q4_0, Q5_0 and IQ4_NL: integer dot products, as llama.cpp
// computes
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
//   it differently): for output j of row i, with q_w the weight codes (q4_0: nibble - 8; iq4_nl:
//   the codebook value at the nibble; q5_0: q - 16), d_w the weights' f16 scales widened exactly,
//   and s[0..15] starting at +0,
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
// - Decode of Q3_K, Q4_K, Q5_K, Q6_K and IQ4_XS (dot_gemm_blocks): the same activations, so a
//   super-block of 256 weights meets 8 activation blocks: block t of a row lies in super-block
//   b = t / 8 as Q4_K's sub-block t mod 8 and as Q6_K's (and Q3_K's) sub-blocks 2 (t mod 8) and
//   2 (t mod 8) + 1. The sub-block scales are taken in f32, where they are exact:
//   ds_g = d * sc_g (an f16 times Q4_K's 6-bit or Q6_K's int8 code: at most 18 significant
//   bits) and Q4_K's dm_g = dmin * m_g. With q_w the weight codes (Q4_K: the nibble q, 0 .. 15,
//   the minimum apart; Q6_K: q - 32, -32 .. 31; Q3_K: q - 4, -4 .. 3, under ds_g = d (sc_g - 32)
//   with a 6-bit sc_g, Q6_K's order throughout), for output j of row i and s[0..15] from +0,
//     for each super-block b of the row, in order:
//       for each of its blocks t = 8b .. 8b + 7, in order:
//         isum[l]  = sum of q_a[e] q_w[e] over e = 4l .. 4l + 3 of the block (l = 0..7; an exact
//                    int32, |isum| <= 4 * 127 * 32)
//         scale[l] = d_a[t] * ds_g, g the sub-block holding inputs 4l .. 4l + 3 (Q4_K: g = t mod 8
//                    for every l; Q6_K: g = 2 (t mod 8) + l / 4)       (one f32 product)
//         s[(t mod 2) 8 + l] = fma(f32(isum[l]), scale[l], s[(t mod 2) 8 + l])
//       Q4_K only, then its minimums join the even lanes:
//         s[l] = fma(sum_a[8b + l], -dm_l, s[l])   (l = 0..7, dm_l of super-block b)
//         with sum_a[t] = d_a[t] * f32(sum of block t's 32 codes q_a) (one f32 product a block,
//         computed once a call for every output)
//     then the fold of q8_0 above.
//   So a lane sees q8_0's order, the sub-block scales inside the scale products. AVX-512 holds a
//   super-block's 4 pairs of blocks in 4 registers (q8_0's lanes), multiplies a row's 8 d_a
//   (repeated per sub-block for Q6_K) by an output's 8 or 16 ds in one product, spreads it over
//   each pair's lanes with one permutation, and adds the minimums with one fma masked to lanes
//   0-7; AVX2 keeps even and odd blocks in two accumulators, the minimums joining the even one.
//   The error against the exact product of the kernel's weights w_e (Q4_K: ds_g q - dm_g exactly;
//   Q6_K: ds_g (q - 32), which is runtime::dequantize_q6_k's value exactly) and the quantized
//   activations, with P = sum_e |q_a[e] d_a[t] ds_g q_w[e]| and M = sum_e |q_a[e] d_a[t] dm_g|
//   (M = 0 for Q6_K and Q3_K), is one rounding per scale product, fma and fold step:
//     |c - sum_e q_a[e] d_a[t] w_e| <= (L + 5) 2^-24 (P + M),  L = 5k / 256 (Q4_K), k / 64 (Q6_K,
//     Q3_K)
//   (L the fmas into the longest lane). runtime::dequantize_q4_k rounds ds_g q - dm_g once in
//   f32: against the product of its weights add 2^-24 (P + M). Against the original f32
//   activations add the activations' quantization term of q8_0's bound,
//   sum over blocks t of d_a[t] (1/2 + 2^-12) sum_{e in t} |w_e|.
//   block_gemm_test checks the order bit for bit against its own transcription and the bounds
//   on random rows (errors take up to 11 % of the whole bound at k = 256, 1.1 % at 16384).
//
//   Single-threaded at the avx512-bf16 level (BM_Decode_Dot, medians of 3 on a shared 2-core
//   Zen 4 VM), GB/s of weights for 1 and 8 rows: q4_k 19.8 and 4.6 on [4096, 1024] (in L3),
//   19.1 and 4.5 on [4096, 8192] (from memory); q6_k 26.4, 5.6 and 24.2, 5.4; q4_0 in the same
//   run 18.7, 3.8 and 18.7, 3.9. Per byte at least q4_0's at every vector level (avx2: q4_k
//   1.2-1.45x, q6_k 1.3-1.45x; the scalar reference about equal), so q4_k decodes a weight at
//   least as fast as q4_0 (the same 4.5 bits), q6_k at 0.89-1.0x (6.56 bits).
//
// - Prefill (packed_gemm_q8), every format: the activations quantized as for decode, the
//   weights repacked by the tile 16 outputs at a time (4 consecutive codes of each of the 16 in
//   one 512-bit register, so that a row's 4 codes, broadcast, meet all 16 in one vpdpbusd and
//   each block's integer sums come out whole). The orders, the same at every level bit for bit:
//   for output j of row i, from acc = +0, for each activation block t of the row, in order,
//   with isum over the block's 32 inputs (exact int32) and d_w, ds, dm as for decode above:
//     Q8_0, Q4_0:  acc = fma(f32(isum), d_a[t] * d_w[t], acc)
//     Q4_K:        acc = fma(f32(isum), d_a[t] * ds_g, acc);  acc = fma(sum_a[t], -dm_g, acc)
//                  (g = t mod 8, sum_a as for decode)
//     Q6_K, Q3_K:  acc = fma(f32(isum over inputs 0-15), d_a[t] * ds_2g, acc);
//                  acc = fma(f32(isum over inputs 16-31), d_a[t] * ds_(2g+1), acc)
//   and c = acc (each scale product one f32 product). At the amx level a tile product
//   (tdpbssd) gives a block's integer sums of 16 rows by 16 outputs at once, and the scale
//   products and fmas follow in this order (rows past the last 16 take the VNNI kernel).
//   A row's products then differ from decode's in the last bits (decode keeps 16 lanes of
//   partial sums and folds them); both multiply the same quantized activations. (device_gemm
//   multiplies Q8_0 and Q4_0 weights stored in panels by this tile at every number of rows where
//   panels pay, from the avx2 level (ops::panels_pay), decode
//   included: its rows read the panels where they lie, one row as fast as the dot kernel.)
//   The error against the exact product of the quantized activations and the kernel's weights
//   (P and M as for decode) is one rounding per scale product and fma:
//   |c - sum| <= (L k / 32 + 1) 2^-24 (P + M), L the roundings a block: 2 (Q8_0, Q4_0: a
//   product, an fma), 3 (Q4_K: a product, two fmas), 4 (Q6_K, Q3_K: two of each).
//
// - gemm_dequantized: the former prefill tile, kept as the fp32 baseline that
//   bench/mlp_bench.cpp measures packed_gemm_q8 against: panels of the weights dequantized to
//   fp32 exactly as the runtime dequantizers give them, and numesh's fp32 gemm(); the
//   activations are not quantized.

namespace numesh::ops {

/// Quantizes activations a[m, k] (rows `lda` floats apart) for the dot kernels below (every
/// block format's), per row and per block of 32 inputs, as the comment above defines: codes of row
/// i at codes + i k (k of them), scales of row i at scales + i (k / 32). Bitwise the same at every
/// level. Runs on the calling thread; no state.
/// REQUIRES: m >= 0; lda >= k; `level` runs on this CPU; codes and scales hold m k and
/// m k / 32 values.
/// Throws: ShapeError naming k when k is not a multiple of 32 (or is negative).
void quantize_activations_q8(std::int64_t m, std::int64_t k, const float* a, std::int64_t lda,
                             std::int8_t* codes, float* scales,
                             runtime::KernelLevel level = runtime::kernel_level());

/// c[m, n] = activations[m, k] b for weights in any block format, on the calling thread, the
/// decode kernel: `codes` and `scales` as quantize_activations_q8 wrote them for m rows of k
/// inputs; b [k, n] stored out-in (its output j's blocks of the format at b.stored_row(j), rows
/// b.stride_bytes() apart); c fp32 with rows `ldc` apart (overwritten, never read; k = 0 writes
/// zeros). Each element is summed in the fixed order above (Q8_0's, or the super-block formats'
/// one), so every level gives the same bits (NaN's payload aside). A weight block whose
/// scale (d, or dmin) is NaN or infinite makes its outputs NaN or infinite; weight codes GGML's
/// quantizers never write but a foreign file may hold (Q8_0's -128, any Q4_K scale code) are
/// multiplied exactly. b.data needs no alignment. The super-block formats with minimums (Q4_K,
/// Q5_K) take the activations' scaled block sums, computed once a call into a buffer of the
/// calling thread kept between calls (m k / 32 floats). Weights stored in panels (b.panel_outputs
/// > 0, runtime/weight_panels.hpp; Q8_0 and Q4_0) give the same bits: at avx512-bf16 and amx 16
/// outputs a register (each row's groups' sums taken off once, from a buffer of the calling
/// thread kept between calls: m k / 4 int32), below them each panel restored to rows in a buffer
/// of the calling thread (16 rows) for the level's kernel. No other state: safe to call from many
/// threads at once.
/// REQUIRES: m >= 0; ldc >= n; `level` runs on this CPU; the codes and scales of m rows, codes
/// within [-127, 127] (as quantize_activations_q8 makes them: the vector steps negate them).
/// Throws: TypeError when b.dtype is an element type, or for panels of a format that has none;
/// ShapeError naming the values when b is not stored out-in, k is not whole blocks of the format,
/// a size is negative, b.stride() is shorter than k or ldc than n, or b's panels are not whole,
/// within n and packed (ld = k).
void dot_gemm_blocks(std::int64_t m, const std::int8_t* codes, const float* scales,
                     const WeightMatrix& b, float* c, std::int64_t ldc,
                     runtime::KernelLevel level = runtime::kernel_level());

/// c[m, n] = activations[m, k] b for weights in any block format on the calling thread, the
/// prefill tile: `codes` and `scales` as quantize_activations_q8 wrote them for m rows of k
/// inputs; b [k, n] stored out-in; c fp32 with rows `ldc` apart (overwritten, never read; k = 0
/// writes zeros). Each element is summed in the format's packed order above, so every level
/// gives the same bits (NaN's payload aside), and the same for any tiling of rows and outputs.
/// The weights are repacked 32 outputs at a time into a buffer of the calling thread kept
/// between calls (1.625 bytes a weight of those outputs, 208 KiB at k = 4096); at avx512-bf16 the
/// activation codes as unsigned bytes go to another (m k bytes), and Q4_K's activation block
/// sums to a third (m k / 32 floats), each call preparing them again for its rows (stored panels,
/// b.panel_outputs > 0 of Q8_0 and Q4_0, are read where they lie by the rows of every level from
/// avx2, a pair of panels both stored, and for Q8_0 by AMX's tile products, and otherwise packed
/// by a copy of their codes: the same bytes; the VNNI rows take each activation block's sum of
/// codes, and below VNNI Q4_0's rows -8 times it, in a fourth buffer, m k / 32 int32). NaN or
/// infinite scales (of weight or activation blocks) reach exactly the outputs they multiply
/// into; weight codes of -128 are multiplied exactly. No other state: safe to call from many
/// threads at once.
/// REQUIRES: m >= 0; ldc >= n; `level` runs on this CPU; activation codes within [-127, 127].
/// Throws: TypeError when b.dtype is an element type; ShapeError naming the values when b is not
/// stored out-in, k is not whole blocks of the format, a size is negative, b.stride() is
/// shorter than k or ldc than n, or b's panels are not whole, within n and packed; TypeError
/// for panels of a format that has none (all but Q8_0 and Q4_0).
void packed_gemm_q8(std::int64_t m, const std::int8_t* codes, const float* scales,
                    const WeightMatrix& b, float* c, std::int64_t ldc,
                    runtime::KernelLevel level = runtime::kernel_level());

/// c[m, n] = a[m, k] b on the calling thread, the fp32 baseline tile of weights in any block format
/// (runtime/block_formats.hpp): a fp32 with rows `lda` floats apart, b [k, n] stored out-in, c fp32
/// with rows `ldc` apart (overwritten, never read; k = 0 writes zeros). Panels of b, up to 256
/// inputs (whole blocks of every format) by 4096 outputs, are dequantized to fp32 exactly as the
/// runtime's dequantizers (runtime/block_formats.hpp) give them, into a buffer of the calling
/// thread kept between calls (up to 4 MiB), and multiplied by gemm() (blas_gemm.hpp),
/// accumulating over the panels of k in order: for the outputs [j0, j0 + 4096)
/// c = gemm(a[:, 0:256], panel 0) and then c = gemm(a[:, 256 p:], panel p) + c for each next
/// panel p. So c is, bit for bit, that sequence of fp32 gemm() calls on the dequantized weights,
/// within fp32 accumulation of k terms of the float64 product. NaN or infinite scales reach
/// exactly the columns they multiply into. `level` is unused today (the dequantizers and gemm()
/// have one version each); it keeps the prefill tiles' signature.
/// REQUIRES: b.data aligned to 2 bytes (a block's f16 scales).
/// Throws: TypeError when b.dtype is an element type; ShapeError naming the values when b is
/// not stored out-in, k is not whole blocks of the format, a size is negative, or a leading
/// dimension is shorter than its row (lda < k, b.stride() < k, ldc < n).
void gemm_dequantized(std::int64_t m, const float* a, std::int64_t lda, const WeightMatrix& b,
                      float* c, std::int64_t ldc,
                      runtime::KernelLevel level = runtime::kernel_level());

}  // namespace numesh::ops
