#include <cstddef>
#include <cstdint>

#include "block_sizes.hpp"
#include "iq4_search.hpp"
#include "numesh/core/dtype.hpp"
#include "numesh/runtime/block_formats.hpp"

// GGML's IQ4_NL (quantize_iq4_nl without an importance matrix, and dequantize_row_iq4_nl, in
// ggml-quants.c), written from its definition: iq4_search_scale's scale (iq4_search.hpp), stored
// as f16, and each element's index re-chosen against that scale in f32, packed as Q4_0 packs
// its codes. Compiled with -ffp-contract=off (runtime/CMakeLists.txt), as GGML's libggml-base is
// compiled without FMA.

namespace numesh::runtime {

namespace {

constexpr std::size_t kIQ4_NLBlock = static_cast<std::size_t>(kIQ4_NLBlockElements);
constexpr std::size_t kIQ4_NLHalfBlock = kIQ4_NLBlock / 2;

}  // namespace

void quantize_iq4_nl(std::span<const float> x, std::span<BlockIQ4_NL> y) {
  quantize_iq4_nl(x, y, kernel_level());
}

void quantize_iq4_nl(std::span<const float> x, std::span<BlockIQ4_NL> y, KernelLevel level) {
  detail::check_block_sizes("quantize", DType::kIQ4_NL, x.size(), y.size());
  for (std::size_t b = 0; b < y.size(); ++b) {
    const float* in = x.data() + b * kIQ4_NLBlock;
    detail::check_finite(in, kIQ4_NLBlock, b * kIQ4_NLBlock, "iq4_nl");
    const float d = detail::iq4_search_scale(in, level);
    BlockIQ4_NL& out = y[b];
    out.d = f16_from_f32(d);
    // GGML re-chooses against the f32 scale, not its f16: `scales[0] ? 1/scales[0] : 0`.
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    detail::iq4_pack_nearest(in, id, out.qs, level);
  }
}

void dequantize_iq4_nl(std::span<const BlockIQ4_NL> y, std::span<float> x) {
  detail::check_block_sizes("dequantize", DType::kIQ4_NL, x.size(), y.size());
  for (std::size_t b = 0; b < y.size(); ++b) {
    const float d = f32_from_f16(y[b].d);
    float* out = x.data() + b * kIQ4_NLBlock;
    for (std::size_t j = 0; j < kIQ4_NLHalfBlock; ++j) {
      out[j] = d * static_cast<float>(kIQ4_NLValues[y[b].qs[j] & 0x0Fu]);
      out[j + kIQ4_NLHalfBlock] = d * static_cast<float>(kIQ4_NLValues[y[b].qs[j] >> 4]);
    }
  }
}

}  // namespace numesh::runtime
