#pragma once

#include "numesh/ops/eigen_views.hpp"

// The RMSNorm and LayerNorm references (see reference/mlp.hpp for what the references are).

namespace numesh::ops {

/// RMSNorm: y[t, :] = x[t, :] / sqrt(mean(x[t, :]^2) + eps) .* weight.
/// x: [T, H], weight: [1, H] (a row). Throws: ShapeError when weight is not [1, H]; ValueError
/// when eps < 0.
RowMatrix rmsnorm_reference(const RowMatrix& x, const RowMatrix& weight, float eps = 1e-6f);

/// LayerNorm (torch.nn.LayerNorm over the last dim): y[t, :] = (x[t, :] - mean) / sqrt(var +
/// eps) .* weight + bias, var the biased variance of the row. x: [T, H], weight: [1, H], bias:
/// [1, H] or empty (0 x 0: none). Throws: ShapeError when weight or bias is not [1, H];
/// ValueError when eps < 0.
RowMatrix layernorm_reference(const RowMatrix& x, const RowMatrix& weight, const RowMatrix& bias,
                              float eps = 1e-5f);

}  // namespace numesh::ops
