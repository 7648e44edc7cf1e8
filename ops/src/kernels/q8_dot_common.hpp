#pragma once

// PRIVATE to ops/src/kernels: the decode kernel of block-format weights against int8
// activations (ops/kernels/block_gemm.hpp defines its fixed order), at every kernel level,
// written once for every format whose blocks are 32 signed codes and an f16 scale (the block's
// first two bytes, little-endian, in both of GGML's formats). The loops, the scales, the
// accumulation and the fold are here; a format (q8_0_gemm.cpp, q4_0_gemm.cpp) says how its codes
// are read and how one step's exact int32 sums isum[l] are computed:
//
//   struct Codes {
//     static constexpr DType kDType;              // the format
//     static constexpr std::int64_t kBlockBytes;  // bytes of a block
//     // Scalar: the block's 32 codes.
//     static void codes(const unsigned char* block, std::int8_t* q);
//     // AVX2: the block's 32 codes (target "avx2": integer work only, inlines anywhere).
//     static __m256i codes256(const unsigned char* block);
//     // AVX-512 (target NUMESH_Q8DOT_AVX512): the weights of blocks t and t + 1 (kHalf: t
//     // alone, in the low half), a row's activation codes prepared once for every output, and
//     // the 16 lanes' isum of the two.
//     template <bool kVnni, bool kHalf> static Q8dotWeights512 weights512(const unsigned char*);
//     template <bool kVnni> static Q8dotRow512 row512(__m512i x);
//     template <bool kVnni> static __m512i isum512(const Q8dotWeights512&, const Q8dotRow512&);
//   };
//
// Every way of computing isum gives the same exact integers, so the formats may each take the
// cheapest (measured in bench/decode_bench.cpp, BM_Decode_Dot).

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

#include "numesh/core/check.hpp"
#include "numesh/core/dtype.hpp"
#include "numesh/core/error.hpp"
#include "numesh/ops/eigen_views.hpp"
#include "numesh/runtime/cpu_features.hpp"

namespace numesh::ops::detail {

/// Inputs in a block of both formats (and in a block of activation codes).
inline constexpr std::int64_t kQ8DotBlock = 32;

/// The f16 scale bits at the start of a block (no alignment needed).
inline std::uint16_t q8dot_scale_bits(const unsigned char* block) noexcept {
  return static_cast<std::uint16_t>(block[0] | (block[1] << 8));
}

// ---- Scalar: the order written out -------------------------------------------------------------

/// The fold of the header: s[0..15] to one sum.
inline float q8dot_fold(const float* s) noexcept {
  float u[8];
  for (int l = 0; l < 8; ++l) u[l] = s[l] + s[l + 8];
  for (int l = 0; l < 4; ++l) u[l] += u[l + 4];
  for (int l = 0; l < 2; ++l) u[l] += u[l + 2];
  return u[0] + u[1];
}

/// One output: `blocks` blocks of activation codes `qa` (scales `da`) against the weight row at
/// `w`.
template <class F>
float q8dot_scalar(std::int64_t blocks, const std::int8_t* qa, const float* da,
                   const unsigned char* w) {
  float s[16] = {};
  for (std::int64_t t = 0; t < blocks; ++t) {
    const unsigned char* block = w + t * F::kBlockBytes;
    std::int8_t q[kQ8DotBlock];
    F::codes(block, q);
    const float scale = da[t] * f32_from_f16(q8dot_scale_bits(block));
    const std::int8_t* x = qa + t * kQ8DotBlock;
    for (int l = 0; l < 8; ++l) {
      std::int32_t isum = 0;
      for (int e = 4 * l; e < 4 * l + 4; ++e) isum += std::int32_t{x[e]} * std::int32_t{q[e]};
      float& acc = s[(t % 2) * 8 + l];
      acc = std::fma(static_cast<float>(isum), scale, acc);
    }
  }
  return q8dot_fold(s);
}

// ---- AVX2: the even and the odd blocks in two 8-lane accumulators ------------------------------

/// u = even + odd (u[l] = s[l] + s[l + 8]), then the 128-bit halves, then pairs.
__attribute__((target("avx2,fma,f16c"))) inline float q8dot_fold256(__m256 even, __m256 odd) {
  const __m256 u8 = _mm256_add_ps(even, odd);
  const __m128 u4 = _mm_add_ps(_mm256_castps256_ps128(u8), _mm256_extractf128_ps(u8, 1));
  const __m128 u2 = _mm_add_ps(u4, _mm_movehl_ps(u4, u4));
  return _mm_cvtss_f32(_mm_add_ss(u2, _mm_shuffle_ps(u2, u2, 1)));
}

/// acc += isum(|w|, x sign(w)) scale: llama.cpp's sign trick. |w| as unsigned bytes (a code of
/// -128 gives 128) times x with w's sign (x within [-127, 127], so the negation is exact) in
/// vpmaddubsw, whose int16 pair sums stay within 2 * 128 * 127 = 32512 (no saturation), then
/// vpmaddwd with ones: int32 lane l holds the exact sum over the block's inputs 4l .. 4l + 3.
__attribute__((target("avx2,fma,f16c"))) inline __m256 q8dot_step256(__m256i abs_w, __m256i w,
                                                                     const std::int8_t* x,
                                                                     float scale, __m256 acc) {
  const __m256i xv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x));
  const __m256i pairs = _mm256_maddubs_epi16(abs_w, _mm256_sign_epi8(xv, w));
  const __m256i isum = _mm256_madd_epi16(pairs, _mm256_set1_epi16(1));
  return _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), _mm256_set1_ps(scale), acc);
}

