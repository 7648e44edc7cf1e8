#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>

#include "block_sizes.hpp"
#include "numesh/core/check.hpp"
#include "numesh/core/dtype.hpp"
#include "numesh/runtime/block_formats.hpp"

// GGML's Q8_0 (quantize_row_q8_0_ref and dequantize_row_q8_0 in ggml-quants.c), written from
// its definition. Every step is the f32 operation GGML's C performs, in the same order, because
// the point is the same bytes: a wider intermediate, or a roundf done as x + 0.5 in f32, would
// move codes that sit next to a rounding boundary.

namespace numesh::runtime {

namespace {

constexpr std::size_t kQ8_0Block = static_cast<std::size_t>(kQ8_0BlockElements);

// C's roundf (half away from zero) of a float of magnitude below 2^31, as an int. Not
// std::round: that is a libm call, which kept the quantizer at a quarter of q4_0's speed; this
// inlines and vectorizes. x - trunc(x) is exact for every float, so the halves are decided on the
// exact fraction (0.49999997 stays 0, where x + 0.5 in f32 would round to 1).
int round_half_away(float x) {
  const int t = static_cast<int>(x);  // truncates
  const float fraction = x - static_cast<float>(t);
  return t + (fraction >= 0.5f ? 1 : 0) - (fraction <= -0.5f ? 1 : 0);
}

}  // namespace

void quantize_q8_0(std::span<const float> x, std::span<BlockQ8_0> y) {
  detail::check_block_sizes("quantize", DType::kQ8_0, x.size(), y.size());
  for (std::size_t b = 0; b < y.size(); ++b) {
    const float* in = x.data() + b * kQ8_0Block;
    float amax = 0.0f;
    for (std::size_t j = 0; j < kQ8_0Block; ++j) {
      // Checked here, in the pass that reads the block anyway. GGML's MAX skips a NaN (it
      // compares false) and codes it by an undefined conversion; an infinity makes d infinite.
      NUMESH_CHECK(std::isfinite(in[j]), ValueError, "quantize q8_0: element {} is {}",
                   b * kQ8_0Block + j, in[j]);
      amax = std::max(amax, std::fabs(in[j]));
    }
    const float d = amax / 127.0f;
    // GGML's id = d ? 1/d : 0. A block below ~3.7e-37 has d <= 2^-128, whose reciprocal
    // overflows: GGML then converts roundf(x * inf) (inf, or NaN for a zero) to int8_t,
    // undefined in C. x86-64 builds of GGML, scalar or vectorized, get the "integer indefinite"
    // 0x80000000 from cvtt(s|p)s2si, whose low byte is 0: the codes of zero, which id = 0 gives
    // too. The scale is an f16 zero there, so the block dequantizes to zeros either way.
    const float reciprocal = d != 0.0f ? 1.0f / d : 0.0f;
    const float id = std::isfinite(reciprocal) ? reciprocal : 0.0f;
    BlockQ8_0& out = y[b];
    out.d = f16_from_f32(d);
    for (std::size_t j = 0; j < kQ8_0Block; ++j) {
      // |x * id| <= 127 * (1 + 2^-21) even for a subnormal d, so the rounded code fits.
      out.qs[j] = static_cast<std::int8_t>(round_half_away(in[j] * id));
    }
  }
}

void dequantize_q8_0(std::span<const BlockQ8_0> y, std::span<float> x) {
  detail::check_block_sizes("dequantize", DType::kQ8_0, x.size(), y.size());
  for (std::size_t b = 0; b < y.size(); ++b) {
    const float d = f32_from_f16(y[b].d);
    float* out = x.data() + b * kQ8_0Block;
    for (std::size_t j = 0; j < kQ8_0Block; ++j) out[j] = static_cast<float>(y[b].qs[j]) * d;
  }
}

}  // namespace numesh::runtime
