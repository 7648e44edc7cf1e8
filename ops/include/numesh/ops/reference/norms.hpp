#pragma once

#include "numesh/ops/tensor.hpp"

// The RMSNorm reference (see reference/mlp.hpp for what the references are).

namespace numesh::ops {

/// RMSNorm: y[t, :] = x[t, :] / sqrt(mean(x[t, :]^2) + eps) .* weight.
/// x: [T, H], weight: [1, H] (a row). Throws: ShapeError when weight is not [1, H]; ValueError
/// when eps < 0.
RowMatrix rmsnorm_reference(const RowMatrix& x, const RowMatrix& weight, float eps = 1e-6f);

}  // namespace numesh::ops
