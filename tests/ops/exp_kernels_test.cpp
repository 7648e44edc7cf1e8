#include "numesh/ops/kernels/exp_kernels.hpp"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "../common/kernel_levels.hpp"

namespace numesh::ops {
namespace {

using runtime::KernelLevel;

class ExpKernelsLevelTest : public numesh::testing::KernelLevelTest {};

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

// Arguments over exp's whole range and its edges: overflow, underflow through the subnormals,
// zeros, infinities, NaN, and random values (1003 in all: no width divides it).
std::vector<float> exp_arguments() {
  std::vector<float> x = {0.0f,   -0.0f,   1.0f,    -1.0f,   88.72f,  88.73f,   89.0f,
                          100.0f, -87.33f, -87.34f, -100.0f, -103.9f, -103.98f, -104.0f,
                          -120.f, kInf,    -kInf,   kNaN,    1e-40f,  -1e-40f,  0.34657359f};
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> wide(-110.0f, 95.0f), narrow(-2.0f, 2.0f);
  while (x.size() < 1003) x.push_back(x.size() % 2 ? wide(rng) : narrow(rng));
  return x;
}

void expect_same_bits(const std::vector<float>& got, const std::vector<float>& want,
                      const std::string& what) {
  ASSERT_EQ(got.size(), want.size());
  for (std::size_t i = 0; i < got.size(); ++i) {
    if (std::isnan(want[i])) {
      EXPECT_TRUE(std::isnan(got[i])) << what << " element " << i << ": " << got[i];
    } else {
      ASSERT_EQ(std::bit_cast<std::uint32_t>(got[i]), std::bit_cast<std::uint32_t>(want[i]))
          << what << " element " << i << ": " << got[i] << " vs the scalar level's " << want[i];
    }
  }
}

TEST_P(ExpKernelsLevelTest, ExpGivesTheScalarLevelsBits) {
  const std::vector<float> x = exp_arguments();
  std::vector<float> want(x.size()), got(x.size());
  exp_rows(x.data(), want.data(), static_cast<std::int64_t>(x.size()), KernelLevel::kScalar);
  for (const std::int64_t n : {1, 7, 8, 15, 16, 17, 1003}) {
    std::fill(got.begin(), got.end(), -7.0f);
    exp_rows(x.data(), got.data(), n, level());
    const std::vector<float> head(got.begin(), got.begin() + n);
    expect_same_bits(head, std::vector<float>(want.begin(), want.begin() + n),
                     "exp of " + std::to_string(n));
    if (n < 1003) {
      EXPECT_EQ(got[static_cast<std::size_t>(n)], -7.0f) << "wrote past " << n;
    }
  }
  std::vector<float> in_place = x;  // y may be x
  exp_rows(in_place.data(), in_place.data(), static_cast<std::int64_t>(x.size()), level());
  expect_same_bits(in_place, want, "exp in place");
}

TEST(ExpKernelsTest, ExpIsWithinTwoUlpOfTheExactOne) {
  const std::vector<float> x = exp_arguments();
  std::vector<float> y(x.size());
  exp_rows(x.data(), y.data(), static_cast<std::int64_t>(x.size()), KernelLevel::kScalar);
  for (std::size_t i = 0; i < x.size(); ++i) {
    const double exact = std::exp(static_cast<double>(x[i]));
    if (std::isnan(x[i])) {
      EXPECT_TRUE(std::isnan(y[i]));
    } else if (exact > std::numeric_limits<float>::max()) {
      EXPECT_EQ(y[i], kInf) << "exp(" << x[i] << ")";
    } else if (exact < std::numeric_limits<float>::min()) {  // subnormal or 0: absolutely close
      EXPECT_NEAR(y[i], exact, 2.0 * std::numeric_limits<float>::denorm_min())
          << "exp(" << x[i] << ")";
    } else {
      const double ulp = std::ldexp(1.0, std::ilogb(exact) - 23);
      EXPECT_LE(std::abs(y[i] - exact), 2.0 * ulp)
          << "exp(" << x[i] << ") = " << y[i] << " vs " << exact;
    }
  }
  EXPECT_EQ(y[0], 1.0f);
  EXPECT_EQ(y[1], 1.0f);
}

TEST_P(ExpKernelsLevelTest, SiluGivesTheScalarLevelsBitsAndItsLimits) {
  const std::vector<float> gate = exp_arguments();
  std::vector<float> up(gate.size());
  std::mt19937 rng(9);
  std::normal_distribution<float> normal;
  for (float& u : up) u = normal(rng);
  const auto n = static_cast<std::int64_t>(gate.size());
  std::vector<float> want = gate, got = gate;
  silu_mul_row(want.data(), up.data(), n, KernelLevel::kScalar);
  silu_mul_row(got.data(), up.data(), n, level());
  expect_same_bits(got, want, "silu");
  for (std::size_t i = 0; i < gate.size(); ++i) {
    const double g = gate[i];
    if (std::isnan(g) || std::isinf(g)) continue;
    const double exact = g / (1.0 + std::exp(-g)) * up[i];
    EXPECT_NEAR(want[i], exact, 4e-7 * std::abs(exact) + 1e-37) << "silu(" << g << ") * " << up[i];
  }
  // Very negative gates: exp(-g) is inf, and g / inf a (signed) zero, never NaN.
  std::vector<float> low = {-200.0f, -1000.0f};
  const std::vector<float> one(2, 1.0f);
  silu_mul_row(low.data(), one.data(), 2, level());
  EXPECT_EQ(low[0], 0.0f);
  EXPECT_EQ(low[1], 0.0f);
}

TEST_P(ExpKernelsLevelTest, SoftmaxGivesTheScalarLevelsBitsZerosPastTheVisibleAndSumsToOne) {
  std::mt19937 rng(13);
  std::normal_distribution<float> normal(0.0f, 4.0f);
  for (const std::int64_t width : {1, 15, 16, 17, 40, 257}) {
    for (const std::int64_t visible : {std::int64_t{1}, (width + 1) / 2, width}) {
      const std::string what =
          "softmax of " + std::to_string(visible) + " of " + std::to_string(width);
      std::vector<float> row(static_cast<std::size_t>(width));
      for (float& v : row) v = normal(rng);
      std::vector<float> want = row, got = row;
      softmax_row(want.data(), visible, width, KernelLevel::kScalar);
      softmax_row(got.data(), visible, width, level());
      expect_same_bits(got, want, what);
      float top = -kInf;
      for (std::int64_t i = 0; i < visible; ++i)
        top = std::max(top, row[static_cast<std::size_t>(i)]);
      double total = 0;
      for (std::int64_t i = 0; i < visible; ++i)
        total += std::exp(double{row[static_cast<std::size_t>(i)]} - top);
      double sum = 0;
      for (std::int64_t i = 0; i < width; ++i) {
        const auto k = static_cast<std::size_t>(i);
        if (i >= visible) {
          EXPECT_EQ(got[k], 0.0f) << what << " at " << i;
          continue;
        }
        const double exact = std::exp(double{row[k]} - top) / total;
        // Beyond the exp's and the sum's few ulp, the float difference row - top is rounded:
        // a relative error of |row - top| 2^-24 in the exponential.
        const double rounding = std::abs(double{row[k]} - top) * 0x1p-24;
        EXPECT_NEAR(got[k], exact, (1e-6 + rounding) * exact) << what << " at " << i;
        sum += got[k];
      }
      EXPECT_NEAR(sum, 1.0, 1e-5) << what;
    }
  }
  // A masked score (-inf) gets probability 0; a NaN score makes the row NaN.
  std::vector<float> masked = {1.0f, -kInf, 2.0f};
  softmax_row(masked.data(), 3, 3, level());
  EXPECT_EQ(masked[1], 0.0f);
  std::vector<float> bad = {1.0f, kNaN, 2.0f};
  softmax_row(bad.data(), 3, 3, level());
  EXPECT_TRUE(std::isnan(bad[0]) && std::isnan(bad[2]));
}

NUMESH_INSTANTIATE_LEVELS(ExpKernelsLevelTest);

}  // namespace
}  // namespace numesh::ops
