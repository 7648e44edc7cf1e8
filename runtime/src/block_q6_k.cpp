#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>

#include "block_sizes.hpp"
#include "kquant_search.hpp"
#include "numesh/core/check.hpp"
#include "numesh/core/dtype.hpp"
#include "numesh/runtime/block_formats.hpp"

// GGML's Q6_K (quantize_row_q6_K_ref with its make_qx_quants(..., rmse_type 1, NULL), and
// dequantize_row_q6_K in ggml-quants.c), written from its definition. Every step is the f32
// operation GGML's C performs, in the same order: the search compares weighted sums, so one
// rounding taken differently can pick another trial scale and change every code of a sub-block.
// That is also why this file is compiled with -ffp-contract=off (runtime/CMakeLists.txt):
// libggml-base is built without FMA, and a fused iscale * x + 1.5 * 2^23 or sum + w * x * l
// would round once where GGML rounds twice.

namespace numesh::runtime {

namespace {

constexpr std::size_t kQ6_KBlock = static_cast<std::size_t>(kQ6_KBlockElements);
constexpr std::size_t kQ6_KSubBlock = 16;
constexpr std::size_t kQ6_KSubBlocks = kQ6_KBlock / kQ6_KSubBlock;
constexpr int kQ6_KHalfRange = 32;  // codes -32 .. 31, stored + 32
constexpr int kQ6_KTrialSteps = 9;  // make_qx_quants's trials: 32 + 0.1 * (-9 .. 9, not 0)
// GGML's GROUP_MAX_EPS: a sub-block, or a block's largest sub-block scale, below it is zero.
constexpr float kQ6_KZeroBelow = 1e-15f;

int q6_k_clamped(int l) { return std::clamp(l, -kQ6_KHalfRange, kQ6_KHalfRange - 1); }

// GGML's make_qx_quants(16, 32, x, codes, 1, NULL): the sub-block's signed scale, and codes
// (stored + 32) for x ~ scale * (code - 32). The first element of largest magnitude, m, sets the
// first trial, iscale = -32 / m (so m is code -32); the scale is the least-squares fit with
// weights x^2, and each of 18 more trial iscales replaces it when its fit explains more, i.e.
// sumlx^2 / suml2 is larger.
float fit_q6_k_sub_block(const float* x, std::uint8_t* codes) {
  const auto [max, amax] = detail::first_largest_magnitude(x, kQ6_KSubBlock);
  if (amax < kQ6_KZeroBelow) {  // code 0 (that is -32), not 32: GGML's choice, kept in the bytes
    std::fill(codes, codes + kQ6_KSubBlock, std::uint8_t{0});
    return 0.0f;
  }
  float iscale = static_cast<float>(-kQ6_KHalfRange) / max;
  float sumlx = 0.0f;
  float suml2 = 0.0f;
  for (std::size_t i = 0; i < kQ6_KSubBlock; ++i) {
    const int l = q6_k_clamped(detail::kquant_nearest_int(iscale * x[i]));
    codes[i] = static_cast<std::uint8_t>(l + kQ6_KHalfRange);
    const float w = x[i] * x[i];
    sumlx += w * x[i] * static_cast<float>(l);
    suml2 += w * static_cast<float>(l) * static_cast<float>(l);
  }
  float scale = suml2 != 0.0f ? sumlx / suml2 : 0.0f;  // C's `suml2 ? ...`: NaN divides
  float best = scale * sumlx;
  int trial[kQ6_KSubBlock];
  for (int step = -kQ6_KTrialSteps; step <= kQ6_KTrialSteps; ++step) {
    if (step == 0) continue;
    iscale = -(static_cast<float>(kQ6_KHalfRange) + 0.1f * static_cast<float>(step)) / max;
    sumlx = 0.0f;
    suml2 = 0.0f;
    for (std::size_t i = 0; i < kQ6_KSubBlock; ++i) {
      trial[i] = q6_k_clamped(detail::kquant_nearest_int(iscale * x[i]));
      const float w = x[i] * x[i];
      sumlx += w * x[i] * static_cast<float>(trial[i]);
      suml2 += w * static_cast<float>(trial[i]) * static_cast<float>(trial[i]);
    }
    if (suml2 > 0.0f && sumlx * sumlx > best * suml2) {
      for (std::size_t i = 0; i < kQ6_KSubBlock; ++i) {
        codes[i] = static_cast<std::uint8_t>(trial[i] + kQ6_KHalfRange);
      }
      scale = sumlx / suml2;
      best = scale * sumlx;
    }
  }
  return scale;
}

// fit_q6_k_sub_block on eight sub-blocks at once (in[16 g + i], g < 8), sub-block g in lane g
// of AVX2's eight: each lane takes fit_q6_k_sub_block's f32 steps in its order (no sum crosses
// lanes), its branches as masks, so its codes and scale are fit_q6_k_sub_block's bit for bit.
__attribute__((target("avx2"))) inline __m256i q6_k_codes(__m256 iscale, __m256 x) {
  // kquant_nearest_int(iscale * x), clamped to -32 .. 31.
  return _mm256_max_epi32(_mm256_min_epi32(detail::kquant_nearest_int8(_mm256_mul_ps(iscale, x)),
                                           _mm256_set1_epi32(kQ6_KHalfRange - 1)),
                          _mm256_set1_epi32(-kQ6_KHalfRange));
}

// The codes l of iscale for the eight lanes' x, with sum w x l and sum w l^2 (w = x^2).
__attribute__((target("avx2"))) inline void q6_k_fit(const __m256* x, __m256 iscale, __m256i* l,
                                                     __m256& sumlx, __m256& suml2) {
  sumlx = _mm256_setzero_ps();
  suml2 = _mm256_setzero_ps();
  for (std::size_t i = 0; i < kQ6_KSubBlock; ++i) {
    l[i] = q6_k_codes(iscale, x[i]);
    const __m256 code = _mm256_cvtepi32_ps(l[i]);
    const __m256 w = _mm256_mul_ps(x[i], x[i]);
    sumlx = _mm256_add_ps(sumlx, _mm256_mul_ps(_mm256_mul_ps(w, x[i]), code));
    suml2 = _mm256_add_ps(suml2, _mm256_mul_ps(_mm256_mul_ps(w, code), code));
  }
}

__attribute__((target("avx2"))) void fit_q6_k_sub_blocks_avx2(const float* in, std::uint8_t* codes,
                                                              float* scales) {
  __m256 x[kQ6_KSubBlock];
  detail::runs_to_lanes8(in, kQ6_KSubBlock, x);
  // The first element of largest magnitude (first_largest_magnitude, lane by lane).
  const __m256 magnitude_bits = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF));
  const __m256 zero = _mm256_setzero_ps();
  __m256 max = zero, amax = zero;
  for (std::size_t i = 0; i < kQ6_KSubBlock; ++i) {
    const __m256 magnitude = _mm256_and_ps(x[i], magnitude_bits);
    const __m256 larger = _mm256_cmp_ps(magnitude, amax, _CMP_GT_OQ);
    max = _mm256_blendv_ps(max, x[i], larger);
    amax = _mm256_blendv_ps(amax, magnitude, larger);
  }
  const __m256 tiny = _mm256_cmp_ps(amax, _mm256_set1_ps(kQ6_KZeroBelow), _CMP_LT_OQ);
  __m256i best[kQ6_KSubBlock], trial[kQ6_KSubBlock];
  __m256 sumlx, suml2;
  q6_k_fit(x, _mm256_div_ps(_mm256_set1_ps(static_cast<float>(-kQ6_KHalfRange)), max), best, sumlx,
           suml2);
  // C's `suml2 ? sumlx / suml2 : 0`: NaN divides.
  __m256 scale =
      _mm256_blendv_ps(_mm256_div_ps(sumlx, suml2), zero, _mm256_cmp_ps(suml2, zero, _CMP_EQ_OQ));
  __m256 best_fit = _mm256_mul_ps(scale, sumlx);
  for (int step = -kQ6_KTrialSteps; step <= kQ6_KTrialSteps; ++step) {
    if (step == 0) continue;
    const float numerator = -(static_cast<float>(kQ6_KHalfRange) + 0.1f * static_cast<float>(step));
    q6_k_fit(x, _mm256_div_ps(_mm256_set1_ps(numerator), max), trial, sumlx, suml2);
    const __m256 better = _mm256_and_ps(
        _mm256_cmp_ps(suml2, zero, _CMP_GT_OQ),
        _mm256_cmp_ps(_mm256_mul_ps(sumlx, sumlx), _mm256_mul_ps(best_fit, suml2), _CMP_GT_OQ));
    for (std::size_t i = 0; i < kQ6_KSubBlock; ++i) {
      best[i] = _mm256_castps_si256(
          _mm256_blendv_ps(_mm256_castsi256_ps(best[i]), _mm256_castsi256_ps(trial[i]), better));
    }
    scale = _mm256_blendv_ps(scale, _mm256_div_ps(sumlx, suml2), better);
    best_fit = _mm256_blendv_ps(best_fit, _mm256_mul_ps(scale, sumlx), better);
  }
  // A sub-block below GGML_MAX_EPS: scale 0, every code 0 (that is -32).
  _mm256_storeu_ps(scales, _mm256_blendv_ps(scale, zero, tiny));
  const __m256i kept = _mm256_castps_si256(tiny);
  for (std::size_t i = 0; i < kQ6_KSubBlock; ++i) {
    best[i] =
        _mm256_andnot_si256(kept, _mm256_add_epi32(best[i], _mm256_set1_epi32(kQ6_KHalfRange)));
  }
  detail::lanes8_to_runs(best, kQ6_KSubBlock, codes);
}

}  // namespace

