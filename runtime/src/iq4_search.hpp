#pragma once

#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>

#include "kquant_search.hpp"
#include "numesh/core/dtype.hpp"
#include "numesh/runtime/cpu_features.hpp"

// PRIVATE to runtime/src: GGML's search for a run of 32 weights' scale over the IQ4_NL codebook
// (quantize_row_iq4_nl_impl in ggml-quants.c, without an importance matrix: weights x^2, seven
// trial scales either side), in GGML's f32 operations and order, which iq4_search.cpp,
// block_iq4_nl.cpp and block_iq4_xs.cpp are compiled to keep (-ffp-contract=off).

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
/// d = max / (t - 127), t = -7 .. 7, each taken only where it fits strictly better. The 16 fits
/// are independent, so from `level` kAvx2 they run side by side, one a vector lane, each lane's
/// sums taken in GGML's order: every level returns the same bits (iq4_search.cpp).
[[nodiscard]] float iq4_search_scale(const float* x, KernelLevel level) noexcept;

/// Packs the indices of the codebook values nearest id x[j] (iq4_nearest_index) of a run of 32:
/// qs[j] = index(j) | index(j + 16) << 4 for j < 16, as IQ4_NL and IQ4_XS store them. Every
/// level writes the same bytes.
void iq4_pack_nearest(const float* x, float id, std::uint8_t* qs, KernelLevel level) noexcept;

}  // namespace numesh::runtime::detail
