#pragma once

#include <cmath>
#include <cstddef>
#include <string_view>

#include "numesh/core/check.hpp"
#include "numesh/core/error.hpp"

// PRIVATE to runtime/src: what GGML's Q4_0 and Q5_0 quantizers (block_q4_0.cpp, block_q5_0.cpp)
// scale a block by.

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

}  // namespace numesh::runtime::detail