/// One block t of one output for R rows of activations (rows k codes and `blocks` scales
/// apart): accumulators by reference (named variables, not arrays: gcc 12 keeps arrays of
/// vectors in memory).
template <class F, int R>
__attribute__((target("avx2,fma,f16c"))) inline void q8dot_block256(
    const unsigned char* block, std::int64_t t, std::int64_t blocks, const std::int8_t* qa,
    const float* da, __m256& r0, __m256& r1, __m256& r2, __m256& r3) {
  const __m256i w = F::codes256(block);
  const __m256i abs_w = _mm256_abs_epi8(w);
  const float d_w = _cvtsh_ss(q8dot_scale_bits(block));  // vcvtph2ps: exact, as f32_from_f16
  const std::int64_t k = blocks * kQ8DotBlock, at = t * kQ8DotBlock;
  r0 = q8dot_step256(abs_w, w, qa + at, da[t] * d_w, r0);
  if constexpr (R > 1) r1 = q8dot_step256(abs_w, w, qa + k + at, da[blocks + t] * d_w, r1);
  if constexpr (R > 2) r2 = q8dot_step256(abs_w, w, qa + 2 * k + at, da[2 * blocks + t] * d_w, r2);
  if constexpr (R > 3) r3 = q8dot_step256(abs_w, w, qa + 3 * k + at, da[3 * blocks + t] * d_w, r3);
}

/// c[r][0] for R rows (c's rows `ldc` apart) of one output whose row of blocks is at `w`.
template <class F, int R>
__attribute__((target("avx2,fma,f16c"))) void q8dot_tile256(std::int64_t blocks,
                                                            const std::int8_t* qa, const float* da,
                                                            const unsigned char* w, float* c,
                                                            std::int64_t ldc) {
  __m256 e0 = _mm256_setzero_ps(), e1 = e0, e2 = e0, e3 = e0, o0 = e0, o1 = e0, o2 = e0, o3 = e0;
  std::int64_t t = 0;
  for (; t + 2 <= blocks; t += 2) {
    q8dot_block256<F, R>(w + t * F::kBlockBytes, t, blocks, qa, da, e0, e1, e2, e3);
    q8dot_block256<F, R>(w + (t + 1) * F::kBlockBytes, t + 1, blocks, qa, da, o0, o1, o2, o3);
  }
  if (t < blocks) q8dot_block256<F, R>(w + t * F::kBlockBytes, t, blocks, qa, da, e0, e1, e2, e3);
  c[0] = q8dot_fold256(e0, o0);
  if constexpr (R > 1) c[ldc] = q8dot_fold256(e1, o1);
  if constexpr (R > 2) c[2 * ldc] = q8dot_fold256(e2, o2);
  if constexpr (R > 3) c[3 * ldc] = q8dot_fold256(e3, o3);
}

