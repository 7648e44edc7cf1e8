#include "kquant_minimums.hpp"

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "numesh/core/check.hpp"
#include "numesh/core/dtype.hpp"
#include "numesh/core/error.hpp"

// GGML's make_qkx2_quants and the scale coding of quantize_row_q4_K_ref and
// quantize_row_q5_K_ref (ggml-quants.c), written from their definitions. Every step is the f32
// operation GGML's C performs, in the same order: the search compares weighted error sums, so
// one rounding of a product or a sum taken differently can pick another trial scale and change
// every code of a sub-block. That is also why this file is compiled with -ffp-contract=off
// (runtime/CMakeLists.txt): libggml-base is built without FMA, and a fused iscale * x + 1.5 *
// 2^23 or sum + w * l would round once where GGML rounds twice.

namespace numesh::runtime::detail {

namespace {

constexpr std::size_t kSuperBlock = 256;
constexpr std::size_t kSubBlock = 32;
constexpr std::size_t kSubBlocks = kSuperBlock / kSubBlock;
constexpr int kMaxSixBit = 63;  // 6-bit scale and minimum codes

std::uint8_t clamped_code(int l, int max_code) {
  return static_cast<std::uint8_t>(std::clamp(l, 0, max_code));
}

// make_qkx2_quants(32, max_code, x, w, codes, &negated_min, ..., rmin, rdelta, steps, use_mad
// false): the sub-block's scale, and -min in negated_min. It starts from the range's max_code
// steps and keeps any trial step count whose weighted least-squares fit has a smaller weighted
// squared error; the codes are those of the kept trial.
float fit_sub_block(const float* x, const float* w, const Qkx2Search& search, std::uint8_t* codes,
                    float& negated_min) {
  float min = x[0];
  float max = x[0];
  float sum_w = w[0];
  float sum_x = sum_w * x[0];
  for (std::size_t i = 1; i < kSubBlock; ++i) {
    if (x[i] < min) min = x[i];
    if (x[i] > max) max = x[i];
    sum_w += w[i];
    sum_x += w[i] * x[i];
  }
  if (min > 0.0f) min = 0.0f;
  if (max == min) {  // a constant sub-block at or below zero: all of it is the minimum
    std::fill(codes, codes + kSubBlock, std::uint8_t{0});
    negated_min = -min;
    return 0.0f;
  }
  const auto max_code = static_cast<float>(search.max_code);
  float iscale = max_code / (max - min);
  float scale = 1.0f / iscale;
  float best_error = 0.0f;
  for (std::size_t i = 0; i < kSubBlock; ++i) {
    codes[i] = clamped_code(kquant_nearest_int(iscale * (x[i] - min)), search.max_code);
    const float diff = scale * static_cast<float>(codes[i]) + min - x[i];
    best_error += w[i] * (diff * diff);
  }
  std::uint8_t trial[kSubBlock];
  for (int step = 0; step <= search.steps; ++step) {
    // Against max - min with the min of the best trial so far, not the range's: GGML's loop
    // reuses the variable it updates, and so do the codes below (x - min).
    iscale = (search.rmin + search.rdelta * static_cast<float>(step) + max_code) / (max - min);
    float sum_l = 0.0f;
    float sum_l2 = 0.0f;
    float sum_xl = 0.0f;
    for (std::size_t i = 0; i < kSubBlock; ++i) {
      trial[i] = clamped_code(kquant_nearest_int(iscale * (x[i] - min)), search.max_code);
      const float l = static_cast<float>(trial[i]);
      sum_l += w[i] * l;
      sum_l2 += w[i] * l * l;
      sum_xl += w[i] * l * x[i];
    }
    const float det = sum_w * sum_l2 - sum_l * sum_l;
    if (!(det > 0.0f)) continue;  // NaN too: GGML's `if (D > 0)`
    float trial_scale = (sum_w * sum_xl - sum_x * sum_l) / det;
    float trial_min = (sum_l2 * sum_x - sum_l * sum_xl) / det;
    if (trial_min > 0.0f) {  // the fit wants a positive minimum: refit through zero instead
      trial_min = 0.0f;
      trial_scale = sum_xl / sum_l2;
    }
    float error = 0.0f;
    for (std::size_t i = 0; i < kSubBlock; ++i) {
      const float diff = trial_scale * static_cast<float>(trial[i]) + trial_min - x[i];
      error += w[i] * (diff * diff);
    }
    if (error < best_error) {
      std::copy(trial, trial + kSubBlock, codes);
      best_error = error;
      scale = trial_scale;
      min = trial_min;
    }
  }
  negated_min = -min;
  return scale;
}

// fit_sub_block on a super-block's eight sub-blocks at once, sub-block s in lane s of AVX2's
// eight: the sub-blocks' searches are independent, and each lane takes fit_sub_block's f32
// steps in its order (no sum crosses lanes), its branches as masks: a trial whose determinant
// is not positive, or whose error is not smaller, leaves that lane as it was. So the codes,
// scales and minimums are fit_sub_block's bit for bit, where fit_sub_block alone is one long
// chain of dependent sums a sub-block.
__attribute__((target("avx2"))) inline __m256i nearest_codes(__m256 v, __m256i max_code) {
  // kquant_nearest_int, then clamped to 0 .. max_code.
  return _mm256_max_epi32(_mm256_min_epi32(kquant_nearest_int8(v), max_code),
                          _mm256_setzero_si256());
}

__attribute__((target("avx2"))) void fit_sub_blocks_avx2(const float* in, const Qkx2Search& search,
                                                         std::uint8_t* codes, float* scales,
                                                         float* negated_mins) {
  // x[i] and w[i] of the eight sub-blocks, lane s sub-block s.
  static_assert(kSubBlocks == 8, "one sub-block a lane of AVX2's eight");
  __m256 x[kSubBlock], w[kSubBlock];
  runs_to_lanes8(in, kSubBlock, x);
  __m256 sum_x2 = _mm256_setzero_ps();
  for (std::size_t i = 0; i < kSubBlock; ++i)
    sum_x2 = _mm256_add_ps(sum_x2, _mm256_mul_ps(x[i], x[i]));
  const __m256 av_x =
      _mm256_sqrt_ps(_mm256_div_ps(sum_x2, _mm256_set1_ps(static_cast<float>(kSubBlock))));
  const __m256 magnitude_bits = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF));
  for (std::size_t i = 0; i < kSubBlock; ++i)
    w[i] = _mm256_add_ps(av_x, _mm256_and_ps(x[i], magnitude_bits));

