#pragma once

#include <cstdint>
#include <limits>
#include <span>
#include <string>
#include <vector>

#include "numesh/runtime/tensor.hpp"

// The one comparison of an output with its reference that every test and every CLI check
// uses. It sees every wrong answer: a NaN or an infinity where the reference is finite (or the
// reverse, or a different non-finite value) is a mismatch reported by index, whatever the
// finite elements do; the finite elements are measured as max |got - want| / max |want|, with
// a scale that cannot be 0 by accident (an all-zero or all-NaN reference does not turn the
// error into 0). std::max and Eigen's maxCoeff() silently drop or mis-order NaN; this does not.

namespace numesh::ops {

/// How compare() measures.
struct CompareOptions {
  /// The scale the relative error divides by is max(max |want| over the finite reference
  /// elements, scale_floor). The default (the smallest normal float) only keeps the division
  /// defined: against an all-zero reference any non-zero output then fails, and an exact one
  /// passes. Raise it when small outputs should be judged against a larger magnitude.
  double scale_floor = static_cast<double>(std::numeric_limits<float>::min());
};

/// What compare() found. Indices are flat (row-major) element indices; describe() prints
/// them as coordinates of `shape`.
struct Comparison {
  /// The compared shape (empty for a flat comparison: indices print as [i]).
  std::vector<std::int64_t> shape;
  /// Number of elements compared.
  std::int64_t elements = 0;
  /// max |got - want| over the elements where both are finite, and where it is (-1: none).
  double max_abs_error = 0.0;
  std::int64_t worst_index = -1;
  double got_at_worst = 0.0, want_at_worst = 0.0;
  /// max(max |want| over finite reference elements, CompareOptions::scale_floor); > 0.
  double scale = 0.0;
  /// max_abs_error / scale.
  double relative_error = 0.0;
  /// Elements where got and want differ in finiteness, or are both non-finite but not the same
  /// value (NaN against an infinity, +inf against -inf); the first of them (-1: none).
  std::int64_t nonfinite_mismatches = 0;
  std::int64_t first_mismatch = -1;
  double got_at_mismatch = 0.0, want_at_mismatch = 0.0;
  /// Non-finite reference elements (matched or not), and the first of them (-1: none). A
  /// reference with non-finite values cannot vouch for those elements: checks of operators
  /// on finite inputs treat it as a failure of the input (see is_finite_reference()).
  std::int64_t nonfinite_reference = 0;
  std::int64_t first_nonfinite_reference = -1;

  /// True when no element mismatches in finiteness and relative_error <= bound.
  /// REQUIRES: bound >= 0.
  [[nodiscard]] bool within(double bound) const noexcept {
    return nonfinite_mismatches == 0 && relative_error <= bound;
  }
  /// True when every reference element is finite.
  [[nodiscard]] bool is_finite_reference() const noexcept { return nonfinite_reference == 0; }
  /// One line for a report: the first non-finite mismatch when there is one ("got nan at
  /// [2, 7] where the reference is 0.5 (3 non-finite mismatches)"), then the relative error
  /// and its worst element ("max relative error 1.2e-06 at [3, 5]: got 0.1, want 0.1000001,
  /// scale 2.3"), and how many reference elements are not finite.
  [[nodiscard]] std::string describe() const;
  /// Coordinates of flat index `i` in `shape` ("[1, 2]"; "[i]" when shape is empty).
  [[nodiscard]] std::string index_text(std::int64_t i) const;
};

/// Compares `got` with the reference `want` element by element (see Comparison).
/// REQUIRES: when `shape` is not empty, its product is the number of elements.
/// Throws: ShapeError naming both sizes when got and want differ in size.
[[nodiscard]] Comparison compare(std::span<const float> got, std::span<const float> want,
                                 std::span<const std::int64_t> shape = {},
                                 const CompareOptions& options = {});
/// As above against a float64 reference.
[[nodiscard]] Comparison compare(std::span<const float> got, std::span<const double> want,
                                 std::span<const std::int64_t> shape = {},
                                 const CompareOptions& options = {});
/// As above for two float64 arrays.
[[nodiscard]] Comparison compare(std::span<const double> got, std::span<const double> want,
                                 std::span<const std::int64_t> shape = {},
                                 const CompareOptions& options = {});
/// Compares two host tensors. Throws: ShapeError naming both shapes when they differ.
[[nodiscard]] Comparison compare(const runtime::HostTensor& got, const runtime::HostTensor& want,
                                 const CompareOptions& options = {});

}  // namespace numesh::ops
