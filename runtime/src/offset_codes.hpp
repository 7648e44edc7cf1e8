#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "numesh/core/check.hpp"
#include "numesh/core/error.hpp"

// PRIVATE to runtime/src: what GGML's Q4_0 and Q5_0 quantizers (block_q4_0.cpp, block_q5_0.cpp)
// share: the element a block is scaled by, and the codes q - kOffset of the scaled elements. Both
// files are compiled with -ffp-contract=off (runtime/CMakeLists.txt), which these inline
// functions need (x * id and + kOffset + 0.5 are two f32 roundings, as in GGML's C).

namespace numesh::runtime::detail {

/// The signed element of largest magnitude of in[0, n): a strict comparison keeps the first of
/// equal magnitudes (so [5, -5] gives 5 and [-5, 5] gives -5) and keeps +0 for a block of zeros,
/// whatever their signs: GGML's choices, which decide the sign of the block's scale.
/// Throws: ValueError "quantize FORMAT: element I is V" for the first non-finite element, I
/// counted from `first`.
inline float signed_extreme(const float* in, std::size_t n, std::size_t first,
                            std::string_view format) {
  float amax = 0.0f;
  float max = 0.0f;
  for (std::size_t j = 0; j < n; ++j) {
    NUMESH_CHECK(std::isfinite(in[j]), ValueError, "quantize {}: element {} is {}", format,
                 first + j, in[j]);
    if (amax < std::fabs(in[j])) {
      amax = std::fabs(in[j]);
      max = in[j];
    }
  }
  return max;
}

/// The code of x * id with kOffset added: trunc(x * id + kOffset + 0.5), at most 2 kOffset - 1
/// (GGML's MIN(2 kOffset - 1, (int8_t)(x * id + kOffset + 0.5f))). The scale is the block's
/// extreme divided by -kOffset, so that extreme is code 0 and the block's codes fall in
/// [-kOffset, kOffset] * (1 + a few ulps) + kOffset + 0.5 > 0: truncation is floor, and only the
/// opposite extreme (2 kOffset) is clamped.
template <int kOffset>
std::uint32_t offset_code(float x, float id) {
  const float scaled = x * id;
  const float shifted = scaled + (static_cast<float>(kOffset) + 0.5f);
  return static_cast<std::uint32_t>(std::min(2 * kOffset - 1, static_cast<int>(shifted)));
}

}  // namespace numesh::runtime::detail
