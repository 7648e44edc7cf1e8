#pragma once

// How every operator test compares an output with its dense reference: ops::compare (NaN and
// infinities by index, a scale that cannot vanish) within a bound, plus the proof that the
// check can fail. Each call also breaks one element of the output, once by NaN and once by
// 1e-3 of the output's scale, and requires the same check to reject both: a bound too loose to
// see a 1e-3 error, or a reference that is not finite, fails the test instead of passing it.

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <span>
#include <vector>

#include "numesh/ops/compare.hpp"
#include "numesh/runtime/tensor.hpp"

namespace numesh::testing {

/// The size of the error every operator check must be able to see, relative to the output's
/// scale. Operator bounds are 1e-5 .. 1e-4 (docs/ops.md); a broken kernel is wrong by far more.
inline constexpr double kMustSeeRelativeError = 1e-3;

/// Success when `got` equals the reference `want` within `bound` (ops::compare), the reference
/// is finite and non-empty, and the same check rejects `got` with one element made NaN or moved
/// by kMustSeeRelativeError of the scale. The failure message says which and where.
template <typename Want>
::testing::AssertionResult matches_reference(std::span<const float> got, std::span<const Want> want,
                                             std::span<const std::int64_t> shape, double bound) {
  const ops::Comparison c = ops::compare(got, want, shape);
  if (c.elements == 0)
    return ::testing::AssertionFailure() << "nothing to compare: the output is empty";
  if (!c.is_finite_reference()) {
    return ::testing::AssertionFailure() << "the reference is not finite: " << c.describe();
  }
  if (!c.within(bound))
    return ::testing::AssertionFailure() << c.describe() << " (bound " << bound << ")";
  // The check must be able to fail: break the element in the middle, which every output has.
  std::vector<float> broken(got.begin(), got.end());
  const std::size_t at = broken.size() / 2;
  const float original = broken[at];
  broken[at] = std::numeric_limits<float>::quiet_NaN();
  if (ops::compare(std::span<const float>(broken), want, shape).within(bound)) {
    return ::testing::AssertionFailure() << "the check passes an output with NaN at "
                                         << c.index_text(static_cast<std::int64_t>(at));
  }
  broken[at] = original + static_cast<float>(kMustSeeRelativeError * c.scale);
  if (ops::compare(std::span<const float>(broken), want, shape).within(bound)) {
    return ::testing::AssertionFailure()
           << "the check cannot see an error of " << kMustSeeRelativeError << " of the scale at "
           << c.index_text(static_cast<std::int64_t>(at)) << " (bound " << bound
           << " is too loose)";
  }
  return ::testing::AssertionSuccess() << c.describe();
}

/// matches_reference for two host tensors of the same shape.
inline ::testing::AssertionResult matches_reference(const runtime::HostTensor& got,
                                                    const runtime::HostTensor& want, double bound) {
  if (got.shape != want.shape) {
    return ::testing::AssertionFailure() << "the output and the reference differ in shape";
  }
  return matches_reference(std::span<const float>(got.data), std::span<const float>(want.data),
                           std::span<const std::int64_t>(want.shape), bound);
}

/// Success when every element of `got` is within `max_abs` of `want` and no element differs in
/// finiteness (ops::compare): for kernels checked against an exact float64 computation, where
/// the expected error is absolute. Fails on an empty comparison.
template <typename Want>
::testing::AssertionResult within_abs(std::span<const float> got, std::span<const Want> want,
                                      double max_abs) {
  if (got.size() != want.size()) {
    return ::testing::AssertionFailure()
           << got.size() << " elements against a reference of " << want.size();
  }
  const ops::Comparison c = ops::compare(got, want);
  if (c.elements == 0)
    return ::testing::AssertionFailure() << "nothing to compare: the output is empty";
  if (c.nonfinite_mismatches == 0 && c.max_abs_error <= max_abs)
    return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << c.describe() << " (max |got - want| " << c.max_abs_error
                                       << ", allowed " << max_abs << ")";
}

}  // namespace numesh::testing
