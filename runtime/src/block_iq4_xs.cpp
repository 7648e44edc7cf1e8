#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>

#include "block_sizes.hpp"
#include "iq4_search.hpp"
#include "kquant_search.hpp"
#include "numesh/core/dtype.hpp"
#include "numesh/runtime/block_formats.hpp"

// GGML's IQ4_XS (quantize_iq4_xs without an importance matrix, and dequantize_row_iq4_xs, in
// ggml-quants.c), written from its definition: IQ4_NL's search on each sub-block of 32
// (iq4_search.hpp), the eight scales coded in 6 bits against the one of largest magnitude, and
// each index re-chosen against its sub-block's coded scale. Compiled with -ffp-contract=off
// (runtime/CMakeLists.txt), as GGML's libggml-base is compiled without FMA.

namespace numesh::runtime {

namespace {

constexpr std::size_t kIQ4_XSBlock = static_cast<std::size_t>(kIQ4_XSBlockElements);
constexpr std::size_t kSubBlock = 32;
constexpr std::size_t kSubBlocks = kIQ4_XSBlock / kSubBlock;

}  // namespace

void quantize_iq4_xs(std::span<const float> x, std::span<BlockIQ4_XS> y) {
  quantize_iq4_xs(x, y, kernel_level());
}

void quantize_iq4_xs(std::span<const float> x, std::span<BlockIQ4_XS> y, KernelLevel level) {
  detail::check_block_sizes("quantize", DType::kIQ4_XS, x.size(), y.size());
  for (std::size_t b = 0; b < y.size(); ++b) {
    const float* in = x.data() + b * kIQ4_XSBlock;
    detail::check_finite(in, kIQ4_XSBlock, b * kIQ4_XSBlock, "iq4_xs");
    float scales[kSubBlocks];
    for (std::size_t g = 0; g < kSubBlocks; ++g)
      scales[g] = detail::iq4_search_scale(in + kSubBlock * g, level);
    // The first scale of largest magnitude (from +0, strictly larger), as GGML's loop keeps it.
    const float max_scale = detail::first_largest_magnitude(scales, kSubBlocks).value;
    const float d = -max_scale / 32.0f;
    BlockIQ4_XS& out = y[b];
    out.d = f16_from_f32(d);
    out.scales_h = 0;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    for (std::size_t g = 0; g < kSubBlocks; ++g) {
      const int code = std::clamp(detail::kquant_nearest_int(id * scales[g]), -32, 31);
      const float dl = d * static_cast<float>(code);
      const float idl = dl != 0.0f ? 1.0f / dl : 0.0f;
      const float* sub = in + kSubBlock * g;
      std::uint8_t* qs = out.qs + 16 * g;
      detail::iq4_pack_nearest(sub, idl, qs, level);
      const auto stored = static_cast<unsigned>(code + 32);
      if (g % 2 == 0) {
        out.scales_l[g / 2] = static_cast<std::uint8_t>(stored & 0x0Fu);
      } else {
        out.scales_l[g / 2] =
            static_cast<std::uint8_t>(out.scales_l[g / 2] | ((stored & 0x0Fu) << 4));
      }
      out.scales_h = static_cast<std::uint16_t>(out.scales_h | ((stored >> 4) << (2 * g)));
    }
  }
}

void dequantize_iq4_xs(std::span<const BlockIQ4_XS> y, std::span<float> x) {
  detail::check_block_sizes("dequantize", DType::kIQ4_XS, x.size(), y.size());
  for (std::size_t b = 0; b < y.size(); ++b) {
    const BlockIQ4_XS& block = y[b];
    const float d = f32_from_f16(block.d);
    float* out = x.data() + b * kIQ4_XSBlock;
    for (std::size_t g = 0; g < kSubBlocks; ++g) {
      const unsigned code = ((block.scales_l[g / 2] >> (4 * (g % 2))) & 0x0Fu) |
                            (((block.scales_h >> (2 * g)) & 3u) << 4);
      const float dl = d * static_cast<float>(static_cast<int>(code) - 32);
      const std::uint8_t* qs = block.qs + 16 * g;
      float* sub = out + kSubBlock * g;
      for (std::size_t j = 0; j < 16; ++j) {
        sub[j] = dl * static_cast<float>(kIQ4_NLValues[qs[j] & 0x0Fu]);
        sub[j + 16] = dl * static_cast<float>(kIQ4_NLValues[qs[j] >> 4]);
      }
    }
  }
}

}  // namespace numesh::runtime
