#include "numesh/ops/kernels/norms.hpp"

#include <algorithm>
#include <cmath>
#include <utility>
#include <vector>

#include "numesh/ops/kernels/parallel.hpp"

namespace numesh::ops {

void rmsnorm_rows(ConstMatrixMap x, ConstMatrixMap weight, MatrixMap y, RmsNormConstants norm) {
  const auto h = static_cast<float>(x.cols());
  const float eps = norm.eps, offset = norm.weight_offset;
  // Each row is one task's: its sum of squares runs in the same order whatever the threads.
  // weight + offset is summed as each row scales (no buffer: a serving step allocates nothing).
  parallel_blocks(x.rows(), row_block_for(x.cols()), [&](std::int64_t r0, std::int64_t r1) {
    for (Eigen::Index t = r0; t < r1; ++t) {
      const float scale = 1.0f / std::sqrt(x.row(t).squaredNorm() / h + eps);
      if (offset == 0.0f) {
        y.row(t) = (x.row(t) * scale).cwiseProduct(weight.row(0));
      } else {
        y.row(t) = ((x.row(t) * scale).array() * (weight.row(0).array() + offset)).matrix();
      }
    }
  });
}

void rmsnorm_rows_backward(ConstMatrixMap x, ConstMatrixMap weight, ConstMatrixMap dy,
                           RmsNormConstants norm, MatrixMap dx, MatrixMap d_weight) {
  const float eps = norm.eps, offset = norm.weight_offset;
  const Eigen::Index rows = x.rows(), h = x.cols();
  const std::int64_t block = row_block_for(h);
  const std::int64_t blocks = (rows + block - 1) / block;
  // Each block's part of d_weight, folded in block order below.
  std::vector<float> parts(static_cast<std::size_t>(std::max<std::int64_t>(blocks, 1) * h), 0.0f);
  parallel_blocks(rows, block, [&](std::int64_t r0, std::int64_t r1) {
    Eigen::Map<Eigen::RowVectorXf> part(parts.data() + (r0 / block) * h, h);
    for (Eigen::Index t = r0; t < r1; ++t) {
      const float r = 1.0f / std::sqrt(x.row(t).squaredNorm() / static_cast<float>(h) + eps);
      part += dy.row(t).cwiseProduct(x.row(t)) * r;
      // g . x before dx (which may be dy's storage) is written; g = dy .* (weight + offset).
      if (offset == 0.0f) {
        const float mean_gx =
            dy.row(t).cwiseProduct(weight.row(0)).dot(x.row(t)) / static_cast<float>(h);
        dx.row(t) = dy.row(t).cwiseProduct(weight.row(0)) * r - x.row(t) * (r * r * r * mean_gx);
      } else {
        const auto g = dy.row(t).array() * (weight.row(0).array() + offset);
        const float mean_gx = (g * x.row(t).array()).sum() / static_cast<float>(h);
        dx.row(t) = (g * r - x.row(t).array() * (r * r * r * mean_gx)).matrix();
      }
    }
  });
  d_weight.setZero();
  for (std::int64_t b = 0; b < blocks; ++b)
    d_weight.row(0) += Eigen::Map<const Eigen::RowVectorXf>(parts.data() + b * h, h);
}

namespace {

// A row's mean and 1 / sqrt(var + eps), the variance from the centred values (two passes: no
// cancellation when the mean is large against the spread).
std::pair<float, float> row_moments(const Eigen::Ref<const Eigen::RowVectorXf>& x, float eps) {
  const auto h = static_cast<float>(x.size());
  const float mean = x.sum() / h;
  const float var = (x.array() - mean).square().sum() / h;
  return {mean, 1.0f / std::sqrt(var + eps)};
}

}  // namespace

void layernorm_rows(ConstMatrixMap x, ConstMatrixMap weight, ConstMatrixMap bias, MatrixMap y,
                    float eps) {
  parallel_blocks(x.rows(), row_block_for(x.cols()), [&](std::int64_t r0, std::int64_t r1) {
    for (Eigen::Index t = r0; t < r1; ++t) {
      const auto [mean, r] = row_moments(x.row(t), eps);
      y.row(t) = ((x.row(t).array() - mean) * r * weight.row(0).array()).matrix();
      if (bias.cols() > 0) y.row(t) += bias.row(0);
    }
  });
}

void layernorm_rows_backward(ConstMatrixMap x, ConstMatrixMap weight, ConstMatrixMap dy, float eps,
                             MatrixMap dx, MatrixMap d_weight, MatrixMap d_bias) {
  const Eigen::Index rows = x.rows(), h = x.cols();
  const std::int64_t block = row_block_for(h);
  const std::int64_t blocks = (rows + block - 1) / block;
  // Each block's parts of d_weight and d_bias, folded in block order below.
  std::vector<float> parts(static_cast<std::size_t>(std::max<std::int64_t>(blocks, 1) * 2 * h),
                           0.0f);
  parallel_blocks(rows, block, [&](std::int64_t r0, std::int64_t r1) {
    Eigen::Map<Eigen::RowVectorXf> dw_part(parts.data() + (r0 / block) * 2 * h, h);
    Eigen::Map<Eigen::RowVectorXf> db_part(parts.data() + (r0 / block) * 2 * h + h, h);
    Eigen::RowVectorXf xhat(h), g(h);
    for (Eigen::Index t = r0; t < r1; ++t) {
      const auto [mean, r] = row_moments(x.row(t), eps);
      xhat = ((x.row(t).array() - mean) * r).matrix();
      dw_part += dy.row(t).cwiseProduct(xhat);
      db_part += dy.row(t);
      g = dy.row(t).cwiseProduct(
          weight.row(0));  // before dx (which may be dy's storage) is written
      const float mean_g = g.sum() / static_cast<float>(h);
      const float mean_gx = g.dot(xhat) / static_cast<float>(h);
      dx.row(t) = ((g.array() - mean_g - xhat.array() * mean_gx) * r).matrix();
    }
  });
  d_weight.setZero();
  if (d_bias.cols() > 0) d_bias.setZero();
  for (std::int64_t b = 0; b < blocks; ++b) {
    d_weight.row(0) += Eigen::Map<const Eigen::RowVectorXf>(parts.data() + b * 2 * h, h);
    if (d_bias.cols() > 0)
      d_bias.row(0) += Eigen::Map<const Eigen::RowVectorXf>(parts.data() + b * 2 * h + h, h);
  }
}

}  // namespace numesh::ops