void quantize_q6_k(std::span<const float> x, std::span<BlockQ6_K> y) {
  quantize_q6_k(x, y, kernel_level());
}

void quantize_q6_k(std::span<const float> x, std::span<BlockQ6_K> y, KernelLevel level) {
  detail::check_block_sizes("quantize", DType::kQ6_K, x.size(), y.size());
  for (std::size_t b = 0; b < y.size(); ++b) {
    const float* in = x.data() + b * kQ6_KBlock;
    // Checked before the block is touched, so a refused block is left as it was.
    detail::check_finite(in, kQ6_KBlock, b * kQ6_KBlock, "q6_k");
    std::uint8_t codes[kQ6_KBlock];
    float scales[kQ6_KSubBlocks];
    if (level >= KernelLevel::kAvx2) {
      for (std::size_t g = 0; g < kQ6_KSubBlocks; g += 8) {
        fit_q6_k_sub_blocks_avx2(in + g * kQ6_KSubBlock, codes + g * kQ6_KSubBlock, scales + g);
      }
    } else {
      for (std::size_t g = 0; g < kQ6_KSubBlocks; ++g) {
        scales[g] = fit_q6_k_sub_block(in + g * kQ6_KSubBlock, codes + g * kQ6_KSubBlock);
      }
    }
    // The first sub-block scale of largest magnitude.
    const auto [max_scale, max_abs_scale] = detail::first_largest_magnitude(scales, kQ6_KSubBlocks);
    BlockQ6_K& out = y[b];
    if (max_abs_scale < kQ6_KZeroBelow) {  // GGML's memset, then d = f16(0): every byte 0
      out = BlockQ6_K{};
      continue;
    }

    // 8-bit codes of the scales against the one of largest magnitude, which is code -128 (a
    // scale of the other sign rounds up to 128 and is clamped to 127). GGML stores the int in an
    // int8_t: a result below -128 (only nearest_int's garbage for inf) wraps modulo 256.
    const float iscale = -128.0f / max_scale;
    out.d = f16_from_f32(1.0f / iscale);
    for (std::size_t g = 0; g < kQ6_KSubBlocks; ++g) {
      out.scales[g] =
          static_cast<std::int8_t>(std::min(127, detail::kquant_nearest_int(iscale * scales[g])));
    }

    // Every code again, against the scale as stored. A sub-block whose stored scale is zero keeps
    // its search's codes: GGML's `if (!d) continue` (NaN goes on).
    const float d = f32_from_f16(out.d);
    for (std::size_t g = 0; g < kQ6_KSubBlocks; ++g) {
      const float sub_d = d * static_cast<float>(out.scales[g]);
      if (sub_d == 0.0f) continue;
      const float* sub = in + g * kQ6_KSubBlock;
      for (std::size_t i = 0; i < kQ6_KSubBlock; ++i) {
        codes[g * kQ6_KSubBlock + i] = static_cast<std::uint8_t>(
            q6_k_clamped(detail::kquant_nearest_int(sub[i] / sub_d)) + kQ6_KHalfRange);
      }
    }

    // Two 128-element halves; within one, element l (l < 32) and l + 32, l + 64, l + 96 share
    // qh byte l (2 bits each, from the low end), and ql bytes l (l, l + 64) and l + 32 (l + 32,
    // l + 96) hold their low nibbles.
    for (std::size_t h = 0; h < kQ6_KBlock / 128; ++h) {
      const std::uint8_t* half = codes + 128 * h;
      std::uint8_t* ql = out.ql + 64 * h;
      std::uint8_t* qh = out.qh + 32 * h;
      for (std::size_t l = 0; l < 32; ++l) {
        ql[l] = static_cast<std::uint8_t>((half[l] & 0x0F) | ((half[l + 64] & 0x0F) << 4));
        ql[l + 32] =
            static_cast<std::uint8_t>((half[l + 32] & 0x0F) | ((half[l + 96] & 0x0F) << 4));
        qh[l] = static_cast<std::uint8_t>((half[l] >> 4) | ((half[l + 32] >> 4) << 2) |
                                          ((half[l + 64] >> 4) << 4) | ((half[l + 96] >> 4) << 6));
      }
    }
  }
}

