#pragma once

// PRIVATE to ops/src/kernels: the decode kernel of block-format weights against int8
// activations (ops/kernels/block_gemm.hpp defines its fixed orders), at every kernel level,
// written once for every format. The loops, the scales, the accumulation and the fold are here;
// a format says how its codes and scales are read and how one step's exact int32 sums isum[l]
// are computed. Two kinds of format:
//
// - Pair formats (q8_0_gemm.cpp, q4_0_gemm.cpp, q5_0_gemm.cpp): blocks of 32 signed codes and
//   an f16 scale (the block's first two bytes, little-endian, in each of GGML's formats); a step
//   takes two blocks.
//
//   struct Codes {
//     static constexpr DType kDType;                      // the format
//     static constexpr std::int64_t kBlockBytes;          // bytes of a block
//     static constexpr std::int64_t kBlockElements = 32;  // inputs of a block
//     // Scalar: the block's 32 codes.
//     static void codes(const unsigned char* block, std::int8_t* q);
//     // AVX2: the block's 32 codes (target "avx2": integer work only, inlines anywhere).
//     static __m256i codes256(const unsigned char* block);
//     // AVX2, for codes q - kOffset256 with q unsigned (0 when the codes are signed as
//     // stored): the unsigned q of the block, which vpmaddubsw takes as they are, the offset
//     // taken off once a row (Q8dotActivations::corrections) instead of the sign trick per
//     // output.
//     static constexpr int kOffset256;
//     static __m256i unsigned256(const unsigned char* block);  // where kOffset256 > 0
//     // AVX-512 (target NUMESH_Q8DOT_AVX512): the weights of blocks t and t + 1 (kHalf: t
//     // alone, in the low half), a row's activation codes prepared once for every output, and
//     // the 16 lanes' isum of the two.
//     template <bool kVnni, bool kHalf> static Q8dotWeights512 weights512(const unsigned char*);
//     template <bool kVnni> static Q8dotRow512 row512(__m512i x);
//     template <bool kVnni> static __m512i isum512(const Q8dotWeights512&, const Q8dotRow512&);
//     // Weights stored in panels (runtime/weight_panels.hpp), with VNNI: group kL's 4 codes of
//     // the 16 outputs as unsigned bytes q + kPanelOffset, from the panel block's codes at
//     // `codes` (the kernel takes kPanelOffset times the activations' group sum off once a row).
//     static constexpr int kPanelOffset;
//     template <int kL> static __m512i panel_codes512(const unsigned char* codes);
//   };
//
// - Super-block formats (q3_k_gemm.cpp ... q6_k_gemm.cpp): blocks of 256 inputs, 8 activation
//   blocks, with a scale per sub-block (exact in f32: block_gemm.hpp); a step takes one
//   super-block.
//
//   struct Codes : KquantFormat<...> {  // declares:
//     static constexpr DType kDType;
//     static constexpr std::int64_t kBlockBytes;
//     static constexpr std::int64_t kBlockElements = 256;
//     static constexpr int kScalesPerBlock;  // sub-block scales per activation block: 1 or 2
//     static constexpr bool kMinimums;       // Q4_K's minimums (the activations' block sums)
//     static constexpr bool kSigned256;      // codes256 gives signed codes (else 0 .. 127)
//     static constexpr int kOffset256;       // KquantFormat's: kOffset where kSigned256, else 0
//     // (and row512 and isum512 below, from the codes' offset); the format defines:
//     // Scalar: the codes (the format's q_w), sub-block scales and negated minimums.
//     static void decode(const unsigned char* block, KquantBlock& out);
//     // AVX2: the sub-block scales and negated minimums (target "avx2,f16c", without fma, so
//     // that the AVX-512 steps, whose target has none, inline it: a call there spilled the
//     // accumulators once a super-block), and block kJ's 32 codes (signed where kSigned256,
//     // for the prefill tile's packer); where kOffset256 > 0 (Q6_K), the dot kernel takes
//     // unsigned256<kJ>'s codes q and the offset off once a row, as the pair formats do.
//     static KquantScales256 scales256(const unsigned char* block);
//     template <int kJ> static __m256i codes256(const unsigned char* block);
//     template <int kJ> static __m256i unsigned256(const unsigned char* block);  // kOffset256 > 0
//     // AVX-512: the 4 pairs of blocks' unsigned codes; row512 and isum512 as for the pair
//     // formats, but on a pair's codes.
//     template <bool kVnni, bool kHalf> static KquantWeights512 weights512(const unsigned char*);
//     template <bool kVnni> static Q8dotRow512 row512(__m512i x);
//     template <bool kVnni> static __m512i isum512(__m512i codes, const Q8dotRow512&);
//   };
//
// Every way of computing isum gives the same exact integers, so the formats may each take the
// cheapest (measured in bench/decode_bench.cpp, BM_Decode_Dot).

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "numesh/core/check.hpp"
#include "numesh/core/dtype.hpp"
#include "numesh/core/error.hpp"
#include "numesh/ops/eigen_views.hpp"
#include "numesh/runtime/cpu_features.hpp"
#include "numesh/runtime/weight_panels.hpp"
#include "stream_ahead.hpp"

namespace numesh::ops::detail {

/// Inputs in a block of the pair formats and in a block of activation codes.
inline constexpr std::int64_t kQ8DotBlock = 32;

/// Activation blocks in a super-block (the K formats: 256 inputs).
inline constexpr std::int64_t kKquantBlocks = 8;

/// True for the super-block formats.
template <class F>
inline constexpr bool kSuperBlocks = F::kBlockElements > kQ8DotBlock;

/// Activation blocks a step of the kernel takes: a pair of blocks, or a super-block.
template <class F>
inline constexpr std::int64_t kStepBlocks = kSuperBlocks<F> ? kKquantBlocks : 2;

/// The f16 scale bits at `at` (no alignment needed).
inline std::uint16_t q8dot_scale_bits(const unsigned char* at) noexcept {
  return static_cast<std::uint16_t>(at[0] | (at[1] << 8));
}

/// A group of rows of activations as quantize_activations_q8 writes them (row r's codes k apart,
/// its scales `blocks` apart), and for formats with minimums each block's scaled sum
/// (q8dot_block_sums, rows `blocks` apart).
struct Q8dotActivations {
  const std::int8_t* codes;
  const float* scales;
  const float* sums;
  std::int64_t blocks;
  /// At the AVX2 level for formats with an offset (kOffset256 > 0: Q4_0, Q5_0, Q3_K, Q6_K): lane l
  /// of block t is -kOffset256 (x[4l] + ... + x[4l + 3]), 8 lanes a block, rows `blocks` * 8 apart
  /// (q8dot_offset_corrections256); null otherwise.
  const std::int32_t* corrections = nullptr;