// ---- AVX-512: two blocks a register, lanes 0-7 the even block and 8-15 the odd -----------------

// One target for both AVX-512 levels (the formats' AVX-512 steps take it too): the kAvx512
// instantiations hold no VNNI instruction (checked with objdump: vpdpbusd appears only in the
// kVnni ones), and run where kAvx512 does.
#define NUMESH_Q8DOT_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,f16c")))

/// u = low 256 + high 256 (u[l] = s[l] + s[l + 8]), then as q8dot_fold256.
NUMESH_Q8DOT_AVX512 inline float q8dot_fold512(__m512 s) {
  const __m256 high = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(s), 1));
  const __m256 u8 = _mm256_add_ps(_mm512_castps512_ps256(s), high);
  const __m128 u4 = _mm_add_ps(_mm256_castps256_ps128(u8), _mm256_extractf128_ps(u8, 1));
  const __m128 u2 = _mm_add_ps(u4, _mm_movehl_ps(u4, u4));
  return _mm_cvtss_f32(_mm_add_ss(u2, _mm_shuffle_ps(u2, u2, 1)));
}

/// [v[0] x 8, v[1] x 8] from a vector whose lanes 0 and 1 hold them.
NUMESH_Q8DOT_AVX512 inline __m512 q8dot_spread_pair(__m512 v) {
  return _mm512_permutexvar_ps(_mm512_set_epi32(1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0), v);
}

/// The f32 scales of the blocks at `block` and `next` in lanes 0 and 1 (kHalf: `block`'s in
/// lane 0). Scales stay in 128-bit vectors until a row's and an output's are multiplied, so that
/// a step spreads one product vector instead of two factors: 1.2-1.3x as fast at m = 1 and
/// 1.02-1.08x at m = 8 as 512-bit factors multiplied per row and output (the A/B program of
/// q8_0_gemm.cpp).
template <bool kHalf>
NUMESH_Q8DOT_AVX512 inline __m128 q8dot_weight_scales(const unsigned char* block,
                                                      const unsigned char* next) {
  if constexpr (kHalf) return _mm_cvtph_ps(_mm_cvtsi32_si128(q8dot_scale_bits(block)));
  const auto bits =
      static_cast<int>(q8dot_scale_bits(block) | (std::uint32_t{q8dot_scale_bits(next)} << 16));
  return _mm_cvtph_ps(_mm_cvtsi32_si128(bits));
}

/// One output's two blocks (kHalf: the odd last block alone, in the low half; the high half's
/// lanes are never added), as the format's step reads them: `w` and `aux` are the format's (its
/// codes, and their magnitudes or a correction), `negative` where codes are negative if it
/// needs that, `d_w` the scales (q8dot_weight_scales).
struct Q8dotWeights512 {
  __m512i w;
  __m512i aux;
  __mmask64 negative;
  __m128 d_w;
};

/// One row's activation codes for two blocks as the format's step reads them (`x`, perhaps
/// changed, and a per-lane `correction` if it needs one).
struct Q8dotRow512 {
  __m512i x;
  __m512i correction;
};

/// acc += f32(isum) (d_a d_w), the two blocks' scale products (lanes 0 and 1 of d_a d_w) spread
/// over the halves; kHalf: only lanes 0-7 (the odd last block), so that the odd block's lanes
/// keep their bits.
template <bool kHalf>
NUMESH_Q8DOT_AVX512 inline __m512 q8dot_accumulate512(__m512i isum, __m128 d_a, __m128 d_w,
                                                      __m512 acc) {
  const __m512 scale = q8dot_spread_pair(_mm512_castps128_ps512(_mm_mul_ps(d_a, d_w)));
  if constexpr (kHalf) return _mm512_mask3_fmadd_ps(_mm512_cvtepi32_ps(isum), scale, acc, 0x00FF);
  return _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), scale, acc);
}

