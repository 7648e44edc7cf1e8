#include "numesh/ops/kernels/norms.hpp"

#include <cmath>

#include "numesh/ops/kernels/parallel.hpp"

namespace numesh::ops {

void rmsnorm_rows(ConstMatrixMap x, ConstMatrixMap weight, MatrixMap y, float eps) {
  const auto h = static_cast<float>(x.cols());
  // Each row is one task's: its sum of squares runs in the same order whatever the threads.
  parallel_blocks(x.rows(), row_block_for(x.cols()), [&](std::int64_t r0, std::int64_t r1) {
    for (Eigen::Index t = r0; t < r1; ++t) {
      const float scale = 1.0f / std::sqrt(x.row(t).squaredNorm() / h + eps);
      y.row(t) = (x.row(t) * scale).cwiseProduct(weight.row(0));
    }
  });
}

}  // namespace numesh::ops
