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

void silu_mul_inplace(MatrixMap gate, ConstMatrixMap up) {
  parallel_blocks(gate.rows(), row_block_for(gate.cols()), [&](std::int64_t r0, std::int64_t r1) {
    auto g = gate.middleRows(r0, r1 - r0).array();
    // exp(-g) overflows to inf for g < -88, and g / inf = -0: the limit, no NaN.
    g = g / (1.0f + (-g).exp()) * up.middleRows(r0, r1 - r0).array();
  });
}

}  // namespace numesh::ops
