#pragma once

#include <immintrin.h>

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

// ---- Eight runs at once (AVX2): the K formats' searches, one run a lane ----

/// kquant_nearest_int on each lane of v.
__attribute__((target("avx2"))) inline __m256i kquant_nearest_int8(__m256 v) {
  const __m256i bits = _mm256_castps_si256(_mm256_add_ps(v, _mm256_set1_ps(12582912.0f)));
  return _mm256_sub_epi32(_mm256_and_si256(bits, _mm256_set1_epi32(0x007FFFFF)),
                          _mm256_set1_epi32(0x00400000));
}

/// Eight runs of `n` values, run r at in + r n, as n vectors: lane r of x[i] is in[r n + i].
__attribute__((target("avx2"))) inline void runs_to_lanes8(const float* in, std::size_t n,
                                                           __m256* x) {
  alignas(32) float column[8];
  for (std::size_t i = 0; i < n; ++i) {
    for (std::size_t r = 0; r < 8; ++r) column[r] = in[r * n + i];
    x[i] = _mm256_load_ps(column);
  }
}

/// The inverse for codes (0 .. 255): out[r n + i] = lane r of codes[i].
__attribute__((target("avx2"))) inline void lanes8_to_runs(const __m256i* codes, std::size_t n,
                                                           std::uint8_t* out) {
  alignas(32) std::int32_t lanes[8];
  for (std::size_t i = 0; i < n; ++i) {
    _mm256_store_si256(reinterpret_cast<__m256i*>(lanes), codes[i]);
    for (std::size_t r = 0; r < 8; ++r) out[r * n + i] = static_cast<std::uint8_t>(lanes[r]);
  }
}

}  // namespace numesh::runtime::detail
