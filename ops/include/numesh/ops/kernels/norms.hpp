#pragma once

#include "numesh/ops/tensor.hpp"

// Normalisations on row-major blocks, no mesh.

namespace numesh::ops {

/// y[t, :] = x[t, :] / sqrt(mean(x[t, :]^2) + eps) .* weight (RMSNorm), per row, in fp32.
/// weight is [1, H]; y may alias x. REQUIRES: shapes agree.
void rmsnorm_rows(ConstMatrixMap x, ConstMatrixMap weight, MatrixMap y, float eps);

/// The backward of rmsnorm_rows given dy: with r = 1 / sqrt(mean(x^2) + eps) per row and
/// g = dy .* weight, dx = r g - x r^3 mean(g .* x) (dx may alias dy), and d_weight [1, H] =
/// the sum over rows of dy .* x r. The rows are summed in blocks fixed by the shapes, the
/// blocks' sums in block order, so d_weight has the same bits for any thread count.
/// REQUIRES: x, dy and dx have one shape; weight and d_weight are [1, H].
void rmsnorm_rows_backward(ConstMatrixMap x, ConstMatrixMap weight, ConstMatrixMap dy, float eps, MatrixMap dx,
                           MatrixMap d_weight);

}  // namespace numesh::ops