  [[nodiscard]] const std::int8_t* codes_at(int r, std::int64_t t) const noexcept {
    return codes + (r * blocks + t) * kQ8DotBlock;
  }
  [[nodiscard]] const float* scales_at(int r, std::int64_t t) const noexcept {
    return scales + r * blocks + t;
  }
  /// REQUIRES: sums is not null (formats with minimums; an offset from null is undefined even
  /// unread).
  [[nodiscard]] const float* sums_at(int r, std::int64_t t) const noexcept {
    return sums + r * blocks + t;
  }
  /// REQUIRES: corrections is not null.
  [[nodiscard]] const std::int32_t* corrections_at(int r, std::int64_t t) const noexcept {
    return corrections + (r * blocks + t) * 8;
  }
  /// The same activations from row i on.
  [[nodiscard]] Q8dotActivations from_row(std::int64_t i) const noexcept {
    return {codes + i * blocks * kQ8DotBlock, scales + i * blocks,
            sums != nullptr ? sums + i * blocks : nullptr, blocks,
            corrections != nullptr ? corrections + i * blocks * 8 : nullptr};
  }
};

/// The weights' bytes of activation block t (a step's first) in a row of blocks at `w`.
template <class F>
const unsigned char* q8dot_block_at(const unsigned char* w, std::int64_t t) noexcept {
  return w + t * kQ8DotBlock / F::kBlockElements * F::kBlockBytes;
}

// ---- Q4_K's minimums: the activations' block sums ----------------------------------------------

/// sums[i blocks + t] = d_a[t] * f32(sum of the 32 codes of row i's block t): exact integers
/// (|sum| <= 32 * 127) times the block's scale, one f32 product, the same at every level.
inline void q8dot_block_sums_scalar(std::int64_t count, const std::int8_t* codes,
                                    const float* scales, float* sums) {
  for (std::int64_t t = 0; t < count; ++t) {
    std::int32_t sum = 0;
    for (std::int64_t e = 0; e < kQ8DotBlock; ++e) sum += codes[t * kQ8DotBlock + e];
    sums[t] = scales[t] * static_cast<float>(sum);
  }
}

/// The sums of the 32 codes of 8 consecutive blocks at `codes` (exact int32): vpmaddubsw and
/// vpmaddwd give each block's 8 sums of 4 codes, three rounds of vphaddd and one of the 128-bit
/// halves its total.
__attribute__((target("avx2"))) inline __m256i q8dot_code_sums8(const std::int8_t* codes) {
  const __m256i ones8 = _mm256_set1_epi8(1), ones16 = _mm256_set1_epi16(1);
  __m256i q[kKquantBlocks];
  for (std::int64_t j = 0; j < kKquantBlocks; ++j) {
    const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(codes + j * kQ8DotBlock));
    q[j] = _mm256_madd_epi16(_mm256_maddubs_epi16(ones8, x), ones16);
  }
  const __m256i s0123 =
      _mm256_hadd_epi32(_mm256_hadd_epi32(q[0], q[1]), _mm256_hadd_epi32(q[2], q[3]));
  const __m256i s4567 =
      _mm256_hadd_epi32(_mm256_hadd_epi32(q[4], q[5]), _mm256_hadd_epi32(q[6], q[7]));
  // s0123 holds blocks 0-3's low 16 codes' sums in its low half and their high ones above.
  return _mm256_add_epi32(_mm256_permute2x128_si256(s0123, s4567, 0x20),
                          _mm256_permute2x128_si256(s0123, s4567, 0x31));
}

/// q8dot_block_sums_scalar 8 blocks at a time (count a multiple of 8).
__attribute__((target("avx2"))) inline void q8dot_block_sums256(std::int64_t count,
                                                                const std::int8_t* codes,
                                                                const float* scales, float* sums) {
  for (std::int64_t t = 0; t < count; t += kKquantBlocks) {
    const __m256i total = q8dot_code_sums8(codes + t * kQ8DotBlock);
    _mm256_storeu_ps(sums + t,
                     _mm256_mul_ps(_mm256_loadu_ps(scales + t), _mm256_cvtepi32_ps(total)));
  }
}

/// The scaled block sums of m rows of `blocks` blocks (a multiple of 8), in a buffer of the
/// calling thread kept between calls.
inline const float* q8dot_block_sums(std::int64_t m, std::int64_t blocks, const std::int8_t* codes,
                                     const float* scales, runtime::KernelLevel level) {
  thread_local std::vector<float> sums;
  const auto count = static_cast<std::size_t>(m * blocks);
  if (sums.size() < count) sums.resize(count);
  if (level == runtime::KernelLevel::kScalar) {
    q8dot_block_sums_scalar(m * blocks, codes, scales, sums.data());
  } else {
    q8dot_block_sums256(m * blocks, codes, scales, sums.data());
  }
  return sums.data();
}

// ---- Scalar: the orders written out ------------------------------------------------------------

/// The fold of the header: s[0..15] to one sum.
inline float q8dot_fold(const float* s) noexcept {
  float u[8];
  for (int l = 0; l < 8; ++l) u[l] = s[l] + s[l + 8];
  for (int l = 0; l < 4; ++l) u[l] += u[l + 4];
  for (int l = 0; l < 2; ++l) u[l] += u[l + 2];
  return u[0] + u[1];
}

/// s[(t mod 2) 8 + l] += isum[l] scale[l] for block t's 32 activation codes `x` and weight codes
/// `q`, lane l's scale product `scale(l)`.
template <class Scale>
void q8dot_block_scalar(std::int64_t t, const std::int8_t* x, const std::int8_t* q,
                        const Scale& scale, float* s) {
  for (int l = 0; l < 8; ++l) {
    std::int32_t isum = 0;
    for (int e = 4 * l; e < 4 * l + 4; ++e) isum += std::int32_t{x[e]} * std::int32_t{q[e]};
    float& acc = s[(t % 2) * 8 + l];
    acc = std::fma(static_cast<float>(isum), scale(l), acc);
  }
}

/// A super-block decoded for the scalar level: its 256 weight codes q_w, its sub-block scales
/// d sc (8 or 16, exact in f32) and its negated minimums -dmin m (Q4_K's 8, exact).
struct KquantBlock {
  std::int8_t codes[256];
  float scales[16];
  float minimums[8];
};

/// One output of row `a` (one row): `a.blocks` blocks of activations against the weight row at
/// `w`.
template <class F>
float q8dot_scalar(const Q8dotActivations& a, const unsigned char* w) {
  float s[16] = {};
  if constexpr (kSuperBlocks<F>) {
    for (std::int64_t t0 = 0; t0 < a.blocks; t0 += kKquantBlocks) {
      KquantBlock b;
      F::decode(q8dot_block_at<F>(w, t0), b);
      for (int j = 0; j < kKquantBlocks; ++j) {
        const float d_a = a.scales[t0 + j];
        const float* scales = b.scales + j * F::kScalesPerBlock;
        q8dot_block_scalar(
            t0 + j, a.codes_at(0, t0 + j), b.codes + j * kQ8DotBlock,
            [&](int l) { return d_a * scales[l * F::kScalesPerBlock / 8]; }, s);
      }
      if constexpr (F::kMinimums) {
        for (int l = 0; l < 8; ++l) s[l] = std::fma(a.sums[t0 + l], b.minimums[l], s[l]);
      }
    }
  } else {
    for (std::int64_t t = 0; t < a.blocks; ++t) {
      const unsigned char* block = w + t * F::kBlockBytes;
      std::int8_t q[kQ8DotBlock];
      F::codes(block, q);
      const float scale = a.scales[t] * f32_from_f16(q8dot_scale_bits(block));
      q8dot_block_scalar(
          t, a.codes_at(0, t), q, [&](int) { return scale; }, s);
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

/// The f16 scale at `at` in all 8 lanes: the bits broadcast, then vcvtph2ps (exact, as
/// f32_from_f16), two instructions where a scalar conversion and its broadcast took four.
__attribute__((target("avx2,f16c"))) inline __m256 q8dot_scale256(const unsigned char* at) {
  return _mm256_cvtph_ps(_mm_set1_epi16(static_cast<short>(q8dot_scale_bits(at))));
}

/// How the AVX2 steps give vpmaddubsw its unsigned operand: signed codes by llama.cpp's sign
/// trick, |w| as unsigned bytes (a code of -128 gives 128) times x with w's sign (x within
/// [-127, 127], so the negation is exact); codes never negative (at most 127) as they are; codes
/// q - offset as their unsigned q, the offset then taken off through the row's corrections
/// (Q8dotActivations::corrections here, the prefill tile's Rows::corrections). The same
/// integers every way: the last two spare the sign (and abs) per row and output.
enum class Codes256 { kSigned, kUnsigned, kCorrected };

/// acc += isum scale, int32 lane l of isum the exact sum over the block's inputs 4l .. 4l + 3:
/// vpmaddubsw (int16 pair sums within 2 * 128 * 127 = 32512, no saturation), vpmaddwd with ones,
/// and for kCorrected the lanes' `correction`.
template <Codes256 kCodes>
__attribute__((target("avx2,fma,f16c"))) inline __m256 q8dot_step256(__m256i magnitude, __m256i w,
                                                                     const std::int8_t* x,
                                                                     const std::int32_t* correction,
                                                                     __m256 scale, __m256 acc) {
  const __m256i xv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x));
  const __m256i pairs = kCodes == Codes256::kSigned
                            ? _mm256_maddubs_epi16(magnitude, _mm256_sign_epi8(xv, w))
                            : _mm256_maddubs_epi16(w, xv);
  __m256i isum = _mm256_madd_epi16(pairs, _mm256_set1_epi16(1));
  if constexpr (kCodes == Codes256::kCorrected) {
    isum = _mm256_add_epi32(isum, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(correction)));
  }
  return _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), scale, acc);
}

