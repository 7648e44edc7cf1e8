#include "numesh/ops/rope_scaling.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <numbers>
#include <string>
#include <utility>
#include <vector>

#include "numesh/core/check.hpp"
#include "numesh/core/error.hpp"
#include "numesh/ops/kernels/rope.hpp"

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

std::optional<RopeScaling> llama3_of_divisors(std::span<const double> divisors, std::int64_t d,
                                              double theta) {
  const std::vector<double> base = rope_frequencies(d, theta);
  if (divisors.empty() || divisors.size() != base.size()) return std::nullopt;
  constexpr double kTolerance = 1e-5;
  const auto near = [](double a, double b) { return std::abs(a - b) <= kTolerance * std::abs(b); };
  const double factor = *std::max_element(divisors.begin(), divisors.end());
  if (!std::isfinite(factor) || !(factor > 1.0) || near(factor, 1.0)) return std::nullopt;
  // In the band the blend s = (1 / divisor - 1 / factor) / (1 - 1 / factor) is a line in the
  // inverse wavelength x = f / (2 pi): s = (L x - low) / (high - low).
  std::vector<std::pair<double, double>> band;  // (x, s)
  for (std::size_t i = 0; i < base.size(); ++i) {
    if (near(divisors[i], 1.0) || near(divisors[i], factor)) continue;
    band.emplace_back(base[i] / (2.0 * std::numbers::pi),
                      (1.0 / divisors[i] - 1.0 / factor) / (1.0 - 1.0 / factor));
  }
  if (band.empty()) return std::nullopt;
  // With low 1: s = a x + b, high = 1 - 1 / b and L = -a / b. Two or more pairs in the band fix
  // the line through its ends; one pair fixes it with Llama 3.1's high / low of 4 (checked below
  // against every divisor, as the two-pair line is).
  double a = 0.0, b = -1.0 / 3.0;
  if (band.size() >= 2 && band.front().first != band.back().first) {
    a = (band.back().second - band.front().second) / (band.back().first - band.front().first);
    b = band.front().second - a * band.front().first;
  } else {
    a = (band.front().second - b) / band.front().first;
  }
  if (!(a > 0.0) || !(b < 0.0)) return std::nullopt;
  const std::int64_t length = std::llround(-a / b);
  if (length <= 0) return std::nullopt;
  const auto gives_divisors = [&](const RopeScaling& s) {
    const std::vector<double> scaled = rope_frequencies(d, theta, s);
    for (std::size_t i = 0; i < base.size(); ++i) {
      if (!near(base[i] / scaled[i], divisors[i])) return false;
    }
    return true;
  };
  // high_freq_factor as a config.json writes it (4, not 3.9999998) when that still fits.
  const double high = 1.0 - 1.0 / b;
  const double rounded = std::stod(fmt::format("{:.6g}", high));
  for (const double h : {rounded, high}) {
    if (!(h > 1.0)) continue;
    const RopeScaling s = RopeScaling::llama3(factor, 1.0, h, length);
    if (gives_divisors(s)) return s;
  }
  return std::nullopt;
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
