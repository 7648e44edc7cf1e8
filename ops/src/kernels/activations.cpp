#include "numesh/ops/kernels/activations.hpp"

#include <unsupported/Eigen/SpecialFunctions>

#include "numesh/ops/kernels/parallel.hpp"

namespace numesh::ops {

void gelu_inplace(MatrixMap x) {
  parallel_blocks(x.rows(), row_block_for(x.cols()), [&](std::int64_t r0, std::int64_t r1) {
    auto a = x.middleRows(r0, r1 - r0).array();
    a = 0.5f * a * (1.0f + (a * 0.70710678118654752440f).erf());
  });
}

void gelu_backward_inplace(ConstMatrixMap x, MatrixMap dy) {
  parallel_blocks(x.rows(), row_block_for(x.cols()), [&](std::int64_t r0, std::int64_t r1) {
    const auto a = x.middleRows(r0, r1 - r0).array();
    const auto cdf = 0.5f * (1.0f + (a * 0.70710678118654752440f).erf());
    const auto pdf = 0.39894228040143267794f * (-0.5f * a * a).exp();
    dy.middleRows(r0, r1 - r0).array() *= cdf + a * pdf;
  });
}

void silu_mul_inplace(MatrixMap gate, ConstMatrixMap up) {
  parallel_blocks(gate.rows(), row_block_for(gate.cols()), [&](std::int64_t r0, std::int64_t r1) {
    auto g = gate.middleRows(r0, r1 - r0).array();
    // exp(-g) overflows to inf for g < -88, and g / inf = -0: the limit, no NaN.
    g = g / (1.0f + (-g).exp()) * up.middleRows(r0, r1 - r0).array();
  });
}

void silu_mul_backward(ConstMatrixMap gate, ConstMatrixMap up, ConstMatrixMap da, MatrixMap d_gate,
                       MatrixMap d_up) {
  parallel_blocks(gate.rows(), row_block_for(gate.cols()), [&](std::int64_t r0, std::int64_t r1) {
    const std::int64_t n = r1 - r0;
    const auto g = gate.middleRows(r0, n).array();
    const auto u = up.middleRows(r0, n).array();
    const auto a = da.middleRows(r0, n).array();
    // sigmoid(g): exp(-g) = inf for g < -88 gives 0, the limit.
    const auto s = (1.0f + (-g).exp()).inverse();
    // d_up first: `da` may be d_gate's storage, which the second line overwrites.
    d_up.middleRows(r0, n).array() = a * g * s;
    d_gate.middleRows(r0, n).array() = a * u * s * (1.0f + g * (1.0f - s));
  });
}

}  // namespace numesh::ops
