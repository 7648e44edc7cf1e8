#pragma once

#include "numesh/ops/eigen_views.hpp"

// Normalisations on row-major blocks, no mesh.

namespace numesh::ops {

/// An RMSNorm's constants: y = x / sqrt(mean(x^2) + eps) .* (weight + weight_offset).
struct RmsNormConstants {
  float eps = 1e-6f;
  /// Added to every weight as it scales: Gemma's norms scale by (1 + w), its checkpoints
  /// holding w. The weight itself (what training updates and decays) stays as stored.
  float weight_offset = 0.0f;
};

/// y[t, :] = x[t, :] / sqrt(mean(x[t, :]^2) + eps) .* (weight + weight_offset) (RMSNorm), per
/// row, in fp32. weight is [1, H]; y may alias x. REQUIRES: shapes agree.
void rmsnorm_rows(ConstMatrixMap x, ConstMatrixMap weight, MatrixMap y, RmsNormConstants norm);

/// The backward of rmsnorm_rows given dy: with r = 1 / sqrt(mean(x^2) + eps) per row and
/// g = dy .* (weight + weight_offset), dx = r g - x r^3 mean(g .* x) (dx may alias dy), and
/// d_weight [1, H] = the sum over rows of dy .* x r. The rows are summed in blocks fixed by the
/// shapes, the blocks' sums in block order, so d_weight has the same bits for any thread count.
/// REQUIRES: x, dy and dx have one shape; weight and d_weight are [1, H].
void rmsnorm_rows_backward(ConstMatrixMap x, ConstMatrixMap weight, ConstMatrixMap dy,
                           RmsNormConstants norm, MatrixMap dx, MatrixMap d_weight);

/// y[t, :] = (x[t, :] - mean) / sqrt(var + eps) .* weight + bias (LayerNorm; mean and the
/// biased variance over the row, the variance from the centred values), per row, in fp32.
/// weight is [1, H]; bias is [1, H] or has no columns (none); y may alias x.
/// REQUIRES: shapes agree.
void layernorm_rows(ConstMatrixMap x, ConstMatrixMap weight, ConstMatrixMap bias, MatrixMap y,
                    float eps);

/// The backward of layernorm_rows given dy: with r = 1 / sqrt(var + eps), x̂ = (x - mean) r and
/// g = dy .* weight per row, dx = r (g - mean(g) - x̂ mean(g .* x̂)) (dx may alias dy); d_weight
/// [1, H] = the sum over rows of dy .* x̂ and d_bias [1, H] = the sum of dy (d_bias may have no
/// columns: not wanted). Summed in blocks fixed by the shapes, as rmsnorm_rows_backward.
/// REQUIRES: x, dy and dx have one shape; weight and d_weight are [1, H].
void layernorm_rows_backward(ConstMatrixMap x, ConstMatrixMap weight, ConstMatrixMap dy, float eps,
                             MatrixMap dx, MatrixMap d_weight, MatrixMap d_bias);

}  // namespace numesh::ops
