#pragma once

#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>

#include "kquant_search.hpp"
#include "numesh/core/dtype.hpp"

// PRIVATE to runtime/src: GGML's search for a run of 32 weights' scale over the IQ4_NL codebook
// (quantize_row_iq4_nl_impl in ggml-quants.c, without an importance matrix: weights x^2, seven
// trial scales either side), in GGML's f32 operations and order, which block_iq4_nl.cpp is
// compiled to keep (-ffp-contract=off).

namespace numesh::runtime::detail {

/// GGML's best_index_int8 over kIQ4_NLValues: the index of the value nearest v, the upper of two
/// equally near (v below the first or above the last value: that end's index; NaN: 15).
inline int iq4_nearest_index(float v) noexcept {
  constexpr const std::array<std::int8_t, 16>& values = kIQ4_NLValues;
  if (v <= static_cast<float>(values[0])) return 0;
  if (v >= static_cast<float>(values[15])) return 15;
  int low = 0, high = 15;
  while (high - low > 1) {
    const int middle = (low + high) / 2;
    if (v < static_cast<float>(values[static_cast<std::size_t>(middle)])) {
      high = middle;
    } else {
      low = middle;
    }
  }
  const auto below = static_cast<float>(values[static_cast<std::size_t>(high - 1)]);
  const auto above = static_cast<float>(values[static_cast<std::size_t>(high)]);
  return v - below < above - v ? high - 1 : high;
}

/// The scale GGML's search gives 32 weights x (finite) over the codebook: 0 when every magnitude
/// is below 1e-15; otherwise the least weighted squared error scale (weights x^2) of the nearest
/// values to x / d for d = max / 127 (max the first value of largest magnitude), then for
/// d = max / (t - 127), t = -7 .. 7, each taken only where it fits strictly better.
inline float iq4_search_scale(const float* x) noexcept {
  constexpr const std::array<std::int8_t, 16>& values = kIQ4_NLValues;
  constexpr std::size_t kRun = 32;
  constexpr int kTrials = 7;
  const LargestMagnitude largest = first_largest_magnitude(x, kRun);
  if (largest.magnitude < 1e-15f) return 0.0f;
  const float max = largest.value;
  // The weighted sums of v x and v^2 over the nearest values v to id x.
  struct Fit {
    float qx = 0.0f, q2 = 0.0f;
  };
  const auto fit = [&](float id) {
    Fit f;
    for (std::size_t j = 0; j < kRun; ++j) {
      const float weight = x[j] * x[j];
      const auto q =
          static_cast<float>(values[static_cast<std::size_t>(iq4_nearest_index(id * x[j]))]);
      f.qx += weight * q * x[j];
      f.q2 += weight * q * q;
    }
    return f;
  };
  // GGML's first guess, -max / values[0]: the extreme at +127, beyond the last value (113).
  const float first = -max / static_cast<float>(values[0]);
  const Fit f = fit(1.0f / first);
  float d = f.q2 > 0.0f ? f.qx / f.q2 : 0.0f;
  float best = d * f.qx;
  for (int t = -kTrials; t <= kTrials; ++t) {
    const Fit trial = fit(static_cast<float>(t + values[0]) / max);
    if (trial.q2 > 0.0f && trial.qx * trial.qx > best * trial.q2) {
      d = trial.qx / trial.q2;
      best = d * trial.qx;
    }
  }
  return d;
}

}  // namespace numesh::runtime::detail
