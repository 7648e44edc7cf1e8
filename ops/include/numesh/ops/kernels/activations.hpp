#pragma once

#include "numesh/ops/tensor.hpp"

// Element-wise activations on whole matrices, vectorized through Eigen's array functions
// (erf and exp have SIMD implementations for float): on one thread a scalar std::erf loop over
// a [512, 4096] activation takes about 10.5 ms, the vectorized one about 0.7 ms, around 1 % of
// an MLP forward of that shape (docs/benchmarks.md, MLP forward, "The parts": BM_Gelu).

namespace numesh::ops {

/// x = gelu(x) in place, exact form 0.5 x (1 + erf(x / sqrt(2))).
void gelu_inplace(MatrixMap x);

/// gate = silu(gate) .* up in place (SwiGLU's middle), silu(g) = g / (1 + exp(-g)).
/// REQUIRES: gate and up have the same shape.
void silu_mul_inplace(MatrixMap gate, ConstMatrixMap up);

}  // namespace numesh::ops