/// One row's step over two blocks (kHalf: the last, odd block) for J outputs: its activation
/// codes at `x` and scales at `d`, loaded and prepared once for the J outputs.
template <class F, bool kVnni, bool kHalf, int J>
NUMESH_Q8DOT_AVX512 inline void q8dot_row512(const std::int8_t* x, const float* d,
                                             const Q8dotWeights512& w0, const Q8dotWeights512& w1,
                                             __m512& p, __m512& q) {
  __m512i xv;
  __m128 d_a;
  if constexpr (kHalf) {
    xv = _mm512_zextsi256_si512(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(x)));
    d_a = _mm_load_ss(d);
  } else {
    xv = _mm512_loadu_si512(x);
    d_a = _mm_castsi128_ps(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(d)));
  }
  const Q8dotRow512 row = F::template row512<kVnni>(xv);
  p = q8dot_accumulate512<kHalf>(F::template isum512<kVnni>(w0, row), d_a, w0.d_w, p);
  if constexpr (J > 1)
    q = q8dot_accumulate512<kHalf>(F::template isum512<kVnni>(w1, row), d_a, w1.d_w, q);
}

/// Blocks [t, t + 2) (kHalf: block t alone) of J outputs (rows `ldw` bytes apart from `w`) for
/// R rows of activations: accumulators p* for the first output, q* for the second.
template <class F, bool kVnni, bool kHalf, int R, int J>
NUMESH_Q8DOT_AVX512 inline void q8dot_rows512(std::int64_t t, std::int64_t blocks,
                                              const std::int8_t* qa, const float* da,
                                              const unsigned char* w, std::int64_t ldw, __m512& p0,
                                              __m512& p1, __m512& p2, __m512& p3, __m512& q0,
                                              __m512& q1, __m512& q2, __m512& q3) {
  const unsigned char* block = w + t * F::kBlockBytes;
  if constexpr (!kHalf && J > 1) {
    // The next pair of outputs' weights at the same place, the bytes this step reads (68 of
    // q8_0): a tile of 4 rows computes long enough between its loads that, with the weights in
    // memory, the hardware prefetcher alone fell behind. 1.2-1.5x at m = 8 on [4096, 8192], no
    // change on [4096, 1024] (in L3); no gain for one output (m < 4), which streams faster
    // (BM_Decode_Dot's shapes in the A/B program of q8_0_gemm.cpp). An address, never read:
    // past the last output it is only a prefetch hint.
    const auto* next =
        reinterpret_cast<const char*>(reinterpret_cast<std::uintptr_t>(block) + 2 * ldw);
    _mm_prefetch(next, _MM_HINT_T0);
    _mm_prefetch(next + 64, _MM_HINT_T0);
    _mm_prefetch(next + ldw, _MM_HINT_T0);
    _mm_prefetch(next + ldw + 64, _MM_HINT_T0);
  }
  const Q8dotWeights512 w0 = F::template weights512<kVnni, kHalf>(block);
  Q8dotWeights512 w1 = w0;
  if constexpr (J > 1) w1 = F::template weights512<kVnni, kHalf>(block + ldw);
  const std::int64_t k = blocks * kQ8DotBlock, at = t * kQ8DotBlock;
  q8dot_row512<F, kVnni, kHalf, J>(qa + at, da + t, w0, w1, p0, q0);
  if constexpr (R > 1)
    q8dot_row512<F, kVnni, kHalf, J>(qa + k + at, da + blocks + t, w0, w1, p1, q1);
  if constexpr (R > 2)
    q8dot_row512<F, kVnni, kHalf, J>(qa + 2 * k + at, da + 2 * blocks + t, w0, w1, p2, q2);
  if constexpr (R > 3)
    q8dot_row512<F, kVnni, kHalf, J>(qa + 3 * k + at, da + 3 * blocks + t, w0, w1, p3, q3);
}

