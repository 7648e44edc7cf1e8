#pragma once

#include "numesh/ops/eigen_views.hpp"

// Element-wise activations on whole matrices, vectorized through Eigen's array functions
// (erf and exp have SIMD implementations for float): on one thread a scalar std::erf loop over
// a [512, 4096] activation takes about 10.5 ms, the vectorized one about 0.7 ms, around 1 % of
// an MLP forward of that shape (docs/benchmarks.md, MLP forward, "The parts": BM_Gelu).

namespace numesh::ops {

/// x = gelu(x) in place, exact form 0.5 x (1 + erf(x / sqrt(2))).
void gelu_inplace(MatrixMap x);

/// The backward of gelu at `x` given dy, in place of dy: dy .* (Phi(x) + x phi(x)), Phi and phi
/// the standard normal's distribution and density. REQUIRES: x and dy have one shape.
void gelu_backward_inplace(ConstMatrixMap x, MatrixMap dy);

/// gate = silu(gate) .* up in place (SwiGLU's middle), silu(g) = g / (1 + exp(-g)).
/// REQUIRES: gate and up have the same shape.
void silu_mul_inplace(MatrixMap gate, ConstMatrixMap up);

/// The backward of a = silu(gate) .* up given da: d_gate = da .* up .* silu'(gate) and d_up =
/// da .* silu(gate), with silu'(g) = s (1 + g (1 - s)), s = sigmoid(g). d_gate may alias da.
/// REQUIRES: every matrix has gate's shape.
void silu_mul_backward(ConstMatrixMap gate, ConstMatrixMap up, ConstMatrixMap da, MatrixMap d_gate,
                       MatrixMap d_up);

}  // namespace numesh::ops