/// q8dot_step256 for row r's block t, whose scale products are d_a[t] * w_scales (one f32
/// product a lane).
template <Codes256 kCodes>
__attribute__((target("avx2,fma,f16c"))) inline __m256 q8dot_row_step256(__m256i magnitude,
                                                                         __m256i w, __m256 w_scales,
                                                                         const Q8dotActivations& a,
                                                                         int r, std::int64_t t,
                                                                         __m256 acc) {
  const __m256 scale = _mm256_mul_ps(_mm256_broadcast_ss(a.scales_at(r, t)), w_scales);
  const std::int32_t* correction =
      kCodes == Codes256::kCorrected ? a.corrections_at(r, t) : nullptr;
  return q8dot_step256<kCodes>(magnitude, w, a.codes_at(r, t), correction, scale, acc);
}

/// Block t's weight codes `w` (their lanes' scales `w_scales`) for R rows of activations:
/// accumulators by reference (named variables, not arrays: gcc 12 keeps arrays of vectors in
/// memory).
template <Codes256 kCodes, int R>
__attribute__((target("avx2,fma,f16c"))) inline void q8dot_block256(__m256i w, __m256 w_scales,
                                                                    std::int64_t t,
                                                                    const Q8dotActivations& a,
                                                                    __m256& r0, __m256& r1,
                                                                    __m256& r2, __m256& r3) {
  const __m256i magnitude = kCodes == Codes256::kSigned ? _mm256_abs_epi8(w) : w;
  r0 = q8dot_row_step256<kCodes>(magnitude, w, w_scales, a, 0, t, r0);
  if constexpr (R > 1) r1 = q8dot_row_step256<kCodes>(magnitude, w, w_scales, a, 1, t, r1);
  if constexpr (R > 2) r2 = q8dot_row_step256<kCodes>(magnitude, w, w_scales, a, 2, t, r2);
  if constexpr (R > 3) r3 = q8dot_row_step256<kCodes>(magnitude, w, w_scales, a, 3, t, r3);
}

/// -kOffset (x[4l] + ... + x[4l + 3]) for the 8 lanes of each of `count` blocks of codes (32
/// apart) into out (8 a block): Q8dotActivations::corrections.
template <int kOffset>
__attribute__((target("avx2"))) inline void q8dot_offset_corrections256(std::int64_t count,
                                                                        const std::int8_t* codes,
                                                                        std::int32_t* out) {
  const __m256i offsets = _mm256_set1_epi8(static_cast<char>(kOffset));
  for (std::int64_t t = 0; t < count; ++t) {
    const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(codes + t * kQ8DotBlock));
    const __m256i sum = _mm256_madd_epi16(_mm256_maddubs_epi16(offsets, x), _mm256_set1_epi16(1));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + t * 8),
                        _mm256_sub_epi32(_mm256_setzero_si256(), sum));
  }
}

/// A super-block's sub-block scales d sc for AVX2 (sub-blocks 0-7 in `low`, 8-15 in `high`) and
/// Q4_K's negated minimums -dmin m.
struct KquantScales256 {
  __m256 low;
  __m256 high;
  __m256 minimums;
};

/// The sixteen sub-block scales d s_g of a format without minimums from their codes s_g as
/// signed bytes and d's f16 bits (Q6_K's int8 codes, Q3_K's 6-bit ones less 32): an f16 times a
/// small integer, exact in f32. Target "avx2,f16c" without fma, as the formats' scales256.
__attribute__((target("avx2,f16c"))) inline KquantScales256 kquant_byte_scales256(
    __m128i codes, std::uint16_t d_bits) {
  const __m256 d = _mm256_set1_ps(_cvtsh_ss(d_bits));
  return {_mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(codes)), d),
          _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(codes, 8))), d),
          _mm256_setzero_ps()};
}

/// Block kJ's lane scales: lane l takes the scale of the sub-block holding inputs 4l .. 4l + 3.
template <int kScalesPerBlock, int kJ>
__attribute__((target("avx2,fma,f16c"))) inline __m256 kq_lane_scales256(const KquantScales256& s) {
  if constexpr (kScalesPerBlock == 1) {
    return _mm256_permutevar8x32_ps(s.low, _mm256_set1_epi32(kJ));
  } else {
    constexpr int g = 2 * kJ % 8;
    return _mm256_permutevar8x32_ps(kJ < 4 ? s.low : s.high,
                                    _mm256_setr_epi32(g, g, g, g, g + 1, g + 1, g + 1, g + 1));
  }
}

/// Block kJ's codes as the AVX2 dot kernel takes them: unsigned256 where the format has an
/// offset (kOffset256 > 0), else codes256.
template <class F, int kJ>
__attribute__((target("avx2"))) inline __m256i kq_codes256(const unsigned char* block) {
  if constexpr (F::kOffset256 > 0) {
    return F::template unsigned256<kJ>(block);
  } else {
    return F::template codes256<kJ>(block);
  }
}

/// Blocks kJ and kJ + 1 of the super-block whose first block is t0 (at `block`).
template <class F, int R, int kJ>
__attribute__((target("avx2,fma,f16c"))) inline void kq_pair256(
    std::int64_t t0, const unsigned char* block, const KquantScales256& s,
    const Q8dotActivations& a, __m256& e0, __m256& e1, __m256& e2, __m256& e3, __m256& o0,
    __m256& o1, __m256& o2, __m256& o3) {
  // Q6_K's codes q - 32 as their q, corrected; Q4_K's nibbles as they are.
  constexpr Codes256 kCodes = F::kOffset256 > 0 ? Codes256::kCorrected
                              : F::kSigned256   ? Codes256::kSigned
                                                : Codes256::kUnsigned;
  q8dot_block256<kCodes, R>(kq_codes256<F, kJ>(block), kq_lane_scales256<F::kScalesPerBlock, kJ>(s),
                            t0 + kJ, a, e0, e1, e2, e3);
  q8dot_block256<kCodes, R>(kq_codes256<F, kJ + 1>(block),
                            kq_lane_scales256<F::kScalesPerBlock, kJ + 1>(s), t0 + kJ + 1, a, o0,
                            o1, o2, o3);
}

