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

// GGML's Q5_0 (quantize_row_q5_0_ref and dequantize_row_q5_0 in ggml-quants.c), written from
// its definition: Q4_0's scheme with one bit more, the scale the block's extreme over -16 and the
// codes trunc(x / d + 16.5), at most 31, their low nibbles as Q4_0's and their fifth bits in a
// little-endian word. x * id and + 16.5 are two f32 roundings, as in GGML's C, so this file is
// compiled with -ffp-contract=off (runtime/CMakeLists.txt), as block_q4_0.cpp is.

namespace numesh::runtime {

namespace {

constexpr std::size_t kQ5_0Block = static_cast<std::size_t>(kQ5_0BlockElements);
constexpr std::size_t kQ5_0HalfBlock = kQ5_0Block / 2;

}  // namespace

void quantize_q5_0(std::span<const float> x, std::span<BlockQ5_0> y) {
  detail::check_block_sizes("quantize", DType::kQ5_0, x.size(), y.size());
  for (std::size_t b = 0; b < y.size(); ++b) {
    const float* in = x.data() + b * kQ5_0Block;
    const float max = detail::signed_extreme(in, kQ5_0Block, b * kQ5_0Block, "q5_0");
    // -0 for a block of zeros (0 / -16), stored as f16 0x8000 as GGML stores it.
    const float d = max / -16.0f;
    BlockQ5_0& out = y[b];
    out.d = f16_from_f32(d);
    // A reciprocal that overflows (a block below ~4.7e-38): as Q4_0 (block_q4_0.cpp), what
    // x86-64 builds of GGML write, every code 0, so every byte 0; the f16 scale is zero there.
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    if (!std::isfinite(id)) {
      std::fill(std::begin(out.qh), std::end(out.qh), std::uint8_t{0});
      std::fill(std::begin(out.qs), std::end(out.qs), std::uint8_t{0});
      continue;
    }
    std::uint32_t fifth_bits = 0;
    for (std::size_t j = 0; j < kQ5_0HalfBlock; ++j) {
      const std::uint32_t low = detail::offset_code<16>(in[j], id);
      const std::uint32_t high = detail::offset_code<16>(in[j + kQ5_0HalfBlock], id);
      out.qs[j] = static_cast<std::uint8_t>((low & 0x0F) | ((high & 0x0F) << 4));
      fifth_bits |= (low >> 4) << j;
      fifth_bits |= (high >> 4) << (j + kQ5_0HalfBlock);
    }
    for (std::size_t i = 0; i < 4; ++i)
      out.qh[i] = static_cast<std::uint8_t>(fifth_bits >> (8 * i));
  }
}

void dequantize_q5_0(std::span<const BlockQ5_0> y, std::span<float> x) {
  detail::check_block_sizes("dequantize", DType::kQ5_0, x.size(), y.size());
  for (std::size_t b = 0; b < y.size(); ++b) {
    const float d = f32_from_f16(y[b].d);
    const std::uint32_t fifth_bits = y[b].qh[0] | (std::uint32_t{y[b].qh[1]} << 8) |
                                     (std::uint32_t{y[b].qh[2]} << 16) |
                                     (std::uint32_t{y[b].qh[3]} << 24);
    float* out = x.data() + b * kQ5_0Block;
    for (std::size_t j = 0; j < kQ5_0HalfBlock; ++j) {
      const auto low = static_cast<int>((y[b].qs[j] & 0x0Fu) | (((fifth_bits >> j) & 1u) << 4));
      const auto high =
          static_cast<int>((y[b].qs[j] >> 4) | (((fifth_bits >> (j + kQ5_0HalfBlock)) & 1u) << 4));
      out[j] = static_cast<float>(low - 16) * d;
      out[j + kQ5_0HalfBlock] = static_cast<float>(high - 16) * d;
    }
  }
}

}  // namespace numesh::runtime
