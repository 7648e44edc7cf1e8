#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <iterator>

#include "block_sizes.hpp"
#include "numesh/core/check.hpp"
#include "numesh/core/dtype.hpp"
#include "numesh/runtime/block_formats.hpp"
#include "offset_codes.hpp"

// GGML's Q4_0 (quantize_row_q4_0_ref and dequantize_row_q4_0 in ggml-quants.c), written from
// its definition. Every step is the f32 operation GGML's C performs, in the same order, because
// the point is the same bytes: in particular x * id and + 8.5 are two f32 roundings (a product
// just below k - 8.5 can round up to k after the addition), so this file is compiled with
// -ffp-contract=off (runtime/CMakeLists.txt): GCC would otherwise fuse them into one
// multiply-add at -O2 on an FMA machine, even across the two statements below.

namespace numesh::runtime {

namespace {

constexpr std::size_t kQ4_0Block = static_cast<std::size_t>(kQ4_0BlockElements);
constexpr std::size_t kQ4_0HalfBlock = kQ4_0Block / 2;

}  // namespace

void quantize_q4_0(std::span<const float> x, std::span<BlockQ4_0> y) {
  detail::check_block_sizes("quantize", DType::kQ4_0, x.size(), y.size());
  for (std::size_t b = 0; b < y.size(); ++b) {
    const float* in = x.data() + b * kQ4_0Block;
    // [5, -5] scales by 5 / -8 and [-5, 5] by -5 / -8.
    const float max = detail::signed_extreme(in, kQ4_0Block, b * kQ4_0Block, "q4_0");
    // -0 for a block of zeros (0 / -8): GGML stores that scale as f16 0x8000.
    const float d = max / -8.0f;
    BlockQ4_0& out = y[b];
    out.d = f16_from_f32(d);
    // A block below ~2.4e-38 has |d| <= 2^-128, whose reciprocal overflows: GGML then converts
    // x * inf + 8.5 (inf, or NaN for a zero) to int8_t, undefined in C. x86-64 builds of GGML,
    // scalar or vectorized, get the "integer indefinite" 0x80000000 from cvtt(s|p)s2si, whose
    // low byte is 0, so every code is min(15, 0) = 0; numesh writes those bytes. The scale is an
    // f16 zero there, so the block dequantizes to zeros either way.
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    if (!std::isfinite(id)) {
      std::fill(std::begin(out.qs), std::end(out.qs), std::uint8_t{0});
      continue;
    }
    for (std::size_t j = 0; j < kQ4_0HalfBlock; ++j) {
      const std::uint32_t low = detail::offset_code<8>(in[j], id);
      const std::uint32_t high = detail::offset_code<8>(in[j + kQ4_0HalfBlock], id);
      out.qs[j] = static_cast<std::uint8_t>(low | (high << 4));
    }
  }
}

void dequantize_q4_0(std::span<const BlockQ4_0> y, std::span<float> x) {
  detail::check_block_sizes("dequantize", DType::kQ4_0, x.size(), y.size());
  for (std::size_t b = 0; b < y.size(); ++b) {
    const float d = f32_from_f16(y[b].d);
    float* out = x.data() + b * kQ4_0Block;
    for (std::size_t j = 0; j < kQ4_0HalfBlock; ++j) {
      const int low = (y[b].qs[j] & 0x0F) - 8;
      const int high = (y[b].qs[j] >> 4) - 8;
      out[j] = static_cast<float>(low) * d;
      out[j + kQ4_0HalfBlock] = static_cast<float>(high) * d;
    }
  }
}

}  // namespace numesh::runtime
