#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <iterator>

#include "block_sizes.hpp"
#include "kquant_minimums.hpp"
#include "numesh/core/dtype.hpp"
#include "numesh/runtime/block_formats.hpp"

// GGML's Q5_K (quantize_row_q5_K_ref and dequantize_row_q5_K in ggml-quants.c), written from its
// definition: Q4_K's search and scale coding (kquant_minimums.hpp) with 5-bit codes and
// make_qkx2_quants's trials for them, the low 4 bits packed as Q4_K's nibbles and the fifth bits
// in 32 bytes of their own. Compiled with -ffp-contract=off as its search is
// (runtime/CMakeLists.txt).

namespace numesh::runtime {

namespace {

constexpr std::size_t kQ5_KBlock = static_cast<std::size_t>(kQ5_KBlockElements);
// make_qkx2_quants(32, 31, ..., rmin -0.5, rdelta 0.1, nstep 15): 16 trial step counts,
// 30.5 .. 32.
constexpr detail::Qkx2Search kQ5_KSearch{31, -0.5f, 0.1f, 15};

}  // namespace

void quantize_q5_k(std::span<const float> x, std::span<BlockQ5_K> y) {
  quantize_q5_k(x, y, kernel_level());
}

void quantize_q5_k(std::span<const float> x, std::span<BlockQ5_K> y, KernelLevel level) {
  detail::check_block_sizes("quantize", DType::kQ5_K, x.size(), y.size());
  for (std::size_t b = 0; b < y.size(); ++b) {
    const float* in = x.data() + b * kQ5_KBlock;
    // Checked before the block is touched, so a refused block is left as it was.
    detail::check_finite(in, kQ5_KBlock, b * kQ5_KBlock, "q5_k");
    std::uint8_t codes[kQ5_KBlock];
    BlockQ5_K& out = y[b];
    detail::quantize_minimum_super_block(in, kQ5_KSearch, codes, out.scales, out.d, out.dmin,
                                         level);
    // 64-element chunks c: elements l and l + 32 share byte l of the chunk's 32 nibble bytes, and
    // their fifth bits are bits 2c and 2c + 1 of qh[l].
    std::fill(std::begin(out.qh), std::end(out.qh), std::uint8_t{0});
    for (std::size_t c = 0; c < kQ5_KBlock / 64; ++c) {
      for (std::size_t l = 0; l < 32; ++l) {
        const unsigned low = codes[64 * c + l];
        const unsigned high = codes[64 * c + 32 + l];
        out.qs[32 * c + l] = static_cast<std::uint8_t>((low & 0x0F) | ((high & 0x0F) << 4));
        out.qh[l] = static_cast<std::uint8_t>(out.qh[l] | ((low >> 4) << (2 * c)) |
                                              ((high >> 4) << (2 * c + 1)));
      }
    }
  }
}

void dequantize_q5_k(std::span<const BlockQ5_K> y, std::span<float> x) {
  detail::check_block_sizes("dequantize", DType::kQ5_K, x.size(), y.size());
  for (std::size_t b = 0; b < y.size(); ++b) {
    const BlockQ5_K& in = y[b];
    const float d = f32_from_f16(in.d);
    const float dmin = f32_from_f16(in.dmin);
    float* out = x.data() + b * kQ5_KBlock;
    for (std::size_t c = 0; c < kQ5_KBlock / 64; ++c) {
      const auto [d_low, min_low, d_high, min_high] =
          detail::kquant_chunk_scales(in.scales, d, dmin, c);
      for (std::size_t l = 0; l < 32; ++l) {
        const unsigned byte = in.qs[32 * c + l];
        const unsigned low = (byte & 0x0F) | (((in.qh[l] >> (2 * c)) & 1u) << 4);
        const unsigned high = (byte >> 4) | (((in.qh[l] >> (2 * c + 1)) & 1u) << 4);
        out[64 * c + l] = d_low * static_cast<float>(low) - min_low;
        out[64 * c + 32 + l] = d_high * static_cast<float>(high) - min_high;
      }
    }
  }
}

}  // namespace numesh::runtime
