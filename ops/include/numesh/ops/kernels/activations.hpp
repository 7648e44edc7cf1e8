#pragma once

#include "numesh/ops/tensor.hpp"

// Element-wise activations on whole matrices, vectorized through Eigen's array functions
// (erf and exp have SIMD implementations for float): a scalar std::erf loop over a [512, 4096]
// activation costs ~30 ms, the vectorized one under 1 ms (BASELINES.md: GELU is < 1% of an
// MLP forward when done right).

namespace numesh::ops {

/// x = gelu(x) in place, exact form 0.5 x (1 + erf(x / sqrt(2))).
void gelu_inplace(MatrixMap x);

/// gate = silu(gate) .* up in place (SwiGLU's middle), silu(g) = g / (1 + exp(-g)).
/// REQUIRES: gate and up have the same shape.
void silu_mul_inplace(MatrixMap gate, ConstMatrixMap up);

}  // namespace numesh::ops
