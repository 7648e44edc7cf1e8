#include "numesh/ops/activations.hpp"

#include <unsupported/Eigen/SpecialFunctions>

#include <cmath>

namespace numesh::ops {

void gelu_inplace(MatrixMap x) {
  auto a = x.array();
  a = 0.5f * a * (1.0f + (a * 0.70710678118654752440f).erf());
}

void silu_mul_inplace(MatrixMap gate, ConstMatrixMap up) {
  auto g = gate.array();
  // exp(-g) overflows to inf for g < -88, and g / inf = -0: the limit, no NaN.
  g = g / (1.0f + (-g).exp()) * up.array();
}

void rmsnorm_rows(ConstMatrixMap x, ConstMatrixMap weight, MatrixMap y, float eps) {
  const auto h = static_cast<float>(x.cols());
  for (Eigen::Index t = 0; t < x.rows(); ++t) {
    const float scale = 1.0f / std::sqrt(x.row(t).squaredNorm() / h + eps);
    y.row(t) = (x.row(t) * scale).cwiseProduct(weight.row(0));
  }
}

}  // namespace numesh::ops
