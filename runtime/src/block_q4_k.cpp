#include <algorithm>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>

#include "numesh/core/check.hpp"
#include "numesh/core/dtype.hpp"
#include "numesh/runtime/block_formats.hpp"

// GGML's Q4_K (quantize_row_q4_K_ref with its make_qkx2_quants, and dequantize_row_q4_K in
// ggml-quants.c), written from its definition. Every step is the f32 operation GGML's C
// performs, in the same order: the search compares weighted error sums, so one rounding of a
// product or a sum taken differently can pick another trial scale and change every code of a
// sub-block. That is also why this file is compiled with -ffp-contract=off
// (runtime/CMakeLists.txt): libggml-base is built without FMA, and a fused iscale * x + 1.5 *
// 2^23 or sum + w * l would round once where GGML rounds twice.

namespace numesh::runtime {

namespace {

constexpr std::size_t kQ4_KBlock = static_cast<std::size_t>(kQ4_KBlockElements);
constexpr std::size_t kQ4_KSubBlock = 32;
constexpr std::size_t kQ4_KSubBlocks = kQ4_KBlock / kQ4_KSubBlock;
constexpr int kQ4_KMaxCode = 15;      // 4-bit codes
constexpr int kQ4_KMaxSixBit = 63;    // 6-bit scale and minimum codes
constexpr int kQ4_KTrialScales = 20;  // make_qkx2_quants's nstep: trials 0 .. 20

void check_q4_k_sizes(const char* what, std::size_t values, std::size_t blocks) {
  NUMESH_CHECK(values / kQ4_KBlock == blocks && values % kQ4_KBlock == 0, ShapeError,
               "{} q4_k: {} values for {} block(s) of {}: expected {} values", what, values, blocks,
               kQ4_KBlock, blocks * kQ4_KBlock);
}

// GGML's nearest_int: adding 1.5 * 2^23 leaves round-half-even(v) in the sum's low mantissa bits
// for |v| < 2^22. GGML asserts that range only in debug builds; beyond it (and for inf or NaN)
// release builds return this same bit arithmetic, which is defined, so it is what numesh returns.
int q4_k_nearest_int(float v) {
  const float shifted = v + 12582912.0f;
  return (std::bit_cast<std::int32_t>(shifted) & 0x007FFFFF) - 0x00400000;
}

std::uint8_t q4_k_clamped_code(int l) {
  return static_cast<std::uint8_t>(std::clamp(l, 0, kQ4_KMaxCode));
}

// GGML's make_qkx2_quants(32, 15, x, w, codes, &negated_min, ..., rmin -1, rdelta 0.1, nstep
// 20, use_mad false): the sub-block's scale, and -min in negated_min, for x ~ scale * code + min
// with min <= 0. It starts from the range's 15 steps and keeps any of 21 trial step counts (14 ..
// 16) whose weighted least-squares fit has a smaller weighted squared error; the codes are those
// of the kept trial.
float fit_q4_k_sub_block(const float* x, const float* w, std::uint8_t* codes, float& negated_min) {
  float min = x[0];
  float max = x[0];
  float sum_w = w[0];
  float sum_x = sum_w * x[0];
  for (std::size_t i = 1; i < kQ4_KSubBlock; ++i) {
    if (x[i] < min) min = x[i];
    if (x[i] > max) max = x[i];
    sum_w += w[i];
    sum_x += w[i] * x[i];
  }
  if (min > 0.0f) min = 0.0f;
  if (max == min) {  // a constant sub-block at or below zero: all of it is the minimum
    std::fill(codes, codes + kQ4_KSubBlock, std::uint8_t{0});
    negated_min = -min;
    return 0.0f;
  }
  float iscale = static_cast<float>(kQ4_KMaxCode) / (max - min);
  float scale = 1.0f / iscale;
  float best_error = 0.0f;
  for (std::size_t i = 0; i < kQ4_KSubBlock; ++i) {
    codes[i] = q4_k_clamped_code(q4_k_nearest_int(iscale * (x[i] - min)));
    const float diff = scale * static_cast<float>(codes[i]) + min - x[i];
    best_error += w[i] * (diff * diff);
  }
  std::uint8_t trial[kQ4_KSubBlock];
  for (int step = 0; step <= kQ4_KTrialScales; ++step) {
    // Against max - min with the min of the best trial so far, not the range's: GGML's loop
    // reuses the variable it updates, and so do the codes below (x - min).
    iscale =
        (-1.0f + 0.1f * static_cast<float>(step) + static_cast<float>(kQ4_KMaxCode)) / (max - min);
    float sum_l = 0.0f;
    float sum_l2 = 0.0f;
    float sum_xl = 0.0f;
    for (std::size_t i = 0; i < kQ4_KSubBlock; ++i) {
      trial[i] = q4_k_clamped_code(q4_k_nearest_int(iscale * (x[i] - min)));
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
    for (std::size_t i = 0; i < kQ4_KSubBlock; ++i) {
      const float diff = trial_scale * static_cast<float>(trial[i]) + trial_min - x[i];
      error += w[i] * (diff * diff);
    }
    if (error < best_error) {
      std::copy(trial, trial + kQ4_KSubBlock, codes);
      best_error = error;
      scale = trial_scale;
      min = trial_min;
    }
  }
  negated_min = -min;
  return scale;
}

// GGML's get_scale_min_k4: sub-block s's 6-bit scale and minimum codes from the 12 packed bytes.
void q4_k_scale_min(std::size_t s, const std::uint8_t* packed, int& scale, int& min) {
  if (s < 4) {
    scale = packed[s] & 63;
    min = packed[s + 4] & 63;
  } else {
    scale = (packed[s + 4] & 0x0F) | ((packed[s - 4] >> 6) << 4);
    min = (packed[s + 4] >> 4) | ((packed[s] >> 6) << 4);
  }
}

}  // namespace

void quantize_q4_k(std::span<const float> x, std::span<BlockQ4_K> y) {
  check_q4_k_sizes("quantize", x.size(), y.size());
  for (std::size_t b = 0; b < y.size(); ++b) {
    const float* in = x.data() + b * kQ4_KBlock;
    // Checked before the block is touched, so a refused block is left as it was.
    for (std::size_t i = 0; i < kQ4_KBlock; ++i) {
      NUMESH_CHECK(std::isfinite(in[i]), ValueError, "quantize q4_k: element {} is {}",
                   b * kQ4_KBlock + i, in[i]);
    }
    std::uint8_t codes[kQ4_KBlock];
    float scales[kQ4_KSubBlocks];
    float mins[kQ4_KSubBlocks];
    float weights[kQ4_KSubBlock];
    // Scales and negated minimums are >= 0 (or NaN, which the strict comparisons skip).
    float max_scale = 0.0f;
    float max_min = 0.0f;
    for (std::size_t s = 0; s < kQ4_KSubBlocks; ++s) {
      const float* sub = in + s * kQ4_KSubBlock;
      float sum_x2 = 0.0f;
      for (std::size_t i = 0; i < kQ4_KSubBlock; ++i) sum_x2 += sub[i] * sub[i];
      const float av_x = std::sqrt(sum_x2 / static_cast<float>(kQ4_KSubBlock));
      for (std::size_t i = 0; i < kQ4_KSubBlock; ++i) weights[i] = av_x + std::fabs(sub[i]);
      scales[s] = fit_q4_k_sub_block(sub, weights, codes + s * kQ4_KSubBlock, mins[s]);
      if (scales[s] > max_scale) max_scale = scales[s];
      if (mins[s] > max_min) max_min = mins[s];
    }

    // 6-bit codes of each scale and minimum against the largest. GGML stores nearest_int's int
    // in a uint8_t before clamping to 63: a negative or huge result wraps modulo 256 first.
    const float inv_scale =
        max_scale > 0.0f ? static_cast<float>(kQ4_KMaxSixBit) / max_scale : 0.0f;
    const float inv_min = max_min > 0.0f ? static_cast<float>(kQ4_KMaxSixBit) / max_min : 0.0f;
    BlockQ4_K& out = y[b];
    for (std::size_t s = 0; s < kQ4_KSubBlocks; ++s) {
      const auto wrapped_scale = static_cast<std::uint8_t>(q4_k_nearest_int(inv_scale * scales[s]));
      const auto wrapped_min = static_cast<std::uint8_t>(q4_k_nearest_int(inv_min * mins[s]));
      const auto ls = std::min(static_cast<std::uint8_t>(kQ4_KMaxSixBit), wrapped_scale);
      const auto lm = std::min(static_cast<std::uint8_t>(kQ4_KMaxSixBit), wrapped_min);
      if (s < 4) {
        out.scales[s] = ls;
        out.scales[s + 4] = lm;
      } else {  // bytes s - 4 and s were written (as s - 4's codes, below 64) just before
        out.scales[s + 4] = static_cast<std::uint8_t>((ls & 0x0F) | ((lm & 0x0F) << 4));
        out.scales[s - 4] = static_cast<std::uint8_t>(out.scales[s - 4] | ((ls >> 4) << 6));
        out.scales[s] = static_cast<std::uint8_t>(out.scales[s] | ((lm >> 4) << 6));
      }
    }
    out.d = f16_from_f32(max_scale / static_cast<float>(kQ4_KMaxSixBit));
    out.dmin = f16_from_f32(max_min / static_cast<float>(kQ4_KMaxSixBit));

    // Every code again, against the scale and minimum as stored. A sub-block whose stored scale
    // is zero keeps its search's codes: GGML's `if (!d) continue` (NaN goes on).
    const float d = f32_from_f16(out.d);
    const float dmin = f32_from_f16(out.dmin);
    for (std::size_t s = 0; s < kQ4_KSubBlocks; ++s) {
      int sc = 0;
      int m = 0;
      q4_k_scale_min(s, out.scales, sc, m);
      const float sub_d = d * static_cast<float>(sc);
      if (sub_d == 0.0f) continue;
      const float sub_dm = dmin * static_cast<float>(m);
      const float* sub = in + s * kQ4_KSubBlock;
      for (std::size_t i = 0; i < kQ4_KSubBlock; ++i) {
        codes[s * kQ4_KSubBlock + i] =
            q4_k_clamped_code(q4_k_nearest_int((sub[i] + sub_dm) / sub_d));
      }
    }

    // 64-element chunks: elements l and l + 32 of a chunk share byte l of its 32.
    for (std::size_t c = 0; c < kQ4_KBlock / 64; ++c) {
      for (std::size_t l = 0; l < 32; ++l) {
        out.qs[32 * c + l] =
            static_cast<std::uint8_t>(codes[64 * c + l] | (codes[64 * c + 32 + l] << 4));
      }
    }
  }
}

void dequantize_q4_k(std::span<const BlockQ4_K> y, std::span<float> x) {
  check_q4_k_sizes("dequantize", x.size(), y.size());
  for (std::size_t b = 0; b < y.size(); ++b) {
    const BlockQ4_K& in = y[b];
    const float d = f32_from_f16(in.d);
    const float dmin = f32_from_f16(in.dmin);
    float* out = x.data() + b * kQ4_KBlock;
    for (std::size_t c = 0; c < kQ4_KBlock / 64; ++c) {
      int sc_low = 0, m_low = 0, sc_high = 0, m_high = 0;
      q4_k_scale_min(2 * c, in.scales, sc_low, m_low);
      q4_k_scale_min(2 * c + 1, in.scales, sc_high, m_high);
      const float d_low = d * static_cast<float>(sc_low);
      const float min_low = dmin * static_cast<float>(m_low);
      const float d_high = d * static_cast<float>(sc_high);
      const float min_high = dmin * static_cast<float>(m_high);
      for (std::size_t l = 0; l < 32; ++l) {
        const std::uint8_t byte = in.qs[32 * c + l];
        out[64 * c + l] = d_low * static_cast<float>(byte & 0x0F) - min_low;
        out[64 * c + 32 + l] = d_high * static_cast<float>(byte >> 4) - min_high;
      }
    }
  }
}

}  // namespace numesh::runtime
