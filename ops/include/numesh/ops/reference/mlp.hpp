#pragma once

#include "numesh/core/dtype.hpp"
#include "numesh/ops/eigen_views.hpp"
#include "numesh/ops/mlp_config.hpp"

// Dense single-device references: the oracles every sharded operator is checked against, and
// themselves checked against PyTorch (tests/ops, docs/ops.md). Plain and serial on purpose,
// and independent of the code they judge: fp32 in and out, float64 arithmetic of their own
// inside (ops/src/reference/oracle.hpp: Eigen's double products, scalar erf/exp, their own
// RoPE, softmax and attention loops), rounded to fp32 once. None of the kernels
// (numesh/ops/kernels) is called, so an error there cannot appear on both sides of a check.

namespace numesh::ops {

/// GELU, exact form: 0.5 * x * (1 + erf(x / sqrt(2))) (PyTorch's default, approximate='none'),
/// evaluated in float64 and rounded.
float gelu(float x) noexcept;
/// SiLU (swish): x * sigmoid(x), with the sigmoid evaluated without overflow for large |x|.
float silu(float x) noexcept;

/// y = gelu(x * w1) * w2. x: [T, H], w1: [H, F], w2: [F, H]; returns [T, H]. With `stored_as`
/// bf16 or f16 the weights are the values a layer storing them in that dtype holds (rounded to
/// nearest even), and for bf16 each projection's input is rounded to bf16 as the kernels do
/// (bf16 weights multiply bf16 activations; docs/ops.md, "Weight dtypes").
/// Throws: ShapeError naming the shapes when they do not chain.
RowMatrix mlp_gelu_reference(const RowMatrix& x, const RowMatrix& w1, const RowMatrix& w2,
                             DType stored_as = DType::kF32);

/// SwiGLU MLP (LLaMA): y = (silu(x * w_gate) .* (x * w_up)) * w_down. x: [T, H],
/// w_gate and w_up: [H, F], w_down: [F, H]; returns [T, H]. `stored_as` as mlp_gelu_reference.
/// Throws: ShapeError naming the shapes when they do not chain.
RowMatrix mlp_swiglu_reference(const RowMatrix& x, const RowMatrix& w_gate, const RowMatrix& w_up,
                               const RowMatrix& w_down, DType stored_as = DType::kF32);

/// The MLP of `weights` (the oracle of ShardedMlp): mlp_gelu_reference or mlp_swiglu_reference
/// by `kind`, with weights.stored_as, each bias (when not empty) added to its projection's
/// output (gate's and up's before the activation). x: [T, H]; returns [T, H].
/// Throws: ShapeError naming the shapes when the matrices do not chain or a bias is misshapen
/// (check_biases).
RowMatrix mlp_reference(const RowMatrix& x, MlpKind kind, const MlpWeights& weights);

}  // namespace numesh::ops
