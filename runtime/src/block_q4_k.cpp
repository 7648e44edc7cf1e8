#include <cstddef>
#include <cstdint>

#include "block_sizes.hpp"
#include "kquant_minimums.hpp"
#include "numesh/core/dtype.hpp"
#include "numesh/runtime/block_formats.hpp"

// GGML's Q4_K (quantize_row_q4_K_ref and dequantize_row_q4_K in ggml-quants.c), written from its
// definition: the search and the scale coding it shares with Q5_K (kquant_minimums.hpp), with
// 4-bit codes and make_qkx2_quants's trials for them, and the nibbles packed as GGML packs them.
// Compiled with -ffp-contract=off as its search is (runtime/CMakeLists.txt).

namespace numesh::runtime {

namespace {

constexpr std::size_t kQ4_KBlock = static_cast<std::size_t>(kQ4_KBlockElements);
// make_qkx2_quants(32, 15, ..., rmin -1, rdelta 0.1, nstep 20): 21 trial step counts, 14 .. 16.
constexpr detail::Qkx2Search kQ4_KSearch{15, -1.0f, 0.1f, 20};

}  // namespace

void quantize_q4_k(std::span<const float> x, std::span<BlockQ4_K> y) {
  quantize_q4_k(x, y, kernel_level());
}

void quantize_q4_k(std::span<const float> x, std::span<BlockQ4_K> y, KernelLevel level) {
  detail::check_block_sizes("quantize", DType::kQ4_K, x.size(), y.size());
  for (std::size_t b = 0; b < y.size(); ++b) {
    const float* in = x.data() + b * kQ4_KBlock;
    // Checked before the block is touched, so a refused block is left as it was.
    detail::check_finite(in, kQ4_KBlock, b * kQ4_KBlock, "q4_k");
    std::uint8_t codes[kQ4_KBlock];
    BlockQ4_K& out = y[b];
    detail::quantize_minimum_super_block(in, kQ4_KSearch, codes, out.scales, out.d, out.dmin,
                                         level);
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
  detail::check_block_sizes("dequantize", DType::kQ4_K, x.size(), y.size());
  for (std::size_t b = 0; b < y.size(); ++b) {
    const BlockQ4_K& in = y[b];
    const float d = f32_from_f16(in.d);
    const float dmin = f32_from_f16(in.dmin);
    float* out = x.data() + b * kQ4_KBlock;
    for (std::size_t c = 0; c < kQ4_KBlock / 64; ++c) {
      const auto [d_low, min_low, d_high, min_high] =
          detail::kquant_chunk_scales(in.scales, d, dmin, c);
      for (std::size_t l = 0; l < 32; ++l) {
        const std::uint8_t byte = in.qs[32 * c + l];
        out[64 * c + l] = d_low * static_cast<float>(byte & 0x0F) - min_low;
        out[64 * c + 32 + l] = d_high * static_cast<float>(byte >> 4) - min_high;
      }
    }
  }
}

}  // namespace numesh::runtime