/// Block t of a pair format's row of blocks at `w`.
template <class F, int R>
__attribute__((target("avx2,fma,f16c"))) inline void q8dot_pair_block256(std::int64_t t,
                                                                         const Q8dotActivations& a,
                                                                         const unsigned char* w,
                                                                         __m256& r0, __m256& r1,
                                                                         __m256& r2, __m256& r3) {
  const unsigned char* block = w + t * F::kBlockBytes;
  const __m256 d_w = q8dot_scale256(block);
  if constexpr (F::kOffset256 > 0) {
    q8dot_block256<Codes256::kCorrected, R>(F::unsigned256(block), d_w, t, a, r0, r1, r2, r3);
  } else {
    q8dot_block256<Codes256::kSigned, R>(F::codes256(block), d_w, t, a, r0, r1, r2, r3);
  }
}

/// c[r][0] for R rows (c's rows `ldc` apart) of one output whose row of blocks is at `w`.
template <class F, int R>
__attribute__((target("avx2,fma,f16c"))) void q8dot_tile256(const Q8dotActivations& a,
                                                            const unsigned char* w, float* c,
                                                            std::int64_t ldc) {
  __m256 e0 = _mm256_setzero_ps(), e1 = e0, e2 = e0, e3 = e0, o0 = e0, o1 = e0, o2 = e0, o3 = e0;
  if constexpr (kSuperBlocks<F>) {
    for (std::int64_t t0 = 0; t0 < a.blocks; t0 += kKquantBlocks) {
      const unsigned char* block = q8dot_block_at<F>(w, t0);
      const KquantScales256 s = F::scales256(block);
      kq_pair256<F, R, 0>(t0, block, s, a, e0, e1, e2, e3, o0, o1, o2, o3);
      kq_pair256<F, R, 2>(t0, block, s, a, e0, e1, e2, e3, o0, o1, o2, o3);
      kq_pair256<F, R, 4>(t0, block, s, a, e0, e1, e2, e3, o0, o1, o2, o3);
      kq_pair256<F, R, 6>(t0, block, s, a, e0, e1, e2, e3, o0, o1, o2, o3);
      if constexpr (F::kMinimums) {
        // The minimums join the even lanes once the super-block's blocks are in.
        e0 = _mm256_fmadd_ps(_mm256_loadu_ps(a.sums_at(0, t0)), s.minimums, e0);
        if constexpr (R > 1)
          e1 = _mm256_fmadd_ps(_mm256_loadu_ps(a.sums_at(1, t0)), s.minimums, e1);
        if constexpr (R > 2)
          e2 = _mm256_fmadd_ps(_mm256_loadu_ps(a.sums_at(2, t0)), s.minimums, e2);
        if constexpr (R > 3)
          e3 = _mm256_fmadd_ps(_mm256_loadu_ps(a.sums_at(3, t0)), s.minimums, e3);
      }
    }
  } else {
    std::int64_t t = 0;
    for (; t + 2 <= a.blocks; t += 2) {
      stream_ahead(q8dot_block_at<F>(w, t));
      q8dot_pair_block256<F, R>(t, a, w, e0, e1, e2, e3);
      q8dot_pair_block256<F, R>(t + 1, a, w, o0, o1, o2, o3);
    }
    if (t < a.blocks) q8dot_pair_block256<F, R>(t, a, w, e0, e1, e2, e3);
  }
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

/// The codes of the 16 bytes of nibbles at `qs`, as Q4_0 and Q5_0 keep them (byte j: element j
/// in its low nibble, j + 16 in its high one), as 32 bytes 0 .. 15 in element order. The 16 bytes
/// go to both halves in one load; the high half's dwords shift down a nibble (each byte's high
/// nibble down, the next byte's low one above it, which the mask drops): three instructions
/// where a load, a shift of a copy and an insert took four.
__attribute__((target("avx2"))) inline __m256i q8dot_nibbles256(const unsigned char* qs) {
  const __m256i both =
      _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(qs)));
  const __m256i down = _mm256_srlv_epi32(both, _mm256_setr_epi32(0, 0, 0, 0, 4, 4, 4, 4));
  return _mm256_and_si256(down, _mm256_set1_epi8(0x0F));
}

/// q8dot_nibbles256 of two blocks' nibbles at `qs` and `next_qs`, the first's 32 codes in bytes
/// 0-31 and the second's in 32-63 (kHalf: the first's alone, the rest zero): the two 16-byte runs
/// unpacked together (128-bit lanes [t, t, t + 1, t + 1], the second and fourth shifted down a
/// nibble).
template <bool kHalf>
NUMESH_Q8DOT_AVX512 inline __m512i q8dot_nibbles512(const unsigned char* qs,
                                                    const unsigned char* next_qs) {
  if constexpr (kHalf) {
    return _mm512_zextsi256_si512(q8dot_nibbles256(qs));
  } else {
    const __m256i pair = _mm256_inserti128_si256(
        _mm256_castsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(qs))),
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(next_qs)), 1);
    const __m512i wide = _mm512_castsi256_si512(pair);
    const __m512i lanes = _mm512_shuffle_i64x2(wide, wide, _MM_SHUFFLE(1, 1, 0, 0));
    return _mm512_and_si512(_mm512_mask_srli_epi16(lanes, 0xFF00FF00u, lanes, 4),
                            _mm512_set1_epi8(0x0F));
  }
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

/// For formats whose codes are q - kOffset with q unsigned (vpmaddubsw's and vpdpbusd's
/// unsigned operand: Q4_0's nibbles, kOffset 8; Q6_K's 6 bits, 32; Q4_K's nibbles, 0; with VNNI,
/// IQ4_NL's codebook values plus 128): the row as it is, and the kOffset taken off once per row,
/// correction = -kOffset (x0 + x1 + x2 + x3) per lane, shared by every output. Without VNNI
/// vpmaddubsw's int16 pair sums must stay within 32767: q at most 128 (2 * 128 * 127).
template <int kOffset, bool kVnni>
NUMESH_Q8DOT_AVX512 inline Q8dotRow512 q8dot_offset_row512(__m512i x) {
  if constexpr (kOffset == 0) {
    return {x, _mm512_setzero_si512()};
  } else {
    const __m512i offsets = _mm512_set1_epi8(static_cast<char>(kOffset));
    __m512i sum;  // kOffset (x0 + x1 + x2 + x3) per lane
    if constexpr (kVnni) {
      sum = _mm512_dpbusd_epi32(_mm512_setzero_si512(), offsets, x);
    } else {
      sum = _mm512_madd_epi16(_mm512_maddubs_epi16(offsets, x), _mm512_set1_epi16(1));
    }
    return {x, _mm512_sub_epi32(_mm512_setzero_si512(), sum)};
  }
}

/// isum = sum q x + correction per lane, for q8dot_offset_row512's rows.
template <int kOffset, bool kVnni>
NUMESH_Q8DOT_AVX512 inline __m512i q8dot_offset_isum512(__m512i q, const Q8dotRow512& row) {
  if constexpr (kVnni) return _mm512_dpbusd_epi32(row.correction, q, row.x);
  const __m512i sum = _mm512_madd_epi16(_mm512_maddubs_epi16(q, row.x), _mm512_set1_epi16(1));
  if constexpr (kOffset == 0) return sum;
  return _mm512_add_epi32(sum, row.correction);
}

