#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "block_sizes.hpp"
#include "kquant_search.hpp"
#include "numesh/core/dtype.hpp"
#include "numesh/runtime/block_formats.hpp"

// GGML's Q3_K (quantize_row_q3_K_ref with its make_q3_quants(16, 4, x, L, true), and
// dequantize_row_q3_K in ggml-quants.c), written from its definition. Every step is the f32
// operation GGML's C performs, in the same order: the search compares weighted sums, so one
// rounding taken differently can keep or move a code and change the sub-block's scale. Compiled
// with -ffp-contract=off, as the other K formats (runtime/CMakeLists.txt).

namespace numesh::runtime {

namespace {

constexpr std::size_t kQ3_KBlock = static_cast<std::size_t>(kQ3_KBlockElements);
constexpr std::size_t kQ3_KSubBlock = 16;
constexpr std::size_t kQ3_KSubBlocks = kQ3_KBlock / kQ3_KSubBlock;
constexpr int kQ3_KHalfRange = 4;         // codes -4 .. 3, stored + 4
constexpr int kQ3_KScaleOffset = 32;      // scale codes -32 .. 31, stored + 32
constexpr int kQ3_KRefinements = 5;       // make_q3_quants's passes
constexpr float kQ3_KZeroBelow = 1e-15f;  // GGML's GROUP_MAX_EPS

int q3_k_clamped(int l) { return std::clamp(l, -kQ3_KHalfRange, kQ3_KHalfRange - 1); }

// GGML's make_q3_quants(16, 4, x, codes, true): the sub-block's signed scale and codes (stored
// + 4) for x ~ scale * (code - 4). The first element of largest magnitude, m, sets the start,
// iscale = -4 / m (so m is code -4); then up to five passes, each element in turn, move one
// code to nearest_int(x sl2 / slx) (the best code for that element with the others' sums fixed)
// when that explains more of the sub-block (weights x^2), i.e. sumlx^2 / suml2 grows; a pass
// that moves nothing ends the search. The scale is the least-squares fit sumlx / suml2.
float fit_q3_k_sub_block(const float* x, std::uint8_t* codes) {
  const auto [max, amax] = detail::first_largest_magnitude(x, kQ3_KSubBlock);
  if (amax < kQ3_KZeroBelow) {  // code 0 (that is -4), not 4: GGML's choice, kept in the bytes
    std::fill(codes, codes + kQ3_KSubBlock, std::uint8_t{0});
    return 0.0f;
  }
  const float iscale = static_cast<float>(-kQ3_KHalfRange) / max;
  int l[kQ3_KSubBlock];
  float sumlx = 0.0f;
  float suml2 = 0.0f;
  for (std::size_t i = 0; i < kQ3_KSubBlock; ++i) {
    l[i] = q3_k_clamped(detail::kquant_nearest_int(iscale * x[i]));
    const float w = x[i] * x[i];
    sumlx += w * x[i] * static_cast<float>(l[i]);
    suml2 += w * static_cast<float>(l[i]) * static_cast<float>(l[i]);
  }
  for (int pass = 0; pass < kQ3_KRefinements; ++pass) {
    bool moved = false;
    for (std::size_t i = 0; i < kQ3_KSubBlock; ++i) {
      const float w = x[i] * x[i];
      float slx = sumlx - w * x[i] * static_cast<float>(l[i]);
      if (!(slx > 0.0f)) continue;
      float sl2 = suml2 - w * static_cast<float>(l[i]) * static_cast<float>(l[i]);
      const int next = q3_k_clamped(detail::kquant_nearest_int(x[i] * sl2 / slx));
      if (next == l[i]) continue;
      slx += w * x[i] * static_cast<float>(next);
      sl2 += w * static_cast<float>(next) * static_cast<float>(next);
      if (sl2 > 0.0f && slx * slx * suml2 > sumlx * sumlx * sl2) {
        l[i] = next;
        sumlx = slx;
        suml2 = sl2;
        moved = true;
      }
    }
    if (!moved) break;
  }
  for (std::size_t i = 0; i < kQ3_KSubBlock; ++i) {
    codes[i] = static_cast<std::uint8_t>(l[i] + kQ3_KHalfRange);
  }
  return suml2 > 0.0f ? sumlx / suml2 : 0.0f;
}

// Sub-block g's scale code (0 .. 63) from the 12 packed bytes.
int q3_k_scale_code(const std::uint8_t* packed, std::size_t g) {
  const int nibble = g < 8 ? packed[g] & 0x0F : packed[g - 8] >> 4;
  return nibble | (((packed[8 + g % 4] >> (2 * (g / 4))) & 3) << 4);
}

}  // namespace

void quantize_q3_k(std::span<const float> x, std::span<BlockQ3_K> y) {
  detail::check_block_sizes("quantize", DType::kQ3_K, x.size(), y.size());
  for (std::size_t b = 0; b < y.size(); ++b) {
    const float* in = x.data() + b * kQ3_KBlock;
    // Checked before the block is touched, so a refused block is left as it was.
    detail::check_finite(in, kQ3_KBlock, b * kQ3_KBlock, "q3_k");
    std::uint8_t codes[kQ3_KBlock];
    float scales[kQ3_KSubBlocks];
    for (std::size_t g = 0; g < kQ3_KSubBlocks; ++g) {
      scales[g] = fit_q3_k_sub_block(in + g * kQ3_KSubBlock, codes + g * kQ3_KSubBlock);
    }
    // The first sub-block scale of largest magnitude.
    const float max_scale = detail::first_largest_magnitude(scales, kQ3_KSubBlocks).value;

    // 6-bit codes of the scales against the one of largest magnitude, which is code -32 (a scale
    // of the other sign rounds up to 32 and is clamped to 31). GGML stores nearest_int's result
    // in an int8_t before clamping: modulo 256 (only its garbage for inf or NaN is that large).
    // Without a non-zero scale (`if (max_scale)`), the codes and d stay zero.
    BlockQ3_K& out = y[b];
    std::memset(out.scales, 0, sizeof out.scales);
    out.d = 0;
    if (max_scale != 0.0f) {
      const float iscale = -32.0f / max_scale;
      for (std::size_t g = 0; g < kQ3_KSubBlocks; ++g) {
        const auto wrapped =
            static_cast<std::int8_t>(detail::kquant_nearest_int(iscale * scales[g]) & 0xFF);
        const int code =
            std::clamp<int>(wrapped, -kQ3_KScaleOffset, kQ3_KScaleOffset - 1) + kQ3_KScaleOffset;
        out.scales[g % 8] |= static_cast<std::uint8_t>((code & 0x0F) << (g < 8 ? 0 : 4));
        out.scales[8 + g % 4] |= static_cast<std::uint8_t>((code >> 4) << (2 * (g / 4)));
      }
      out.d = f16_from_f32(1.0f / iscale);
    }

    // Every code again, against the scale as stored. A sub-block whose stored scale is zero keeps
    // its search's codes: GGML's `if (!d) continue` (NaN goes on).
    const float d = f32_from_f16(out.d);
    for (std::size_t g = 0; g < kQ3_KSubBlocks; ++g) {
      const float sub_d = d * static_cast<float>(q3_k_scale_code(out.scales, g) - kQ3_KScaleOffset);
      if (sub_d == 0.0f) continue;
      const float* sub = in + g * kQ3_KSubBlock;
      for (std::size_t i = 0; i < kQ3_KSubBlock; ++i) {
        codes[g * kQ3_KSubBlock + i] = static_cast<std::uint8_t>(
            q3_k_clamped(detail::kquant_nearest_int(sub[i] / sub_d)) + kQ3_KHalfRange);
      }
    }

    // Element e's high bit (code > 3) as bit e / 32 of hmask[e mod 32], its low bit pair at bits
    // 2 ((e mod 128) / 32) of qs[32 (e / 128) + e mod 32].
    std::memset(out.hmask, 0, sizeof out.hmask);
    std::memset(out.qs, 0, sizeof out.qs);
    for (std::size_t e = 0; e < kQ3_KBlock; ++e) {
      const int code = codes[e];
      out.hmask[e % 32] |= static_cast<std::uint8_t>((code >> 2) << (e / 32));
      out.qs[32 * (e / 128) + e % 32] |=
          static_cast<std::uint8_t>((code & 3) << (2 * (e % 128 / 32)));
    }
  }
}

void dequantize_q3_k(std::span<const BlockQ3_K> y, std::span<float> x) {
  detail::check_block_sizes("dequantize", DType::kQ3_K, x.size(), y.size());
  for (std::size_t b = 0; b < y.size(); ++b) {
    const BlockQ3_K& in = y[b];
    const float d = f32_from_f16(in.d);
    float* out = x.data() + b * kQ3_KBlock;
    for (std::size_t g = 0; g < kQ3_KSubBlocks; ++g) {
      const float sub_d = d * static_cast<float>(q3_k_scale_code(in.scales, g) - kQ3_KScaleOffset);
      for (std::size_t i = 0; i < kQ3_KSubBlock; ++i) {
        const std::size_t e = g * kQ3_KSubBlock + i;
        const int low = (in.qs[32 * (e / 128) + e % 32] >> (2 * (e % 128 / 32))) & 3;
        const int high = (in.hmask[e % 32] >> (e / 32)) & 1;
        out[e] = sub_d * static_cast<float>(low + 4 * high - kQ3_KHalfRange);
      }
    }
  }
}

}  // namespace numesh::runtime
