// The row-wise pieces of the vocabulary-parallel cross-entropy (kernels/cross_entropy.hpp), each
// against float64 on rows whose length is and is not a multiple of the vector width, and what a
// NaN or an infinity in a row does.

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "numesh/ops/kernels/cross_entropy.hpp"
#include "test_util.hpp"

namespace numesh::ops {
namespace {

// Logits [rows, cols] of normal(0, 3) values.
std::vector<float> logits_of(std::int64_t rows, std::int64_t cols, std::uint32_t seed) {
  return testing::random_host({rows, cols}, seed, 3.0f).data;
}

TEST(CrossEntropyKernelTest, SumsAndGradientsAreTheFloat64Ones) {
  for (const std::int64_t cols :
       {std::int64_t{1}, std::int64_t{7}, std::int64_t{37}, std::int64_t{1000}}) {
    const std::int64_t rows = 5, v0 = 10;
    std::vector<float> x = logits_of(rows, cols, static_cast<std::uint32_t>(cols));
    std::vector<std::int32_t> targets(static_cast<std::size_t>(rows));
    for (std::int64_t r = 0; r < rows; ++r)
      targets[static_cast<std::size_t>(r)] = static_cast<std::int32_t>(v0 + (r * 3) % cols);
    targets[0] = 3;  // outside this slice [v0, v0 + cols): its logit is not here
    std::vector<float> max(static_cast<std::size_t>(rows)),
        sums(static_cast<std::size_t>(2 * rows));
    row_max(ConstMatrixMap(x.data(), rows, cols), max);
    cross_entropy_sums(ConstMatrixMap(x.data(), rows, cols), max, targets, v0, sums);
    const double scale = 0.25;
    std::vector<float> grad = x;
    cross_entropy_logit_gradient(MatrixMap(grad.data(), rows, cols), max, sums, targets, v0, scale);
    for (std::int64_t r = 0; r < rows; ++r) {
      const std::string where = "cols " + std::to_string(cols) + " row " + std::to_string(r);
      double top = -INFINITY, total = 0.0;
      for (std::int64_t c = 0; c < cols; ++c)
        top = std::max(top, static_cast<double>(x[static_cast<std::size_t>(r * cols + c)]));
      for (std::int64_t c = 0; c < cols; ++c)
        total += std::exp(x[static_cast<std::size_t>(r * cols + c)] - top);
      EXPECT_EQ(max[static_cast<std::size_t>(r)], static_cast<float>(top)) << where;
      EXPECT_NEAR(sums[static_cast<std::size_t>(2 * r)], total, 1e-6 * total) << where;
      const std::int64_t t = targets[static_cast<std::size_t>(r)] - v0;
      EXPECT_EQ(sums[static_cast<std::size_t>(2 * r + 1)],
                t >= 0 && t < cols ? x[static_cast<std::size_t>(r * cols + t)] : 0.0f)
          << where;
      for (std::int64_t c = 0; c < cols; ++c) {
        const double want =
            scale * (std::exp(x[static_cast<std::size_t>(r * cols + c)] - top) / total -
                     (c == t ? 1.0 : 0.0));
        EXPECT_NEAR(grad[static_cast<std::size_t>(r * cols + c)], want, 1e-6 * scale)
            << where << " column " << c;
      }
    }
  }
}

// A NaN anywhere in a row makes its max, its sum and its whole gradient NaN (never a finite
// loss from a broken row); a -inf logit adds nothing and gets a zero gradient.
TEST(CrossEntropyKernelTest, NaNSpreadsOverItsRowAndMinusInfinityAddsNothing) {
  const std::int64_t rows = 2, cols = 37;
  std::vector<float> x = logits_of(rows, cols, 5);
  x[20] = std::numeric_limits<float>::quiet_NaN();        // row 0
  x[cols + 3] = -std::numeric_limits<float>::infinity();  // row 1
  const std::vector<std::int32_t> targets = {0, 1};
  std::vector<float> max(2), sums(4);
  row_max(ConstMatrixMap(x.data(), rows, cols), max);
  cross_entropy_sums(ConstMatrixMap(x.data(), rows, cols), max, targets, 0, sums);
  EXPECT_TRUE(std::isnan(max[0]));
  EXPECT_TRUE(std::isnan(sums[0]));
  EXPECT_TRUE(std::isfinite(sums[2]));
  double total = 0.0;
  for (std::int64_t c = 0; c < cols; ++c) {
    if (c != 3)
      total += std::exp(static_cast<double>(x[static_cast<std::size_t>(cols + c)]) - max[1]);
  }
  EXPECT_NEAR(sums[2], total, 1e-6 * total);
  std::vector<float> grad = x;
  cross_entropy_logit_gradient(MatrixMap(grad.data(), rows, cols), max, sums, targets, 0, 1.0);
  for (std::int64_t c = 0; c < cols; ++c)
    EXPECT_TRUE(std::isnan(grad[static_cast<std::size_t>(c)])) << c;
  EXPECT_EQ(grad[static_cast<std::size_t>(cols + 3)], 0.0f);
}

}  // namespace
}  // namespace numesh::ops