/// For formats whose codes are signed bytes as they are (Q8_0's, and IQ4_NL's codebook values):
/// below VNNI, llama.cpp's sign trick, |w| as unsigned bytes (-128 gives 128) times x given w's
/// sign (a masked negation), vpmaddubsw's int16 pair sums within 2 * 128 * 127 = 32512, then
/// vpmaddwd with ones. With VNNI, the bias trick instead: x + 128 (x ^ 0x80) is an unsigned byte,
/// so one vpdpbusd takes (x + 128) w, starting from -128 (w0 + w1 + w2 + w3), which the weights
/// give once for every row. Exact either way (a lane's sums stay within 4 * 255 * 128). The bias
/// trick has no negation per row and output: 1.05x the sign trick's speed at m = 1, 1.12x at
/// m = 8 (a throwaway A/B program on BM_Decode_Dot's [4096, 1024] weights, runs interleaved).
/// The weights `w` of one output's two blocks (or one: kHalf) with their scales `d_w`.
template <bool kVnni>
NUMESH_Q8DOT_AVX512 inline Q8dotWeights512 q8dot_signed_weights512(__m512i w, __m128 d_w) {
  if constexpr (kVnni) {
    const __m512i bias =
        _mm512_dpbusd_epi32(_mm512_setzero_si512(), _mm512_set1_epi8(static_cast<char>(0x80)), w);
    return {w, _mm512_sub_epi32(_mm512_setzero_si512(), bias), 0, d_w};
  } else {
    return {w, _mm512_abs_epi8(w), _mm512_movepi8_mask(w), d_w};
  }
}

/// A row of activation codes for q8dot_signed_weights512's weights.
template <bool kVnni>
NUMESH_Q8DOT_AVX512 inline Q8dotRow512 q8dot_signed_row512(__m512i x) {
  if constexpr (kVnni) {
    return {_mm512_xor_si512(x, _mm512_set1_epi8(static_cast<char>(0x80))), _mm512_setzero_si512()};
  } else {
    return {x, _mm512_setzero_si512()};
  }
}

/// isum = sum w x per lane, for q8dot_signed_weights512's weights and q8dot_signed_row512's rows.
template <bool kVnni>
NUMESH_Q8DOT_AVX512 inline __m512i q8dot_signed_isum512(const Q8dotWeights512& w,
                                                        const Q8dotRow512& row) {
  if constexpr (kVnni) {
    return _mm512_dpbusd_epi32(w.aux, row.x, w.w);
  } else {
    const __m512i signed_x = _mm512_mask_sub_epi8(row.x, w.negative, _mm512_setzero_si512(), row.x);
    return _mm512_madd_epi16(_mm512_maddubs_epi16(w.aux, signed_x), _mm512_set1_epi16(1));
  }
}

/// What a super-block format declares (q8_dot_common.hpp's top comment), and its AVX-512 row and
/// isum for codes q - kOffset given unsigned (q8dot_offset_row512).
template <DType kType, std::int64_t kBytes, int kScales, bool kHasMinimums, bool kSigned,
          int kOffset>
struct KquantFormat {
  static constexpr DType kDType = kType;
  static constexpr std::int64_t kBlockBytes = kBytes;
  static constexpr std::int64_t kBlockElements = kKquantBlocks * kQ8DotBlock;
  static constexpr int kScalesPerBlock = kScales;
  static constexpr bool kMinimums = kHasMinimums;
  static constexpr bool kSigned256 = kSigned;
  /// Signed codes with an offset (Q6_K's q - 32) go to the AVX2 kernel unsigned
  /// (unsigned256<kJ>), the offset taken off once a row: Q8dotActivations::corrections.
  static constexpr int kOffset256 = kSigned ? kOffset : 0;

  template <bool kVnni>
  NUMESH_Q8DOT_AVX512 static Q8dotRow512 row512(__m512i x) {
    return q8dot_offset_row512<kOffset, kVnni>(x);
  }

  template <bool kVnni>
  NUMESH_Q8DOT_AVX512 static __m512i isum512(__m512i codes, const Q8dotRow512& row) {
    return q8dot_offset_isum512<kOffset, kVnni>(codes, row);
  }
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

/// A pair format's row over two blocks (kHalf: the last, odd block) for J outputs: its
/// activation codes at `x` and scales at `d`, loaded and prepared once for the J outputs.
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

/// One output's super-block as the AVX-512 step reads it: the unsigned codes of its 4 pairs of
/// blocks (pair c: blocks 2c and 2c + 1 in the low and high halves), its sub-block scales d sc
/// (lanes 0-7 for one a block, 0-15 for two) and Q4_K's negated minimums -dmin m. Named
/// members, not an array (gcc 12 keeps arrays of vectors in memory).
struct KquantWeights512 {
  __m512i c0;
  __m512i c1;
  __m512i c2;
  __m512i c3;
  __m512 scales;
  __m256 minimums;
};

/// kquant_byte_scales256's sixteen scales in one register, for KquantWeights512::scales.
NUMESH_Q8DOT_AVX512 inline __m512 kquant_byte_scales512(__m128i codes, std::uint16_t d_bits) {
  return _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(codes)),
                       _mm512_set1_ps(_cvtsh_ss(d_bits)));
}

template <int kC>
NUMESH_Q8DOT_AVX512 inline __m512i kq_pair_codes(const KquantWeights512& w) {
  if constexpr (kC == 0) {
    return w.c0;
  } else if constexpr (kC == 1) {
    return w.c1;
  } else if constexpr (kC == 2) {
    return w.c2;
  } else {
    return w.c3;
  }
}

/// Lane L of pair kC's 16 takes scale product ((2 kC + L / 8) S + (L mod 8) S / 8), S the
/// format's scales per block: the sub-block of the inputs it sums.
template <int kScalesPerBlock, int kC>
NUMESH_Q8DOT_AVX512 inline __m512i kq_pair_lanes() {
  constexpr auto lane = [](int l) {
    return (2 * kC + l / 8) * kScalesPerBlock + l % 8 * kScalesPerBlock / 8;
  };
  return _mm512_set_epi32(lane(15), lane(14), lane(13), lane(12), lane(11), lane(10), lane(9),
                          lane(8), lane(7), lane(6), lane(5), lane(4), lane(3), lane(2), lane(1),
                          lane(0));
}

/// Pair kC of a row's super-block for J outputs: its activation codes loaded and prepared once,
/// the scale products `s0`, `s1` (an output's, every sub-block's) spread over the lanes.
template <class F, bool kVnni, int kC, int J>
NUMESH_Q8DOT_AVX512 inline void kq_pair512(const std::int8_t* x, const KquantWeights512& w0,
                                           const KquantWeights512& w1, __m512 s0, __m512 s1,
                                           __m512& p, __m512& q) {
  const Q8dotRow512 row = F::template row512<kVnni>(_mm512_loadu_si512(x + 2 * kC * kQ8DotBlock));
  const __m512i lanes = kq_pair_lanes<F::kScalesPerBlock, kC>();
  p = _mm512_fmadd_ps(_mm512_cvtepi32_ps(F::template isum512<kVnni>(kq_pair_codes<kC>(w0), row)),
                      _mm512_permutexvar_ps(lanes, s0), p);
  if constexpr (J > 1) {
    q = _mm512_fmadd_ps(_mm512_cvtepi32_ps(F::template isum512<kVnni>(kq_pair_codes<kC>(w1), row)),
                        _mm512_permutexvar_ps(lanes, s1), q);
  }
}

