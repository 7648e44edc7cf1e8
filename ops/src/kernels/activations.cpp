#include "numesh/ops/kernels/activations.hpp"

#include <unsupported/Eigen/SpecialFunctions>


namespace numesh::ops {

void gelu_inplace(MatrixMap x) {
  auto a = x.array();
  a = 0.5f * a * (1.0f + (a * 0.70710678118654752440f).erf());
}

void silu_mul_inplace(MatrixMap gate, ConstMatrixMap up) {
  auto g = gate.array();
  // exp(-g) overflows to inf for g < -88, and g / inf = -0: the limit, no NaN.
  g = g / (1.0f + (-g).exp()) * up.array();
}

}  // namespace numesh::ops