/// c[r][0 .. J) for R rows of activations (c's rows `ldc` apart) and J outputs whose rows of
/// blocks lie `ldw` bytes apart from `w`: each weight load serves R rows, each activation load J
/// outputs.
template <class F, bool kVnni, int R, int J>
NUMESH_Q8DOT_AVX512 void q8dot_tile512(std::int64_t blocks, const std::int8_t* qa, const float* da,
                                       const unsigned char* w, std::int64_t ldw, float* c,
                                       std::int64_t ldc) {
  __m512 p0 = _mm512_setzero_ps(), p1 = p0, p2 = p0, p3 = p0, q0 = p0, q1 = p0, q2 = p0, q3 = p0;
  std::int64_t t = 0;
  for (; t + 2 <= blocks; t += 2) {
    q8dot_rows512<F, kVnni, false, R, J>(t, blocks, qa, da, w, ldw, p0, p1, p2, p3, q0, q1, q2, q3);
  }
  if (t < blocks) {
    q8dot_rows512<F, kVnni, true, R, J>(t, blocks, qa, da, w, ldw, p0, p1, p2, p3, q0, q1, q2, q3);
  }
  c[0] = q8dot_fold512(p0);
  if constexpr (R > 1) c[ldc] = q8dot_fold512(p1);
  if constexpr (R > 2) c[2 * ldc] = q8dot_fold512(p2);
  if constexpr (R > 3) c[3 * ldc] = q8dot_fold512(p3);
  if constexpr (J > 1) {
    c[1] = q8dot_fold512(q0);
    if constexpr (R > 1) c[ldc + 1] = q8dot_fold512(q1);
    if constexpr (R > 2) c[2 * ldc + 1] = q8dot_fold512(q2);
    if constexpr (R > 3) c[3 * ldc + 1] = q8dot_fold512(q3);
  }
}

// ---- Dispatch ----------------------------------------------------------------------------------

/// Rows of activations a kernel call takes at once: each weight block, once loaded, serves
/// them all.
inline constexpr std::int64_t kQ8DotRows = 4;

/// The AVX-512 tiles for `rows` (1 .. kQ8DotRows) rows and `outputs` (1 or 2) outputs.
template <class F, bool kVnni>
void q8dot_tile512_any(std::int64_t rows, std::int64_t outputs, std::int64_t blocks,
                       const std::int8_t* qa, const float* da, const unsigned char* w,
                       std::int64_t ldw, float* c, std::int64_t ldc) {
  const bool two = outputs == 2;
  switch (rows) {
    case 1:
      return two ? q8dot_tile512<F, kVnni, 1, 2>(blocks, qa, da, w, ldw, c, ldc)
                 : q8dot_tile512<F, kVnni, 1, 1>(blocks, qa, da, w, ldw, c, ldc);
    case 2:
      return two ? q8dot_tile512<F, kVnni, 2, 2>(blocks, qa, da, w, ldw, c, ldc)
                 : q8dot_tile512<F, kVnni, 2, 1>(blocks, qa, da, w, ldw, c, ldc);
    case 3:
      return two ? q8dot_tile512<F, kVnni, 3, 2>(blocks, qa, da, w, ldw, c, ldc)
                 : q8dot_tile512<F, kVnni, 3, 1>(blocks, qa, da, w, ldw, c, ldc);
    default:
      return two ? q8dot_tile512<F, kVnni, 4, 2>(blocks, qa, da, w, ldw, c, ldc)
                 : q8dot_tile512<F, kVnni, 4, 1>(blocks, qa, da, w, ldw, c, ldc);
  }
}

/// The AVX2 tiles for `rows` (1 .. kQ8DotRows) rows of one output.
template <class F>
void q8dot_tile256_any(std::int64_t rows, std::int64_t blocks, const std::int8_t* qa,
                       const float* da, const unsigned char* w, float* c, std::int64_t ldc) {
  switch (rows) {
    case 1:
      return q8dot_tile256<F, 1>(blocks, qa, da, w, c, ldc);
    case 2:
      return q8dot_tile256<F, 2>(blocks, qa, da, w, c, ldc);
    case 3:
      return q8dot_tile256<F, 3>(blocks, qa, da, w, c, ldc);
    default:
      return q8dot_tile256<F, 4>(blocks, qa, da, w, c, ldc);
  }
}