/// A super-block format's row over one super-block for J outputs: its 8 activation scales at `d`
/// (each repeated for its two sub-blocks when S is 2) times every output's sub-block scales in
/// one product, then the 4 pairs, then Q4_K's minimums on lanes 0-7.
template <class F, bool kVnni, int J>
NUMESH_Q8DOT_AVX512 inline void kq_row512(const std::int8_t* x, const float* d, const float* sums,
                                          const KquantWeights512& w0, const KquantWeights512& w1,
                                          __m512& p, __m512& q) {
  const __m256 d8 = _mm256_loadu_ps(d);
  __m512 d_a;
  if constexpr (F::kScalesPerBlock == 1) {
    d_a = _mm512_zextps256_ps512(d8);
  } else {
    d_a = _mm512_permutexvar_ps(_mm512_set_epi32(7, 7, 6, 6, 5, 5, 4, 4, 3, 3, 2, 2, 1, 1, 0, 0),
                                _mm512_castps256_ps512(d8));
  }
  const __m512 s0 = _mm512_mul_ps(d_a, w0.scales);
  const __m512 s1 = J > 1 ? _mm512_mul_ps(d_a, w1.scales) : s0;
  kq_pair512<F, kVnni, 0, J>(x, w0, w1, s0, s1, p, q);
  kq_pair512<F, kVnni, 1, J>(x, w0, w1, s0, s1, p, q);
  kq_pair512<F, kVnni, 2, J>(x, w0, w1, s0, s1, p, q);
  kq_pair512<F, kVnni, 3, J>(x, w0, w1, s0, s1, p, q);
  if constexpr (F::kMinimums) {
    const __m512 sum = _mm512_castps256_ps512(_mm256_loadu_ps(sums));
    p = _mm512_mask3_fmadd_ps(sum, _mm512_castps256_ps512(w0.minimums), p, 0x00FF);
    if constexpr (J > 1) {
      q = _mm512_mask3_fmadd_ps(sum, _mm512_castps256_ps512(w1.minimums), q, 0x00FF);
    }
  }
}

/// Row r of a step at block t, for either kind of format.
template <class F, bool kVnni, bool kHalf, int J, class W>
NUMESH_Q8DOT_AVX512 inline void q8dot_step_row512(const Q8dotActivations& a, int r, std::int64_t t,
                                                  const W& w0, const W& w1, __m512& p, __m512& q) {
  if constexpr (kSuperBlocks<F>) {
    const float* sums = nullptr;  // formats without minimums have none
    if constexpr (F::kMinimums) sums = a.sums_at(r, t);
    kq_row512<F, kVnni, J>(a.codes_at(r, t), a.scales_at(r, t), sums, w0, w1, p, q);
  } else {
    q8dot_row512<F, kVnni, kHalf, J>(a.codes_at(r, t), a.scales_at(r, t), w0, w1, p, q);
  }
}

/// The step at block t (kHalf: block t alone) of J outputs (rows `ldw` bytes apart from `w`) for
/// R rows of activations: accumulators p* for the first output, q* for the second.
template <class F, bool kVnni, bool kHalf, int R, int J>
NUMESH_Q8DOT_AVX512 inline void q8dot_rows512(std::int64_t t, const Q8dotActivations& a,
                                              const unsigned char* w, std::int64_t ldw, __m512& p0,
                                              __m512& p1, __m512& p2, __m512& p3, __m512& q0,
                                              __m512& q1, __m512& q2, __m512& q3) {
  const unsigned char* block = q8dot_block_at<F>(w, t);
  // The bytes this step reads (68 of q8_0, 36 of q4_0, 144 of q4_k, 210 of q6_k).
  constexpr std::int64_t kStepBytes =
      kStepBlocks<F> * kQ8DotBlock / F::kBlockElements * F::kBlockBytes;
  if constexpr (!kHalf && J > 1) {
    // The next J outputs' weights at the same place: a tile of 4 rows computes long enough
    // between its loads that, with the weights in memory, the hardware prefetcher alone fell
    // behind. 1.2-1.5x at m = 8 on [4096, 8192], no change on [4096, 1024] (in L3). An address,
    // never read: past the last output it is only a prefetch hint.
    const auto* next =
        reinterpret_cast<const char*>(reinterpret_cast<std::uintptr_t>(block) + J * ldw);
    for (std::int64_t at = 0; at < std::max<std::int64_t>(kStepBytes, 65); at += 64) {
      _mm_prefetch(next + at, _MM_HINT_T0);
      _mm_prefetch(next + ldw + at, _MM_HINT_T0);
    }
  } else if constexpr (!kHalf) {
    // One output: the stream a few KiB on (stream_ahead.hpp). The super-block formats asked for
    // the next output's same block before (q4_k 17.3 -> 19.2 GB/s, q6_k 22.0 -> 24.2 at m = 1
    // on [4096, 8192] on Zen 4), which at k = 768 is only 432 bytes ahead.
    // A pair format's step (68 or 36 bytes) asks for one line: two for q8_0's 68 measured
    // slower (133-167 -> 124-144 tokens/s, three alternated rounds).
    stream_ahead(block, kSuperBlocks<F> ? kStepBytes : 64);
  }
  const auto w0 = F::template weights512<kVnni, kHalf>(block);
  auto w1 = w0;
  if constexpr (J > 1) w1 = F::template weights512<kVnni, kHalf>(block + ldw);
  q8dot_step_row512<F, kVnni, kHalf, J>(a, 0, t, w0, w1, p0, q0);
  if constexpr (R > 1) q8dot_step_row512<F, kVnni, kHalf, J>(a, 1, t, w0, w1, p1, q1);
  if constexpr (R > 2) q8dot_step_row512<F, kVnni, kHalf, J>(a, 2, t, w0, w1, p2, q2);
  if constexpr (R > 3) q8dot_step_row512<F, kVnni, kHalf, J>(a, 3, t, w0, w1, p3, q3);
}

/// c[r][0 .. J) for R rows of activations (c's rows `ldc` apart) and J outputs whose rows of
/// blocks lie `ldw` bytes apart from `w`: each weight load serves R rows, each activation load J
/// outputs.
template <class F, bool kVnni, int R, int J>
NUMESH_Q8DOT_AVX512 void q8dot_tile512(const Q8dotActivations& a, const unsigned char* w,
                                       std::int64_t ldw, float* c, std::int64_t ldc) {
  __m512 p0 = _mm512_setzero_ps(), p1 = p0, p2 = p0, p3 = p0, q0 = p0, q1 = p0, q2 = p0, q3 = p0;
  std::int64_t t = 0;
  for (; t + kStepBlocks<F> <= a.blocks; t += kStepBlocks<F>) {
    q8dot_rows512<F, kVnni, false, R, J>(t, a, w, ldw, p0, p1, p2, p3, q0, q1, q2, q3);
  }
  if constexpr (!kSuperBlocks<F>) {  // super-block rows are whole steps
    if (t < a.blocks) {
      q8dot_rows512<F, kVnni, true, R, J>(t, a, w, ldw, p0, p1, p2, p3, q0, q1, q2, q3);
    }
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

// ---- AVX-512 VNNI over panels: 16 outputs a register ------------------------------------------

/// A row's groups' corrections for the panel kernel: -kOffset (x0 + x1 + x2 + x3) for each group
/// of 4 of its `blocks` blocks' codes (8 groups a block) into out[0 .. 8 blocks), which has room
/// for 8 more (an odd last block is stored as a pair).
template <int kOffset>
NUMESH_Q8DOT_AVX512 inline void q8dot_panel_corrections(const std::int8_t* codes,
                                                        std::int64_t blocks, std::int32_t* out) {
  const __m512i offsets = _mm512_set1_epi8(static_cast<char>(kOffset));
  for (std::int64_t t = 0; t < blocks; t += 2) {
    const __m512i x = t + 2 <= blocks
                          ? _mm512_loadu_si512(codes + t * kQ8DotBlock)
                          : _mm512_zextsi256_si512(_mm256_loadu_si256(
                                reinterpret_cast<const __m256i*>(codes + t * kQ8DotBlock)));
    const __m512i sum = _mm512_dpbusd_epi32(_mm512_setzero_si512(), offsets, x);
    _mm512_storeu_si512(out + t * 8, _mm512_sub_epi32(_mm512_setzero_si512(), sum));
  }
}

/// acc += f32(isum) scale for group kL of a panel block: isum the 16 outputs' exact sums over the
/// group's 4 inputs (the correction taking the codes' offset off), lane o output o's.
template <class F, int kL>
NUMESH_Q8DOT_AVX512 inline void q8dot_panel_group(const unsigned char* codes,
                                                  const std::int32_t* x4,
                                                  const std::int32_t* corrections, __m512 scale,
                                                  __m512& acc) {
  const __m512i isum =
      _mm512_dpbusd_epi32(_mm512_set1_epi32(corrections[kL]), F::template panel_codes512<kL>(codes),
                          _mm512_set1_epi32(x4[kL]));
  acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), scale, acc);
}

