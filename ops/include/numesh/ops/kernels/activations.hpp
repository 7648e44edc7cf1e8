#pragma once

#include "numesh/ops/eigen_views.hpp"
#include "numesh/ops/mlp_config.hpp"

// Element-wise activations on whole matrices, vectorized through Eigen's array functions
// (erf and exp have SIMD implementations for float): on one thread a scalar std::erf loop over
// a [512, 4096] activation takes about 10.5 ms, the vectorized one about 0.7 ms, around 1 % of
// an MLP forward of that shape (docs/benchmarks.md, MLP forward, "The parts": BM_Gelu).
// Each takes the Activation; a new one is one more functor in activations.cpp.

namespace numesh::ops {

/// x = act(x) in place.
void activation_inplace(Activation act, MatrixMap x);

/// The backward of act at `x` given dy, in place of dy: dy .* act'(x).
/// REQUIRES: x and dy have one shape.
void activation_backward_inplace(Activation act, ConstMatrixMap x, MatrixMap dy);

/// gate = act(gate) .* up in place (a gated MLP's middle: SwiGLU's with silu).
/// REQUIRES: gate and up have the same shape.
void gated_inplace(Activation act, MatrixMap gate, ConstMatrixMap up);

/// The backward of a = act(gate) .* up given da: d_gate = da .* up .* act'(gate) and d_up =
/// da .* act(gate). d_gate may alias da. REQUIRES: every matrix has gate's shape.
void gated_backward(Activation act, ConstMatrixMap gate, ConstMatrixMap up, ConstMatrixMap da,
                    MatrixMap d_gate, MatrixMap d_up);

}  // namespace numesh::ops