  __m256 min = x[0], max = x[0], sum_w = w[0];
  __m256 sum_x = _mm256_mul_ps(sum_w, x[0]);
  for (std::size_t i = 1; i < kSubBlock; ++i) {
    min = _mm256_blendv_ps(min, x[i], _mm256_cmp_ps(x[i], min, _CMP_LT_OQ));
    max = _mm256_blendv_ps(max, x[i], _mm256_cmp_ps(x[i], max, _CMP_GT_OQ));
    sum_w = _mm256_add_ps(sum_w, w[i]);
    sum_x = _mm256_add_ps(sum_x, _mm256_mul_ps(w[i], x[i]));
  }
  const __m256 zero = _mm256_setzero_ps();
  min = _mm256_blendv_ps(min, zero, _mm256_cmp_ps(min, zero, _CMP_GT_OQ));
  // A constant sub-block at or below zero: all of it is the minimum (its lane's search below
  // runs on a zero range and is overwritten at the end).
  const __m256 flat = _mm256_cmp_ps(max, min, _CMP_EQ_OQ);
  const __m256 flat_min = min;

  const __m256i max_code_int = _mm256_set1_epi32(search.max_code);
  const __m256 max_code = _mm256_set1_ps(static_cast<float>(search.max_code));
  __m256 iscale = _mm256_div_ps(max_code, _mm256_sub_ps(max, min));
  __m256 scale = _mm256_div_ps(_mm256_set1_ps(1.0f), iscale);
  __m256 best_error = zero;
  __m256i best[kSubBlock];
  for (std::size_t i = 0; i < kSubBlock; ++i) {
    best[i] = nearest_codes(_mm256_mul_ps(iscale, _mm256_sub_ps(x[i], min)), max_code_int);
    const __m256 diff =
        _mm256_sub_ps(_mm256_add_ps(_mm256_mul_ps(scale, _mm256_cvtepi32_ps(best[i])), min), x[i]);
    best_error = _mm256_add_ps(best_error, _mm256_mul_ps(w[i], _mm256_mul_ps(diff, diff)));
  }
  __m256i trial[kSubBlock];
  for (int step = 0; step <= search.steps; ++step) {
    const float numerator = search.rmin + search.rdelta * static_cast<float>(step) +
                            static_cast<float>(search.max_code);
    iscale = _mm256_div_ps(_mm256_set1_ps(numerator), _mm256_sub_ps(max, min));
    __m256 sum_l = zero, sum_l2 = zero, sum_xl = zero;
    for (std::size_t i = 0; i < kSubBlock; ++i) {
      trial[i] = nearest_codes(_mm256_mul_ps(iscale, _mm256_sub_ps(x[i], min)), max_code_int);
      const __m256 l = _mm256_cvtepi32_ps(trial[i]);
      const __m256 wl = _mm256_mul_ps(w[i], l);
      sum_l = _mm256_add_ps(sum_l, wl);
      sum_l2 = _mm256_add_ps(sum_l2, _mm256_mul_ps(wl, l));
      sum_xl = _mm256_add_ps(sum_xl, _mm256_mul_ps(wl, x[i]));
    }
    const __m256 det = _mm256_sub_ps(_mm256_mul_ps(sum_w, sum_l2), _mm256_mul_ps(sum_l, sum_l));
    const __m256 fits = _mm256_cmp_ps(det, zero, _CMP_GT_OQ);  // NaN too: GGML's `if (D > 0)`
    __m256 trial_scale = _mm256_div_ps(
        _mm256_sub_ps(_mm256_mul_ps(sum_w, sum_xl), _mm256_mul_ps(sum_x, sum_l)), det);
    __m256 trial_min = _mm256_div_ps(
        _mm256_sub_ps(_mm256_mul_ps(sum_l2, sum_x), _mm256_mul_ps(sum_l, sum_xl)), det);
    const __m256 positive = _mm256_cmp_ps(trial_min, zero, _CMP_GT_OQ);
    trial_min = _mm256_blendv_ps(trial_min, zero, positive);
    trial_scale = _mm256_blendv_ps(trial_scale, _mm256_div_ps(sum_xl, sum_l2), positive);
    __m256 error = zero;
    for (std::size_t i = 0; i < kSubBlock; ++i) {
      const __m256 diff = _mm256_sub_ps(
          _mm256_add_ps(_mm256_mul_ps(trial_scale, _mm256_cvtepi32_ps(trial[i])), trial_min), x[i]);
      error = _mm256_add_ps(error, _mm256_mul_ps(w[i], _mm256_mul_ps(diff, diff)));
    }
    const __m256 better = _mm256_and_ps(fits, _mm256_cmp_ps(error, best_error, _CMP_LT_OQ));
    for (std::size_t i = 0; i < kSubBlock; ++i) {
      best[i] = _mm256_castps_si256(
          _mm256_blendv_ps(_mm256_castsi256_ps(best[i]), _mm256_castsi256_ps(trial[i]), better));
    }
    best_error = _mm256_blendv_ps(best_error, error, better);
    scale = _mm256_blendv_ps(scale, trial_scale, better);
    min = _mm256_blendv_ps(min, trial_min, better);
  }
  scale = _mm256_blendv_ps(scale, zero, flat);
  min = _mm256_blendv_ps(min, flat_min, flat);
  const __m256 negated = _mm256_xor_ps(min, _mm256_set1_ps(-0.0f));  // -min, as the scalar
  alignas(32) float lanes[kSubBlocks];
  _mm256_store_ps(lanes, scale);
  std::copy(lanes, lanes + kSubBlocks, scales);
  _mm256_store_ps(lanes, negated);
  std::copy(lanes, lanes + kSubBlocks, negated_mins);
  const __m256i flat_codes = _mm256_castps_si256(flat);
  for (std::size_t i = 0; i < kSubBlock; ++i) best[i] = _mm256_andnot_si256(flat_codes, best[i]);
  lanes8_to_runs(best, kSubBlock, codes);
}

}  // namespace

