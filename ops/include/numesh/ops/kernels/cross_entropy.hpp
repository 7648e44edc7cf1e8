#pragma once

#include <cstdint>
#include <span>

#include "numesh/ops/eigen_views.hpp"

// The row-wise pieces of a cross-entropy over logits split along the vocabulary: each device
// holds the columns [v0, v0 + cols) of every row. The devices' maxima are combined first (a
// max all-reduce), then their sums of exponentials and the target's logit (a sum all-reduce),
// so the loss and its gradient need the full logits nowhere.

namespace numesh::ops {

/// max[r] = the largest of row r (a NaN anywhere makes it NaN). Rows in blocks over the calling
/// thread's arena. REQUIRES: max holds logits.rows() values.
void row_max(ConstMatrixMap logits, std::span<float> max);

/// For each row r: sums[2 r] = the sum of exp(logits[r, c] - max[r]) over the row (each exp
/// Eigen's vectorized fp32 one, within 2 ulp, NaN kept; summed in double, stored as float) and
/// sums[2 r + 1] = logits[r, targets[r] - v0] when the target lies in [v0, v0 + cols), else 0.
/// REQUIRES: sums holds 2 rows values; targets and max one per row.
void cross_entropy_sums(ConstMatrixMap logits, std::span<const float> max,
                        std::span<const std::int32_t> targets, std::int64_t v0,
                        std::span<float> sums);

/// The gradient of scale * (logsumexp(row) - row[target]) with respect to the logits, in place
/// of them: scale (exp(l - max) / total - [c == target]), with max and total the whole row's
/// (total[2 r] as cross_entropy_sums lays its all-reduced sums out).
void cross_entropy_logit_gradient(MatrixMap logits, std::span<const float> max,
                                  std::span<const float> sums,
                                  std::span<const std::int32_t> targets, std::int64_t v0,
                                  double scale);

}  // namespace numesh::ops
