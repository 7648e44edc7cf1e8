#include "numesh/ops/kernels/norms.hpp"

#include <cmath>

namespace numesh::ops {

void rmsnorm_rows(ConstMatrixMap x, ConstMatrixMap weight, MatrixMap y, float eps) {
  const auto h = static_cast<float>(x.cols());
  for (Eigen::Index t = 0; t < x.rows(); ++t) {
    const float scale = 1.0f / std::sqrt(x.row(t).squaredNorm() / h + eps);
    y.row(t) = (x.row(t) * scale).cwiseProduct(weight.row(0));
  }
}

}  // namespace numesh::ops
