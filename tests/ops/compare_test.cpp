#include "numesh/ops/compare.hpp"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "numesh/core/error.hpp"
#include "test_util.hpp"

namespace numesh::ops {
namespace {

using ::testing::HasSubstr;
using ::testing::ThrowsMessage;

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();

runtime::HostTensor tensor(std::vector<std::int64_t> shape, std::vector<float> values) {
  return runtime::HostTensor{.shape = std::move(shape), .data = std::move(values)};
}

TEST(CompareTest, MeasuresTheLargestErrorAgainstTheReferenceScale) {
  const Comparison c =
      compare(tensor({2, 2}, {1.0f, 2.0f, 3.0f, 4.5f}), tensor({2, 2}, {1.0f, 2.0f, 3.0f, -4.0f}));
  EXPECT_EQ(c.elements, 4);
  EXPECT_DOUBLE_EQ(c.max_abs_error, 8.5);
  EXPECT_EQ(c.worst_index, 3);
  EXPECT_DOUBLE_EQ(c.scale, 4.0);
  EXPECT_DOUBLE_EQ(c.relative_error, 8.5 / 4.0);
  EXPECT_FALSE(c.within(2.0));
  EXPECT_TRUE(c.within(2.2));
  EXPECT_THAT(c.describe(),
              HasSubstr("max relative error 2.12e+00 at [1, 1]: got 4.5, want -4, scale 4"));
}

TEST(CompareTest, ANanInTheOutputFailsAndSaysWhere) {
  const Comparison c =
      compare(tensor({2, 3}, {1, 2, 3, 4, kNaN, 6}), tensor({2, 3}, {1, 2, 3, 4, 5, 6}));
  EXPECT_EQ(c.nonfinite_mismatches, 1);
  EXPECT_EQ(c.first_mismatch, 4);
  EXPECT_DOUBLE_EQ(c.relative_error, 0.0) << "the finite elements agree";
  EXPECT_FALSE(c.within(1e9)) << "no bound admits a NaN where the reference is finite";
  EXPECT_THAT(c.describe(),
              HasSubstr("got nan at [1, 1] where the reference is 5 (1 non-finite mismatch)"));
}

TEST(CompareTest, ANanInTheReferenceFailsToo) {
  const Comparison c = compare(tensor({3}, {1, 2, 3}), tensor({3}, {1, kNaN, 3}));
  EXPECT_EQ(c.nonfinite_mismatches, 1);
  EXPECT_EQ(c.first_mismatch, 1);
  EXPECT_EQ(c.nonfinite_reference, 1);
  EXPECT_FALSE(c.is_finite_reference());
  EXPECT_FALSE(c.within(1.0));
  EXPECT_THAT(c.describe(), HasSubstr("got 2 at [1] where the reference is nan"));
}

TEST(CompareTest, AllNanNeverMeasuresAsZeroError) {
  // Against a finite output: every element mismatches.
  const Comparison finite = compare(tensor({2}, {0, 0}), tensor({2}, {kNaN, kNaN}));
  EXPECT_EQ(finite.nonfinite_mismatches, 2);
  EXPECT_FALSE(finite.within(1.0));
  // NaN against NaN is the same non-finite value: no mismatch, but the reference says nothing
  // about those elements, and the comparison says so.
  const Comparison both = compare(tensor({2}, {kNaN, kNaN}), tensor({2}, {kNaN, kNaN}));
  EXPECT_EQ(both.nonfinite_mismatches, 0);
  EXPECT_EQ(both.nonfinite_reference, 2);
  EXPECT_FALSE(both.is_finite_reference());
  EXPECT_EQ(both.worst_index, -1);
  EXPECT_GT(both.scale, 0.0) << "the scale cannot be 0";
  EXPECT_THAT(both.describe(),
              HasSubstr("no element is finite in both; 2 of 2 reference elements are not finite"));
  // The old measure (std::max over |got - want|) reported 0 here; matches_reference refuses.
  EXPECT_FALSE(
      testing::matches_reference(tensor({2}, {kNaN, kNaN}), tensor({2}, {kNaN, kNaN}), 1e-5));
}

TEST(CompareTest, InfinitiesMatchOnlyTheSameInfinity) {
  EXPECT_EQ(compare(tensor({1}, {kInf}), tensor({1}, {kInf})).nonfinite_mismatches, 0);
  EXPECT_EQ(compare(tensor({1}, {-kInf}), tensor({1}, {kInf})).nonfinite_mismatches, 1);
  EXPECT_EQ(compare(tensor({1}, {kNaN}), tensor({1}, {kInf})).nonfinite_mismatches, 1);
  EXPECT_EQ(compare(tensor({1}, {kInf}), tensor({1}, {3.0e38f})).nonfinite_mismatches, 1);
  EXPECT_EQ(compare(tensor({1}, {3.0e38f}), tensor({1}, {-kInf})).nonfinite_mismatches, 1);
  // Finite extremes are measured in float64: no overflow to inf in the difference.
  const Comparison far = compare(tensor({1}, {3.0e38f}), tensor({1}, {-3.0e38f}));
  EXPECT_EQ(far.nonfinite_mismatches, 0);
  EXPECT_DOUBLE_EQ(far.relative_error, 2.0);
}

TEST(CompareTest, NegativeZeroEqualsZero) {
  const Comparison c = compare(tensor({2}, {-0.0f, 1.0f}), tensor({2}, {0.0f, 1.0f}));
  EXPECT_EQ(c.max_abs_error, 0.0);
  EXPECT_TRUE(c.within(0.0));
}

TEST(CompareTest, AnAllZeroReferenceIsJudgedAgainstTheScaleFloor) {
  // Exact zeros pass with any bound...
  EXPECT_TRUE(compare(tensor({3}, {0, -0.0f, 0}), tensor({3}, {0, 0, 0})).within(0.0));
  // ...and a small non-zero output fails: the scale is the floor, not 0 (no division by 0,
  // no silent fallback to an absolute error).
  const Comparison c = compare(tensor({3}, {0, 1e-20f, 0}), tensor({3}, {0, 0, 0}));
  EXPECT_DOUBLE_EQ(c.scale, static_cast<double>(std::numeric_limits<float>::min()));
  EXPECT_FALSE(c.within(1e-3));
  // A caller that knows the magnitude that matters says so.
  EXPECT_TRUE(compare(tensor({3}, {0, 1e-20f, 0}), tensor({3}, {0, 0, 0}), {.scale_floor = 1.0})
                  .within(1e-6));
}

TEST(CompareTest, EmptyTensorsCompareEqualAndShapesMustAgree) {
  const Comparison c = compare(tensor({0, 4}, {}), tensor({0, 4}, {}));
  EXPECT_EQ(c.elements, 0);
  EXPECT_TRUE(c.within(0.0));
  EXPECT_EQ(c.describe(), "nothing to compare (0 elements)");
  EXPECT_FALSE(testing::matches_reference(tensor({0, 4}, {}), tensor({0, 4}, {}), 1e-5))
      << "an operator test that compares nothing proves nothing";
  EXPECT_THAT(
      [&] {
        (void)compare(tensor({2}, {1, 2}), tensor({1, 2}, {1, 2}));
      },
      ThrowsMessage<ShapeError>(HasSubstr("compare: the output is [2] and the reference [1, 2]")));
  const std::vector<float> three{1, 2, 3}, two{1, 2};
  EXPECT_THAT(
      [&] { (void)compare(std::span<const float>(three), std::span<const float>(two)); },
      ThrowsMessage<ShapeError>(HasSubstr("the output has 3 elements and the reference 2")));
}

TEST(CompareTest, AFloat64ReferenceIsComparedWithoutRoundingIt) {
  const std::vector<float> got{1.0f};
  const std::vector<double> want{1.0 + 1e-12};
  const Comparison c = compare(std::span<const float>(got), std::span<const double>(want));
  EXPECT_NEAR(c.max_abs_error, 1e-12, 1e-15);
  EXPECT_EQ(c.index_text(0), "[0]");
}

// matches_reference, which every operator test uses, proves on each call that its bound sees
// a broken element: by NaN, and by 1e-3 of the output's scale.
TEST(MatchesReferenceTest, RejectsBoundsTooLooseToSeeABrokenElement) {
  const runtime::HostTensor want = testing::random_host({4, 8}, 3, 1.0f);
  runtime::HostTensor got = want;
  got.data[5] += 1e-7f;
  EXPECT_TRUE(testing::matches_reference(got, want, 1e-5));
  const ::testing::AssertionResult loose = testing::matches_reference(got, want, 0.5);
  EXPECT_FALSE(loose);
  EXPECT_THAT(
      loose.message(),
      HasSubstr("cannot see an error of 0.001 of the scale at [2, 0] (bound 0.5 is too loose)"));
  // A broken output: by NaN, by 1e-3 of the scale.
  runtime::HostTensor nan = want, off = want;
  nan.data[17] = kNaN;
  off.data[17] += static_cast<float>(1e-3 * compare(want, want).scale);
  EXPECT_FALSE(testing::matches_reference(nan, want, 1e-5));
  EXPECT_FALSE(testing::matches_reference(off, want, 1e-5));
  EXPECT_THAT(testing::matches_reference(off, want, 1e-5).message(), HasSubstr("at [2, 1]"));
}

}  // namespace
}  // namespace numesh::ops