void dequantize_q6_k(std::span<const BlockQ6_K> y, std::span<float> x) {
  detail::check_block_sizes("dequantize", DType::kQ6_K, x.size(), y.size());
  for (std::size_t b = 0; b < y.size(); ++b) {
    const BlockQ6_K& in = y[b];
    const float d = f32_from_f16(in.d);
    for (std::size_t h = 0; h < kQ6_KBlock / 128; ++h) {
      const std::uint8_t* ql = in.ql + 64 * h;
      const std::uint8_t* qh = in.qh + 32 * h;
      const std::int8_t* sc = in.scales + 8 * h;
      float* out = x.data() + b * kQ6_KBlock + 128 * h;
      for (std::size_t l = 0; l < 32; ++l) {
        const std::size_t g = l / 16;
        const int q1 = ((ql[l] & 0x0F) | (((qh[l] >> 0) & 3) << 4)) - kQ6_KHalfRange;
        const int q2 = ((ql[l + 32] & 0x0F) | (((qh[l] >> 2) & 3) << 4)) - kQ6_KHalfRange;
        const int q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - kQ6_KHalfRange;
        const int q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - kQ6_KHalfRange;
        out[l] = d * static_cast<float>(sc[g]) * static_cast<float>(q1);
        out[l + 32] = d * static_cast<float>(sc[g + 2]) * static_cast<float>(q2);
        out[l + 64] = d * static_cast<float>(sc[g + 4]) * static_cast<float>(q3);
        out[l + 96] = d * static_cast<float>(sc[g + 6]) * static_cast<float>(q4);
      }
    }
  }
}

}  // namespace numesh::runtime
