#include "numesh/ops/kernels/argmax.hpp"

#include <cmath>

#include "numesh/ops/kernels/parallel.hpp"

namespace numesh::ops {

void row_argmax(ConstMatrixMap logits, std::int64_t first_index, float* out) {
  const std::int64_t rows = logits.rows(), cols = logits.cols();
  parallel_blocks(rows, row_block_for(cols), [&](std::int64_t r0, std::int64_t r1) {
    for (std::int64_t r = r0; r < r1; ++r) {
      const float* row = logits.data() + r * cols;
      std::int64_t at = 0;
      for (std::int64_t j = 1; j < cols && !std::isnan(row[at]); ++j) {
        if (std::isnan(row[j]) || row[j] > row[at]) at = j;
      }
      out[2 * r] = row[at];
      out[2 * r + 1] = static_cast<float>(first_index + at);
    }
  });
}

}  // namespace numesh::ops
