#include "numesh/ops/kernels/cross_entropy.hpp"

#include <cmath>
#include <limits>

#include "numesh/ops/kernels/parallel.hpp"

namespace numesh::ops {

void row_max(ConstMatrixMap logits, std::span<float> max) {
  parallel_blocks(logits.rows(), row_block_for(logits.cols()), [&](std::int64_t r0, std::int64_t r1) {
    for (std::int64_t r = r0; r < r1; ++r) {
      float best = -std::numeric_limits<float>::infinity();
      for (std::int64_t c = 0; c < logits.cols(); ++c) {
        const float v = logits(r, c);
        if (std::isnan(v)) {
          best = v;
          break;
        }
        best = v > best ? v : best;
      }
      max[static_cast<std::size_t>(r)] = best;
    }
  });
}

void cross_entropy_sums(ConstMatrixMap logits, std::span<const float> max, std::span<const std::int32_t> targets,
                        std::int64_t v0, std::span<float> sums) {
  const std::int64_t cols = logits.cols();
  parallel_blocks(logits.rows(), row_block_for(cols), [&](std::int64_t r0, std::int64_t r1) {
    for (std::int64_t r = r0; r < r1; ++r) {
      const auto i = static_cast<std::size_t>(r);
      const float top = max[i];
      double total = 0.0;
      for (std::int64_t c = 0; c < cols; ++c) total += std::exp(static_cast<double>(logits(r, c) - top));
      sums[2 * i] = static_cast<float>(total);
      const std::int64_t t = targets[i] - v0;
      sums[2 * i + 1] = t >= 0 && t < cols ? logits(r, t) : 0.0f;
    }
  });
}

void cross_entropy_logit_gradient(MatrixMap logits, std::span<const float> max, std::span<const float> sums,
                                  std::span<const std::int32_t> targets, std::int64_t v0, double scale) {
  const std::int64_t cols = logits.cols();
  parallel_blocks(logits.rows(), row_block_for(cols), [&](std::int64_t r0, std::int64_t r1) {
    for (std::int64_t r = r0; r < r1; ++r) {
      const auto i = static_cast<std::size_t>(r);
      const float top = max[i];
      const auto per = static_cast<float>(scale / static_cast<double>(sums[2 * i]));
      for (std::int64_t c = 0; c < cols; ++c) logits(r, c) = std::exp(logits(r, c) - top) * per;
      const std::int64_t t = targets[i] - v0;
      if (t >= 0 && t < cols) logits(r, t) -= static_cast<float>(scale);
    }
  });
}

}  // namespace numesh::ops