/// Block t of a panel (at `block`) into the 8 accumulators of its parity: the scalar order's
/// s[(t mod 2) 8 + l] for 16 outputs at once, l = 0 .. 7.
template <class F>
NUMESH_Q8DOT_AVX512 inline void q8dot_panel_block(const unsigned char* block, float d_a,
                                                  const std::int8_t* x,
                                                  const std::int32_t* corrections, __m512& s0,
                                                  __m512& s1, __m512& s2, __m512& s3, __m512& s4,
                                                  __m512& s5, __m512& s6, __m512& s7) {
  // d_a d_w per output, as the scalar order's one f32 product.
  const __m512 scale =
      _mm512_mul_ps(_mm512_set1_ps(d_a),
                    _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(block))));
  const unsigned char* codes = block + runtime::kPanelWidth * 2;
  std::int32_t x4[8];
  std::memcpy(x4, x, sizeof x4);
  q8dot_panel_group<F, 0>(codes, x4, corrections, scale, s0);
  q8dot_panel_group<F, 1>(codes, x4, corrections, scale, s1);
  q8dot_panel_group<F, 2>(codes, x4, corrections, scale, s2);
  q8dot_panel_group<F, 3>(codes, x4, corrections, scale, s3);
  q8dot_panel_group<F, 4>(codes, x4, corrections, scale, s4);
  q8dot_panel_group<F, 5>(codes, x4, corrections, scale, s5);
  q8dot_panel_group<F, 6>(codes, x4, corrections, scale, s6);
  q8dot_panel_group<F, 7>(codes, x4, corrections, scale, s7);
}

/// c[0 .. 16) for one row of activations (codes `x`, scales `d`, `blocks` blocks, corrections from
/// q8dot_panel_corrections) against the panel at `panel`: the scalar order for each output (block
/// t into s[(t mod 2) 8 + l], then q8dot_fold), so the same bits as every other level.
template <class F>
NUMESH_Q8DOT_AVX512 void q8dot_panel512(const std::int8_t* x, const float* d,
                                        const std::int32_t* corrections, std::int64_t blocks,
                                        const unsigned char* panel, float* c) {
  constexpr std::int64_t kBlockBytes = runtime::kPanelWidth * F::kBlockBytes;
  __m512 s0 = _mm512_setzero_ps(), s1 = s0, s2 = s0, s3 = s0, s4 = s0, s5 = s0, s6 = s0, s7 = s0,
         s8 = s0, s9 = s0, s10 = s0, s11 = s0, s12 = s0, s13 = s0, s14 = s0, s15 = s0;
  std::int64_t t = 0;
  for (; t + 2 <= blocks; t += 2) {
    const unsigned char* block = panel + t * kBlockBytes;
    stream_ahead(block, 2 * kBlockBytes);
    q8dot_panel_block<F>(block, d[t], x + t * kQ8DotBlock, corrections + t * 8, s0, s1, s2, s3, s4,
                         s5, s6, s7);
    q8dot_panel_block<F>(block + kBlockBytes, d[t + 1], x + (t + 1) * kQ8DotBlock,
                         corrections + (t + 1) * 8, s8, s9, s10, s11, s12, s13, s14, s15);
  }
  if (t < blocks) {
    q8dot_panel_block<F>(panel + t * kBlockBytes, d[t], x + t * kQ8DotBlock, corrections + t * 8,
                         s0, s1, s2, s3, s4, s5, s6, s7);
  }
  // q8dot_fold's order, 16 outputs at once: u[l] = s[l] + s[l + 8], u[l] += u[l + 4],
  // u[l] += u[l + 2], u[0] + u[1].
  s0 = _mm512_add_ps(s0, s8);
  s1 = _mm512_add_ps(s1, s9);
  s2 = _mm512_add_ps(s2, s10);
  s3 = _mm512_add_ps(s3, s11);
  s4 = _mm512_add_ps(s4, s12);
  s5 = _mm512_add_ps(s5, s13);
  s6 = _mm512_add_ps(s6, s14);
  s7 = _mm512_add_ps(s7, s15);
  s0 = _mm512_add_ps(s0, s4);
  s1 = _mm512_add_ps(s1, s5);
  s2 = _mm512_add_ps(s2, s6);
  s3 = _mm512_add_ps(s3, s7);
  s0 = _mm512_add_ps(s0, s2);
  s1 = _mm512_add_ps(s1, s3);
  _mm512_storeu_ps(c, _mm512_add_ps(s0, s1));
}

/// The panels of outputs [0, np) for m rows: each panel read from memory once, then from cache
/// by the other rows (a panel of k = 4096 inputs is 68 KiB of Q8_0).
template <class F>
void q8dot_panels512(std::int64_t m, const Q8dotActivations& a, const unsigned char* w,
                     std::int64_t np, float* c, std::int64_t ldc) {
  const std::int64_t panel_bytes = runtime::kPanelWidth * a.blocks * F::kBlockBytes;
  thread_local std::vector<std::int32_t> corrections;
  corrections.resize(static_cast<std::size_t>(m * a.blocks * 8 + 8));
  for (std::int64_t i = 0; i < m; ++i) {
    q8dot_panel_corrections<F::kPanelOffset>(a.codes + i * a.blocks * kQ8DotBlock, a.blocks,
                                             corrections.data() + i * a.blocks * 8);
  }
  for (std::int64_t j = 0; j < np; j += runtime::kPanelWidth) {
    for (std::int64_t i = 0; i < m; ++i) {
      q8dot_panel512<F>(a.codes + i * a.blocks * kQ8DotBlock, a.scales + i * a.blocks,
                        corrections.data() + i * a.blocks * 8, a.blocks,
                        w + j / runtime::kPanelWidth * panel_bytes, c + i * ldc + j);
    }
  }
}

// ---- Dispatch ----------------------------------------------------------------------------------

/// Rows of activations a kernel call takes at once: each weight block, once loaded, serves
/// them all.
inline constexpr std::int64_t kQ8DotRows = 4;

/// The AVX-512 tiles for `rows` (1 .. kQ8DotRows) rows and `outputs` (1 or 2) outputs.
template <class F, bool kVnni>
void q8dot_tile512_any(std::int64_t rows, std::int64_t outputs, const Q8dotActivations& a,
                       const unsigned char* w, std::int64_t ldw, float* c, std::int64_t ldc) {
  const bool two = outputs == 2;
  switch (rows) {
    case 1:
      return two ? q8dot_tile512<F, kVnni, 1, 2>(a, w, ldw, c, ldc)
                 : q8dot_tile512<F, kVnni, 1, 1>(a, w, ldw, c, ldc);
    case 2:
      return two ? q8dot_tile512<F, kVnni, 2, 2>(a, w, ldw, c, ldc)
                 : q8dot_tile512<F, kVnni, 2, 1>(a, w, ldw, c, ldc);
    case 3:
      return two ? q8dot_tile512<F, kVnni, 3, 2>(a, w, ldw, c, ldc)
                 : q8dot_tile512<F, kVnni, 3, 1>(a, w, ldw, c, ldc);
    default:
      return two ? q8dot_tile512<F, kVnni, 4, 2>(a, w, ldw, c, ldc)
                 : q8dot_tile512<F, kVnni, 4, 1>(a, w, ldw, c, ldc);
  }
}

