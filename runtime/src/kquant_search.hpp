#pragma once

#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "numesh/core/check.hpp"
#include "numesh/core/error.hpp"

// PRIVATE to runtime/src: steps GGML's K-format reference quantizers share (block_q3_k.cpp,
// block_q6_k.cpp and kquant_minimums.cpp): numesh's refusal of non-finite input, GGML's rounding,
// and the search for a run's extreme that Q3_K and Q6_K start with, on a sub-block's values and
// again on the super-block's scales.

namespace numesh::runtime::detail {

/// Refuses the first non-finite value of in[0, n) with ValueError "quantize FORMAT: element I
/// is V", I counted from `first`.
inline void check_finite(const float* in, std::size_t n, std::size_t first,
                         std::string_view format) {
  for (std::size_t i = 0; i < n; ++i) {
    NUMESH_CHECK(std::isfinite(in[i]), ValueError, "quantize {}: element {} is {}", format,
                 first + i, in[i]);
  }
}

/// GGML's nearest_int: adding 1.5 * 2^23 leaves round-half-even(v) in the sum's low mantissa
/// bits for |v| < 2^22. GGML asserts that range only in debug builds; beyond it (and for inf or
/// NaN) release builds return this same bit arithmetic, which is defined, so it is what numesh
/// returns.
inline int kquant_nearest_int(float v) {
  const float shifted = v + 12582912.0f;
  return (std::bit_cast<std::int32_t>(shifted) & 0x007FFFFF) - 0x00400000;
}

/// The first value of largest magnitude of x[0, n) and that magnitude, as GGML's loops find it:
/// from +0, taking a value only when its magnitude is strictly larger (so never a NaN, and the
/// first of equal magnitudes).
struct LargestMagnitude {
  float value = 0.0f;
  float magnitude = 0.0f;
};

inline LargestMagnitude first_largest_magnitude(const float* x, std::size_t n) {
  LargestMagnitude largest;
  for (std::size_t i = 0; i < n; ++i) {
    const float magnitude = std::fabs(x[i]);
    if (magnitude > largest.magnitude) largest = {x[i], magnitude};
  }
  return largest;
}

}  // namespace numesh::runtime::detail
