#include "numesh/ops/kernels/gemm.hpp"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <thread>
#include <vector>

#include "../common/matches_reference.hpp"
#include "numesh/core/error.hpp"

namespace numesh::ops {
namespace {

using ::testing::HasSubstr;
using ::testing::ThrowsMessage;

RowMatrix pattern(Eigen::Index rows, Eigen::Index cols, float phase) {
  RowMatrix m(rows, cols);
  for (Eigen::Index i = 0; i < rows; ++i) {
    for (Eigen::Index j = 0; j < cols; ++j) {
      m(i, j) = std::sin(phase + 0.37f * static_cast<float>(i) + 0.11f * static_cast<float>(j));
    }
  }
  return m;
}

// c = a * b in double precision, the naive way.
Eigen::MatrixXd naive(const RowMatrix& a, const RowMatrix& b) {
  Eigen::MatrixXd c = Eigen::MatrixXd::Zero(a.rows(), b.cols());
  for (Eigen::Index i = 0; i < a.rows(); ++i) {
    for (Eigen::Index j = 0; j < b.cols(); ++j) {
      for (Eigen::Index k = 0; k < a.cols(); ++k) c(i, j) += double(a(i, k)) * double(b(k, j));
    }
  }
  return c;
}

// got within max_abs of want everywhere (testing::within_abs; want is column-major).
::testing::AssertionResult close(const RowMatrix& got, const Eigen::MatrixXd& want, double max_abs) {
  const Eigen::Matrix<double, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor> w = want;
  return testing::within_abs(std::span<const float>(got.data(), static_cast<std::size_t>(got.size())),
                             std::span<const double>(w.data(), static_cast<std::size_t>(w.size())), max_abs);
}

TEST(GemmTest, SmallAndLargeProductsMatchANaiveDoubleProduct) {
  // 4x5x3 takes the Eigen path; 64x48x80 the OpenBLAS path.
  for (auto [m, k, n] : {std::tuple{4, 5, 3}, std::tuple{64, 80, 48}}) {
    const RowMatrix a = pattern(m, k, 0.1f), b = pattern(k, n, 0.7f);
    RowMatrix c(m, n);
    gemm(ConstMatrixMap(a.data(), m, k), ConstMatrixMap(b.data(), k, n), MatrixMap(c.data(), m, n));
    EXPECT_TRUE(close(c, naive(a, b), 1e-4 * k)) << m << "x" << k << "x" << n;
  }
}

TEST(GemmTest, TransposedBAlphaAndBetaFollowTheFormula) {
  const Eigen::Index m = 40, k = 36, n = 32;
  const RowMatrix a = pattern(m, k, 0.3f), bt = pattern(n, k, 1.3f);  // b transposed: [N, K]
  RowMatrix c = pattern(m, n, 2.0f);
  const RowMatrix c0 = c;
  gemm(ConstMatrixMap(a.data(), m, k), ConstMatrixMap(bt.data(), n, k), MatrixMap(c.data(), m, n),
       2.0f, 0.5f, /*transpose_b=*/true);
  const RowMatrix b = bt.transpose();
  const Eigen::MatrixXd want = 2.0 * naive(a, b) + 0.5 * c0.cast<double>();
  EXPECT_TRUE(close(c, want, 1e-3));
}

TEST(GemmTest, ConcurrentCallsGiveIdenticalResults) {
  const Eigen::Index m = 96, k = 96, n = 96;
  const RowMatrix a = pattern(m, k, 0.2f), b = pattern(k, n, 0.9f);
  RowMatrix ref(m, n);
  gemm(ConstMatrixMap(a.data(), m, k), ConstMatrixMap(b.data(), k, n), MatrixMap(ref.data(), m, n));
  std::vector<RowMatrix> out(4, RowMatrix(m, n));
  std::vector<std::thread> threads;
  for (std::size_t t = 0; t < out.size(); ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 20; ++i) {
        gemm(ConstMatrixMap(a.data(), m, k), ConstMatrixMap(b.data(), k, n),
             MatrixMap(out[t].data(), m, n));
      }
    });
  }
  for (auto& th : threads) th.join();
  for (const RowMatrix& o : out) EXPECT_EQ(o, ref);
}

TEST(GemmTest, MismatchedShapesNameAllThree) {
  RowMatrix a(2, 3), b(4, 5), c(2, 5);
  EXPECT_THAT([&] { gemm(ConstMatrixMap(a.data(), 2, 3), ConstMatrixMap(b.data(), 4, 5), MatrixMap(c.data(), 2, 5)); },
              ThrowsMessage<ShapeError>(HasSubstr("gemm: a is [2, 3], b is [4, 5], c is [2, 5]: they do not multiply")));
}

}  // namespace
}  // namespace numesh::ops