/// The AVX2 tiles for `rows` (1 .. kQ8DotRows) rows of one output.
template <class F>
void q8dot_tile256_any(std::int64_t rows, const Q8dotActivations& a, const unsigned char* w,
                       float* c, std::int64_t ldc) {
  switch (rows) {
    case 1:
      return q8dot_tile256<F, 1>(a, w, c, ldc);
    case 2:
      return q8dot_tile256<F, 2>(a, w, c, ldc);
    case 3:
      return q8dot_tile256<F, 3>(a, w, c, ldc);
    default:
      return q8dot_tile256<F, 4>(a, w, c, ldc);
  }
}

/// The level's kernel for m rows against n outputs stored as rows of blocks (`ldw` bytes apart
/// from `w`), into c (rows `ldc` apart).
template <class F>
void q8dot_gemm_rows(std::int64_t m, const Q8dotActivations& all, const unsigned char* w,
                     std::int64_t ldw, std::int64_t n, float* c, std::int64_t ldc,
                     runtime::KernelLevel level) {
  using runtime::KernelLevel;
  // Outputs outermost: a pair of outputs' weights (2 k / 32 blocks, 8.5 KiB of q8_0 at
  // k = 4096) stay in cache while every group of rows reads them, so the weights come from
  // memory once whatever m is.
  switch (level) {
    case KernelLevel::kAvx512:
    case KernelLevel::kAvx512Bf16:
    case KernelLevel::kAmx: {
      const bool vnni = level >= KernelLevel::kAvx512Bf16;
      // Two outputs a tile only for groups of 4 rows (an activation load then serves both):
      // with fewer rows the kernel streams the weights, and two of their rows at once ran at
      // 0.4x (10.8 against 26 GB/s, q8_0 at m = 1 on [4096, 8192], BM_Decode_Dot).
      const std::int64_t step = m >= kQ8DotRows ? 2 : 1;
      for (std::int64_t j = 0; j < n; j += step) {
        const std::int64_t outputs = std::min<std::int64_t>(step, n - j);
        for (std::int64_t i = 0; i < m; i += kQ8DotRows) {
          const std::int64_t rows = std::min(kQ8DotRows, m - i);
          if (vnni) {
            q8dot_tile512_any<F, true>(rows, outputs, all.from_row(i), w + j * ldw, ldw,
                                       c + i * ldc + j, ldc);
          } else {
            q8dot_tile512_any<F, false>(rows, outputs, all.from_row(i), w + j * ldw, ldw,
                                        c + i * ldc + j, ldc);
          }
        }
      }
      return;
    }
    case KernelLevel::kAvx2:
      for (std::int64_t j = 0; j < n; ++j) {
        for (std::int64_t i = 0; i < m; i += kQ8DotRows) {
          q8dot_tile256_any<F>(std::min(kQ8DotRows, m - i), all.from_row(i), w + j * ldw,
                               c + i * ldc + j, ldc);
        }
      }
      return;
    case KernelLevel::kScalar:
      break;
  }
  for (std::int64_t i = 0; i < m; ++i) {
    for (std::int64_t j = 0; j < n; ++j) {
      c[i * ldc + j] = q8dot_scalar<F>(all.from_row(i), w + j * ldw);
    }
  }
}

/// dot_gemm_blocks (block_gemm.hpp) for the format F: checks, then the level's kernel.
template <class F>
void q8dot_gemm(std::int64_t m, const std::int8_t* codes, const float* scales,
                const WeightMatrix& b, float* c, std::int64_t ldc, runtime::KernelLevel level) {
  using runtime::KernelLevel;
  constexpr const char* name = "dot_gemm_blocks";
  NUMESH_CHECK(b.dtype == F::kDType, TypeError, "{}: weights of dtype {}; it takes {}", name,
               to_string(b.dtype), to_string(F::kDType));
  NUMESH_CHECK(b.layout == WeightLayout::kOutIn, ShapeError,
               "{}: {} weights stored in-out; block-format weights are stored out-in ([n, k])",
               name, to_string(b.dtype));
  const std::int64_t n = b.cols, k = b.rows, ld = b.ld != 0 ? b.ld : k;
  constexpr std::int64_t kBlock = F::kBlockElements;
  NUMESH_CHECK(
      m >= 0 && n >= 0 && k >= 0 && k % kBlock == 0 && ld >= k && ld % kBlock == 0 && ldc >= n,
      ShapeError,
      "{}: m {}, n {}, k {} with ldb {}, ldc {}: sizes must be >= 0, k and ldb whole "
      "blocks of {} ({}) and each leading dimension at least its row's length",
      name, m, n, k, ld, ldc, kBlock, to_string(F::kDType));
  if (m == 0 || n == 0) return;
  const std::int64_t blocks = k / kQ8DotBlock;
  const float* sums = nullptr;
  if constexpr (kSuperBlocks<F>) {
    if constexpr (F::kMinimums) sums = q8dot_block_sums(m, blocks, codes, scales, level);
  }
  Q8dotActivations all{codes, scales, sums, blocks};
  if constexpr (F::kOffset256 > 0) {
    if (level == KernelLevel::kAvx2) {
      thread_local std::vector<std::int32_t> corrections;
      corrections.resize(static_cast<std::size_t>(m * blocks * 8));
      q8dot_offset_corrections256<F::kOffset256>(m * blocks, codes, corrections.data());
      all.corrections = corrections.data();
    }
  }
  const auto* w = static_cast<const unsigned char*>(b.data);
  const std::int64_t ldw = ld / kBlock * F::kBlockBytes;
  const std::int64_t np = b.panel_outputs;
  if (np > 0) {
    if constexpr (!runtime::has_panels(F::kDType)) {
      throw TypeError(
          fmt::format("{}: {} weights have no panel layout", name, to_string(F::kDType)));
    } else {
      NUMESH_CHECK(np % runtime::kPanelWidth == 0 && np <= n && ld == k, ShapeError,
                   "{}: {} panel outputs of {} {} weights with ldb {} for k {}: panels are "
                   "whole (16 outputs), within the matrix and packed (ldb = k)",
                   name, np, n, to_string(F::kDType), ld, k);
      if (level >= KernelLevel::kAvx512Bf16) {
        q8dot_panels512<F>(m, all, w, np, c, ldc);
      } else {
        // Below VNNI, each panel back to rows in a buffer of the thread, then the level's kernel:
        // the same bits, for panels where they do not pay (device_gemm takes the tile for those
        // that do).
        thread_local std::vector<std::byte> rows;
        const std::int64_t panel_bytes = runtime::kPanelWidth * ldw;
        rows.resize(static_cast<std::size_t>(panel_bytes));
        for (std::int64_t j = 0; j < np; j += runtime::kPanelWidth) {
          runtime::panels_to_rows(F::kDType, runtime::kPanelWidth, k,
                                  std::span(reinterpret_cast<const std::byte*>(w + j * ldw),
                                            static_cast<std::size_t>(panel_bytes)),
                                  rows);
          q8dot_gemm_rows<F>(m, all, reinterpret_cast<const unsigned char*>(rows.data()), ldw,
                             runtime::kPanelWidth, c + j, ldc, level);
        }
      }
    }
  }
  q8dot_gemm_rows<F>(m, all, w + np * ldw, ldw, n - np, c + np, ldc, level);
}

}  // namespace numesh::ops::detail
