#pragma once

#include "numesh/ops/tensor.hpp"

// Normalisations on row-major blocks, no mesh.

namespace numesh::ops {

/// y[t, :] = x[t, :] / sqrt(mean(x[t, :]^2) + eps) .* weight (RMSNorm), per row, in fp32.
/// weight is [1, H]; y may alias x. REQUIRES: shapes agree.
void rmsnorm_rows(ConstMatrixMap x, ConstMatrixMap weight, MatrixMap y, float eps);

}  // namespace numesh::ops
