#include "kquant_minimums.hpp"

#include <algorithm>
#include <cmath>

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
                                  std::uint16_t& dmin_bits) {
  float scales[kSubBlocks];
  float mins[kSubBlocks];
  float weights[kSubBlock];
  // Scales and negated minimums are >= 0 (or NaN, which the strict comparisons skip).
  float max_scale = 0.0f;
  float max_min = 0.0f;
  for (std::size_t s = 0; s < kSubBlocks; ++s) {
    const float* sub = in + s * kSubBlock;
    float sum_x2 = 0.0f;
    for (std::size_t i = 0; i < kSubBlock; ++i) sum_x2 += sub[i] * sub[i];
    const float av_x = std::sqrt(sum_x2 / static_cast<float>(kSubBlock));
    for (std::size_t i = 0; i < kSubBlock; ++i) weights[i] = av_x + std::fabs(sub[i]);
    scales[s] = fit_sub_block(sub, weights, search, codes + s * kSubBlock, mins[s]);
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