void kquant_scale_min(std::size_t s, const std::uint8_t* packed, int& scale, int& min) {
  if (s < 4) {
    scale = packed[s] & 63;
    min = packed[s + 4] & 63;
  } else {
    scale = (packed[s + 4] & 0x0F) | ((packed[s - 4] >> 6) << 4);
    min = (packed[s + 4] >> 4) | ((packed[s] >> 6) << 4);
  }
}

ChunkScales kquant_chunk_scales(const std::uint8_t* packed, float d, float dmin, std::size_t c) {
  int sc_low = 0, m_low = 0, sc_high = 0, m_high = 0;
  kquant_scale_min(2 * c, packed, sc_low, m_low);
  kquant_scale_min(2 * c + 1, packed, sc_high, m_high);
  return {d * static_cast<float>(sc_low), dmin * static_cast<float>(m_low),
          d * static_cast<float>(sc_high), dmin * static_cast<float>(m_high)};
}

void quantize_minimum_super_block(const float* in, const Qkx2Search& search, std::uint8_t* codes,
                                  std::uint8_t* packed, std::uint16_t& d_bits,
                                  std::uint16_t& dmin_bits, KernelLevel level) {
  float scales[kSubBlocks];
  float mins[kSubBlocks];
  if (level >= KernelLevel::kAvx2) {
    fit_sub_blocks_avx2(in, search, codes, scales, mins);
  } else {
    float weights[kSubBlock];
    for (std::size_t s = 0; s < kSubBlocks; ++s) {
      const float* sub = in + s * kSubBlock;
      float sum_x2 = 0.0f;
      for (std::size_t i = 0; i < kSubBlock; ++i) sum_x2 += sub[i] * sub[i];
      const float av_x = std::sqrt(sum_x2 / static_cast<float>(kSubBlock));
      for (std::size_t i = 0; i < kSubBlock; ++i) weights[i] = av_x + std::fabs(sub[i]);
      scales[s] = fit_sub_block(sub, weights, search, codes + s * kSubBlock, mins[s]);
    }
  }
  // Scales and negated minimums are >= 0 (or NaN, which the strict comparisons skip).
  float max_scale = 0.0f;
  float max_min = 0.0f;
  for (std::size_t s = 0; s < kSubBlocks; ++s) {
    if (scales[s] > max_scale) max_scale = scales[s];
    if (mins[s] > max_min) max_min = mins[s];
  }

  // 6-bit codes of each scale and minimum against the largest. GGML stores nearest_int's int
  // in a uint8_t before clamping to 63: a negative or huge result wraps modulo 256 first.
  const float inv_scale = max_scale > 0.0f ? static_cast<float>(kMaxSixBit) / max_scale : 0.0f;
  const float inv_min = max_min > 0.0f ? static_cast<float>(kMaxSixBit) / max_min : 0.0f;
  for (std::size_t s = 0; s < kSubBlocks; ++s) {
    const auto wrapped_scale = static_cast<std::uint8_t>(kquant_nearest_int(inv_scale * scales[s]));
    const auto wrapped_min = static_cast<std::uint8_t>(kquant_nearest_int(inv_min * mins[s]));
    const auto ls = std::min(static_cast<std::uint8_t>(kMaxSixBit), wrapped_scale);
    const auto lm = std::min(static_cast<std::uint8_t>(kMaxSixBit), wrapped_min);
    if (s < 4) {
      packed[s] = ls;
      packed[s + 4] = lm;
    } else {  // bytes s - 4 and s were written (as s - 4's codes, below 64) just before
      packed[s + 4] = static_cast<std::uint8_t>((ls & 0x0F) | ((lm & 0x0F) << 4));
      packed[s - 4] = static_cast<std::uint8_t>(packed[s - 4] | ((ls >> 4) << 6));
      packed[s] = static_cast<std::uint8_t>(packed[s] | ((lm >> 4) << 6));
    }
  }
  d_bits = f16_from_f32(max_scale / static_cast<float>(kMaxSixBit));
  dmin_bits = f16_from_f32(max_min / static_cast<float>(kMaxSixBit));

  // Every code again, against the scale and minimum as stored. A sub-block whose stored scale
  // is zero keeps its search's codes: GGML's `if (!d) continue` (NaN goes on).
  const float d = f32_from_f16(d_bits);
  const float dmin = f32_from_f16(dmin_bits);
  for (std::size_t s = 0; s < kSubBlocks; ++s) {
    int sc = 0;
    int m = 0;
    kquant_scale_min(s, packed, sc, m);
    const float sub_d = d * static_cast<float>(sc);
    if (sub_d == 0.0f) continue;
    const float sub_dm = dmin * static_cast<float>(m);
    const float* sub = in + s * kSubBlock;
    for (std::size_t i = 0; i < kSubBlock; ++i) {
      codes[s * kSubBlock + i] =
          clamped_code(kquant_nearest_int((sub[i] + sub_dm) / sub_d), search.max_code);
    }
  }
}

}  // namespace numesh::runtime::detail
