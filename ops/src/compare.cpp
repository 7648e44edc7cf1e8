#include "numesh/ops/compare.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cmath>

#include "numesh/core/check.hpp"
#include "numesh/core/error.hpp"

namespace numesh::ops {

namespace {

// Both non-finite and the same value: NaN and NaN (any payload), or the same infinity.
bool same_nonfinite(double a, double b) noexcept {
  return (std::isnan(a) && std::isnan(b)) || (std::isinf(a) && a == b);
}

template <typename Got, typename Want>
Comparison compare_values(std::span<const Got> got, std::span<const Want> want,
                          std::span<const std::int64_t> shape, const CompareOptions& options) {
  NUMESH_CHECK(got.size() == want.size(), ShapeError,
               "compare: the output has {} elements and the reference {}", got.size(), want.size());
  Comparison c;
  c.shape.assign(shape.begin(), shape.end());
  c.elements = static_cast<std::int64_t>(want.size());
  double max_want = 0.0;
  for (std::size_t i = 0; i < want.size(); ++i) {
    const auto g = static_cast<double>(got[i]);
    const auto w = static_cast<double>(want[i]);
    const auto index = static_cast<std::int64_t>(i);
    const bool g_finite = std::isfinite(g), w_finite = std::isfinite(w);
    if (!w_finite) {
      if (c.nonfinite_reference++ == 0) c.first_nonfinite_reference = index;
    } else {
      max_want = std::max(max_want, std::abs(w));  // w is finite: no NaN reaches std::max
    }
    if (g_finite && w_finite) {
      const double err = std::abs(g - w);
      if (c.worst_index < 0 || err > c.max_abs_error) {
        c.max_abs_error = err;
        c.worst_index = index;
        c.got_at_worst = g;
        c.want_at_worst = w;
      }
    } else if (!(same_nonfinite(g, w))) {
      if (c.nonfinite_mismatches++ == 0) {
        c.first_mismatch = index;
        c.got_at_mismatch = g;
        c.want_at_mismatch = w;
      }
    }
  }
  c.scale = std::max(max_want, options.scale_floor);
  c.relative_error = c.max_abs_error / c.scale;
  return c;
}

}  // namespace

std::string Comparison::index_text(std::int64_t i) const {
  if (shape.empty()) return fmt::format("[{}]", i);
  std::vector<std::int64_t> coords(shape.size(), 0);
  for (std::size_t d = shape.size(); d-- > 0;) {
    const std::int64_t extent = shape[d] > 0 ? shape[d] : 1;
    coords[d] = i % extent;
    i /= extent;
  }
  return fmt::format("[{}]", fmt::join(coords, ", "));
}

std::string Comparison::describe() const {
  if (elements == 0) return "nothing to compare (0 elements)";
  std::string out;
  if (nonfinite_mismatches > 0) {
    out = fmt::format("got {:.7g} at {} where the reference is {:.7g} ({} non-finite mismatch{}); ",
                      got_at_mismatch, index_text(first_mismatch), want_at_mismatch,
                      nonfinite_mismatches, nonfinite_mismatches == 1 ? "" : "es");
  }
  if (worst_index >= 0) {
    out += fmt::format("max relative error {:.2e} at {}: got {:.7g}, want {:.7g}, scale {:.3g}",
                       relative_error, index_text(worst_index), got_at_worst, want_at_worst, scale);
  } else {
    out += "no element is finite in both";
  }
  if (nonfinite_reference > 0) {
    out += fmt::format("; {} of {} reference elements are not finite (the first at {})",
                       nonfinite_reference, elements, index_text(first_nonfinite_reference));
  }
  return out;
}

Comparison compare(std::span<const float> got, std::span<const float> want,
                   std::span<const std::int64_t> shape, const CompareOptions& options) {
  return compare_values(got, want, shape, options);
}

Comparison compare(std::span<const float> got, std::span<const double> want,
                   std::span<const std::int64_t> shape, const CompareOptions& options) {
  return compare_values(got, want, shape, options);
}

Comparison compare(std::span<const double> got, std::span<const double> want,
                   std::span<const std::int64_t> shape, const CompareOptions& options) {
  return compare_values(got, want, shape, options);
}

Comparison compare(const runtime::HostTensor& got, const runtime::HostTensor& want,
                   const CompareOptions& options) {
  NUMESH_CHECK(got.shape == want.shape && got.data.size() == want.data.size(), ShapeError,
               "compare: the output is [{}] and the reference [{}]", fmt::join(got.shape, ", "),
               fmt::join(want.shape, ", "));
  return compare_values(std::span<const float>(got.data), std::span<const float>(want.data),
                        std::span<const std::int64_t>(want.shape), options);
}

}  // namespace numesh::ops
