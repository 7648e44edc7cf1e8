#include "numesh/ops/rope_scaling.hpp"

#include <cmath>

#include "numesh/core/check.hpp"
#include "numesh/core/error.hpp"

namespace numesh::ops {

std::string_view to_string(RopeScaling::Kind kind) noexcept {
  switch (kind) {
    case RopeScaling::Kind::kNone:
      return "none";
    case RopeScaling::Kind::kLinear:
      return "linear";
    case RopeScaling::Kind::kLlama3:
      return "llama3";
    case RopeScaling::Kind::kFactors:
      return "factors";
  }
  return "?";
}

void validate(const RopeScaling& s) {
  if (s.kind == RopeScaling::Kind::kNone) return;
  if (s.kind == RopeScaling::Kind::kFactors) {
    NUMESH_CHECK(!s.frequency_factors.empty(), ValueError, "rope scaling factors: none given");
    for (std::size_t i = 0; i < s.frequency_factors.size(); ++i) {
      NUMESH_CHECK(std::isfinite(s.frequency_factors[i]) && s.frequency_factors[i] > 0.0,
                   ValueError, "rope scaling factors: factor {} is {}, not a positive number", i,
                   s.frequency_factors[i]);
    }
    return;
  }
  NUMESH_CHECK(std::isfinite(s.factor) && s.factor > 0.0, ValueError,
               "rope scaling {}: factor {} must be positive", to_string(s.kind), s.factor);
  if (s.kind != RopeScaling::Kind::kLlama3) return;
  NUMESH_CHECK(
      std::isfinite(s.low_freq_factor) && std::isfinite(s.high_freq_factor) &&
          s.low_freq_factor > 0.0 && s.low_freq_factor < s.high_freq_factor,
      ValueError,
      "rope scaling llama3: low_freq_factor {} and high_freq_factor {} must satisfy 0 < low < high",
      s.low_freq_factor, s.high_freq_factor);
  NUMESH_CHECK(s.original_max_position > 0, ValueError,
               "rope scaling llama3: original_max_position {} must be positive",
               s.original_max_position);
}

}  // namespace numesh::ops