/// dot_gemm_q8_0 / dot_gemm_q4_0 (block_gemm.hpp) for the format F: checks, then the level's
/// kernel. `name` names the caller in errors.
template <class F>
void q8dot_gemm(const char* name, std::int64_t m, const std::int8_t* codes, const float* scales,
                const WeightMatrix& b, float* c, std::int64_t ldc, runtime::KernelLevel level) {
  using runtime::KernelLevel;
  NUMESH_CHECK(b.dtype == F::kDType, TypeError, "{}: weights of dtype {}; it takes {}", name,
               to_string(b.dtype), to_string(F::kDType));
  NUMESH_CHECK(b.layout == WeightLayout::kOutIn, ShapeError,
               "{}: {} weights stored in-out; block-format weights are stored out-in ([n, k])",
               name, to_string(b.dtype));
  const std::int64_t n = b.cols, k = b.rows, ld = b.ld != 0 ? b.ld : k;
  NUMESH_CHECK(m >= 0 && n >= 0 && k >= 0 && k % kQ8DotBlock == 0 && ld >= k &&
                   ld % kQ8DotBlock == 0 && ldc >= n,
               ShapeError,
               "{}: m {}, n {}, k {} with ldb {}, ldc {}: sizes must be >= 0, k and ldb whole "
               "blocks of {} and each leading dimension at least its row's length",
               name, m, n, k, ld, ldc, kQ8DotBlock);
  if (m == 0 || n == 0) return;
  const std::int64_t blocks = k / kQ8DotBlock;
  const auto* w = static_cast<const unsigned char*>(b.data);
  const std::int64_t ldw = ld / kQ8DotBlock * F::kBlockBytes;
  // Outputs outermost: a pair of outputs' weights (2 k / 32 blocks, 8.5 KiB of q8_0 at
  // k = 4096) stay in cache while every group of rows reads them, so the weights come from
  // memory once whatever m is.
  switch (level) {
    case KernelLevel::kAvx512:
    case KernelLevel::kAvx512Bf16: {
      const bool vnni = level == KernelLevel::kAvx512Bf16;
      // Two outputs a tile only for groups of 4 rows (an activation load then serves both):
      // with fewer rows the kernel streams the weights, and two of their rows at once ran at
      // 0.4x (10.8 against 26 GB/s, q8_0 at m = 1 on [4096, 8192], BM_Decode_Dot).
      const std::int64_t step = m >= kQ8DotRows ? 2 : 1;
      for (std::int64_t j = 0; j < n; j += step) {
        const std::int64_t outputs = std::min<std::int64_t>(step, n - j);
        for (std::int64_t i = 0; i < m; i += kQ8DotRows) {
          const std::int64_t rows = std::min(kQ8DotRows, m - i);
          const std::int8_t* qa = codes + i * k;
          const float* da = scales + i * blocks;
          if (vnni) {
            q8dot_tile512_any<F, true>(rows, outputs, blocks, qa, da, w + j * ldw, ldw,
                                       c + i * ldc + j, ldc);
          } else {
            q8dot_tile512_any<F, false>(rows, outputs, blocks, qa, da, w + j * ldw, ldw,
                                        c + i * ldc + j, ldc);
          }
        }
      }
      return;
    }
    case KernelLevel::kAvx2:
      for (std::int64_t j = 0; j < n; ++j) {
        for (std::int64_t i = 0; i < m; i += kQ8DotRows) {
          q8dot_tile256_any<F>(std::min(kQ8DotRows, m - i), blocks, codes + i * k,
                               scales + i * blocks, w + j * ldw, c + i * ldc + j, ldc);
        }
      }
      return;
    case KernelLevel::kScalar:
      break;
  }
  for (std::int64_t i = 0; i < m; ++i) {
    for (std::int64_t j = 0; j < n; ++j) {
      c[i * ldc + j] = q8dot_scalar<F>(blocks, codes + i * k, scales + i * blocks, w + j * ldw);
    }
  }
}

}  // namespace numesh::ops::detail
